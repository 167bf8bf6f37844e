//! Shapes and data movement: constants, Shape/Size/Range, Reshape and friends, Concat,
//! Split, Slice (negative steps too), Gather, Expand, Tile, Pad (constant, reflect,
//! edge, wrap), Trilu, DepthToSpace, OneHot, CumSum and Resize (nearest and linear).
//! Arguments that decide shapes must be known on the host; [`super::host`] makes sure
//! shape arithmetic is.

use super::host::{self, axes_arg, flatten_dims, reshape_dims, slice_plan, split_plan, squeeze_dims, unsqueeze_dims};
use super::{as_float, axis, dev, host_input, host_ints_opt, host_scalar, input, opt, to_usize, Cx};
use crate::onnx::read::{Attr, Node};
use crate::onnx::value::{Elem, HostTensor, Value};
use crate::{DType, Result, Tensor};

fn ints_tensor(v: &[i64], cx: &Cx) -> Tensor {
    let v: Vec<i32> = v.iter().map(|&x| x as i32).collect();
    let n = v.len();
    Tensor::from_slice(&v, [n], cx.dev)
}

pub(crate) fn constant(_: &Cx, n: &Node, _: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = match n.attrs.iter().next() {
        Some((k, Attr::Tensor(v))) if k == "value" => v.clone(),
        Some((k, Attr::Float(f))) if k == "value_float" => Value::host(HostTensor::scalar(Elem::F32, *f as f64)),
        Some((k, Attr::Int(i))) if k == "value_int" => Value::host(HostTensor::i64(vec![], vec![*i])?),
        Some((k, Attr::Floats(f))) if k == "value_floats" => Value::host(HostTensor::f32(vec![f.len()], f)?),
        Some((k, Attr::Ints(i))) if k == "value_ints" => Value::host(HostTensor::i64(vec![i.len()], i.clone())?),
        Some((k, _)) => return Err(n.err(format!("Constant's attribute '{k}' is not supported"))),
        None => return Err(n.err("Constant without a value")),
    };
    Ok(vec![v])
}

pub(crate) fn constant_of_shape(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let dims: Vec<usize> =
        host_input(n, ins, 0, "shape")?.ints().iter().map(|&d| to_usize(n, d, "dimension")).collect::<Result<_>>()?;
    let (elem, v) = match n.attrs.get("value") {
        Some(Attr::Tensor(t)) => {
            let h = t.as_host().ok_or_else(|| n.err("value must be a one-element tensor"))?;
            if h.numel() != 1 {
                return Err(n.err("value must be a one-element tensor"));
            }
            (h.elem, h.data.f(0))
        }
        _ => (Elem::F32, 0.0),
    };
    let total = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    match total {
        Some(t) if t <= host::HOST_MAX => Ok(vec![Value::host(HostTensor::from_f64(elem, dims, &vec![v; t])?)]),
        _ => Ok(vec![dev(Tensor::full(v, dims, elem.dtype(), cx.dev), elem)]),
    }
}

pub(crate) fn shape(_: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let d = input(n, ins, 0)?.dims();
    let r = d.len() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let s = clampi(n.attr_int("start", 0));
    let e = clampi(n.attr_int("end", r));
    let v: Vec<i64> = d[s..e.max(s)].iter().map(|&x| x as i64).collect();
    Ok(vec![Value::host(HostTensor::i64(vec![v.len()], v)?)])
}

pub(crate) fn size(_: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let c: usize = input(n, ins, 0)?.dims().iter().product();
    Ok(vec![Value::host(HostTensor::i64(vec![], vec![c as i64])?)])
}

pub(crate) fn range(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let elem = host_input(n, ins, 0, "start")?.elem;
    let s = host_scalar(n, ins, 0, "start")?;
    let l = host_scalar(n, ins, 1, "limit")?;
    let d = host_scalar(n, ins, 2, "delta")?;
    let count = host::range_len(n, s, l, d)?;
    let t = Tensor::arange(s, s + count as f64 * d, d, elem.dtype(), cx.dev);
    t.check()?;
    let t = if t.dims()[0] != count { t.narrow(0, 0, count.min(t.dims()[0])) } else { t };
    Ok(vec![dev(t, elem)])
}

pub(crate) fn reshape(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let shape = match opt(ins, 1) {
        Some(_) => host_input(n, ins, 1, "shape")?.ints(),
        None => n.attr_ints("shape").ok_or_else(|| n.err("no shape"))?,
    };
    let dims = reshape_dims(n, v.dims(), &shape, n.attr_int("allowzero", 0) != 0)?;
    Ok(vec![dev(cx.tin(n, ins, 0)?.reshape(dims), v.elem())])
}

pub(crate) fn flatten(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let d = flatten_dims(n, v.dims())?;
    Ok(vec![dev(cx.tin(n, ins, 0)?.reshape(d.to_vec()), v.elem())])
}

pub(crate) fn squeeze(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let axes = match opt(ins, 1) {
        Some(_) => Some(host_input(n, ins, 1, "axes")?.ints()),
        None => n.attr_ints("axes"),
    };
    let dims = squeeze_dims(n, v.dims(), axes.as_deref())?;
    Ok(vec![dev(cx.tin(n, ins, 0)?.reshape(dims), v.elem())])
}

pub(crate) fn unsqueeze(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let axes = axes_arg(n, opt(ins, 1).map(|_| host_input(n, ins, 1, "axes")).transpose()?).unwrap_or_default();
    let dims = unsqueeze_dims(n, v.dims(), &axes)?;
    Ok(vec![dev(cx.tin(n, ins, 0)?.reshape(dims), v.elem())])
}

pub(crate) fn transpose(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let p = host::perm(n, v.dims().len())?;
    Ok(vec![dev(cx.tin(n, ins, 0)?.permute(&p), v.elem())])
}

pub(crate) fn concat(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let first = input(n, ins, 0)?;
    let elem = first.elem();
    let rank = first.dims().len();
    let ax = axis(n, n.attr_int("axis", 0), rank)?;
    let mut ts = Vec::new();
    let mut dt = None;
    for (i, v) in ins.iter().enumerate() {
        let Some(v) = v else { continue };
        if v.dims().len() == rank && v.dims()[ax] == 0 {
            continue;
        }
        let t = cx.t(v, &n.inputs[i])?;
        let d = *dt.get_or_insert(t.dtype());
        ts.push(if t.dtype() != d { t.cast(d) } else { t });
    }
    if ts.is_empty() {
        return Ok(vec![first.clone()]);
    }
    Ok(vec![dev(if ts.len() == 1 { ts.remove(0) } else { Tensor::concat(&ts, ax as isize) }, elem)])
}

pub(crate) fn split(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let split = opt(ins, 1).map(|_| host_input(n, ins, 1, "split")).transpose()?;
    let parts = split_plan(n, v.dims(), split)?;
    let ax = axis(n, n.attr_int("axis", 0), v.dims().len())?;
    let t = cx.tin(n, ins, 0)?;
    Ok(parts.iter().map(|&(s, l)| dev(t.narrow(ax as isize, s, l), v.elem())).collect())
}

pub(crate) fn slice(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let plan = if cx.opset < 10 {
        let starts = n.attr_ints("starts").unwrap_or_default();
        let ends = n.attr_ints("ends").unwrap_or_default();
        slice_plan(n, v.dims(), &starts, &ends, n.attr_ints("axes").as_deref(), None)?
    } else {
        let starts = host_input(n, ins, 1, "starts")?.ints();
        let ends = host_input(n, ins, 2, "ends")?.ints();
        let axes = host_ints_opt(n, ins, 3, "axes")?;
        let steps = host_ints_opt(n, ins, 4, "steps")?;
        slice_plan(n, v.dims(), &starts, &ends, axes.as_deref(), steps.as_deref())?
    };
    let mut t = cx.tin(n, ins, 0)?;
    for (a, &(start, count, step)) in plan.iter().enumerate() {
        if start == 0 && count == v.dims()[a] && step == 1 {
            continue;
        }
        if count == 0 {
            return Err(n.err(format!("the slice of axis {a} is empty (empty tensors are not supported)")));
        }
        t = if step > 0 {
            let end = start + (count - 1) * step as usize + 1;
            t.slice(a as isize, start as isize, end as isize, step as usize)
        } else {
            let idx: Vec<i64> = (0..count as i64).map(|i| start as i64 + i * step).collect();
            t.index_select(a as isize, &ints_tensor(&idx, cx))
        };
    }
    Ok(vec![dev(t, v.elem())])
}

pub(crate) fn gather(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let iv = input(n, ins, 1)?;
    let ax = axis(n, n.attr_int("axis", 0), v.dims().len())?;
    let d = v.dims()[ax];
    let idx = match iv.as_host() {
        Some(h) => {
            let mut ids = h.ints();
            for i in ids.iter_mut() {
                if *i < 0 {
                    *i += d as i64;
                }
                if *i < 0 || *i >= d as i64 {
                    return Err(n.err(format!("index {i} is out of range for axis {ax} of size {d}")));
                }
            }
            ints_tensor(&ids, cx)
        }
        None => {
            let t = cx.t(iv, &n.inputs[1])?.flatten();
            Tensor::where_(&t.lt_scalar(0.0), &t.add_scalar(d as f64), &t)
        }
    };
    let idx = if idx.rank() == 0 { idx.reshape([1]) } else { idx.reshape([idx.numel()]) };
    let t = cx.tin(n, ins, 0)?.index_select(ax as isize, &idx);
    let mut dims = v.dims()[..ax].to_vec();
    dims.extend_from_slice(iv.dims());
    dims.extend_from_slice(&v.dims()[ax + 1..]);
    Ok(vec![dev(t.reshape(dims), v.elem())])
}

pub(crate) fn gather_elements(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let ax = axis(n, n.attr_int("axis", 0), v.dims().len())?;
    let d = v.dims()[ax] as f64;
    let i = cx.tin(n, ins, 1)?;
    let i = Tensor::where_(&i.lt_scalar(0.0), &i.add_scalar(d), &i);
    Ok(vec![dev(cx.tin(n, ins, 0)?.gather(ax as isize, &i), v.elem())])
}

pub(crate) fn expand(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let shape: Vec<usize> =
        host_input(n, ins, 1, "shape")?.ints().iter().map(|&d| to_usize(n, d, "dimension")).collect::<Result<_>>()?;
    let dims = crate::shape::broadcast_shapes(v.dims(), &shape)
        .ok_or_else(|| n.err(format!("cannot expand {:?} to {shape:?}", v.dims())))?;
    Ok(vec![dev(cx.tin(n, ins, 0)?.broadcast_to(dims), v.elem())])
}

pub(crate) fn tile(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let reps = host_input(n, ins, 1, "repeats")?.ints();
    let d = v.dims();
    if reps.len() != d.len() {
        return Err(n.err(format!("{} repeats for rank {}", reps.len(), d.len())));
    }
    let reps: Vec<usize> = reps.iter().map(|&r| to_usize(n, r, "repeat")).collect::<Result<_>>()?;
    // [d0, d1] -> [1, d0, 1, d1] -> [r0, d0, r1, d1] -> [r0*d0, r1*d1].
    let split: Vec<usize> = d.iter().flat_map(|&x| [1, x]).collect();
    let big: Vec<usize> = d.iter().zip(&reps).flat_map(|(&x, &r)| [r, x]).collect();
    // Saturating: a product past usize fails the broadcast's element count.
    let out: Vec<usize> = d.iter().zip(&reps).map(|(&x, &r)| x.saturating_mul(r)).collect();
    let t = cx.tin(n, ins, 0)?.reshape(split).broadcast_to(big).reshape(out);
    Ok(vec![dev(t, v.elem())])
}

pub(crate) fn pad(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let r = v.dims().len();
    let pads = if cx.opset < 11 {
        n.attr_ints("pads").or_else(|| n.attr_ints("paddings")).unwrap_or_default()
    } else {
        host_input(n, ins, 1, "pads")?.ints()
    };
    let value = if cx.opset < 11 {
        n.attr_float("value", 0.0) as f64
    } else {
        match opt(ins, 2) {
            Some(_) => host_scalar(n, ins, 2, "constant_value")?,
            None => 0.0,
        }
    };
    let axes: Vec<usize> = match host_ints_opt(n, ins, 3, "axes")? {
        Some(a) => a.iter().map(|&x| axis(n, x, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(n.err(format!("{} pads for {} axes", pads.len(), axes.len())));
    }
    let mut t = cx.tin(n, ins, 0)?;
    let k = axes.len();
    let mut before = vec![0i64; r];
    let mut after = vec![0i64; r];
    for (i, &a) in axes.iter().enumerate() {
        before[a] = pads[i];
        after[a] = pads[i + k];
    }
    // Negative pads crop.
    for a in 0..r {
        let (b, e) = (before[a].min(0), after[a].min(0));
        if b < 0 || e < 0 {
            let d = t.dims()[a] as i64;
            let len = d.saturating_add(b).saturating_add(e);
            if len <= 0 {
                return Err(n.err("negative pads remove the whole axis"));
            }
            t = t.narrow(a as isize, (-b) as usize, len as usize);
        }
    }
    let mode = n.attr_str("mode", "constant");
    let grow: Vec<(usize, usize)> = (0..r).map(|a| (before[a].max(0) as usize, after[a].max(0) as usize)).collect();
    if grow.iter().all(|&(b, e)| b == 0 && e == 0) {
        return Ok(vec![dev(t, v.elem())]);
    }
    let t = match mode.as_str() {
        "constant" => t.pad(&grow, value),
        "reflect" | "edge" | "wrap" => {
            let mut t = t;
            for (a, &(b, e)) in grow.iter().enumerate() {
                if b == 0 && e == 0 {
                    continue;
                }
                let d = t.dims()[a] as i64;
                // The index list is built on the host: one entry per output position.
                if d == 0 || (d as u64).saturating_add(b as u64).saturating_add(e as u64) > 1 << 31 {
                    return Err(n.err(format!("{mode} padding of {b} and {e} around an axis of {d}")));
                }
                let idx: Vec<i64> = (-(b as i64)..d + e as i64)
                    .map(|i| match mode.as_str() {
                        "edge" => i.clamp(0, d - 1),
                        "wrap" => i.rem_euclid(d),
                        _ => {
                            if d == 1 {
                                0
                            } else {
                                let p = 2 * (d - 1);
                                let m = i.rem_euclid(p);
                                if m < d {
                                    m
                                } else {
                                    p - m
                                }
                            }
                        }
                    })
                    .collect();
                t = t.index_select(a as isize, &ints_tensor(&idx, cx));
            }
            t
        }
        m => return Err(n.err(format!("pad mode '{m}' is not supported"))),
    };
    Ok(vec![dev(t, v.elem())])
}

pub(crate) fn eye_like(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let d = v.dims();
    if d.len() != 2 {
        return Err(n.err("EyeLike needs a 2-D input"));
    }
    let elem = match n.attr_int("dtype", 0) {
        0 => v.elem(),
        c => Elem::from_proto(c as i32).ok_or_else(|| n.err(format!("dtype {c}")))?,
    };
    let k = n.attr_int("k", 0) as f64;
    let rows = Tensor::arange(0.0, d[0] as f64, 1.0, DType::I32, cx.dev).reshape([d[0], 1]);
    let cols = Tensor::arange(0.0, d[1] as f64, 1.0, DType::I32, cx.dev).reshape([1, d[1]]);
    let m = cols.sub(&rows).eq_scalar(k);
    Ok(vec![dev(m.cast(elem.dtype()), elem)])
}

pub(crate) fn trilu(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let d = v.dims();
    if d.len() < 2 {
        return Err(n.err("Trilu needs rank 2 or more"));
    }
    let k = match opt(ins, 1) {
        Some(_) => host_scalar(n, ins, 1, "k")? as i64,
        None => 0,
    };
    let (h, w) = (d[d.len() - 2], d[d.len() - 1]);
    let rows = Tensor::arange(0.0, h as f64, 1.0, DType::I32, cx.dev).reshape([h, 1]);
    let cols = Tensor::arange(0.0, w as f64, 1.0, DType::I32, cx.dev).reshape([1, w]);
    let diff = cols.sub(&rows);
    let keep = if n.attr_int("upper", 1) != 0 { diff.ge_scalar(k as f64) } else { diff.le_scalar(k as f64) };
    let x = cx.tin(n, ins, 0)?;
    Ok(vec![dev(Tensor::where_(&keep, &x, &x.zeros_like()), v.elem())])
}

pub(crate) fn depth_space(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let d = v.dims();
    if d.len() != 4 {
        return Err(n.err("needs a 4-D input"));
    }
    let b = to_usize(n, n.attr_int("blocksize", 0), "blocksize")?;
    let (nn, c, h, w) = (d[0], d[1], d[2], d[3]);
    let x = cx.tin(n, ins, 0)?;
    let y = if n.op == "DepthToSpace" {
        if b == 0 || b.checked_mul(b).is_none_or(|bb| c % bb != 0) {
            return Err(n.err(format!("{c} channels do not divide by blocksize {b} squared")));
        }
        let c2 = c / (b * b);
        if n.attr_str("mode", "DCR") == "CRD" {
            x.reshape(vec![nn, c2, b, b, h, w]).permute(&[0, 1, 4, 2, 5, 3]).reshape(vec![nn, c2, h * b, w * b])
        } else {
            x.reshape(vec![nn, b, b, c2, h, w]).permute(&[0, 3, 4, 1, 5, 2]).reshape(vec![nn, c2, h * b, w * b])
        }
    } else {
        if b == 0 || h % b != 0 || w % b != 0 {
            return Err(n.err(format!("{h}x{w} does not divide by blocksize {b}")));
        }
        let blocks = x.reshape(vec![nn, c, h / b, b, w / b, b]);
        let perm: &[usize] = if n.attr_str("mode", "DCR") == "CRD" { &[0, 1, 3, 5, 2, 4] } else { &[0, 3, 5, 1, 2, 4] };
        blocks.permute(perm).reshape(vec![nn, c * b * b, h / b, w / b])
    };
    Ok(vec![dev(y, v.elem())])
}

pub(crate) fn one_hot(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let iv = input(n, ins, 0)?;
    let depth = host_scalar(n, ins, 1, "depth")? as i64;
    let values = host_input(n, ins, 2, "values")?;
    if depth <= 0 || values.numel() != 2 {
        return Err(n.err("depth must be positive and values hold [off, on]"));
    }
    let r = iv.dims().len() + 1;
    let ax = axis(n, n.attr_int("axis", -1), r)?;
    let idx = as_float(&cx.tin(n, ins, 0)?);
    let idx = Tensor::where_(&idx.lt_scalar(0.0), &idx.add_scalar(depth as f64), &idx).unsqueeze(ax as isize);
    let mut shape = vec![1usize; r];
    shape[ax] = depth as usize;
    let range = Tensor::arange(0.0, depth as f64, 1.0, DType::F32, cx.dev).reshape(shape);
    let hit = idx.eq(&range);
    let dt = values.elem.dtype();
    let on = Tensor::full(values.data.f(1), (), dt, cx.dev);
    let off = Tensor::full(values.data.f(0), (), dt, cx.dev);
    Ok(vec![dev(Tensor::where_(&hit, &on, &off), values.elem)])
}

pub(crate) fn non_zero(_: &Cx, n: &Node, _: &[Option<Value>]) -> Result<Vec<Value>> {
    Err(n.err("NonZero's output shape depends on the data: its input must be known on the host"))
}

pub(crate) fn cumsum(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let r = v.dims().len();
    let ax = axis(n, host_scalar(n, ins, 1, "axis")? as i64, r)?;
    let len = v.dims()[ax];
    let (excl, rev) = (n.attr_int("exclusive", 0) != 0, n.attr_int("reverse", 0) != 0);
    // x (axis moved last) @ T, T[i][j] = 1 where element i adds into output j.
    let i = Tensor::arange(0.0, len as f64, 1.0, DType::I32, cx.dev).reshape([len, 1]);
    let j = Tensor::arange(0.0, len as f64, 1.0, DType::I32, cx.dev).reshape([1, len]);
    let m = match (excl, rev) {
        (false, false) => i.le(&j),
        (true, false) => i.lt(&j),
        (false, true) => i.ge(&j),
        (true, true) => i.gt(&j),
    };
    let x = cx.tin(n, ins, 0)?;
    let dt = x.dtype();
    let xf = if dt == DType::F16 { x.cast(DType::F32) } else { as_float(&x) };
    let y = xf.transpose(ax as isize, -1).matmul(&m.cast(DType::F32)).transpose(ax as isize, -1);
    let y = if dt.is_float() { y.cast(dt) } else { y.round().cast(dt) };
    Ok(vec![dev(y, v.elem())])
}

/// The longest axis Resize produces (16M positions: 17 minutes of 16 kHz audio).
const MAX_RESIZED_AXIS: usize = 1 << 24;

pub(crate) fn resize(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let dims = v.dims().to_vec();
    let r = dims.len();
    let legacy = n.op == "Upsample" || cx.opset < 11;
    // Scales and sizes: Upsample-7 has an attribute, Upsample-9 and Resize-10 an input 1,
    // Resize-11+ inputs 2 (scales) and 3 (sizes).
    let (scales, sizes): (Option<Vec<f64>>, Option<Vec<i64>>) = if n.op == "Upsample" && opt(ins, 1).is_none() {
        (n.attr_floats("scales").map(|s| s.iter().map(|&x| x as f64).collect()), None)
    } else if legacy {
        (Some(host_input(n, ins, 1, "scales")?.floats()), None)
    } else {
        let sc = match opt(ins, 2) {
            Some(_) => Some(host_input(n, ins, 2, "scales")?.floats()).filter(|s| !s.is_empty()),
            None => None,
        };
        let sz = match opt(ins, 3) {
            Some(_) => Some(host_input(n, ins, 3, "sizes")?.ints()).filter(|s| !s.is_empty()),
            None => None,
        };
        (sc, sz)
    };
    let axes: Vec<usize> = match n.attr_ints("axes") {
        Some(a) => a.iter().map(|&x| axis(n, x, r)).collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    let mut scale = vec![1.0f64; r];
    let mut out = dims.clone();
    let sized = sizes.is_some();
    match (scales, sizes) {
        (_, Some(sz)) => {
            if sz.len() != axes.len() {
                return Err(n.err(format!("{} sizes for {} axes", sz.len(), axes.len())));
            }
            let policy = n.attr_str("keep_aspect_ratio_policy", "stretch");
            let ratios: Vec<f64> = axes.iter().zip(&sz).map(|(&a, &s)| s as f64 / dims[a] as f64).collect();
            let common = match policy.as_str() {
                "not_larger" => Some(ratios.iter().cloned().fold(f64::INFINITY, f64::min)),
                "not_smaller" => Some(ratios.iter().cloned().fold(f64::NEG_INFINITY, f64::max)),
                _ => None,
            };
            for (i, &a) in axes.iter().enumerate() {
                match common {
                    Some(c) => {
                        scale[a] = c;
                        out[a] = (dims[a] as f64 * c).round() as usize;
                    }
                    None => {
                        out[a] = to_usize(n, sz[i], "size")?;
                        scale[a] = ratios[i];
                    }
                }
            }
        }
        (Some(sc), None) => {
            if sc.len() != axes.len() {
                return Err(n.err(format!("{} scales for {} axes", sc.len(), axes.len())));
            }
            for (i, &a) in axes.iter().enumerate() {
                if sc[i].is_nan() || sc[i] <= 0.0 || !sc[i].is_finite() {
                    return Err(n.err(format!("scale {} must be positive", sc[i])));
                }
                scale[a] = sc[i];
                out[a] = (dims[a] as f64 * sc[i]).floor() as usize;
            }
        }
        (None, None) => return Err(n.err("Resize needs scales or sizes")),
    }
    if out.contains(&0) || out.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_none() {
        return Err(n.err(format!("output shape {out:?}")));
    }
    let mode = n.attr_str("mode", "nearest");
    let ctm =
        if legacy { "asymmetric".to_string() } else { n.attr_str("coordinate_transformation_mode", "half_pixel") };
    if n.attr_int("antialias", 0) != 0 && out.iter().zip(&dims).any(|(o, d)| o < d) {
        return Err(n.err("antialiased downsampling is not supported"));
    }
    // Each resized axis gets a host table of its taps, one entry an output position.
    if (0..r).any(|a| (out[a] != dims[a] || scale[a] != 1.0) && out[a] > MAX_RESIZED_AXIS) {
        return Err(n.err("an axis resized past 2^24 positions"));
    }
    if dims.contains(&0) {
        return Err(n.err("cannot resize an empty axis"));
    }
    let nearest_mode = n.attr_str("nearest_mode", "round_prefer_floor");
    // tf_crop_and_resize: the region of interest per axis, and the value outside it.
    let roi: Option<Vec<f64>> = if ctm == "tf_crop_and_resize" {
        let r_in = host_input(n, ins, 1, "roi")?.floats();
        let mut full = vec![0.0; 2 * r];
        for a in 0..r {
            full[r + a] = 1.0;
        }
        if r_in.len() != 2 * axes.len() {
            return Err(n.err(format!("roi of {} values for {} axes", r_in.len(), axes.len())));
        }
        for (i, &a) in axes.iter().enumerate() {
            full[a] = r_in[i];
            full[r + a] = r_in[axes.len() + i];
        }
        Some(full)
    } else {
        None
    };
    let extrapolation = n.attr_float("extrapolation_value", 0.0) as f64;
    let cubic_a = n.attr_float("cubic_coeff_a", -0.75) as f64;
    let exclude_outside = n.attr_int("exclude_outside", 0) != 0;
    let mut t = cx.tin(n, ins, 0)?;
    let orig_dt = t.dtype();
    let mut inside: Option<Tensor> = None;
    for a in 0..r {
        if out[a] == dims[a] && scale[a] == 1.0 && roi.is_none() {
            continue;
        }
        let (len_in, len_out) = (dims[a] as f64, out[a] as f64);
        // The resized length as ONNX defines it: the unrounded product with the scale.
        let len_resized = if sized { len_out } else { len_in * scale[a] };
        let src = |x: f64| -> f64 {
            match ctm.as_str() {
                "asymmetric" => x / scale[a],
                "align_corners" => {
                    if len_resized <= 1.0 {
                        0.0
                    } else {
                        x * (len_in - 1.0) / (len_resized - 1.0)
                    }
                }
                "pytorch_half_pixel" => {
                    if len_resized > 1.0 {
                        (x + 0.5) / scale[a] - 0.5
                    } else {
                        0.0
                    }
                }
                "tf_half_pixel_for_nn" => (x + 0.5) / scale[a],
                "tf_crop_and_resize" => {
                    let roi = roi.as_deref().unwrap_or(&[]);
                    let (s0, e0) = (roi[a], roi[r + a]);
                    if len_out > 1.0 {
                        s0 * (len_in - 1.0) + x * (e0 - s0) * (len_in - 1.0) / (len_out - 1.0)
                    } else {
                        0.5 * (s0 + e0) * (len_in - 1.0)
                    }
                }
                "half_pixel_symmetric" => {
                    let adj = len_out / (scale[a] * len_in);
                    let offset = len_in / 2.0 * (1.0 - adj);
                    offset + (x + 0.5) / scale[a] - 0.5
                }
                _ => (x + 0.5) / scale[a] - 0.5,
            }
        };
        let last = dims[a] as i64 - 1;
        // Per output position: the taps (input index, weight) it blends.
        let mut taps: Vec<Vec<(i64, f64)>> = Vec::with_capacity(out[a]);
        let mut valid = vec![1f32; out[a]];
        for (o, ok) in valid.iter_mut().enumerate() {
            let x = src(o as f64);
            if roi.is_some() && (x < 0.0 || x > len_in - 1.0) {
                *ok = 0.0;
            }
            taps.push(match mode.as_str() {
                "nearest" => {
                    let down = scale[a] < 1.0;
                    let i = if legacy {
                        if down {
                            x.ceil()
                        } else {
                            x.floor()
                        }
                    } else {
                        match nearest_mode.as_str() {
                            "floor" => x.floor(),
                            "ceil" => x.ceil(),
                            "round_prefer_ceil" => {
                                if x - x.floor() == 0.5 {
                                    x.ceil()
                                } else {
                                    x.round()
                                }
                            }
                            _ => {
                                if x - x.floor() == 0.5 {
                                    x.floor()
                                } else {
                                    x.round()
                                }
                            }
                        }
                    };
                    vec![((i as i64).clamp(0, last), 1.0)]
                }
                "linear" => {
                    let x = x.clamp(0.0, len_in - 1.0);
                    let f = x.floor();
                    vec![((f as i64).clamp(0, last), 1.0 - (x - f)), ((f as i64 + 1).clamp(0, last), x - f)]
                }
                "cubic" => {
                    let f = x.floor();
                    let tt = x - f;
                    let w = |d: f64| -> f64 {
                        let d = d.abs();
                        if d <= 1.0 {
                            ((cubic_a + 2.0) * d - (cubic_a + 3.0)) * d * d + 1.0
                        } else if d < 2.0 {
                            ((cubic_a * d - 5.0 * cubic_a) * d + 8.0 * cubic_a) * d - 4.0 * cubic_a
                        } else {
                            0.0
                        }
                    };
                    let mut v: Vec<(i64, f64)> = (-1i64..3).map(|k| (f as i64 + k, w(tt - k as f64))).collect();
                    if exclude_outside {
                        for p in v.iter_mut() {
                            if p.0 < 0 || p.0 > last {
                                p.1 = 0.0;
                            }
                        }
                        let sum: f64 = v.iter().map(|p| p.1).sum();
                        if sum != 0.0 {
                            v.iter_mut().for_each(|p| p.1 /= sum);
                        }
                    }
                    v.into_iter().map(|(i, w)| (i.clamp(0, last), w)).collect()
                }
                m => return Err(n.err(format!("Resize mode '{m}' is not supported"))),
            });
        }
        let k = taps[0].len();
        let mut wshape = vec![1usize; r];
        wshape[a] = out[a];
        if k == 1 {
            let idx: Vec<i64> = taps.iter().map(|p| p[0].0).collect();
            t = t.index_select(a as isize, &ints_tensor(&idx, cx));
        } else {
            let tf = as_float(&t);
            let mut acc: Option<Tensor> = None;
            for j in 0..k {
                let idx: Vec<i64> = taps.iter().map(|p| p[j].0).collect();
                let w: Vec<f32> = taps.iter().map(|p| p[j].1 as f32).collect();
                let term = tf
                    .index_select(a as isize, &ints_tensor(&idx, cx))
                    .mul(&Tensor::from_slice(&w, wshape.clone(), cx.dev).cast(tf.dtype()));
                acc = Some(match acc {
                    Some(x) => x.add(&term),
                    None => term,
                });
            }
            t = acc.ok_or_else(|| n.err("no taps"))?;
        }
        if roi.is_some() {
            let m = Tensor::from_slice(&valid, wshape, cx.dev);
            inside = Some(match inside {
                Some(x) => x.mul(&m),
                None => m,
            });
        }
    }
    if let Some(m) = inside {
        let ex = Tensor::full(extrapolation, (), t.dtype(), cx.dev);
        t = Tensor::where_(&m.gt_scalar(0.0), &t, &ex);
    }
    if t.dtype() != orig_dt {
        t = if orig_dt.is_float() { t.cast(orig_dt) } else { t.round().cast(orig_dt) };
    }
    Ok(vec![dev(t, v.elem())])
}

pub(crate) fn gather_nd(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let iv = input(n, ins, 1)?;
    let (dd, id) = (v.dims().to_vec(), iv.dims().to_vec());
    let b = to_usize(n, n.attr_int("batch_dims", 0), "batch_dims")?;
    let k = *id.last().ok_or_else(|| n.err("indices must have rank 1 or more"))?;
    if b + k > dd.len() || b >= id.len() || dd[..b] != id[..b] {
        return Err(n.err(format!("indices {id:?} do not fit data {dd:?} with batch_dims {b}")));
    }
    let batch: usize = dd[..b].iter().product();
    let p: usize = dd[b..b + k].iter().product();
    let rest = dd[b + k..].to_vec();
    // Row-major position of each index tuple inside its batch, plus the batch's offset.
    let idx = cx.tin(n, ins, 1)?;
    let mut lin: Option<Tensor> = None;
    let mut stride = 1usize;
    for j in (0..k).rev() {
        let dim = dd[b + j];
        let c = idx.narrow(-1, j, 1);
        let c = Tensor::where_(&c.lt_scalar(0.0), &c.add_scalar(dim as f64), &c).mul_scalar(stride as f64);
        lin = Some(match lin {
            Some(l) => l.add(&c),
            None => c,
        });
        stride *= dim;
    }
    let mut lin = lin.ok_or_else(|| n.err("indices of zero length are not supported"))?.squeeze(-1);
    if b > 0 {
        let mut shape = id[..b].to_vec();
        shape.extend(std::iter::repeat_n(1, id.len() - 1 - b));
        let offs = Tensor::arange(0.0, batch as f64, 1.0, DType::I32, cx.dev).mul_scalar(p as f64).reshape(shape);
        lin = lin.add(&offs);
    }
    let mut flat_shape = vec![batch * p];
    flat_shape.extend_from_slice(&rest);
    let data = cx.tin(n, ins, 0)?.reshape(flat_shape);
    let picked = data.index_select(0, &lin.flatten());
    let mut out = id[..id.len() - 1].to_vec();
    out.extend_from_slice(&rest);
    Ok(vec![dev(picked.reshape(out), v.elem())])
}
