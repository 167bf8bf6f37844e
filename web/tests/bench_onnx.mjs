#!/usr/bin/env node
// The browser ONNX benchmark: one ONNX model (default: all-MiniLM-L6-v2 as
// scripts/make_minilm_onnx.sh writes it) in headless Chromium, in one page and one run,
// on Tessera's WebGPU backend and onnxruntime-web's WebGPU execution provider (the same
// adapter: SwiftShader on a machine without a GPU), and on Tessera's CPU backend and
// onnxruntime-web's wasm backend (one thread each). The same int64 token ids (batch x
// sequence) go to every engine; each timed run reads the first output back. Medians of
// at least 3 runs after one warm-up. The outputs are compared across engines too.
//
//   node web/tests/bench_onnx.mjs [--batch 1] [--seq 128] [--seconds 5] [--engines a,b] [--json]
// Env: TESSERA_DATA (the model is $TESSERA_DATA/minilm/model.onnx, default ~/.cache/tessera).
import { existsSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { CHROMIUM, flag, option, withPage } from "./bench_page.mjs";

const batch = Number(option("batch", "1"));
const seq = Number(option("seq", "128"));
const seconds = Number(option("seconds", "5"));
const engines = option("engines", "tessera-webgpu,ort-webgpu,tessera-cpu,ort-wasm").split(",");
const json = flag("json");
const dir = join(process.env.TESSERA_DATA ?? join(homedir(), ".cache/tessera"), "minilm");
if (!existsSync(join(dir, "model.onnx"))) {
  console.error(`${join(dir, "model.onnx")} is missing: run scripts/make_minilm_onnx.sh`);
  process.exit(1);
}

await withPage("/web/tests/bench_onnx.html", async (page) => {
  const rows = await page.evaluate(async ({ batch, seq, seconds, engines }) => {
    const T = window.T, ort = window.ort;
    const time = async (run) => {
      await run();
      const ms = [];
      const start = performance.now();
      while (ms.length < 3 || (performance.now() - start < seconds * 1e3 && ms.length < 30)) {
        const t = performance.now();
        await run();
        ms.push(performance.now() - t);
      }
      ms.sort((a, b) => a - b);
      return ms[ms.length >> 1];
    };
    const model = new Uint8Array(await (await fetch("/model/model.onnx")).arrayBuffer());
    const n = batch * seq;
    const ids = Int32Array.from({ length: n }, (_, p) => (p % seq === 0 ? 101 : p % seq === seq - 1 ? 102 : 1000 + ((p * 17) % 20000)));
    const out = [];
    const first = {};
    for (const engine of engines) {
      try {
        if (engine.startsWith("tessera")) {
          const backend = engine === "tessera-webgpu" ? "webgpu" : "cpu";
          const tessera = await T.Tessera.init({ backend });
          const m = T.OnnxModel.load(model);
          const feeds = {
            input_ids: T.Tensor.fromArray(ids, [batch, seq], "i32"),
            attention_mask: T.Tensor.ones([batch, seq], "i32"),
            token_type_ids: T.Tensor.zeros([batch, seq], "i32"),
          };
          let y;
          const ms = await time(async () => {
            const o = await m.run(feeds);
            y = await o[m.outputs[0].name].toArray();
            for (const t of Object.values(o)) t.dispose();
          });
          first[engine] = y;
          out.push({ engine, device: tessera.adapter.name, ms });
        } else {
          const ep = engine === "ort-webgpu" ? "webgpu" : "wasm";
          ort.env.wasm.numThreads = 1;
          ort.env.wasm.wasmPaths = "/web/tests/node_modules/onnxruntime-web/dist/";
          const session = await ort.InferenceSession.create(model, { executionProviders: [ep] });
          const i64 = (a) => new ort.Tensor("int64", BigInt64Array.from(a, (v) => BigInt(v)), [batch, seq]);
          const feeds = { input_ids: i64(ids), attention_mask: i64(new Int32Array(n).fill(1)), token_type_ids: i64(new Int32Array(n)) };
          let y;
          const ms = await time(async () => {
            const r = await session.run(feeds);
            y = await r[session.outputNames[0]].getData();
          });
          first[engine] = y;
          out.push({ engine, device: ep === "webgpu" ? "navigator.gpu adapter" : "wasm, 1 thread", ms });
          await session.release();
        }
      } catch (e) {
        out.push({ engine, error: String(e.message ?? e) });
      }
    }
    // Agreement with the first engine that ran.
    const ref = Object.values(first)[0];
    for (const r of out) {
      const y = first[r.engine];
      if (y && ref) r.maxDiff = y.reduce((m, v, k) => Math.max(m, Math.abs(v - ref[k])), 0);
    }
    return out;
  }, { batch, seq, seconds, engines });
  if (json) {
    for (const r of rows) console.log(JSON.stringify({ batch, seq, ...r }));
  } else {
    console.log(`MiniLM ONNX in the browser, batch ${batch} x seq ${seq} (${CHROMIUM}, medians)\n`);
    for (const r of rows) {
      if (r.error) console.log(`${r.engine.padEnd(16)} failed: ${r.error}`);
      else console.log(`${r.engine.padEnd(16)} ${r.ms.toFixed(1).padStart(9)} ms  ${(batch / (r.ms / 1e3)).toFixed(2).padStart(7)} sentences/s  max |diff| ${r.maxDiff?.toExponential(1)}  (${r.device})`);
    }
    const get = (e) => rows.find((r) => r.engine === e && !r.error);
    for (const [a, b] of [["tessera-webgpu", "ort-webgpu"], ["tessera-cpu", "ort-wasm"]]) {
      if (get(a) && get(b)) console.log(`${a} vs ${b}: ${(get(b).ms / get(a).ms).toFixed(2)}x`);
    }
  }
}, { mounts: { "/model/": dir } });
