//! Train an MLP or a CNN on real MNIST digits (the main demo).
//!
//! ```text
//! cargo run --release --example train_mnist -- --model cnn
//! ```
//!
//! It trains on the first 8,000 of the 10,000 digits in `data/mnist.bin` and tests on
//! the other 2,000, shows loss, accuracy and steps/s on a progress bar, writes
//! TensorBoard scalars under `runs/`, saves a checkpoint every epoch (`--resume`
//! continues from it), then prints a confusion matrix and one `RESULT {json}` line and
//! writes `predictions.png`.

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use tessera::io::mnist::Mnist;
use tessera::io::tensorboard::EventWriter;
use tessera::nn::{loss, Layer, Module, Sequential};
use tessera::optim::{Adam, LrSchedule, LrScheduler, Optimizer, StepOptions};
use tessera::{DType, Device, Tensor};

#[derive(Parser, Debug)]
#[command(about = "Train an MLP or CNN on real MNIST digits with Tessera")]
struct Args {
    /// `mlp` (784-256-10) or `cnn` (two conv + pool blocks, then two linear layers).
    #[arg(long, default_value = "mlp")]
    model: String,
    /// Passes over the 8,000 training digits (default: 8 for the MLP, 5 for the CNN).
    #[arg(long)]
    epochs: Option<usize>,
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Peak learning rate (Adam, linear warm-up then cosine decay).
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Continue from the checkpoint of an earlier run.
    #[arg(long)]
    resume: bool,
    /// Stop after this many training steps (for quick checks).
    #[arg(long)]
    max_steps: Option<usize>,
    /// f16 compute with f32 master weights and dynamic loss scaling.
    #[arg(long)]
    mixed_precision: bool,
    #[arg(long, default_value = "data/mnist.bin")]
    data: PathBuf,
    #[arg(long, default_value = "checkpoints")]
    checkpoint_dir: PathBuf,
    #[arg(long, default_value = "runs")]
    log_dir: PathBuf,
    #[arg(long, default_value = "predictions.png")]
    predictions: PathBuf,
    /// Hide the progress bar (logs one line per epoch instead).
    #[arg(long)]
    quiet: bool,
    /// After training, write the model as ONNX (opset 17, input `input` of one digit,
    /// output `output`, the 10 logits) to this file.
    #[arg(long)]
    export_onnx: Option<PathBuf>,
    /// Data-parallel over MPI: one rank per process (`mpirun -np 2 ... --distributed`;
    /// build with `--features mpi`). `--batch` is per rank.
    #[arg(long)]
    distributed: bool,
    /// `all`: data-parallel with one replica per wgpu adapter in this process.
    #[arg(long)]
    devices: Option<String>,
}

#[path = "dist/mod.rs"]
mod dist;

/// The MNIST model as a data-parallel replica: each rank takes its shard of the
/// training digits (`DistributedSampler`, reshuffled per epoch).
struct MnistReplica {
    data: Mnist,
    kind: String,
    seed: u64,
    batch: usize,
    lr: f64,
}

impl dist::Replica for MnistReplica {
    type Model = Sequential;
    fn model(&self, dev: &Device) -> tessera::Result<Sequential> {
        build(&self.kind, self.seed, dev)
    }
    fn optimizer(&self) -> Box<dyn Optimizer> {
        Box::new(Adam::new(self.lr))
    }
    fn schedule(&self, total: u64) -> LrSchedule {
        LrSchedule::cosine(self.lr, 50.min(total / 4), total, 1e-5)
    }
    fn loss(
        &self,
        model: &mut Sequential,
        rank: usize,
        size: usize,
        step: u64,
        dev: &Device,
    ) -> tessera::Result<Tensor> {
        let per_epoch = (TRAIN / (self.batch * size)).max(1) as u64;
        let order = tessera::dist::DistributedSampler::new(TRAIN, rank, size, self.seed).indices(step / per_epoch);
        let at = (step % per_epoch) as usize * self.batch;
        let (x, y) = batch_tensors(&self.data, &order[at..at + self.batch], self.kind == "cnn", dev);
        Ok(loss::cross_entropy(&model.forward(&x), &y))
    }
    fn batch(&self) -> usize {
        self.batch
    }
    fn report(&self, model: &mut Sequential, dev: &Device) -> tessera::Result<String> {
        let test_idx: Vec<usize> = (TRAIN..self.data.len()).collect();
        let preds = evaluate(model, &self.data, &test_idx, self.kind == "cnn", dev)?;
        let right = preds.iter().zip(&test_idx).filter(|(p, &i)| **p == self.data.labels[i] as i32).count();
        Ok(format!(
            "test accuracy (rank 0's replica): {:.4} on {} digits",
            right as f64 / test_idx.len() as f64,
            test_idx.len()
        ))
    }
}

const TRAIN: usize = tessera::models::mnist::TRAIN;
/// Steps between readbacks of the training loss and accuracy.
const LOG_EVERY: usize = 10;

fn build(model: &str, seed: u64, dev: &Device) -> tessera::Result<Sequential> {
    tessera::models::mnist::build(model, seed, dev)
}

/// A seeded permutation (xorshift Fisher-Yates), so an epoch's order is a function of
/// (seed, epoch) and a resumed run sees the same batches.
fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p.swap(i, (s % (i as u64 + 1)) as usize);
    }
    p
}

fn batch_tensors(data: &Mnist, idx: &[usize], cnn: bool, dev: &Device) -> (Tensor, Tensor) {
    let shape = if cnn { vec![idx.len(), 1, 28, 28] } else { vec![idx.len(), 784] };
    // Standardised with the MNIST mean and deviation, as torchvision's examples do.
    let px = tessera::models::mnist::standardize(&data.images_f32(idx));
    let x = Tensor::from_slice(&px, shape, dev);
    let y = Tensor::from_slice(&data.labels_i32(idx), [idx.len()], dev);
    (x, y)
}

fn evaluate(model: &mut Sequential, data: &Mnist, idx: &[usize], cnn: bool, dev: &Device) -> tessera::Result<Vec<i32>> {
    model.set_training(false);
    let _g = tessera::no_grad();
    let mut preds = Vec::with_capacity(idx.len());
    for chunk in idx.chunks(500) {
        let (x, _) = batch_tensors(data, chunk, cnn, dev);
        let p = model.forward(&x).argmax(&[-1], false);
        preds.extend(p.to_vec_blocking::<i32>()?);
    }
    model.set_training(true);
    Ok(preds)
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> tessera::Result<()> {
    let started = Instant::now();
    let data = Mnist::load(&args.data)?;
    let cnn = args.model == "cnn";
    let epochs = args.epochs.unwrap_or(if cnn { 5 } else { 8 });
    if args.distributed || args.devices.is_some() {
        let transport = match (args.distributed, args.devices.as_deref()) {
            (true, None) => dist::Transport::Mpi,
            (false, Some("all")) => dist::Transport::AllDevices,
            _ => {
                return Err(tessera::Error::Unsupported(
                    "use either --distributed (under mpirun) or --devices all".into(),
                ))
            }
        };
        let replica = MnistReplica {
            data,
            kind: args.model.clone(),
            seed: args.seed,
            batch: args.batch,
            lr: args.lr.unwrap_or(if cnn { 4e-3 } else { 2e-3 }),
        };
        let plan = dist::Plan {
            max_steps: args.max_steps.map(|m| m as u64),
            epochs: epochs as u64,
            examples: TRAIN,
            checkpoint: args.checkpoint_dir.join(format!("mnist-{}-ddp.safetensors", args.model)),
            resume: args.resume,
            checkpoint_every: 50,
            name: format!("mnist {}", args.model),
        };
        std::fs::create_dir_all(&args.checkpoint_dir).ok();
        return dist::run(&replica, &plan, transport);
    }
    let dev = Device::new()?;
    let mut model = build(&args.model, args.seed, &dev)?;
    let steps_per_epoch = TRAIN / args.batch;
    let total_steps = (epochs * steps_per_epoch) as u64;
    let base_lr = args.lr.unwrap_or(if cnn { 4e-3 } else { 2e-3 });
    let mut opt = Adam::new(base_lr);
    let mut scaler = tessera::optim::GradScaler::new(1024.0);
    println!(
        "device: {} ({}), model {} with {} parameters, {} train / {} test digits, batch {}",
        dev.info().name,
        dev.info().backend,
        args.model,
        model.num_parameters(),
        TRAIN,
        data.len() - TRAIN,
        args.batch
    );

    let ckpt = args.checkpoint_dir.join(format!("mnist-{}.safetensors", args.model));
    let mut first_epoch = 0;
    let mut step = 0u64;
    if args.resume {
        let md = tessera::io::checkpoint::load(&ckpt, &mut model, &mut opt, &dev)?;
        first_epoch = md.get("epoch").and_then(|s| s.parse().ok()).unwrap_or(0);
        step = md.get("step").and_then(|s| s.parse().ok()).unwrap_or(0);
        println!("resumed from {} at epoch {first_epoch}, step {step}", ckpt.display());
    }
    // Warm-up then cosine decay; the scheduler picks up from the optimiser's step count
    // (which a resumed checkpoint restored).
    let schedule = LrSchedule::cosine(base_lr, 50, total_steps, 1e-5);
    let mut sched = LrScheduler::new(schedule, &mut opt);
    let run_name = format!(
        "mnist-{}-{}",
        args.model,
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    );
    let mut tb = EventWriter::new(args.log_dir.join(run_name))?;

    let test_idx: Vec<usize> = (TRAIN..data.len()).collect();
    let mut steps_timed = 0u64;
    let mut train_time = 0.0f64;
    let mut last_epoch = first_epoch;
    let max_steps = args.max_steps.map(|m| m as u64).unwrap_or(u64::MAX);
    let mut first_step_ms = None;
    'epochs: for epoch in first_epoch..epochs {
        let order = permutation(TRAIN, args.seed * 7919 + epoch as u64);
        let bar = if args.quiet { ProgressBar::hidden() } else { ProgressBar::new(steps_per_epoch as u64) };
        bar.set_style(
            ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{}/{}", epoch + 1, epochs));
        let t_epoch = Instant::now();
        let (mut loss_sum, mut acc_sum, mut n) = (0.0f64, 0.0f64, 0.0f64);
        let mut pending: Vec<(u64, f64, Tensor, Tensor)> = Vec::new();
        for b in 0..steps_per_epoch {
            if step >= max_steps {
                bar.finish_and_clear();
                break 'epochs;
            }
            let t0 = Instant::now();
            let lr = opt.lr();
            let (x, y) = batch_tensors(&data, &order[b * args.batch..(b + 1) * args.batch], cnn, &dev);
            // Mixed precision: the forward pass (and so its backward) computes the
            // Linear layers' products in f16; the weights stay f32.
            let autocast = args.mixed_precision.then(|| tessera::autocast(DType::F16));
            let logits = model.forward(&x);
            drop(autocast);
            let loss = loss::cross_entropy(&logits, &y);
            let acc = {
                let _g = tessera::no_grad();
                logits.argmax_dim(-1).eq(&y).cast(DType::F32).mean_all()
            };
            // Steps are submitted back to back; losses and accuracies are read every
            // LOG_EVERY steps (one readback for the lot), so the next step's graph is
            // built while the GPU runs the last. Loss scaling reads every step.
            let last_of_epoch = b + 1 == steps_per_epoch || step + 1 >= max_steps;
            let sync = pending.len() + 1 >= LOG_EVERY || last_of_epoch;
            let opts = StepOptions {
                scaler: args.mixed_precision.then_some(&mut scaler),
                no_sync: !sync,
                ..Default::default()
            };
            opt.step_with(&mut model, &loss, opts)?;
            sched.step(&mut opt);
            step += 1;
            pending.push((step, lr, loss, acc));
            if sync {
                let ts: Vec<Tensor> = pending.iter().flat_map(|(_, _, l, a)| [l.clone(), a.clone()]).collect();
                let vals = tessera::read_all_blocking(&ts)?;
                for ((s, lr, _, _), v) in pending.drain(..).zip(vals.chunks(2)) {
                    let (l, a) = (v[0][0], v[1][0]);
                    loss_sum += l;
                    acc_sum += a;
                    n += 1.0;
                    tb.scalar("train/loss", l, s)?;
                    tb.scalar("train/accuracy", a, s)?;
                    tb.scalar("train/lr", lr, s)?;
                }
            }
            if first_step_ms.is_none() {
                first_step_ms = Some(started.elapsed().as_secs_f64() * 1e3);
            }
            if step > 1 {
                train_time += t0.elapsed().as_secs_f64();
                steps_timed += 1;
            }
            let sps = if train_time > 0.0 { steps_timed as f64 / train_time } else { 0.0 };
            bar.set_message(format!(
                "loss {:.4} acc {:.3} {:.1} steps/s",
                loss_sum / n.max(1.0),
                acc_sum / n.max(1.0),
                sps
            ));
            bar.inc(1);
        }
        bar.finish_and_clear();
        let preds = evaluate(&mut model, &data, &test_idx, cnn, &dev)?;
        let correct = preds.iter().zip(&test_idx).filter(|(p, &i)| **p == data.labels[i] as i32).count();
        let test_acc = correct as f64 / test_idx.len() as f64;
        tb.scalar("test/accuracy", test_acc, step)?;
        tb.flush()?;
        println!(
            "epoch {}/{}: loss {:.4}, train accuracy {:.4}, test accuracy {:.4} ({:.1} s)",
            epoch + 1,
            epochs,
            loss_sum / n.max(1.0),
            acc_sum / n.max(1.0),
            test_acc,
            t_epoch.elapsed().as_secs_f64()
        );
        last_epoch = epoch + 1;
        let mut md = BTreeMap::new();
        md.insert("epoch".to_string(), last_epoch.to_string());
        md.insert("step".to_string(), step.to_string());
        md.insert("seed".to_string(), args.seed.to_string());
        md.insert("model".to_string(), args.model.clone());
        md.insert("rng".to_string(), format!("permutation(seed*7919+epoch); next epoch {last_epoch}"));
        md.insert("schedule".to_string(), format!("{schedule:?}"));
        md.insert("loss_scale".to_string(), scaler.scale.to_string());
        std::fs::create_dir_all(&args.checkpoint_dir).map_err(|e| tessera::Error::Io {
            path: args.checkpoint_dir.display().to_string(),
            message: e.to_string(),
        })?;
        tessera::io::checkpoint::save(&ckpt, &mut model, &mut opt, &md)?;
    }

    let preds = evaluate(&mut model, &data, &test_idx, cnn, &dev)?;
    let mut confusion = [[0usize; 10]; 10];
    for (p, &i) in preds.iter().zip(&test_idx) {
        confusion[data.labels[i] as usize][(*p).clamp(0, 9) as usize] += 1;
    }
    let correct: usize = (0..10).map(|d| confusion[d][d]).sum();
    let test_acc = correct as f64 / test_idx.len() as f64;
    println!("\nconfusion matrix (rows: true digit, columns: predicted)");
    println!("     {}", (0..10).map(|d| format!("{d:>5}")).collect::<String>());
    for (d, row) in confusion.iter().enumerate() {
        println!("{d:>5}{}", row.iter().map(|c| format!("{c:>5}")).collect::<String>());
    }
    write_predictions(&args.predictions, &data, &test_idx[..100], &preds[..100])?;
    if let Some(path) = &args.export_onnx {
        model.set_training(false);
        let (x, _) = batch_tensors(&data, &test_idx[..1], cnn, &dev);
        tessera::onnx::export(&model, std::slice::from_ref(&x), path)?;
        println!(
            "wrote {} (ONNX opset {}, input 'input' {:?}, output 'output' [1, 10])",
            path.display(),
            tessera::onnx::EXPORT_OPSET,
            x.dims()
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    let sps = if train_time > 0.0 { steps_timed as f64 / train_time } else { 0.0 };
    println!(
        "RESULT {}",
        serde_json::json!({
            "model": args.model,
            "test_accuracy": test_acc,
            "epochs": last_epoch,
            "steps": step,
            "seconds": (seconds * 10.0).round() / 10.0,
            "steps_per_s": (sps * 10.0).round() / 10.0,
            "first_step_ms": first_step_ms.map(|v| v.round()),
            "submits": dev.stats().submits,
            "plans_built": dev.stats().plans_built,
            "plans_replayed": dev.stats().plans_replayed,
            "device": dev.info().name,
        })
    );
    Ok(())
}

/// 3x5 bitmaps of the digits, one row per u8 (low 3 bits, MSB left).
const FONT: [[u8; 5]; 10] = [
    [7, 5, 5, 5, 7],
    [2, 6, 2, 2, 7],
    [7, 1, 7, 4, 7],
    [7, 1, 7, 1, 7],
    [5, 5, 7, 1, 1],
    [7, 4, 7, 1, 7],
    [7, 4, 7, 5, 7],
    [7, 1, 2, 2, 2],
    [7, 5, 7, 5, 7],
    [7, 5, 7, 1, 7],
];

/// A 10x10 grid of test digits, each with its predicted label below (green when right,
/// red when wrong).
fn write_predictions(path: &std::path::Path, data: &Mnist, idx: &[usize], preds: &[i32]) -> tessera::Result<()> {
    let (cell_w, cell_h, cols) = (60usize, 76usize, 10usize);
    let rows = idx.len().div_ceil(cols);
    let (w, h) = (cell_w * cols, cell_h * rows);
    let mut img = vec![255u8; w * h * 3];
    for (k, (&i, &p)) in idx.iter().zip(preds).enumerate() {
        let (ox, oy) = ((k % cols) * cell_w + 2, (k / cols) * cell_h + 2);
        for y in 0..56 {
            for x in 0..56 {
                let v = 255 - data.pixels[i * 784 + (y / 2) * 28 + x / 2];
                let o = ((oy + y) * w + ox + x) * 3;
                img[o..o + 3].copy_from_slice(&[v, v, v]);
            }
        }
        let color = if p == data.labels[i] as i32 { [0, 150, 0] } else { [210, 0, 0] };
        let digit = p.clamp(0, 9) as usize;
        for (r, bits) in FONT[digit].iter().enumerate() {
            for c in 0..3 {
                if bits >> (2 - c) & 1 == 1 {
                    for dy in 0..3 {
                        for dx in 0..3 {
                            let (x, y) = (ox + 24 + c * 3 + dx, oy + 58 + r * 3 + dy);
                            let o = (y * w + x) * 3;
                            img[o..o + 3].copy_from_slice(&color);
                        }
                    }
                }
            }
        }
    }
    let io = |e: String| tessera::Error::Io { path: path.display().to_string(), message: e };
    let f = std::fs::File::create(path).map_err(|e| io(e.to_string()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(f), w as u32, h as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().map_err(|e| io(e.to_string()))?;
    wr.write_image_data(&img).map_err(|e| io(e.to_string()))?;
    Ok(())
}
