//! Reverse-mode autograd over the lazy graph: one table of gradient rules over [`Op`]
//! ([`input_grads`]). `backward` only records nodes; the gradients are lazy tensors that
//! realise with whatever else the caller asks for, so a whole training step (forward,
//! backward, optimiser update) is one submit.

use crate::graph::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::{DType, Error, Result, Tensor};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

thread_local! {
    static NO_GRAD_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Whether ops built now on this thread are recorded for backward.
pub fn grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(|d| d.get() == 0)
}

/// While alive, ops built on this thread are not differentiated (like `torch.no_grad()`).
pub struct NoGradGuard(());

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        NO_GRAD_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Enter a no-grad scope; it ends when the guard drops.
pub fn no_grad() -> NoGradGuard {
    NO_GRAD_DEPTH.with(|d| d.set(d.get() + 1));
    NoGradGuard(())
}

/// Gradients of one `backward` call, keyed by the tensors marked with
/// [`Tensor::requires_grad`].
#[derive(Clone, Default)]
pub struct Gradients {
    map: HashMap<u64, Tensor>,
}

impl Gradients {
    /// The gradient of `t` (`None` when the loss does not depend on it).
    pub fn get(&self, t: &Tensor) -> Option<&Tensor> {
        self.map.get(&t.id())
    }

    /// Remove and return the gradient of `t`.
    pub fn take(&mut self, t: &Tensor) -> Option<Tensor> {
        self.map.remove(&t.id())
    }

    /// How many tensors received a gradient.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no tensor received a gradient.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Set the gradient of `t`.
    pub fn insert(&mut self, t: &Tensor, g: Tensor) {
        self.map.insert(t.id(), g);
    }

    /// Add `other`'s gradients to these (lazily): gradient accumulation over several
    /// backward passes, such as micro-batches.
    pub fn accumulate(&mut self, other: &Gradients) {
        for (id, g) in &other.map {
            let sum = match self.map.get(id) {
                Some(prev) => prev.add(g),
                None => g.clone(),
            };
            self.map.insert(*id, sum);
        }
    }

    /// Replace every gradient with `f(gradient)`.
    pub fn map_all(&mut self, f: impl Fn(&Tensor) -> Tensor) {
        for g in self.map.values_mut() {
            *g = f(g);
        }
    }

    /// Every gradient (lazy tensors), ordered by the tensor they belong to (oldest
    /// first), so graphs built from them have the same structure every step.
    pub fn tensors(&self) -> Vec<Tensor> {
        let mut v: Vec<(&u64, &Tensor)> = self.map.iter().collect();
        v.sort_by_key(|(id, _)| **id);
        v.into_iter().map(|(_, t)| t.clone()).collect()
    }
}

impl Tensor {
    /// Mark this tensor as a gradient target: `backward` returns its gradient. Returns
    /// the same tensor, so it chains (`Tensor::randn(..).requires_grad()`).
    pub fn requires_grad(self) -> Tensor {
        self.0.requires_grad.store(true, Ordering::Relaxed);
        self
    }

    /// Whether this tensor is a gradient target.
    pub fn is_grad_target(&self) -> bool {
        self.0.requires_grad.load(Ordering::Relaxed)
    }

    /// The same values, cut from the graph: backward does not pass through.
    #[track_caller]
    pub fn detach(&self) -> Tensor {
        if let Some(s) = self.storage() {
            return Tensor::from_storage(s, self.shape().clone(), self.dtype(), self.device());
        }
        let _g = no_grad();
        self.derive(Op::Reshape, self.dims().to_vec(), std::panic::Location::caller())
    }

    /// Gradients of this scalar (one-element) tensor with respect to every tensor marked
    /// with [`Tensor::requires_grad`] that it depends on. The result is lazy.
    #[track_caller]
    pub fn backward(&self) -> Result<Gradients> {
        self.check()?;
        if self.numel() != 1 {
            return Err(Error::Shape {
                op: "backward",
                shapes: vec![self.dims().to_vec()],
                detail: "backward() needs a one-element loss; use backward_with(seed) otherwise".into(),
                location: std::panic::Location::caller(),
            });
        }
        self.backward_with(&self.ones_like())
    }

    /// Gradients of `sum(self * seed)`: `seed` is the gradient flowing into this tensor.
    #[track_caller]
    pub fn backward_with(&self, seed: &Tensor) -> Result<Gradients> {
        self.check()?;
        seed.check()?;
        if seed.dims() != self.dims() {
            return Err(Error::Shape {
                op: "backward",
                shapes: vec![self.dims().to_vec(), seed.dims().to_vec()],
                detail: "the seed gradient must have the output's shape".into(),
                location: std::panic::Location::caller(),
            });
        }
        if !self.dtype().is_float() {
            return Err(Error::DType {
                op: "backward",
                dtypes: vec![self.dtype()],
                detail: "only float tensors have gradients".into(),
                location: std::panic::Location::caller(),
            });
        }
        let _g = no_grad();
        backward_impl(self, seed.cast(self.dtype()))
    }
}

/// Every node under `root` (realised ones included), inputs before consumers.
fn full_topo(root: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        if t.0.no_grad {
            continue;
        }
        for i in t.node().inputs.iter().rev() {
            if !seen.contains(&i.id()) {
                stack.push((i.clone(), false));
            }
        }
    }
    order
}

fn backward_impl(root: &Tensor, seed: Tensor) -> Result<Gradients> {
    let order = full_topo(root);
    // Which nodes lead to a gradient target.
    let mut needs: HashSet<u64> = HashSet::new();
    for t in &order {
        let through = !t.0.no_grad && t.node().inputs.iter().any(|i| needs.contains(&i.id()));
        if (t.is_grad_target() || through) && t.dtype().is_float() {
            needs.insert(t.id());
        }
    }
    let mut grads: HashMap<u64, Tensor> = HashMap::new();
    let mut out = Gradients::default();
    if needs.contains(&root.id()) {
        grads.insert(root.id(), seed);
    }
    for t in order.iter().rev() {
        let Some(g) = grads.remove(&t.id()) else { continue };
        if t.is_grad_target() {
            out.map.insert(t.id(), g.clone());
        }
        let ins = &t.node().inputs;
        let wanted: Vec<bool> = ins.iter().map(|i| needs.contains(&i.id())).collect();
        if !wanted.iter().any(|&w| w) {
            continue;
        }
        let gi = input_grads(t, &g, &wanted);
        for ((inp, gi), w) in ins.iter().zip(gi).zip(wanted) {
            let Some(gi) = gi.filter(|_| w) else { continue };
            gi.check()?;
            let gi = if gi.dtype() != inp.dtype() { gi.cast(inp.dtype()) } else { gi };
            let acc = match grads.remove(&inp.id()) {
                Some(prev) => prev.add(&gi),
                None => gi,
            };
            grads.insert(inp.id(), acc);
        }
    }
    Ok(out)
}

fn mask(m: &Tensor, dt: DType) -> Tensor {
    m.cast(dt)
}

/// Sum `g` down to `dims` (undo numpy broadcasting).
pub(crate) fn unbroadcast(g: &Tensor, dims: &[usize]) -> Tensor {
    if g.dims() == dims {
        return g.clone();
    }
    let lead = g.rank() - dims.len();
    let mut axes: Vec<usize> = (0..lead).collect();
    for (i, &d) in dims.iter().enumerate() {
        if d == 1 && g.dims()[lead + i] != 1 {
            axes.push(lead + i);
        }
    }
    let s = g.sum_axes(&axes, true);
    s.reshape(dims.to_vec())
}

/// Scatter the gradient of a strided slice back to the input's shape (zeros elsewhere).
fn unslice(g: &Tensor, in_dims: &[usize], starts: &[usize], steps: &[usize]) -> Tensor {
    let mut cur = g.clone();
    let mut pads = Vec::with_capacity(in_dims.len());
    for a in 0..in_dims.len() {
        let n = cur.dims()[a];
        let (start, step) = (starts[a], steps[a]);
        if step > 1 && n > 0 {
            // [.., n, ..] -> [.., n, step, ..] with zeros after each element -> [.., n*step, ..]
            let mut pad = vec![(0, 0); cur.rank() + 1];
            pad[a + 1] = (0, step - 1);
            let spread = cur.unsqueeze(a as isize + 1).pad(&pad, 0.0);
            let mut dims = cur.dims().to_vec();
            dims[a] = n * step;
            cur = spread.reshape(dims);
            let keep = (in_dims[a] - start).min(n * step);
            cur = cur.narrow(a as isize, 0, keep);
        }
        let len = cur.dims()[a];
        pads.push((start, in_dims[a] - start - len));
    }
    cur.pad(&pads, 0.0)
}

/// The gradient table: for node `t` with output gradient `g`, the gradient of each input
/// (`None` where the input has none or is not `wanted`).
pub(crate) fn input_grads(t: &Tensor, g: &Tensor, wanted: &[bool]) -> Vec<Option<Tensor>> {
    let ins = &t.node().inputs;
    let dt = t.dtype();
    let x = || ins[0].clone();
    let one = |v: Tensor| vec![Some(v)];
    match &t.node().op {
        Op::Input | Op::Full { .. } | Op::Arange { .. } | Op::Rand { .. } => vec![],
        Op::Unary(u) => {
            let x = x();
            let y = t;
            one(match u {
                UnaryOp::Neg => g.neg(),
                UnaryOp::Abs => g.mul(&(mask(&x.gt_scalar(0.0), dt).sub(&mask(&x.lt_scalar(0.0), dt)))),
                UnaryOp::Exp => g.mul(y),
                UnaryOp::Log => g.div(&x),
                UnaryOp::Sqrt => g.div(&y.mul_scalar(2.0)),
                UnaryOp::Rsqrt => g.mul(&y.mul(y).mul(y)).mul_scalar(-0.5),
                UnaryOp::Sin => g.mul(&x.cos()),
                UnaryOp::Cos => g.mul(&x.sin()).neg(),
                UnaryOp::Tanh => g.mul(&y.mul(y).neg().add_scalar(1.0)),
                UnaryOp::Sigmoid => g.mul(&y.mul(&y.neg().add_scalar(1.0))),
                UnaryOp::Relu => g.mul(&mask(&x.gt_scalar(0.0), dt)),
                UnaryOp::Erf => {
                    // 2/sqrt(pi) e^{-x^2}
                    g.mul(&x.square().neg().exp().mul_scalar(std::f64::consts::FRAC_2_SQRT_PI))
                }
                UnaryOp::GeluErf => {
                    // Phi(x) + x phi(x)
                    let cdf = x.mul_scalar(std::f64::consts::FRAC_1_SQRT_2).erf().add_scalar(1.0).mul_scalar(0.5);
                    let pdf = x.square().mul_scalar(-0.5).exp().mul_scalar(0.398_942_280_401_432_7);
                    g.mul(&cdf.add(&x.mul(&pdf)))
                }
                UnaryOp::GeluTanh => {
                    let c = 0.797_884_560_802_865_4;
                    let u = x.add(&x.mul(&x).mul(&x).mul_scalar(0.044715)).mul_scalar(c);
                    let th = u.tanh();
                    let du = x.square().mul_scalar(3.0 * 0.044715).add_scalar(1.0).mul_scalar(c);
                    let left = th.add_scalar(1.0).mul_scalar(0.5);
                    let right = x.mul_scalar(0.5).mul(&th.square().neg().add_scalar(1.0)).mul(&du);
                    g.mul(&left.add(&right))
                }
                UnaryOp::Silu => {
                    let s = x.sigmoid();
                    g.mul(&s.mul(&x.mul(&s.neg().add_scalar(1.0)).add_scalar(1.0)))
                }
                UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Not => return vec![None],
                UnaryOp::Recip => g.mul(&y.mul(y)).neg(),
            })
        }
        Op::Binary(b) => {
            let (a, bb) = (&ins[0], &ins[1]);
            let (ga, gb) = match b {
                BinaryOp::Add => (g.clone(), g.clone()),
                BinaryOp::Sub => (g.clone(), g.neg()),
                BinaryOp::Mul => (g.mul(bb), g.mul(a)),
                BinaryOp::Div => (g.div(bb), g.mul(t).div(bb).neg()),
                BinaryOp::Maximum => (g.mul(&mask(&a.ge(bb), dt)), g.mul(&mask(&a.lt(bb), dt))),
                BinaryOp::Minimum => (g.mul(&mask(&a.le(bb), dt)), g.mul(&mask(&a.gt(bb), dt))),
                BinaryOp::Pow => {
                    let ga = if wanted[0] { g.mul(bb).mul(&a.pow(&bb.sub_scalar(1.0))) } else { g.clone() };
                    let gb = if wanted[1] {
                        // d/db a^b = a^b ln a (0 where a == 0)
                        let ln = Tensor::where_(&a.gt_scalar(0.0), &a.log(), &a.zeros_like());
                        g.mul(t).mul(&ln)
                    } else {
                        g.clone()
                    };
                    (ga, gb)
                }
                _ => return vec![None, None],
            };
            vec![Some(ga), Some(gb)]
        }
        Op::Where => {
            let m = &ins[0];
            let z = g.zeros_like();
            vec![None, Some(Tensor::where_(m, g, &z)), Some(Tensor::where_(m, &z, g))]
        }
        Op::Cast => {
            if x().dtype().is_float() {
                one(g.cast(x().dtype()))
            } else {
                vec![None]
            }
        }
        Op::Reshape => one(g.reshape(x().dims().to_vec())),
        Op::Expand => one(unbroadcast(g, x().dims())),
        Op::Permute { perm } => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            one(g.permute(&inv))
        }
        Op::Slice { starts, steps } => one(unslice(g, x().dims(), starts, steps)),
        Op::Pad { before, .. } => {
            let mut cur = g.clone();
            for (a, (&b, &n)) in before.iter().zip(x().dims()).enumerate() {
                cur = cur.narrow(a as isize, b, n);
            }
            one(cur)
        }
        Op::Concat { axis } => {
            let mut off = 0;
            ins.iter()
                .map(|i| {
                    let n = i.dims()[*axis];
                    let s = g.narrow(*axis as isize, off, n);
                    off += n;
                    Some(s)
                })
                .collect()
        }
        Op::Gather { axis } => {
            let (x, idx) = (&ins[0], &ins[1]);
            let r = idx.rank();
            let n = x.dims()[*axis];
            let mut ar_dims = vec![1; r];
            ar_dims.push(n);
            let classes = Tensor::arange(0.0, n as f64, 1.0, idx.dtype(), x.device()).reshape(ar_dims);
            let onehot = mask(&idx.unsqueeze(r as isize).eq(&classes), dt);
            // [idx.., n] summed over the gather axis -> idx dims with that axis = 1, plus n last
            let s = onehot.mul(&g.unsqueeze(r as isize)).sum(&[*axis as isize], true);
            let mut perm: Vec<usize> = (0..=r).collect();
            perm.swap(*axis, r);
            let s = s.permute(&perm).squeeze(r as isize);
            let pads: Vec<(usize, usize)> = s.dims().iter().zip(x.dims()).map(|(&a, &b)| (0, b - a)).collect();
            vec![Some(s.pad(&pads, 0.0)), None]
        }
        // A gather planned on the host (`Tensor::gather_rows`): the gradient sums each
        // row's gathered gradients in sorted order, one segment per table row.
        Op::IndexSelect { axis: 0 } if ins.len() == 5 => {
            let (perm, offsets, sorted) = (&ins[2], &ins[3], &ins[4]);
            let gx = g.cast(DType::F32).index_select(0, perm).segment_reduce(offsets, sorted, ReduceOp::Sum);
            vec![Some(gx.cast(dt)), None, None, None, None]
        }
        Op::IndexSelect { axis } => {
            let (x, idx) = (&ins[0], &ins[1]);
            let n = x.dims()[*axis];
            let k = idx.numel();
            let classes = Tensor::arange(0.0, n as f64, 1.0, idx.dtype(), x.device()).reshape(vec![1, n]);
            let onehot = mask(&idx.reshape(vec![k, 1]).eq(&classes), DType::F32);
            let last = g.rank() as isize - 1;
            let gl = g.transpose(*axis as isize, last).cast(DType::F32);
            let gx = gl.matmul(&onehot).transpose(*axis as isize, last);
            vec![Some(gx.cast(dt)), None]
        }
        Op::Reduce { op, axes } => {
            let x = x();
            match op {
                ReduceOp::Sum => one(g.broadcast_to(x.dims().to_vec())),
                ReduceOp::Max | ReduceOp::Min => {
                    let hit = mask(&x.eq(&t.broadcast_to(x.dims().to_vec())), dt);
                    let count = hit.sum_axes(axes, true);
                    one(hit.mul(&g.div(&count)))
                }
                ReduceOp::ArgMax | ReduceOp::ArgMin => vec![None],
            }
        }
        Op::Im2col { window, .. } => one(g.col2im(*window, x().dims()[2], x().dims()[3])),
        Op::Col2im { window } => one(g.im2col(*window, 0.0)),
        // Rounding to a grid has no useful derivative: quantisation stops gradients.
        Op::Quantize => vec![None],
        // Each value row receives its segment's gradient row (sum), or the gradient of
        // the (segment, column) pairs where it was the first maximum (max).
        Op::SegmentReduce { op } => {
            let (values, offsets, ids) = (&ins[0], &ins[1], &ins[2]);
            let spread = g.index_select(0, ids);
            match op {
                ReduceOp::Sum => vec![Some(spread), None, None],
                ReduceOp::Max => {
                    let n = values.dims()[0];
                    let at = values.segment_reduce(offsets, ids, ReduceOp::ArgMax).index_select(0, ids);
                    let rows = Tensor::arange(0.0, n as f64, 1.0, DType::I32, values.device()).reshape(vec![n, 1]);
                    let hit = at.eq(&rows.broadcast_to(values.dims().to_vec()));
                    vec![Some(Tensor::where_(&hit, &spread, &spread.zeros_like())), None, None]
                }
                _ => vec![None, None, None],
            }
        }
        // An optimiser's write and a selection: no gradients.
        Op::ScatterRows { .. } => vec![None; t.node().inputs.len()],
        Op::TopK { .. } => vec![None],
        Op::Norm { rms, eps, weight, bias } => {
            // n = normalised x (recomputed), y = n * w + b; in f32 (the kernel's
            // precision for f16 inputs too), each gradient back in its input's dtype.
            let x = x().cast(DType::F32);
            let ax = [-1isize];
            let (n, rstd) = crate::ops::nn::normalise(&x, *rms, *eps);
            let w = weight.then(|| ins[1].cast(DType::F32));
            let gn = match &w {
                Some(w) => g.mul(w),
                None => g.clone(),
            };
            let mut proj = gn.sub(&n.mul(&gn.mul(&n).mean(&ax, true)));
            if !*rms {
                proj = proj.sub(&gn.mean(&ax, true));
            }
            let mut out = vec![wanted[0].then(|| proj.mul(&rstd).cast(ins[0].dtype()))];
            if let Some(w) = &w {
                out.push(wanted[1].then(|| unbroadcast(&g.mul(&n), w.dims()).cast(ins[1].dtype())));
            }
            if *bias {
                let b = &ins[1 + usize::from(*weight)];
                out.push(wanted[out.len()].then(|| unbroadcast(g, b.dims()).cast(b.dtype())));
            }
            out
        }
        Op::Softmax { axis, log } => {
            // y = softmax: g*y - y*sum(g*y); y = log_softmax: g - exp(y)*sum(g).
            // (f16 inputs: the kernel computed in f32; the gradient returns to f16.)
            let ax = [*axis as isize];
            let dx = if *log {
                g.sub(&t.exp().mul(&g.sum(&ax, true)))
            } else {
                let gy = g.mul(t);
                gy.sub(&t.mul(&gy.sum(&ax, true)))
            };
            one(dx.cast(ins[0].dtype()))
        }
        Op::Attention { causal } => {
            // Recompute the probabilities, then the usual softmax-attention adjoints.
            let (q, k, v) = (ins[0].cast(DType::F32), ins[1].cast(DType::F32), ins[2].cast(DType::F32));
            let r = t.rank() as isize;
            let d = q.dims()[q.rank() - 1];
            let scale = 1.0 / (d as f64).sqrt();
            let p = crate::ops::nn::attention_probs(&q, &k, ins.get(3), *causal);
            let g = g.cast(DType::F32);
            let dv = p.transpose(r - 2, r - 1).matmul(&g);
            let dp = g.matmul(&v.transpose(r - 2, r - 1));
            let ds = p.mul(&dp.sub(&dp.mul(&p).sum(&[-1], true)));
            let dq = ds.matmul(&k).mul_scalar(scale);
            let dk = ds.transpose(r - 2, r - 1).matmul(&q).mul_scalar(scale);
            let back = |x: Tensor, i: usize| wanted[i].then(|| x.cast(ins[i].dtype()));
            let mut out = vec![back(dq, 0), back(dk, 1), back(dv, 2)];
            if ins.len() == 4 {
                // d(scores)/d(bias) is the identity, summed where the bias broadcasts.
                out.push(wanted[3].then(|| unbroadcast(&ds, ins[3].dims())));
            }
            out
        }
        Op::Matmul => {
            let (a, b) = (&ins[0], &ins[1]);
            let r = t.rank() as isize;
            let ga = wanted[0].then(|| {
                let gg = if b.dtype() == DType::F16 { g.cast(DType::F16) } else { g.clone() };
                unbroadcast(&gg.matmul(&b.transpose(r - 2, r - 1)), a.dims())
            });
            let gb = wanted[1].then(|| {
                let gg = if a.dtype() == DType::F16 { g.cast(DType::F16) } else { g.clone() };
                // For b = w^T (a Linear layer's weight) the product is computed as
                // (g^T a)^T: the transpose's own rule then undoes the outer transpose,
                // so w's gradient comes out in w's layout instead of as a strided view
                // every optimiser kernel would have to gather.
                let prod = if b.op().swaps_last_two_axes() {
                    gg.transpose(r - 2, r - 1).matmul(a).transpose(r - 2, r - 1)
                } else {
                    a.transpose(r - 2, r - 1).matmul(&gg)
                };
                unbroadcast(&prod, b.dims())
            });
            vec![ga, gb]
        }
    }
}
