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
