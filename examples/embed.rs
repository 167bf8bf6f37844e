//! Sentence embeddings with all-MiniLM-L6-v2.
//!
//! `cargo run --release --example embed -- "one sentence" "another"` prints each
//! embedding's first values and the cosine similarity matrix. `--dtype f32|f16|q8_0|q4_0`
//! stores the Linear weights in that dtype; `--json` prints
//! `[{"text": ..., "embedding": [...]}]` and nothing else; `--model-dir` points at another
//! copy of the model (default: `scripts/fetch_minilm.sh`'s cache).

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use tessera::models::bert::{self, SentenceEmbedder};
use tessera::{quant, Device};

#[derive(Parser)]
#[command(about = "Sentence embeddings with all-MiniLM-L6-v2 on Tessera")]
struct Args {
    /// Sentences to embed.
    #[arg(required = true)]
    texts: Vec<String>,
    /// Linear weights' dtype: f32, f16, q8_0 or q4_0.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Print JSON only.
    #[arg(long)]
    json: bool,
    /// Directory with model.safetensors, config.json and tokenizer.json.
    #[arg(long)]
    model_dir: Option<PathBuf>,
}

fn default_dir() -> PathBuf {
    let base = std::env::var_os("TESSERA_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tessera"));
    base.join("minilm")
}

fn run(args: Args) -> tessera::Result<()> {
    let dtype = quant::parse_dtype(&args.dtype)
        .ok_or_else(|| tessera::Error::Unsupported(format!("--dtype {} (use f32, f16, q8_0 or q4_0)", args.dtype)))?;
    let dir = args.model_dir.unwrap_or_else(default_dir);
    if !dir.join("model.safetensors").exists() {
        return Err(tessera::Error::Io {
            path: dir.display().to_string(),
            message: "no model.safetensors here: run scripts/fetch_minilm.sh or pass --model-dir".into(),
        });
    }
    let device = Device::new()?;
    let config = bert::read_config(&dir)?;
    // Refuse before loading anything if the batch cannot fit.
    let est = bert::check_memory(&config, args.texts.len(), 256, dtype, &device)?;
    let mut emb = SentenceEmbedder::load(&dir, &device)?;
    pollster::block_on(emb.quantize(dtype, None))?;
    let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
    let t0 = std::time::Instant::now();
    let out = emb.embed_blocking(&texts)?;
    let secs = t0.elapsed().as_secs_f64();
    if args.json {
        let rows: Vec<serde_json::Value> =
            texts.iter().zip(&out).map(|(t, e)| serde_json::json!({ "text": t, "embedding": e })).collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    println!("all-MiniLM-L6-v2 on {device}, Linear weights in {dtype}");
    println!(
        "memory estimate: {:.1} MB weights + {:.1} MB activations\n",
        est.weights as f64 / 1e6,
        est.activations as f64 / 1e6
    );
    for (t, e) in texts.iter().zip(&out) {
        let head: Vec<String> = e.iter().take(6).map(|v| format!("{v:+.4}")).collect();
        println!("{t:?}\n    [{}, ...] ({} values)", head.join(", "), e.len());
    }
    println!("\ncosine similarity");
    for (i, a) in out.iter().enumerate() {
        let row: Vec<String> =
            out.iter().map(|b| format!("{:+.4}", a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>())).collect();
        println!("  [{i}] {}", row.join("  "));
    }
    println!("\n{} sentences in {:.0} ms ({})", out.len(), secs * 1e3, tessera::stats());
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
