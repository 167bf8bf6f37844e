#!/usr/bin/env node
// Browser tests of tessera-web: Debian's Chromium, headless, on its real WebGPU adapter
// (SwiftShader on a machine without a GPU), driven by playwright-core. No tool here
// downloads a browser.
//
// The page imports the package as `npm pack` made it (extracted under artifacts/pack),
// so what is tested is what a user installs. Run `scripts/build_web.sh` first;
// `scripts/test_web.sh` does both.
//
//   node web/tests/run.mjs [substring of a test name ...]
// Env: CHROMIUM (default /usr/bin/chromium), TESSERA_DATA (MiniLM under $TESSERA_DATA/minilm,
// default ~/.cache/tessera), TESSERA_ALLOW_NO_MODEL=1 (skip the model tests loudly rather
// than fail without it).
import { chromium } from "playwright-core";
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { ROOT, serve } from "../serve.mjs";

const HERE = join(ROOT, "web/tests");
const ARTIFACTS = join(HERE, "artifacts");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
// --enable-unsafe-webgpu gives headless Chromium its WebGPU adapter; the rest keep it
// from reaching for a network this machine does not have.
const ARGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-background-networking",
  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"];
const DATA = process.env.TESSERA_DATA ?? join(homedir(), ".cache/tessera");
const MODEL_DIR = join(DATA, "minilm");
// The official ONNX node tests (scripts/gen_onnx_node_tests.sh) and the MNIST model
// train_mnist exports (scripts/test_web.sh makes it when missing).
const NODE_TESTS = join(DATA, "onnx-node-tests");
const MNIST_ONNX = join(ROOT, "target/ci-demo/mnist.onnx");
const filters = process.argv.slice(2);

// ---- The package, as a user gets it ----------------------------------------------------
function packPackage() {
  const pkg = join(ROOT, "web/pkg");
  if (!existsSync(join(pkg, "package.json"))) throw new Error("web/pkg is missing: run scripts/build_web.sh first");
  const dest = join(ARTIFACTS, "pack");
  rmSync(dest, { recursive: true, force: true });
  mkdirSync(join(dest, "node_modules/tessera-web"), { recursive: true });
  const out = execFileSync("npm", ["pack", "--json", "--pack-destination", dest], { cwd: pkg, encoding: "utf8" });
  const info = JSON.parse(out)[0];
  execFileSync("tar", ["-xzf", join(dest, info.filename), "-C", join(dest, "node_modules/tessera-web"), "--strip-components=1"]);
  const files = info.files.map((f) => f.path).sort();
  console.log(`npm pack: ${info.filename}, ${info.size} bytes packed, ${info.unpackedSize} unpacked: ${files.join(", ")}`);
  for (const need of ["package.json", "tessera.js", "tessera.d.ts", "tessera_bg.wasm"]) {
    if (!files.includes(need)) throw new Error(`the packed package lacks ${need}`);
  }
  return info;
}

// ---- A tiny test harness -----------------------------------------------------------------
const tests = [];
const test = (name, fn) => tests.push({ name, fn });
function assert(cond, message) {
  if (!cond) throw new Error(message);
}

let browser, base;
const pageErrors = [];

async function openPage(path = "/web/tests/page.html", { noWebGpu = false } = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  if (noWebGpu) await context.addInitScript(() => { delete Navigator.prototype.gpu; });
  const page = await context.newPage();
  page.on("pageerror", (e) => pageErrors.push(`${path}: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().includes("favicon")) console.log(`  [console] ${m.text()}`);
  });
  await page.goto(base + path);
  if (path.startsWith("/web/tests/page.html")) await page.evaluate(() => window.loaded);
  return page;
}

// A page with the engine initialised (on WebGPU unless options say otherwise).
async function enginePage(options = { backend: "webgpu" }) {
  const page = await openPage();
  const info = await page.evaluate(async (o) => {
    window.tessera = await T.Tessera.init(o);
    return { adapter: tessera.adapter, caps: tessera.capabilities, backend: tessera.backend, placement: tessera.placement };
  }, options);
  return { page, info };
}

// Both backends every engine test runs on.
const BACKENDS = ["cpu", "webgpu"];

// ---- Tests ---------------------------------------------------------------------------------
test("init picks the backend and says why; backend: 'webgpu' | 'cpu' overrides", async () => {
  const { page, info } = await enginePage({});
  console.log(`  automatic: ${info.backend} (${info.placement}); adapter ${JSON.stringify(info.adapter)}`);
  // This machine's only WebGPU adapter is SwiftShader, a software one: the CPU wins.
  assert(info.backend === "cpu" && /software adapter; the CPU backend is faster here/.test(info.placement),
    `automatic choice on SwiftShader: ${info.backend} (${info.placement})`);
  const r = await page.evaluate(async () => {
    const w = await T.Tessera.init({ backend: "webgpu" });
    const out = { webgpu: { backend: w.backend, placement: w.placement, adapter: w.adapter, caps: w.capabilities } };
    const c = await T.Tessera.init({ backend: "cpu" });
    out.cpu = { backend: c.backend, placement: c.placement, name: c.adapter.name };
    try { await T.Tessera.init({ backend: "cuda" }); out.bad = "no error"; } catch (e) { out.bad = e.message; }
    return out;
  });
  console.log(`  webgpu: ${JSON.stringify(r.webgpu.adapter)}; capabilities ${JSON.stringify(r.webgpu.caps)}`);
  assert(r.webgpu.backend === "webgpu" && r.webgpu.adapter.backend === "BrowserWebGpu", `webgpu: ${JSON.stringify(r.webgpu)}`);
  for (const k of ["f16", "subgroups", "timestampQuery"]) assert(typeof r.webgpu.caps[k] === "boolean", `capabilities.${k}`);
  assert(r.webgpu.caps.limits.maxStorageBufferBindingSize > 0, "limits.maxStorageBufferBindingSize");
  assert(r.cpu.backend === "cpu" && /backend: "cpu"/.test(r.cpu.placement) && /^cpu \(1 thread\)$/.test(r.cpu.name), JSON.stringify(r.cpu));
  assert(/backend: "cuda" is not "webgpu" or "cpu"/.test(r.bad), r.bad);
  await page.context().close();
});

const ops = JSON.parse(readFileSync(join(HERE, "fixtures/ops.json"), "utf8"));

async function runOpCases(page) {
  return page.evaluate(async (cases) => {
    const AsyncFunction = (async () => {}).constructor;
    const failures = [];
    const typed = { f32: Float32Array, i32: Int32Array, u32: Uint32Array };
    for (const c of cases) {
      try {
        const inputs = c.inputs.map((i) =>
          T.Tensor.fromArray(typed[i.dtype] ? new typed[i.dtype](i.data) : i.data, i.shape, i.dtype));
        const fn = new AsyncFunction("T", ...c.inputs.map((i) => i.name), `return (${c.js});`);
        const y = await fn(T, ...inputs);
        if (y.dtype !== c.dtype) throw new Error(`dtype ${y.dtype}, want ${c.dtype}`);
        if (JSON.stringify(y.shape) !== JSON.stringify(c.shape)) throw new Error(`shape ${y.shape}, want ${c.shape}`);
        const got = await y.toArray();
        if (got.length !== c.expected.length) throw new Error(`${got.length} values, want ${c.expected.length}`);
        for (let k = 0; k < got.length; k++) {
          const w = c.expected[k], g = got[k];
          if (!(Math.abs(g - w) <= c.atol + c.rtol * Math.abs(w))) {
            throw new Error(`element ${k}: ${g}, want ${w} (atol ${c.atol}, rtol ${c.rtol})`);
          }
        }
        inputs.forEach((t) => t.dispose());
        y.dispose();
      } catch (e) {
        failures.push(`${c.name} (${c.js}): ${e.message}`);
      }
    }
    return failures;
  }, ops.cases);
}

for (const backend of BACKENDS) {
  test(`ops match the native reference on ${backend} (${ops.cases.length} cases, f32/f16/i32/bool/q8_0/q4_0)`, async () => {
    const { page, info } = await enginePage({ backend });
    assert(info.backend === backend, `asked for ${backend}, got ${info.backend}`);
    const failures = await runOpCases(page);
    assert(failures.length === 0, `${failures.length} cases failed:\n    ${failures.join("\n    ")}`);
    if (backend === "webgpu") console.log(`  f16 ran on the ${info.caps.f16 ? "native shader-f16" : "packed (u32 pairs)"} path`);
    await page.context().close();
  });
}

test("ops match with every fallback forced (packed f16, no subgroups)", async () => {
  const { page, info } = await enginePage({ backend: "webgpu", forceFallback: true });
  assert(info.adapter.forcedFallback && !info.caps.f16, "forceFallback did not take");
  const failures = await runOpCases(page);
  assert(failures.length === 0, `${failures.length} cases failed:\n    ${failures.join("\n    ")}`);
  await page.context().close();
});

for (const backend of BACKENDS) test(`errors reach JavaScript as Errors with clear messages (${backend})`, async () => {
  const { page } = await enginePage({ backend });
  const r = await page.evaluate(async () => {
    const msg = async (f) => {
      try {
        await f();
        return "no error";
      } catch (e) {
        return `${e instanceof Error ? "Error" : typeof e}: ${e.message}`;
      }
    };
    const a = T.Tensor.ones([2, 3]);
    const gone = T.Tensor.ones([2]);
    gone.dispose();
    return {
      matmul: await msg(() => a.matmul(T.Tensor.ones([2, 3]))),
      axis: await msg(() => a.sum([5])),
      dtype: await msg(() => a.cast("f64")),
      shape: await msg(() => T.Tensor.fromArray(new Float32Array(5), [2, 3])),
      badShape: await msg(() => T.Tensor.zeros([2, -1])),
      disposed: await msg(() => gone.add(a)),
      safetensors: await msg(() => T.loadSafetensors(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 8, 9]))),
      hugeHeader: await msg(() => T.loadSafetensors(new Uint8Array([255, 255, 255, 255, 255, 255, 255, 127, 123]))),
      gguf: await msg(() => T.loadGguf(new TextEncoder().encode("GGUF but not really"))),
      mnist: await msg(() => T.Mnist.parse(new Uint8Array(10))),
      notBytes: await msg(() => T.loadGguf(42)),
      embedder: await msg(() => T.Embedder.load({ model: new Uint8Array(8), tokenizer: "{}", config: "{}" })),
      item: await msg(() => a.item()),
      sizes: await msg(() => T.Model.mlp([784])),
      alive: Array.from(await a.add(a).toArray()),
    };
  });
  console.log(`  ${JSON.stringify(r, null, 1).replace(/\n/g, "\n  ")}`);
  const want = {
    matmul: /^Error: .*matmul.*\[2, 3\].*\[2, 3\]/s, axis: /^Error: .*axis/i, dtype: /^Error: unknown dtype "f64"/,
    shape: /^Error: from_slice: shape mismatch: 5 values given for a shape of 6 elements/, badShape: /^Error: shape\[1\] is -1/, disposed: /^Error: this Tensor was disposed/,
    safetensors: /^Error: .*safetensors/i, hugeHeader: /^Error: .*safetensors/i, gguf: /^Error: .*gguf/i, mnist: /^Error: .*TMNIST/,
    notBytes: /^Error: bytes must be an ArrayBuffer/, embedder: /^Error: config\.json: missing or non-integer "vocab_size"/, item: /^Error: item\(\) needs one element/,
    sizes: /^Error: sizes needs at least two/,
  };
  for (const [k, re] of Object.entries(want)) assert(re.test(r[k]), `${k}: ${r[k]}`);
  assert(r.alive.every((v) => v === 2), "the engine was unusable after the errors");
  await page.context().close();
});

for (const backend of BACKENDS) test(`concurrent reads of different graphs all settle correctly (${backend})`, async () => {
  const { page } = await enginePage({ backend });
  const r = await page.evaluate(async () => {
    const x = T.Tensor.arange(0, 64, 1).reshape([8, 8]);
    const graphs = Array.from({ length: 12 }, (_, k) => x.mulScalar(k).add(x.matmul(T.Tensor.eye(8))).sum());
    // Good reads and bad graphs (a shape mismatch, an index out of range) in flight at
    // once: each settles on its own.
    // (A shape error throws as the op is called, so it is wrapped in an async call.)
    const mixed = await Promise.allSettled([
      graphs[3].item(),
      (async () => x.matmul(T.Tensor.ones([7, 8])).toArray())(),
      x.indexSelect(0, T.Tensor.fromArray(new Int32Array([1, 9]), [2], "i32")).toArray(),
      T.Tensor.ones([4]).toArray(),
    ]);
    const values = await Promise.all(graphs.map((g) => g.item()));
    return { values, mixed: mixed.map((m) => (m.status === "fulfilled" ? Array.from(typeof m.value === "number" ? [m.value] : m.value) : m.reason.message)) };
  });
  const want = Array.from({ length: 12 }, (_, k) => 2016 * (k + 1));
  console.log(`  ${r.values.join(" ")}\n  mixed: ${JSON.stringify(r.mixed)}`);
  assert(JSON.stringify(r.values) === JSON.stringify(want), `want ${want}`);
  assert(JSON.stringify(r.mixed[0]) === JSON.stringify([want[3]]), `good read among bad ones: ${r.mixed[0]}`);
  assert(/matmul.*inner dimensions differ \(8 vs 7\)/.test(r.mixed[1]), `shape mismatch: ${r.mixed[1]}`);
  assert(/index_select.*index 9.*size 8/.test(r.mixed[2]), `bad index: ${r.mixed[2]}`);
  assert(JSON.stringify(r.mixed[3]) === "[1,1,1,1]", `ones: ${r.mixed[3]}`);
  await page.context().close();
});

for (const backend of BACKENDS) test(`safetensors round trip and a GGUF file with F32/F16/Q8_0/Q4_0 tensors (${backend})`, async () => {
  const { page } = await enginePage({ backend });
  const gguf = JSON.parse(readFileSync(join(HERE, "fixtures/gguf.json"), "utf8"));
  const r = await page.evaluate(async (expected) => {
    const a = T.Tensor.randn([3, 5], 7), b = T.Tensor.arange(0, 6, 1, "i32").reshape([2, 3]);
    const bytes = await T.saveSafetensors({ a, b }, { note: "hello" });
    const back = T.loadSafetensors(bytes);
    const same = async (x, y) => JSON.stringify(Array.from(await x.toArray())) === JSON.stringify(Array.from(await y.toArray()));
    const st = { meta: back.metadata.note, a: await same(back.tensors.a, a), b: await same(back.tensors.b, b), bdtype: back.tensors.b.dtype };
    const file = T.loadGguf(await (await fetch("fixtures/tiny.gguf")).arrayBuffer());
    const errs = [];
    for (const [name, want] of Object.entries(expected.tensors)) {
      const t = file.tensors[name];
      if (!t) { errs.push(`${name} missing`); continue; }
      if (t.dtype !== want.dtype) errs.push(`${name}: dtype ${t.dtype}, want ${want.dtype}`);
      const got = await t.toArray();
      want.values.forEach((w, i) => { if (Math.abs(got[i] - w) > 1e-6) errs.push(`${name}[${i}] ${got[i]} != ${w}`); });
      // Quantised weights feed a matmul directly: ones @ w^T sums each row of w.
      if (want.dtype.startsWith("q")) {
        const [rows, cols] = want.shape;
        const sums = Array.from(await T.Tensor.ones([1, cols]).matmul(t.t()).toArray());
        for (let r = 0; r < rows; r++) {
          const w = want.values.slice(r * cols, (r + 1) * cols).reduce((a, b) => a + b, 0);
          if (!(Math.abs(sums[r] - w) <= 1e-4 * (1 + Math.abs(w)))) errs.push(`${name}: (ones @ w^T)[${r}] ${sums[r]} != ${w}`);
        }
      }
    }
    return { st, meta: { ...file.metadata, "tiny.big": String(file.metadata["tiny.big"]) }, errs, version: file.version };
  }, gguf);
  console.log(`  safetensors: ${JSON.stringify(r.st)}; gguf v${r.version} metadata ${JSON.stringify(r.meta)}`);
  assert(r.st.meta === "hello" && r.st.a && r.st.b && r.st.bdtype === "i32", "safetensors round trip");
  assert(r.errs.length === 0, r.errs.slice(0, 5).join("; "));
  assert(r.meta["general.name"] === "tiny" && r.meta["tiny.big"] === String(2 ** 40) && r.meta["tiny.list"].join() === "1,-2,3", "gguf metadata");
  await page.context().close();
});

for (const backend of BACKENDS) test(`MNIST: the training loss falls over 50 steps in the page (${backend})`, async () => {
  const { page } = await enginePage({ backend });
  const r = await page.evaluate(async () => {
    const mnist = T.Mnist.parse(await (await fetch("/data/mnist.bin")).arrayBuffer());
    const model = T.Model.mlp([784, 128, 10], { seed: 1 });
    const opt = T.Optimizer.adam(2e-3);
    let s = 7;
    const rnd = () => ((s = (s * 1103515245 + 12345) >>> 0) / 2 ** 32);
    const losses = [];
    const t0 = performance.now();
    for (let step = 0; step < 50; step++) {
      const { x, y } = mnist.batch(Uint32Array.from({ length: 64 }, () => Math.floor(rnd() * 8000)));
      losses.push(await model.trainStep(opt, x, y));
      x.dispose(); y.dispose();
    }
    const seconds = (performance.now() - t0) / 1000;
    const idx = Uint32Array.from({ length: 500 }, (_, i) => 8000 + i);
    const { x, y } = mnist.batch(idx);
    const pred = await model.forward(x).argmax(-1).toArray(), labels = await y.toArray();
    const acc = pred.reduce((n, p, i) => n + (p === labels[i]), 0) / 500;
    return { losses, seconds, acc, params: model.parameterCount, steps: opt.steps };
  });
  const mean = (a) => a.reduce((x, y) => x + y, 0) / a.length;
  const first = mean(r.losses.slice(0, 5)), last = mean(r.losses.slice(-5));
  console.log(`  loss ${first.toFixed(3)} -> ${last.toFixed(3)} (first/last 5 steps), ${(50 / r.seconds).toFixed(1)} steps/s, ` +
    `held-out accuracy after 50 steps ${(100 * r.acc).toFixed(1)}%, ${r.params} parameters`);
  assert(r.losses.every(Number.isFinite), "a loss was not finite");
  assert(r.steps === 50, `optimiser steps ${r.steps}`);
  assert(last < 0.6 * first, `loss did not fall: ${first} -> ${last}`);
  assert(r.acc > 0.6, `held-out accuracy ${r.acc}`);
  await page.context().close();
});

const haveModel = existsSync(join(MODEL_DIR, "model.safetensors"));
// A missing model fails the model tests unless TESSERA_ALLOW_NO_MODEL=1 says to skip them.
function needModel() {
  if (haveModel) return null;
  if (process.env.TESSERA_ALLOW_NO_MODEL === "1") return `skipped (TESSERA_ALLOW_NO_MODEL=1): no MiniLM in ${MODEL_DIR}`;
  throw new Error(`no MiniLM in ${MODEL_DIR}: run scripts/fetch_minilm.sh (or set TESSERA_ALLOW_NO_MODEL=1)`);
}
for (const backend of BACKENDS) test(`the embedder matches native embeddings within 1e-4 (${backend})`, async () => {
  const skip = needModel();
  if (skip) return skip;
  const native = JSON.parse(readFileSync(join(HERE, "fixtures/embeddings.json"), "utf8"));
  const { page } = await enginePage({ backend });
  const r = await page.evaluate(async (texts) => {
    const get = async (f) => (await fetch(`/model/${f}`)).arrayBuffer();
    const stages = [];
    const t0 = performance.now();
    const embedder = await T.Embedder.load(
      { model: await get("model.safetensors"), tokenizer: await get("tokenizer.json"), config: await get("config.json") },
      { onProgress: (p) => stages.push(`${p.stage}:${p.progress}`) });
    const loadMs = performance.now() - t0;
    const t1 = performance.now();
    const e = await embedder.embed(texts);
    const embedMs = performance.now() - t1;
    const empty = (await embedder.embed([])).length;
    let notStrings;
    try { await embedder.embed([1, 2]); notStrings = "no error"; } catch (err) { notStrings = err.message; }
    return { stages, loadMs, embedMs, e: e.map((v) => Array.from(v)), ids: texts.map((t) => Array.from(embedder.tokenize(t))), dim: embedder.dim, empty, notStrings };
  }, native.texts);
  let worst = 0;
  r.e.forEach((row, i) => row.forEach((v, j) => (worst = Math.max(worst, Math.abs(v - native.embeddings[i][j])))));
  console.log(`  ${r.e.length} sentences, dim ${r.dim}; max |browser - native| = ${worst.toExponential(2)}; ` +
    `load ${r.loadMs.toFixed(0)} ms, embed ${r.embedMs.toFixed(0)} ms; progress: ${r.stages.join(" ")}`);
  assert(JSON.stringify(r.ids) === JSON.stringify(native.token_ids), "token ids differ from native");
  assert(r.empty === 0, `embed([]) gave ${r.empty} rows`);
  assert(/texts\[0\] is not a string/.test(r.notStrings), r.notStrings);
  assert(worst <= 1e-4, `max difference ${worst}`);
  assert(r.stages.at(-1) === "ready:1" && r.stages.length >= 5, `progress ${r.stages}`);
  await page.context().close();
});

// ---- ONNX ---------------------------------------------------------------------------------
for (const backend of BACKENDS) test(`ONNX: train_mnist's exported model classifies 100 digits as onnxruntime-web does (${backend})`, async () => {
  assert(existsSync(MNIST_ONNX), `${MNIST_ONNX} is missing: run cargo run --release --example train_mnist -- --max-steps 40 --export-onnx ${MNIST_ONNX} (scripts/test_web.sh does)`);
  const { page } = await enginePage({ backend });
  const r = await page.evaluate(async () => {
    const bytes = new Uint8Array(await (await fetch("/target/ci-demo/mnist.onnx")).arrayBuffer());
    const model = T.OnnxModel.load(bytes);
    const mnist = T.Mnist.parse(await (await fetch("/data/mnist.bin")).arrayBuffer());
    const ort = await import("onnxruntime-web");
    ort.env.wasm.numThreads = 1;
    ort.env.wasm.wasmPaths = "/web/tests/node_modules/onnxruntime-web/dist/";
    const session = await ort.InferenceSession.create(bytes, { executionProviders: ["wasm"] });
    const inName = model.inputs[0].name, shape = model.inputs[0].shape;
    let worst = 0, agree = 0;
    for (let i = 0; i < 100; i++) {
      const { x } = mnist.batch([8000 + i]);
      const px = await x.toArray();
      const z = Float32Array.from(px, (v) => (v - 0.1307) / 0.3081);
      const out = await model.run({ [inName]: T.Tensor.fromArray(z, shape) });
      const mine = await out[model.outputs[0].name].toArray();
      const theirs = (await session.run({ [inName]: new ort.Tensor("float32", z, shape) }))[session.outputNames[0]].data;
      for (let k = 0; k < 10; k++) worst = Math.max(worst, Math.abs(mine[k] - theirs[k]));
      const arg = (a) => a.indexOf(Math.max(...a));
      agree += arg(Array.from(mine)) === arg(Array.from(theirs)) ? 1 : 0;
    }
    return { worst, agree, info: model.info, inputs: model.inputs };
  });
  console.log(`  ${backend}: max |logit - onnxruntime-web| ${r.worst.toExponential(2)}, ${r.agree}/100 argmax agree; ops ${JSON.stringify(r.info.ops)}`);
  assert(r.worst < 1e-4 && r.agree === 100, JSON.stringify(r));
  assert(r.info.opset === 17 && r.inputs[0].name === "input", JSON.stringify(r));
});

// A handful of the official node tests, the files fetched by the page.
const NODE_CASES = ["test_conv_with_strides_padding", "test_maxpool_2d_pads", "test_averagepool_2d_pads_count_include_pad",
  "test_gemm_default_single_elem_vector_bias", "test_matmul_4d", "test_softmax_axis_1", "test_layer_normalization_3d_axis1_epsilon",
  "test_gather_0", "test_reshape_negative_dim", "test_slice_neg_steps", "test_resize_upsample_scales_linear", "test_lstm_defaults",
  "test_batchnorm_epsilon", "test_where_example", "test_dequantizelinear", "test_matmulinteger", "test_attention_4d", "test_einsum_batch_matmul"];
for (const backend of BACKENDS) test(`ONNX: ${NODE_CASES.length} official node tests pass in the page (${backend})`, async () => {
  assert(existsSync(NODE_TESTS), `${NODE_TESTS} is missing: run scripts/gen_onnx_node_tests.sh`);
  const listed = readFileSync(join(ROOT, "tests/onnx/node_passing.txt"), "utf8");
  for (const c of NODE_CASES) assert(listed.includes(`\n${c}\n`), `${c} is not in tests/onnx/node_passing.txt`);
  const { page } = await enginePage({ backend });
  const count = (c, kind) => readdirSync(join(NODE_TESTS, c, "test_data_set_0")).filter((f) => f.startsWith(kind)).length;
  const cases = NODE_CASES.map((c) => ({ c, inputs: count(c, "input_"), outputs: count(c, "output_") }));
  const r = await page.evaluate(async (cases) => {
    const get = async (p) => new Uint8Array(await (await fetch(p)).arrayBuffer());
    const files = (c, kind, n) => Promise.all(Array.from({ length: n }, (_, k) => get(`/onnx-node/${c}/test_data_set_0/${kind}_${k}.pb`)));
    const out = {};
    for (const { c, inputs, outputs } of cases) {
      out[c] = await T.onnxTestCase(await get(`/onnx-node/${c}/model.onnx`), await files(c, "input", inputs), await files(c, "output", outputs));
    }
    let unsupported;
    try { T.OnnxModel.load(new Uint8Array([10, 200, 1])); unsupported = "loaded"; } catch (e) { unsupported = e.message; }
    return { out, unsupported };
  }, cases);
  const failed = Object.entries(r.out).filter(([, v]) => v.verdict !== "pass");
  assert(failed.length === 0, `failed: ${JSON.stringify(failed)}`);
  assert(/onnx: /.test(r.unsupported), `a truncated file: ${r.unsupported}`);
});

test("a lost device rejects reads in flight, and init() recovers", async () => {
  const { page } = await enginePage({ backend: "webgpu" });
  const r = await page.evaluate(async () => {
    const x = T.Tensor.randn([128, 128], 1);
    const inFlight = x.matmul(x).sum().toArray();
    T.Tessera.loseDeviceForTesting();
    const outcome = async (p) => p.then((v) => `resolved ${Array.from(v)}`, (e) => `${e instanceof Error ? "Error" : typeof e}: ${e.message}`);
    const first = await outcome(inFlight);
    const after = await outcome(T.Tensor.ones([2]).add(T.Tensor.ones([2])).toArray());
    const t = await T.Tessera.init({ backend: "webgpu" });
    const fresh = Array.from(await T.Tensor.ones([3]).mulScalar(2).toArray());
    const old = await outcome(Promise.resolve().then(() => x.add(T.Tensor.ones([128, 128])).toArray()));
    return { first, after, fresh, old, adapter: t.adapter.backend };
  });
  console.log(`  in flight: ${r.first}\n  after the loss: ${r.after}\n  old tensor on the new device: ${r.old}\n  after init(): ${r.fresh}`);
  assert(/^Error: .*(lost|destroy)/i.test(r.first), `read in flight: ${r.first}`);
  assert(/^Error: .*(lost|destroy)/i.test(r.after), `read after loss: ${r.after}`);
  assert(r.fresh.join() === "2,2,2", "no recovery after init()");
  assert(/^Error: /.test(r.old), `an old tensor mixed with the new device: ${r.old}`);
  await page.context().close();
});

test("without WebGPU, init() runs the CPU backend; asking for WebGPU rejects with what to do", async () => {
  const page = await openPage("/web/tests/page.html", { noWebGpu: true });
  const r = await page.evaluate(async () => {
    const out = {};
    try { T.Tensor.zeros([2]); out.before = "no error"; } catch (e) { out.before = e.message; }
    try { await T.Tessera.init({ backend: "webgpu" }); out.webgpu = "no error"; } catch (e) { out.webgpu = `${e instanceof Error ? "Error" : typeof e}: ${e.message}`; }
    const t = await T.Tessera.init();
    out.backend = t.backend;
    out.placement = t.placement;
    out.values = Array.from(await T.Tensor.arange(0, 4, 1).mulScalar(2).toArray());
    return out;
  });
  console.log(`  before init: ${r.before}\n  init({ backend: "webgpu" }): ${r.webgpu}\n  init(): ${r.backend} (${r.placement})`);
  assert(/call `await Tessera.init\(\)` first/.test(r.before), r.before);
  assert(/^Error: WebGPU is not available here: navigator.gpu is missing.*--enable-unsafe-webgpu/.test(r.webgpu), r.webgpu);
  assert(r.backend === "cpu" && /navigator.gpu is missing/.test(r.placement), `${r.backend}: ${r.placement}`);
  assert(r.values.join() === "0,2,4,6", `values ${r.values}`);
  await page.context().close();
});

for (const noWebGpu of [false, true]) test(`the demo page trains, predicts a drawn digit, compares sentences${noWebGpu ? " (WebGPU disabled)" : ""}; screenshot saved`, async () => {
  const skip = needModel();
  if (skip) return skip;
  const page = await openPage("/web/demo/", { noWebGpu });
  await page.waitForFunction(() => window.demo?.ready || window.demo?.error, null, { timeout: 60000 });
  const error = await page.evaluate(() => window.demo.error);
  assert(!error, `demo: ${error}`);
  await page.click("#train");
  await page.waitForFunction(() => window.demo.steps >= 120 || window.demo.error, null, { timeout: 240000 });
  await page.click("#train"); // pause
  await page.waitForTimeout(300);
  // Draw a "1": a vertical stroke.
  const box = await page.locator("#pad").boundingBox();
  await page.mouse.move(box.x + 145, box.y + 50);
  await page.mouse.down();
  for (let i = 1; i <= 12; i++) await page.mouse.move(box.x + 140 - i, box.y + 50 + i * 15);
  await page.mouse.up();
  await page.waitForFunction(() => window.demo.prediction, null, { timeout: 30000 });
  await page.setInputFiles("#model-files", ["model.safetensors", "tokenizer.json", "config.json"].map((f) => join(MODEL_DIR, f)));
  await page.click("#load-model");
  await page.waitForFunction(() => window.demo.modelReady || window.demo.error, null, { timeout: 240000 });
  await page.click("#compare");
  await page.waitForFunction(() => window.demo.similarity || window.demo.error, null, { timeout: 120000 });
  const d = await page.evaluate(() => ({ backend: window.demo.backend, steps: window.demo.steps, losses: window.demo.losses, accuracy: window.demo.accuracy,
    prediction: window.demo.prediction, similarity: window.demo.similarity, error: window.demo.error,
    rate: document.getElementById("rate").textContent, status: document.getElementById("status").textContent }));
  mkdirSync(ARTIFACTS, { recursive: true });
  const shot = join(ARTIFACTS, noWebGpu ? "demo-no-webgpu.png" : "demo.png");
  await page.screenshot({ path: shot, fullPage: true });
  console.log(`  [${d.backend}] ${d.status}\n  ${d.steps} steps, loss ${d.losses[0].toFixed(3)} -> ${d.losses.at(-1).toFixed(3)}, ` +
    `${d.rate} steps/s, held-out accuracy ${d.accuracy}; drawn "1" predicted as ${d.prediction.digit}`);
  console.log(`  similarity: ${d.similarity.map((r) => r.map((v) => v.toFixed(2)).join(" ")).join(" | ")}`);
  console.log(`  screenshot: ${shot}`);
  assert(!d.error, d.error);
  assert(d.backend === "cpu", `the demo on SwiftShader or without WebGPU should run the CPU backend, ran ${d.backend}`);
  assert(d.accuracy > 0.8, `accuracy ${d.accuracy} after ${d.steps} steps`);
  assert(d.similarity[0][1] > d.similarity[0][2] && d.similarity[2][3] > d.similarity[1][2], "similarity panel ranks pairs wrongly");
  await page.context().close();
});

// ---- Run -------------------------------------------------------------------------------------
const info = packPackage();
const { server, url } = await serve({ mounts: { "/model/": MODEL_DIR, "/onnx-node/": NODE_TESTS } });
base = url;
browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ARGS });
console.log(`chromium ${browser.version()} at ${CHROMIUM}; serving ${ROOT} at ${base}`);
let failed = 0;
const summary = [];
for (const t of tests.filter((t) => !filters.length || filters.some((f) => t.name.includes(f)))) {
  const t0 = Date.now();
  console.log(`- ${t.name}`);
  let status;
  try {
    const note = await t.fn();
    status = note ? `SKIP (${note})` : "ok";
  } catch (e) {
    failed++;
    status = "FAILED";
    console.log(`  ${e.stack ?? e}`);
  }
  const line = `${status.padEnd(6)} ${((Date.now() - t0) / 1000).toFixed(1).padStart(6)} s  ${t.name}`;
  summary.push(line);
  console.log(`  ${line}`);
}
if (pageErrors.length) {
  failed++;
  console.log(`uncaught page errors:\n  ${pageErrors.join("\n  ")}`);
}
await browser.close();
server.close();
writeFileSync(join(ARTIFACTS, "summary.txt"), `${info.filename}\n${summary.join("\n")}\n`);
console.log(`\n${summary.join("\n")}\n${failed ? `${failed} FAILED` : "all browser tests passed"}`);
process.exit(failed ? 1 : 0);
