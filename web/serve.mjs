#!/usr/bin/env node
// A static file server for the demo and the browser tests (Node's standard library
// only). Serves the repository root, so /web/demo/ can reach /web/pkg/ and
// /data/mnist.bin. WebGPU needs a secure context: http://localhost is one.
//
//   node web/serve.mjs [--port 8080] [--mount /model/=DIR ...]
import { createServer } from "node:http";
import { createReadStream, statSync } from "node:fs";
import { extname, join, normalize, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const TYPES = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".json": "application/json",
  ".wasm": "application/wasm",
  ".png": "image/png",
  ".svg": "image/svg+xml",
  ".ts": "text/plain; charset=utf-8",
  ".txt": "text/plain; charset=utf-8",
  ".md": "text/plain; charset=utf-8",
};

/** The repository root (this file is web/serve.mjs). */
export const ROOT = resolve(fileURLToPath(new URL("..", import.meta.url)));

/**
 * Serve `root` (and each `mounts` prefix from its own directory) on localhost.
 * Resolves to `{ server, url }` once listening; port 0 picks a free port.
 */
export function serve({ root = ROOT, port = 0, mounts = {} } = {}) {
  const server = createServer((req, res) => {
    let path;
    try {
      path = decodeURIComponent(new URL(req.url, "http://localhost").pathname);
    } catch {
      res.writeHead(400).end("bad path");
      return;
    }
    let base = root;
    for (const [prefix, dir] of Object.entries(mounts)) {
      if (path.startsWith(prefix)) {
        base = resolve(dir);
        path = "/" + path.slice(prefix.length);
        break;
      }
    }
    let file = normalize(join(base, path));
    if (file !== base && !file.startsWith(base + sep)) {
      res.writeHead(403).end("outside the served folder");
      return;
    }
    let st;
    try {
      st = statSync(file);
      if (st.isDirectory()) {
        file = join(file, "index.html");
        st = statSync(file);
      }
    } catch {
      res.writeHead(404).end("not found");
      return;
    }
    res.writeHead(200, {
      "content-type": TYPES[extname(file)] ?? "application/octet-stream",
      "content-length": st.size,
      "cache-control": "no-store",
    });
    createReadStream(file).pipe(res);
  });
  return new Promise((ok, fail) => {
    server.once("error", fail);
    server.listen(port, "127.0.0.1", () => ok({ server, url: `http://localhost:${server.address().port}` }));
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  let port = 8080;
  const mounts = {};
  for (let i = 0; i < args.length; i++) {
    if (args[i] === "--port") port = Number(args[++i]);
    else if (args[i] === "--mount") {
      const [prefix, dir] = args[++i].split("=");
      mounts[prefix] = dir;
    } else {
      console.error(`unknown argument ${args[i]}\nusage: node web/serve.mjs [--port 8080] [--mount /prefix/=DIR]`);
      process.exit(2);
    }
  }
  const { url } = await serve({ port, mounts });
  console.log(`serving ${ROOT} at ${url}/  (demo: ${url}/web/demo/)  Ctrl-C stops`);
}
