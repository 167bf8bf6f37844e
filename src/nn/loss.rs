//! Losses. Each returns a scalar (mean over the batch unless said otherwise).

use crate::{DType, Tensor};

/// Mean squared error.
#[track_caller]
pub fn mse(pred: &Tensor, target: &Tensor) -> Tensor {
    pred.sub(target).square().mean_all()
}

/// Options of [`cross_entropy_with`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CrossEntropy {
    /// Mix the one-hot target with the uniform distribution by this much.
    pub label_smoothing: f64,
    /// Targets equal to this are skipped (PyTorch uses -100).
    pub ignore_index: Option<i32>,
}

/// Cross-entropy of `logits` `[N, C]` against integer class `targets` `[N]`.
#[track_caller]
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Tensor {
    cross_entropy_with(logits, targets, CrossEntropy::default())
}

/// Cross-entropy with label smoothing and an ignore index, averaged over the targets
/// that are not ignored.
#[track_caller]
pub fn cross_entropy_with(logits: &Tensor, targets: &Tensor, o: CrossEntropy) -> Tensor {
    let logp = logits.cast(DType::F32).log_softmax(-1);
    let c = logits.dims().last().copied().unwrap_or(1);
    let t = targets.cast(DType::I32);
    let (t, keep) = match o.ignore_index {
        Some(ig) => {
            let keep = t.ne_scalar(ig as f64);
            (Tensor::where_(&keep, &t, &t.zeros_like()), Some(keep.cast(DType::F32)))
        }
        None => (t, None),
    };
    let nll = logp.gather(-1, &t.unsqueeze(-1)).squeeze(-1).neg();
    let per = if o.label_smoothing > 0.0 {
        let smooth = logp.mean(&[-1], false).neg();
        nll.mul_scalar(1.0 - o.label_smoothing).add(&smooth.mul_scalar(o.label_smoothing))
    } else {
        nll
    };
    let _ = c;
    match keep {
        Some(k) => per.mul(&k).sum_all().div(&k.sum_all().maximum_scalar(1.0)),
        None => per.mean_all(),
    }
}

/// Binary cross-entropy on logits, in the stable form
/// `max(x, 0) - x*y + log(1 + exp(-|x|))`.
#[track_caller]
pub fn bce_with_logits(logits: &Tensor, targets: &Tensor) -> Tensor {
    let x = logits;
    let y = targets.cast(x.dtype());
    x.relu().sub(&x.mul(&y)).add(&x.abs().neg().exp().add_scalar(1.0).log()).mean_all()
}

/// Distillation loss: `KL(softmax(teacher/T) || softmax(student/T)) * T^2`, averaged over
/// the batch (PyTorch's `kl_div(..., reduction="batchmean")`).
#[track_caller]
pub fn kl_div_distill(student_logits: &Tensor, teacher_logits: &Tensor, temperature: f64) -> Tensor {
    let t = temperature.max(1e-6);
    let ls = student_logits.div_scalar(t).log_softmax(-1);
    let lt = teacher_logits.div_scalar(t).log_softmax(-1);
    let n = student_logits.dims().first().copied().unwrap_or(1).max(1) as f64;
    lt.exp().mul(&lt.sub(&ls)).sum_all().mul_scalar(t * t / n)
}
