//! Segment reductions, row writes and top-k.

use crate::graph::{ReduceOp, RowRule};

/// `Op::SegmentReduce` over `values` (`[N, D]`) by `offsets` (`[S + 1]`).
pub fn segment_reduce(op: ReduceOp, values: &[f64], offsets: &[f64], d: usize) -> Vec<f64> {
    let n = values.len().checked_div(d).unwrap_or(0);
    let s = offsets.len().saturating_sub(1);
    let mut out = vec![0.0; s * d];
    for seg in 0..s {
        let start = (offsets[seg].max(0.0) as usize).min(n);
        let end = (offsets[seg + 1].max(0.0) as usize).clamp(start, n);
        for c in 0..d {
            let col = (start..end).map(|k| (k, values[k * d + c]));
            out[seg * d + c] = match op {
                ReduceOp::Sum => col.map(|(_, v)| v).sum(),
                ReduceOp::Max | ReduceOp::ArgMax => {
                    let mut best: Option<(usize, f64)> = None;
                    for (k, v) in col {
                        // The first maximum; NaN counts as the maximum.
                        if best.is_none_or(|(_, b)| !b.is_nan() && (v > b || v.is_nan())) {
                            best = Some((k, v));
                        }
                    }
                    match (op, best) {
                        (ReduceOp::Max, Some((_, v))) => v,
                        (ReduceOp::ArgMax, Some((k, _))) => k as f64,
                        (ReduceOp::ArgMax, None) => -1.0,
                        _ => 0.0,
                    }
                }
                _ => unreachable!("segment_reduce checks its op"),
            };
        }
    }
    out
}

/// `Op::ScatterRows`: `inputs[0]` (`[R, D]`) with rows `inputs[1][u]` rewritten by
/// `rule` from the operands that follow (the gate last when `gated`: no row changes
/// where it is 0).
pub fn scatter_rows(rule: RowRule, gated: bool, inputs: &[&[f64]], d: usize) -> Vec<f64> {
    let (x, rows) = (inputs[0], inputs[1]);
    let mut out = x.to_vec();
    let r = x.len().checked_div(d).unwrap_or(0);
    if gated && inputs[2 + rule.operands()][0] == 0.0 {
        return out;
    }
    for (u, &row) in rows.iter().enumerate() {
        if row < 0.0 || row as usize >= r {
            continue;
        }
        let row = row as usize;
        for c in 0..d {
            let (at, k) = (row * d + c, u * d + c);
            out[at] = match rule {
                RowRule::Replace => inputs[2][k],
                RowRule::Accumulate { square } => {
                    let (g, h) = (inputs[2][k], inputs[3]);
                    h[0] * out[at] + h[1] * if square { g * g } else { g }
                }
                RowRule::Step { num_rows } => {
                    let (num, den, h) = (inputs[2], inputs[3], inputs[4]);
                    let n = if num_rows { num[at] } else { num[k] };
                    out[at] - h[0] * n / (den[at].sqrt() + h[1])
                }
            };
        }
    }
    out
}

/// `Op::TopK`: indices of the `k` largest of each row of `n`, largest first, ties to
/// the lower index, NaN the largest.
pub fn topk(x: &[f64], n: usize, k: usize) -> Vec<f64> {
    let rows = x.len().checked_div(n).unwrap_or(0);
    let mut out = Vec::with_capacity(rows * k);
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let mut idx: Vec<usize> = (0..n).collect();
        let key = |v: f64| if v.is_nan() { f64::INFINITY } else { v };
        // Stable: equal values keep index order. NaN sorts before +inf.
        idx.sort_by(|&a, &b| {
            let (va, vb) = (row[a], row[b]);
            vb.is_nan().cmp(&va.is_nan()).then(key(vb).partial_cmp(&key(va)).unwrap_or(std::cmp::Ordering::Equal))
        });
        out.extend(idx[..k].iter().map(|&i| i as f64));
    }
    out
}
