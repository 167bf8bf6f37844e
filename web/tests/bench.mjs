#!/usr/bin/env node
// The browser benchmark: square f32 matmuls in headless Chromium, in one page and one
// run, on Tessera's CPU backend (wasm SIMD, one thread), on Tessera's WebGPU backend
// (the page's adapter: SwiftShader on a machine without a GPU), and on onnxruntime-web's
// wasm backend (one thread) with a one-node MatMul model. Inputs are on the backend
// before timing; each timed run reads the full output back. Medians of at least 5 runs
// after 2 warm-ups, and at least `seconds` per case.
//
//   node web/tests/bench.mjs [--sizes 256,512,1024] [--seconds 2] [--json]
// scripts/bench_web.sh builds the package and runs it.
import { CHROMIUM, flag, option, withPage } from "./bench_page.mjs";

const sizes = option("sizes", "256,512,1024").split(",").map(Number);
const seconds = Number(option("seconds", "2"));
const json = flag("json");

await withPage("/web/tests/bench.html", async (page) => {
  const rows = await page.evaluate(async ({ sizes, seconds }) => {
    const T = window.T, ort = window.ort;
    const time = async (run) => {
      await run(); await run();
      const ms = [];
      const start = performance.now();
      while (ms.length < 5 || (performance.now() - start < seconds * 1e3 && ms.length < 50)) {
        const t = performance.now();
        await run();
        ms.push(performance.now() - t);
      }
      ms.sort((a, b) => a - b);
      return ms[ms.length >> 1];
    };
    const out = [];
    const model = new Uint8Array(await (await fetch("/web/tests/fixtures/matmul.onnx")).arrayBuffer());
    ort.env.wasm.numThreads = 1;
    ort.env.wasm.wasmPaths = "/web/tests/node_modules/onnxruntime-web/dist/";
    const session = await ort.InferenceSession.create(model, { executionProviders: ["wasm"] });
    for (const backend of ["cpu", "webgpu"]) {
      const tessera = await T.Tessera.init({ backend });
      for (const n of sizes) {
        const a = T.Tensor.rand([n, n], 1), b = T.Tensor.rand([n, n], 2);
        await a.realize(); await b.realize();
        const ms = await time(async () => { const c = a.matmul(b); await c.toArray(); c.dispose(); });
        out.push({ engine: `tessera ${backend}`, device: tessera.adapter.name, n, ms });
        a.dispose(); b.dispose();
      }
    }
    for (const n of sizes) {
      const a = new ort.Tensor("float32", Float32Array.from({ length: n * n }, () => Math.random()), [n, n]);
      const b = new ort.Tensor("float32", Float32Array.from({ length: n * n }, () => Math.random()), [n, n]);
      const ms = await time(async () => { const r = await session.run({ a, b }); await r.c.getData(); });
      out.push({ engine: "onnxruntime-web wasm", device: "wasm, 1 thread", n, ms });
    }
    return out.map((r) => ({ ...r, gflops: (2 * r.n ** 3) / 1e6 / r.ms }));
  }, { sizes, seconds });
  if (json) {
    for (const r of rows) console.log(JSON.stringify(r));
  } else {
    console.log(`browser matmul (f32, ${CHROMIUM}, medians)\n`);
    for (const r of rows) {
      console.log(`${r.engine.padEnd(22)} ${String(r.n).padStart(5)}^3  ${r.ms.toFixed(2).padStart(9)} ms  ${r.gflops.toFixed(2).padStart(7)} GFLOP/s  (${r.device})`);
    }
    console.log("\nTessera's CPU backend relative to onnxruntime-web's wasm backend (same page):");
    for (const n of sizes) {
      const t = rows.find((r) => r.engine === "tessera cpu" && r.n === n);
      const o = rows.find((r) => r.engine === "onnxruntime-web wasm" && r.n === n);
      console.log(`  ${n}^3: ${(t.gflops / o.gflops).toFixed(2)}x`);
    }
  }
});
