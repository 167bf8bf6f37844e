//! What the data-parallel tests share: the MNIST MLP, its batches, the two optimiser
//! settings the equivalence floor names, a one-process reference run and a DDP run.
#![allow(dead_code)]

use tessera::dist::{Communicator, DdpOptions, DdpStep, DistributedDataParallel, DistributedSampler};
use tessera::io::mnist::Mnist;
use tessera::nn::{loss, Layer, Module, Sequential};
use tessera::optim::{Adam, Optimizer, Sgd, StepOptions};
use tessera::{DType, Device, Tensor};

pub const SEED: u64 = 11;

/// Named tensors as f32.
pub type Weights = Vec<(String, Vec<f32>)>;

/// SGD with momentum, or AdamW with clipping by global norm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Opt {
    SgdMomentum,
    AdamWClip,
}

impl Opt {
    pub fn make(self) -> Box<dyn Optimizer> {
        match self {
            Opt::SgdMomentum => Box::new(Sgd::new(0.05).with_momentum(0.9, false)),
            Opt::AdamWClip => Box::new(Adam::adamw(2e-3, 0.01)),
        }
    }

    pub fn clip(self) -> Option<f64> {
        (self == Opt::AdamWClip).then_some(0.5)
    }
}

pub fn mnist() -> Mnist {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist.bin");
    Mnist::load(&p).unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch_mnist.sh)", p.display()))
}

pub fn batch(data: &Mnist, idx: &[usize], dev: &Device) -> (Tensor, Tensor) {
    let x = Tensor::from_slice(&tessera::models::mnist::standardize(&data.images_f32(idx)), [idx.len(), 784], dev);
    let y: Vec<i32> = idx.iter().map(|&i| data.labels[i] as i32).collect();
    (x, Tensor::from_slice(&y, [idx.len()], dev))
}

pub fn model(dev: &Device) -> Sequential {
    tessera::models::mnist::build("mlp", SEED, dev).expect("model")
}

/// Every parameter and buffer, as f32.
pub fn weights(m: &mut Sequential) -> Vec<(String, Vec<f32>)> {
    m.slots().iter().map(|s| (s.name.clone(), s.tensor.cast(DType::F32).to_vec_blocking::<f32>().unwrap())).collect()
}

/// One process, batch `global` per step, the sampler's order for one rank of one.
pub fn reference(data: &Mnist, opt: Opt, steps: usize, global: usize, dev: &Device) -> Vec<(String, Vec<f32>)> {
    let mut m = model(dev);
    let mut o = opt.make();
    let order = DistributedSampler::new(tessera::models::mnist::TRAIN, 0, 1, SEED).indices(0);
    for k in 0..steps {
        let (x, y) = batch(data, &order[k * global..(k + 1) * global], dev);
        let l = loss::cross_entropy(&m.forward(&x), &y);
        o.step_with(&mut m, &l, StepOptions { clip_norm: opt.clip(), ..Default::default() }).expect("step");
    }
    weights(&mut m)
}

/// The same training under DDP on this rank, batch `per_rank`; returns the weights and
/// the largest gradient norm seen (with clipping).
pub fn ddp_run(
    comm: Box<dyn Communicator>,
    data: &Mnist,
    opt: Opt,
    steps: usize,
    per_rank: usize,
    dev: &Device,
    options: DdpOptions,
) -> tessera::Result<(Weights, f64)> {
    let (rank, size) = (comm.rank(), comm.size());
    // Each rank starts from its own seed: DDP's broadcast must make them equal.
    let mut m = tessera::models::mnist::build("mlp", SEED + rank as u64 * 100, dev)?;
    let mut o = opt.make();
    let mut ddp = DistributedDataParallel::new(comm, &mut m, options)?;
    let order = DistributedSampler::new(tessera::models::mnist::TRAIN, rank, size, SEED).indices(0);
    let mut max_norm: f64 = 0.0;
    for k in 0..steps {
        let (x, y) = batch(data, &order[k * per_rank..(k + 1) * per_rank], dev);
        let l = loss::cross_entropy(&m.forward(&x), &y);
        let r = ddp.step(&mut m, o.as_mut(), &l, DdpStep { clip_norm: opt.clip(), ..Default::default() })?;
        max_norm = max_norm.max(r.grad_norm.unwrap_or(0.0));
    }
    ddp.check_weights(&mut m)?;
    Ok((weights(&mut m), max_norm))
}

/// Per tensor, `|a - b| / |b| <= tol` (L2 norms).
pub fn assert_rel_close(what: &str, got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: tensor count");
    for ((n, a), (m, b)) in got.iter().zip(want) {
        assert_eq!(n, m);
        let diff: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>().sqrt();
        let norm: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt().max(1e-30);
        assert!(diff / norm <= tol, "{what}: {n} differs by {:.3e} relative (tolerance {tol:e})", diff / norm);
    }
}

/// The relative difference of two initial models (to show the comparison can fail).
pub fn rel_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f64 {
    a.iter()
        .zip(b)
        .map(|((_, x), (_, y))| {
            let d: f64 = x.iter().zip(y).map(|(p, q)| ((p - q) as f64).powi(2)).sum::<f64>().sqrt();
            d / y.iter().map(|q| (*q as f64).powi(2)).sum::<f64>().sqrt().max(1e-30)
        })
        .fold(0.0, f64::max)
}
