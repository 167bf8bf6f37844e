//! Ops over rows of tables: segment reductions (what embedding bags and sparse
//! gradients are made of), in-place row writes (what sparse optimisers update tables
//! with), and top-k selection.

use super::{dtype_err, precheck, shape_err, Loc};
use crate::graph::{Op, ReduceOp, RowRule};
use crate::{DType, Error, Result, Shape, Tensor};
use std::panic::Location;

fn check_index(op: &'static str, t: &Tensor, len: usize, loc: Loc) -> Result<()> {
    if t.dtype() != DType::I32 {
        return Err(dtype_err(op, &[t.dtype()], "offsets, segment ids and rows are i32", loc));
    }
    if t.dims() != [len] {
        return Err(shape_err(op, &[t.dims()], format!("expected a 1-D index of {len} entries"), loc));
    }
    Ok(())
}

impl Tensor {
    /// Reduce the rows of `self` (`[N, D]` f32) by segments: row `s` of the `[S, D]`
    /// result reduces rows `offsets[s]..offsets[s + 1]` (`offsets`: I32 `[S + 1]`,
    /// non-decreasing, from 0 to N) with `op`: `Sum`, `Max`, or `ArgMax` (the position,
    /// among all N rows, of the first maximum, as I32). Empty segments give 0 (ArgMax
    /// -1). `segment_ids` (I32 `[N]`, the segment of each row) is what the gradient
    /// needs. One kernel, `self`'s expression fused in: a gather of embedding rows
    /// times per-sample weights costs one pass over the rows it reads.
    #[track_caller]
    pub fn segment_reduce(&self, offsets: &Tensor, segment_ids: &Tensor, op: ReduceOp) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            precheck("segment_reduce", &[self, offsets, segment_ids], loc)?;
            if self.dtype() != DType::F32 {
                return Err(dtype_err("segment_reduce", &[self.dtype()], "values are f32", loc));
            }
            if self.rank() != 2 {
                return Err(shape_err("segment_reduce", &[self.dims()], "values are [N, D]", loc));
            }
            if !matches!(op, ReduceOp::Sum | ReduceOp::Max | ReduceOp::ArgMax) {
                return Err(Error::Unsupported(format!("segment_reduce by {op:?}: Sum, Max and ArgMax are supported")));
            }
            let n = self.dims()[0];
            if offsets.rank() != 1 || offsets.dims()[0] == 0 {
                return Err(shape_err("segment_reduce", &[offsets.dims()], "offsets are [S + 1]", loc));
            }
            let s = offsets.dims()[0] - 1;
            check_index("segment_reduce", offsets, s + 1, loc)?;
            check_index("segment_reduce", segment_ids, n, loc)?;
            let dt = if op == ReduceOp::ArgMax { DType::I32 } else { DType::F32 };
            let inputs = vec![self.clone(), offsets.clone(), segment_ids.clone()];
            Ok(Tensor::make_at(
                Op::SegmentReduce { op },
                inputs,
                Shape(vec![s, self.dims()[1]]),
                dt,
                self.device(),
                loc,
            ))
        })();
        self.lift(r)
    }

    /// This table (f32 `[R, D]`) with rows `rows[u]` (I32 `[U]`, distinct) replaced by
    /// `src[u]` (`[U, D]`), written into the table's own buffer: the cost is that of the
    /// `U` rows, not of the table. `self` is consumed: once the result is realised, the
    /// old tensor's values are unspecified (on the GPU and CPU backends they are the
    /// result's), so read anything you need from it in the same realisation or before.
    /// Rows out of range are skipped. Not differentiable.
    #[track_caller]
    pub fn scatter_rows(self, rows: &Tensor, src: &Tensor) -> Tensor {
        self.rows_op(rows, RowRule::Replace, &[src], None, Location::caller())
    }

    /// [`Tensor::scatter_rows`] that accumulates instead of replacing: row `r =
    /// rows[u]` becomes `decay * self[r] + scale * g[u]` (`g[u]²` with `square`), each
    /// row read and written once in place. A moment of `SparseAdam` (`decay = β`,
    /// `scale = 1 - β`) or Adagrad's sum of squares (1, 1). Where `gate` (a one-element
    /// tensor, computed on the device) is false or 0 the table stays as it is, so a
    /// step skipped for non-finite gradients never reads them.
    #[track_caller]
    pub fn accumulate_rows(
        self,
        rows: &Tensor,
        g: &Tensor,
        square: bool,
        [decay, scale]: [f64; 2],
        gate: Option<&Tensor>,
    ) -> Tensor {
        let h = Tensor::from_slice(&[decay as f32, scale as f32], [2], self.device());
        self.rows_op(rows, RowRule::Accumulate { square }, &[g, &h], gate, Location::caller())
    }

    /// [`Tensor::scatter_rows`] that takes an optimiser's step: row `r = rows[u]`
    /// becomes `self[r] - lr * n / (sqrt(den[r]) + eps)`, where `den` is a table like
    /// `self` and `n` is `num[r]` when `num_rows` (`num` a table: Adam's first moment)
    /// or `num[u]` (`num` `[U, D]`: Adagrad's gradient). In place, one pass over the
    /// rows; `gate` as in [`Tensor::accumulate_rows`].
    #[track_caller]
    pub fn step_rows(
        self,
        rows: &Tensor,
        num: &Tensor,
        num_rows: bool,
        den: &Tensor,
        [lr, eps]: [f64; 2],
        gate: Option<&Tensor>,
    ) -> Tensor {
        let h = Tensor::from_slice(&[lr as f32, eps as f32], [2], self.device());
        self.rows_op(rows, RowRule::Step { num_rows }, &[num, den, &h], gate, Location::caller())
    }

    /// `Op::ScatterRows` with `rule` over `operands`, checked.
    fn rows_op(self, rows: &Tensor, rule: RowRule, operands: &[&Tensor], gate: Option<&Tensor>, loc: Loc) -> Tensor {
        let op = rule.op_name();
        let r = (|| {
            let mut all = vec![&self, rows];
            all.extend(operands.iter().copied());
            all.extend(gate);
            precheck(op, &all, loc)?;
            if let Some(t) = std::iter::once(&self).chain(operands.iter().copied()).find(|t| t.dtype() != DType::F32) {
                return Err(dtype_err(op, &[self.dtype(), t.dtype()], "tables and rows are f32", loc));
            }
            if self.rank() != 2 {
                return Err(shape_err(op, &[self.dims()], "the table is [R, D]", loc));
            }
            let (r, d) = (self.dims()[0], self.dims()[1]);
            let u = rows.dims().first().copied().unwrap_or(0);
            check_index(op, rows, u, loc)?;
            // Each operand's expected shape: per touched row, per table row, or `h`.
            let per_u = [u, d];
            let table = [r, d];
            let expected: Vec<&[usize]> = match rule {
                RowRule::Replace => vec![&per_u],
                RowRule::Accumulate { .. } => vec![&per_u, &[2]],
                RowRule::Step { num_rows } => vec![if num_rows { &table } else { &per_u }, &table, &[2]],
            };
            for (t, want) in operands.iter().zip(&expected) {
                if t.dims() != *want {
                    return Err(shape_err(
                        op,
                        &[self.dims(), t.dims()],
                        format!("the table is [R, D] = {:?}; expected an operand of {want:?}", self.dims()),
                        loc,
                    ));
                }
            }
            let mut inputs = vec![self.clone(), rows.clone()];
            inputs.extend(operands.iter().map(|t| (*t).clone()));
            if let Some(g) = gate {
                if g.numel() != 1 {
                    return Err(shape_err(op, &[g.dims()], "the gate is one element", loc));
                }
                inputs.push(g.reshape(Vec::<usize>::new()).cast(DType::F32));
            }
            let shape = Shape(self.dims().to_vec());
            Ok(Tensor::make_at(
                Op::ScatterRows { rule, gated: gate.is_some() },
                inputs,
                shape,
                DType::F32,
                self.device(),
                loc,
            ))
        })();
        self.lift(r)
    }

    /// The `k` largest values along the last axis and their indices (I32), largest
    /// first; ties go to the lower index and NaN counts as the largest. The selection is
    /// one kernel over the rows (its input expression fused in); the values are a gather
    /// of the input at those indices. `k` is at most 64 and at most the axis length.
    #[track_caller]
    pub fn topk(&self, k: usize) -> (Tensor, Tensor) {
        let loc = Location::caller();
        let r = (|| {
            precheck("topk", &[self], loc)?;
            if !self.dtype().is_float() {
                return Err(dtype_err("topk", &[self.dtype()], "top-k takes f32 or f16 values", loc));
            }
            let n = self.dims().last().copied().unwrap_or(1);
            if k == 0 || k > 64 || k > n {
                return Err(shape_err("topk", &[self.dims()], format!("k = {k}: expected 1..=min(64, {n})"), loc));
            }
            let mut d = self.dims().to_vec();
            if d.is_empty() {
                d.push(1);
            }
            *d.last_mut().expect("rank >= 1") = k;
            let x = if self.dtype() == DType::F32 { self.clone() } else { self.cast(DType::F32) };
            Ok(Tensor::make_at(Op::TopK { k }, vec![x], Shape(d), DType::I32, self.device(), loc))
        })();
        let idx = self.lift(r);
        let values = self.gather(-1, &idx);
        (values, idx)
    }
}

/// A row gather planned on the host: the index, and the same positions sorted by row
/// (the permutation, each row's first sorted position, and the sorted rows), which is
/// what the gather's gradient needs to be a segment sum rather than a product with a
/// one-hot matrix. Build once per batch of ids ([`GatherPlan::new`]) and gather with
/// [`Tensor::gather_rows`]. Under [`crate::no_grad`] nothing is sorted (inference
/// uploads only the ids).
#[derive(Clone, Debug)]
pub struct GatherPlan {
    /// The rows gathered, in order (I32 `[N]`).
    pub index: Tensor,
    /// The permutation, each row's first sorted position and the sorted rows.
    sort: Option<[Tensor; 3]>,
    /// Rows of the table the plan gathers from.
    pub num_rows: usize,
}

/// Positions sorted by key (stable) and, per key in `0..num_keys`, the first sorted
/// position: `(perm, offsets [num_keys + 1], sorted keys)`.
pub fn sort_by_key(keys: &[u32], num_keys: usize) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let mut counts = vec![0i32; num_keys + 1];
    for &k in keys {
        counts[k as usize + 1] += 1;
    }
    for r in 0..num_keys {
        counts[r + 1] += counts[r];
    }
    let mut next = counts.clone();
    let mut perm = vec![0i32; keys.len()];
    for (j, &k) in keys.iter().enumerate() {
        perm[next[k as usize] as usize] = j as i32;
        next[k as usize] += 1;
    }
    let sorted = perm.iter().map(|&j| keys[j as usize] as i32).collect();
    (perm, counts, sorted)
}

impl GatherPlan {
    /// Plan a gather of `index` (each below `num_rows`, else an error naming the first
    /// bad one) from a table of `num_rows` rows on `dev`.
    #[track_caller]
    pub fn new(index: &[u32], num_rows: usize, dev: &crate::Device) -> Result<GatherPlan> {
        let bad = |detail: String| Error::InvalidArgument { op: "gather_rows", detail, location: Location::caller() };
        if let Some((j, &r)) = index.iter().enumerate().find(|(_, &r)| r as usize >= num_rows) {
            return Err(bad(format!("index {r} at position {j} is out of range for a table of {num_rows} rows")));
        }
        if num_rows >= i32::MAX as usize || index.len() >= i32::MAX as usize {
            return Err(bad(format!("{num_rows} rows or {} ids exceed i32", index.len())));
        }
        let up = |v: &[i32]| Tensor::from_slice(v, [v.len()], dev);
        let sort = crate::autograd::grad_enabled().then(|| {
            let (perm, offsets, sorted) = sort_by_key(index, num_rows);
            [up(&perm), up(&offsets), up(&sorted)]
        });
        let i32s: Vec<i32> = index.iter().map(|&r| r as i32).collect();
        Ok(GatherPlan { index: up(&i32s), sort, num_rows })
    }
}

impl Tensor {
    /// Rows `plan.index` of this `[R, D]` table (as `index_select(0, ..)`), whose
    /// gradient is a segment sum over the plan's sorted positions: one pass over the
    /// gathered rows instead of a one-hot product over all `R` rows.
    #[track_caller]
    pub fn gather_rows(&self, plan: &GatherPlan) -> Tensor {
        let loc = Location::caller();
        if self.rank() != 2 || self.dims()[0] != plan.num_rows {
            let e =
                shape_err("gather_rows", &[self.dims()], format!("the plan gathers from [{}, D]", plan.num_rows), loc);
            return self.lift(Err(e));
        }
        let out = self.index_select(0, &plan.index);
        let Some([perm, offsets, sorted]) = &plan.sort else { return out };
        if out.check().is_err() {
            return out;
        }
        let node = out.node();
        let inputs = vec![self.clone(), plan.index.clone(), perm.clone(), offsets.clone(), sorted.clone()];
        Tensor::make_at(node.op.clone(), inputs, node.shape.clone(), node.dtype, self.device(), loc)
    }
}
