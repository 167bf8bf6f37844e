//! Optimisers (SGD, Adam, AdamW), learning-rate schedules, gradient clipping, dynamic
//! loss scaling, and [`step`]: a whole training step (backward, clipping, update) as one
//! realisation, so one submit on a GPU.
//!
//! Updates are lazy element-wise graphs, so each parameter's update (moments, bias
//! correction, weight decay, the skip on overflow) fuses into one kernel per tensor it
//! writes. Step-dependent scalars (learning rate, bias corrections) travel as kernel
//! parameters, so a repeated step re-uses the same pipelines.

use crate::nn::{Module, Slot, SparseGrad};
use crate::{Error, Gradients, Result, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// An optimiser: turns gradients into lazy parameter updates.
pub trait Optimizer: crate::nn::MaybeSync {
    /// Replace every trainable slot that has a gradient with its updated value (lazy).
    /// With `apply` (a Bool scalar), the update only happens where it is true: a step
    /// with overflowing gradients leaves parameters and state as they were.
    fn update(&mut self, slots: &mut [Slot], grads: &Gradients, apply: Option<&Tensor>) -> Result<()>;
    /// Replace the tables of `grads` (sparse gradients: rows and their values) with
    /// their updated values, writing only those rows. Optimisers without a sparse rule
    /// refuse, as PyTorch's do; [`SparseAdam`] and [`Adagrad`] have one.
    fn update_sparse(&mut self, slots: &mut [Slot], grads: &[SparseGrad], apply: Option<&Tensor>) -> Result<()> {
        let _ = (slots, apply);
        match grads.first() {
            None => Ok(()),
            Some(g) => Err(Error::Unsupported(format!(
                "{} has a sparse gradient (an Embedding or EmbeddingBag with sparse = true): \
                 optim::SparseAdam and optim::Adagrad update sparse gradients, this optimiser does not",
                g.param
            ))),
        }
    }
    /// Named state tensors (moments, momentum buffers), to realise and to checkpoint.
    fn state(&mut self) -> Vec<(String, &mut Tensor)>;
    /// Current learning rate.
    fn lr(&self) -> f64;
    /// Set the learning rate (schedules call this before each step).
    fn set_lr(&mut self, lr: f64);
    /// Updates applied so far.
    fn steps(&self) -> u64;
    /// Restore the update count (from a checkpoint).
    fn set_steps(&mut self, steps: u64);

    /// One training step on `model` from `loss` (PyTorch's `loss.backward()`,
    /// `opt.step()` and `opt.zero_grad()`, as one realisation): returns the loss.
    /// Blocks (native only); [`step_async`] works everywhere.
    #[cfg(not(target_arch = "wasm32"))]
    fn step(&mut self, model: &mut dyn Module, loss: &Tensor) -> Result<f64> {
        let r = pollster::block_on(step_async(model, self, loss, StepOptions::default()))?;
        Ok(r.loss.unwrap_or(f64::NAN))
    }

    /// [`Optimizer::step`] with clipping, loss scaling, extra reads or no waiting.
    #[cfg(not(target_arch = "wasm32"))]
    fn step_with(&mut self, model: &mut dyn Module, loss: &Tensor, options: StepOptions<'_>) -> Result<StepResult> {
        pollster::block_on(step_async(model, self, loss, options))
    }
}

fn gated(apply: Option<&Tensor>, new: Tensor, old: &Tensor) -> Tensor {
    match apply {
        Some(a) => Tensor::where_(&a.broadcast_to(new.dims().to_vec()), &new, old),
        None => new,
    }
}

/// Stochastic gradient descent with momentum, Nesterov momentum and weight decay.
#[derive(Clone, Debug)]
pub struct Sgd {
    pub lr: f64,
    pub momentum: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
    buffers: HashMap<String, Tensor>,
    steps: u64,
}

impl Sgd {
    /// Plain SGD at `lr`.
    pub fn new(lr: f64) -> Sgd {
        Sgd { lr, momentum: 0.0, nesterov: false, weight_decay: 0.0, buffers: HashMap::new(), steps: 0 }
    }

    /// With momentum `mu` (Nesterov if `nesterov`).
    pub fn with_momentum(mut self, mu: f64, nesterov: bool) -> Sgd {
        self.momentum = mu;
        self.nesterov = nesterov;
        self
    }

    /// With L2 weight decay.
    pub fn with_weight_decay(mut self, wd: f64) -> Sgd {
        self.weight_decay = wd;
        self
    }
}

impl Optimizer for Sgd {
    fn update(&mut self, slots: &mut [Slot], grads: &Gradients, apply: Option<&Tensor>) -> Result<()> {
        for s in slots.iter_mut().filter(|s| s.trainable) {
            let Some(g) = grads.get(s.tensor) else { continue };
            let p = s.tensor.clone();
            let mut g = g.clone();
            if self.weight_decay != 0.0 {
                g = g.add(&p.mul_scalar(self.weight_decay));
            }
            if self.momentum != 0.0 {
                let buf = match self.buffers.get(&s.name) {
                    Some(b) => b.mul_scalar(self.momentum).add(&g),
                    _ => g.clone(),
                };
                let old = self.buffers.get(&s.name).cloned().unwrap_or_else(|| buf.zeros_like());
                g = if self.nesterov { g.add(&buf.mul_scalar(self.momentum)) } else { buf.clone() };
                self.buffers.insert(s.name.clone(), gated(apply, buf, &old));
            }
            *s.tensor = gated(apply, p.sub(&g.mul_scalar(self.lr)), &p);
        }
        self.steps += 1;
        Ok(())
    }

    fn state(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v: Vec<_> = self.buffers.iter_mut().map(|(k, t)| (format!("{k}.momentum_buffer"), t)).collect();
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

mod sparse;
pub use sparse::{Adagrad, SparseAdam};

/// Adam, and AdamW when `decoupled` (weight decay applied to the weights directly).
#[derive(Clone, Debug)]
pub struct Adam {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub decoupled: bool,
    moments: HashMap<String, (Tensor, Tensor)>,
    steps: u64,
}

impl Adam {
    /// Adam with PyTorch's defaults (betas 0.9/0.999, eps 1e-8).
    pub fn new(lr: f64) -> Adam {
        Adam {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            moments: HashMap::new(),
            steps: 0,
        }
    }

    /// AdamW: decoupled weight decay `wd` (PyTorch's default is 0.01).
    pub fn adamw(lr: f64, wd: f64) -> Adam {
        Adam { weight_decay: wd, decoupled: true, ..Adam::new(lr) }
    }
}

impl Optimizer for Adam {
    fn update(&mut self, slots: &mut [Slot], grads: &Gradients, apply: Option<&Tensor>) -> Result<()> {
        let t = self.steps as i32 + 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(t);
        let c2 = 1.0 - b2.powi(t);
        for s in slots.iter_mut().filter(|s| s.trainable) {
            let Some(g) = grads.get(s.tensor) else { continue };
            let p = s.tensor.clone();
            let mut g = g.clone();
            if self.weight_decay != 0.0 && !self.decoupled {
                g = g.add(&p.mul_scalar(self.weight_decay));
            }
            let (m0, v0) = match self.moments.get(&s.name) {
                Some(mv) => mv.clone(),
                None => (p.zeros_like(), p.zeros_like()),
            };
            let m = m0.mul_scalar(b1).add(&g.mul_scalar(1.0 - b1));
            let v = v0.mul_scalar(b2).add(&g.square().mul_scalar(1.0 - b2));
            let step = m.mul_scalar(1.0 / c1).div(&v.mul_scalar(1.0 / c2).sqrt().add_scalar(self.eps));
            let mut np = p.sub(&step.mul_scalar(self.lr));
            if self.weight_decay != 0.0 && self.decoupled {
                np = np.sub(&p.mul_scalar(self.lr * self.weight_decay));
            }
            *s.tensor = gated(apply, np, &p);
            self.moments.insert(s.name.clone(), (gated(apply, m, &m0), gated(apply, v, &v0)));
        }
        self.steps += 1;
        Ok(())
    }

    fn state(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = Vec::new();
        for (k, (m, s)) in self.moments.iter_mut() {
            v.push((format!("{k}.exp_avg"), m));
            v.push((format!("{k}.exp_avg_sq"), s));
        }
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

/// Restore optimiser state tensors from `state` (names as [`Optimizer::state`] gives
/// them) for the trainable slots of `model`.
pub fn load_state(opt: &mut dyn Optimizer, model: &mut dyn Module, state: &HashMap<String, Tensor>) -> Result<()> {
    // Create the state entries with a zero-learning-rate dry update, then overwrite them.
    let mut slots = model.slots();
    let mut fake = Gradients::default();
    for s in slots.iter().filter(|s| s.trainable) {
        fake.insert(s.tensor, s.tensor.zeros_like());
    }
    let (lr, steps) = (opt.lr(), opt.steps());
    let before: Vec<Tensor> = slots.iter().map(|s| s.tensor.clone()).collect();
    opt.update(&mut slots, &fake, None)?;
    for (s, b) in slots.iter_mut().zip(before) {
        *s.tensor = b;
    }
    opt.set_lr(lr);
    opt.set_steps(steps);
    for (name, t) in opt.state() {
        let src = state.get(&name).ok_or_else(|| Error::Format {
            format: "checkpoint",
            detail: format!("optimiser state {name} is missing"),
        })?;
        if src.dims() != t.dims() {
            return Err(Error::Format {
                format: "checkpoint",
                detail: format!("optimiser state {name} has shape {:?}, expected {:?}", src.dims(), t.dims()),
            });
        }
        *t = src.detach();
    }
    Ok(())
}

/// A learning-rate schedule: linear warm-up, then constant, step decay or cosine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    Constant,
    /// Multiply by `gamma` every `every` steps.
    Step {
        every: u64,
        gamma: f64,
    },
    /// Cosine from the base rate down to `min_lr` over `total` steps.
    Cosine {
        total: u64,
        min_lr: f64,
    },
}

/// A schedule with optional linear warm-up over the first `warmup` steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    pub base: f64,
    pub warmup: u64,
    pub kind: Schedule,
}

impl LrSchedule {
    /// The learning rate for step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.base * (step + 1) as f64 / self.warmup as f64;
        }
        let s = step - self.warmup;
        match self.kind {
            Schedule::Constant => self.base,
            Schedule::Step { every, gamma } => self.base * gamma.powi((s / every.max(1)) as i32),
            Schedule::Cosine { total, min_lr } => {
                let span = total.saturating_sub(self.warmup).max(1);
                let f = (s.min(span) as f64) / span as f64;
                min_lr + 0.5 * (self.base - min_lr) * (1.0 + (std::f64::consts::PI * f).cos())
            }
        }
    }
}

impl LrSchedule {
    /// A constant rate.
    pub fn constant(base: f64) -> LrSchedule {
        LrSchedule { base, warmup: 0, kind: Schedule::Constant }
    }

    /// Cosine from `base` down to `min_lr` over `total` steps, after `warmup` linear ones.
    pub fn cosine(base: f64, warmup: u64, total: u64, min_lr: f64) -> LrSchedule {
        LrSchedule { base, warmup, kind: Schedule::Cosine { total, min_lr } }
    }

    /// `base`, multiplied by `gamma` every `every` steps.
    pub fn step_decay(base: f64, every: u64, gamma: f64) -> LrSchedule {
        LrSchedule { base, warmup: 0, kind: Schedule::Step { every, gamma } }
    }
}

/// A learning-rate scheduler that owns its schedule, as PyTorch's `lr_scheduler`: it
/// sets the optimiser's rate when made (for the optimiser's next step, so a resumed run
/// continues where it was) and again after each `step()`.
///
/// ```
/// use tessera::optim::{Adam, LrSchedule, LrScheduler, Optimizer};
/// let mut opt = Adam::new(1e-3);
/// let mut sched = LrScheduler::new(LrSchedule::cosine(1e-3, 10, 100, 0.0), &mut opt);
/// assert_eq!(opt.lr(), 1e-4); // warm-up, step 0
/// sched.step(&mut opt);       // after each training step
/// assert_eq!(opt.lr(), 2e-4);
/// ```
#[derive(Clone, Debug)]
pub struct LrScheduler {
    pub schedule: LrSchedule,
    step: u64,
}

impl LrScheduler {
    /// Take over `opt`'s learning rate from its current step count.
    pub fn new(schedule: LrSchedule, opt: &mut dyn Optimizer) -> LrScheduler {
        let step = opt.steps();
        opt.set_lr(schedule.lr_at(step));
        LrScheduler { schedule, step }
    }

    /// Advance one step and set the rate of the next.
    pub fn step(&mut self, opt: &mut dyn Optimizer) {
        self.step += 1;
        opt.set_lr(self.schedule.lr_at(self.step));
    }

    /// The rate it set last.
    pub fn last_lr(&self) -> f64 {
        self.schedule.lr_at(self.step)
    }
}

/// Sum of squares of every gradient (lazy scalar).
pub fn grad_sq_norm(grads: &Gradients) -> Option<Tensor> {
    let parts: Vec<Tensor> = grads.tensors().iter().map(|g| g.cast(crate::DType::F32).square().sum_all()).collect();
    let first = parts.first()?.clone();
    Some(parts[1..].iter().fold(first, |a, b| a.add(b)))
}

/// Scale all gradients so their global L2 norm is at most `max_norm`. Returns the
/// norm before clipping (lazy).
pub fn clip_grad_norm(grads: &mut Gradients, max_norm: f64) -> Option<Tensor> {
    let norm = grad_sq_norm(grads)?.sqrt();
    let factor = norm.add_scalar(1e-6).recip().mul_scalar(max_norm).minimum_scalar(1.0);
    grads.map_all(|g| g.mul(&factor.cast(g.dtype())));
    Some(norm)
}

/// Clamp every gradient element into `[-v, v]`.
pub fn clip_grad_value(grads: &mut Gradients, v: f64) {
    grads.map_all(|g| g.clamp(-v, v));
}

/// Dynamic loss scaling for f16 training: the loss is multiplied by `scale` before
/// backward; a step whose gradients are not finite is skipped and the scale halves;
/// after `growth_interval` good steps it doubles.
#[derive(Clone, Debug)]
pub struct GradScaler {
    pub scale: f64,
    pub growth_interval: u64,
    good_steps: u64,
    /// Steps skipped because of overflow.
    pub skipped: u64,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler { scale: 65536.0, growth_interval: 2000, good_steps: 0, skipped: 0 }
    }
}

impl GradScaler {
    /// Start at `scale`.
    pub fn new(scale: f64) -> GradScaler {
        GradScaler { scale, ..Default::default() }
    }

    /// Record whether the last step's gradients were finite and adjust the scale.
    pub fn update(&mut self, finite: bool) {
        if finite {
            self.good_steps += 1;
            if self.good_steps >= self.growth_interval {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
        } else {
            self.scale = (self.scale / 2.0).max(1.0);
            self.good_steps = 0;
            self.skipped += 1;
        }
    }
}

/// What a training step does besides the update.
#[derive(Default)]
pub struct StepOptions<'a> {
    /// Clip the global gradient norm to this (after unscaling).
    pub clip_norm: Option<f64>,
    /// Clamp gradient elements into `[-v, v]`.
    pub clip_value: Option<f64>,
    /// Dynamic loss scaling for mixed precision (with [`crate::autocast`]).
    pub scaler: Option<&'a mut GradScaler>,
    /// More tensors to compute and read in the same realisation (an accuracy, say):
    /// their values come back in [`StepResult::values`].
    pub read: &'a [Tensor],
    /// Do not wait for the device: the step is submitted, the loss and `read` tensors are
    /// realised but not read back (`loss` is `None`; read the tensors later), so the
    /// next step's graph is built while this one runs. Ignored with a `scaler`, which
    /// must see whether the gradients were finite.
    pub no_sync: bool,
}

/// The outcome of one training step.
#[derive(Clone, Debug)]
pub struct StepResult {
    /// The loss, unless the step was not synchronised (`no_sync`).
    pub loss: Option<f64>,
    /// Values of the `read` tensors, in order (empty when not synchronised).
    pub values: Vec<Vec<f64>>,
    /// False when the step was skipped for non-finite gradients.
    pub applied: bool,
}

/// One training step: backward from `loss`, optional clipping and loss scaling, the
/// optimiser's update, then ONE realisation of the loss, the `read` tensors, every new
/// parameter, buffer and optimiser state. Afterwards the module holds fresh leaves (the
/// graph of this step is released). [`Optimizer::step`] and [`Optimizer::step_with`]
/// are the blocking forms; this one works everywhere, the browser included.
pub async fn step_async<O: Optimizer + ?Sized>(
    model: &mut dyn Module,
    opt: &mut O,
    loss: &Tensor,
    o: StepOptions<'_>,
) -> Result<StepResult> {
    loss.check()?;
    let StepOptions { clip_norm, clip_value, scaler, read, no_sync } = o;
    let scale = scaler.as_ref().map(|s| s.scale);
    let mut grads = match scale {
        Some(s) => loss.mul_scalar(s).backward()?,
        None => loss.backward()?,
    };
    // Sparse tables: each table's lookups merged into one gradient over distinct rows,
    // kept among the dense gradients until scaling and clipping have seen them.
    let sparse_keys = gather_sparse(model, &mut grads)?;
    if let Some(s) = scale {
        grads.map_all(|g| g.mul_scalar(1.0 / s));
    }
    let finite = if scale.is_some() { grad_sq_norm(&grads).map(|n| n.lt_scalar(f64::INFINITY)) } else { None };
    if let Some(v) = clip_value {
        clip_grad_value(&mut grads, v);
    }
    if let Some(max) = clip_norm {
        clip_grad_norm(&mut grads, max);
    }
    let sparse: Vec<SparseGrad> = sparse_keys
        .into_iter()
        .filter_map(|(param, rows, key)| grads.take(&key).map(|values| SparseGrad { param, rows, values }))
        .collect();
    let mut slots = model.slots();
    opt.update(&mut slots, &grads, finite.as_ref())?;
    opt.update_sparse(&mut slots, &sparse, finite.as_ref())?;
    drop(sparse);
    drop(grads);
    let mut keep: Vec<Tensor> = slots.iter().map(|s| s.tensor.clone()).collect();
    keep.extend(opt.state().into_iter().map(|(_, t)| t.clone()));
    let mut to_read = vec![loss.clone()];
    to_read.extend_from_slice(read);
    if let Some(f) = &finite {
        to_read.push(f.clone());
    }
    let mut values = if no_sync && finite.is_none() {
        // Submit and return: the loss and `read` stay on the device (read them later),
        // and the caller builds the next step while this one runs.
        keep.extend(to_read);
        loss.device().realize(&keep).await?;
        Vec::new()
    } else {
        loss.device().read_and_realize(&to_read, &keep).await?
    };
    let applied = match &finite {
        Some(_) => values.pop().and_then(|v| v.first().copied()).unwrap_or(0.0) != 0.0,
        None => true,
    };
    if let Some(s) = scaler {
        s.update(applied);
    }
    for s in slots.iter_mut() {
        *s.tensor = if s.trainable { s.tensor.detach().requires_grad() } else { s.tensor.detach() };
    }
    for (_, t) in opt.state() {
        *t = t.detach();
    }
    let loss = (!values.is_empty()).then(|| values.remove(0).first().copied().unwrap_or(f64::NAN));
    Ok(StepResult { loss, values, applied })
}

/// Take the model's sparse lookups and put one merged gradient per table into `grads`
/// (keyed by a tensor returned with the table's name and rows).
/// A table's name, its rows, and the key of its merged gradient in a `Gradients`.
type SparseKey = (String, Arc<Vec<u32>>, Tensor);

fn gather_sparse(model: &dyn Module, grads: &mut Gradients) -> Result<Vec<SparseKey>> {
    type Parts = Vec<(Arc<Vec<u32>>, Tensor)>;
    let mut by_param: Vec<(String, Parts)> = Vec::new();
    for l in crate::nn::sparse::take_sparse_lookups(model) {
        let Some(g) = grads.take(&l.gathered) else { continue };
        match by_param.iter_mut().find(|(p, _)| *p == l.param) {
            Some((_, parts)) => parts.push((l.rows, g)),
            None => by_param.push((l.param, vec![(l.rows, g)])),
        }
    }
    let mut keys = Vec::with_capacity(by_param.len());
    for (param, parts) in by_param {
        let merged = crate::nn::sparse::merge(param, parts)?;
        let key = merged.values.clone();
        grads.insert(&key, merged.values);
        keys.push((merged.param, merged.rows, key));
    }
    Ok(keys)
}
