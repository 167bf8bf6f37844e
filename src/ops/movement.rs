//! Movement ops: reshape, permute, transpose, broadcast, slice, narrow, concat, stack,
//! index_select, gather, pad. On the GPU they cost nothing on their own: they rewrite
//! indices inside the fused kernel of whatever consumes them.

use super::{arg_err, axis, check_numel, dtype_err, precheck, shape_err, Loc};
use crate::graph::Op;
use crate::shape::can_broadcast_to;
use crate::{DType, Error, Result, Shape, Tensor};
use std::panic::Location;

impl Tensor {
    /// Same elements, new shape (row-major order). The element count must match.
    #[track_caller]
    pub fn reshape(&self, shape: impl Into<Shape>) -> Tensor {
        let s = shape.into();
        self.reshape_at(s.dims(), Location::caller())
    }

    /// One axis holding every element.
    #[track_caller]
    pub fn flatten(&self) -> Tensor {
        let n = self.numel();
        self.reshape_at(&[n], Location::caller())
    }

    /// Insert a size-1 axis at `axis` (`-1` appends).
    #[track_caller]
    pub fn unsqueeze(&self, axis_: isize) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            precheck("unsqueeze", &[self], loc)?;
            let a = crate::shape::normalize_axis(axis_, self.rank() + 1).ok_or(Error::Axis {
                op: "unsqueeze",
                axis: axis_,
                rank: self.rank() + 1,
                shape: self.dims().to_vec(),
                location: loc,
            })?;
            let mut d = self.dims().to_vec();
            d.insert(a, 1);
            Ok(self.reshape_at(&d, loc))
        })();
        self.lift(r)
    }

    /// Remove axis `axis`, which must have size 1.
    #[track_caller]
    pub fn squeeze(&self, axis_: isize) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            precheck("squeeze", &[self], loc)?;
            let a = axis("squeeze", self, axis_, loc)?;
            if self.dims()[a] != 1 {
                return Err(shape_err(
                    "squeeze",
                    &[self.dims()],
                    format!("axis {a} has size {}, not 1", self.dims()[a]),
                    loc,
                ));
            }
            let mut d = self.dims().to_vec();
            d.remove(a);
            Ok(self.reshape_at(&d, loc))
        })();
        self.lift(r)
    }

    pub(crate) fn reshape_at(&self, dims: &[usize], loc: Loc) -> Tensor {
        let r = (|| {
            precheck("reshape", &[self], loc)?;
            check_numel("reshape", dims, loc)?;
            let n: usize = dims.iter().product();
            if n != self.numel() {
                return Err(shape_err(
                    "reshape",
                    &[self.dims(), dims],
                    format!("cannot reshape {} elements into {} elements", self.numel(), n),
                    loc,
                ));
            }
            if dims == self.dims() {
                return Ok(self.clone());
            }
            Ok(self.derive(Op::Reshape, dims.to_vec(), loc))
        })();
        self.lift(r)
    }

    /// Reorder axes: output axis `i` is input axis `perm[i]`.
    #[track_caller]
    pub fn permute(&self, perm: &[usize]) -> Tensor {
        let loc = Location::caller();
        self.lift(self.permute_at(perm, loc))
    }

    pub(crate) fn permute_at(&self, perm: &[usize], loc: Loc) -> Result<Tensor> {
        precheck("permute", &[self], loc)?;
        let r = self.rank();
        let mut seen = vec![false; r];
        if perm.len() != r || perm.iter().any(|&p| p >= r || std::mem::replace(&mut seen[p], true)) {
            return Err(shape_err(
                "permute",
                &[self.dims(), perm],
                format!("{perm:?} is not a permutation of {r} axes"),
                loc,
            ));
        }
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(self.clone());
        }
        // A permute that undoes an unrealised permute is that permute's input. A Linear
        // weight's gradient is such a pair (the transpose of the transposed product, see
        // autograd's matmul rule): folded, the optimiser's kernel loads it in its own
        // layout, vectorised, instead of through per-element index arithmetic (lavapipe:
        // Adam on 256x784 took 3.2 ms a step). Pairs that do not cancel stay two nodes: a
        // product reads a swap of its operand's last two axes in place, and a head split
        // under it is stored by quads. Not past a gradient target, whose gradient would
        // then not flow.
        if let (Op::Permute { perm: inner }, false, false) = (self.op(), self.is_realized(), self.is_grad_target()) {
            if perm.iter().enumerate().all(|(i, &p)| inner[p] == i) {
                return Ok(self.node().inputs[0].clone());
            }
        }
        let dims: Vec<usize> = perm.iter().map(|&p| self.dims()[p]).collect();
        Ok(self.derive(Op::Permute { perm: perm.to_vec() }, dims, loc))
    }

    /// Swap two axes.
    #[track_caller]
    pub fn transpose(&self, a: isize, b: isize) -> Tensor {
        let loc = Location::caller();
        self.lift(self.transpose_at(a, b, loc))
    }

    pub(crate) fn transpose_at(&self, a: isize, b: isize, loc: Loc) -> Result<Tensor> {
        precheck("transpose", &[self], loc)?;
        let (a, b) = (axis("transpose", self, a, loc)?, axis("transpose", self, b, loc)?);
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute_at(&perm, loc)
    }

    /// Transpose of the last two axes.
    #[track_caller]
    pub fn t(&self) -> Tensor {
        let loc = Location::caller();
        self.lift(self.transpose_at(-2, -1, loc))
    }

    /// numpy broadcast to `shape`.
    #[track_caller]
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> Tensor {
        let s = shape.into();
        let loc = Location::caller();
        self.lift(self.expand_at(s.dims(), loc))
    }

    pub(crate) fn expand_at(&self, dims: &[usize], loc: Loc) -> Result<Tensor> {
        precheck("broadcast_to", &[self], loc)?;
        if !can_broadcast_to(self.dims(), dims) {
            return Err(shape_err(
                "broadcast_to",
                &[self.dims(), dims],
                "shape cannot be broadcast to the target",
                loc,
            ));
        }
        if dims == self.dims() {
            return Ok(self.clone());
        }
        check_numel("broadcast_to", dims, loc)?;
        Ok(self.derive(Op::Expand, dims.to_vec(), loc))
    }

    /// Python slicing `x[start:end:step]` along one axis: negative `start`/`end` count
    /// from the end and both clamp to the axis; `step` must be positive.
    #[track_caller]
    pub fn slice(&self, axis_: isize, start: isize, end: isize, step: usize) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            precheck("slice", &[self], loc)?;
            let a = axis("slice", self, axis_, loc)?;
            if step == 0 {
                return Err(arg_err("slice", "step must be positive", loc));
            }
            let n = self.dims()[a] as isize;
            let clampi = |v: isize| if v < 0 { (v + n).max(0) } else { v.min(n) };
            let (s, e) = (clampi(start), clampi(end));
            let len = if e > s { ((e - s) as usize).div_ceil(step) } else { 0 };
            self.slice_axis(a, s as usize, len, step, loc)
        })();
        self.lift(r)
    }

    /// `len` elements of `axis` starting at `start`; out-of-range requests are errors.
    #[track_caller]
    pub fn narrow(&self, axis_: isize, start: usize, len: usize) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            precheck("narrow", &[self], loc)?;
            let a = axis("narrow", self, axis_, loc)?;
            let n = self.dims()[a];
            if start.checked_add(len).is_none_or(|e| e > n) {
                return Err(shape_err(
                    "narrow",
                    &[self.dims()],
                    format!("start {start} + length {len} exceeds axis {a} of size {n}"),
                    loc,
                ));
            }
            self.slice_axis(a, start, len, 1, loc)
        })();
        self.lift(r)
    }

    fn slice_axis(&self, a: usize, start: usize, len: usize, step: usize, loc: Loc) -> Result<Tensor> {
        if start == 0 && step == 1 && len == self.dims()[a] {
            return Ok(self.clone());
        }
        let r = self.rank();
        let mut starts = vec![0; r];
        let mut steps = vec![1; r];
        starts[a] = start;
        steps[a] = step;
        let mut dims = self.dims().to_vec();
        dims[a] = len;
        Ok(self.derive(Op::Slice { starts, steps }, dims, loc))
    }

    /// Join tensors along an existing axis. Shapes must match elsewhere.
    #[track_caller]
    pub fn concat(tensors: &[Tensor], axis_: isize) -> Tensor {
        let loc = Location::caller();
        concat_at(tensors, axis_, loc)
    }

    /// Join tensors along a new axis. Shapes must match.
    #[track_caller]
    pub fn stack(tensors: &[Tensor], axis_: isize) -> Tensor {
        let loc = Location::caller();
        let Some(first) = tensors.first() else {
            return Tensor::failed(arg_err("stack", "no tensors given", loc), DType::F32, &crate::Device::cpu());
        };
        let r = (|| {
            let refs: Vec<&Tensor> = tensors.iter().collect();
            precheck("stack", &refs, loc)?;
            for t in tensors {
                if t.dims() != first.dims() {
                    return Err(shape_err(
                        "stack",
                        &[first.dims(), t.dims()],
                        "stacked tensors must have one shape",
                        loc,
                    ));
                }
            }
            let a = crate::shape::normalize_axis(axis_, first.rank() + 1).ok_or(Error::Axis {
                op: "stack",
                axis: axis_,
                rank: first.rank() + 1,
                shape: first.dims().to_vec(),
                location: loc,
            })?;
            let mut d = first.dims().to_vec();
            d.insert(a, 1);
            let parts: Vec<Tensor> = tensors.iter().map(|t| t.reshape_at(&d, loc)).collect();
            Ok(concat_at(&parts, a as isize, loc))
        })();
        first.lift(r)
    }

    /// Select entries of `axis` by a 1-D integer `index`: `out[.., i, ..] = x[.., index[i], ..]`.
    /// Out-of-range indices are reported when the result is realised.
    #[track_caller]
    pub fn index_select(&self, axis_: isize, index: &Tensor) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            let a = self.index_preamble("index_select", axis_, index, loc)?;
            if index.rank() != 1 {
                return Err(shape_err("index_select", &[self.dims(), index.dims()], "the index must be 1-D", loc));
            }
            let mut d = self.dims().to_vec();
            d[a] = index.dims()[0];
            self.indexed("index_select", Op::IndexSelect { axis: a }, index, Shape(d), loc)
        })();
        self.lift(r)
    }

    /// Checks shared by gather and index_select; returns the resolved axis.
    fn index_preamble(&self, op: &'static str, axis_: isize, index: &Tensor, loc: Loc) -> Result<usize> {
        precheck(op, &[self, index], loc)?;
        let a = axis(op, self, axis_, loc)?;
        if !index.dtype().is_int() {
            return Err(dtype_err(op, &[index.dtype()], "the index must be i32 or u32", loc));
        }
        Ok(a)
    }

    /// The node of a gather-like op producing `shape`; any index into an empty axis is
    /// out of range.
    fn indexed(&self, op: &'static str, node: Op, index: &Tensor, shape: Shape, loc: Loc) -> Result<Tensor> {
        let (Op::Gather { axis } | Op::IndexSelect { axis }) = node else { unreachable!("indexed takes gather ops") };
        if self.dims()[axis] == 0 && shape.numel() > 0 && index.numel() > 0 {
            return Err(Error::IndexOutOfRange { op, index: 0, axis, size: 0, location: loc });
        }
        // A lookup into a quantised table (an embedding) dequantises to f32.
        let dt = if self.dtype().is_quantized() { DType::F32 } else { self.dtype() };
        Ok(Tensor::make_at(node, vec![self.clone(), index.clone()], shape, dt, self.device(), loc))
    }

    /// `out[c] = x[c with c[axis] = index[c]]` (as `torch.gather`). `index` has this
    /// tensor's rank, and no axis longer than it except `axis`.
    #[track_caller]
    pub fn gather(&self, axis_: isize, index: &Tensor) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            let a = self.index_preamble("gather", axis_, index, loc)?;
            if index.rank() != self.rank()
                || index.dims().iter().zip(self.dims()).enumerate().any(|(d, (&i, &s))| d != a && i > s)
            {
                return Err(shape_err(
                    "gather",
                    &[self.dims(), index.dims()],
                    "the index must have the input's rank and no larger size off the gather axis",
                    loc,
                ));
            }
            self.indexed("gather", Op::Gather { axis: a }, index, index.shape().clone(), loc)
        })();
        self.lift(r)
    }

    /// Constant padding: `pads[d] = (before, after)` for every axis `d`.
    #[track_caller]
    pub fn pad(&self, pads: &[(usize, usize)], value: f64) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            precheck("pad", &[self], loc)?;
            if pads.len() != self.rank() {
                return Err(arg_err(
                    "pad",
                    format!("{} (before, after) pairs given for rank {}", pads.len(), self.rank()),
                    loc,
                ));
            }
            let mut dims = Vec::with_capacity(pads.len());
            for (d, &(b, a)) in pads.iter().enumerate() {
                let n = self.dims()[d].checked_add(b).and_then(|x| x.checked_add(a));
                dims.push(n.ok_or_else(|| arg_err("pad", "padded size overflows", loc))?);
            }
            check_numel("pad", &dims, loc)?;
            if pads.iter().all(|&(b, a)| b == 0 && a == 0) {
                return Ok(self.clone());
            }
            let value = crate::reference::elementwise::cast(value, DType::F32, self.dtype());
            let before = pads.iter().map(|p| p.0).collect();
            Ok(self.derive(Op::Pad { before, value }, dims, loc))
        })();
        self.lift(r)
    }
}

impl Tensor {
    /// A node computed from this tensor alone, with its dtype and device.
    pub(crate) fn derive(&self, op: Op, dims: Vec<usize>, loc: Loc) -> Tensor {
        Tensor::make_at(op, vec![self.clone()], Shape(dims), self.dtype(), self.device(), loc)
    }
}

/// Most inputs of one concatenation node.
const CONCAT_FANIN: usize = 4;

fn concat_at(tensors: &[Tensor], axis_: isize, loc: Loc) -> Tensor {
    let Some(first) = tensors.first() else {
        return Tensor::failed(arg_err("concat", "no tensors given", loc), DType::F32, &crate::Device::cpu());
    };
    let r = (|| {
        let refs: Vec<&Tensor> = tensors.iter().collect();
        precheck("concat", &refs, loc)?;
        let a = axis("concat", first, axis_, loc)?;
        let mut total = 0usize;
        for t in tensors {
            if t.dtype() != first.dtype() {
                return Err(dtype_err(
                    "concat",
                    &[first.dtype(), t.dtype()],
                    "concatenated tensors must share a dtype",
                    loc,
                ));
            }
            let same = t.rank() == first.rank() && (0..t.rank()).all(|d| d == a || t.dims()[d] == first.dims()[d]);
            if !same {
                return Err(shape_err("concat", &[first.dims(), t.dims()], format!("shapes differ off axis {a}"), loc));
            }
            total += t.dims()[a];
        }
        if tensors.len() == 1 {
            return Ok(first.clone());
        }
        // Many inputs: a tree of concatenations of at most CONCAT_FANIN each, so the
        // scheduler can split a group that would read more buffers than a kernel binds.
        if tensors.len() > CONCAT_FANIN {
            let parts: Vec<Tensor> = tensors.chunks(CONCAT_FANIN).map(|c| concat_at(c, a as isize, loc)).collect();
            return Ok(concat_at(&parts, a as isize, loc));
        }
        let mut d = first.dims().to_vec();
        d[a] = total;
        check_numel("concat", &d, loc)?;
        Ok(Tensor::make_at(Op::Concat { axis: a }, tensors.to_vec(), Shape(d), first.dtype(), first.device(), loc))
    })();
    first.lift(r)
}
