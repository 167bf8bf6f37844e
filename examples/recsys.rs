//! Recommendation on MovieLens-100K (`scripts/fetch_movielens.sh`): DeepFM rating
//! prediction (RMSE on a random 10% test split), matrix factorisation with BPR and a
//! two-tower retrieval model (Recall@10 and NDCG@10 over all items, seen items
//! excluded, on RecBole's per-user 8:1:1 split, or leave-one-out by time with `--split
//! loo`), every table with sparse gradients and
//! SparseAdam. Progress bars, TensorBoard scalars under `--out`/runs, a checkpoint per
//! model, and one `RESULT {json}` line. `--bench-sparse` times a sparse EmbeddingBag
//! step on a 10,000-row and a 1,000,000-row table.

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use tessera::io::movielens::MovieLens;
use tessera::io::tensorboard::EventWriter;
use tessera::models::recsys::{items_by_user, rank_metrics, DeepFm, Features, MatrixFactorization, TwoTower};
use tessera::nn::{BagMode, Bags, EmbeddingBag, Linear, Module};
use tessera::optim::{Optimizer, SparseAdam};
use tessera::{Device, Error, Result, Tensor};

#[derive(Parser)]
struct Args {
    /// Which models: all, deepfm, mf, two-tower.
    #[arg(long, default_value = "all")]
    model: String,
    /// Short runs for CI (a few epochs each; the floors are not expected).
    #[arg(long)]
    quick: bool,
    #[arg(long, default_value = "target/recsys")]
    out: PathBuf,
    #[arg(long)]
    data: Option<PathBuf>,
    #[arg(long, default_value_t = 2020)]
    seed: u64,
    /// The ranking split: `recbole` (each user's ratings shuffled, 8:1:1, as RecBole's
    /// published tables) or `loo` (per user, the last rating by time is test and the one
    /// before it validation).
    #[arg(long, default_value = "recbole")]
    split: String,
    /// Time sparse steps on a 10,000-row and a 1,000,000-row table instead.
    #[arg(long)]
    bench_sparse: bool,
    /// Table sizes for `--bench-sparse`; the ratio is last over first.
    #[arg(long, value_delimiter = ',', default_values_t = [10_000usize, 1_000_000])]
    bench_rows: Vec<usize>,
    /// Timed rounds per table size for `--bench-sparse` (15 steps each, after 15
    /// untimed ones; the median round counts). On a shared host single rounds swing by
    /// a third, so a median of few moves the ratio by 0.1.
    #[arg(long, default_value_t = 31)]
    bench_rounds: usize,
    #[arg(long)]
    quiet: bool,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// xorshift64*, seeded: shuffles and negative samples.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

fn bar(quiet: bool, len: u64, name: &str) -> ProgressBar {
    let b = if quiet { ProgressBar::hidden() } else { ProgressBar::new(len) };
    b.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    b.set_prefix(name.to_string());
    b
}

fn io_err(p: &std::path::Path, e: std::io::Error) -> Error {
    Error::Io { path: p.display().to_string(), message: e.to_string() }
}

fn save(args: &Args, name: &str, model: &mut dyn Module, opt: &mut dyn Optimizer, epoch: usize) -> Result<PathBuf> {
    std::fs::create_dir_all(&args.out).map_err(|e| io_err(&args.out, e))?;
    let path = args.out.join(format!("{name}.ckpt"));
    let mut md = BTreeMap::new();
    md.insert("model".to_string(), name.to_string());
    md.insert("epoch".to_string(), epoch.to_string());
    md.insert("seed".to_string(), args.seed.to_string());
    tessera::io::checkpoint::save(&path, model, opt, &md)?;
    Ok(path)
}

fn run(args: Args) -> Result<()> {
    let dev = Device::new()?;
    eprintln!("device: {} ({})", dev.info().name, dev.info().placement);
    if args.bench_sparse {
        return bench_sparse(&dev, &args.bench_rows, args.bench_rounds.max(1));
    }
    let data = MovieLens::load(&args.data.clone().unwrap_or_else(MovieLens::default_path))?;
    let mut result = serde_json::Map::new();
    let started = Instant::now();
    let runs = args.out.join("runs");
    let mut tb = EventWriter::new(&runs)?;
    if !["all", "deepfm", "mf", "two-tower"].contains(&args.model.as_str()) {
        return Err(Error::Unsupported(format!("--model {}: use all, deepfm, mf or two-tower", args.model)));
    }
    let which = |m: &str| args.model == "all" || args.model == m;
    if which("deepfm") {
        let (rmse, epochs) = deepfm(&args, &data, &dev, &mut tb)?;
        println!("DeepFM: test RMSE {rmse:.4} (best validation epoch {epochs})");
        result.insert("deepfm_test_rmse".into(), rmse.into());
    }
    result.insert("split".into(), args.split.clone().into());
    if which("mf") {
        let (recall, ndcg) = bpr_mf(&args, &data, &dev, &mut tb)?;
        println!("BPR-MF: test Recall@10 {recall:.4}, NDCG@10 {ndcg:.4}");
        result.insert("bpr_mf_recall10".into(), recall.into());
        result.insert("bpr_mf_ndcg10".into(), ndcg.into());
    }
    if which("two-tower") {
        let (recall, ndcg) = two_tower(&args, &data, &dev, &mut tb, &mut result)?;
        println!("two-tower: test Recall@10 {recall:.4}, NDCG@10 {ndcg:.4}");
        result.insert("two_tower_recall10".into(), recall.into());
        result.insert("two_tower_ndcg10".into(), ndcg.into());
    }
    tb.flush()?;
    result.insert("seconds".into(), started.elapsed().as_secs_f64().into());
    result.insert("device".into(), dev.info().name.clone().into());
    println!("RESULT {}", serde_json::Value::Object(result));
    Ok(())
}

/// DeepFM on a random 80/10/10 split; the test RMSE at the epoch with the best
/// validation RMSE.
fn deepfm(args: &Args, data: &MovieLens, dev: &Device, tb: &mut EventWriter) -> Result<(f64, usize)> {
    let (train, valid, test) = data.random_split(args.seed, (0.8, 0.1));
    let mut model = DeepFm::new(data, 16, 64, args.seed, dev);
    let mut opt = SparseAdam::new(2e-3);
    let epochs = if args.quick { 2 } else { 12 };
    let batch = 512;
    let mut rng = Rng(args.seed | 1);
    let rmse_of = |model: &DeepFm, idx: &[usize]| -> Result<f64> {
        let _g = tessera::no_grad();
        let mut se = 0.0;
        for chunk in idx.chunks(10_000) {
            let pred = model.forward(&Features::of(data, chunk)?).to_vec_blocking::<f32>()?;
            se += chunk
                .iter()
                .zip(&pred)
                .map(|(&k, &p)| (f64::from(p.clamp(1.0, 5.0)) - f64::from(data.ratings[k])).powi(2))
                .sum::<f64>();
        }
        Ok((se / idx.len() as f64).sqrt())
    };
    let (mut best, mut best_test, mut best_epoch, mut step) = (f64::INFINITY, f64::NAN, 0, 0u64);
    for epoch in 0..epochs {
        let mut order = train.clone();
        rng.shuffle(&mut order);
        let b = bar(args.quiet, order.len().div_ceil(batch) as u64, &format!("deepfm {}/{epochs}", epoch + 1));
        for chunk in order.chunks(batch) {
            let f = Features::of(data, chunk)?;
            let y: Vec<f32> = chunk.iter().map(|&k| data.ratings[k]).collect();
            let loss = model.loss(&f, &y);
            let l = opt.step(&mut model, &loss)?;
            tb.scalar("deepfm/train_mse", l, step)?;
            step += 1;
            b.inc(1);
            b.set_message(format!("mse {l:.3}"));
        }
        b.finish_and_clear();
        let v = rmse_of(&model, &valid)?;
        tb.scalar("deepfm/valid_rmse", v, epoch as u64)?;
        if v < best {
            best = v;
            best_test = rmse_of(&model, &test)?;
            best_epoch = epoch + 1;
            save(args, "deepfm", &mut model, &mut opt, epoch + 1)?;
        }
        if !args.quiet {
            eprintln!("deepfm epoch {}: valid RMSE {v:.4}", epoch + 1);
        }
    }
    tb.scalar("deepfm/test_rmse", best_test, best_epoch as u64)?;
    Ok((best_test, best_epoch))
}

/// (user, item) pairs of a split.
fn pairs(data: &MovieLens, idx: &[usize]) -> Vec<(u32, u32)> {
    idx.iter().map(|&k| (data.users[k], data.items[k])).collect()
}

/// Validation and test ranking metrics at K = 10: validation excludes the training
/// items, test the training and validation items.
struct Ranking {
    train: Vec<(u32, u32)>,
    seen_train: Vec<Vec<u32>>,
    seen_both: Vec<Vec<u32>>,
    valid: Vec<Vec<u32>>,
    test: Vec<Vec<u32>>,
}

impl Ranking {
    fn new(data: &MovieLens, args: &Args) -> Result<Ranking> {
        let (train, valid, test) = match args.split.as_str() {
            "recbole" => data.per_user_split(args.seed),
            "loo" => data.leave_one_out(),
            s => return Err(Error::Unsupported(format!("--split {s}: use recbole or loo"))),
        };
        let both: Vec<usize> = train.iter().chain(&valid).copied().collect();
        Ok(Ranking {
            train: pairs(data, &train),
            seen_train: items_by_user(data, &train),
            seen_both: items_by_user(data, &both),
            valid: items_by_user(data, &valid),
            test: items_by_user(data, &test),
        })
    }
}

/// Train with early stopping on validation NDCG@10 (checked every `every` epochs,
/// patience 3); returns the test metrics of the best checkpoint.
#[allow(clippy::too_many_arguments)] // three closures and the schedule: a struct would only rename them
fn rank_loop(
    args: &Args,
    name: &str,
    epochs: usize,
    every: usize,
    tb: &mut EventWriter,
    mut epoch_fn: impl FnMut(usize) -> Result<()>,
    mut scores: impl FnMut() -> Result<Tensor>,
    mut checkpoint: impl FnMut(usize) -> Result<()>,
    r: &Ranking,
) -> Result<(f64, f64)> {
    let (mut best, mut best_test, mut bad) = (-1.0, (0.0, 0.0), 0);
    for epoch in 1..=epochs {
        epoch_fn(epoch)?;
        if epoch % every != 0 && epoch != epochs {
            continue;
        }
        let s = scores()?;
        let (vr, vn) = rank_metrics(&s, &r.seen_train, &r.valid, 10)?;
        tb.scalar(&format!("{name}/valid_ndcg10"), vn, epoch as u64)?;
        tb.scalar(&format!("{name}/valid_recall10"), vr, epoch as u64)?;
        if !args.quiet {
            eprintln!("{name} epoch {epoch}: valid Recall@10 {vr:.4} NDCG@10 {vn:.4}");
        }
        if vn > best {
            best = vn;
            best_test = rank_metrics(&s, &r.seen_both, &r.test, 10)?;
            checkpoint(epoch)?;
            bad = 0;
        } else {
            bad += 1;
            if bad >= 3 {
                break;
            }
        }
    }
    tb.scalar(&format!("{name}/test_recall10"), best_test.0, 0)?;
    tb.scalar(&format!("{name}/test_ndcg10"), best_test.1, 0)?;
    Ok(best_test)
}

/// A uniform negative item the user has not rated in training.
fn negative(rng: &mut Rng, seen: &[u32], n_items: usize) -> u32 {
    loop {
        let i = rng.below(n_items) as u32;
        if seen.binary_search(&i).is_err() {
            return i;
        }
    }
}

/// Matrix factorisation with BPR, RecBole's setup: 64-wide tables, batch 2048, one
/// uniform negative per positive.
fn bpr_mf(args: &Args, data: &MovieLens, dev: &Device, tb: &mut EventWriter) -> Result<(f64, f64)> {
    let r = Ranking::new(data, args)?;
    let model = std::cell::RefCell::new(MatrixFactorization::new(data.n_users, data.n_items, 64, args.seed, dev));
    let opt = std::cell::RefCell::new(SparseAdam::new(1e-3));
    let mut rng = Rng(args.seed ^ 0xb9);
    let mut step = 0u64;
    let (epochs, every) = if args.quick { (2, 1) } else { (150, 5) };
    let mut tb_steps: Vec<(f64, u64)> = Vec::new();
    let epoch_fn = |epoch: usize| -> Result<()> {
        let mut order = r.train.clone();
        rng.shuffle(&mut order);
        let b = bar(args.quiet, order.len().div_ceil(2048) as u64, &format!("bpr-mf {epoch}"));
        for chunk in order.chunks(2048) {
            let users: Vec<u32> = chunk.iter().map(|p| p.0).collect();
            let pos: Vec<u32> = chunk.iter().map(|p| p.1).collect();
            let neg: Vec<u32> =
                users.iter().map(|&u| negative(&mut rng, &r.seen_train[u as usize], data.n_items)).collect();
            let loss = model.borrow().bpr_loss(&users, &pos, &neg);
            let l = opt.borrow_mut().step(&mut *model.borrow_mut(), &loss)?;
            tb_steps.push((l, step));
            step += 1;
            b.inc(1);
        }
        b.finish_and_clear();
        Ok(())
    };
    let scores = || -> Result<Tensor> {
        let _g = tessera::no_grad();
        Ok(model.borrow().all_scores())
    };
    let checkpoint = |epoch: usize| -> Result<()> {
        save(args, "bpr_mf", &mut *model.borrow_mut(), &mut *opt.borrow_mut(), epoch).map(|_| ())
    };
    let out = rank_loop(args, "bpr_mf", epochs, every, tb, epoch_fn, scores, checkpoint, &r)?;
    Ok(out)
}

/// The two-tower model with in-batch negatives; then the serving path: one user's top
/// 10 in one realisation.
fn two_tower(
    args: &Args,
    data: &MovieLens,
    dev: &Device,
    tb: &mut EventWriter,
    result: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<(f64, f64)> {
    let r = Ranking::new(data, args)?;
    let model = std::cell::RefCell::new(TwoTower::new(data, 32, args.seed, dev));
    let opt = std::cell::RefCell::new(SparseAdam::new(3e-3));
    let mut rng = Rng(args.seed ^ 0x77);
    let (epochs, every) = if args.quick { (1, 1) } else { (40, 2) };
    let mut counts = vec![0f64; data.n_items];
    for &(_, i) in &r.train {
        counts[i as usize] += 1.0;
    }
    let log_q: Vec<f32> = counts.iter().map(|&c| ((c + 1.0) / (r.train.len() as f64 + 1.0)).ln() as f32).collect();
    let epoch_fn = |epoch: usize| -> Result<()> {
        let mut order = r.train.clone();
        rng.shuffle(&mut order);
        let b = bar(args.quiet, order.len().div_ceil(1024) as u64, &format!("two-tower {epoch}"));
        for chunk in order.chunks(1024) {
            let users: Vec<u32> = chunk.iter().map(|p| p.0).collect();
            let items: Vec<u32> = chunk.iter().map(|p| p.1).collect();
            let loss = model.borrow().loss(data, &users, &items, Some(&log_q))?;
            opt.borrow_mut().step(&mut *model.borrow_mut(), &loss)?;
            b.inc(1);
        }
        b.finish_and_clear();
        Ok(())
    };
    let scores = || -> Result<Tensor> {
        let _g = tessera::no_grad();
        let m = model.borrow();
        let users: Vec<u32> = (0..data.n_users as u32).collect();
        Ok(m.users(data, &users).matmul(&m.item_table(data)?.t()))
    };
    let checkpoint = |epoch: usize| -> Result<()> {
        save(args, "two_tower", &mut *model.borrow_mut(), &mut *opt.borrow_mut(), epoch).map(|_| ())
    };
    let out = rank_loop(args, "two_tower", epochs, every, tb, epoch_fn, scores, checkpoint, &r)?;
    // Serving: the item table once, then one realisation per request.
    let m = model.borrow();
    let table = m.item_table(data)?;
    let before = dev.stats().realizations;
    let top = m.recommend(data, &table, 0, &r.seen_both[0], 10)?;
    let realisations = dev.stats().realizations - before;
    println!("two-tower: top 10 items for user 0: {top:?} ({realisations} realisation)");
    result.insert("recommend_realizations".into(), realisations.into());
    Ok(out)
}

/// Steps/s of a sparse EmbeddingBag (batch 1,024 bags of 8 ids, width 32) + Linear
/// trained with SparseAdam onto ratings from 1 to 5 (a loss driven to 0 would shrink
/// the gradients toward subnormals, which no real model trains on), per table size,
/// with ids drawn two ways: uniformly over the table (a larger table then has more
/// distinct rows per batch: about 8,160 of 8,192 at 1,000,000 rows, 5,600 at 10,000),
/// and uniformly over 10,000 rows spread across the table (the same rows touched per
/// batch whatever the size: what isolates the table's size). Sizes are timed in
/// alternating rounds, each after as many untimed steps; the median round counts.
fn bench_sparse(dev: &Device, sizes: &[usize], timed_rounds: usize) -> Result<()> {
    #[derive(Module)]
    struct Net {
        bag: EmbeddingBag,
        fc: Linear,
    }
    let mut json = serde_json::Map::new();
    for spread in [false, true] {
        let mut nets: Vec<(Net, SparseAdam, Rng)> = sizes
            .iter()
            .map(|&rows| {
                let net = Net {
                    bag: EmbeddingBag::new(rows, 32, BagMode::Sum, true, 1, dev),
                    fc: Linear::new(32, 1, true, 2, dev),
                };
                (net, SparseAdam::new(1e-2), Rng(99))
            })
            .collect();
        let step = |(net, opt, rng): &mut (Net, SparseAdam, Rng)| -> Result<()> {
            let rows = net.bag.weight.dims()[0];
            let hot = rows.min(10_000);
            let ids: Vec<i64> = (0..1024 * 8)
                .map(|_| {
                    let k = rng.below(if spread { hot } else { rows });
                    (if spread { k * (rows / hot) } else { k }) as i64
                })
                .collect();
            let offsets: Vec<i64> = (0..1024).map(|b| b * 8).collect();
            let bags = Bags::from_offsets(&ids, &offsets, None)?;
            let ratings: Vec<f32> = (0..1024).map(|_| 1.0 + rng.below(5) as f32).collect();
            let target = Tensor::from_slice(&ratings, [1024, 1], dev);
            let loss = (net.fc.forward(&net.bag.forward(&bags)) - target).square().mean_all();
            opt.step(net, &loss)?;
            Ok(())
        };
        for n in &mut nets {
            for _ in 0..3 {
                step(n)?;
            }
        }
        let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
        let (mut submits, mut kernels) = (vec![0.0; sizes.len()], vec![0.0; sizes.len()]);
        let per_round = 15;
        for _ in 0..timed_rounds {
            for (k, n) in nets.iter_mut().enumerate() {
                // As many untimed steps first: the round before trained the other table,
                // whose rows then fill the caches, and a run that trains one table (what
                // the ratio is about) has this table's rows there. Without them the first
                // steps of every round ran cold and the 1M-row table measured 0.74x-0.83x
                // (six runs), against 0.82x-0.92x with them.
                for _ in 0..per_round {
                    step(n)?;
                }
                // The CPU backend has no queue: count realisations there.
                let count = || if dev.is_cpu() { dev.stats().realizations } else { dev.stats().submits };
                let (s0, k0, t0) = (count(), dev.stats().kernels_dispatched, Instant::now());
                for _ in 0..per_round {
                    step(n)?;
                }
                rounds[k].push(per_round as f64 / t0.elapsed().as_secs_f64());
                submits[k] = (count() - s0) as f64 / per_round as f64;
                kernels[k] = (dev.stats().kernels_dispatched - k0) as f64 / per_round as f64;
            }
        }
        let ids = if spread { "ids over 10,000 rows spread across the table" } else { "ids uniform over the table" };
        let unit = if dev.is_cpu() { "realisations" } else { "submits" };
        // The ratio within each pair of rounds run back to back: its spread shows the
        // host's noise.
        let mut pairs: Vec<f64> = rounds[0].iter().zip(&rounds[sizes.len() - 1]).map(|(a, b)| b / a).collect();
        pairs.sort_by(f64::total_cmp);
        let quartiles = [pairs[pairs.len() / 4], pairs[pairs.len() / 2], pairs[pairs.len() * 3 / 4]];
        let mut rates = Vec::new();
        for (k, r) in rounds.iter_mut().enumerate() {
            r.sort_by(f64::total_cmp);
            let rate = r[r.len() / 2];
            println!(
                "sparse EmbeddingBag step, {:>9} rows x 32, {ids}: {rate:8.1} steps/s, {} {unit} and {} kernels per step",
                sizes[k], submits[k], kernels[k]
            );
            rates.push(rate);
        }
        let ratio = rates[rates.len() - 1] / rates[0];
        println!(
            "  {} rows / {} rows: {ratio:.2}x the steps/s (round by round: quartiles {:.2}x, {:.2}x, {:.2}x)",
            sizes[sizes.len() - 1],
            sizes[0],
            quartiles[0],
            quartiles[1],
            quartiles[2]
        );
        let key = if spread { "same_rows" } else { "uniform" };
        json.insert(
            key.into(),
            serde_json::json!({ "rows": sizes, "steps_per_s": rates, "ratio": ratio, "round_ratio_quartiles": quartiles }),
        );
    }
    println!("RESULT {}", serde_json::Value::Object(json));
    Ok(())
}
