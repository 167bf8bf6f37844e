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

/// How structured pruning ranks output channels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ChannelNorm {
    L1,
    L2,
}

/// What [`prune_channels`] removed.
#[derive(Clone, Debug, Default)]
pub struct ChannelReport {
    /// Per pruned layer (index in the `Sequential`): outputs before and after.
    pub layers: Vec<(usize, usize, usize)>,
    pub params_before: usize,
    pub params_after: usize,
}

/// A layer of a `Sequential` as structured pruning sees it.
enum Seen<'a> {
    Linear(&'a mut crate::nn::Linear),
    Conv(&'a mut crate::nn::Conv2d),
    Norm(&'a mut crate::nn::conv::BatchNorm2d),
    Flatten,
    /// Element-wise or pooling: channels pass through unchanged.
    Through,
    Other,
}

fn see(l: &mut Box<dyn crate::nn::Layer>) -> Seen<'_> {
    use crate::nn::conv::{AvgPool2d, BatchNorm2d, MaxPool2d};
    use crate::nn::{Activation, Conv2d, Dropout, Flatten, Linear};
    let Some(a) = l.as_any_mut() else { return Seen::Other };
    if a.is::<Linear>() {
        return a.downcast_mut::<Linear>().map_or(Seen::Other, Seen::Linear);
    }
    if a.is::<Conv2d>() {
        return a.downcast_mut::<Conv2d>().map_or(Seen::Other, Seen::Conv);
    }
    if a.is::<BatchNorm2d>() {
        return a.downcast_mut::<BatchNorm2d>().map_or(Seen::Other, Seen::Norm);
    }
    if a.is::<Flatten>() {
        return Seen::Flatten;
    }
    if a.is::<Activation>() || a.is::<Dropout>() || a.is::<MaxPool2d>() || a.is::<AvgPool2d>() {
        return Seen::Through;
    }
    Seen::Other
}

fn keep_index(keep: &[usize], dev: &crate::Device) -> Tensor {
    let k: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
    Tensor::from_slice(&k, [k.len()], dev)
}

fn param(t: Tensor) -> Tensor {
    t.detach().requires_grad()
}

/// Structured pruning of a [`crate::nn::Sequential`]: in every Linear or Conv2d whose
/// outputs feed another Linear or Conv2d (through activations, dropout, pooling,
/// BatchNorm2d or a Flatten), remove the `amount` fraction of output channels with the
/// smallest L1 or L2 weight norm. The rows or filters go, with their bias, the
/// BatchNorm's entries for them, and the inputs of the next layer that read them, so
/// the model really is smaller and faster. The last layer's outputs are kept. Grouped
/// convolutions and any other layer in between stop the walk with an error.
pub fn prune_channels(model: &mut crate::nn::Sequential, amount: f64, norm: ChannelNorm) -> Result<ChannelReport> {
    check_amount(amount)?;
    let mut report = ChannelReport { params_before: model.num_parameters(), ..Default::default() };
    let n = model.layers.len();
    for i in 0..n {
        // The producer's outputs and its per-channel norms.
        let (outs, norms, dev) = match see(&mut model.layers[i]) {
            Seen::Linear(l) => {
                let w = l.weight.cast(DType::F32).to_vec_blocking::<f32>()?;
                let (o, k) = (l.weight.dims()[0], l.weight.dims()[1]);
                (o, channel_norms(&w, o, k, norm), l.weight.device().clone())
            }
            Seen::Conv(c) => {
                if c.options.groups > 1 {
                    continue;
                }
                let w = c.weight.cast(DType::F32).to_vec_blocking::<f32>()?;
                let o = c.weight.dims()[0];
                (o, channel_norms(&w, o, w.len() / o.max(1), norm), c.weight.device().clone())
            }
            _ => continue,
        };
        // Find the consumer; note BatchNorms and a Flatten on the way.
        let mut norms_between = Vec::new();
        let mut flatten = false;
        let mut consumer = None;
        for j in i + 1..n {
            match see(&mut model.layers[j]) {
                Seen::Linear(_) | Seen::Conv(_) => {
                    consumer = Some(j);
                    break;
                }
                Seen::Norm(_) => norms_between.push(j),
                Seen::Flatten => flatten = true,
                Seen::Through => {}
                Seen::Other => break,
            }
        }
        let Some(j) = consumer else { continue };
        let keep_n = ((1.0 - amount) * outs as f64).round().max(1.0) as usize;
        if keep_n >= outs {
            continue;
        }
        let mut order: Vec<usize> = (0..outs).collect();
        order.sort_by(|&a, &b| norms[b].total_cmp(&norms[a]).then(a.cmp(&b)));
        let mut keep: Vec<usize> = order[..keep_n].to_vec();
        keep.sort_unstable();
        let idx = keep_index(&keep, &dev);
        match see(&mut model.layers[i]) {
            Seen::Linear(l) => {
                l.weight = param(l.weight.index_select(0, &idx));
                l.bias = l.bias.as_ref().map(|b| param(b.index_select(0, &idx)));
            }
            Seen::Conv(c) => {
                c.weight = param(c.weight.index_select(0, &idx));
                c.bias = c.bias.as_ref().map(|b| param(b.index_select(0, &idx)));
            }
            _ => {}
        }
        for &b in &norms_between {
            if let Seen::Norm(bn) = see(&mut model.layers[b]) {
                bn.weight = param(bn.weight.index_select(0, &idx));
                bn.bias = param(bn.bias.index_select(0, &idx));
                for m in [&bn.running_mean, &bn.running_var] {
                    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
                    *g = g.index_select(0, &idx).detach();
                }
            }
        }
        match see(&mut model.layers[j]) {
            Seen::Linear(l) => {
                let inputs = l.weight.dims()[1];
                let per = if flatten { inputs / outs } else { 1 };
                if per * outs != inputs {
                    return Err(bad(format!(
                        "layer {j} takes {inputs} inputs, not a multiple of layer {i}'s {outs} channels"
                    )));
                }
                let cols: Vec<usize> = keep.iter().flat_map(|&c| c * per..(c + 1) * per).collect();
                l.weight = param(l.weight.index_select(1, &keep_index(&cols, &dev)));
            }
            Seen::Conv(c) => {
                if c.options.groups > 1 || c.weight.dims()[1] != outs {
                    return Err(bad(format!("layer {j}: a grouped or mismatched convolution after layer {i}")));
                }
                c.weight = param(c.weight.index_select(1, &idx));
            }
            _ => {}
        }
        report.layers.push((i, outs, keep_n));
    }
    // Realise the new parameters once.
    let ts: Vec<Tensor> = model.slots().iter().map(|s| s.tensor.clone()).collect();
    if let Some(first) = ts.first() {
        pollster::block_on(first.device().realize(&ts))?;
    }
    report.params_after = model.num_parameters();
    Ok(report)
}

fn channel_norms(w: &[f32], outs: usize, per: usize, norm: ChannelNorm) -> Vec<f64> {
    (0..outs)
        .map(|o| {
            let row = &w[o * per..(o + 1) * per];
            match norm {
                ChannelNorm::L1 => row.iter().map(|x| x.abs() as f64).sum(),
                ChannelNorm::L2 => row.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt(),
            }
        })
        .collect()
}
