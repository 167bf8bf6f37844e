//! Quantises all-MiniLM-L6-v2's Linear weights to f16, Q8_0 and Q4_0, saves each as GGUF
//! (and safetensors), reloads it from the file, and reports file size, embeddings per
//! second and the mean cosine to the f32 embeddings on a built-in sentence set. Q4_0
//! uses GPTQ calibrated on a separate set of sentences.
//!
//! `cargo run --release --example quantize [-- --model-dir DIR --out DIR]`

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use tessera::models::bert::{self, SentenceEmbedder};
use tessera::{quant, DType, Device};

const SENTENCES: [&str; 12] = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The new movie is awesome.",
    "The cat sits outside.",
    "GPU kernels written in WGSL run in the browser.",
];

/// Mean cosine each dtype must reach against f32.
fn target(dt: DType) -> f64 {
    match dt {
        DType::F16 => 0.9999,
        DType::Q8_0 => 0.999,
        DType::Q4_0 => 0.98,
        _ => 1.0 - 1e-6,
    }
}

#[derive(Parser)]
struct Args {
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Where to write the quantised files (default: a temporary directory).
    #[arg(long)]
    out: Option<PathBuf>,
}

fn run(args: Args) -> tessera::Result<bool> {
    let dir = args
        .model_dir
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tessera/minilm"));
    let tmp = tempfile::tempdir().map_err(|e| tessera::Error::Io { path: "tmp".into(), message: e.to_string() })?;
    let out = args.out.unwrap_or_else(|| tmp.path().to_path_buf());
    let device = Device::new()?;
    let tok = dir.join("tokenizer.json");
    let reference = SentenceEmbedder::load(&dir, &device)?.embed_blocking(&SENTENCES)?;
    println!("all-MiniLM-L6-v2 on {device}; {} sentences\n", SENTENCES.len());
    println!(
        "{:<6} {:>12} {:>12} {:>14} {:>12} {:>8}",
        "dtype", "GGUF bytes", "st bytes", "embeddings/s", "mean cos", "target"
    );
    let mut ok = true;
    for dt in quant::MODEL_DTYPES {
        let mut fresh = SentenceEmbedder::load(&dir, &device)?;
        // Q4_0 calibrates on bert::CALIBRATION, which shares no sentence with SENTENCES.
        pollster::block_on(fresh.quantize(dt, None))?;
        let model = fresh.model;
        let gguf = out.join(format!("minilm-{}.gguf", dt.name()));
        let st = out.join(format!("minilm-{}.safetensors", dt.name()));
        bert::save(&model, &gguf)?;
        bert::save(&model, &st)?;
        let size = |p: &PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        // Reload from the GGUF file and embed from it.
        let emb = SentenceEmbedder::from_model(bert::load_saved(&gguf, &device)?, &tok)?;
        let _ = emb.embed_blocking(&SENTENCES[..1])?; // warm the pipelines
        let t0 = Instant::now();
        let got = emb.embed_blocking(&SENTENCES)?;
        let rate = SENTENCES.len() as f64 / t0.elapsed().as_secs_f64();
        let cos: f64 = got
            .iter()
            .zip(&reference)
            .map(|(a, b)| a.iter().zip(b).map(|(x, y)| (*x as f64) * (*y as f64)).sum::<f64>())
            .sum::<f64>()
            / SENTENCES.len() as f64;
        let pass = cos >= target(dt);
        ok &= pass;
        println!(
            "{:<6} {:>12} {:>12} {:>14.2} {:>12.6} {:>8} {}",
            dt.name(),
            size(&gguf),
            size(&st),
            rate,
            cos,
            target(dt),
            if pass { "ok" } else { "BELOW TARGET" }
        );
    }
    Ok(ok)
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
