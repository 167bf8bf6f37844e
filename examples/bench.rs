//! The benchmark table: `cargo run --release --example bench [-- FILTER ...] [--json]`.
//!
//! Each row is a case, its dtype and shape, the median wall time of a realisation that
//! waits for the GPU, and GFLOP/s (or sentences/s for `bert-embed`). `--json` prints the
//! same rows as JSON lines. Filters keep the cases whose name contains one of them.
//!
//! Cases: `elementwise` (a fused gelu chain), `elementwise-ops` (single ops and chains
//! over 4M f32), `reduce` (row sums), `softmax`, `layer_norm`, `matmul` (square 256 to
//! 2048 in f32, 512 and 1024 in f16, and the BERT-like 128x384x1536 product
//! `x @ w.t()` with w in f32, f16, q8_0 and q4_0; each row gives `vs_naive`, the
//! speed-up over a one-thread-per-output kernel kept here as a baseline, and
//! `cold_ms`), `matmul-batched` (8 x 128x64 @ 64x128), `gemv`
//! (1x4096 @ 4096x4096 weights in f32, f16, q8_0, q4_0: GB/s of weight bytes read, and
//! `quant_err`, the output's relative RMS error against f32), `conv2d` (batch 8,
//! 64->64 channels, 56x56, 3x3, padding 1), `attention` (1 x 12 heads x seq 128 and
//! 512 x 64, and 1 x 8 heads x seq 512 x 128, f32 and f16: the device's choice, then
//! `attention-fused` and `attention-composed`), `bert-embed` (all-MiniLM-L6-v2 at sequence 128, batch 1, 8
//! and 32, Linear weights in f32, f16, q8_0 and q4_0, with the dispatches one embedding
//! call runs; needs scripts/fetch_minilm.sh),
//! `bert-encoder` and `onnx-bert` (the same MiniLM encoder at batch x 128, f32, to the
//! last hidden state: the native `models::bert` path, and the ONNX file that
//! scripts/make_minilm_onnx.sh builds, imported with `tessera::onnx`),
//! `mlp-train` (MLP 784-256-10, batch 64, Adam) and `cnn-train` (the MNIST CNN, batch
//! 64, Adam): steps/s over blocks of 10 steps submitted back to back (the loss read
//! after each block, as a training loop that logs every 10 steps), dispatches and
//! submits per step, and `cold_ms`, the time from a fresh process's start to its first
//! finished step (measured in a child process). `peak` runs only when named: f32
//! matmul 4096^3 and 8192^3 and Q4_0 GEMV 1x4096x4096 and 1x16384x16384, each with
//! `kernel_ms`, the kernels' GPU time from timestamps (issue 21 item 7).

use clap::Parser;
use std::time::Instant;
use tessera::models::bert::SentenceEmbedder;
use tessera::nn::{loss, Activation, Conv2d, Flatten, Layer, Linear, MaxPool2d, Sequential};
use tessera::ops::nn::Conv2dOptions;
use tessera::optim::{Adam, Optimizer, StepOptions};
use tessera::{quant, DType, Device, Tensor};

#[derive(Parser)]
struct Args {
    /// Keep only cases whose name contains one of these.
    filters: Vec<String>,
    /// JSON lines instead of a table.
    #[arg(long)]
    json: bool,
    /// Square matmul sizes.
    #[arg(long, value_delimiter = ',', default_value = "256,512,1024,2048")]
    sizes: Vec<usize>,
    /// Batch sizes for bert-embed.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batches: Vec<usize>,
    /// Linear weight dtypes for bert-embed (f32, f16, q8_0, q4_0; all by default).
    #[arg(long, value_delimiter = ',')]
    weights: Vec<String>,
    /// Sequence length (word pieces, [CLS] and [SEP] included) for bert-embed.
    #[arg(long, default_value_t = 128)]
    seq: usize,
    /// Minimum timed seconds per case (1 by default, 2 with `--peer-cases`).
    #[arg(long)]
    seconds: Option<f64>,
    /// Skip the matmul autotuner (its cached result still applies; TESSERA_AUTOTUNE=0
    /// ignores the cache).
    #[arg(long)]
    no_tune: bool,
    /// Print the top kernels by time after the table (GPU timestamp queries, or the
    /// CPU backend's own clock).
    #[arg(long)]
    top: bool,
    /// The devices to run every case on, in one run: `auto` (what `Device::new()`
    /// picks), `cpu`, `gpu` (the best wgpu adapter, software or not), or part of an
    /// adapter's name. With several, a table of speed ratios to the first follows.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    devices: Vec<String>,
    /// Also time numpy's matmul (the machine's BLAS) at the square sizes, with this
    /// Python (`scripts/setup_python.sh` makes `.venv`); `auto` looks for
    /// `.venv/bin/python`.
    #[arg(long)]
    blas: Option<String>,
    /// Run exactly the cases and the method of the table in issue #21 (burn 0.22.1's
    /// wgpu backend beside Tessera): 3 warm-ups, then at least 5 timed iterations until
    /// `--seconds`, each forced to completion by reading back one
    /// element of its output; every case twice, in two interleaved passes; each pass's
    /// median, and the first call's time (compile and tune). With `--json`, one line per
    /// case: `{"case", "device", "rate": [pass 1, pass 2], "unit", "median_ms": [..],
    /// "first_ms"}`, the same keys as the burn program, so the two compare line by line.
    #[arg(long)]
    peer_cases: bool,
    /// Internal: run one training step of this model in a fresh process and print the
    /// milliseconds from process start (the child of `*-train`'s `cold_ms`).
    #[arg(long, hide = true)]
    cold_train: Option<String>,
}

impl Args {
    /// The minimum timed seconds per case.
    fn seconds(&self) -> f64 {
        self.seconds.unwrap_or(if self.peer_cases { 2.0 } else { 1.0 })
    }
}

struct Rows {
    json: bool,
    printed: usize,
    /// Every row so far, for the ratio table.
    all: Vec<Row>,
    /// The device of the rows being pushed.
    device: String,
}

impl Rows {
    /// Record a row and print it at once (long cases should not hide earlier results).
    fn push(&mut self, mut r: Row) {
        r.device = self.device.clone();
        if self.json {
            let rate_key = match r.unit {
                "GFLOP/s" => "gflops",
                "GB/s" => "gbps",
                "steps/s" => "steps_per_s",
                _ => "sentences_per_s",
            };
            println!("{}", {
                let mut v = serde_json::json!({ "case": r.case, "device": r.device, "dtype": r.dtype, "shape": r.shape, "median_ms": r.median_ms, "cold_ms": r.cold_ms, rate_key: r.rate });
                if let (Some(obj), Some(extra)) = (v.as_object_mut(), r.extra.as_ref().and_then(|e| e.as_object())) {
                    obj.extend(extra.clone());
                }
                v
            });
        } else {
            let mut more = String::new();
            for (k, v) in r.extra.as_ref().and_then(|e| e.as_object()).into_iter().flatten() {
                if let Some(x) = v.as_f64() {
                    more += &format!("  {k} {}", if x.abs() < 0.01 { format!("{x:.1e}") } else { format!("{x:.2}") });
                }
            }
            println!(
                "{:<14} {:<5} {:<24} {:>9.2} ms {:>9.2} {:<11} cold {:>5.0} ms{more}",
                r.case, r.dtype, r.shape, r.median_ms, r.rate, r.unit, r.cold_ms
            );
        }
        self.printed += 1;
        self.all.push(r);
    }

    /// Speed of each device relative to the first, per case present on both.
    fn ratios(&self, devices: &[String]) {
        if devices.len() < 2 {
            return;
        }
        println!("\nspeed relative to {} (same run):", devices[0]);
        for r in self.all.iter().filter(|r| r.device == devices[0]) {
            let mut line = format!("{:<14} {:<5} {:<24}", r.case, r.dtype, r.shape);
            for other in &devices[1..] {
                let o = self
                    .all
                    .iter()
                    .find(|o| &o.device == other && o.case == r.case && o.dtype == r.dtype && o.shape == r.shape);
                if let Some(o) = o {
                    line += &format!("  {other}: {:.2}x", o.rate / r.rate);
                }
            }
            println!("{line}");
        }
    }
}

struct Row {
    case: &'static str,
    /// The device's short name (set by `Rows::push`).
    device: String,
    dtype: String,
    shape: String,
    median_ms: f64,
    cold_ms: f64,
    rate: f64,
    unit: &'static str,
    /// More JSON fields (training rows: dispatches and submits per step).
    extra: Option<serde_json::Value>,
}

/// Run `f` once cold, then until `seconds` have passed (2 to 30 times); median in ms.
fn time(seconds: f64, mut f: impl FnMut()) -> (f64, f64) {
    let t0 = Instant::now();
    f();
    let cold = t0.elapsed().as_secs_f64() * 1e3;
    let mut v = Vec::new();
    let start = Instant::now();
    while v.len() < 2 || (start.elapsed().as_secs_f64() < seconds && v.len() < 30) {
        let t = Instant::now();
        f();
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], cold)
}

/// The baseline of `vs_naive`: one invocation per output looping over K, 16x16
/// workgroups, f32, run straight through wgpu on the bench's device. Median ms of `reps`
/// runs after one warm-up.
fn naive_matmul_ms(d: &Device, m: usize, n: usize, k: usize, reps: usize) -> Option<f64> {
    use tessera::wgpu;
    let (dev, queue) = d.wgpu()?;
    const SRC: &str = "
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> dims: vec4<u32>;
@compute @workgroup_size(16, 16, 1)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let row = g.y;
    let col = g.x;
    if (row >= dims.x || col >= dims.y) {
        return;
    }
    var s = 0.0;
    for (var k = 0u; k < dims.z; k = k + 1u) {
        s = fma(a[row * dims.z + k], b[k * dims.y + col], s);
    }
    c[row * dims.y + col] = s;
}";
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("naive_matmul"),
        source: wgpu::ShaderSource::Wgsl(SRC.into()),
    });
    let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("naive_matmul"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let storage = |floats: usize| {
        dev.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (floats * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    };
    let (a, b, c) = (storage(m * k), storage(k * n), storage(m * n));
    queue.write_buffer(&a, 0, &vec![0x3f80_0000u32.to_le_bytes(); m * k].concat());
    queue.write_buffer(&b, 0, &vec![0x3f00_0000u32.to_le_bytes(); k * n].concat());
    let dims = dev.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    queue.write_buffer(&dims, 0, &[m as u32, n as u32, k as u32, 0].map(u32::to_le_bytes).concat());
    let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[&a, &b, &c, &dims]
            .iter()
            .enumerate()
            .map(|(i, buf)| wgpu::BindGroupEntry { binding: i as u32, resource: buf.as_entire_binding() })
            .collect::<Vec<_>>(),
    });
    let run = || {
        let t = Instant::now();
        let mut enc = dev.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(n.div_ceil(16) as u32, m.div_ceil(16) as u32, 1);
        }
        queue.submit([enc.finish()]);
        dev.poll(wgpu::PollType::wait_indefinitely()).ok()?;
        Some(t.elapsed().as_secs_f64() * 1e3)
    };
    run()?;
    let mut v: Vec<f64> = (0..reps.max(1)).map(|_| run()).collect::<Option<_>>()?;
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

/// Relative RMS error of `got` against `want`.
fn rel_rms(got: &[f32], want: &[f32]) -> f64 {
    let (mut e, mut w) = (0.0f64, 0.0f64);
    for (g, r) in got.iter().zip(want) {
        e += (*g as f64 - *r as f64).powi(2);
        w += (*r as f64).powi(2);
    }
    (e / w.max(1e-30)).sqrt()
}

fn sync(d: &Device, t: &Tensor) {
    t.realize_blocking().expect("realise");
    d.synchronize().expect("synchronize");
}

/// Median GPU time in ms of the kernels one call of `f` runs (their timestamps summed),
/// over `reps` calls; `None` where the adapter has no timestamp queries.
fn kernel_ms(d: &Device, reps: usize, f: impl Fn() -> Tensor) -> Option<f64> {
    let was_on = tessera::profile::enabled();
    let mut v = Vec::new();
    for _ in 0..reps {
        tessera::profile::start();
        sync(d, &f());
        let events = tessera::profile::stop();
        if events.is_empty() {
            break;
        }
        v.push(events.iter().map(|e| e.duration_us).sum::<f64>() / 1e3);
    }
    if was_on {
        tessera::profile::start();
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

/// `peak` (only when named): the figures a real GPU is held to (issue 21, item 7):
/// f32 matmul 4096^3 and 8192^3 against the FMA peak, and Q4_0 GEMV against memory
/// bandwidth, at 1x4096x4096 (9.4 MB of weights, which a large L2 cache holds) and
/// 1x16384x16384 (151 MB, more than any L2). Each row gives the wall time of a
/// realisation with its wait, and `kernel_ms`, the kernels' GPU time from timestamps.
fn peak_cases(d: &Device, args: &Args, rows: &mut Rows) -> tessera::Result<()> {
    for n in [4096usize, 8192] {
        let a = Tensor::rand([n, n], 3, d) - 0.5;
        let b = Tensor::rand([n, n], 4, d) - 0.5;
        sync(d, &a);
        sync(d, &b);
        let (ms, cold) = time(args.seconds(), || sync(d, &a.matmul(&b)));
        let kms = kernel_ms(d, 5, || a.matmul(&b));
        let gflop = 2.0 * (n * n * n) as f64 / 1e9;
        // Spot check against the reference: one row of C.
        let (ar, bv) = (a.slice(0, 7, 8, 1).to_vec_blocking::<f32>()?, b.to_vec_blocking::<f32>()?);
        let want: Vec<f32> =
            (0..n).map(|j| (0..n).map(|k| ar[k] as f64 * bv[k * n + j] as f64).sum::<f64>() as f32).collect();
        let full = a.matmul(&b).slice(0, 7, 8, 1).to_vec_blocking::<f32>()?;
        rows.push(Row {
            device: String::new(),
            case: "peak-matmul",
            dtype: "f32".into(),
            shape: format!("{n}x{n}x{n}"),
            median_ms: ms,
            cold_ms: cold,
            rate: gflop / (ms / 1e3),
            unit: "GFLOP/s",
            extra: Some(serde_json::json!({
                "kernel_ms": kms,
                "kernel_gflops": kms.map(|k| gflop / (k / 1e3)),
                "row_err": rel_rms(&full, &want),
            })),
        });
    }
    for n in [4096usize, 16384] {
        let x = Tensor::rand([1, n], 7, d) - 0.5;
        let w32 = Tensor::rand([n, n], 8, d) - 0.5;
        let w = quant::convert_blocking(&w32, DType::Q4_0)?;
        let want = x.matmul(&w.cast(DType::F32).t()).to_vec_blocking::<f32>()?;
        drop(w32);
        sync(d, &x);
        let (ms, cold) = time(args.seconds(), || sync(d, &x.matmul(&w.t())));
        let kms = kernel_ms(d, 9, || x.matmul(&w.t()));
        let bytes = quant::block_bytes(DType::Q4_0) as f64 / quant::BLOCK as f64 * (n * n) as f64;
        let err = rel_rms(&x.matmul(&w.t()).to_vec_blocking::<f32>()?, &want);
        rows.push(Row {
            device: String::new(),
            case: "peak-gemv",
            dtype: "q4_0".into(),
            shape: format!("1x{n}x{n}"),
            median_ms: ms,
            cold_ms: cold,
            rate: bytes / 1e9 / (ms / 1e3),
            unit: "GB/s",
            extra: Some(serde_json::json!({
                "kernel_ms": kms,
                "kernel_gbps": kms.map(|k| bytes / 1e9 / (k / 1e3)),
                "err_vs_dequantised": err,
            })),
        });
    }
    Ok(())
}

/// A training model of the bench and one step of it on random MNIST-shaped data.
struct Trainer {
    model: Sequential,
    opt: Adam,
    x: Tensor,
    y: Tensor,
}

impl Trainer {
    fn new(kind: &str, d: &Device) -> Trainer {
        let cnn = kind == "cnn";
        let model = if cnn {
            Sequential::new()
                .add(Conv2d::new(1, 8, 3, Conv2dOptions::new(1, 1), 1, d))
                .add(Activation::Relu)
                .add(MaxPool2d::new(2))
                .add(Conv2d::new(8, 16, 3, Conv2dOptions::new(1, 1), 2, d))
                .add(Activation::Relu)
                .add(MaxPool2d::new(2))
                .add(Flatten)
                .add(Linear::new(16 * 7 * 7, 64, true, 3, d))
                .add(Activation::Relu)
                .add(Linear::new(64, 10, true, 4, d))
        } else {
            Sequential::new()
                .add(Linear::new(784, 256, true, 1, d))
                .add(Activation::Relu)
                .add(Linear::new(256, 10, true, 2, d))
        };
        let shape = if cnn { vec![64, 1, 28, 28] } else { vec![64, 784] };
        let x = Tensor::rand(shape, 5, d);
        let labels: Vec<i32> = (0..64).map(|i: i32| i * 7 % 10).collect();
        let y = Tensor::from_slice(&labels, [64], d);
        tessera::read_all_blocking(&[x.clone(), y.clone()]).expect("upload");
        Trainer { model, opt: Adam::new(1e-3), x, y }
    }

    /// One step; with `sync` false it is only submitted (the loss stays on the device).
    fn step(&mut self, sync: bool) -> Tensor {
        let l = loss::cross_entropy(&self.model.forward(&self.x), &self.y);
        let o = StepOptions { no_sync: !sync, ..Default::default() };
        self.opt.step_with(&mut self.model, &l, o).expect("step");
        l
    }

    /// `n` steps as a training loop runs them: submitted back to back (the next graph is
    /// built while the GPU runs the last), the loss of the last one read at the end.
    fn steps(&mut self, n: usize) {
        for _ in 1..n {
            self.step(false);
        }
        let l = self.step(false);
        l.to_vec_blocking::<f32>().expect("loss");
    }
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> tessera::Result<()> {
    let started = Instant::now();
    let args = Args::parse();
    if let Some(kind) = &args.cold_train {
        let d = Device::new()?;
        Trainer::new(kind, &d).step(true);
        println!("{}", started.elapsed().as_secs_f64() * 1e3);
        return Ok(());
    }
    let want = |name: &str| args.filters.is_empty() || args.filters.iter().any(|f| name.contains(f.as_str()));
    if !args.no_tune {
        // Tune the matmul once per adapter and driver; later runs read the cache.
        // Tune the GPU adapter even where Device::new() would pick the CPU backend (a
        // software adapter such as lavapipe): `--devices gpu` runs on it.
        let mut opts = tessera::DeviceOptions::from_env();
        if opts.adapter.as_deref().is_none_or(|a| a == "cpu" || a == "auto") {
            opts.adapter = Some("gpu".into());
        }
        match tessera::device::autotune::ensure(&opts, None) {
            Ok(t) => {
                let how = if t.cached {
                    "cached".to_string()
                } else {
                    let all: Vec<String> = t.timings.iter().map(|(c, ms)| format!("{} {ms:.1} ms", c.name())).collect();
                    format!("tuned in {:.1} s: {}", t.elapsed_ms / 1e3, all.join(", "))
                };
                eprintln!("autotune: {} ({how})", t.best.name());
                let attn = if t.fused_attention { "fused" } else { "composed" };
                match t.attention_ms {
                    Some((c, f)) => eprintln!("autotune: attention {attn} (composed {c:.2} ms, fused {f:.2} ms)"),
                    None => eprintln!("autotune: attention {attn} (cached)"),
                }
                let conv = if t.implicit_gemm { "implicit GEMM" } else { "materialised columns" };
                match t.conv_ms {
                    Some((m, i)) => eprintln!("autotune: conv2d {conv} (materialised {m:.2} ms, implicit {i:.2} ms)"),
                    None => eprintln!("autotune: conv2d {conv} (cached)"),
                }
            }
            Err(e) => eprintln!("autotune skipped: {e}"),
        }
    }
    let devices = args
        .devices
        .iter()
        .map(|name| match name.as_str() {
            "auto" => Device::new(),
            other => Device::with_options(tessera::DeviceOptions {
                adapter: Some(other.into()),
                ..tessera::DeviceOptions::from_env()
            }),
        })
        .collect::<tessera::Result<Vec<Device>>>()?;
    if args.top {
        tessera::profile::start();
    }
    if args.peer_cases {
        for (d, name) in devices.iter().zip(&args.devices) {
            peer_cases(d, name, &args, &want)?;
        }
        return Ok(());
    }
    let mut rows = Rows { json: args.json, printed: 0, all: Vec::new(), device: String::new() };
    for (d, name) in devices.iter().zip(&args.devices) {
        rows.device = name.clone();
        if !args.json {
            println!(
                "Tessera bench on {d} ({}){}\n",
                d.info().placement,
                if args.devices.len() > 1 { format!(", as {name:?}") } else { String::new() }
            );
        }
        cases(d, &args, &want, &mut rows)?;
        if !args.json {
            println!();
        }
    }
    if let Some(python) = &args.blas {
        blas_rows(python, &args, &mut rows);
    }
    if rows.printed == 0 {
        eprintln!("no case matched {:?}", args.filters);
    }
    rows.ratios(&args.devices.iter().cloned().chain(args.blas.iter().map(|_| "numpy".to_string())).collect::<Vec<_>>());
    if args.top {
        // The totals include each kernel's first (cold) call; the median per call does not.
        let events = tessera::profile::events();
        println!("\ntop kernels by time (total, calls, median per call):");
        for (name, ms, calls) in tessera::profile::top(10) {
            let mut each: Vec<f64> = events.iter().filter(|e| e.label == name).map(|e| e.duration_us / 1e3).collect();
            each.sort_by(f64::total_cmp);
            let median = each.get(each.len() / 2).copied().unwrap_or(0.0);
            println!("{ms:10.2} ms {calls:6}x {median:9.3} ms  {name}");
        }
    }
    Ok(())
}

/// One case of `--peer-cases`: its name, the work one iteration does (in `unit`s), and
/// the iteration (build the graph, realise it, read one element back).
struct PeerCase<'a> {
    name: &'static str,
    work: f64,
    unit: &'static str,
    run: Box<dyn FnMut() -> tessera::Result<()> + 'a>,
}

/// Realise `t` on its device and read one element of it back (what forces the work to
/// finish, as the peer's loop does).
fn force(t: &Tensor) -> tessera::Result<()> {
    t.realize_blocking()?;
    let one = t.reshape([t.numel()]).narrow(0, 0, 1).cast(DType::F32);
    one.to_vec_blocking::<f32>().map(|_| ())
}

/// Issue #21's table on device `d`, by its method (see `Args::peer_cases`).
fn peer_cases(d: &Device, name: &str, args: &Args, want: &dyn Fn(&str) -> bool) -> tessera::Result<()> {
    let seconds = args.seconds();
    let input = |shape: &[usize], seed: u64, dt: DType| -> tessera::Result<Tensor> {
        let t = (Tensor::rand(shape.to_vec(), seed, d) - 0.5).cast(dt);
        t.realize_blocking()?;
        Ok(t)
    };
    let mut cases: Vec<PeerCase> = Vec::new();
    for (case, dt, n) in [
        ("matmul f32 1024", DType::F32, 1024),
        ("matmul f32 512", DType::F32, 512),
        ("matmul f16 512", DType::F16, 512),
    ] {
        let (a, b) = (input(&[n, n], 1, dt)?, input(&[n, n], 2, dt)?);
        let work = 2.0 * (n * n * n) as f64 / 1e9;
        cases.push(PeerCase { name: case, work, unit: "GFLOP/s", run: Box::new(move || force(&a.matmul(&b))) });
    }
    let (a, b) = (input(&[8, 128, 64], 3, DType::F32)?, input(&[8, 64, 128], 4, DType::F32)?);
    cases.push(PeerCase {
        name: "matmul-batched f32 8x128x64x128",
        work: 2.0 * (8 * 128 * 128 * 64) as f64 / 1e9,
        unit: "GFLOP/s",
        run: Box::new(move || force(&a.matmul(&b))),
    });
    let n = 4 << 20;
    let x = input(&[n], 5, DType::F32)?;
    cases.push(PeerCase {
        name: "elementwise f32 4M",
        work: (n * 8) as f64 / 1e9,
        unit: "GB/s",
        run: Box::new(move || force(&((&x * 2.0 + 1.0).exp().tanh() * &x).relu())),
    });
    let (x, w) = (input(&[8, 64, 56, 56], 6, DType::F32)?, input(&[64, 64, 3, 3], 7, DType::F32)?);
    cases.push(PeerCase {
        name: "conv2d f32 8x64x56x56 k3",
        work: 2.0 * (8 * 64 * 56 * 56 * 64 * 9) as f64 / 1e9,
        unit: "GFLOP/s",
        run: Box::new(move || force(&x.conv2d(&w, None, Conv2dOptions::new(1, 1)))),
    });
    let qkv = [
        input(&[1, 12, 128, 64], 8, DType::F32)?,
        input(&[1, 12, 128, 64], 9, DType::F32)?,
        input(&[1, 12, 128, 64], 10, DType::F32)?,
    ];
    let attn_work = 4.0 * (12 * 128 * 128 * 64) as f64 / 1e9;
    let [q, k, v] = qkv.clone();
    cases.push(PeerCase {
        name: "attention f32 1x12x128x64",
        work: attn_work,
        unit: "GFLOP/s",
        run: Box::new(move || force(&Tensor::scaled_dot_product_attention(&q, &k, &v, None, false))),
    });
    let [q, k, v] = qkv;
    cases.push(PeerCase {
        name: "attention-composed f32 1x12x128x64",
        work: attn_work,
        unit: "GFLOP/s",
        run: Box::new(move || force(&(q.matmul(&k.t()) / 8.0).softmax(-1).matmul(&v))),
    });
    let mut trainer = Trainer::new("mlp", d);
    cases.push(PeerCase {
        name: "mlp-train adam b64",
        work: 1.0,
        unit: "steps/s",
        run: Box::new(move || trainer.step(false).to_vec_blocking::<f32>().map(|_| ())),
    });
    let one = input(&[1], 11, DType::F32)?;
    cases.push(PeerCase {
        name: "tiny-op readback",
        work: 1e-3,
        unit: "ops/ms",
        run: Box::new(move || (&one + 1.0).to_vec_blocking::<f32>().map(|_| ())),
    });
    cases.retain(|c| want(c.name));
    // Two interleaved passes over every case; per case, per pass: the median ms.
    let mut medians: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut first = vec![0.0; cases.len()];
    for pass in 0..2 {
        for (c, case) in cases.iter_mut().enumerate() {
            let mut iteration = || -> tessera::Result<f64> {
                let t = Instant::now();
                (case.run)()?;
                Ok(t.elapsed().as_secs_f64() * 1e3)
            };
            if pass == 0 {
                first[c] = iteration()?;
            }
            for _ in 0..3 {
                iteration()?;
            }
            let (start, mut v) = (Instant::now(), Vec::new());
            while v.len() < 5 || (start.elapsed().as_secs_f64() < seconds && v.len() < 200) {
                v.push(iteration()?);
            }
            v.sort_by(|a, b| a.total_cmp(b));
            medians[c].push(v[v.len() / 2]);
        }
    }
    if !args.json {
        println!("Tessera, issue #21's cases on {d} ({name}); rates of pass 1, pass 2\n");
    }
    for (c, case) in cases.iter().enumerate() {
        let rate: Vec<f64> = medians[c].iter().map(|ms| case.work / (ms / 1e3)).collect();
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "case": case.name, "device": name, "rate": rate, "unit": case.unit, "median_ms": medians[c], "first_ms": first[c] })
            );
        } else {
            println!(
                "{:<36} {:>9.2} {:>9.2} {:<8} ({:.2}, {:.2} ms)  first call {:.0} ms",
                case.name, rate[0], rate[1], case.unit, medians[c][0], medians[c][1], first[c]
            );
        }
    }
    Ok(())
}

/// Every case the filters keep, on device `d`.
fn cases(d: &Device, args: &Args, want: &dyn Fn(&str) -> bool, rows: &mut Rows) -> tessera::Result<()> {
    if want("elementwise") {
        let n = 1 << 20;
        let x = Tensor::rand([n], 1, d);
        sync(d, &x);
        let (ms, cold) = time(args.seconds(), || sync(d, &((&x * 2.0 + 1.0).gelu() * &x)));
        let gb = (n * 8) as f64 / 1e9;
        rows.push(Row {
            device: String::new(),
            case: "elementwise",
            dtype: "f32".into(),
            shape: format!("{n}"),
            median_ms: ms,
            cold_ms: cold,
            rate: gb / (ms / 1e3),
            unit: "GB/s",
            extra: None,
        });
    }
    if want("elementwise-ops") {
        // One op or short chain per row over 4M f32, for comparing the forms of the
        // vector element-wise kernel (`TESSERA_ELEMENTWISE_FORM`).
        let n = 4 << 20;
        let x = Tensor::rand([n], 5, d) - 0.5;
        let y = Tensor::rand([n], 6, d) - 0.5;
        sync(d, &x);
        sync(d, &y);
        let exprs: [(&str, &dyn Fn() -> Tensor); 11] = [
            ("x*2+1", &|| &x * 2.0 + 1.0),
            ("exp", &|| x.exp()),
            ("sigmoid", &|| x.sigmoid()),
            ("relu", &|| x.relu()),
            ("relu(x+y)", &|| (&x + &y).relu()),
            ("relu(tanh(exp(x*2+1))*x)", &|| ((&x * 2.0 + 1.0).exp().tanh() * &x).relu()),
            ("gelu", &|| x.gelu()),
            ("log(|x|+1)", &|| (x.abs() + 1.0).log()),
            ("x/(sqrt(|y|)+1e-8)", &|| &x / (y.abs().sqrt() + 1e-8)),
            ("relu(x*2+1)", &|| (&x * 2.0 + 1.0).relu()),
            ("relu(x)*y", &|| x.relu() * &y),
        ];
        for (name, f) in exprs {
            let (ms, cold) = time(args.seconds(), || sync(d, &f()));
            rows.push(Row {
                device: String::new(),
                case: "elementwise-ops",
                dtype: "f32".into(),
                shape: format!("{n} {name}"),
                median_ms: ms,
                cold_ms: cold,
                rate: (n * 8) as f64 / 1e9 / (ms / 1e3),
                unit: "GB/s",
                extra: None,
            });
        }
    }
    for (case, op) in [("reduce", 0), ("softmax", 1)] {
        if !want(case) {
            continue;
        }
        let x = Tensor::rand([1024, 1024], 2, d);
        sync(d, &x);
        let (ms, cold) = time(args.seconds(), || sync(d, &if op == 0 { x.sum(&[1], false) } else { x.softmax(-1) }));
        let gb = (1024 * 1024 * 4) as f64 / 1e9;
        rows.push(Row {
            device: String::new(),
            case,
            dtype: "f32".into(),
            shape: "1024x1024".into(),
            median_ms: ms,
            cold_ms: cold,
            rate: gb / (ms / 1e3),
            unit: "GB/s",
            extra: None,
        });
    }
    if want("layer_norm") {
        let x = Tensor::rand([1024, 1024], 2, d);
        sync(d, &x);
        let (ms, cold) = time(args.seconds(), || sync(d, &x.layer_norm(None, None, 1e-5)));
        rows.push(Row {
            device: String::new(),
            case: "layer_norm",
            dtype: "f32".into(),
            shape: "1024x1024".into(),
            median_ms: ms,
            cold_ms: cold,
            rate: (1024 * 1024 * 8) as f64 / 1e9 / (ms / 1e3),
            unit: "GB/s",
            extra: None,
        });
    }
    if want("matmul") {
        // (dtype, m, n, k, weight stored as [n, k] and read transposed: `x @ w.t()`)
        let mut cases: Vec<(DType, usize, usize, usize, bool)> =
            args.sizes.iter().map(|&n| (DType::F32, n, n, n, false)).collect();
        cases.extend([(DType::F16, 512, 512, 512, false), (DType::F16, 1024, 1024, 1024, false)]);
        for dt in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0] {
            cases.push((dt, 128, 1536, 384, true));
        }
        for (dt, m, n, k, linear) in cases {
            let a = Tensor::rand([m, k], 3, d) - 0.5;
            let w32 = Tensor::rand(if linear { [n, k] } else { [k, n] }, 4, d) - 0.5;
            // f16 weights take f16 activations; quantised ones f32 activations.
            let a = if dt == DType::F16 { a.cast(dt) } else { a };
            let (a, w) = if linear { (a, quant::convert_blocking(&w32, dt)?) } else { (a, w32.cast(dt)) };
            sync(d, &a);
            sync(d, &w);
            let run = || if linear { a.matmul(&w.t()) } else { a.matmul(&w) };
            let (ms, cold) = time(args.seconds(), || sync(d, &run()));
            let gflop = 2.0 * (m * n * k) as f64 / 1e9;
            let naive = naive_matmul_ms(d, m, n, k, if m * n * k > 1 << 30 { 1 } else { 3 });
            let mut extra = serde_json::json!({ "vs_naive": naive.map(|nm| nm / ms) });
            if dt.is_quantized() || (linear && dt == DType::F16) {
                let want = a.cast(DType::F32).matmul(&w32.t()).to_vec_blocking::<f32>()?;
                extra["quant_err"] = rel_rms(&run().cast(DType::F32).to_vec_blocking::<f32>()?, &want).into();
            }
            rows.push(Row {
                device: String::new(),
                case: "matmul",
                dtype: dt.name().into(),
                shape: format!("{m}x{n}x{k}{}", if linear { " (x@w.t)" } else { "" }),
                median_ms: ms,
                cold_ms: cold,
                rate: gflop / (ms / 1e3),
                unit: "GFLOP/s",
                extra: Some(extra),
            });
        }
    }
    if want("matmul-batched") {
        let a = Tensor::rand([8, 128, 64], 5, d);
        let b = Tensor::rand([8, 64, 128], 6, d);
        sync(d, &a);
        sync(d, &b);
        let (ms, cold) = time(args.seconds(), || sync(d, &a.matmul(&b)));
        rows.push(Row {
            device: String::new(),
            case: "matmul-batched",
            dtype: "f32".into(),
            shape: "8x128x128x64".into(),
            median_ms: ms,
            cold_ms: cold,
            rate: 2.0 * (8 * 128 * 128 * 64) as f64 / 1e9 / (ms / 1e3),
            unit: "GFLOP/s",
            extra: None,
        });
    }
    if want("linear-gelu") {
        // BERT's feed-forward up-projection: x @ w.t() + b, then GELU (one kernel when the
        // epilogue is fused into the product's store; TESSERA_EPILOGUE=0 for two).
        for (m, n, k) in [(128usize, 1536usize, 384usize), (1024, 1024, 1024)] {
            let x = Tensor::rand([m, k], 5, d) - 0.5;
            let w = Tensor::rand([n, k], 6, d) - 0.5;
            let b = Tensor::rand([n], 7, d) - 0.5;
            tessera::read_all_blocking(&[x.clone(), w.clone(), b.clone()])?;
            let run = || (x.matmul(&w.t()) + &b).gelu();
            let (ms, cold) = time(args.seconds(), || sync(d, &run()));
            let before = d.stats();
            sync(d, &run());
            let dispatches = d.stats().kernels_dispatched - before.kernels_dispatched;
            rows.push(Row {
                device: String::new(),
                case: "linear-gelu",
                dtype: "f32".into(),
                shape: format!("{m}x{n}x{k}"),
                median_ms: ms,
                cold_ms: cold,
                rate: 2.0 * (m * n * k) as f64 / 1e9 / (ms / 1e3),
                unit: "GFLOP/s",
                extra: Some(serde_json::json!({ "dispatches": dispatches })),
            });
        }
    }
    if want("gemv") {
        let (n, k) = (4096usize, 4096usize);
        let x32 = Tensor::rand([1, k], 7, d) - 0.5;
        let w32 = Tensor::rand([n, k], 8, d) - 0.5;
        sync(d, &x32);
        let want = x32.matmul(&w32.t()).to_vec_blocking::<f32>()?;
        for dt in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0] {
            let x = if dt == DType::F16 { x32.cast(dt) } else { x32.clone() };
            let w = quant::convert_blocking(&w32, dt)?;
            sync(d, &w);
            let (ms, cold) = time(args.seconds(), || sync(d, &x.matmul(&w.t())));
            let bytes = match dt {
                DType::F32 => 4.0,
                DType::F16 => 2.0,
                q => quant::block_bytes(q) as f64 / quant::BLOCK as f64,
            } * (n * k) as f64;
            let err = rel_rms(&x.matmul(&w.t()).cast(DType::F32).to_vec_blocking::<f32>()?, &want);
            rows.push(Row {
                device: String::new(),
                case: "gemv",
                dtype: dt.name().into(),
                shape: format!("1x{n}x{k}"),
                median_ms: ms,
                cold_ms: cold,
                rate: bytes / 1e9 / (ms / 1e3),
                unit: "GB/s",
                extra: Some(serde_json::json!({ "gflops": 2.0 * (n * k) as f64 / 1e9 / (ms / 1e3), "quant_err": err })),
            });
        }
    }
    if args.filters.iter().any(|f| f == "peak") {
        peak_cases(d, args, rows)?;
    }
    if want("quantize") {
        // Quantisation on the device (one kernel) against the host quantiser.
        let (r, c) = (1024usize, 1024usize);
        let x = Tensor::rand([r, c], 11, d) - 0.5;
        sync(d, &x);
        let xs = x.to_vec_blocking::<f32>()?;
        for dt in [DType::Q8_0, DType::Q4_0] {
            let (ms, cold) = time(args.seconds(), || sync(d, &x.quantize(dt)));
            let t = Instant::now();
            let host = quant::quantize(dt, &xs);
            let host_ms = t.elapsed().as_secs_f64() * 1e3;
            let q = x.quantize(dt);
            let back = q.cast(DType::F32).to_vec_blocking::<f32>()?;
            let same = q.quantized_blocks_blocking()? == host;
            rows.push(Row {
 device: String::new(),
                case: "quantize",
                dtype: dt.name().into(),
                shape: format!("{r}x{c} f32"),
                median_ms: ms,
                cold_ms: cold,
                rate: (r * c * 4) as f64 / 1e9 / (ms / 1e3),
                unit: "GB/s",
                extra: Some(serde_json::json!({ "host_ms": host_ms, "quant_err": rel_rms(&back, &xs), "same_as_host": f64::from(u8::from(same)) })),
            });
        }
    }
    if want("conv2d") {
        let x = Tensor::rand([8, 64, 56, 56], 9, d) - 0.5;
        let w = (Tensor::rand([64, 64, 3, 3], 10, d) - 0.5) * 0.1;
        sync(d, &x);
        sync(d, &w);
        let (ms, cold) = time(args.seconds(), || sync(d, &x.conv2d(&w, None, Conv2dOptions::new(1, 1))));
        rows.push(Row {
            device: String::new(),
            case: "conv2d",
            dtype: "f32".into(),
            shape: "8x64x56x56 k3 -> 64".into(),
            median_ms: ms,
            cold_ms: cold,
            rate: 2.0 * (8 * 64 * 56 * 56 * 64 * 9) as f64 / 1e9 / (ms / 1e3),
            unit: "GFLOP/s",
            extra: None,
        });
    }
    if want("attention") {
        // (heads, seq, head dim): BERT-base's heads of 64, then 8 heads of 128 (Llama's).
        let shapes = [(12usize, 128usize, 64usize), (12, 512, 64), (8, 512, 128)];
        for dt in [DType::F32, DType::F16] {
            for (heads, seq, hd) in shapes {
                let qkv: Vec<Tensor> =
                    (0..3).map(|i| (Tensor::rand([1, heads, seq, hd], 11 + i, d) - 0.5).cast(dt)).collect();
                tessera::read_all_blocking(&qkv)?;
                let (q, k, v) = (&qkv[0], &qkv[1], &qkv[2]);
                // The device's choice, then each way on its own.
                let ways: [(&'static str, &dyn Fn() -> Tensor); 3] = [
                    ("attention", &|| Tensor::scaled_dot_product_attention(q, k, v, None, false)),
                    ("attention-fused", &|| Tensor::scaled_dot_product_attention_fused(q, k, v, None, false)),
                    ("attention-composed", &|| (q.matmul(&k.t()) / (hd as f32).sqrt()).softmax(-1).matmul(v)),
                ];
                for (case, work) in ways {
                    let (ms, cold) = time(args.seconds(), || sync(d, &work()));
                    rows.push(Row {
                        device: String::new(),
                        case,
                        dtype: dt.name().into(),
                        shape: format!("1x{heads}x{seq}x{hd}"),
                        median_ms: ms,
                        cold_ms: cold,
                        rate: 4.0 * (heads * seq * seq * hd) as f64 / 1e9 / (ms / 1e3),
                        unit: "GFLOP/s",
                        extra: None,
                    });
                }
            }
        }
    }
    if want("bert-embed") {
        let dir = std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tessera/minilm");
        match SentenceEmbedder::load(&dir, d) {
            Err(e) => eprintln!("bert-embed skipped: {e} (run scripts/fetch_minilm.sh)"),
            Ok(mut emb) => {
                for dt in quant::MODEL_DTYPES {
                    if !args.weights.is_empty() && !args.weights.iter().any(|w| w == dt.name()) {
                        continue;
                    }
                    pollster::block_on(emb.quantize(dt, None))?;
                    for &batch in &args.batches {
                        // Word pieces between [CLS] and [SEP]: `--seq` in all.
                        let ids: Vec<Vec<u32>> = (0..batch)
                            .map(|b| {
                                std::iter::once(101)
                                    .chain((0..args.seq.max(2) - 2).map(|i| 1000 + ((b * 131 + i * 17) % 20000) as u32))
                                    .chain([102])
                                    .collect()
                            })
                            .collect();
                        let (ms, cold) = time(args.seconds(), || sync(d, &emb.embed_ids(&ids)));
                        let before = d.stats();
                        sync(d, &emb.embed_ids(&ids));
                        let dispatches = d.stats().kernels_dispatched - before.kernels_dispatched;
                        rows.push(Row {
                            device: String::new(),
                            case: "bert-embed",
                            dtype: dt.name().into(),
                            shape: format!("batch {batch} x seq {}", args.seq),
                            median_ms: ms,
                            cold_ms: cold,
                            rate: batch as f64 / (ms / 1e3),
                            unit: "sentences/s",
                            extra: Some(serde_json::json!({ "dispatches": dispatches })),
                        });
                    }
                    // Back to f32 for the next dtype (quantise from the original weights).
                    emb = SentenceEmbedder::load(&dir, d)?;
                }
            }
        }
    }
    if want("bert-encoder") || want("onnx-bert") {
        encoder_rows(d, args, rows, &want)?;
    }
    for kind in ["mlp", "cnn"] {
        let case = if kind == "mlp" { "mlp-train" } else { "cnn-train" };
        if !want(case) {
            continue;
        }
        let mut t = Trainer::new(kind, d);
        t.step(true);
        let before = d.stats();
        // Blocks of 10 steps, each ending with a readback; the median block over 10.
        let block = 10;
        let (ms, _) = time(args.seconds(), || t.steps(block));
        let ms = ms / block as f64;
        let after = d.stats();
        let steps = (t.opt.steps() - 1) as f64;
        let per = |a: u64, b: u64| (a - b) as f64 / steps.max(1.0);
        let cold = std::process::Command::new(
            std::env::current_exe().map_err(|e| tessera::Error::Io { path: "bench".into(), message: e.to_string() })?,
        )
        .args(["--cold-train", kind])
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
        rows.push(Row {
            device: String::new(),
            case,
            dtype: "f32".into(),
            shape: if kind == "mlp" { "784-256-10 batch 64".into() } else { "conv8-conv16-64-10 batch 64".into() },
            median_ms: ms,
            cold_ms: cold,
            rate: 1e3 / ms,
            unit: "steps/s",
            extra: Some(serde_json::json!({
                "dispatches_per_step": per(after.kernels_dispatched, before.kernels_dispatched),
                "submits_per_step": per(after.submits, before.submits),
            })),
        });
    }
    Ok(())
}

/// MiniLM's encoder to the last hidden state, natively and imported from ONNX, on the
/// same token ids.
fn encoder_rows(d: &Device, args: &Args, rows: &mut Rows, want: &dyn Fn(&str) -> bool) -> tessera::Result<()> {
    let data = std::env::var_os("TESSERA_DATA").map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tessera")
    });
    let dir = data.join("minilm");
    for &batch in &args.batches {
        let ids: Vec<i32> = (0..batch * 128)
            .map(|p| match p % 128 {
                0 => 101,
                127 => 102,
                i => 1000 + ((p / 128 * 131 + i * 17) % 20000) as i32,
            })
            .collect();
        let ids_t = Tensor::from_slice(&ids, [batch, 128], d);
        let mut push = |case: &'static str, ms: f64, cold: f64| {
            rows.push(Row {
                device: String::new(),
                case,
                dtype: "f32".into(),
                shape: format!("batch {batch} x seq 128"),
                median_ms: ms,
                cold_ms: cold,
                rate: batch as f64 / (ms / 1e3),
                unit: "sentences/s",
                extra: None,
            })
        };
        if want("bert-encoder") {
            match tessera::models::bert::load_dir(&dir, d) {
                Err(e) => eprintln!("bert-encoder skipped: {e} (run scripts/fetch_minilm.sh)"),
                Ok(model) => {
                    let mask = Tensor::ones([batch, 128], DType::F32, d);
                    let (ms, cold) = time(args.seconds(), || sync(d, &model.forward(&ids_t, &mask)));
                    push("bert-encoder", ms, cold);
                }
            }
        }
        if want("onnx-bert") {
            match tessera::onnx::OnnxModel::load(dir.join("model.onnx"), d) {
                Err(e) => eprintln!("onnx-bert skipped: {e} (run scripts/make_minilm_onnx.sh)"),
                Ok(model) => {
                    let ones = Tensor::ones([batch, 128], DType::I32, d);
                    let zeros = Tensor::zeros([batch, 128], DType::I32, d);
                    let run = || -> Tensor {
                        let out = model
                            .run(&[
                                ("input_ids", ids_t.clone()),
                                ("attention_mask", ones.clone()),
                                ("token_type_ids", zeros.clone()),
                            ])
                            .unwrap_or_else(|e| panic!("onnx-bert: {e}"));
                        out[0].tensor.clone()
                    };
                    let (ms, cold) = time(args.seconds(), || sync(d, &run()));
                    push("onnx-bert", ms, cold);
                }
            }
        }
    }
    Ok(())
}

/// numpy's matmul at the square sizes (the machine's BLAS, all its threads), as rows of
/// the device `numpy`: the yardstick for the CPU backend.
fn blas_rows(python: &str, args: &Args, rows: &mut Rows) {
    let python = if python == "auto" { ".venv/bin/python" } else { python };
    let sizes: Vec<String> = args.sizes.iter().map(|n| n.to_string()).collect();
    let script = format!(
        "import numpy as np, time\n\
         for n in [{}]:\n\
         \x20   a = np.random.rand(n, n).astype(np.float32); b = np.random.rand(n, n).astype(np.float32)\n\
         \x20   a @ b; t = []\n\
         \x20   start = time.perf_counter()\n\
         \x20   while len(t) < 3 or (time.perf_counter() - start < {} and len(t) < 30):\n\
         \x20       s = time.perf_counter(); a @ b; t.append(time.perf_counter() - s)\n\
         \x20   t.sort(); print(n, t[len(t) // 2] * 1e3)\n",
        sizes.join(","),
        args.seconds()
    );
    let out = match std::process::Command::new(python).args(["-c", &script]).output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).to_string(),
        Ok(o) => return eprintln!("blas skipped: {python} failed: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => return eprintln!("blas skipped: {python}: {e} (run scripts/setup_python.sh)"),
    };
    rows.device = "numpy".into();
    for line in out.lines() {
        let mut it = line.split_whitespace();
        let (Some(n), Some(ms)) =
            (it.next().and_then(|v| v.parse::<usize>().ok()), it.next().and_then(|v| v.parse::<f64>().ok()))
        else {
            continue;
        };
        rows.push(Row {
            case: "matmul",
            device: String::new(),
            dtype: "f32".into(),
            shape: format!("{n}x{n}x{n}"),
            median_ms: ms,
            cold_ms: f64::NAN,
            rate: 2.0 * (n * n * n) as f64 / 1e9 / (ms / 1e3),
            unit: "GFLOP/s",
            extra: None,
        });
    }
}
