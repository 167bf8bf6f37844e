//! Why a model predicts what it does: attributions of a class score to the input
//! (saliency, SmoothGrad, integrated gradients) and Grad-CAM maps over a convolution's
//! channels. Each works on any model built from `nn` layers, through autograd: the
//! input (or a layer's output) becomes a gradient target, and the target class's score
//! is the seed of one backward pass. Call them with the model in evaluation mode.
//!
//! Results are lazy tensors, like every other op's: read them, or write them into a
//! texture, in the same realisation as anything else.

use crate::nn::{Layer, Sequential};
use crate::{no_grad, DType, Device, Error, Result, Tensor};

/// One class per input row: `targets[i]` is the class whose score is explained for row
/// `i`, as a `[N, classes]` one-hot seed.
fn seed(targets: &[usize], n: usize, classes: usize, dev: &Device) -> Result<Tensor> {
    if targets.len() != n {
        return seed_error(targets.len(), n);
    }
    let mut v = vec![0f32; n * classes];
    for (i, &t) in targets.iter().enumerate() {
        if t >= classes {
            return Err(Error::InvalidArgument {
                op: "explain",
                detail: format!("target class {t} of row {i}: the model has {classes} outputs"),
                location: std::panic::Location::caller(),
            });
        }
        v[i * classes + t] = 1.0;
    }
    Ok(Tensor::from_slice(&v, [n, classes], dev))
}

/// The scores `[N, classes]` of `model` at `x` and their gradient with respect to
/// `x` for `targets` (lazy).
fn input_gradient(model: &dyn Layer, x: &Tensor, targets: &[usize]) -> Result<(Tensor, Tensor)> {
    x.check()?;
    let xl = x.detach().requires_grad();
    let y = model.forward(&xl);
    y.check()?;
    if y.rank() != 2 {
        return Err(Error::Shape {
            op: "explain",
            shapes: vec![y.dims().to_vec()],
            detail: "the model must return scores [N, classes]".into(),
            location: std::panic::Location::caller(),
        });
    }
    let s = seed(targets, y.dims()[0], y.dims()[1], x.device())?;
    let mut g = y.backward_with(&s)?;
    let gx = g.take(&xl).unwrap_or_else(|| xl.zeros_like());
    Ok((y.detach(), gx))
}

/// Saliency (Simonyan et al.): the gradient of each row's target score with respect to
/// the input, the input's shape. Its magnitude says how much each input value moves
/// the score.
pub fn saliency(model: &dyn Layer, x: &Tensor, targets: &[usize]) -> Result<Tensor> {
    Ok(input_gradient(model, x, targets)?.1)
}

/// SmoothGrad (Smilkov et al.): the saliency averaged over `samples` copies of the
/// input with Gaussian noise of standard deviation `sigma` (seeded: the same result
/// every run). One forward and backward pass over all the copies at once.
pub fn smoothgrad(
    model: &dyn Layer,
    x: &Tensor,
    targets: &[usize],
    samples: usize,
    sigma: f64,
    seed: u64,
) -> Result<Tensor> {
    x.check()?;
    let samples = samples.max(1);
    let n = x.dims().first().copied().unwrap_or(0);
    let copies: Vec<Tensor> = (0..samples as u64)
        .map(|k| x.add(&Tensor::randn(x.dims().to_vec(), seed.wrapping_add(k), x.device()).mul_scalar(sigma)))
        .collect();
    let big = Tensor::concat(&copies, 0);
    if targets.len() != n {
        return seed_error(targets.len(), n);
    }
    let t: Vec<usize> = (0..samples).flat_map(|_| targets.iter().copied()).collect();
    let g = input_gradient(model, &big, &t)?.1;
    let mut dims = vec![samples];
    dims.extend_from_slice(x.dims());
    Ok(g.reshape(dims).mean(&[0], false))
}

fn seed_error<T>(got: usize, n: usize) -> Result<T> {
    Err(Error::InvalidArgument {
        op: "explain",
        detail: format!("{got} targets for a batch of {n}"),
        location: std::panic::Location::caller(),
    })
}

/// Integrated gradients (Sundararajan et al.): `(x - baseline)` times the gradient
/// averaged along the straight path from `baseline` to `x`, by the trapezoid rule over
/// `steps` intervals (all points in one forward and backward pass). The attributions
/// of a row sum to its score at `x` minus its score at the baseline, up to the
/// quadrature's error (completeness); [`completeness_gap`] measures it.
pub fn integrated_gradients(
    model: &dyn Layer,
    x: &Tensor,
    baseline: &Tensor,
    targets: &[usize],
    steps: usize,
) -> Result<Tensor> {
    x.check()?;
    baseline.check()?;
    if baseline.dims() != x.dims() {
        return Err(Error::Shape {
            op: "integrated_gradients",
            shapes: vec![x.dims().to_vec(), baseline.dims().to_vec()],
            detail: "the baseline must have the input's shape".into(),
            location: std::panic::Location::caller(),
        });
    }
    let n = x.dims().first().copied().unwrap_or(0);
    if targets.len() != n {
        return seed_error(targets.len(), n);
    }
    let steps = steps.max(1);
    let delta = x.sub(baseline);
    // The path's points, `baseline + (k / steps) * delta` for k = 0..=steps, as one
    // broadcast over a leading steps axis (not a concat of steps + 1 tensors, which
    // every element would walk), then merged into the batch.
    let mut wd = vec![steps + 1];
    wd.extend(std::iter::repeat_n(1, x.rank()));
    let mut gd = vec![steps + 1];
    gd.extend_from_slice(x.dims());
    let mut pd = x.dims().to_vec();
    pd[0] *= steps + 1;
    let alpha: Vec<f32> = (0..=steps).map(|k| (k as f64 / steps as f64) as f32).collect();
    let alpha = Tensor::from_slice(&alpha, wd.clone(), x.device());
    let points = baseline.unsqueeze(0).add(&delta.unsqueeze(0).mul(&alpha)).reshape(pd);
    let t: Vec<usize> = (0..=steps).flat_map(|_| targets.iter().copied()).collect();
    let g = input_gradient(model, &points, &t)?.1;
    // Trapezoid weights: 1/2 at both ends, 1 inside, over `steps` intervals.
    let w: Vec<f32> = (0..=steps).map(|k| if k == 0 || k == steps { 0.5 } else { 1.0 } / steps as f32).collect();
    let avg = g.reshape(gd).mul(&Tensor::from_slice(&w, wd, x.device())).sum(&[0], false);
    Ok(delta.mul(&avg))
}

/// For each row: the sum of its attributions, and its target score at `x` minus that at
/// `baseline` (what integrated gradients' completeness says the sum equals).
pub async fn completeness_gap(
    model: &dyn Layer,
    x: &Tensor,
    baseline: &Tensor,
    targets: &[usize],
    attributions: &Tensor,
) -> Result<Vec<(f64, f64)>> {
    let _g = no_grad();
    let n = x.dims().first().copied().unwrap_or(0);
    if targets.len() != n {
        return seed_error(targets.len(), n);
    }
    let (fx, fb) = (model.forward(x), model.forward(baseline));
    fx.check()?;
    let classes = fx.dims().get(1).copied().unwrap_or(0);
    let s = seed(targets, n, classes, x.device())?;
    let rows = attributions.reshape(vec![n, attributions.numel() / n.max(1)]).sum(&[1], false);
    let diff = fx.sub(&fb).mul(&s).sum(&[1], false);
    let v = crate::tensor::read_all(&[rows, diff]).await?;
    Ok(v[0].iter().zip(&v[1]).map(|(a, b)| (*a, *b)).collect())
}

/// Grad-CAM (Selvaraju et al.) at the output of `model.layers[layer]`, which must be
/// `[N, C, H, W]`: each channel weighted by the mean gradient of the target score over
/// its positions, summed over channels, negatives clipped. The map is `[N, H, W]` at
/// that layer's resolution (upsample it to overlay it on the input).
pub fn grad_cam(model: &Sequential, layer: usize, x: &Tensor, targets: &[usize]) -> Result<Tensor> {
    x.check()?;
    if layer >= model.layers.len() {
        return Err(Error::InvalidArgument {
            op: "grad_cam",
            detail: format!("layer {layer} of a model with {} layers", model.layers.len()),
            location: std::panic::Location::caller(),
        });
    }
    let a = {
        let _g = no_grad();
        model.layers[..=layer].iter().fold(x.clone(), |h, l| l.forward(&h))
    };
    a.check()?;
    if a.rank() != 4 {
        return Err(Error::Shape {
            op: "grad_cam",
            shapes: vec![a.dims().to_vec()],
            detail: format!("layer {layer}'s output must be [N, C, H, W]"),
            location: std::panic::Location::caller(),
        });
    }
    let tail = Tail(&model.layers[layer + 1..]);
    let (_, g) = input_gradient(&tail, &a, targets)?;
    let alpha = g.mean(&[2, 3], true); // [N, C, 1, 1]
    Ok(a.mul(&alpha).sum(&[1], false).relu())
}

/// The layers after the Grad-CAM layer, as one.
struct Tail<'a>(&'a [Box<dyn Layer>]);

impl Layer for Tail<'_> {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.0.iter().fold(x.clone(), |h, l| l.forward(&h))
    }
}

impl crate::nn::Module for Tail<'_> {
    fn visit(&self, v: &mut dyn crate::nn::Visitor) {
        let _ = v;
    }
    fn visit_mut<'a>(&'a mut self, v: &mut dyn crate::nn::VisitorMut<'a>) {
        let _ = v;
    }
}

/// A map `[H, W]` scaled to `[0, 1]` by its maximum magnitude (zero stays zero): for
/// display.
pub fn normalize_map(m: &Tensor) -> Tensor {
    let top = m.abs().max_all().maximum_scalar(1e-12);
    m.abs().div(&top).cast(DType::F32)
}
