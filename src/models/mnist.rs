//! The MNIST digit classifiers the demo trains: their architectures (`mlp`, `cnn`), the
//! input standardisation, and a short training run (for a server that starts without a
//! trained model).

use crate::nn::{Activation, Conv2d, Flatten, Linear, MaxPool2d, Sequential};
use crate::ops::nn::Conv2dOptions;
use crate::{Device, Error, Result};

/// The digits the demo trains on (the first 8,000); the rest are its test set.
pub const TRAIN: usize = 8000;
/// MNIST's pixel mean and standard deviation, as torchvision's examples standardise.
pub const MEAN: f32 = 0.1307;
pub const STD: f32 = 0.3081;

/// `mlp` (784-256-10) or `cnn` (two 3x3 convolutions with pooling, then 64-10).
pub fn build(kind: &str, seed: u64, dev: &Device) -> Result<Sequential> {
    let lin = |i, o, s| Linear::new(i, o, true, seed * 1000 + s, dev);
    Ok(match kind {
        "mlp" => Sequential::new().add(Flatten).add(lin(784, 256, 1)).add(Activation::Relu).add(lin(256, 10, 2)),
        "cnn" => Sequential::new()
            .add(Conv2d::new(1, 8, 3, Conv2dOptions::new(1, 1), seed * 1000 + 3, dev))
            .add(Activation::Relu)
            .add(MaxPool2d::new(2))
            .add(Conv2d::new(8, 16, 3, Conv2dOptions::new(1, 1), seed * 1000 + 4, dev))
            .add(Activation::Relu)
            .add(MaxPool2d::new(2))
            .add(Flatten)
            .add(lin(16 * 7 * 7, 64, 5))
            .add(Activation::Relu)
            .add(lin(64, 10, 6)),
        other => {
            return Err(Error::InvalidArgument {
                op: "mnist",
                detail: format!("unknown model {other:?}: use mlp or cnn"),
                location: std::panic::Location::caller(),
            })
        }
    })
}

/// The input shape of `n` digits for `kind`: `[n, 784]` or `[n, 1, 28, 28]`.
pub fn input_shape(kind: &str, n: usize) -> Vec<usize> {
    if kind == "cnn" {
        vec![n, 1, 28, 28]
    } else {
        vec![n, 784]
    }
}

/// Grey levels in [0, 1] standardised with [`MEAN`] and [`STD`].
pub fn standardize(px: &[f32]) -> Vec<f32> {
    px.iter().map(|v| (v - MEAN) / STD).collect()
}

/// Train `kind` from seed `seed` for `steps` Adam steps (batch 64, lr 1e-3) on the
/// training digits; returns the model in evaluation mode and its optimiser (native:
/// it blocks on each step).
#[cfg(not(target_arch = "wasm32"))]
pub fn train(
    kind: &str,
    data: &crate::io::mnist::Mnist,
    steps: usize,
    seed: u64,
    dev: &Device,
) -> Result<(Sequential, crate::optim::Adam)> {
    use crate::nn::{loss, Layer, Module};
    use crate::optim::Optimizer;
    use crate::Tensor;
    let mut model = build(kind, seed, dev)?;
    let mut opt = crate::optim::Adam::new(1e-3);
    let batch = 64;
    let train = TRAIN.min(data.len());
    for s in 0..steps {
        let idx: Vec<usize> = (0..batch).map(|i| (s * batch + i * 7919) % train).collect();
        let x = Tensor::from_slice(&standardize(&data.images_f32(&idx)), input_shape(kind, batch), dev);
        let y = Tensor::from_slice(&data.labels_i32(&idx), [batch], dev);
        let l = loss::cross_entropy(&model.forward(&x), &y);
        opt.step(&mut model, &l)?;
    }
    model.set_training(false);
    Ok((model, opt))
}
