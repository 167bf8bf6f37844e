//! The benchmark table: `cargo run --release --example bench [-- FILTER ...] [--json]`.
//!
//! Each row is a case, its dtype and shape, the median wall time of a realisation that
//! waits for the GPU, and GFLOP/s (or sentences/s for `bert-embed`). `--json` prints the
//! same rows as JSON lines. Filters keep the cases whose name contains one of them.
//!
//! Cases: `elementwise` (a fused gelu chain), `reduce` (row sums), `softmax`,
//! `matmul` (f32 square), `bert-embed` (all-MiniLM-L6-v2 at sequence 128, batch 1, 8
//! and 32, Linear weights in f32, f16, q8_0 and q4_0; needs scripts/fetch_minilm.sh).

use clap::Parser;
use std::time::Instant;
use tessera::models::bert::SentenceEmbedder;
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
                _ => "sentences_per_s",
            };
            println!(
                "{}",
                serde_json::json!({ "case": r.case, "dtype": r.dtype, "shape": r.shape, "median_ms": r.median_ms, "cold_ms": r.cold_ms, rate_key: r.rate })
            );
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

fn main() -> tessera::Result<()> {
    let args = Args::parse();
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
                        });
                    }
                    // Back to f32 for the next dtype (quantise from the original weights).
                    emb = SentenceEmbedder::load(&dir, &d)?;
                }
            }
        }
    }
    if rows.printed == 0 {
        eprintln!("no case matched {:?}", args.filters);
    }
    Ok(())
}
