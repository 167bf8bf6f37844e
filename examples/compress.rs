//! What compression costs and buys on the MNIST models: one table (and one JSON line
//! per variant) with parameters, non-zeros, file bytes, held-out accuracy, latency at
//! batch 1 and throughput at batch 64 on the current device.
//!
//! ```text
//! cargo run --release --example compress            # the full report
//! cargo run --release --example compress -- --quick # short training, for CI
//! TESSERA_ADAPTER=gpu cargo run --release --example compress   # on the wgpu adapter
//! ```
//!
//! Variants: the CNN and the MLP trained here; the CNN pruned 50%, 75% and 90%
//! (unstructured, each fine-tuned with its masks held); the CNN with 50% of its channels
//! removed, fine-tuned; a distilled MLP student with under a fifth of the CNN's
//! parameters, against the same student trained on labels alone (3 seeds); the MLP and
//! the CNN (convolutions included) in Q8_0 and in Q4_0, calibrated with GPTQ on 256
//! training digits (the CNN also without, to show what GPTQ buys); and the student
//! pruned 50%, fine-tuned and in Q8_0.
//!
//! `--check` loads every variant the report saved, in this new process, from its file
//! alone, and checks that it reproduces the accuracy the report recorded:
//!
//! ```text
//! cargo run --release --example compress -- --check
//! ```

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tessera::compress::distill::{distill_step, DistillOptions};
use tessera::compress::prune::{prunable, prune_channels, ChannelNorm, Pruning};
use tessera::io::mnist::Mnist;
use tessera::models::mnist::{build, from_state_dict, input_shape, standardize, TRAIN};
use tessera::nn::{loss, Activation, Flatten, Layer, Linear, Module, Sequential};
use tessera::optim::{Adam, Optimizer};
use tessera::{DType, Device, Tensor};

#[derive(Parser, Debug)]
#[command(about = "Pruning, distillation and quantisation of the MNIST models, measured")]
struct Args {
    /// Short training and fine-tuning (CI); the figures are then not the report's.
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "data/mnist.bin")]
    data: PathBuf,
    /// Where the variants' files and `report.jsonl` go.
    #[arg(long, default_value = "target/compress")]
    out: PathBuf,
    /// Distillation temperature (the best of a small sweep; see `--sweep`).
    #[arg(long, default_value_t = 2.0)]
    temperature: f64,
    /// Weight of the distillation term (1 - alpha on the labels).
    #[arg(long, default_value_t = 0.5)]
    alpha: f64,
    /// Only the students: distilled against labels alone for each T,alpha pair given
    /// here (e.g. `2,0.5 4,0.7 8,0.9`), then exit.
    #[arg(long, num_args = 1..)]
    sweep: Vec<String>,
    /// Student training steps (default: 3,000; 60 with --quick).
    #[arg(long)]
    student_steps: Option<usize>,
    /// Train and fine-tune on the CPU backend, then measure each variant (accuracy,
    /// latency, throughput) on the current device: on a software adapter such as
    /// lavapipe the training is what takes the time.
    #[arg(long)]
    train_on_cpu: bool,
    /// Load each variant listed in `<out>/report.jsonl` from its file and check that it
    /// reproduces the recorded accuracy; exit 1 if any does not.
    #[arg(long)]
    check: bool,
}

struct Budget {
    cnn: usize,
    mlp: usize,
    finetune: usize,
    student: usize,
    seeds: u64,
}

fn batch(data: &Mnist, kind: &str, idx: &[usize], dev: &Device) -> (Tensor, Tensor) {
    let x = Tensor::from_slice(&standardize(&data.images_f32(idx)), input_shape(kind, idx.len()), dev);
    (x, Tensor::from_slice(&data.labels_i32(idx), [idx.len()], dev))
}

/// Batch `k` of 64 training digits (a fixed stride through the training set).
fn train_idx(k: usize) -> Vec<usize> {
    (0..64).map(|i| (k * 64 + i * 7919) % TRAIN).collect()
}

/// Adam steps over the batches `steps`; the masks (if any) held after every step.
fn train(
    m: &mut Sequential,
    kind: &str,
    data: &Mnist,
    steps: std::ops::Range<usize>,
    lr: f64,
    masks: Option<&Pruning>,
    dev: &Device,
) -> tessera::Result<()> {
    let mut opt = Adam::new(lr);
    for k in steps {
        let (x, y) = batch(data, kind, &train_idx(k), dev);
        let l = loss::cross_entropy(&m.forward(&x), &y);
        opt.step(m, &l)?;
        if let Some(p) = masks {
            p.after_step(m, &mut opt)?;
        }
    }
    Ok(())
}

fn accuracy(m: &mut Sequential, kind: &str, data: &Mnist, dev: &Device) -> tessera::Result<f64> {
    m.set_training(false);
    let _g = tessera::no_grad();
    let test: Vec<usize> = (TRAIN..data.len()).collect();
    let mut right = 0;
    for c in test.chunks(500) {
        let (x, _) = batch(data, kind, c, dev);
        let p = m.forward(&x).argmax_dim(-1).to_vec_blocking::<i32>()?;
        right += p.iter().zip(c).filter(|(p, &i)| **p == data.labels[i] as i32).count();
    }
    m.set_training(true);
    Ok(right as f64 / test.len() as f64)
}

/// Median latency of one digit (ms) and digits/s at batch 64.
fn speed(m: &Sequential, kind: &str, data: &Mnist, dev: &Device) -> tessera::Result<(f64, f64)> {
    let _g = tessera::no_grad();
    let (one, _) = batch(data, kind, &[TRAIN], dev);
    let (many, _) = batch(data, kind, &(TRAIN..TRAIN + 64).collect::<Vec<_>>(), dev);
    let time = |x: &Tensor, n: usize| -> tessera::Result<f64> {
        for _ in 0..3 {
            m.forward(x).to_vec_blocking::<f32>()?;
        }
        let mut t = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = Instant::now();
            m.forward(x).to_vec_blocking::<f32>()?;
            t.push(t0.elapsed().as_secs_f64());
        }
        t.sort_by(|a, b| a.total_cmp(b));
        Ok(t[n / 2])
    };
    Ok((time(&one, 21)? * 1e3, 64.0 / time(&many, 11)?))
}

/// A copy of `m` on `dev`, weights exact (quantised blocks included).
fn to_device(m: &mut Sequential, arch: &str, dev: &Device) -> tessera::Result<Sequential> {
    let mut dict = Vec::new();
    for s in m.slots() {
        let t = &s.tensor;
        let moved = if t.dtype().is_quantized() {
            let blocks = pollster::block_on(t.quantized_blocks())?;
            Tensor::from_quantized(t.dtype(), t.dims().to_vec(), &blocks, dev)
        } else {
            Tensor::from_slice(&t.to_vec_blocking::<f32>()?, t.dims().to_vec(), dev)
        };
        dict.push((s.name.clone(), moved));
    }
    from_state_dict(arch, &dict.into_iter().collect())
}

fn nonzeros(m: &mut Sequential) -> tessera::Result<usize> {
    let mut n = 0;
    for s in m.slots() {
        n += s.tensor.cast(DType::F32).to_vec_blocking::<f32>()?.iter().filter(|x| **x != 0.0).count();
    }
    Ok(n)
}

fn file_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// A student MLP with under a fifth of the CNN's parameters (784-12-10: 9,550).
fn student(seed: u64, dev: &Device) -> Sequential {
    Sequential::new()
        .add(Flatten)
        .add(Linear::new(784, 12, true, seed * 10 + 1, dev))
        .add(Activation::Relu)
        .add(Linear::new(12, 10, true, seed * 10 + 2, dev))
}

struct Row {
    name: String,
    /// The architecture `models::mnist::from_state_dict` rebuilds it as.
    arch: &'static str,
    file: PathBuf,
    params: usize,
    nonzeros: usize,
    bytes: u64,
    accuracy: f64,
    latency_ms: f64,
    per_s: f64,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> tessera::Result<()> {
    let data = Mnist::load(&args.data)?;
    let dev = Device::new()?;
    if args.check {
        return check(&args.out, &data, &dev);
    }
    // `dev` trains; `eval` measures.
    let eval = dev.clone();
    let dev = if args.train_on_cpu { Device::cpu() } else { dev };
    std::fs::create_dir_all(&args.out)
        .map_err(|e| tessera::Error::Io { path: args.out.display().to_string(), message: e.to_string() })?;
    let mut b = if args.quick {
        Budget { cnn: 60, mlp: 60, finetune: 20, student: 60, seeds: 1 }
    } else {
        Budget { cnn: 625, mlp: 1000, finetune: 200, student: 3000, seeds: 3 }
    };
    if let Some(n) = args.student_steps {
        b.student = n;
    }
    println!(
        "device: {} ({}){}{}",
        eval.info().name,
        eval.info().backend,
        if args.train_on_cpu { ", trained on the CPU backend" } else { "" },
        if args.quick { ", --quick" } else { "" }
    );
    let bar = ProgressBar::new(15 + 2 * b.seeds);
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut record = |name: &str, m: &mut Sequential, arch: &'static str, file: &Path| -> tessera::Result<()> {
        bar.set_message(name.to_string());
        let mut moved = if eval.same(&dev) { None } else { Some(to_device(m, arch, &eval)?) };
        let on = moved.as_mut().unwrap_or(m);
        let accuracy = accuracy(on, arch, &data, &eval)?;
        let (latency_ms, per_s) = speed(on, arch, &data, &eval)?;
        rows.push(Row {
            name: name.into(),
            arch,
            file: file.to_path_buf(),
            params: m.num_parameters(),
            nonzeros: nonzeros(m)?,
            bytes: file_bytes(file),
            accuracy,
            latency_ms,
            per_s,
        });
        bar.inc(1);
        Ok(())
    };
    let dense_file = |m: &mut Sequential, name: &str| -> tessera::Result<PathBuf> {
        let p = args.out.join(format!("{name}.safetensors"));
        let dict: Vec<(String, Tensor)> = m.slots().iter().map(|s| (s.name.clone(), s.tensor.clone())).collect();
        tessera::io::safetensors::save(&p, &dict, &Default::default())?;
        Ok(p)
    };

    // The dense models.
    bar.set_message("training the CNN");
    let mut cnn = build("cnn", 1, &dev)?;
    train(&mut cnn, "cnn", &data, 0..b.cnn, 4e-3, None, &dev)?;
    if !args.sweep.is_empty() {
        bar.finish_and_clear();
        return sweep(&args, &b, &mut cnn, &data, &dev);
    }
    let f = dense_file(&mut cnn, "cnn")?;
    record("cnn", &mut cnn, "cnn", &f)?;
    bar.set_message("training the MLP");
    let mut mlp = build("mlp", 1, &dev)?;
    train(&mut mlp, "mlp", &data, 0..b.mlp, 2e-3, None, &dev)?;
    let f = dense_file(&mut mlp, "mlp")?;
    record("mlp", &mut mlp, "mlp", &f)?;

    // Unstructured pruning of the CNN, fine-tuned with the masks held.
    for amount in [0.5, 0.75, 0.9] {
        let mut m = build("cnn", 1, &dev)?;
        m.load_state_dict(&cnn.state_dict(), true)?;
        let mut p = Pruning::default();
        p.global_unstructured(&mut m, amount, &prunable)?;
        train(&mut m, "cnn", &data, b.cnn..b.cnn + b.finetune, 1e-3, Some(&p), &dev)?;
        p.remove(&mut m)?;
        let name = format!("cnn-unstructured-{}", (amount * 100.0) as u32);
        let f = args.out.join(format!("{name}.sparse.safetensors"));
        tessera::compress::sparse::save(&f, &mut m)?;
        record(&name, &mut m, "cnn", &f)?;
    }

    // Half the CNN's channels removed, fine-tuned.
    let mut slim = build("cnn", 1, &dev)?;
    slim.load_state_dict(&cnn.state_dict(), true)?;
    prune_channels(&mut slim, 0.5, ChannelNorm::L1)?;
    train(&mut slim, "cnn", &data, b.cnn..b.cnn + b.finetune, 1e-3, None, &dev)?;
    let f = dense_file(&mut slim, "cnn-channels-50")?;
    record("cnn-channels-50", &mut slim, "cnn", &f)?;

    // Distillation: the CNN teaches a small MLP; the same MLP on labels alone.
    // (`--sweep` compares temperatures and weights.)
    let o = DistillOptions { temperature: args.temperature, alpha: args.alpha };
    bar.set_message("students");
    let (kd_acc, ce_acc, mut s) = students(&mut cnn, o, &b, &data, &dev)?;
    bar.inc(2 * b.seeds);
    let f = dense_file(&mut s, "student-distilled")?;
    record("student-distilled (seed 1)", &mut s, "mlp", &f)?;

    // Quantised: every Linear and Conv2d weight; Q4_0 calibrated with GPTQ on 256
    // training digits (and the CNN's Q4_0 also without, round to nearest).
    for (kind, dense) in [("mlp", &mlp), ("cnn", &cnn)] {
        let calib = batch(&data, kind, &(0..256).map(|i| i * 31 % TRAIN).collect::<Vec<_>>(), &dev).0;
        let mut variants = vec![(DType::Q8_0, false), (DType::Q4_0, true)];
        if kind == "cnn" {
            variants.push((DType::Q4_0, false));
        }
        for (dt, gptq) in variants {
            let mut m = build(kind, 1, &dev)?;
            m.load_state_dict(&dense.state_dict(), true)?;
            m.set_training(false);
            pollster::block_on(tessera::quant::quantize_model(&mut m, dt, gptq.then_some(&calib)))?;
            let name = format!("{kind}-{}{}", dt.name(), if dt == DType::Q4_0 && !gptq { "-rtn" } else { "" });
            let f = dense_file(&mut m, &name)?;
            record(&name, &mut m, kind, &f)?;
        }
    }

    // Distilled + pruned 50% (fine-tuned) + Q8_0.
    let mut p = Pruning::default();
    p.l1_unstructured(&mut s, 0.5, &prunable)?;
    let mut opt = Adam::new(1e-3);
    for k in 0..b.finetune {
        let (x, y) = batch(&data, "cnn", &train_idx(b.student + k), &dev);
        distill_step(&cnn, &mut s, &mut opt, &x, &y, o)?;
        p.after_step(&mut s, &mut opt)?;
    }
    p.remove(&mut s)?;
    pollster::block_on(tessera::quant::quantize_model(&mut s, DType::Q8_0, None))?;
    let f = dense_file(&mut s, "student-pruned-q8_0")?;
    record("student-distilled-pruned-50-q8_0", &mut s, "mlp", &f)?;
    bar.finish_and_clear();

    println!(
        "\n{:<34} {:>9} {:>9} {:>10} {:>9} {:>11} {:>12}",
        "variant", "params", "non-zero", "file B", "accuracy", "batch-1 ms", "batch-64 /s"
    );
    let mut json = String::new();
    for r in &rows {
        println!(
            "{:<34} {:>9} {:>9} {:>10} {:>9.4} {:>11.3} {:>12.0}",
            r.name, r.params, r.nonzeros, r.bytes, r.accuracy, r.latency_ms, r.per_s
        );
        json.push_str(
            &serde_json::json!({ "variant": r.name, "arch": r.arch, "file": r.file.file_name().map(|f| f.to_string_lossy()),
                "params": r.params, "nonzeros": r.nonzeros, "file_bytes": r.bytes,
                "accuracy": r.accuracy, "latency_batch1_ms": r.latency_ms, "throughput_batch64_per_s": r.per_s })
            .to_string(),
        );
        json.push('\n');
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "\nstudent (784-12-10, {} parameters, {:.1}% of the CNN's), {} steps, {} seed(s): distilled (T = {}, alpha = {}) {:.4}, labels alone {:.4}",
        student(1, &dev).num_parameters(),
        100.0 * student(1, &dev).num_parameters() as f64 / cnn.num_parameters() as f64,
        b.student,
        b.seeds,
        o.temperature,
        o.alpha,
        mean(&kd_acc),
        mean(&ce_acc)
    );
    json.push_str(
        &serde_json::json!({ "distillation": { "temperature": o.temperature, "alpha": o.alpha,
            "distilled": kd_acc, "labels_alone": ce_acc } })
        .to_string(),
    );
    json.push('\n');
    let find = |n: &str| rows.iter().find(|r| r.name == n);
    if let (Some(d), Some(c), Some(u)) = (find("cnn"), find("cnn-channels-50"), find("cnn-unstructured-90")) {
        println!(
            "50% channels: accuracy {:+.2} points, batch-64 {:.2}x faster; 90% unstructured: {:+.2} points, file {:.1}% of dense",
            100.0 * (c.accuracy - d.accuracy),
            c.per_s / d.per_s,
            100.0 * (u.accuracy - d.accuracy),
            100.0 * u.bytes as f64 / d.bytes.max(1) as f64
        );
    }
    let report = args.out.join("report.jsonl");
    std::fs::write(&report, json)
        .map_err(|e| tessera::Error::Io { path: report.display().to_string(), message: e.to_string() })?;
    println!("wrote {} and each variant's file in {}", report.display(), args.out.display());
    Ok(())
}

/// The distilled student's and the labels-only student's accuracy per seed, and the
/// distilled student of the first seed.
fn students(
    teacher: &mut Sequential,
    o: DistillOptions,
    b: &Budget,
    data: &Mnist,
    dev: &Device,
) -> tessera::Result<(Vec<f64>, Vec<f64>, Sequential)> {
    teacher.set_training(false);
    let (mut kd, mut ce) = (Vec::new(), Vec::new());
    let mut first = None;
    for seed in 1..=b.seeds {
        let mut s = student(seed, dev);
        let mut opt = Adam::new(3e-3);
        for k in 0..b.student {
            let (x, y) = batch(data, "cnn", &train_idx(k), dev);
            distill_step(&*teacher, &mut s, &mut opt, &x, &y, o)?;
        }
        kd.push(accuracy(&mut s, "cnn", data, dev)?);
        first.get_or_insert(s);
        let mut c = student(seed, dev);
        let mut opt = Adam::new(3e-3);
        for k in 0..b.student {
            let (x, y) = batch(data, "cnn", &train_idx(k), dev);
            let l = loss::cross_entropy(&c.forward(&x), &y);
            opt.step(&mut c, &l)?;
        }
        ce.push(accuracy(&mut c, "cnn", data, dev)?);
    }
    teacher.set_training(true);
    Ok((kd, ce, first.unwrap_or_else(|| student(1, dev))))
}

fn sweep(args: &Args, b: &Budget, teacher: &mut Sequential, data: &Mnist, dev: &Device) -> tessera::Result<()> {
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    println!(
        "teacher accuracy {:.4}; {} student steps, {} seeds",
        accuracy(teacher, "cnn", data, dev)?,
        b.student,
        b.seeds
    );
    for pair in &args.sweep {
        let mut it = pair.split(',').map(|x| x.trim().parse::<f64>());
        let (Some(Ok(temperature)), Some(Ok(alpha))) = (it.next(), it.next()) else {
            return Err(tessera::Error::Unsupported(format!("--sweep {pair:?}: use T,alpha such as 4,0.7")));
        };
        let (kd, ce, _) = students(teacher, DistillOptions { temperature, alpha }, b, data, dev)?;
        println!(
            "T = {temperature}, alpha = {alpha}: distilled {:.4} {kd:.4?}, labels alone {:.4} {ce:.4?}",
            mean(&kd),
            mean(&ce)
        );
    }
    Ok(())
}

/// Load each variant of `<out>/report.jsonl` from its file alone and compare its
/// held-out accuracy with the recorded one (at most one digit in 2,000 apart, for a
/// device other than the report's).
fn check(out: &Path, data: &Mnist, dev: &Device) -> tessera::Result<()> {
    let io = |p: &Path, e: String| tessera::Error::Io { path: p.display().to_string(), message: e };
    let report = out.join("report.jsonl");
    let text = std::fs::read_to_string(&report).map_err(|e| io(&report, format!("{e} (run the report first)")))?;
    println!("checking the variants in {} on {}", report.display(), dev.info().name);
    let (mut checked, mut bad) = (0, 0);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| io(&report, e.to_string()))?;
        let (Some(name), Some(arch), Some(file), Some(recorded)) =
            (v["variant"].as_str(), v["arch"].as_str(), v["file"].as_str(), v["accuracy"].as_f64())
        else {
            continue; // the distillation summary line
        };
        let path = out.join(file);
        let bytes = std::fs::read(&path).map_err(|e| io(&path, e.to_string()))?;
        let tensors = if file.ends_with(".sparse.safetensors") {
            tessera::compress::sparse::from_bytes(&bytes, dev)?
        } else {
            tessera::io::safetensors::load_bytes(&bytes, dev)?.tensors
        };
        let mut m = from_state_dict(arch, &tensors.into_iter().collect())?;
        let got = accuracy(&mut m, arch, data, dev)?;
        let ok = (got - recorded).abs() <= 1.0 / 2000.0 + 1e-12;
        println!(
            "{:<34} {:<28} recorded {recorded:.4}, loaded {got:.4} {}",
            name,
            file,
            if ok { "ok" } else { "DIFFERS" }
        );
        checked += 1;
        bad += usize::from(!ok);
    }
    if checked == 0 || bad > 0 {
        return Err(tessera::Error::Unsupported(format!(
            "{bad} of {checked} variants did not reproduce their accuracy"
        )));
    }
    println!("all {checked} variants reproduce their recorded accuracy");
    Ok(())
}
