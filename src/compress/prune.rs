//! Magnitude pruning with PyTorch's habits (`l1_unstructured`, `global_unstructured`,
//! `remove`), N:M masks, and Zhu & Gupta's gradual sparsity schedule.
//!
//! A [`Pruning`] holds one mask per pruned parameter. [`Pruning::apply`] zeroes the
//! pruned weights; after each optimiser step, [`Pruning::after_step`] zeroes them again
//! together with the optimiser's state for them (momentum, Adam's moments), so a masked
//! weight stays exactly zero and carries no state through fine-tuning, as if it got no
//! update. [`Pruning::remove`] bakes the masks in and forgets them.

use crate::nn::Module;
use crate::optim::Optimizer;
use crate::{DType, Error, Result, Tensor};
use std::collections::BTreeMap;

/// Masks (1 keeps, 0 prunes), by parameter name, each of its parameter's shape.
#[derive(Clone, Debug, Default)]
pub struct Pruning {
    pub masks: BTreeMap<String, Tensor>,
}

/// The parameters magnitude pruning looks at by default: weights of rank 2 or more
/// (Linear and convolution weights, not biases or norms).
pub fn prunable(name: &str, t: &Tensor) -> bool {
    t.rank() >= 2 && name.rsplit('.').next() == Some("weight")
}

fn bad(detail: String) -> Error {
    Error::InvalidArgument { op: "prune", detail, location: std::panic::Location::caller() }
}

fn check_amount(amount: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&amount) {
        return Err(bad(format!("amount {amount} must be a fraction in [0, 1]")));
    }
    Ok(())
}

/// Keep-masks that prune the `k` smallest magnitudes of `values` (ties broken by
/// position, so exactly `k` are pruned).
fn smallest_k_mask(values: &[f32], k: usize) -> Vec<f32> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].abs().total_cmp(&values[b].abs()).then(a.cmp(&b)));
    let mut keep = vec![1.0f32; values.len()];
    for &i in order.iter().take(k) {
        keep[i] = 0.0;
    }
    keep
}

/// The selected parameters' names and values.
fn selected(model: &mut dyn Module, select: &dyn Fn(&str, &Tensor) -> bool) -> Result<Vec<(String, Tensor, Vec<f32>)>> {
    let mut out = Vec::new();
    for s in model.slots() {
        if s.trainable && select(&s.name, s.tensor) {
            let v = s.tensor.cast(DType::F32).to_vec_blocking::<f32>()?;
            out.push((s.name.clone(), s.tensor.clone(), v));
        }
    }
    if out.is_empty() {
        return Err(bad("no parameter matches the selection".into()));
    }
    Ok(out)
}

impl Pruning {
    /// PyTorch's `l1_unstructured` on every selected parameter: the `amount` fraction of
    /// each tensor's entries with the smallest magnitude (an existing mask is kept:
    /// already pruned entries count as the smallest).
    pub fn l1_unstructured(
        &mut self,
        model: &mut dyn Module,
        amount: f64,
        select: &dyn Fn(&str, &Tensor) -> bool,
    ) -> Result<()> {
        check_amount(amount)?;
        for (name, t, mut v) in selected(model, select)? {
            self.fold_mask(&name, &mut v)?;
            let k = (amount * v.len() as f64).round() as usize;
            let keep = smallest_k_mask(&v, k);
            self.masks.insert(name, Tensor::from_slice(&keep, t.dims().to_vec(), t.device()));
        }
        self.apply(model)
    }

    /// PyTorch's `global_unstructured` with L1: one threshold over every selected
    /// parameter, so layers lose different fractions.
    pub fn global_unstructured(
        &mut self,
        model: &mut dyn Module,
        amount: f64,
        select: &dyn Fn(&str, &Tensor) -> bool,
    ) -> Result<()> {
        check_amount(amount)?;
        let mut params = selected(model, select)?;
        let mut all = Vec::new();
        for (name, _, v) in params.iter_mut() {
            self.fold_mask(name, v)?;
            all.extend(v.iter().copied());
        }
        let k = (amount * all.len() as f64).round() as usize;
        let keep = smallest_k_mask(&all, k);
        let mut at = 0;
        for (name, t, v) in params {
            let m = &keep[at..at + v.len()];
            at += v.len();
            self.masks.insert(name, Tensor::from_slice(m, t.dims().to_vec(), t.device()));
        }
        self.apply(model)
    }

    /// N:M sparsity (2:4 by default in hardware): in every group of `m` consecutive
    /// weights along the input axis (the last one), keep the `n` largest. Reported, not
    /// accelerated.
    pub fn n_m(
        &mut self,
        model: &mut dyn Module,
        n: usize,
        m: usize,
        select: &dyn Fn(&str, &Tensor) -> bool,
    ) -> Result<()> {
        if m == 0 || n > m {
            return Err(bad(format!("{n}:{m} sparsity needs 0 < m and n <= m")));
        }
        for (name, t, mut v) in selected(model, select)? {
            let last = *t.dims().last().unwrap_or(&1);
            if last % m != 0 {
                return Err(bad(format!("{name}: its last axis ({last}) is not a multiple of {m}")));
            }
            self.fold_mask(&name, &mut v)?;
            let mut keep = vec![0.0f32; v.len()];
            for (g, chunk) in v.chunks(m).enumerate() {
                let k = smallest_k_mask(chunk, m - n);
                keep[g * m..g * m + chunk.len()].copy_from_slice(&k);
            }
            self.masks.insert(name, Tensor::from_slice(&keep, t.dims().to_vec(), t.device()));
        }
        self.apply(model)
    }

    /// Zero `v` where the existing mask of `name` prunes, so re-pruning keeps it.
    fn fold_mask(&self, name: &str, v: &mut [f32]) -> Result<()> {
        if let Some(m) = self.masks.get(name) {
            let m = m.to_vec_blocking::<f32>()?;
            for (x, k) in v.iter_mut().zip(m) {
                if k == 0.0 {
                    *x = 0.0;
                }
            }
        }
        Ok(())
    }

    /// Multiply every masked parameter by its mask (one realisation).
    pub fn apply(&self, model: &mut dyn Module) -> Result<()> {
        let mut touched = Vec::new();
        for s in model.slots() {
            if let Some(m) = self.masks.get(&s.name) {
                let w = masked(s.tensor, m);
                *s.tensor = if s.trainable { w.requires_grad() } else { w };
                touched.push(s.tensor.clone());
            }
        }
        if let Some(first) = touched.first() {
            pollster::block_on(first.device().realize(&touched))?;
        }
        Ok(())
    }

    /// After an optimiser step: masked weights back to zero, and the optimiser's state
    /// for them (`<name>.momentum_buffer`, `.exp_avg`, `.exp_avg_sq`) too.
    pub fn after_step(&self, model: &mut dyn Module, opt: &mut dyn Optimizer) -> Result<()> {
        self.apply(model)?;
        let mut touched = Vec::new();
        for (name, t) in opt.state() {
            let Some(param) = name.rsplit_once('.').map(|(p, _)| p) else { continue };
            if let Some(m) = self.masks.get(param) {
                if m.dims() == t.dims() {
                    *t = masked(t, m);
                    touched.push(t.clone());
                }
            }
        }
        if let Some(first) = touched.first() {
            pollster::block_on(first.device().realize(&touched))?;
        }
        Ok(())
    }

    /// Bake the masks into the weights and forget them (PyTorch's `prune.remove`).
    pub fn remove(&mut self, model: &mut dyn Module) -> Result<()> {
        self.apply(model)?;
        self.masks.clear();
        Ok(())
    }

    /// Pruned entries over masked entries, per parameter and overall.
    pub fn sparsity(&self) -> Result<(BTreeMap<String, f64>, f64)> {
        let mut per = BTreeMap::new();
        let (mut zeros, mut total) = (0usize, 0usize);
        for (name, m) in &self.masks {
            let v = m.to_vec_blocking::<f32>()?;
            let z = v.iter().filter(|&&x| x == 0.0).count();
            per.insert(name.clone(), z as f64 / v.len().max(1) as f64);
            zeros += z;
            total += v.len();
        }
        Ok((per, zeros as f64 / total.max(1) as f64))
    }
}

/// `t` where `mask` keeps, +0.0 where it prunes (a product would leave -0.0 behind
/// negative weights, which sparse storage would have to keep).
fn masked(t: &Tensor, mask: &Tensor) -> Tensor {
    Tensor::where_(&mask.gt_scalar(0.0), t, &t.zeros_like()).detach()
}

/// Zhu & Gupta's cubic schedule ("To prune, or not to prune", 2017): sparsity at
/// `step` rising from `initial` at `start` to `target` after `steps` more, fast at first
/// and slower near the end: `s_t = s_f + (s_i - s_f) (1 - (t - t0) / n)^3`.
pub fn cubic_sparsity(initial: f64, target: f64, start: u64, steps: u64, step: u64) -> f64 {
    if step <= start {
        return initial;
    }
    let p = ((step - start) as f64 / steps.max(1) as f64).min(1.0);
    target + (initial - target) * (1.0 - p).powi(3)
}
