//! Reductions on the CPU: the fused input expression is evaluated in ranges laid out
//! for the reduced axes. Trailing axes reduce row by row, leading axes accumulate whole
//! rows of outputs at a time, and any other set walks blocks of the innermost axes by a
//! list of positions made once (the browser's build: element by element, in order).
//! Sums accumulate in the input's compute type (f32 for floats, in several lanes per
//! chunk); max and min propagate NaN; argmax and argmin return the first extreme, NaN
//! counting as extreme (the reference's rules).

use super::buffer::{CpuBuffer, HostBuffer, Vals};
use super::expr::{strides_of, Idx, Program, CHUNK};
use super::{memory, par};
use crate::graph::ReduceOp;
use crate::{DType, Error, Result, Tensor};
use std::sync::Arc;

/// A partial reduction: a running value and, for the arg forms, its index.
#[derive(Clone, Copy, Debug)]
enum Acc {
    Empty,
    F(f32, usize),
    I(i64, usize),
}

fn better(op: ReduceOp, v: f64, best: f64) -> bool {
    match op {
        ReduceOp::Max | ReduceOp::ArgMax => v > best,
        _ => v < best,
    }
}

/// Fold element `v` (at reduction index `r`) into `acc`.
#[inline]
fn fold_f(op: ReduceOp, acc: &mut Acc, v: f32, r: usize) {
    *acc = match *acc {
        Acc::Empty => Acc::F(v, r),
        Acc::F(s, i) => match op {
            ReduceOp::Sum => Acc::F(s + v, i),
            _ if s.is_nan() => Acc::F(s, i),
            _ if v.is_nan() || better(op, v as f64, s as f64) => Acc::F(v, r),
            _ => Acc::F(s, i),
        },
        a => a,
    };
}

#[inline]
fn fold_i(op: ReduceOp, acc: &mut Acc, v: i64, r: usize, wrap: fn(i64) -> i64) {
    *acc = match *acc {
        Acc::Empty => Acc::I(v, r),
        Acc::I(s, i) => match op {
            ReduceOp::Sum => Acc::I(wrap(s.wrapping_add(v)), i),
            _ if better(op, v as f64, s as f64) => Acc::I(v, r),
            _ => Acc::I(s, i),
        },
        a => a,
    };
}

/// Combine `a` with `b`, whose indices all come after `a`'s.
fn combine(op: ReduceOp, a: Acc, b: Acc, wrap: fn(i64) -> i64) -> Acc {
    match (a, b) {
        (Acc::Empty, x) | (x, Acc::Empty) => x,
        (Acc::F(_, _), Acc::F(v, r)) => {
            let mut a = a;
            if op == ReduceOp::Sum {
                if let Acc::F(s, i) = a {
                    return Acc::F(s + v, i);
                }
            }
            fold_f(op, &mut a, v, r);
            a
        }
        (Acc::I(_, _), Acc::I(v, r)) => {
            let mut a = a;
            fold_i(op, &mut a, v, r, wrap);
            a
        }
        (a, _) => a,
    }
}

/// Sum of a float slice in 8 lanes (vectorisable, and more accurate than one running
/// sum).
fn lane_sum(v: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut it = v.chunks_exact(8);
    for c in &mut it {
        for (l, x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    let tail: f32 = it.remainder().iter().sum();
    lanes.iter().sum::<f32>() + tail
}

/// Fold the values `v[lo..hi]`, which are reduction indices `r0..`, into `acc`.
fn fold_run(op: ReduceOp, acc: &mut Acc, v: &Vals, lo: usize, hi: usize, r0: usize, wrap: fn(i64) -> i64) {
    match v {
        Vals::F(x) if op == ReduceOp::Sum => {
            let s = lane_sum(&x[lo..hi]);
            *acc = combine(op, *acc, Acc::F(s, r0), wrap);
        }
        Vals::F(x) => {
            for (j, &e) in x[lo..hi].iter().enumerate() {
                fold_f(op, acc, e, r0 + j);
            }
        }
        Vals::I(x) => x[lo..hi].iter().enumerate().for_each(|(j, &e)| fold_i(op, acc, e as i64, r0 + j, wrap)),
        Vals::U(x) => x[lo..hi].iter().enumerate().for_each(|(j, &e)| fold_i(op, acc, e as i64, r0 + j, wrap)),
        Vals::B(x) => x[lo..hi].iter().enumerate().for_each(|(j, &e)| fold_i(op, acc, e as i64, r0 + j, wrap)),
    }
}

/// Fold element `p` of `v` (reduction index `r`) into `acc`.
#[inline]
fn fold_one(op: ReduceOp, acc: &mut Acc, v: &Vals, p: usize, r: usize, wrap: fn(i64) -> i64) {
    match v {
        Vals::F(x) => fold_f(op, acc, x[p], r),
        Vals::I(x) => fold_i(op, acc, x[p] as i64, r, wrap),
        Vals::U(x) => fold_i(op, acc, x[p] as i64, r, wrap),
        Vals::B(x) => fold_i(op, acc, x[p] as i64, r, wrap),
    }
}

/// Parts of the outputs, in order, as one vector (a copy per part: `flatten` went
/// element by element, a quarter of a 3x3 max pool's time).
fn joined(parts: Vec<Vec<Acc>>) -> Vec<Acc> {
    let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    parts.into_iter().for_each(|p| out.extend_from_slice(&p));
    out
}

/// The reduced value of an accumulator, exact, before rounding to the output dtype.
fn finish(op: ReduceOp, a: Acc) -> f64 {
    match (op, a) {
        (ReduceOp::ArgMax | ReduceOp::ArgMin, Acc::F(_, i) | Acc::I(_, i)) => i as f64,
        (ReduceOp::ArgMax | ReduceOp::ArgMin, Acc::Empty) => 0.0,
        (ReduceOp::Sum, Acc::Empty) => 0.0,
        (_, Acc::Empty) => f64::NAN,
        (_, Acc::F(v, _)) => v as f64,
        (_, Acc::I(v, _)) => v as f64,
    }
}

/// Reduce `prog` (the input expression, of dims `xd`) over `axes` into a buffer of
/// `out_dt` with the reduced axes kept as size 1.
pub(crate) fn reduce(prog: &Program, xd: &[usize], op: ReduceOp, axes: &[usize], out_dt: DType) -> Result<HostBuffer> {
    let wrap: fn(i64) -> i64 = match prog.dtype() {
        DType::U32 => |v| v as u32 as i64,
        _ => |v| v as i32 as i64,
    };
    let n_out: usize = xd.iter().enumerate().filter(|(d, _)| !axes.contains(d)).map(|(_, &s)| s).product();
    let len: usize = axes.iter().map(|&a| xd[a]).product();
    // Axes of size one do not matter for the layout.
    let red: Vec<usize> = (0..xd.len()).filter(|d| axes.contains(d) && xd[*d] > 1).collect();
    let kept: Vec<usize> = (0..xd.len()).filter(|d| !axes.contains(d) && xd[*d] > 1).collect();
    // One accumulator an output, held twice at the peak (the blocks' and the whole).
    let scratch = (n_out as u64).saturating_mul(2 * std::mem::size_of::<Acc>() as u64);
    super::host_room(scratch, "a reduction's accumulators")?;
    // Kept axes on both sides of one block of reduced ones: the outputs before it.
    let between = |r: &usize| kept.iter().all(|k| k < r || k > &red[red.len() - 1]);
    let middle = red.first().filter(|r| between(r)).map(|&r| xd[..r].iter().product::<usize>());
    let suffix = red.iter().all(|r| kept.iter().all(|k| k < r));
    let prefix = red.iter().all(|r| kept.iter().all(|k| k > r));
    let accs: Vec<Acc> = if n_out == 0 {
        Vec::new()
    } else if len == 0 {
        vec![Acc::Empty; n_out]
    } else if suffix {
        rows(prog, op, n_out, len, wrap)?
    } else if prefix {
        columns(prog, op, (1, n_out), len, wrap)?
    } else if let Some(outer) = middle.filter(|&o| n_out / o * len >= CHUNK) {
        // At least a chunk of input for each outer index (smaller ones walk in order,
        // many outer indices a chunk).
        columns(prog, op, (outer, n_out / outer), len, wrap)?
    } else {
        in_order(prog, op, xd, axes, red[0], wrap)?
    };
    if out_dt == DType::F32 {
        let vals = accs.into_iter().map(|a| finish(op, a) as f32);
        return Ok(HostBuffer::F32(super::buffer::filled(vals)));
    }
    let vals: Vec<f64> = accs.into_iter().map(|a| out_dt.round(finish(op, a))).collect();
    Ok(HostBuffer::from_f64(out_dt, &vals))
}

/// Outputs of `len` consecutive input elements each.
fn rows(prog: &Program, op: ReduceOp, n_out: usize, len: usize, wrap: fn(i64) -> i64) -> Result<Vec<Acc>> {
    if len <= CHUNK {
        // Blocks of whole rows per chunk.
        let per = (CHUNK / len).max(1);
        let blocks = n_out.div_ceil(per);
        let parts = par::map(blocks, par::worth(n_out * len), |b| {
            let (r0, r1) = (b * per, ((b + 1) * per).min(n_out));
            let v = prog.eval(Idx::Range(r0 * len, (r1 - r0) * len))?;
            Ok((r0..r1)
                .map(|r| {
                    let mut a = Acc::Empty;
                    let lo = (r - r0) * len;
                    fold_run(op, &mut a, &v, lo, lo + len, 0, wrap);
                    a
                })
                .collect::<Vec<_>>())
        })?;
        return Ok(joined(parts));
    }
    let pieces = len.div_ceil(CHUNK);
    let reduce_row = |r: usize, parallel: bool| -> Result<Acc> {
        let parts = par::map(pieces, parallel, |c| {
            let (lo, hi) = (c * CHUNK, ((c + 1) * CHUNK).min(len));
            let v = prog.eval(Idx::Range(r * len + lo, hi - lo))?;
            let mut a = Acc::Empty;
            fold_run(op, &mut a, &v, 0, hi - lo, lo, wrap);
            Ok(a)
        })?;
        Ok(parts.into_iter().fold(Acc::Empty, |a, b| combine(op, a, b, wrap)))
    };
    if n_out >= 2 * par::threads() {
        par::map(n_out, par::worth(n_out * len), |r| reduce_row(r, false))
    } else {
        (0..n_out).map(|r| reduce_row(r, par::worth(len))).collect()
    }
}

/// Accumulators for a row of outputs: plain floats for f32 sums, maxima and minima
/// (a sum starts at -0.0, so a lone -0.0 stays -0.0; NaN wins), else [`Acc`]s.
enum Accs {
    Plain(Vec<f32>),
    Any(Vec<Acc>),
}

/// Where a plain f32 fold of `op` over values of `dt` starts, if it has one.
fn plain_start(op: ReduceOp, dt: DType) -> Option<f32> {
    match op {
        ReduceOp::Sum => Some(-0.0),
        ReduceOp::Max => Some(f32::NEG_INFINITY),
        ReduceOp::Min => Some(f32::INFINITY),
        _ => None,
    }
    .filter(|_| dt == DType::F32)
}

impl Accs {
    fn new(op: ReduceOp, dt: DType, n: usize) -> Accs {
        match plain_start(op, dt) {
            Some(start) => Accs::Plain(vec![start; n]),
            None => Accs::Any(vec![Acc::Empty; n]),
        }
    }

    /// Fold `v[at..]`, reduction step `k`, one value into each accumulator.
    fn fold(&mut self, op: ReduceOp, v: &Vals, at: usize, k: usize, wrap: fn(i64) -> i64) {
        match (self, v) {
            (Accs::Plain(a), Vals::F(x)) => {
                let x = &x[at..at + a.len()];
                match op {
                    ReduceOp::Sum => a.iter_mut().zip(x).for_each(|(a, &x)| *a += x),
                    ReduceOp::Max => a.iter_mut().zip(x).for_each(|(a, &x)| *a = f32_fold(ReduceOp::Max, *a, x)),
                    _ => a.iter_mut().zip(x).for_each(|(a, &x)| *a = f32_fold(ReduceOp::Min, *a, x)),
                }
            }
            (Accs::Any(a), v) => a.iter_mut().enumerate().for_each(|(p, a)| fold_one(op, a, v, at + p, k, wrap)),
            // Plain accumulators are made for f32 expressions only.
            (Accs::Plain(_), _) => {}
        }
    }

    fn finish(self) -> Vec<Acc> {
        match self {
            Accs::Plain(a) => a.into_iter().map(|x| Acc::F(x, 0)).collect(),
            Accs::Any(a) => a,
        }
    }
}

/// Outputs `(o, j)` folding input elements `(o * len + k) * n + j` over `k`, in order:
/// leading axes reduced (`outer` = 1), or a block of reduced axes between kept ones
/// (window pooling's `[N, C, K, OH, OW]` over `K`: walked element by element, folding
/// into every output of each range, a 3x3 max pool over 24 channels of 112x112 took
/// 19.5 ms; a row of outputs a step, 4.2 ms).
fn columns(
    prog: &Program,
    op: ReduceOp,
    (outer, n): (usize, usize),
    len: usize,
    wrap: fn(i64) -> i64,
) -> Result<Vec<Acc>> {
    if outer > 1 || n >= CHUNK / 4 {
        // Blocks of at most a chunk of one outer index's outputs; each walks down the
        // reduced rows, several at once where the block is a whole row shorter than a
        // chunk.
        let width = n.min(CHUNK);
        let per_o = n.div_ceil(width);
        let parts = par::map(outer * per_o, par::worth(outer * n * len), |b| {
            let (o, j0) = (b / per_o, (b % per_o) * width);
            let w = width.min(n - j0);
            let mut accs = Accs::new(op, prog.dtype(), w);
            let rows = if per_o == 1 { (CHUNK / n).max(1) } else { 1 };
            let mut k = 0;
            while k < len {
                let kk = rows.min(len - k);
                let v = prog.eval(Idx::Range((o * len + k) * n + j0, (kk - 1) * n + w))?;
                for r in 0..kk {
                    accs.fold(op, &v, r * n, k + r, wrap);
                }
                k += kk;
            }
            Ok(accs.finish())
        })?;
        return Ok(joined(parts));
    }
    // Few outputs: blocks of whole input rows, combined in order.
    let per = (CHUNK / n).max(1);
    let blocks = len.div_ceil(per);
    let parts = par::map(blocks, par::worth(n * len), |b| {
        let (k0, k1) = (b * per, ((b + 1) * per).min(len));
        let v = prog.eval(Idx::Range(k0 * n, (k1 - k0) * n))?;
        let mut accs = vec![Acc::Empty; n];
        for k in k0..k1 {
            for (j, a) in accs.iter_mut().enumerate() {
                fold_one(op, a, &v, (k - k0) * n + j, k, wrap);
            }
        }
        Ok(accs)
    })?;
    let mut out = vec![Acc::Empty; n];
    for p in parts {
        for (o, a) in out.iter_mut().zip(p) {
            *o = combine(op, *o, a, wrap);
        }
    }
    Ok(out)
}

/// Any other axis set (natively; the browser's build has the per-element walk below).
/// The input splits at an axis into outer indices (the axes before it) and blocks (the
/// axes from it on: about a chunk, or the innermost axis alone however long). A block's
/// positions are listed once, by reduction step and then output (`order`), so the walk
/// folds each step into a row of independent outputs, each output's elements in
/// reduction order. Outer indices are read in ranges spread over threads; where the
/// outer axes include reduced ones, each range folds into all the outputs and the ranges
/// combine in order.
#[cfg(not(target_arch = "wasm32"))]
fn in_order(
    prog: &Program,
    op: ReduceOp,
    xd: &[usize],
    axes: &[usize],
    first: usize,
    wrap: fn(i64) -> i64,
) -> Result<Vec<Acc>> {
    let rank = xd.len();
    let mut s = first;
    while s + 1 < rank && xd[s..].iter().product::<usize>() > CHUNK {
        s += 1;
    }
    let reduced = |d: usize| axes.contains(&d);
    // Every axis's output stride (0 on reduced axes) and reduction-index stride (0 on
    // kept axes).
    let strides = |red: bool| -> Vec<usize> {
        let dims: Vec<usize> = (0..rank).map(|d| if reduced(d) == red { xd[d] } else { 1 }).collect();
        strides_of(&dims).into_iter().enumerate().map(|(d, st)| if reduced(d) == red { st } else { 0 }).collect()
    };
    let (os, rs) = (strides(false), strides(true));
    let n_out: usize = (0..rank).filter(|&d| !reduced(d)).map(|d| xd[d]).product();
    let (outer, block): (usize, usize) = (xd[..s].iter().product(), xd[s..].iter().product());
    // Output and reduction offsets of positions `i` over axes `from..to`.
    let offsets = |i: usize, from: usize, to: usize, c: &mut [usize]| -> (usize, usize) {
        crate::shape::unravel(i, &xd[from..to], c);
        c.iter().enumerate().fold((0, 0), |(o, r), (j, &x)| (o + x * os[from + j], r + x * rs[from + j]))
    };
    // A block's positions by reduction offset, then output: `order[k * outs + j]` is
    // where output j's k-th element lies (each output of a block has the same count).
    let mut c = vec![0; rank];
    let outs = (s..rank).filter(|&d| !reduced(d)).map(|d| xd[d]).product::<usize>();
    let mut order = vec![0; block];
    for q in 0..block {
        let (o, k) = offsets(q, s, rank, &mut c[s..]);
        order[k * outs + o] = q;
    }
    let spread = (0..s).any(reduced);
    // Ranges of whole blocks, about a chunk each; with reduced outer axes, a few ranges
    // (each holds every output), or one where the outputs are many.
    let per = match spread {
        true if n_out <= CHUNK * 64 => outer.div_ceil(par::threads() * 4),
        true => outer,
        false => (CHUNK / block).max(1),
    };
    let ranges = outer.div_ceil(per);
    // f32 sums, maxima and minima fold into plain floats.
    let plain = plain_start(op, prog.dtype());
    let parts = par::map(ranges, par::worth(outer * block), |b| {
        let (o0, o1) = (b * per, ((b + 1) * per).min(outer));
        let mut c = vec![0; s];
        let bases: Vec<(usize, usize)> = (o0..o1).map(|o| offsets(o, 0, s, &mut c)).collect();
        // Outputs this range writes start at `lo` (all of them where reduced axes are outer).
        let lo = if spread { 0 } else { bases.first().map_or(0, |b| b.0) };
        let n = if spread { n_out } else { (o1 - o0) * (n_out / outer) };
        Ok(match plain {
            Some(start) => {
                let mut vals = vec![start; n];
                walk_blocks(prog, o0 * block, &bases, &order, outs, lo, |o, v, p, _| {
                    if let Vals::F(x) = v {
                        vals[o] = f32_fold(op, vals[o], x[p]);
                    }
                })?;
                vals.into_iter().map(|x| Acc::F(x, 0)).collect::<Vec<_>>()
            }
            None => {
                let mut accs = vec![Acc::Empty; n];
                walk_blocks(prog, o0 * block, &bases, &order, outs, lo, |o, v, p, r| {
                    fold_one(op, &mut accs[o], v, p, r, wrap)
                })?;
                accs
            }
        })
    })?;
    if !spread {
        return Ok(joined(parts));
    }
    let all = parts.into_iter().reduce(|a, b| a.into_iter().zip(b).map(|(x, y)| combine(op, x, y, wrap)).collect());
    Ok(all.unwrap_or_default())
}

/// [`fold_f`] on plain floats, without branches on the values: NaN wins (a NaN `a`
/// is never replaced, since no comparison with it holds).
#[inline(always)]
fn f32_fold(op: ReduceOp, a: f32, v: f32) -> f32 {
    let keep = match op {
        ReduceOp::Sum => return a + v,
        ReduceOp::Max => {
            if v > a {
                v
            } else {
                a
            }
        }
        _ => {
            if v < a {
                v
            } else {
                a
            }
        }
    };
    if v.is_nan() && !a.is_nan() {
        v
    } else {
        keep
    }
}

/// [`in_order`]'s walk over one range of outer indices (`bases`: each one's output and
/// reduction-index base) from input element `start`: `fold(output - lo, values,
/// position in them, reduction index)` for every element, each output's in reduction
/// order, walked by `order` over blocks of `outs` outputs, evaluated a group of whole
/// blocks (about a chunk, or one longer block) at a time.
#[cfg(not(target_arch = "wasm32"))]
fn walk_blocks(
    prog: &Program,
    start: usize,
    bases: &[(usize, usize)],
    order: &[usize],
    outs: usize,
    lo: usize,
    mut fold: impl FnMut(usize, &Vals, usize, usize),
) -> Result<()> {
    let block = order.len();
    let per = (CHUNK / block).max(1);
    for (g, group) in bases.chunks(per).enumerate() {
        let v = prog.eval(Idx::Range(start + g * per * block, group.len() * block))?;
        for (b, &(ob, rb)) in group.iter().enumerate() {
            for (k, row) in order.chunks(outs).enumerate() {
                for (j, &q) in row.iter().enumerate() {
                    fold(ob + j - lo, &v, b * block + q, rb + k);
                }
            }
        }
    }
    Ok(())
}

/// Any other axis set, in the browser's build (smaller than the native walk, for its
/// size budget): the input read in order, in blocks of whole indices of the axes before
/// the first reduced one (`first`), each element folded into its output as it comes (so,
/// for each output, in reduction order).
#[cfg(target_arch = "wasm32")]
fn in_order(
    prog: &Program,
    op: ReduceOp,
    xd: &[usize],
    axes: &[usize],
    first: usize,
    wrap: fn(i64) -> i64,
) -> Result<Vec<Acc>> {
    let sub = &xd[first..];
    let outer: usize = xd[..first].iter().product();
    let block: usize = sub.iter().product();
    let reduced = |j: usize| axes.contains(&(first + j));
    // Over `sub`: the output's strides (0 on reduced axes) and the reduction index's
    // (0 on kept axes).
    let kept_dims: Vec<usize> = sub.iter().enumerate().map(|(j, &s)| if reduced(j) { 1 } else { s }).collect();
    let red_dims: Vec<usize> = sub.iter().enumerate().map(|(j, &s)| if reduced(j) { s } else { 1 }).collect();
    let os: Vec<usize> =
        strides_of(&kept_dims).iter().enumerate().map(|(j, &s)| if reduced(j) { 0 } else { s }).collect();
    let rs: Vec<usize> =
        strides_of(&red_dims).iter().enumerate().map(|(j, &s)| if reduced(j) { s } else { 0 }).collect();
    let outs: usize = kept_dims.iter().product();
    let per = (CHUNK / block.max(1)).max(1);
    let parts = par::map(outer.div_ceil(per), par::worth(outer * block), |b| {
        let (o0, o1) = (b * per, ((b + 1) * per).min(outer));
        let mut accs = vec![Acc::Empty; (o1 - o0) * outs];
        let total = (o1 - o0) * block;
        let mut c = vec![0usize; sub.len()];
        let (mut base, mut oi, mut ri, mut pos) = (0, 0, 0, 0);
        while pos < total {
            let n = CHUNK.min(total - pos);
            let v = prog.eval(Idx::Range(o0 * block + pos, n))?;
            for p in 0..n {
                fold_one(op, &mut accs[base + oi], &v, p, ri, wrap);
                let mut d = sub.len();
                while d > 0 {
                    d -= 1;
                    (c[d], oi, ri) = (c[d] + 1, oi + os[d], ri + rs[d]);
                    if c[d] < sub[d] {
                        break;
                    }
                    (c[d], oi, ri) = (0, oi - os[d] * sub[d], ri - rs[d] * sub[d]);
                    if d == 0 {
                        base += outs;
                    }
                }
            }
            pos += n;
        }
        Ok(accs)
    })?;
    Ok(joined(parts))
}

/// `Op::SegmentReduce` over `values` (`[N, D]`, f32) by `offsets` (`[S + 1]`): sums in
/// f32 in row order, max and argmax keep the first maximum (NaN the maximum); empty
/// segments give 0 (argmax -1). Segments run on rayon's threads.
pub(crate) fn segment(op: ReduceOp, values: &[f32], offsets: &[f64], d: usize) -> HostBuffer {
    let n = values.len().checked_div(d).unwrap_or(0);
    let s = offsets.len().saturating_sub(1);
    let range = |seg: usize| {
        let start = (offsets[seg].max(0.0) as usize).min(n);
        (start, (offsets[seg + 1].max(0.0) as usize).clamp(start, n))
    };
    let argmax_of = |seg: usize, c: usize| -> Option<(usize, f32)> {
        let (start, end) = range(seg);
        let mut best: Option<(usize, f32)> = None;
        for k in start..end {
            let v = values[k * d + c];
            if best.is_none_or(|(_, b)| !b.is_nan() && (v > b || v.is_nan())) {
                best = Some((k, v));
            }
        }
        best
    };
    match op {
        ReduceOp::ArgMax => {
            let mut out = vec![0i32; s * d];
            par::for_rows(&mut out, d.max(1), |seg, row| {
                for (c, o) in row.iter_mut().enumerate() {
                    *o = argmax_of(seg, c).map_or(-1, |(k, _)| k as i32);
                }
            });
            HostBuffer::I32(out.into())
        }
        _ => {
            let mut out = HostBuffer::zeros(DType::F32, s * d).into_f32();
            par::for_rows(&mut out, d.max(1), |seg, row| {
                if op == ReduceOp::Max {
                    for (c, o) in row.iter_mut().enumerate() {
                        *o = argmax_of(seg, c).map_or(0.0, |(_, v)| v);
                    }
                    return;
                }
                let (start, end) = range(seg);
                for k in start..end {
                    for (o, v) in row.iter_mut().zip(&values[k * d..(k + 1) * d]) {
                        *o += v;
                    }
                }
            });
            HostBuffer::F32(out)
        }
    }
}

/// The buffer `[R, D]` whose rows `values` (`[N, D]`) are
/// ([`gathered_rows`](crate::graph::schedule::gathered_rows)), and which row of it each
/// of the `N` is. An index out of range is the error the gather would give.
pub(crate) fn gathered_rows(
    values: &Tensor,
    is_leaf: &dyn Fn(&Tensor) -> bool,
    buffer: &dyn Fn(&Tensor) -> Result<Arc<CpuBuffer>>,
) -> Result<Option<(Arc<CpuBuffer>, Vec<usize>)>> {
    let Some((table, gathers)) = crate::graph::schedule::gathered_rows(values, is_leaf) else { return Ok(None) };
    let mut rows: Vec<usize> = (0..values.dims()[0]).collect();
    for t in &gathers {
        let (src, ids) = (&t.node().inputs[0], &t.node().inputs[1]);
        let index = Program::compile(ids, false, is_leaf, buffer)?.run(ids.numel())?.to_f64(ids.numel());
        let size = src.dims().first().copied().unwrap_or(0);
        if rows.iter().any(|&r| r >= index.len()) {
            return Ok(None);
        }
        for r in rows.iter_mut() {
            let v = index[*r];
            if v < 0.0 || v as usize >= size {
                let location = t.location();
                return Err(Error::IndexOutOfRange { op: "index_select", index: v as i64, axis: 0, size, location });
            }
            *r = v as usize;
        }
    }
    Ok(Some((buffer(&table)?, rows)))
}

/// [`segment`]'s sum over rows of `table` (`[R, D]`): segment `s` sums rows
/// `rows[k]` for `k` in its range, in order, in f32 (the same values and order as the
/// gathered rows would give). Each thread prefetches its next rows.
pub(crate) fn segment_sum_rows(table: &[f32], rows: &[usize], offsets: &[f64], d: usize) -> HostBuffer {
    let n = rows.len();
    let s = offsets.len().saturating_sub(1);
    let range = |seg: usize| {
        let start = (offsets[seg].max(0.0) as usize).min(n);
        (start, (offsets[seg + 1].max(0.0) as usize).clamp(start, n))
    };
    const AHEAD: usize = 8;
    let mut out = HostBuffer::zeros(DType::F32, s * d).into_f32();
    par::for_rows(&mut out, d.max(1), |seg, row| {
        let (start, end) = range(seg);
        for k in start..end {
            if let Some(&next) = rows.get(k + AHEAD) {
                memory::prefetch_run(table, next * d, d);
            }
            let r = rows[k] * d;
            for (o, v) in row.iter_mut().zip(&table[r..r + d]) {
                *o += v;
            }
        }
    });
    HostBuffer::F32(out)
}

/// `Op::TopK`: the indices of the `k` largest of each row of `n` (largest first, ties
/// to the lower index, NaN the largest), rows on rayon's threads.
pub(crate) fn topk(values: &[f32], n: usize, k: usize) -> HostBuffer {
    let rows = values.len().checked_div(n).unwrap_or(0);
    let mut out = vec![0i32; rows * k];
    let before = |a: f32, ia: usize, b: f32, ib: usize| -> bool {
        match (a.is_nan(), b.is_nan()) {
            (true, false) => true,
            (false, true) => false,
            (true, true) => ia < ib,
            _ => a > b || (a == b && ia < ib),
        }
    };
    par::for_rows(&mut out, k.max(1), |r, dst| {
        let row = &values[r * n..(r + 1) * n];
        let mut best: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
        for (j, &v) in row.iter().enumerate() {
            if best.len() == k && !before(v, j, best[k - 1].0, best[k - 1].1) {
                continue;
            }
            let p = best.partition_point(|&(b, ib)| before(b, ib, v, j));
            best.insert(p, (v, j));
            best.truncate(k);
        }
        for (o, (_, j)) in dst.iter_mut().zip(&best) {
            *o = *j as i32;
        }
    });
    HostBuffer::I32(out.into())
}
