//! Reductions over any set of axes (sum, mean, max, min, argmax, argmin, var) and the
//! softmax family built from them.

use super::{arg_err, axes, dtype_err, precheck, Loc};
use crate::graph::{Op, ReduceOp};
use crate::{DType, Result, Shape, Tensor};
use std::panic::Location;

/// The axes of a reduction: a list the caller gave (which may not be empty), or all.
#[derive(Clone, Copy)]
pub(crate) enum Axes<'a> {
    List(&'a [isize]),
    All,
}

/// Reductions in three forms, as in PyTorch: over one axis (`sum_dim(-1)`, the axis
/// dropped), over a list of axes with `keepdim` (`sum(&[0, 2], true)`; an empty list is
/// an error rather than "every axis"), and over every element (`sum_all()`, a scalar).
impl Tensor {
    /// Sum over `axes`, kept as size 1 with `keepdim`. Bool counts as i32.
    #[track_caller]
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Tensor {
        self.reduce_at(ReduceOp::Sum, Axes::List(axes), keepdim, Location::caller())
    }

    /// Sum over one axis, which is dropped.
    #[track_caller]
    pub fn sum_dim(&self, axis: isize) -> Tensor {
        self.reduce_at(ReduceOp::Sum, Axes::List(&[axis]), false, Location::caller())
    }

    /// Sum of every element, as a scalar.
    #[track_caller]
    pub fn sum_all(&self) -> Tensor {
        self.reduce_at(ReduceOp::Sum, Axes::All, false, Location::caller())
    }

    /// Maximum over `axes` (NaN propagates).
    #[track_caller]
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Tensor {
        self.reduce_at(ReduceOp::Max, Axes::List(axes), keepdim, Location::caller())
    }

    /// Maximum over one axis, which is dropped.
    #[track_caller]
    pub fn max_dim(&self, axis: isize) -> Tensor {
        self.reduce_at(ReduceOp::Max, Axes::List(&[axis]), false, Location::caller())
    }

    /// Maximum of every element, as a scalar.
    #[track_caller]
    pub fn max_all(&self) -> Tensor {
        self.reduce_at(ReduceOp::Max, Axes::All, false, Location::caller())
    }

    /// Minimum over `axes` (NaN propagates).
    #[track_caller]
    pub fn min(&self, axes: &[isize], keepdim: bool) -> Tensor {
        self.reduce_at(ReduceOp::Min, Axes::List(axes), keepdim, Location::caller())
    }

    /// Minimum over one axis, which is dropped.
    #[track_caller]
    pub fn min_dim(&self, axis: isize) -> Tensor {
        self.reduce_at(ReduceOp::Min, Axes::List(&[axis]), false, Location::caller())
    }

    /// Minimum of every element, as a scalar.
    #[track_caller]
    pub fn min_all(&self) -> Tensor {
        self.reduce_at(ReduceOp::Min, Axes::All, false, Location::caller())
    }

    /// Index (i32) of the first maximum over `axes`, counted row-major within the reduced
    /// axes. NaN counts as the maximum.
    #[track_caller]
    pub fn argmax(&self, axes: &[isize], keepdim: bool) -> Tensor {
        self.reduce_at(ReduceOp::ArgMax, Axes::List(axes), keepdim, Location::caller())
    }

    /// Index (i32) of the first maximum along one axis, which is dropped.
    #[track_caller]
    pub fn argmax_dim(&self, axis: isize) -> Tensor {
        self.reduce_at(ReduceOp::ArgMax, Axes::List(&[axis]), false, Location::caller())
    }

    /// Index (i32) of the first maximum over every element, counted row-major.
    #[track_caller]
    pub fn argmax_all(&self) -> Tensor {
        self.reduce_at(ReduceOp::ArgMax, Axes::All, false, Location::caller())
    }

    /// Index (i32) of the first minimum over `axes`.
    #[track_caller]
    pub fn argmin(&self, axes: &[isize], keepdim: bool) -> Tensor {
        self.reduce_at(ReduceOp::ArgMin, Axes::List(axes), keepdim, Location::caller())
    }

    /// Index (i32) of the first minimum along one axis, which is dropped.
    #[track_caller]
    pub fn argmin_dim(&self, axis: isize) -> Tensor {
        self.reduce_at(ReduceOp::ArgMin, Axes::List(&[axis]), false, Location::caller())
    }

    /// Index (i32) of the first minimum over every element, counted row-major.
    #[track_caller]
    pub fn argmin_all(&self) -> Tensor {
        self.reduce_at(ReduceOp::ArgMin, Axes::All, false, Location::caller())
    }

    /// Mean over `axes` (floats).
    #[track_caller]
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Tensor {
        let loc = Location::caller();
        self.lift(self.mean_at(Axes::List(axes), keepdim, loc))
    }

    /// Mean over one axis, which is dropped.
    #[track_caller]
    pub fn mean_dim(&self, axis: isize) -> Tensor {
        let loc = Location::caller();
        self.lift(self.mean_at(Axes::List(&[axis]), false, loc))
    }

    /// Mean of every element, as a scalar.
    #[track_caller]
    pub fn mean_all(&self) -> Tensor {
        let loc = Location::caller();
        self.lift(self.mean_at(Axes::All, false, loc))
    }

    /// Unbiased variance over `axes` (`correction = 1`, as PyTorch's default).
    #[track_caller]
    pub fn var(&self, axes: &[isize], keepdim: bool) -> Tensor {
        let loc = Location::caller();
        self.lift(self.var_at(Axes::List(axes), keepdim, 1, loc))
    }

    /// Unbiased variance of every element, as a scalar.
    #[track_caller]
    pub fn var_all(&self) -> Tensor {
        let loc = Location::caller();
        self.lift(self.var_at(Axes::All, false, 1, loc))
    }

    /// Variance with `sum((x - mean)^2) / (N - correction)`.
    #[track_caller]
    pub fn var_with(&self, axes: &[isize], keepdim: bool, correction: usize) -> Tensor {
        let loc = Location::caller();
        self.lift(self.var_at(Axes::List(axes), keepdim, correction, loc))
    }

    /// Sum over exactly the axes `ax` (none: the tensor itself), kept as size 1 with
    /// `keepdim`: what gradient rules and broadcasting need, where no axes is meaningful.
    pub(crate) fn sum_axes(&self, ax: &[usize], keepdim: bool) -> Tensor {
        if ax.is_empty() {
            return self.clone();
        }
        let list: Vec<isize> = ax.iter().map(|&a| a as isize).collect();
        self.reduce_at(ReduceOp::Sum, Axes::List(&list), keepdim, Location::caller())
    }

    /// Softmax along `axis` (max-subtracted, so large inputs do not overflow).
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Tensor {
        let loc = Location::caller();
        self.lift((|| {
            self.float_only("softmax", loc)?;
            if let Some(t) = self.fused_softmax(axis, false, loc) {
                return Ok(t);
            }
            let m = self.reduce_at(ReduceOp::Max, Axes::List(&[axis]), true, loc);
            let e = self.binary_at(crate::graph::BinaryOp::Sub, &m, loc).unary_at(crate::graph::UnaryOp::Exp, loc);
            let s = e.reduce_at(ReduceOp::Sum, Axes::List(&[axis]), true, loc);
            Ok(e.binary_at(crate::graph::BinaryOp::Div, &s, loc))
        })())
    }

    /// `log(softmax(x))` along `axis`, computed stably.
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Tensor {
        let loc = Location::caller();
        self.lift((|| {
            self.float_only("log_softmax", loc)?;
            if let Some(t) = self.fused_softmax(axis, true, loc) {
                return Ok(t);
            }
            let m = self.reduce_at(ReduceOp::Max, Axes::List(&[axis]), true, loc);
            let z = self.binary_at(crate::graph::BinaryOp::Sub, &m, loc);
            let s =
                z.unary_at(crate::graph::UnaryOp::Exp, loc).reduce_at(ReduceOp::Sum, Axes::List(&[axis]), true, loc);
            Ok(z.binary_at(crate::graph::BinaryOp::Sub, &s.unary_at(crate::graph::UnaryOp::Log, loc), loc))
        })())
    }

    /// Whether this tensor is larger than one storage binding of its device: the
    /// one-kernel forms (softmax, norms) then give way to compositions, which split.
    pub(crate) fn exceeds_binding(&self) -> bool {
        self.dtype().storage_bytes(self.numel()) > self.device().capabilities().max_storage_buffer_binding_size
    }

    /// The one-kernel softmax (`Op::Softmax`) for f32 or f16 along a valid axis (f16
    /// is computed in f32 and rounded once, by a cast after the kernel); bad axes, which
    /// the composition reports, take the composition.
    fn fused_softmax(&self, axis: isize, log: bool, loc: Loc) -> Option<Tensor> {
        let axis = crate::shape::normalize_axis(axis, self.rank())?;
        if !matches!(self.dtype(), DType::F32 | DType::F16)
            || std::env::var("TESSERA_FUSED_SOFTMAX").as_deref() == Ok("0")
            || self.exceeds_binding()
        {
            return None;
        }
        let y = Tensor::make_at(
            Op::Softmax { axis, log },
            vec![self.clone()],
            self.shape().clone(),
            DType::F32,
            self.device(),
            loc,
        );
        Some(y.cast_at(self.dtype(), loc))
    }

    fn float_only(&self, op: &'static str, loc: Loc) -> Result<()> {
        precheck(op, &[self], loc)?;
        if !self.dtype().is_float() {
            return Err(dtype_err(op, &[self.dtype()], format!("{op} needs a float tensor"), loc));
        }
        Ok(())
    }

    fn mean_at(&self, list: Axes, keepdim: bool, loc: Loc) -> Result<Tensor> {
        self.float_only("mean", loc)?;
        let ax = resolve("mean", self, list, loc)?;
        let count: usize = ax.iter().map(|&a| self.dims()[a]).product();
        let s = self.reduce_at(ReduceOp::Sum, list, keepdim, loc);
        Ok(s.binary_at(crate::graph::BinaryOp::Div, &s.scalar_like(count as f64, loc), loc))
    }

    fn var_at(&self, list: Axes, keepdim: bool, correction: usize, loc: Loc) -> Result<Tensor> {
        self.float_only("var", loc)?;
        let ax = resolve("var", self, list, loc)?;
        let count: usize = ax.iter().map(|&a| self.dims()[a]).product();
        let mu = self.mean_at(list, true, loc)?;
        let d = self.binary_at(crate::graph::BinaryOp::Sub, &mu, loc);
        let ss = d.binary_at(crate::graph::BinaryOp::Mul, &d, loc).reduce_at(ReduceOp::Sum, list, keepdim, loc);
        let denom = count as f64 - correction as f64;
        let denom = if denom <= 0.0 { 0.0 } else { denom };
        Ok(ss.binary_at(crate::graph::BinaryOp::Div, &ss.scalar_like(denom, loc), loc))
    }

    pub(crate) fn reduce_at(&self, op: ReduceOp, list: Axes, keepdim: bool, loc: Loc) -> Tensor {
        self.lift(reduce_impl(self, op, list, keepdim, loc))
    }
}

/// The sorted axes of a reduction; an empty list is an error naming the `_all` form.
fn resolve(op: &'static str, x: &Tensor, list: Axes, loc: Loc) -> Result<Vec<usize>> {
    match list {
        Axes::All => Ok((0..x.rank()).collect()),
        Axes::List([]) => Err(arg_err(
            op,
            format!("no axes given: pass the axes to reduce, or use {op}_all() for every element"),
            loc,
        )),
        Axes::List(l) => axes(op, x, l, loc),
    }
}

fn reduce_impl(x: &Tensor, op: ReduceOp, list: Axes, keepdim: bool, loc: Loc) -> Result<Tensor> {
    let name: &'static str = match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
        ReduceOp::ArgMax => "argmax",
        ReduceOp::ArgMin => "argmin",
    };
    precheck(name, &[x], loc)?;
    let ax = resolve(name, x, list, loc)?;
    let len: usize = ax.iter().map(|&a| x.dims()[a]).product();
    if op != ReduceOp::Sum && len == 0 {
        return Err(arg_err(name, format!("cannot take {name} over an empty axis (shape {:?})", x.dims()), loc));
    }
    let input = match x.dtype() {
        DType::Bool if op == ReduceOp::Sum => x.cast_at(DType::I32, loc),
        DType::Bool => return Err(dtype_err(name, &[DType::Bool], format!("{name} is not defined for bool"), loc)),
        DType::F16 => x.cast_at(DType::F32, loc),
        _ => x.clone(),
    };
    let kept: Vec<usize> = x.dims().iter().enumerate().map(|(d, &s)| if ax.contains(&d) { 1 } else { s }).collect();
    let out_dt = match op {
        ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I32,
        _ => input.dtype(),
    };
    let mut y = if len == 1 && !matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) {
        // Over axes of size one (a gather's gradient sums its one-hot over one): the
        // sum, max or min of one element is that element, with no kernel.
        input
    } else {
        Tensor::make_at(Op::Reduce { op, axes: ax.clone() }, vec![input], Shape(kept), out_dt, x.device(), loc)
    };
    if x.dtype() == DType::F16 && out_dt == DType::F32 {
        y = y.cast_at(DType::F16, loc);
    }
    if !keepdim {
        let dims: Vec<usize> = x.dims().iter().enumerate().filter(|(d, _)| !ax.contains(d)).map(|(_, &s)| s).collect();
        y = y.reshape_at(&dims, loc);
    }
    Ok(y)
}
