//! Optimisers with a sparse rule: [`SparseAdam`] (PyTorch's lazy `SparseAdam`) and
//! [`Adagrad`]. A sparse gradient updates only its rows of the table and of the
//! optimiser's state, each rewritten in place ([`Tensor::accumulate_rows`],
//! [`Tensor::step_rows`]); the scheduler runs a table's writes as one kernel over
//! those rows, so a step costs the rows a batch touched whatever the table's size. Dense gradients get the dense
//! rule (Adam, Adagrad), so one optimiser trains a whole recommendation model.

use super::{gated, Adam, Optimizer};
use crate::nn::{Slot, SparseGrad};
use crate::{Error, Gradients, Result, Tensor};
use std::collections::HashMap;

/// The slot a sparse gradient belongs to, and its rows as an I32 tensor.
fn target<'s, 'a>(slots: &'s mut [Slot<'a>], g: &SparseGrad) -> Result<(&'s mut Slot<'a>, Tensor)> {
    let slot = slots
        .iter_mut()
        .find(|s| s.trainable && s.name == g.param)
        .ok_or_else(|| Error::Unsupported(format!("a sparse gradient for {}, which is not a parameter", g.param)))?;
    let rows: Vec<i32> = g.rows.iter().map(|&r| r as i32).collect();
    let rows = Tensor::from_slice(&rows, [rows.len()], slot.tensor.device());
    Ok((slot, rows))
}

/// Adam whose sparse gradients update lazily, as PyTorch's `SparseAdam`: only the rows
/// a batch touched move, and only their moments decay; bias corrections use the step
/// count. Dense gradients (the rest of the model) get plain [`Adam`].
#[derive(Clone, Debug)]
pub struct SparseAdam {
    pub adam: Adam,
}

impl SparseAdam {
    /// With PyTorch's defaults (betas 0.9/0.999, eps 1e-8).
    pub fn new(lr: f64) -> SparseAdam {
        SparseAdam { adam: Adam::new(lr) }
    }
}

impl Optimizer for SparseAdam {
    fn update(&mut self, slots: &mut [Slot], grads: &Gradients, apply: Option<&Tensor>) -> Result<()> {
        self.adam.update(slots, grads, apply)
    }

    fn update_sparse(&mut self, slots: &mut [Slot], grads: &[SparseGrad], apply: Option<&Tensor>) -> Result<()> {
        let a = &mut self.adam;
        // `update` ran first this step and counted it.
        let t = a.steps.max(1) as i32;
        let (b1, b2) = (a.beta1, a.beta2);
        let step_size = a.lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
        for g in grads {
            let (slot, rows) = target(slots, g)?;
            let p = slot.tensor.clone();
            let (m0, v0) = a.moments.get(&slot.name).cloned().unwrap_or_else(|| (p.zeros_like(), p.zeros_like()));
            // Three row writes in place, one per table (one pass over the rows on the
            // CPU backend, which runs writes over the same rows together).
            let m = m0.accumulate_rows(&rows, &g.values, false, [b1, 1.0 - b1], apply);
            let v = v0.accumulate_rows(&rows, &g.values, true, [b2, 1.0 - b2], apply);
            *slot.tensor = p.step_rows(&rows, &m, true, &v, [step_size, a.eps], apply);
            a.moments.insert(slot.name.clone(), (m, v));
        }
        Ok(())
    }

    fn state(&mut self) -> Vec<(String, &mut Tensor)> {
        self.adam.state()
    }
    fn lr(&self) -> f64 {
        self.adam.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.adam.lr = lr;
    }
    fn steps(&self) -> u64 {
        self.adam.steps
    }
    fn set_steps(&mut self, steps: u64) {
        self.adam.steps = steps;
    }
}

/// Adagrad (PyTorch's defaults: eps 1e-10, no learning-rate decay, accumulators from
/// 0): `sum += g²`, `p -= lr · g / (sqrt(sum) + eps)`; for a sparse gradient, on its
/// rows only.
#[derive(Clone, Debug)]
pub struct Adagrad {
    pub lr: f64,
    pub eps: f64,
    sums: HashMap<String, Tensor>,
    steps: u64,
}

impl Adagrad {
    pub fn new(lr: f64) -> Adagrad {
        Adagrad { lr, eps: 1e-10, sums: HashMap::new(), steps: 0 }
    }
}

impl Optimizer for Adagrad {
    fn update(&mut self, slots: &mut [Slot], grads: &Gradients, apply: Option<&Tensor>) -> Result<()> {
        for s in slots.iter_mut().filter(|s| s.trainable) {
            let Some(g) = grads.get(s.tensor) else { continue };
            let p = s.tensor.clone();
            let s0 = self.sums.get(&s.name).cloned().unwrap_or_else(|| p.zeros_like());
            let sum = s0.add(&g.square());
            let np = p.sub(&g.div(&sum.sqrt().add_scalar(self.eps)).mul_scalar(self.lr));
            *s.tensor = gated(apply, np, &p);
            self.sums.insert(s.name.clone(), gated(apply, sum, &s0));
        }
        self.steps += 1;
        Ok(())
    }

    fn update_sparse(&mut self, slots: &mut [Slot], grads: &[SparseGrad], apply: Option<&Tensor>) -> Result<()> {
        for g in grads {
            let (slot, rows) = target(slots, g)?;
            let p = slot.tensor.clone();
            let s0 = self.sums.get(&slot.name).cloned().unwrap_or_else(|| p.zeros_like());
            let sum = s0.accumulate_rows(&rows, &g.values, true, [1.0, 1.0], apply);
            *slot.tensor = p.step_rows(&rows, &g.values, false, &sum, [self.lr, self.eps], apply);
            self.sums.insert(slot.name.clone(), sum);
        }
        Ok(())
    }

    fn state(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v: Vec<_> = self.sums.iter_mut().map(|(k, t)| (format!("{k}.sum"), t)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn steps(&self) -> u64 {
        self.steps
    }
    fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }
}
