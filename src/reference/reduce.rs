//! Reductions over a set of axes, reduced axes kept as size 1.

use crate::graph::ReduceOp;
use crate::shape::{ravel, unravel};

/// Reduce `x` (shape `xd`) over `axes`. Sums accumulate in f64; max/min propagate NaN and
/// the arg forms return the first index of the extreme (NaN counting as extreme).
pub fn reduce(op: ReduceOp, x: &[f64], xd: &[usize], axes: &[usize]) -> Vec<f64> {
    let od: Vec<usize> = xd.iter().enumerate().map(|(d, &s)| if axes.contains(&d) { 1 } else { s }).collect();
    let rd: Vec<usize> = axes.iter().map(|&a| xd[a]).collect();
    let n_out: usize = od.iter().product();
    let len: usize = rd.iter().product();
    let mut oc = vec![0; od.len()];
    let mut rc = vec![0; rd.len()];
    (0..n_out)
        .map(|o| {
            unravel(o, &od, &mut oc);
            let mut best = (f64::NAN, usize::MAX);
            let mut sum = 0.0;
            for r in 0..len {
                unravel(r, &rd, &mut rc);
                let mut c = oc.clone();
                for (j, &a) in axes.iter().enumerate() {
                    c[a] = rc[j];
                }
                let v = x[ravel(&c, xd)];
                sum += v;
                let better = match op {
                    ReduceOp::Max | ReduceOp::ArgMax => v > best.0,
                    _ => v < best.0,
                };
                if best.1 == usize::MAX || (!best.0.is_nan() && (v.is_nan() || better)) {
                    best = (v, r);
                }
            }
            match op {
                ReduceOp::Sum => sum,
                ReduceOp::Max | ReduceOp::Min => best.0,
                ReduceOp::ArgMax | ReduceOp::ArgMin => {
                    if best.1 == usize::MAX {
                        0.0
                    } else {
                        best.1 as f64
                    }
                }
            }
        })
        .collect()
}

/// Softmax (or log-softmax) of `x` with shape `dims` along `axis`, in f64; the max is
/// NaN if any element is.
pub fn softmax(x: &[f64], dims: &[usize], axis: usize, log: bool) -> Vec<f64> {
    let a = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let mut out = vec![0.0; x.len()];
    if a == 0 {
        return out;
    }
    for row in 0..x.len() / a {
        let base = (row / inner) * a * inner + row % inner;
        let at = |j: usize| base + j * inner;
        let top = (0..a).map(|j| x[at(j)]).fold(f64::NEG_INFINITY, |m, v| {
            if v.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(v)
            }
        });
        let total: f64 = (0..a).map(|j| (x[at(j)] - top).exp()).sum();
        for j in 0..a {
            let z = x[at(j)] - top;
            out[at(j)] = if log { z - total.ln() } else { z.exp() / total };
        }
    }
    out
}

/// Layer (or RMS) normalisation of `x` over its last axis in f64, times `w`, plus `b`.
pub fn norm(x: &[f64], dims: &[usize], rms: bool, eps: f64, w: Option<&[f64]>, b: Option<&[f64]>) -> Vec<f64> {
    let d = dims.last().copied().unwrap_or(1);
    let mut out = vec![0.0; x.len()];
    if d == 0 {
        return out;
    }
    for (row, o) in x.chunks(d).zip(out.chunks_mut(d)) {
        let mean = if rms { 0.0 } else { row.iter().sum::<f64>() / d as f64 };
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for (j, (o, v)) in o.iter_mut().zip(row).enumerate() {
            *o = (v - mean) * rstd * w.map_or(1.0, |w| w[j]) + b.map_or(0.0, |b| b[j]);
        }
    }
    out
}
