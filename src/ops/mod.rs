//! The ops, as methods of [`Tensor`](crate::Tensor), one file per family. Each checks
//! shapes and dtypes at once and records a node; an error becomes a tensor that carries
//! it (with the caller's location) until the user realises.

pub mod creation;
pub mod elementwise;
pub mod matmul;
pub mod movement;
pub mod nn;
pub mod reduce;
pub mod segment;

use crate::shape::normalize_axis;
use crate::{DType, Error, Result, Tensor};
use std::panic::Location;

pub(crate) type Loc = &'static Location<'static>;

/// The first error carried by any of `ts`, or a device mismatch between them.
/// Ops that accept quantised (Q8_0/Q4_0) inputs: they dequantise as they load, or only
/// change the view.
const QUANT_OPS: [&str; 9] =
    ["cast", "matmul", "reshape", "permute", "transpose", "index_select", "squeeze", "unsqueeze", "slice"];

pub(crate) fn precheck(op: &'static str, ts: &[&Tensor], loc: Loc) -> Result<()> {
    for t in ts {
        t.check()?;
    }
    if !QUANT_OPS.contains(&op) {
        if let Some(q) = ts.iter().find(|t| t.dtype().is_quantized()) {
            return Err(dtype_err(
                op,
                &[q.dtype()],
                format!("{op} does not take quantised tensors: cast to f32 or f16 first"),
                loc,
            ));
        }
    }
    if let Some(first) = ts.first() {
        for t in &ts[1..] {
            if !t.device().same(first.device()) {
                return Err(Error::DeviceMismatch {
                    op,
                    a: first.device().to_string(),
                    b: t.device().to_string(),
                    location: loc,
                });
            }
        }
    }
    Ok(())
}

pub(crate) fn shape_err(op: &'static str, shapes: &[&[usize]], detail: impl Into<String>, loc: Loc) -> Error {
    Error::Shape { op, shapes: shapes.iter().map(|s| s.to_vec()).collect(), detail: detail.into(), location: loc }
}

pub(crate) fn dtype_err(op: &'static str, dtypes: &[DType], detail: impl Into<String>, loc: Loc) -> Error {
    Error::DType { op, dtypes: dtypes.to_vec(), detail: detail.into(), location: loc }
}

pub(crate) fn arg_err(op: &'static str, detail: impl Into<String>, loc: Loc) -> Error {
    Error::InvalidArgument { op, detail: detail.into(), location: loc }
}

/// Resolve a possibly negative axis of `t`.
pub(crate) fn axis(op: &'static str, t: &Tensor, a: isize, loc: Loc) -> Result<usize> {
    normalize_axis(a, t.rank()).ok_or(Error::Axis {
        op,
        axis: a,
        rank: t.rank(),
        shape: t.dims().to_vec(),
        location: loc,
    })
}

/// Resolve a list of axes (empty means all), rejecting repeats.
pub(crate) fn axes(op: &'static str, t: &Tensor, list: &[isize], loc: Loc) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(list.len());
    for &a in list {
        let x = axis(op, t, a, loc)?;
        if out.contains(&x) {
            return Err(arg_err(op, format!("axis {a} given twice"), loc));
        }
        out.push(x);
    }
    out.sort_unstable();
    Ok(out)
}

/// Check that a shape's element count fits in memory arithmetic.
pub(crate) fn check_numel(op: &'static str, dims: &[usize], loc: Loc) -> Result<()> {
    let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    match n {
        Some(n) if (n as u128) * 4 <= u64::MAX as u128 / 2 => Ok(()),
        _ => Err(shape_err(op, &[dims], "element count overflows", loc)),
    }
}
