//! Layers: Conv and ConvInteger (1-D and 2-D, groups, dilations, asymmetric and auto
//! pads), ConvTranspose, MaxPool/AveragePool (ceil mode, count_include_pad, dilations)
//! over im2col windows, the global pools, and the normalisations.

use super::{as_float, axis, dev, input, opt, to_usize, Cx};
use crate::graph::Window;
use crate::onnx::read::Node;
use crate::onnx::value::{Elem, Value};
use crate::ops::nn::Conv2dOptions;
use crate::{DType, Result, Tensor};

/// Spatial geometry of a 1-D or 2-D window op, as 2-D (a 1-D op gets a leading 1).
struct Geometry {
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    /// The dilated kernel extents, `(kernel - 1) * dilation + 1`.
    span: [usize; 2],
    /// `[top, left, bottom, right]`.
    pads: [usize; 4],
}

/// Read kernel, strides, dilations and pads (resolving `auto_pad`) for `spatial` input
/// sizes. `ceil` adds no pad here; pools handle it.
fn geometry(n: &Node, spatial: &[usize], kernel: &[usize]) -> Result<Geometry> {
    let k = spatial.len();
    if !(1..=2).contains(&k) {
        return Err(n.err("only 1-D and 2-D windows are supported"));
    }
    let list = |name: &str, default: usize| -> Result<Vec<usize>> {
        match n.attr_ints(name) {
            Some(v) if v.len() == k => v.iter().map(|&x| to_usize(n, x, name)).collect(),
            Some(v) => Err(n.err(format!("{name} {v:?} for {k} spatial axes"))),
            None => Ok(vec![default; k]),
        }
    };
    let stride = list("strides", 1)?;
    let dilation = list("dilations", 1)?;
    if stride.contains(&0) || dilation.contains(&0) {
        return Err(n.err("strides and dilations must be positive"));
    }
    let eff = spans(n, kernel, &dilation)?;
    let mut pads = vec![0usize; 2 * k];
    match n.attr_str("auto_pad", "NOTSET").as_str() {
        "SAME_UPPER" | "SAME_LOWER" => {
            let upper = n.attr_str("auto_pad", "") == "SAME_UPPER";
            for i in 0..k {
                let out = spatial[i].div_ceil(stride[i]);
                let total = out
                    .saturating_sub(1)
                    .checked_mul(stride[i])
                    .and_then(|x| x.checked_add(eff[i]))
                    .ok_or_else(|| n.err("the convolution's size overflows"))?
                    .saturating_sub(spatial[i]);
                let small = total / 2;
                let (b, e) = if upper { (small, total - small) } else { (total - small, small) };
                pads[i] = b;
                pads[i + k] = e;
            }
        }
        "VALID" => {}
        _ => {
            if let Some(p) = n.attr_ints("pads") {
                if p.len() != 2 * k {
                    return Err(n.err(format!("pads {p:?} for {k} spatial axes")));
                }
                for (i, &x) in p.iter().enumerate() {
                    pads[i] = to_usize(n, x, "pad")?;
                }
            }
        }
    }
    Ok(if k == 1 {
        Geometry {
            kernel: [1, kernel[0]],
            stride: [1, stride[0]],
            dilation: [1, dilation[0]],
            span: [1, eff[0]],
            pads: [0, pads[0], 0, pads[1]],
        }
    } else {
        Geometry {
            kernel: [kernel[0], kernel[1]],
            stride: [stride[0], stride[1]],
            dilation: [dilation[0], dilation[1]],
            span: [eff[0], eff[1]],
            pads: [pads[0], pads[1], pads[2], pads[3]],
        }
    })
}

/// Each spatial axis's dilated kernel extent, `(kernel - 1) * dilation + 1`: one kernel
/// size per axis, each at least 1, and no overflow.
fn spans(n: &Node, kernel: &[usize], dilation: &[usize]) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(kernel.len());
    for (&k, &d) in kernel.iter().zip(dilation) {
        match k.checked_sub(1).and_then(|x| x.checked_mul(d)).and_then(|x| x.checked_add(1)) {
            Some(e) => out.push(e),
            None => break,
        }
    }
    if out.len() != dilation.len() || kernel.len() != dilation.len() {
        return Err(n.err("kernel_shape needs a size of at least 1 for each spatial axis (and no overflow)"));
    }
    Ok(out)
}

/// The input as `[N, C, H, W]` (a 1-D input gets `H = 1`).
fn as_4d(n: &Node, x: &Tensor) -> Result<Tensor> {
    match x.rank() {
        3 => Ok(x.unsqueeze(2)),
        4 => Ok(x.clone()),
        r => Err(n.err(format!("{}-D inputs are not supported (1-D and 2-D are)", r.saturating_sub(2)))),
    }
}

fn back(y: Tensor, rank: usize) -> Tensor {
    if rank == 3 {
        y.squeeze(2)
    } else {
        y
    }
}

pub(crate) fn conv(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let rank = v.dims().len();
    if !(3..=4).contains(&rank) {
        return Err(n.err("only 1-D and 2-D convolutions are supported"));
    }
    let integer = n.op == "ConvInteger";
    let mut x = cx.tin(n, ins, 0)?;
    let mut w = cx.tin(n, ins, 1)?;
    let mut bias = if integer { None } else { cx.topt(n, ins, 2)? };
    if w.rank() != rank {
        return Err(n.err(format!("weight of rank {} for an input of rank {rank}", w.rank())));
    }
    if integer {
        x = as_float(&x);
        w = as_float(&w);
        if let Some(z) = cx.topt(n, ins, 2)? {
            x = x.sub(&as_float(&z));
        }
        if let Some(z) = cx.topt(n, ins, 3)? {
            let z = as_float(&z);
            let z = if z.numel() > 1 { z.reshape(vec![z.numel(), 1, 1, 1][..w.rank()].to_vec()) } else { z };
            w = w.sub(&z);
        }
        // A zero point that does not broadcast fails here, not as a weight of no axes.
        x.check()?;
        w.check()?;
    }
    let wd = w.dims().to_vec();
    let kernel: Vec<usize> = match n.attr_ints("kernel_shape") {
        Some(k) => k.iter().map(|&x| to_usize(n, x, "kernel size")).collect::<Result<_>>()?,
        None => wd[2..].to_vec(),
    };
    let g = geometry(n, &v.dims()[2..], &kernel)?;
    let groups = to_usize(n, n.attr_int("group", 1), "group")?;
    let x4 = as_4d(n, &x)?;
    let w4 = as_4d(n, &w)?;
    if w4.dtype() != x4.dtype() {
        w = w4.cast(x4.dtype());
    } else {
        w = w4;
    }
    let [t, l, b, r] = g.pads;
    let (x4, padding) =
        if t == b && l == r { (x4, (t, l)) } else { (x4.pad(&[(0, 0), (0, 0), (t, b), (l, r)], 0.0), (0, 0)) };
    if let Some(bb) = &bias {
        if bb.dtype() != x4.dtype() {
            bias = Some(bb.cast(x4.dtype()));
        }
    }
    let opts =
        Conv2dOptions { stride: (g.stride[0], g.stride[1]), padding, dilation: (g.dilation[0], g.dilation[1]), groups };
    let y = back(x4.conv2d(&w, bias.as_ref(), opts), rank);
    if integer {
        return Ok(vec![dev(y.round().cast(DType::I32), Elem::I32)]);
    }
    Ok(vec![dev(y, v.elem())])
}

pub(crate) fn conv_transpose(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let rank = v.dims().len();
    let x = as_4d(n, &cx.tin(n, ins, 0)?)?;
    let w = cx.tin(n, ins, 1)?;
    if w.rank() != rank {
        return Err(n.err(format!("weight of rank {} for an input of rank {rank}", w.rank())));
    }
    let w = as_4d(n, &w)?;
    let w = if w.dtype() != x.dtype() { w.cast(x.dtype()) } else { w };
    let bias = cx.topt(n, ins, 2)?.map(|b| if b.dtype() != x.dtype() { b.cast(x.dtype()) } else { b });
    let k = rank - 2;
    let wd = w.dims().to_vec();
    let kernel: Vec<usize> = match n.attr_ints("kernel_shape") {
        Some(ks) => ks.iter().map(|&x| to_usize(n, x, "kernel size")).collect::<Result<_>>()?,
        None => wd[4 - k..].to_vec(),
    };
    let list = |name: &str, default: usize| -> Result<Vec<usize>> {
        match n.attr_ints(name) {
            Some(v) if v.len() == k => v.iter().map(|&x| to_usize(n, x, name)).collect(),
            Some(v) => Err(n.err(format!("{name} {v:?} for {k} spatial axes"))),
            None => Ok(vec![default; k]),
        }
    };
    let stride = list("strides", 1)?;
    let dilation = list("dilations", 1)?;
    let mut out_pad = list("output_padding", 0)?;
    let spatial = &v.dims()[2..];
    // (A zero stride or dilation, or an empty input, is refused by conv_transpose2d.)
    let eff = spans(n, &kernel, &dilation)?;
    let mut full = Vec::with_capacity(k);
    for i in 0..k {
        let f = spatial[i].saturating_sub(1).checked_mul(stride[i]).and_then(|x| x.checked_add(eff[i]));
        full.push(f.ok_or_else(|| n.err("the output size overflows"))?);
    }
    let mut pads = vec![0usize; 2 * k];
    let auto = n.attr_str("auto_pad", "NOTSET");
    if let Some(os) = n.attr_ints("output_shape") {
        let os: Vec<usize> =
            os.iter().rev().take(k).rev().map(|&x| to_usize(n, x, "output size")).collect::<Result<_>>()?;
        if os.len() != k {
            return Err(n.err("output_shape needs a size for each spatial axis"));
        }
        for i in 0..k {
            let have = full[i].saturating_add(out_pad[i]);
            if have < os[i] {
                // The output is larger than the full convolution: grow the end.
                out_pad[i] += os[i] - have;
                continue;
            }
            let total = have - os[i];
            let (b, e) =
                if auto == "SAME_UPPER" { (total / 2, total - total / 2) } else { (total - total / 2, total / 2) };
            pads[i] = b;
            pads[i + k] = e;
        }
    } else if auto == "SAME_UPPER" || auto == "SAME_LOWER" {
        for i in 0..k {
            let target = spatial[i].saturating_mul(stride[i]);
            let total = full[i].saturating_add(out_pad[i]).saturating_sub(target);
            let (b, e) =
                if auto == "SAME_UPPER" { (total / 2, total - total / 2) } else { (total - total / 2, total / 2) };
            pads[i] = b;
            pads[i + k] = e;
        }
    } else if let Some(p) = n.attr_ints("pads") {
        if p.len() != 2 * k {
            return Err(n.err(format!("pads {p:?} for {k} spatial axes")));
        }
        for (i, &x) in p.iter().enumerate() {
            pads[i] = to_usize(n, x, "pad")?;
        }
    }
    let at = |v: &[usize], i: usize| {
        if k == 1 {
            if i == 0 {
                1
            } else {
                v[0]
            }
        } else {
            v[i]
        }
    };
    let geo = |v: &[usize]| (at(v, 0), at(v, 1));
    let (pb, pe): (Vec<usize>, Vec<usize>) = (pads[..k].to_vec(), pads[k..].to_vec());
    let sym = pb == pe;
    let groups = to_usize(n, n.attr_int("group", 1), "group")?;
    let opts = Conv2dOptions {
        stride: geo(&stride),
        padding: if sym {
            if k == 1 {
                (0, pb[0])
            } else {
                (pb[0], pb[1])
            }
        } else {
            (0, 0)
        },
        dilation: geo(&dilation),
        groups,
    };
    let op = if k == 1 { (0, out_pad[0]) } else { (out_pad[0], out_pad[1]) };
    let mut y = x.conv_transpose2d(&w, bias.as_ref(), opts, op);
    y.check()?;
    if !sym {
        for i in 0..k {
            let a = 4 - k + i;
            let len = y.dims()[a] as i64 - pb[i] as i64 - pe[i] as i64;
            if len <= 0 {
                return Err(n.err("pads remove the whole output"));
            }
            y = y.narrow(a as isize, pb[i], len as usize);
        }
    }
    Ok(vec![dev(back(y, rank), v.elem())])
}

pub(crate) fn pool(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let rank = v.dims().len();
    if n.wants(1) {
        return Err(n.err("MaxPool's Indices output is not supported"));
    }
    let max = n.op == "MaxPool";
    let kernel: Vec<usize> = n
        .attr_ints("kernel_shape")
        .ok_or_else(|| n.err("kernel_shape is required"))?
        .iter()
        .map(|&x| to_usize(n, x, "kernel size"))
        .collect::<Result<_>>()?;
    if kernel.len() + 2 != rank || kernel.contains(&0) {
        return Err(n.err(format!("kernel_shape {kernel:?} for an input of rank {rank}")));
    }
    let spatial = v.dims()[2..].to_vec();
    let g = geometry(n, &spatial, &kernel)?;
    let x = as_4d(n, &cx.tin(n, ins, 0)?)?;
    let (h, w) = (x.dims()[2], x.dims()[3]);
    let ceil = n.attr_int("ceil_mode", 0) != 0;
    // Output size per axis, and any extra end padding that ceil mode needs.
    let out = |i: usize, len: usize, pb: usize, pe: usize| -> Result<(usize, usize)> {
        let eff = g.span[i];
        let span = len.checked_add(pb).and_then(|x| x.checked_add(pe)).ok_or_else(|| n.err("pads overflow"))?;
        if span < eff {
            return Err(n.err(format!("a window of {eff} does not fit {len} + pads")));
        }
        let s = g.stride[i];
        let mut o = if ceil { (span - eff).div_ceil(s) + 1 } else { (span - eff) / s + 1 };
        if ceil && (o - 1).saturating_mul(s) >= len + pb {
            o -= 1;
        }
        let need = o.saturating_sub(1).saturating_mul(s).saturating_add(eff).saturating_sub(span);
        Ok((o, need))
    };
    let [t, l, b, r] = g.pads;
    let (oh, eh) = out(0, h, t, b)?;
    let (ow, ew) = out(1, w, l, r)?;
    if oh.checked_mul(ow).is_none_or(|hw| hw > 1 << 31) {
        return Err(n.err("the pooled output is too large"));
    }
    let pad_value = if max { f64::NEG_INFINITY } else { 0.0 };
    // Only the taps that reach the input in some window are read (`live_taps`); the
    // input is cropped or padded to what those taps span.
    let taps = [
        live_taps(h, t, oh, g.stride[0], g.dilation[0], g.kernel[0]),
        live_taps(w, l, ow, g.stride[1], g.dilation[1], g.kernel[1]),
    ];
    let p = n.attr_int("p", 2) as f64;
    let reduced = match taps {
        [Some((ah, kh)), Some((aw, kw))] => {
            let mut padded = x.clone();
            let mut pads = [(0, 0); 4];
            for (axis, (len, pad, outs, first, kept)) in
                [(h, t, oh, ah, kh), (w, l, ow, aw, kw)].into_iter().enumerate()
            {
                let (s, d) = (g.stride[axis], g.dilation[axis]);
                let shift = first * d;
                let crop = shift.saturating_sub(pad);
                let before = pad.saturating_sub(shift);
                let need = (outs - 1).saturating_mul(s).saturating_add((kept - 1).saturating_mul(d)).saturating_add(1);
                let kept_len = (len - crop).min(need.saturating_sub(before));
                padded = padded.narrow(2 + axis as isize, crop, kept_len);
                pads[2 + axis] = (before, need - before - kept_len);
            }
            if pads.iter().any(|&(a, b)| a + b > 0) {
                padded = padded.pad(&pads, pad_value);
            }
            let window = Window {
                kernel: (kh, kw),
                stride: (g.stride[0], g.stride[1]),
                padding: (0, 0),
                dilation: (g.dilation[0], g.dilation[1]),
            };
            let cols = padded.im2col(window, pad_value);
            if n.op == "LpPool" {
                cols.abs().pow_scalar(p).sum(&[2], false).pow_scalar(1.0 / p)
            } else if max {
                cols.max(&[2], false)
            } else {
                cols.sum(&[2], false)
            }
        }
        // No window reaches the input: every output is the pads' reduction.
        _ => Tensor::full(pad_value, vec![x.dims()[0], x.dims()[1], oh, ow], x.dtype(), cx.dev),
    };
    let y = if max || n.op == "LpPool" {
        reduced
    } else {
        let sum = reduced;
        let include = n.attr_int("count_include_pad", 0) != 0;
        if eh + ew == 0 && (include || t + b + l + r == 0) {
            sum.div_scalar(g.kernel[0] as f64 * g.kernel[1] as f64)
        } else {
            // How many elements each window averages: inside the input, or inside the
            // declared pads too with count_include_pad, never in ceil mode's extra. A
            // window's count is the product of its two axes' counts, multiplied on the
            // device. A window with none sums nothing, so any divisor serves it.
            let (lo_h, hi_h) = if include { (0, h + t + b) } else { (t, t + h) };
            let (lo_w, hi_w) = if include { (0, w + l + r) } else { (l, l + w) };
            let counts = |outs: usize, axis: usize, lo: usize, hi: usize| -> Vec<f32> {
                let (s, d, k) = (g.stride[axis], g.dilation[axis], g.kernel[axis]);
                (0..outs).map(|i| window_count(i, s, d, k, lo, hi).max(1) as f32).collect()
            };
            let rows = Tensor::from_slice(&counts(oh, 0, lo_h, hi_h), [1, 1, oh, 1], cx.dev);
            let cols = Tensor::from_slice(&counts(ow, 1, lo_w, hi_w), [1, 1, 1, ow], cx.dev);
            sum.div(&rows.mul(&cols).cast(sum.dtype()))
        }
    };
    Ok(vec![dev(back(y, rank), v.elem())])
}

/// The taps along one axis that reach the input (`len` cells after `pad`) in at least
/// one of `outs` windows, as (first tap, count); `None` when no tap does. The others
/// read only pads, which hold the reduction's neutral value, so dropping them changes
/// nothing, and a huge `kernel_shape` with SAME pads costs the input's size, not its own.
fn live_taps(
    len: usize,
    pad: usize,
    outs: usize,
    stride: usize,
    dilation: usize,
    kernel: usize,
) -> Option<(usize, usize)> {
    // Tap a of window i reads padded cell i * stride + a * dilation.
    let last_start = outs.checked_sub(1)?.saturating_mul(stride);
    let first = pad.saturating_sub(last_start).div_ceil(dilation);
    let last = (pad.saturating_add(len).checked_sub(1)? / dilation).min(kernel.checked_sub(1)?);
    (first <= last).then(|| (first, last - first + 1))
}

/// How many positions of window `i` along one axis (`i * stride + a * dilation` for `a`
/// in `0..kernel`) lie in `lo..hi`. Counted in closed form, so a huge kernel from a file
/// costs nothing.
fn window_count(i: usize, stride: usize, dilation: usize, kernel: usize, lo: usize, hi: usize) -> usize {
    // The first a with start + a d >= lo, and the first with start + a d >= hi (a start
    // past usize is past both).
    let start = i.saturating_mul(stride);
    let first = |bound: usize| if start >= bound { 0 } else { (bound - start).div_ceil(dilation) };
    first(hi).min(kernel).saturating_sub(first(lo).min(kernel))
}

pub(crate) fn global_pool(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let axes: Vec<isize> = (2..v.dims().len() as isize).collect();
    let x = cx.tin(n, ins, 0)?;
    let y = if n.op == "GlobalMaxPool" { x.max(&axes, true) } else { x.mean(&axes, true) };
    Ok(vec![dev(y, v.elem())])
}

/// A per-channel `[C]` vector shaped to broadcast over `[N, C, ...]`.
fn per_channel(t: &Tensor, rank: usize) -> Tensor {
    let mut d = vec![t.numel()];
    d.extend(std::iter::repeat_n(1, rank.saturating_sub(2)));
    t.reshape(d)
}

pub(crate) fn batch_norm(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    if n.attr_int("training_mode", 0) != 0 || n.outputs.iter().skip(1).any(|o| !o.is_empty()) && cx.opset >= 14 {
        return Err(n.err("BatchNormalization in training mode is not supported (inference only)"));
    }
    let v = input(n, ins, 0)?;
    let rank = v.dims().len();
    let eps = n.attr_float("epsilon", 1e-5) as f64;
    let x = cx.tin(n, ins, 0)?;
    // Fold scale, bias, mean and variance into one multiply-add when all are constants.
    let hosts: Option<Vec<Vec<f64>>> =
        (1..5).map(|i| opt(ins, i).and_then(|v| v.as_host()).map(|h| h.floats())).collect();
    let (a, b) = match hosts {
        Some(p) if p.iter().all(|q| q.len() == p[0].len()) => {
            let c = p[0].len();
            let a: Vec<f32> = (0..c).map(|i| (p[0][i] / (p[3][i] + eps).sqrt()) as f32).collect();
            let b: Vec<f32> = (0..c).map(|i| (p[1][i] - p[2][i] * p[0][i] / (p[3][i] + eps).sqrt()) as f32).collect();
            (Tensor::from_slice(&a, [c], cx.dev), Tensor::from_slice(&b, [c], cx.dev))
        }
        _ => {
            let f = |i| -> Result<Tensor> { Ok(as_float(&cx.tin(n, ins, i)?).cast(DType::F32)) };
            let (s, bias, m, var) = (f(1)?, f(2)?, f(3)?, f(4)?);
            let a = s.mul(&var.add_scalar(eps).rsqrt());
            (a.clone(), bias.sub(&m.mul(&a)))
        }
    };
    let (a, b) = (per_channel(&a, rank).cast(x.dtype()), per_channel(&b, rank).cast(x.dtype()));
    Ok(vec![dev(x.mul(&a).add(&b), v.elem())])
}

/// `(x - mean) / sqrt(var + eps)` over `axes`, computed in f32.
fn normalise(x: &Tensor, axes: &[isize], eps: f64) -> (Tensor, Tensor, Tensor) {
    let xf = x.cast(DType::F32);
    let mean = xf.mean(axes, true);
    let c = xf.sub(&mean);
    let inv = c.square().mean(axes, true).add_scalar(eps).rsqrt();
    (c.mul(&inv), mean, inv)
}

pub(crate) fn instance_norm(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let rank = v.dims().len();
    let x = cx.tin(n, ins, 0)?;
    let axes: Vec<isize> = (2..rank as isize).collect();
    let (y, _, _) = normalise(&x, &axes, n.attr_float("epsilon", 1e-5) as f64);
    let s = per_channel(&as_float(&cx.tin(n, ins, 1)?), rank).cast(DType::F32);
    let b = per_channel(&as_float(&cx.tin(n, ins, 2)?), rank).cast(DType::F32);
    Ok(vec![dev(y.mul(&s).add(&b).cast(x.dtype()), v.elem())])
}

pub(crate) fn layer_norm(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let dims = v.dims().to_vec();
    let r = dims.len();
    let ax = axis(n, n.attr_int("axis", -1), r)?;
    let eps = n.attr_float("epsilon", 1e-5) as f64;
    let x = cx.tin(n, ins, 0)?;
    let scale = cx.tin(n, ins, 1)?;
    let bias = cx.topt(n, ins, 2)?;
    let inner: usize = dims[ax..].iter().product();
    let outer_dims = &dims[..ax];
    let stats_wanted = n.wants(1) || n.wants(2);
    let fits = |t: &Tensor| t.numel() == inner && t.dims().iter().rev().zip(dims.iter().rev()).all(|(a, b)| a == b);
    if !stats_wanted && fits(&scale) && bias.as_ref().is_none_or(fits) {
        // One fused kernel over the flattened normalised axes.
        let mut flat = outer_dims.to_vec();
        flat.push(inner);
        let xs = x.reshape(flat);
        let w = scale.reshape([inner]).cast(x.dtype());
        let b = bias.map(|b| b.reshape([inner]).cast(x.dtype()));
        let y = xs.layer_norm(Some(&w), b.as_ref(), eps);
        return Ok(vec![dev(y.reshape(dims), v.elem())]);
    }
    let axes: Vec<isize> = (ax as isize..r as isize).collect();
    let (y, mean, inv) = normalise(&x, &axes, eps);
    let mut y = y.mul(&scale.cast(DType::F32));
    if let Some(b) = bias {
        y = y.add(&b.cast(DType::F32));
    }
    let mut out = vec![dev(y.cast(x.dtype()), v.elem())];
    if n.wants(1) || n.wants(2) {
        out.push(dev(mean, Elem::F32));
        out.push(dev(inv, Elem::F32));
    }
    Ok(out)
}

pub(crate) fn group_norm(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let dims = v.dims().to_vec();
    let r = dims.len();
    let groups = to_usize(n, n.attr_int("num_groups", 0), "num_groups")?;
    if r < 3 || groups == 0 || dims[1] % groups != 0 {
        return Err(n.err(format!("{groups} groups for input {dims:?}")));
    }
    let c = dims[1];
    let x = cx.tin(n, ins, 0)?;
    let xg = x.reshape(vec![dims[0], groups, dims[1..].iter().product::<usize>() / groups]);
    let (y, _, _) = normalise(&xg, &[2], n.attr_float("epsilon", 1e-5) as f64);
    let y = y.reshape(dims.clone());
    let expand = |t: Tensor| -> Tensor {
        if t.numel() == groups && groups != c {
            let idx: Vec<i32> = (0..c).map(|i| (i / (c / groups)) as i32).collect();
            t.reshape([groups]).index_select(0, &Tensor::from_slice(&idx, [c], cx.dev))
        } else {
            t
        }
    };
    let s = per_channel(&expand(as_float(&cx.tin(n, ins, 1)?)), r).cast(DType::F32);
    let b = per_channel(&expand(as_float(&cx.tin(n, ins, 2)?)), r).cast(DType::F32);
    Ok(vec![dev(y.mul(&s).add(&b).cast(x.dtype()), v.elem())])
}

pub(crate) fn lrn(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let dims = v.dims().to_vec();
    if dims.len() < 3 {
        return Err(n.err("LRN needs [N, C, ...]"));
    }
    let size = to_usize(n, n.attr_int("size", 0), "size")?;
    if size == 0 {
        return Err(n.err("size must be positive"));
    }
    let (alpha, beta, bias) =
        (n.attr_float("alpha", 1e-4) as f64, n.attr_float("beta", 0.75) as f64, n.attr_float("bias", 1.0) as f64);
    let x = cx.tin(n, ins, 0)?;
    let (nb, c) = (dims[0], dims[1]);
    let hw: usize = dims[2..].iter().product();
    // A window reaching past the channels adds only zeros there, so it is cut to them
    // (a size of 2^40 from a file then costs what a size of 2c does).
    let pre = ((size - 1) / 2).min(c);
    let post = (size - 1 - (size - 1) / 2).min(c);
    // Sum of squares over a window of channels: im2col along the channel axis.
    let sq = as_float(&x).square().reshape(vec![nb, 1, c, hw]).pad(&[(0, 0), (0, 0), (pre, post), (0, 0)], 0.0);
    let win = Window { kernel: (pre + post + 1, 1), stride: (1, 1), padding: (0, 0), dilation: (1, 1) };
    let sums = sq.im2col(win, 0.0).sum(&[2], false).reshape(dims.clone());
    let denom = sums.mul_scalar(alpha / size as f64).add_scalar(bias).pow_scalar(beta);
    Ok(vec![dev(as_float(&x).div(&denom).cast(x.dtype()), v.elem())])
}

pub(crate) fn mean_variance_norm(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let r = v.dims().len();
    let axes: Vec<isize> = match n.attr_ints("axes") {
        Some(a) => a.iter().map(|&x| axis(n, x, r).map(|a| a as isize)).collect::<Result<_>>()?,
        None => [0, 2, 3].into_iter().filter(|&a| a < r as isize).collect(),
    };
    let x = as_float(&cx.tin(n, ins, 0)?);
    let mean = x.mean(&axes, true);
    let var = x.square().mean(&axes, true).sub(&mean.square());
    let y = x.sub(&mean).div(&var.sqrt().add_scalar(1e-9));
    Ok(vec![dev(y, v.elem())])
}

pub(crate) fn lp_norm(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let ax = axis(n, n.attr_int("axis", -1), v.dims().len())? as isize;
    let x = cx.tin(n, ins, 0)?;
    let norm = match n.attr_int("p", 2) {
        1 => x.abs().sum(&[ax], true),
        2 => x.square().sum(&[ax], true).sqrt(),
        p => return Err(n.err(format!("p = {p} (1 or 2)"))),
    };
    let y = Tensor::where_(&norm.eq_scalar(0.0), &x.zeros_like(), &x.div(&norm));
    Ok(vec![dev(y, v.elem())])
}

/// RMSNormalization (opset 23): `x / sqrt(mean(x^2 over axis..) + eps) * scale`.
pub(crate) fn rms_norm(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let dims = v.dims().to_vec();
    let r = dims.len();
    let ax = axis(n, n.attr_int("axis", -1), r)?;
    let eps = n.attr_float("epsilon", 1e-5) as f64;
    let x = cx.tin(n, ins, 0)?;
    let scale = cx.tin(n, ins, 1)?;
    let inner: usize = dims[ax..].iter().product();
    if scale.numel() == inner && x.dtype() == DType::F32 {
        let mut flat = dims[..ax].to_vec();
        flat.push(inner);
        let y = x.reshape(flat).rms_norm(Some(&scale.reshape([inner]).cast(DType::F32)), eps);
        return Ok(vec![dev(y.reshape(dims), v.elem())]);
    }
    let axes: Vec<isize> = (ax as isize..r as isize).collect();
    let xf = x.cast(DType::F32);
    let y = xf.mul(&xf.square().mean(&axes, true).add_scalar(eps).rsqrt()).mul(&scale.cast(DType::F32));
    Ok(vec![dev(y.cast(x.dtype()), v.elem())])
}
