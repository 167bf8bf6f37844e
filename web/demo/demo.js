// The demo page: train an MNIST MLP live, draw a digit, compare sentences with MiniLM.
// Everything runs through the tessera-web package built into ../pkg (scripts/build_web.sh).
import init, { Embedder, Mnist, Model, Optimizer, Tensor, Tessera } from "../pkg/tessera.js";

const $ = (id) => document.getElementById(id);
const TRAIN = 8000; // digits 0..8000 train, 8000..10000 are held out
const BATCH = 64;

/** State the browser tests read (window.demo). */
const demo = { steps: 0, losses: [], accuracy: null, prediction: null, similarity: null, error: null };
window.demo = demo;

function fail(message) {
  demo.error = message;
  $("status").textContent = message;
  $("status").classList.add("error");
}

window.addEventListener("error", (e) => fail(`error: ${e.message}`));
window.addEventListener("unhandledrejection", (e) => fail(`error: ${e.reason?.message ?? e.reason}`));

let mnist, model, opt, running = false;

async function main() {
  await init();
  let tessera;
  try {
    // ?backend=webgpu or ?backend=cpu overrides the automatic choice.
    const backend = new URLSearchParams(location.search).get("backend") ?? undefined;
    tessera = await Tessera.init({ backend });
  } catch (e) {
    fail(e.message);
    return;
  }
  const a = tessera.adapter, c = tessera.capabilities;
  const adapter = tessera.backend === "cpu"
    ? `CPU backend (wasm SIMD): ${tessera.placement}.`
    : `WebGPU adapter: ${a.name || "unnamed"} (${a.deviceType}; ${tessera.placement}); ` +
      `f16: ${c.f16 ? "native shader-f16" : "packed fallback"}; subgroups: ${c.subgroups ? "yes" : "no"}; ` +
      `largest binding ${(c.limits.maxStorageBufferBindingSize / 2 ** 20).toFixed(0)} MiB.`;
  demo.backend = tessera.backend;
  $("status").textContent = `${adapter} Loading digits…`;
  const response = await fetch("../../data/mnist.bin");
  if (!response.ok) return fail(`could not fetch data/mnist.bin (${response.status})`);
  mnist = Mnist.parse(await response.arrayBuffer());
  $("status").textContent = `${adapter} ${mnist.length} real MNIST digits loaded.`;
  reset();
  $("train").disabled = $("reset").disabled = false;
  $("load-model").disabled = false;
  demo.ready = true;
}

function reset() {
  model?.free();
  opt?.free();
  model = Model.mlp([784, Number($("hidden").value), 10], { seed: 1 });
  opt = Optimizer.adam(Number($("lr").value));
  demo.steps = 0;
  demo.losses = [];
  demo.accuracy = null;
  $("step").textContent = "0";
  $("loss-value").textContent = $("rate").textContent = $("accuracy").textContent = "–";
  drawLoss();
}

// A seeded generator, so runs are repeatable.
let seed = 12345;
function random() {
  seed = (seed * 1103515245 + 12345) >>> 0;
  return seed / 2 ** 32;
}

// Let the page handle input and paint between steps: on the CPU backend a step runs on
// this thread, and awaiting its result alone never gives the event loop a turn.
const channel = new MessageChannel();
const yieldToPage = () => new Promise((resolve) => {
  channel.port1.onmessage = () => resolve();
  channel.port2.postMessage(0);
});

async function trainLoop() {
  const times = [];
  while (running) {
    await yieldToPage();
    const idx = Uint32Array.from({ length: BATCH }, () => Math.floor(random() * TRAIN));
    const { x, y } = mnist.batch(idx);
    let loss;
    try {
      loss = await model.trainStep(opt, x, y);
    } catch (e) {
      running = false;
      $("train").textContent = "Train";
      return fail(`training stopped: ${e.message}`);
    } finally {
      x.dispose();
      y.dispose();
    }
    demo.steps += 1;
    demo.losses.push(loss);
    times.push(performance.now());
    if (times.length > 20) times.shift();
    $("step").textContent = demo.steps;
    $("loss-value").textContent = loss.toFixed(4);
    if (times.length > 1) {
      $("rate").textContent = ((times.length - 1) / ((times.at(-1) - times[0]) / 1000)).toFixed(1);
    }
    drawLoss();
    if (demo.steps % 100 === 0) await evaluate();
  }
}

async function evaluate() {
  let right = 0;
  for (let start = TRAIN; start < mnist.length; start += 500) {
    const idx = Uint32Array.from({ length: Math.min(500, mnist.length - start) }, (_, i) => start + i);
    const { x, y } = mnist.batch(idx);
    const pred = model.forward(x).argmax(-1);
    const [p, l] = await Promise.all([pred.toArray(), y.toArray()]);
    for (let i = 0; i < p.length; i++) right += p[i] === l[i];
    x.dispose(); y.dispose(); pred.dispose();
  }
  demo.accuracy = right / (mnist.length - TRAIN);
  $("accuracy").textContent = `${(100 * demo.accuracy).toFixed(1)}%`;
}

function drawLoss() {
  const cv = $("loss"), g = cv.getContext("2d");
  const w = cv.width, h = cv.height, pad = 34;
  g.clearRect(0, 0, w, h);
  g.strokeStyle = "#d5d9e4";
  g.fillStyle = "#5d6678";
  g.font = "12px system-ui";
  g.beginPath();
  g.moveTo(pad, 8); g.lineTo(pad, h - pad); g.lineTo(w - 8, h - pad);
  g.stroke();
  const L = demo.losses;
  const top = Math.max(2.5, ...L.slice(0, 5));
  g.fillText(top.toFixed(1), 4, 14);
  g.fillText("0", 20, h - pad);
  g.fillText(`step ${L.length}`, w - 70, h - 10);
  g.fillText("loss", pad + 6, 18);
  if (L.length < 2) return;
  const x = (i) => pad + (i / (L.length - 1)) * (w - pad - 10);
  const y = (v) => h - pad - (Math.min(v, top) / top) * (h - pad - 10);
  g.strokeStyle = "#9db8ef";
  g.beginPath();
  L.forEach((v, i) => (i ? g.lineTo(x(i), y(v)) : g.moveTo(x(i), y(v))));
  g.stroke();
  // A moving average over 20 steps.
  g.strokeStyle = "#2f6fde";
  g.lineWidth = 2;
  g.beginPath();
  let sum = 0;
  L.forEach((v, i) => {
    sum += v - (i >= 20 ? L[i - 20] : 0);
    const m = sum / Math.min(i + 1, 20);
    i ? g.lineTo(x(i), y(m)) : g.moveTo(x(i), y(m));
  });
  g.stroke();
  g.lineWidth = 1;
}

$("train").onclick = () => {
  running = !running;
  $("train").textContent = running ? "Pause" : "Train";
  if (running) trainLoop();
};
$("reset").onclick = () => {
  running = false;
  $("train").textContent = "Train";
  // Let a step in flight finish before the model is replaced.
  setTimeout(reset, 50);
};

// ---- Drawing pad -------------------------------------------------------------------
const pad = $("pad"), pen = pad.getContext("2d");
pen.lineCap = pen.lineJoin = "round";
pen.lineWidth = 20;
pen.strokeStyle = "#fff";
let drawing = false, predicting = false, dirty = false;
function point(e) {
  const r = pad.getBoundingClientRect();
  return [((e.clientX - r.left) * pad.width) / r.width, ((e.clientY - r.top) * pad.height) / r.height];
}
pad.addEventListener("pointerdown", (e) => {
  drawing = true;
  pen.beginPath();
  pen.moveTo(...point(e));
  pen.lineTo(...point(e));
  pen.stroke();
});
pad.addEventListener("pointermove", (e) => {
  if (!drawing) return;
  pen.lineTo(...point(e));
  pen.stroke();
  predictSoon();
});
window.addEventListener("pointerup", () => {
  if (drawing) predictSoon();
  drawing = false;
});
$("clear").onclick = () => {
  pen.clearRect(0, 0, pad.width, pad.height);
  $("guess").textContent = "";
  $("probs").innerHTML = "";
  demo.prediction = null;
};

/** The drawing as MNIST would have it: the digit's box scaled into 20x20, centred by mass in 28x28. */
function digitPixels() {
  const { data, width, height } = pen.getImageData(0, 0, pad.width, pad.height);
  let x0 = width, y0 = height, x1 = -1, y1 = -1;
  for (let y = 0; y < height; y++)
    for (let x = 0; x < width; x++)
      if (data[(y * width + x) * 4] > 20) {
        x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
      }
  if (x1 < 0) return null;
  const bw = x1 - x0 + 1, bh = y1 - y0 + 1, s = 20 / Math.max(bw, bh);
  const small = document.createElement("canvas");
  small.width = small.height = 28;
  const g = small.getContext("2d");
  const dw = bw * s, dh = bh * s;
  g.drawImage(pad, x0, y0, bw, bh, (28 - dw) / 2, (28 - dh) / 2, dw, dh);
  const img = g.getImageData(0, 0, 28, 28).data;
  const px = new Float32Array(784);
  let mass = 0, cx = 0, cy = 0;
  for (let i = 0; i < 784; i++) {
    px[i] = img[i * 4] / 255;
    mass += px[i]; cx += px[i] * (i % 28); cy += px[i] * Math.floor(i / 28);
  }
  const sx = Math.round(14 - cx / mass), sy = Math.round(14 - cy / mass);
  const out = new Float32Array(784);
  for (let y = 0; y < 28; y++)
    for (let x = 0; x < 28; x++) {
      const fx = x - sx, fy = y - sy;
      if (fx >= 0 && fx < 28 && fy >= 0 && fy < 28) out[y * 28 + x] = px[fy * 28 + fx];
    }
  return out;
}

function predictSoon() {
  dirty = true;
  if (!predicting) predict();
}

async function predict() {
  if (!model) return;
  predicting = true;
  while (dirty) {
    dirty = false;
    const px = digitPixels();
    if (!px) break;
    const x = Tensor.fromArray(px, [1, 784]);
    let probs;
    try {
      const p = model.forward(x).softmax(-1);
      probs = await p.toArray();
      p.dispose();
    } catch (e) {
      // The model is mid-step; try again on the next stroke.
      dirty = true;
      await new Promise((r) => setTimeout(r, 30));
      continue;
    } finally {
      x.dispose();
    }
    const best = probs.indexOf(Math.max(...probs));
    demo.prediction = { digit: best, probs: Array.from(probs) };
    $("guess").textContent = `→ ${best}`;
    $("probs").innerHTML = Array.from(probs, (p, d) =>
      `<span>${d}</span><div class="bar"><div style="width:${(100 * p).toFixed(1)}%"></div></div><span>${(100 * p).toFixed(1)}%</span>`).join("");
  }
  predicting = false;
}

// ---- Sentence similarity -------------------------------------------------------------
let embedder = null;

function readFile(file, onProgress) {
  return new Promise((ok, bad) => {
    const r = new FileReader();
    r.onprogress = (e) => e.lengthComputable && onProgress(e.loaded / e.total);
    r.onload = () => ok(r.result);
    r.onerror = () => bad(new Error(`could not read ${file.name}: ${r.error}`));
    r.readAsArrayBuffer(file);
  });
}

$("load-model").onclick = async () => {
  const files = Array.from($("model-files").files);
  const find = (name) => files.find((f) => f.name === name || f.name.endsWith(name));
  const model = find(".safetensors"), tokenizer = find("tokenizer.json"), config = find("config.json");
  if (!model || !tokenizer || !config) {
    $("model-stage").textContent = "choose model.safetensors, tokenizer.json and config.json together";
    return;
  }
  $("load-model").disabled = true;
  const progress = $("model-progress");
  try {
    $("model-stage").textContent = `reading ${model.name}`;
    const weights = await readFile(model, (f) => (progress.value = 0.5 * f));
    embedder?.free();
    embedder = await Embedder.load(
      { model: weights, tokenizer: await tokenizer.text(), config: await config.text() },
      {
        dtype: $("model-dtype").value,
        onProgress: ({ stage, progress: p }) => {
          progress.value = 0.5 + 0.5 * p;
          $("model-stage").textContent = stage;
        },
      });
    $("model-stage").textContent = `ready: ${embedder.dim}-dimensional embeddings`;
    $("compare").disabled = false;
    demo.modelReady = true;
  } catch (e) {
    $("model-stage").textContent = e.message;
    demo.error = e.message;
  } finally {
    $("load-model").disabled = false;
  }
};

$("compare").onclick = async () => {
  const texts = $("sentences").value.split("\n").map((s) => s.trim()).filter(Boolean);
  if (!texts.length || !embedder) return;
  const t0 = performance.now();
  const e = await embedder.embed(texts);
  const ms = performance.now() - t0;
  const cos = e.map((a) => e.map((b) => a.reduce((s, v, i) => s + v * b[i], 0)));
  demo.similarity = cos;
  const cell = (v) => `<td style="background:rgba(47,111,222,${Math.max(0, v).toFixed(2)});color:${v > 0.55 ? "#fff" : "#1d2330"}">${v.toFixed(2)}</td>`;
  const esc = (s) => s.replace(/[&<>]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" })[c]);
  $("similarity").innerHTML = `<table class="sim">${texts.map((t, i) =>
    `<tr><th title="${esc(t)}">${esc(t.slice(0, 28))}${t.length > 28 ? "…" : ""}</th>${cos[i].map(cell).join("")}</tr>`).join("")}</table>
    <p class="note">${texts.length} sentences embedded in ${ms.toFixed(0)} ms (one batch).</p>`;
};

main().catch((e) => fail(e.message ?? String(e)));
