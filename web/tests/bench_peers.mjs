#!/usr/bin/env node
// Issue #21's browser cases, every engine in one headless Chromium page on its WebGPU
// adapter (SwiftShader on a machine without a GPU):
//   - Tessera's WebGPU backend (tessera-web, built by scripts/build_web.sh);
//   - tfjs-webgpu 4.22 (@tensorflow/tfjs-backend-webgpu);
//   - onnxruntime-web 1.30's WebGPU execution provider, inputs handed over as GPU
//     buffers (Tensor.fromGpuBuffer) and outputs kept on the GPU until read;
//   - a naive WGSL kernel per case (one invocation per output), on raw WebGPU.
// Cases: f32 matmul 1024^3, relu(tanh(exp(x*2+1))*x) over 4M f32, conv2d batch 8,
// 64->64 channels, 56x56, 3x3 (NCHW; tfjs takes NHWC, its native layout), and a
// one-element op with its readback. Inputs are on the GPU before timing; each timed
// run reads the whole output back. Medians of at least 3 runs (5 for the quick cases)
// after warm-ups, and at least `seconds` per case (the tiny op: each sample the mean of
// 50 runs back to back). Each engine's output is checked
// against Tessera's (max abs difference), so a wrong kernel cannot win.
//
// Floors (issue #21): at least 1.5x the best WebGPU peer on matmul and conv2d, at least
// the naive kernel's speed on the chain, at most 0.5 ms for the tiny op.
//
//   node web/tests/bench_peers.mjs [--seconds 2] [--json] [--cases matmul,chain,conv2d,tiny]
//                                  [--tessera-matmul tiled|direct]
// scripts/bench_web.sh builds the package, makes the ONNX models and runs it.
import { CHROMIUM, flag, option, withPage } from "./bench_page.mjs";

const seconds = Number(option("seconds", "2"));
const cases = option("cases", "matmul,chain,conv2d,tiny").split(",");
const json = flag("json");
// Tessera's WebGPU matmul kernel: the device's default, or "tiled" / "direct".
const tesseraMatmul = option("tessera-matmul", "");

await withPage("/web/tests/bench_peers.html", async (page) => {
  let failed = false;
  const rows = await page.evaluate(async ({ seconds, cases, tesseraMatmul }) => {
    const T = window.T, ort = window.ort, tf = window.tf;
    // Median ms of `run` after `warm` warm-ups: at least `min` runs and `seconds`.
    // `batch` runs per sample, back to back, for ops shorter than the page's clock
    // resolution (100 us without cross-origin isolation).
    const time = async (run, { warm = 2, min = 5, batch = 1 } = {}) => {
      for (let i = 0; i < warm; i++) await run();
      const ms = [];
      const start = performance.now();
      while (ms.length < min || (performance.now() - start < seconds * 1e3 && ms.length < 50)) {
        const t = performance.now();
        for (let i = 0; i < batch; i++) await run();
        ms.push((performance.now() - t) / batch);
      }
      ms.sort((a, b) => a - b);
      return ms[ms.length >> 1];
    };
    const rand = (n, seed) => {
      let s = seed * 2654435761 % 4294967296;
      return Float32Array.from({ length: n }, () => {
        s = (s * 1664525 + 1013904223) % 4294967296;
        return s / 4294967296 * 2 - 1;
      });
    };
    const maxDiff = (a, b) => {
      let m = 0;
      for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
      return a.length === b.length ? m : Infinity;
    };

    // The naive kernels: raw WebGPU, one invocation per output element.
    const adapter = await navigator.gpu.requestAdapter();
    const info = adapter.info ?? {};
    const device = await adapter.requestDevice({
      requiredLimits: {
        maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
        maxBufferSize: adapter.limits.maxBufferSize,
      },
    });
    const upload = (data) => {
      const b = device.createBuffer({ size: data.byteLength, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
      device.queue.writeBuffer(b, 0, data);
      return b;
    };
    const naive = (code, inputs, outLen, groups, uniform) => {
      const module = device.createShaderModule({ code });
      const pipeline = device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
      const out = device.createBuffer({ size: outLen * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC });
      const read = device.createBuffer({ size: outLen * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      const entries = [...inputs, out].map((buffer, binding) => ({ binding, resource: { buffer } }));
      if (uniform) {
        const u = device.createBuffer({ size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
        device.queue.writeBuffer(u, 0, new Uint32Array(uniform));
        entries.push({ binding: entries.length, resource: { buffer: u } });
      }
      const bind = device.createBindGroup({ layout: pipeline.getBindGroupLayout(0), entries });
      return async () => {
        const enc = device.createCommandEncoder();
        const pass = enc.beginComputePass();
        pass.setPipeline(pipeline);
        pass.setBindGroup(0, bind);
        pass.dispatchWorkgroups(...groups);
        pass.end();
        enc.copyBufferToBuffer(out, 0, read, 0, outLen * 4);
        device.queue.submit([enc.finish()]);
        await read.mapAsync(GPUMapMode.READ);
        const v = new Float32Array(read.getMappedRange().slice(0));
        read.unmap();
        return v;
      };
    };

    // Small ops on the GPU too (tfjs-webgpu otherwise runs them on the CPU).
    tf.env().set("WEBGPU_CPU_FORWARD", false);
    await tf.setBackend("webgpu");
    await tf.ready();
    const tessera = await T.Tessera.init({ backend: "webgpu", ...(tesseraMatmul ? { matmul: tesseraMatmul } : {}) });
    const sessions = {};
    const ortSession = async (name) => {
      const bytes = new Uint8Array(await (await fetch(`/web/tests/fixtures/${name}`)).arrayBuffer());
      return ort.InferenceSession.create(bytes, { executionProviders: ["webgpu"], preferredOutputLocation: "gpu-buffer" });
    };
    ort.env.wasm.wasmPaths = "/web/tests/node_modules/onnxruntime-web/dist/";
    sessions.matmul = await ortSession("matmul.onnx");
    const ortDevice = await ort.env.webgpu.device;
    const ortGpu = (data, dims) => {
      // Its kernels bind whole vec4s: a buffer of at least 16 bytes.
      const b = ortDevice.createBuffer({ size: Math.max(16, Math.ceil(data.byteLength / 16) * 16), usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
      ortDevice.queue.writeBuffer(b, 0, data);
      return ort.Tensor.fromGpuBuffer(b, { dataType: "float32", dims });
    };
    const ortRun = (session, feeds) => async () => {
      const r = await session.run(feeds);
      const out = Object.values(r)[0];
      const v = await out.getData();
      out.dispose();
      return v;
    };

    // Each case: its inputs, then per engine a function that computes and reads back.
    const out = [];
    const measure = async (name, work, unit, engines, timing) => {
      let want = null;
      for (const [engine, run] of engines) {
        let ms = NaN, diff = NaN, error = null;
        try {
          const got = await run();
          if (!want) want = got;
          diff = maxDiff(got, want);
          ms = await time(run, timing);
        } catch (e) {
          error = String(e && e.message || e);
        }
        // work is FLOPs or bytes: per ms / 1e6 is per second / 1e9.
        const rate = unit === "ms" ? ms : work / ms / 1e6;
        out.push({ case: name, engine, ms, rate, unit, max_abs_diff_vs_tessera: diff, error });
      }
    };

    if (cases.includes("matmul")) {
      const n = 1024;
      const [a, b] = [rand(n * n, 1), rand(n * n, 2)];
      const [ta, tb] = [T.Tensor.fromArray(a, [n, n]), T.Tensor.fromArray(b, [n, n])];
      await ta.realize(); await tb.realize();
      const [fa, fb] = [tf.tensor(a, [n, n]), tf.tensor(b, [n, n])];
      const feeds = { a: ortGpu(a, [n, n]), b: ortGpu(b, [n, n]) };
      const wgsl = `
        @group(0) @binding(0) var<storage, read> a: array<f32>;
        @group(0) @binding(1) var<storage, read> b: array<f32>;
        @group(0) @binding(2) var<storage, read_write> c: array<f32>;
        @compute @workgroup_size(8, 8)
        fn main(@builtin(global_invocation_id) g: vec3u) {
          let n = ${n}u;
          if (g.x >= n || g.y >= n) { return; }
          var s = 0.0;
          for (var k = 0u; k < n; k++) { s += a[g.y * n + k] * b[k * n + g.x]; }
          c[g.y * n + g.x] = s;
        }`;
      await measure("f32 matmul 1024^3", 2 * n ** 3, "GFLOP/s", [
        ["tessera webgpu", async () => { const c = ta.matmul(tb); const v = await c.toArray(); c.dispose(); return v; }],
        ["tfjs-webgpu", async () => { const c = tf.matMul(fa, fb); const v = await c.data(); c.dispose(); return v; }],
        ["onnxruntime-web webgpu", ortRun(sessions.matmul, feeds)],
        ["naive wgsl", naive(wgsl, [upload(a), upload(b)], n * n, [n / 8, n / 8])],
      ], { warm: 1, min: 3 });
    }
    if (cases.includes("chain")) {
      const n = 4 << 20;
      const x = rand(n, 3);
      const tx = T.Tensor.fromArray(x, [n]);
      await tx.realize();
      const fx = tf.tensor(x, [n]);
      const session = await ortSession("peers/chain.onnx");
      const feeds = { x: ortGpu(x, [n]) };
      const wgsl = `
        @group(0) @binding(0) var<storage, read> x: array<f32>;
        @group(0) @binding(1) var<storage, read_write> y: array<f32>;
        @compute @workgroup_size(256)
        fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) w: vec3u) {
          let i = g.x + g.y * w.x * 256u;
          if (i >= ${n}u) { return; }
          let v = x[i];
          y[i] = max(tanh(exp(v * 2.0 + 1.0)) * v, 0.0);
        }`;
      const groups = n / 256;
      await measure("relu(tanh(exp(x*2+1))*x) 4M f32", n * 8, "GB/s", [
        ["tessera webgpu", async () => {
          const ts = [];
          const k = (t) => { ts.push(t); return t; };
          const y = k(k(k(k(k(tx.mulScalar(2)).addScalar(1)).exp()).tanh()).mul(tx)).relu();
          const v = await y.toArray();
          y.dispose(); ts.forEach((t) => t.dispose());
          return v;
        }],
        ["tfjs-webgpu", async () => {
          const y = tf.tidy(() => tf.relu(tf.mul(tf.tanh(tf.exp(tf.add(tf.mul(fx, 2), 1))), fx)));
          const v = await y.data(); y.dispose(); return v;
        }],
        ["onnxruntime-web webgpu", ortRun(session, feeds)],
        ["naive wgsl", naive(wgsl, [upload(x)], n, [Math.min(groups, 32768), Math.ceil(groups / 32768)])],
      ]);
    }
    if (cases.includes("conv2d")) {
      const [b, c, h, w, o] = [8, 64, 56, 56, 64];
      const x = rand(b * c * h * w, 4), wt = rand(o * c * 9, 5);
      const tx = T.Tensor.fromArray(x, [b, c, h, w]), tw = T.Tensor.fromArray(wt, [o, c, 3, 3]);
      await tx.realize(); await tw.realize();
      // tfjs in its own layout: NHWC input, HWIO filter, NHWC output (permuted back to
      // NCHW on the host only for the comparison, outside the timed run).
      const fx = tf.tidy(() => tf.transpose(tf.tensor(x, [b, c, h, w]), [0, 2, 3, 1]));
      const fw = tf.tidy(() => tf.transpose(tf.tensor(wt, [o, c, 3, 3]), [2, 3, 1, 0]));
      await fx.data(); await fw.data();
      const session = await ortSession("peers/conv.onnx");
      const feeds = { x: ortGpu(x, [b, c, h, w]), w: ortGpu(wt, [o, c, 3, 3]) };
      const wgsl = `
        @group(0) @binding(0) var<storage, read> x: array<f32>;
        @group(0) @binding(1) var<storage, read> wt: array<f32>;
        @group(0) @binding(2) var<storage, read_write> y: array<f32>;
        @compute @workgroup_size(256)
        fn main(@builtin(global_invocation_id) g: vec3u, @builtin(num_workgroups) nw: vec3u) {
          let i = g.x + g.y * nw.x * 256u;
          if (i >= ${b * o * h * w}u) { return; }
          let xx = i % ${w}u; let yy = (i / ${w}u) % ${h}u;
          let oc = (i / ${w * h}u) % ${o}u; let n = i / ${w * h * o}u;
          var s = 0.0;
          for (var ci = 0u; ci < ${c}u; ci++) {
            for (var ky = 0u; ky < 3u; ky++) {
              let sy = i32(yy + ky) - 1;
              if (sy < 0 || sy >= ${h}) { continue; }
              for (var kx = 0u; kx < 3u; kx++) {
                let sx = i32(xx + kx) - 1;
                if (sx < 0 || sx >= ${w}) { continue; }
                s += x[((n * ${c}u + ci) * ${h}u + u32(sy)) * ${w}u + u32(sx)] * wt[((oc * ${c}u + ci) * 3u + ky) * 3u + kx];
              }
            }
          }
          y[i] = s;
        }`;
      const groups = b * o * h * w / 256;
      const nhwcToNchw = (v) => {
        const r = new Float32Array(v.length);
        for (let n = 0; n < b; n++) for (let yy = 0; yy < h; yy++) for (let xx = 0; xx < w; xx++) for (let k = 0; k < o; k++) {
          r[((n * o + k) * h + yy) * w + xx] = v[((n * h + yy) * w + xx) * o + k];
        }
        return r;
      };
      let tfFirst = true;
      await measure("conv2d 8x64x56x56, 3x3, 64->64", 2 * b * o * h * w * c * 9, "GFLOP/s", [
        ["tessera webgpu", async () => { const y = tx.conv2d(tw, undefined, { padding: 1 }); const v = await y.toArray(); y.dispose(); return v; }],
        ["tfjs-webgpu (NHWC)", async () => {
          const y = tf.conv2d(fx, fw, 1, "same");
          const v = await y.data(); y.dispose();
          if (tfFirst) { tfFirst = false; return nhwcToNchw(v); }
          return v;
        }],
        ["onnxruntime-web webgpu", ortRun(session, feeds)],
        ["naive wgsl", naive(wgsl, [upload(x), upload(wt)], b * o * h * w, [Math.min(groups, 32768), Math.ceil(groups / 32768)])],
      ], { warm: 1, min: 3 });
    }
    if (cases.includes("tiny")) {
      const x = new Float32Array([0.5]);
      const tx = T.Tensor.fromArray(x, [1]);
      await tx.realize();
      const fx = tf.tensor(x, [1]);
      const session = await ortSession("peers/tiny.onnx");
      const feeds = { x: ortGpu(x, [1]) };
      const wgsl = `
        @group(0) @binding(0) var<storage, read> x: array<f32>;
        @group(0) @binding(1) var<storage, read_write> y: array<f32>;
        @compute @workgroup_size(1)
        fn main() { y[0] = x[0] + 1.0; }`;
      await measure("1-element op + readback", 0, "ms", [
        ["tessera webgpu", async () => { const y = tx.addScalar(1); const v = await y.toArray(); y.dispose(); return v; }],
        ["tfjs-webgpu", async () => { const y = tf.add(fx, 1); const v = await y.data(); y.dispose(); return v; }],
        ["onnxruntime-web webgpu", ortRun(session, feeds)],
        ["naive wgsl", naive(wgsl, [upload(x)], 1, [1])],
      ], { warm: 10, min: 9, batch: 50 });
    }
    return { adapter: `${info.vendor ?? ""} ${info.architecture ?? ""} ${info.description ?? ""}`.trim(), rows: out };
  }, { seconds, cases, tesseraMatmul });

  const byCase = {};
  for (const r of rows.rows) (byCase[r.case] ??= []).push(r);
  const verdicts = [];
  for (const [name, rs] of Object.entries(byCase)) {
    const t = rs.find((r) => r.engine === "tessera webgpu");
    const peers = rs.filter((r) => r.engine !== "tessera webgpu" && r.engine !== "naive wgsl" && !r.error);
    const nv = rs.find((r) => r.engine === "naive wgsl");
    if (!t || t.error) { verdicts.push({ case: name, verdict: "tessera failed" }); failed = true; continue; }
    if (name.startsWith("1-element")) {
      verdicts.push({ case: name, tessera_ms: t.ms, floor: "<= 0.5 ms", met: t.ms <= 0.5 });
    } else if (name.startsWith("relu")) {
      verdicts.push({ case: name, tessera_over_naive: t.rate / nv.rate, floor: ">= 1x the naive kernel", met: t.rate >= nv.rate });
    } else {
      const best = peers.reduce((a, r) => (r.rate > (a?.rate ?? 0) ? r : a), null);
      verdicts.push({ case: name, best_peer: best?.engine, tessera_over_best_peer: t.rate / best.rate, floor: ">= 1.5x the best WebGPU peer", met: t.rate >= 1.5 * best.rate });
    }
  }
  if (json) {
    for (const r of rows.rows) console.log(JSON.stringify({ adapter: rows.adapter, ...r }));
    for (const v of verdicts) console.log(JSON.stringify(v));
  } else {
    console.log(`issue #21's browser cases (${CHROMIUM}, adapter: ${rows.adapter}, medians)\n`);
    for (const r of rows.rows) {
      const rate = r.unit === "ms" ? `${r.ms.toFixed(3)} ms` : `${r.rate.toFixed(3)} ${r.unit}`;
      const diff = Number.isFinite(r.max_abs_diff_vs_tessera) ? r.max_abs_diff_vs_tessera.toExponential(1) : "-";
      console.log(`${r.case.padEnd(34)} ${r.engine.padEnd(24)} ${r.error ? `FAILED: ${r.error}` : `${rate.padStart(16)}  (${r.ms.toFixed(2)} ms, max |diff| vs tessera ${diff})`}`);
    }
    console.log("\nfloors:");
    for (const v of verdicts) console.log(`  ${JSON.stringify(v)}`);
  }
  return !failed;
});
