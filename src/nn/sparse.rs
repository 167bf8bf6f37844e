//! Embedding bags and sparse embedding gradients.
//!
//! [`EmbeddingBag`] reduces bags of rows (sum, mean or max) in one kernel: the gather of
//! the rows, times per-sample weights, is fused into a segment reduction
//! ([`Tensor::segment_reduce`]). Its backward pass is a scatter-add into the rows the
//! batch touched. WGSL has no float atomics, so the scatter is sorted instead: the host
//! already holds the ids, sorts the positions by row once per batch (a counting sort,
//! [`GatherPlan`]), and the gradient is a segment sum over that order: deterministic,
//! with any number of duplicate ids, and one pass over the gathered rows.
//!
//! With `sparse: true` ([`Embedding::sparse`], [`EmbeddingBag::sparse`]) the table gets no
//! dense gradient: the forward pass gathers the rows the batch touches into a small
//! leaf, whose gradient is the sparse gradient (those rows and their values,
//! [`SparseGrad`]); [`crate::optim::SparseAdam`] and [`crate::optim::Adagrad`] then
//! update only those rows, in the table's own buffer, so a step costs the rows touched,
//! not the table.

use super::{init, Layer, Module, Role, Visitor, VisitorMut};
use crate::graph::ReduceOp;
use crate::ops::segment::{sort_by_key, GatherPlan};
use crate::{Device, Error, Result, Tensor};
use std::panic::Location;
use std::sync::{Arc, Mutex};

/// Rows a forward pass gathered for a sparse table: the table's parameter (by name,
/// relative to the module asked), the sorted distinct rows, and the `[U, D]` leaf whose
/// gradient is the rows' gradient.
#[derive(Clone, Debug)]
pub struct SparseLookup {
    pub param: String,
    pub rows: Arc<Vec<u32>>,
    pub gathered: Tensor,
}

/// A sparse gradient of a table: distinct sorted `rows` and their gradient `values`
/// (`[rows.len(), D]`).
#[derive(Clone, Debug)]
pub struct SparseGrad {
    /// The table's full state-dict name.
    pub param: String,
    pub rows: Arc<Vec<u32>>,
    pub values: Tensor,
}

/// Lookups recorded since the last optimiser step (not cloned with the module).
#[derive(Debug, Default)]
pub struct PendingLookups(Mutex<Vec<SparseLookup>>);

impl Clone for PendingLookups {
    fn clone(&self) -> Self {
        PendingLookups::default()
    }
}

/// Most lookups kept between steps: forward passes that no step consumes (evaluation
/// with gradients on) must not pile up.
const MAX_PENDING: usize = 1024;

impl PendingLookups {
    fn push(&self, l: SparseLookup) {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() >= MAX_PENDING {
            v.remove(0);
        }
        v.push(l);
    }

    pub(crate) fn take(&self) -> Vec<SparseLookup> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Every sparse lookup under `m` since the last call, with full parameter names.
pub fn take_sparse_lookups(m: &dyn Module) -> Vec<SparseLookup> {
    struct Collect {
        out: Vec<SparseLookup>,
    }
    impl Visitor for Collect {
        fn tensor(&mut self, _: &str, _: &Tensor, _: Role) {}
        fn module(&mut self, name: &str, m: &dyn Module) {
            for mut l in take_sparse_lookups(m) {
                l.param = super::join(name, &l.param);
                self.out.push(l);
            }
        }
    }
    let mut c = Collect { out: m.own_sparse_lookups() };
    m.visit(&mut c);
    c.out
}

/// How a bag's rows combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BagMode {
    Sum,
    Mean,
    Max,
}

/// Bags of ids, checked on the host: `offsets[b]..offsets[b + 1]` of `ids` form bag
/// `b`, each id optionally weighted.
#[derive(Clone, Debug)]
pub struct Bags {
    ids: Vec<u32>,
    /// `bags + 1` entries from 0 to `ids.len()`.
    offsets: Vec<usize>,
    weights: Option<Vec<f32>>,
}

#[track_caller]
fn bad(detail: String) -> Error {
    Error::InvalidArgument { op: "embedding_bag", detail, location: Location::caller() }
}

impl Bags {
    /// PyTorch's form: `offsets[b]` is where bag `b` starts in `ids` (the first is 0,
    /// non-decreasing, at most `ids.len()`); the last bag runs to the end. Optional
    /// per-sample `weights`, one per id (sum mode only, as in PyTorch).
    #[track_caller]
    pub fn from_offsets(ids: &[i64], offsets: &[i64], weights: Option<&[f32]>) -> Result<Bags> {
        let ids = check_ids(ids)?;
        if let Some((b, &o)) = offsets.iter().enumerate().find(|(_, &o)| o < 0) {
            return Err(bad(format!("offset {o} of bag {b} is negative")));
        }
        if offsets.first().is_some_and(|&o| o != 0) {
            return Err(bad(format!("the first offset is {}, not 0", offsets[0])));
        }
        let mut o: Vec<usize> = offsets.iter().map(|&o| o as usize).collect();
        o.push(ids.len());
        for b in 0..o.len() - 1 {
            if o[b] > o[b + 1] {
                return Err(bad(format!(
                    "offsets must be non-decreasing and at most the {} ids: bag {b} starts at {} and ends at {}",
                    ids.len(),
                    o[b],
                    o[b + 1]
                )));
            }
        }
        Bags::with_weights(ids, o, weights)
    }

    /// Fixed-width bags: `ids` is `[bags, width]` row-major and `mask` (same length)
    /// says which entries count; masked-out ids are not read (any value is fine).
    #[track_caller]
    pub fn padded(ids: &[i64], width: usize, mask: &[bool], weights: Option<&[f32]>) -> Result<Bags> {
        if width == 0 || !ids.len().is_multiple_of(width) {
            return Err(bad(format!("{} padded ids do not form rows of width {width}", ids.len())));
        }
        if mask.len() != ids.len() {
            return Err(bad(format!("the mask has {} entries for {} ids", mask.len(), ids.len())));
        }
        if let Some(w) = weights {
            if w.len() != ids.len() {
                return Err(bad(format!("{} per-sample weights for {} ids", w.len(), ids.len())));
            }
        }
        let mut kept = Vec::new();
        let mut kept_w = Vec::new();
        let mut offsets = vec![0];
        for (p, (&id, &on)) in ids.iter().zip(mask).enumerate() {
            if on {
                kept.push(id);
                if let Some(w) = weights {
                    kept_w.push(w[p]);
                }
            }
            if (p + 1) % width == 0 {
                offsets.push(kept.len());
            }
        }
        let ids = check_ids(&kept)?;
        Bags::with_weights(ids, offsets, weights.map(|_| kept_w.as_slice()))
    }

    #[track_caller]
    fn with_weights(ids: Vec<u32>, offsets: Vec<usize>, weights: Option<&[f32]>) -> Result<Bags> {
        if let Some(w) = weights {
            if w.len() != ids.len() {
                return Err(bad(format!("{} per-sample weights for {} ids", w.len(), ids.len())));
            }
            if let Some(j) = w.iter().position(|v| !v.is_finite()) {
                return Err(bad(format!("per-sample weight {j} is not finite")));
            }
        }
        Ok(Bags { ids, offsets, weights: weights.map(<[f32]>::to_vec) })
    }

    /// Number of bags.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Whether there are no bags.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All ids, bag after bag.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

#[track_caller]
fn check_ids(ids: &[i64]) -> Result<Vec<u32>> {
    ids.iter()
        .enumerate()
        .map(|(j, &id)| u32::try_from(id).map_err(|_| bad(format!("id {id} at position {j} is negative or too large"))))
        .collect()
}

/// The rows of `weight` a batch reads: `(source table, its plan)`. For a sparse table
/// the source is a small leaf of the distinct rows (recorded in `pending`), else the
/// table itself.
fn source_rows(weight: &Tensor, ids: &[u32], sparse: bool, pending: &PendingLookups) -> Result<(Tensor, GatherPlan)> {
    let num = weight.dims()[0];
    let dev = weight.device();
    if !sparse || !crate::autograd::grad_enabled() {
        return Ok((weight.clone(), GatherPlan::new(ids, num, dev)?));
    }
    if let Some((j, &r)) = ids.iter().enumerate().find(|(_, &r)| r as usize >= num) {
        return Err(bad(format!("id {r} at position {j} is out of range for a table of {num} rows")));
    }
    let mut rows: Vec<u32> = ids.to_vec();
    rows.sort_unstable();
    rows.dedup();
    let mut local = Vec::with_capacity(ids.len());
    for id in ids {
        local.push(rows.binary_search(id).map_err(|_| bad("a sorted row went missing".into()))? as u32);
    }
    let row_t: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
    let gathered = weight.index_select(0, &Tensor::from_slice(&row_t, [rows.len()], dev)).detach().requires_grad();
    pending.push(SparseLookup { param: "weight".into(), rows: Arc::new(rows.clone()), gathered: gathered.clone() });
    Ok((gathered, GatherPlan::new(&local, rows.len(), dev)?))
}

/// A table `[num, dim]` whose rows are reduced by bags of ids (PyTorch's
/// `nn.EmbeddingBag`): one kernel forward, a sorted segment sum backward, and with
/// `sparse` a [`SparseGrad`] instead of a dense gradient.
#[derive(Clone, Debug)]
pub struct EmbeddingBag {
    pub name: String,
    pub weight: Tensor,
    pub mode: BagMode,
    pub sparse: bool,
    pub pending: PendingLookups,
}

impl EmbeddingBag {
    /// A trainable table initialised from N(0, 1), as PyTorch does.
    pub fn new(num: usize, dim: usize, mode: BagMode, sparse: bool, seed: u64, dev: &Device) -> EmbeddingBag {
        let weight = init::normal(&[num, dim], 1.0, seed, dev).requires_grad();
        EmbeddingBag { name: String::new(), weight, mode, sparse, pending: PendingLookups::default() }
    }

    /// One row per bag (`[bags, dim]`): the sum, mean or max of its rows, each times
    /// its per-sample weight. An empty bag gives zeros.
    #[track_caller]
    pub fn forward(&self, bags: &Bags) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            self.weight.check()?;
            if bags.weights.is_some() && self.mode != BagMode::Sum {
                return Err(bad("per-sample weights need mode Sum (as in PyTorch)".into()));
            }
            let dev = self.weight.device();
            let (src, plan) = source_rows(&self.weight, &bags.ids, self.sparse, &self.pending)?;
            let b = bags.len();
            let mut seg = Vec::with_capacity(bags.ids.len());
            let mut coef = Vec::with_capacity(bags.ids.len());
            for k in 0..b {
                let n = bags.offsets[k + 1] - bags.offsets[k];
                for j in bags.offsets[k]..bags.offsets[k + 1] {
                    seg.push(k as i32);
                    let w = bags.weights.as_ref().map_or(1.0, |w| w[j]);
                    coef.push(if self.mode == BagMode::Mean { w / n as f32 } else { w });
                }
            }
            let offsets: Vec<i32> = bags.offsets.iter().map(|&o| o as i32).collect();
            let n = bags.ids.len();
            let mut values = src.gather_rows(&plan);
            if self.mode != BagMode::Max && (bags.weights.is_some() || self.mode == BagMode::Mean) {
                values = values.mul(&Tensor::from_slice(&coef, [n, 1], dev));
            }
            let op = if self.mode == BagMode::Max { ReduceOp::Max } else { ReduceOp::Sum };
            let offsets = Tensor::from_slice(&offsets, [b + 1], dev);
            let seg = Tensor::from_slice(&seg, [n], dev);
            Ok(values.segment_reduce(&offsets, &seg, op))
        })();
        match r {
            Ok(t) => t,
            Err(e) => self.weight.lift(Err(relocate(e, loc))),
        }
    }
}

/// Point an argument error at the user's call.
fn relocate(e: Error, loc: &'static Location<'static>) -> Error {
    match e {
        Error::InvalidArgument { op, detail, .. } => Error::InvalidArgument { op, detail, location: loc },
        e => e,
    }
}

impl Module for EmbeddingBag {
    fn visit(&self, v: &mut dyn Visitor) {
        v.tensor("weight", &self.weight, Role::Parameter);
    }
    fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>) {
        v.tensor("weight", &mut self.weight, Role::Parameter);
    }
    fn own_sparse_lookups(&self) -> Vec<SparseLookup> {
        self.pending.take()
    }
}

/// Rows of a sparse table for ids of any shape (`[.., dim]`), recording the lookup for
/// the optimiser (see [`crate::nn::Embedding::sparse`]).
pub(crate) fn sparse_lookup(weight: &Tensor, ids: &[u32], shape: &[usize], pending: &PendingLookups) -> Result<Tensor> {
    let (src, plan) = source_rows(weight, ids, true, pending)?;
    let mut dims = shape.to_vec();
    dims.push(weight.dims()[1]);
    Ok(src.gather_rows(&plan).reshape(dims))
}

/// Merge a table's lookups into one sparse gradient: rows that several lookups
/// touched get the sum of their gradients (a segment sum in row order).
pub fn merge(param: String, parts: Vec<(Arc<Vec<u32>>, Tensor)>) -> Result<SparseGrad> {
    if parts.len() == 1 {
        let (rows, values) = parts.into_iter().next().expect("one part");
        return Ok(SparseGrad { param, rows, values });
    }
    let all: Vec<u32> = parts.iter().flat_map(|(r, _)| r.iter().copied()).collect();
    let mut rows = all.clone();
    rows.sort_unstable();
    rows.dedup();
    let keys: Vec<u32> = all.iter().map(|r| rows.binary_search(r).unwrap_or(0) as u32).collect();
    let (perm, offsets, sorted) = sort_by_key(&keys, rows.len());
    let values: Vec<Tensor> = parts.iter().map(|(_, v)| v.clone()).collect();
    let stacked = Tensor::concat(&values, 0);
    let dev = stacked.device().clone();
    let up = |v: &[i32]| Tensor::from_slice(v, [v.len()], &dev);
    let merged = stacked.index_select(0, &up(&perm)).segment_reduce(&up(&offsets), &up(&sorted), ReduceOp::Sum);
    Ok(SparseGrad { param, rows: Arc::new(rows), values: merged })
}

impl Layer for EmbeddingBag {
    /// Bags given as a `[bags, width]` tensor of ids, every entry counting. Blocks to
    /// read the ids (use [`EmbeddingBag::forward`] with [`Bags`] to avoid that).
    fn forward(&self, x: &Tensor) -> Tensor {
        let r = (|| {
            let width = x.dims().last().copied().unwrap_or(1).max(1);
            let ids: Vec<i64> = read_ids(x)?;
            let mask = vec![true; ids.len()];
            Bags::padded(&ids, width, &mask, None)
        })();
        match r {
            Ok(b) => EmbeddingBag::forward(self, &b),
            Err(e) => self.weight.lift(Err(e)),
        }
    }
}

/// The ids of an integer tensor, read back (blocking; native only).
pub(crate) fn read_ids(x: &Tensor) -> Result<Vec<i64>> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        Ok(x.cast(crate::DType::I32).to_vec_blocking::<i32>()?.into_iter().map(i64::from).collect())
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = x;
        Err(Error::Unsupported("a layer reading ids back in a page: pass the ids from the host".into()))
    }
}
