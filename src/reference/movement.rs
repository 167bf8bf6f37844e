//! Movement reference ops: expand, permute, slice, pad, concat, gather, index_select.

use crate::shape::{ravel, unravel};
use crate::{Error, Result};
use std::panic::Location;

/// numpy broadcast of `x` (shape `from`) to `to`.
pub fn expand(x: &[f64], from: &[usize], to: &[usize]) -> Vec<f64> {
    let n: usize = to.iter().product();
    let off = to.len() - from.len();
    let mut c = vec![0; to.len()];
    let mut src = vec![0; from.len()];
    (0..n)
        .map(|i| {
            unravel(i, to, &mut c);
            for j in 0..from.len() {
                src[j] = if from[j] == 1 { 0 } else { c[off + j] };
            }
            x[ravel(&src, from)]
        })
        .collect()
}

/// Output axis `i` is input axis `perm[i]`.
pub fn permute(x: &[f64], from: &[usize], perm: &[usize]) -> Vec<f64> {
    let to: Vec<usize> = perm.iter().map(|&p| from[p]).collect();
    let n: usize = to.iter().product();
    let mut c = vec![0; to.len()];
    let mut src = vec![0; to.len()];
    (0..n)
        .map(|i| {
            unravel(i, &to, &mut c);
            for (k, &p) in perm.iter().enumerate() {
                src[p] = c[k];
            }
            x[ravel(&src, from)]
        })
        .collect()
}

/// Output coordinate `c` reads `start + c * step` on each axis.
pub fn slice(x: &[f64], from: &[usize], starts: &[usize], steps: &[usize], to: &[usize]) -> Vec<f64> {
    let n: usize = to.iter().product();
    let mut c = vec![0; to.len()];
    (0..n)
        .map(|i| {
            unravel(i, to, &mut c);
            for d in 0..c.len() {
                c[d] = starts[d] + c[d] * steps[d];
            }
            x[ravel(&c, from)]
        })
        .collect()
}

/// Constant padding with `before[d]` leading elements on axis `d`.
pub fn pad(x: &[f64], from: &[usize], before: &[usize], value: f64, to: &[usize]) -> Vec<f64> {
    let n: usize = to.iter().product();
    let mut c = vec![0; to.len()];
    (0..n)
        .map(|i| {
            unravel(i, to, &mut c);
            for d in 0..c.len() {
                if c[d] < before[d] || c[d] - before[d] >= from[d] {
                    return value;
                }
                c[d] -= before[d];
            }
            x[ravel(&c, from)]
        })
        .collect()
}

/// Join along `axis`.
pub fn concat(xs: &[&[f64]], shapes: &[&[usize]], axis: usize, to: &[usize]) -> Vec<f64> {
    let n: usize = to.iter().product();
    let mut c = vec![0; to.len()];
    (0..n)
        .map(|i| {
            unravel(i, to, &mut c);
            let mut k = 0;
            while c[axis] >= shapes[k][axis] {
                c[axis] -= shapes[k][axis];
                k += 1;
            }
            xs[k][ravel(&c, shapes[k])]
        })
        .collect()
}

fn check_index(
    v: f64,
    size: usize,
    axis: usize,
    op: &'static str,
    location: &'static Location<'static>,
) -> Result<usize> {
    if v < 0.0 || v >= size as f64 {
        return Err(Error::IndexOutOfRange { op, index: v as i64, axis, size, location });
    }
    Ok(v as usize)
}

/// `out[c] = x[c with c[axis] = index[c]]`.
pub fn gather(
    x: &[f64],
    xd: &[usize],
    index: &[f64],
    id: &[usize],
    axis: usize,
    location: &'static Location<'static>,
) -> Result<Vec<f64>> {
    let mut c = vec![0; id.len()];
    (0..index.len())
        .map(|i| {
            unravel(i, id, &mut c);
            c[axis] = check_index(index[i], xd[axis], axis, "gather", location)?;
            Ok(x[ravel(&c, xd)])
        })
        .collect()
}

/// `out[c] = x[c with c[axis] = index[c[axis]]]`.
pub fn index_select(
    x: &[f64],
    xd: &[usize],
    index: &[f64],
    axis: usize,
    to: &[usize],
    location: &'static Location<'static>,
) -> Result<Vec<f64>> {
    let n: usize = to.iter().product();
    let mut c = vec![0; to.len()];
    (0..n)
        .map(|i| {
            unravel(i, to, &mut c);
            c[axis] = check_index(index[c[axis]], xd[axis], axis, "index_select", location)?;
            Ok(x[ravel(&c, xd)])
        })
        .collect()
}

/// For each element of the columns `[N, C, kh*kw, OH, OW]` (row-major), the index in
/// the `[N, C, H, W]` input it reads, or `None` where the window is off the input.
fn window_sources(xd: &[usize], cd: &[usize], win: &crate::graph::Window) -> Vec<Option<usize>> {
    let (n, c, h, w) = (xd[0], xd[1], xd[2], xd[3]);
    let (kk, oh, ow) = (cd[2], cd[3], cd[4]);
    let kw = win.kernel.1;
    let mut out = Vec::with_capacity(n * c * kk * oh * ow);
    for plane in 0..n * c {
        for k in 0..kk {
            for y in 0..oh {
                for x in 0..ow {
                    let sh = (y * win.stride.0 + (k / kw) * win.dilation.0) as isize - win.padding.0 as isize;
                    let sw = (x * win.stride.1 + (k % kw) * win.dilation.1) as isize - win.padding.1 as isize;
                    let inside = sh >= 0 && sw >= 0 && (sh as usize) < h && (sw as usize) < w;
                    out.push(inside.then(|| (plane * h + sh as usize) * w + sw as usize));
                }
            }
        }
    }
    out
}

/// Sliding windows `[N, C, H, W]` -> `[N, C, kh*kw, OH, OW]`.
pub fn im2col(x: &[f64], xd: &[usize], win: &crate::graph::Window, pad: f64, od: &[usize]) -> Vec<f64> {
    window_sources(xd, od, win).into_iter().map(|s| s.map_or(pad, |i| x[i])).collect()
}

/// The adjoint of [`im2col`]: windows summed back onto `[N, C, H, W]`.
pub fn col2im(cols: &[f64], cd: &[usize], win: &crate::graph::Window, od: &[usize]) -> Vec<f64> {
    let mut out = vec![0.0; od.iter().product()];
    for (v, s) in cols.iter().zip(window_sources(od, cd, win)) {
        if let Some(i) = s {
            out[i] += v;
        }
    }
    out
}
