//! Train a small GPT-style character language model on the text shipped in this repo.
//!
//! ```text
//! cargo run --release --example train_charlm
//! cargo run --release --example train_charlm -- --steps 60 --sample-every 30
//! ```
//!
//! The corpus is `README.md`, `ARCHITECTURE.md` and `shaders/README.md` (those that
//! exist), read at run time; non-ASCII bytes become `?` and the vocabulary is the sorted
//! set of distinct bytes. The model is token + position embeddings, a stack of causal
//! pre-norm transformer layers, a final layer norm and a linear head, trained with AdamW
//! (warm-up then cosine decay, gradient clipping) on random windows of the text, one
//! submit per step. It prints the loss with steps/s every 20 steps and a sample (one
//! forward per generated character, greedy or with temperature) every `--sample-every`
//! steps and at the end, then one `RESULT {json}` line.

use clap::Parser;
use std::time::Instant;
use tessera::nn::{loss, Embedding, LayerNorm, Linear, Module, TransformerEncoderLayer};
use tessera::optim::{Adam, LrSchedule, LrScheduler, Optimizer, StepOptions};
use tessera::{DType, Device, Tensor};

#[derive(Parser, Debug, Clone)]
#[command(about = "Train a small character-level transformer language model with Tessera")]
struct Args {
    /// Training steps.
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Sequences per batch (8 keeps the default run near 2.5 minutes on lavapipe).
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Context length in characters.
    #[arg(long, default_value_t = 32)]
    block: usize,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    dim: usize,
    /// Attention heads (must divide `dim`).
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Transformer layers.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Peak learning rate (AdamW, linear warm-up then cosine decay).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seeds the weights, the batches and the sampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print a sample every this many steps (0: only at the end).
    #[arg(long, default_value_t = 100)]
    sample_every: usize,
    /// Characters to generate per sample.
    #[arg(long, default_value_t = 120)]
    sample_len: usize,
    /// Sampling temperature; 0 picks the most likely character (greedy).
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Dropout inside the transformer layers.
    #[arg(long, default_value_t = 0.0)]
    dropout: f64,
    /// Data-parallel over MPI: one rank per process (`mpirun -np 2 ... --distributed`;
    /// build with `--features mpi`). `--batch` is per rank.
    #[arg(long)]
    distributed: bool,
    /// `all`: data-parallel with one replica per wgpu adapter in this process.
    #[arg(long)]
    devices: Option<String>,
    /// Continue a data-parallel run from its checkpoint.
    #[arg(long)]
    resume: bool,
    #[arg(long, default_value = "checkpoints")]
    checkpoint_dir: std::path::PathBuf,
}

#[path = "dist/mod.rs"]
mod dist;

/// The language model as a data-parallel replica: each rank draws its own random
/// windows, seeded by (seed, step, rank).
struct CharLmReplica {
    corpus: Corpus,
    args: Args,
}

impl dist::Replica for CharLmReplica {
    type Model = CharLm;
    fn model(&self, dev: &Device) -> tessera::Result<CharLm> {
        Ok(CharLm::new(&self.args, self.corpus.vocab.len(), dev))
    }
    fn optimizer(&self) -> Box<dyn Optimizer> {
        Box::new(Adam::adamw(self.args.lr, 0.01))
    }
    fn schedule(&self, total: u64) -> LrSchedule {
        LrSchedule::cosine(self.args.lr, (total / 10).clamp(1, 30), total, self.args.lr / 10.0)
    }
    fn loss(&self, model: &mut CharLm, rank: usize, size: usize, step: u64, dev: &Device) -> tessera::Result<Tensor> {
        let mut rng =
            Rng::new(self.args.seed ^ (step * size as u64 + rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (x, y) = batch(&self.corpus, self.args.batch, self.args.block, &mut rng, dev);
        Ok(loss::cross_entropy(&model.forward(&x), &y))
    }
    fn batch(&self) -> usize {
        self.args.batch
    }
    fn report(&self, model: &mut CharLm, dev: &Device) -> tessera::Result<String> {
        let mut rng = Rng::new(self.args.seed ^ 0x5a5a_5a5a);
        let (prompt, text) = sample(model, &self.corpus, &self.args, &mut rng, dev)?;
        Ok(format!("sample (rank 0's replica): {prompt:?} -> {text:?}"))
    }
}

/// Seeded xorshift64.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        for _ in 0..4 {
            r.next_u64();
        }
        r
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The training text and its byte vocabulary.
struct Corpus {
    /// The text as token ids.
    ids: Vec<i32>,
    /// Byte of each token id.
    vocab: Vec<u8>,
}

impl Corpus {
    fn load() -> tessera::Result<Corpus> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut text = Vec::new();
        for name in ["README.md", "ARCHITECTURE.md", "shaders/README.md"] {
            let path = root.join(name);
            if !path.exists() {
                continue;
            }
            let bytes = std::fs::read(&path)
                .map_err(|e| tessera::Error::Io { path: path.display().to_string(), message: e.to_string() })?;
            text.extend(bytes.into_iter().map(|b| if b.is_ascii() { b } else { b'?' }));
            text.push(b'\n');
        }
        if text.is_empty() {
            return Err(tessera::Error::Io {
                path: root.display().to_string(),
                message: "none of README.md, ARCHITECTURE.md, shaders/README.md was found".into(),
            });
        }
        let mut vocab = text.clone();
        vocab.sort_unstable();
        vocab.dedup();
        let mut index = [0i32; 256];
        for (i, &b) in vocab.iter().enumerate() {
            index[b as usize] = i as i32;
        }
        Ok(Corpus { ids: text.iter().map(|&b| index[b as usize]).collect(), vocab })
    }

    fn decode(&self, ids: &[i32]) -> String {
        ids.iter().map(|&i| self.vocab.get(i as usize).copied().unwrap_or(b'?') as char).collect()
    }
}

/// Token and position embeddings, causal pre-norm transformer layers, final layer norm
/// and a linear head to the vocabulary.
#[derive(Module)]
struct CharLm {
    tok_emb: Embedding,
    pos_emb: Embedding,
    layers: Vec<TransformerEncoderLayer>,
    ln_f: LayerNorm,
    head: Linear,
    vocab: usize,
}

impl CharLm {
    fn new(args: &Args, vocab: usize, dev: &Device) -> CharLm {
        let s = args.seed * 1000;
        let layers = (0..args.layers)
            .map(|i| {
                let mut l = TransformerEncoderLayer::new(
                    args.dim,
                    args.heads,
                    4 * args.dim,
                    args.dropout,
                    s + 100 * (i as u64 + 1),
                    dev,
                );
                l.causal = true;
                l.norm_first = true;
                l
            })
            .collect();
        CharLm {
            tok_emb: Embedding::new(vocab, args.dim, s + 1, dev),
            pos_emb: Embedding::new(args.block, args.dim, s + 2, dev),
            layers,
            ln_f: LayerNorm::new(args.dim, 1e-5, dev),
            head: Linear::new(args.dim, vocab, true, s + 3, dev),
            vocab,
        }
    }

    /// Logits `[B*T, V]` for token ids `[B, T]` (I32, `T <= block`).
    fn forward(&self, ids: &Tensor) -> Tensor {
        let (b, t) = match ids.dims() {
            [b, t] => (*b, *t),
            _ => (0, 0), // the reshape below carries the shape error
        };
        let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I32, ids.device());
        let mut x = self.tok_emb.forward(ids).add(&self.pos_emb.forward(&pos));
        for layer in &self.layers {
            x = layer.forward_masked(&x, None);
        }
        self.head.forward(&self.ln_f.forward(&x)).reshape(vec![b * t, self.vocab])
    }
}

/// `batch` random windows: inputs `[B, T]` and the next characters `[B*T]`.
fn batch(corpus: &Corpus, batch: usize, block: usize, rng: &mut Rng, dev: &Device) -> (Tensor, Tensor) {
    let mut x = Vec::with_capacity(batch * block);
    let mut y = Vec::with_capacity(batch * block);
    for _ in 0..batch {
        let s = rng.below(corpus.ids.len() - block);
        x.extend_from_slice(&corpus.ids[s..s + block]);
        y.extend_from_slice(&corpus.ids[s + 1..s + block + 1]);
    }
    (Tensor::from_slice(&x, [batch, block], dev), Tensor::from_slice(&y, [batch * block], dev))
}

/// Pick a token from `logits`: the arg max when `temperature` is 0, else a draw from
/// `softmax(logits / temperature)`.
fn pick(logits: &[f32], temperature: f64, rng: &mut Rng) -> i32 {
    let argmax = || {
        logits.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
            as i32
    };
    if temperature <= 0.0 {
        return argmax();
    }
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let p: Vec<f64> = logits.iter().map(|&v| ((v as f64 - m) / temperature).exp()).collect();
    let total: f64 = p.iter().sum();
    if !total.is_finite() || total <= 0.0 {
        return argmax();
    }
    let mut r = rng.unit() * total;
    for (i, &w) in p.iter().enumerate() {
        if r < w {
            return i as i32;
        }
        r -= w;
    }
    (p.len() - 1) as i32
}

/// Continue a `block`-character prompt from the text by `len` characters, one forward of
/// the last `block` characters per character. Returns (prompt, continuation).
fn sample(
    model: &mut CharLm,
    corpus: &Corpus,
    args: &Args,
    rng: &mut Rng,
    dev: &Device,
) -> tessera::Result<(String, String)> {
    model.set_training(false);
    let out = (|| {
        let _g = tessera::no_grad();
        let start = rng.below(corpus.ids.len() - args.block);
        let mut ctx: Vec<i32> = corpus.ids[start..start + args.block].to_vec();
        let mut generated = Vec::with_capacity(args.sample_len);
        for _ in 0..args.sample_len {
            let window = &ctx[ctx.len() - args.block..];
            let ids = Tensor::from_slice(window, [1, args.block], dev);
            let last = model.forward(&ids).narrow(0, args.block - 1, 1);
            let logits = last.to_vec_blocking::<f32>()?;
            let next = pick(&logits, args.temperature, rng);
            ctx.push(next);
            generated.push(next);
        }
        Ok((corpus.decode(&ctx[..args.block]), corpus.decode(&generated)))
    })();
    model.set_training(true);
    out
}

fn print_sample(step: usize, prompt: &str, text: &str) {
    println!("--- sample at step {step} (prompt in brackets) ---");
    println!("[{prompt}]{text}");
    println!("---");
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

#[track_caller]
fn invalid(detail: String) -> tessera::Error {
    tessera::Error::InvalidArgument { op: "train_charlm", detail, location: std::panic::Location::caller() }
}

fn run(args: Args) -> tessera::Result<()> {
    let started = Instant::now();
    if args.steps == 0 || args.batch == 0 || args.block == 0 || args.dim == 0 || args.heads == 0 {
        return Err(invalid("steps, batch, block, dim and heads must be positive".into()));
    }
    if !args.dim.is_multiple_of(args.heads) {
        return Err(invalid(format!("--heads {} must divide --dim {}", args.heads, args.dim)));
    }
    let corpus = Corpus::load()?;
    if corpus.ids.len() <= args.block + 1 {
        return Err(invalid(format!(
            "the text has {} characters, too few for --block {}",
            corpus.ids.len(),
            args.block
        )));
    }
    if args.distributed || args.devices.is_some() {
        let transport = match (args.distributed, args.devices.as_deref()) {
            (true, None) => dist::Transport::Mpi,
            (false, Some("all")) => dist::Transport::AllDevices,
            _ => return Err(invalid("use either --distributed (under mpirun) or --devices all".into())),
        };
        let plan = dist::Plan {
            max_steps: Some(args.steps as u64),
            epochs: 1,
            examples: 0,
            checkpoint: args.checkpoint_dir.join("charlm-ddp.safetensors"),
            resume: args.resume,
            checkpoint_every: 50,
            name: "charlm".into(),
        };
        std::fs::create_dir_all(&args.checkpoint_dir).ok();
        return dist::run(&CharLmReplica { corpus, args }, &plan, transport);
    }
    let dev = Device::new()?;
    let vocab = corpus.vocab.len();
    let mut model = CharLm::new(&args, vocab, &dev);
    let mut opt = Adam::adamw(args.lr, 0.01);
    let warmup = (args.steps as u64 / 10).clamp(1, 30);
    let mut sched = LrScheduler::new(LrSchedule::cosine(args.lr, warmup, args.steps as u64, args.lr / 10.0), &mut opt);
    let mut rng = Rng::new(args.seed);
    let mut sample_rng = Rng::new(args.seed ^ 0x5a5a_5a5a);
    println!(
        "device: {} ({}); text {} chars, vocab {} (ln V = {:.3}); {} layers x dim {} x {} heads, {} parameters; \
         batch {} x block {}",
        dev.info().name,
        dev.info().backend,
        corpus.ids.len(),
        vocab,
        (vocab as f64).ln(),
        args.layers,
        args.dim,
        args.heads,
        model.num_parameters(),
        args.batch,
        args.block
    );

    let mut losses = Vec::with_capacity(args.steps);
    let mut train_time = 0.0f64; // excludes step 1 (pipeline compilation) and sampling
    let mut window_time = 0.0f64;
    let mut first_step_s = 0.0;
    let mut sample_time = 0.0f64;
    for step in 0..args.steps {
        let t0 = Instant::now();
        let (x, y) = batch(&corpus, args.batch, args.block, &mut rng, &dev);
        let logits = model.forward(&x);
        let l = loss::cross_entropy(&logits, &y);
        let r = opt.step_with(&mut model, &l, StepOptions { clip_norm: Some(1.0), ..Default::default() })?;
        sched.step(&mut opt);
        let lv = r.loss.unwrap_or(f64::NAN);
        if !lv.is_finite() {
            return Err(invalid(format!("the loss is {lv} at step {}", step + 1)));
        }
        losses.push(lv);
        let dt = t0.elapsed().as_secs_f64();
        if step == 0 {
            first_step_s = dt;
            println!("step 1: loss {lv:.4} (first step with pipeline compilation: {dt:.2} s)");
        } else {
            train_time += dt;
            window_time += dt;
        }
        let done = step + 1;
        if done % 20 == 0 || done == args.steps {
            let recent = &losses[losses.len().saturating_sub(20)..];
            let n_window = if done % 20 == 0 { 20 } else { done % 20 };
            let n_timed = if done <= 20 { n_window - 1 } else { n_window };
            let sps = if window_time > 0.0 { n_timed as f64 / window_time } else { 0.0 };
            println!(
                "step {done}/{}: loss {:.4} (mean of last {}), lr {:.2e}, {sps:.2} steps/s",
                args.steps,
                recent.iter().sum::<f64>() / recent.len() as f64,
                recent.len(),
                opt.lr()
            );
            window_time = 0.0;
        }
        if args.sample_every > 0 && done % args.sample_every == 0 && done != args.steps {
            let ts = Instant::now();
            let (prompt, text) = sample(&mut model, &corpus, &args, &mut sample_rng, &dev)?;
            print_sample(done, &prompt, &text);
            sample_time += ts.elapsed().as_secs_f64();
        }
    }
    let ts = Instant::now();
    let (prompt, text) = sample(&mut model, &corpus, &args, &mut sample_rng, &dev)?;
    print_sample(args.steps, &prompt, &text);
    sample_time += ts.elapsed().as_secs_f64();

    let first_loss = losses.first().copied().unwrap_or(f64::NAN);
    let tail = &losses[losses.len().saturating_sub(20)..];
    let final_loss = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    let timed = args.steps.saturating_sub(1);
    let sps = if train_time > 0.0 { timed as f64 / train_time } else { 0.0 };
    let round = |v: f64, k: f64| (v * k).round() / k;
    println!(
        "RESULT {}",
        serde_json::json!({
            "first_loss": round(first_loss, 1e4),
            "final_loss": round(final_loss, 1e4),
            "ln_vocab": round((vocab as f64).ln(), 1e4),
            "steps": args.steps,
            "steps_per_s": round(sps, 100.0),
            "first_step_s": round(first_step_s, 100.0),
            "sample_s": round(sample_time, 10.0),
            "seconds": round(started.elapsed().as_secs_f64(), 10.0),
            "vocab": vocab,
            "parameters": model.num_parameters(),
            "device": dev.info().name,
        })
    );
    Ok(())
}
