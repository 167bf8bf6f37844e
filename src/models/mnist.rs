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

/// `kind`'s architecture with the sizes and dtypes of the weights in `state` (PyTorch's
/// names: `1.weight`, `3.bias`, ...), holding those weights: a model whose channels or
/// hidden units were pruned away, or whose weights are quantised, loads as it was saved.
pub fn from_state_dict(kind: &str, state: &crate::nn::StateDict) -> Result<Sequential> {
    let err = |detail: String| Error::Format { format: "MNIST model", detail };
    let get = |name: String| state.get(&name).cloned().ok_or_else(|| err(format!("{kind}: {name} is missing")));
    let linear = |i: usize| -> Result<Linear> {
        let weight = get(format!("{i}.weight"))?;
        if weight.rank() != 2 {
            return Err(err(format!("{i}.weight is {:?}, not [out, in]", weight.dims())));
        }
        Ok(Linear { name: String::new(), weight, bias: Some(get(format!("{i}.bias"))?) })
    };
    let conv = |i: usize, in_ch: usize| -> Result<Conv2d> {
        let weight = get(format!("{i}.weight"))?;
        let fits = match weight.dims() {
            [_, c, 3, 3] => *c == in_ch,
            [_, k] => weight.dtype().is_quantized() && *k == (in_ch * 9).next_multiple_of(crate::quant::BLOCK),
            _ => false,
        };
        if !fits {
            return Err(err(format!("{i}.weight is {:?}: not a 3x3 convolution of {in_ch} channels", weight.dims())));
        }
        let bias = Some(get(format!("{i}.bias"))?);
        Ok(Conv2d { weight, bias, options: Conv2dOptions::new(1, 1), kernel: (3, 3) })
    };
    let expected: &[usize] = match kind {
        "mlp" => &[1, 3],
        "cnn" => &[0, 3, 7, 9],
        other => return Err(err(format!("unknown model {other:?}: use mlp or cnn"))),
    };
    let known: Vec<String> = expected.iter().flat_map(|i| [format!("{i}.weight"), format!("{i}.bias")]).collect();
    if let Some(k) = state.keys().find(|k| !known.iter().any(|n| n == k)) {
        return Err(err(format!("{kind}: unexpected tensor {k}")));
    }
    let out = |l: &Linear| l.weight.dims()[0];
    // A Linear takes `n` inputs: its weight has `n` columns, or whole blocks over them.
    let takes = |l: &Linear, n: usize| {
        let k = l.weight.dims()[1];
        k == n || (l.weight.dtype().is_quantized() && k == n.next_multiple_of(crate::quant::BLOCK))
    };
    Ok(if kind == "mlp" {
        let (a, b) = (linear(1)?, linear(3)?);
        if !takes(&a, 784) || !takes(&b, out(&a)) {
            return Err(err(format!("1.weight {:?} and 3.weight {:?} do not chain", a.weight.dims(), b.weight.dims())));
        }
        Sequential::new().add(Flatten).add(a).add(Activation::Relu).add(b)
    } else {
        let c1 = conv(0, 1)?;
        let c2 = conv(3, c1.weight.dims()[0])?;
        let (f1, f2) = (linear(7)?, linear(9)?);
        if !takes(&f1, c2.weight.dims()[0] * 49) || !takes(&f2, out(&f1)) {
            return Err(err(format!(
                "7.weight {:?} and 9.weight {:?} do not follow {} channels",
                f1.weight.dims(),
                f2.weight.dims(),
                c2.weight.dims()[0]
            )));
        }
        Sequential::new()
            .add(c1)
            .add(Activation::Relu)
            .add(MaxPool2d::new(2))
            .add(c2)
            .add(Activation::Relu)
            .add(MaxPool2d::new(2))
            .add(Flatten)
            .add(f1)
            .add(Activation::Relu)
            .add(f2)
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
