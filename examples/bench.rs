//! The benchmark table: `cargo run --release --example bench [-- FILTER ...] [--json]`.
//!
//! Each row is a case, its dtype and shape, the median wall time of a realisation that
//! waits for the GPU, and GFLOP/s (or sentences/s for `bert-embed`). `--json` prints the
//! same rows as JSON lines. Filters keep the cases whose name contains one of them.
//!
//! Cases: `elementwise` (a fused gelu chain), `reduce` (row sums), `softmax`,
//! `matmul` (f32 square), `bert-embed` (all-MiniLM-L6-v2 at sequence 128, batch 1, 8
//! and 32, Linear weights in f32, f16, q8_0 and q4_0; needs scripts/fetch_minilm.sh),
//! `mlp-train` (MLP 784-256-10, batch 64, Adam) and `cnn-train` (the MNIST CNN, batch
//! 64, Adam): steps/s over blocks of 10 steps submitted back to back (the loss read
//! after each block, as a training loop that logs every 10 steps), dispatches and
//! submits per step, and `cold_ms`, the time from a fresh process's start to its first
//! finished step (measured in a child process).

use clap::Parser;
use std::time::Instant;
use tessera::models::bert::SentenceEmbedder;
use tessera::nn::{loss, Activation, Conv2d, Flatten, Layer, Linear, MaxPool2d, Sequential};
use tessera::ops::nn::Conv2dOptions;
use tessera::optim::{self, Adam, Optimizer, StepOptions};
use tessera::{quant, Device, Tensor};

#[derive(Parser)]
struct Args {
    /// Keep only cases whose name contains one of these.
    filters: Vec<String>,
    /// JSON lines instead of a table.
    #[arg(long)]
    json: bool,
    /// Batch sizes for bert-embed.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batches: Vec<usize>,
    /// Minimum timed seconds per case.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Internal: run one training step of this model in a fresh process and print the
    /// milliseconds from process start (the child of `*-train`'s `cold_ms`).
    #[arg(long, hide = true)]
    cold_train: Option<String>,
}

struct Rows {
    json: bool,
    printed: usize,
}

impl Rows {
    /// Record a row and print it at once (long cases should not hide earlier results).
    fn push(&mut self, r: Row) {
        if self.json {
            let rate_key = match r.unit {
                "GFLOP/s" => "gflops",
                "GB/s" => "gbps",
                "steps/s" => "steps_per_s",
                _ => "sentences_per_s",
            };
            println!("{}", {
                let mut v = serde_json::json!({ "case": r.case, "dtype": r.dtype, "shape": r.shape, "median_ms": r.median_ms, "cold_ms": r.cold_ms, rate_key: r.rate });
                if let (Some(obj), Some(extra)) = (v.as_object_mut(), r.extra.as_ref().and_then(|e| e.as_object())) {
                    obj.extend(extra.clone());
                }
                v
            });
        } else {
            println!(
                "{:<12} {:<6} {:<22} {:>10.2} ms  {:>10.2} {:<12} (cold {:.0} ms)",
                r.case, r.dtype, r.shape, r.median_ms, r.rate, r.unit, r.cold_ms
            );
        }
        self.printed += 1;
    }
}

struct Row {
    case: &'static str,
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

fn sync(d: &Device, t: &Tensor) {
    t.realize_blocking().expect("realise");
    d.synchronize().expect("synchronize");
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
        optim::step_blocking(&mut self.model, &mut self.opt, &l, &[], o).expect("step");
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

fn main() -> tessera::Result<()> {
    let started = Instant::now();
    let args = Args::parse();
    if let Some(kind) = &args.cold_train {
        let d = Device::new()?;
        Trainer::new(kind, &d).step(true);
        println!("{}", started.elapsed().as_secs_f64() * 1e3);
        return Ok(());
    }
    let want = |name: &str| args.filters.is_empty() || args.filters.iter().any(|f| name.contains(f.as_str()));
    let d = Device::new()?;
    let mut rows = Rows { json: args.json, printed: 0 };
    if !args.json {
        println!("Tessera bench on {d}\n");
    }
    if want("elementwise") {
        let n = 1 << 20;
        let x = Tensor::rand([n], 1, &d);
        sync(&d, &x);
        let (ms, cold) = time(args.seconds, || sync(&d, &((&x * 2.0 + 1.0).gelu() * &x)));
        let gb = (n * 8) as f64 / 1e9;
        rows.push(Row {
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
    for (case, op) in [("reduce", 0), ("softmax", 1)] {
        if !want(case) {
            continue;
        }
        let x = Tensor::rand([1024, 1024], 2, &d);
        sync(&d, &x);
        let (ms, cold) = time(args.seconds, || sync(&d, &if op == 0 { x.sum(&[1], false) } else { x.softmax(-1) }));
        let gb = (1024 * 1024 * 4) as f64 / 1e9;
        rows.push(Row {
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
    if want("matmul") {
        for n in [256usize, 512, 1024] {
            let a = Tensor::rand([n, n], 3, &d);
            let b = Tensor::rand([n, n], 4, &d);
            sync(&d, &a);
            sync(&d, &b);
            let (ms, cold) = time(args.seconds, || sync(&d, &a.matmul(&b)));
            let gflop = 2.0 * (n * n * n) as f64 / 1e9;
            rows.push(Row {
                case: "matmul",
                dtype: "f32".into(),
                shape: format!("{n}x{n}x{n}"),
                median_ms: ms,
                cold_ms: cold,
                rate: gflop / (ms / 1e3),
                unit: "GFLOP/s",
                extra: None,
            });
        }
    }
    if want("bert-embed") {
        let dir = std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tessera/minilm");
        match SentenceEmbedder::load(&dir, &d) {
            Err(e) => eprintln!("bert-embed skipped: {e} (run scripts/fetch_minilm.sh)"),
            Ok(mut emb) => {
                for dt in quant::MODEL_DTYPES {
                    pollster::block_on(emb.quantize(dt, None))?;
                    for &batch in &args.batches {
                        // 126 word pieces between [CLS] and [SEP]: sequence 128.
                        let ids: Vec<Vec<u32>> = (0..batch)
                            .map(|b| {
                                std::iter::once(101)
                                    .chain((0..126).map(|i| 1000 + ((b * 131 + i * 17) % 20000) as u32))
                                    .chain([102])
                                    .collect()
                            })
                            .collect();
                        let (ms, cold) = time(args.seconds, || sync(&d, &emb.embed_ids(&ids)));
                        rows.push(Row {
                            case: "bert-embed",
                            dtype: dt.name().into(),
                            shape: format!("batch {batch} x seq 128"),
                            median_ms: ms,
                            cold_ms: cold,
                            rate: batch as f64 / (ms / 1e3),
                            unit: "sentences/s",
                            extra: None,
                        });
                    }
                    // Back to f32 for the next dtype (quantise from the original weights).
                    emb = SentenceEmbedder::load(&dir, &d)?;
                }
            }
        }
    }
    for kind in ["mlp", "cnn"] {
        let case = if kind == "mlp" { "mlp-train" } else { "cnn-train" };
        if !want(case) {
            continue;
        }
        let mut t = Trainer::new(kind, &d);
        t.step(true);
        let before = d.stats();
        // Blocks of 10 steps, each ending with a readback; the median block over 10.
        let block = 10;
        let (ms, _) = time(args.seconds, || t.steps(block));
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
    if rows.printed == 0 {
        eprintln!("no case matched {:?}", args.filters);
    }
    Ok(())
}
