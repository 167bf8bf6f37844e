//! Host evaluation of the small integer and float arithmetic that ONNX graphs do on
//! shapes (`Shape -> Gather -> Unsqueeze -> Concat -> Reshape`, `Range`, `Expand`,
//! scale factors for `Resize`): exact in 64-bit, so `INT64_MAX` meaning "to the end"
//! and symbolic dimensions fold to constants before any device op needs them. Also the
//! shape rules that host and device lowerings share.

use super::super::read::Node;
use super::super::value::{Elem, HostData, HostTensor, Value};
use super::{axis, scalar_of, to_usize, Cx};
use crate::Result;

/// Largest host tensor the folding produces or reads.
pub const HOST_MAX: usize = 1 << 16;
/// Marks the errors that send an op back to the device.
const TOO_LARGE: &str = "is too large to fold on the host";
/// Float inputs larger than this are left to the device (they are data, not shapes).
const FLOAT_MAX: usize = 1024;

/// Evaluate `n` on the host when every input is known there and the op is one of the
/// shape-arithmetic set; `None` leaves it to the device lowering.
pub(crate) fn fold(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Option<Result<Vec<Value>>> {
    let mut hs: Vec<Option<&HostTensor>> = Vec::with_capacity(ins.len());
    let mut total = 0usize;
    for v in ins {
        match v {
            None => hs.push(None),
            Some(v) => {
                let h = v.as_host()?;
                if h.elem.is_float() && h.numel() > FLOAT_MAX {
                    return None;
                }
                total += h.numel();
                hs.push(Some(h));
            }
        }
    }
    if total > HOST_MAX {
        return None;
    }
    match eval(cx, n, &hs)? {
        Ok(v) => Some(Ok(v.into_iter().map(Value::host).collect())),
        // Too large to fold: the device computes it instead.
        Err(e) if e.to_string().contains(TOO_LARGE) => None,
        Err(e) => Some(Err(e)),
    }
}

fn eval(cx: &Cx, n: &Node, hs: &[Option<&HostTensor>]) -> Option<Result<Vec<HostTensor>>> {
    let h = |i: usize| -> Result<&HostTensor> {
        hs.get(i).copied().flatten().ok_or_else(|| n.err(format!("input {i} is required")))
    };
    let one = |r: Result<HostTensor>| Some(r.map(|t| vec![t]));
    let op = n.op.as_str();
    match op {
        "Identity" => one(h(0).cloned()),
        "Cast" => one(h(0).map(|t| t.cast(Elem::from_proto(n.attr_int("to", 1) as i32).unwrap_or(Elem::F32)))),
        "CastLike" => one((|| Ok(h(0)?.cast(h(1)?.elem)))()),
        "Reshape" => one((|| {
            let t = h(0)?;
            let shape = match hs.get(1).copied().flatten() {
                Some(s) => s.ints(),
                None => n.attr_ints("shape").unwrap_or_default(),
            };
            let dims = reshape_dims(n, &t.dims, &shape, n.attr_int("allowzero", 0) != 0)?;
            HostTensor::new(t.elem, dims, t.data.clone())
        })()),
        "Flatten" => one((|| {
            let t = h(0)?;
            let dims = flatten_dims(n, &t.dims)?;
            HostTensor::new(t.elem, dims.to_vec(), t.data.clone())
        })()),
        "Squeeze" => one((|| {
            let t = h(0)?;
            let axes = axes_arg(n, hs.get(1).copied().flatten());
            HostTensor::new(t.elem, squeeze_dims(n, &t.dims, axes.as_deref())?, t.data.clone())
        })()),
        "Unsqueeze" => one((|| {
            let t = h(0)?;
            let axes = axes_arg(n, hs.get(1).copied().flatten()).unwrap_or_default();
            HostTensor::new(t.elem, unsqueeze_dims(n, &t.dims, &axes)?, t.data.clone())
        })()),
        "Concat" => {
            let parts: Vec<&HostTensor> = hs.iter().flatten().copied().collect();
            one(concat(n, &parts, n.attr_int("axis", 0)))
        }
        "Gather" => one((|| gather(n, h(0)?, h(1)?, n.attr_int("axis", 0)))()),
        "Slice" => one((|| {
            let t = h(0)?;
            let plan = slice_plan_from(cx, n, &t.dims, hs)?;
            Ok(slice(t, &plan))
        })()),
        "Transpose" => one((|| {
            let t = h(0)?;
            let perm = perm(n, t.dims.len())?;
            let dims: Vec<usize> = perm.iter().map(|&p| t.dims[p]).collect();
            let st = strides(&t.dims);
            Ok(remap(t, dims.clone(), |c, _| perm.iter().zip(c).map(|(&p, &ci)| ci * st[p]).sum()))
        })()),
        "Expand" => one((|| {
            let t = h(0)?;
            let shape: Vec<usize> = h(1)?.ints().iter().map(|&d| to_usize(n, d, "dimension")).collect::<Result<_>>()?;
            let dims = crate::shape::broadcast_shapes(&t.dims, &shape)
                .ok_or_else(|| n.err(format!("cannot expand {:?} to {shape:?}", t.dims)))?;
            expand(t, &dims)
        })()),
        "Tile" => one((|| {
            let t = h(0)?;
            let reps = h(1)?.ints();
            if reps.len() != t.dims.len() || reps.iter().any(|&r| r < 0) {
                return Err(n.err(format!("repeats {reps:?} for a tensor of shape {:?}", t.dims)));
            }
            let dims: Vec<usize> = t.dims.iter().zip(&reps).map(|(&d, &r)| d.saturating_mul(r as usize)).collect();
            check_size(n, &dims)?;
            let st = strides(&t.dims);
            let src = t.dims.clone();
            Ok(remap(t, dims, |c, _| c.iter().enumerate().map(|(i, &ci)| (ci % src[i].max(1)) * st[i]).sum()))
        })()),
        "Range" => one((|| {
            let (s, d) = (h(0)?, h(2)?);
            let (s0, d0) = (scalar_of(n, s, "start")?, scalar_of(n, d, "delta")?);
            let count = range_len(n, s0, scalar_of(n, h(1)?, "limit")?, d0)?;
            check_size(n, &[count])?;
            if s.elem.is_float() {
                HostTensor::new(
                    s.elem,
                    vec![count],
                    HostData::F((0..count).map(|i| s.elem.round(s0 + i as f64 * d0)).collect()),
                )
            } else {
                let (si, di) = (s.ints()[0], d.ints()[0]);
                HostTensor::new(
                    s.elem,
                    vec![count],
                    HostData::I((0..count as i64).map(|i| si.saturating_add(i.saturating_mul(di))).collect()),
                )
            }
        })()),
        "Split" => Some((|| {
            let t = h(0)?;
            let parts = split_plan(n, &t.dims, hs.get(1).copied().flatten())?;
            let ax = axis(n, n.attr_int("axis", 0), t.dims.len())?;
            Ok(parts
                .iter()
                .map(|&(start, len)| {
                    let mut plan: Vec<(usize, usize, i64)> = t.dims.iter().map(|&d| (0, d, 1)).collect();
                    plan[ax] = (start, len, 1);
                    slice(t, &plan)
                })
                .collect())
        })()),
        "NonZero" => one((|| {
            let t = h(0)?;
            let st = strides(&t.dims);
            let hits: Vec<usize> = (0..t.numel()).filter(|&i| t.data.f(i) != 0.0).collect();
            let r = t.dims.len();
            let mut out = vec![0i64; r * hits.len()];
            for (j, &i) in hits.iter().enumerate() {
                for a in 0..r {
                    out[a * hits.len() + j] = ((i / st[a].max(1)) % t.dims[a].max(1)) as i64;
                }
            }
            HostTensor::new(Elem::I64, vec![r, hits.len()], HostData::I(out))
        })()),
        "Where" => one((|| {
            let (c, a, b) = (h(0)?, h(1)?, h(2)?);
            let d1 = crate::shape::broadcast_shapes(&c.dims, &a.dims);
            let dims = d1
                .and_then(|d| crate::shape::broadcast_shapes(&d, &b.dims))
                .ok_or_else(|| n.err("shapes cannot be broadcast together"))?;
            let (c, a, b) = (expand(c, &dims)?, expand(a, &dims)?, expand(b, &dims)?);
            let data = match (&a.data, &b.data) {
                (HostData::F(x), HostData::F(y)) => {
                    HostData::F((0..x.len()).map(|i| if c.data.f(i) != 0.0 { x[i] } else { y[i] }).collect())
                }
                (HostData::I(x), HostData::I(y)) => {
                    HostData::I((0..x.len()).map(|i| if c.data.f(i) != 0.0 { x[i] } else { y[i] }).collect())
                }
                _ => return Err(n.err("Where's branches differ in type")),
            };
            HostTensor::new(a.elem, dims, data)
        })()),
        "Add" | "Sub" | "Mul" | "Div" | "Mod" | "Pow" | "Equal" | "Less" | "LessOrEqual" | "Greater"
        | "GreaterOrEqual" | "And" | "Or" | "Xor" => one((|| binary(n, op, h(0)?, h(1)?))()),
        "Max" | "Min" | "Sum" => one((|| {
            let parts: Vec<&HostTensor> = hs.iter().flatten().copied().collect();
            let mut acc = (*parts.first().ok_or_else(|| n.err("needs at least one input"))?).clone();
            for p in &parts[1..] {
                acc = binary(n, op, &acc, p)?;
            }
            Ok(acc)
        })()),
        "Neg" | "Abs" | "Floor" | "Ceil" | "Round" | "Sqrt" | "Not" | "Sign" | "Reciprocal" | "Exp" | "Log" => {
            one((|| unary(n, op, h(0)?))())
        }
        "ReduceSum" | "ReduceProd" | "ReduceMax" | "ReduceMin" | "ReduceMean" => one((|| {
            let t = h(0)?;
            let axes = if cx.opset >= 18 || (op == "ReduceSum" && cx.opset >= 13) {
                hs.get(1).copied().flatten().map(|a| a.ints())
            } else {
                n.attr_ints("axes")
            };
            reduce(n, op, t, axes, n.attr_int("keepdims", 1) != 0, n.attr_int("noop_with_empty_axes", 0) != 0)
        })()),
        _ => None,
    }
}

// ---- shared shape rules --------------------------------------------------------------

/// Row-major strides.
pub(crate) fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(dims[i + 1]);
    }
    s
}

fn check_size(n: &Node, dims: &[usize]) -> Result<usize> {
    let total = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    match total {
        Some(t) if t <= HOST_MAX => Ok(t),
        _ => Err(n.err(format!("a result of shape {dims:?} {TOO_LARGE}"))),
    }
}

/// ONNX Reshape's target: `0` copies the input dimension (unless `allowzero`), one
/// `-1` is inferred.
pub(crate) fn reshape_dims(n: &Node, dims: &[usize], shape: &[i64], allowzero: bool) -> Result<Vec<usize>> {
    let total: usize = dims.iter().product();
    let mut out = Vec::with_capacity(shape.len());
    let mut infer = None;
    for (i, &s) in shape.iter().enumerate() {
        match s {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(
                *dims.get(i).ok_or_else(|| n.err(format!("shape {shape:?}: 0 at axis {i} past the input's rank")))?,
            ),
            s if s >= 0 => out.push(s as usize),
            _ => return Err(n.err(format!("shape {shape:?} is not a valid Reshape target"))),
        }
    }
    let known = out
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| n.err(format!("shape {shape:?} overflows")))?;
    if let Some(i) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(n.err(format!("cannot reshape {dims:?} ({total} elements) to {shape:?}")));
        }
        out[i] = total / known;
    } else if known != total {
        return Err(n.err(format!("cannot reshape {dims:?} ({total} elements) to {shape:?}")));
    }
    Ok(out)
}

/// Flatten to 2-D at `axis`.
pub(crate) fn flatten_dims(n: &Node, dims: &[usize]) -> Result<[usize; 2]> {
    let r = dims.len() as i64;
    let a = n.attr_int("axis", 1);
    let a = if a < 0 { a + r } else { a };
    if a < 0 || a > r {
        return Err(n.err(format!("axis {} out of range for rank {r}", n.attr_int("axis", 1))));
    }
    let a = a as usize;
    Ok([dims[..a].iter().product(), dims[a..].iter().product()])
}

/// Axes from input 1 (opset 13+) or the `axes` attribute.
pub(crate) fn axes_arg(n: &Node, input: Option<&HostTensor>) -> Option<Vec<i64>> {
    match input {
        Some(t) => Some(t.ints()),
        None => n.attr_ints("axes"),
    }
}

pub(crate) fn squeeze_dims(n: &Node, dims: &[usize], axes: Option<&[i64]>) -> Result<Vec<usize>> {
    match axes {
        None => Ok(dims.iter().copied().filter(|&d| d != 1).collect()),
        Some(axes) => {
            let mut drop = vec![false; dims.len()];
            for &a in axes {
                let a = axis(n, a, dims.len())?;
                if dims[a] != 1 {
                    return Err(n.err(format!("cannot squeeze axis {a} of size {} (shape {dims:?})", dims[a])));
                }
                drop[a] = true;
            }
            Ok(dims.iter().zip(drop).filter(|(_, d)| !d).map(|(&x, _)| x).collect())
        }
    }
}

pub(crate) fn unsqueeze_dims(n: &Node, dims: &[usize], axes: &[i64]) -> Result<Vec<usize>> {
    let r = dims.len() + axes.len();
    let mut at = vec![false; r];
    for &a in axes {
        let a = axis(n, a, r)?;
        if at[a] {
            return Err(n.err(format!("axis {a} given twice")));
        }
        at[a] = true;
    }
    let mut src = dims.iter();
    Ok(at.iter().map(|&new| if new { 1 } else { src.next().copied().unwrap_or(1) }).collect())
}

/// A Transpose's permutation (default: reversed axes), checked.
pub(crate) fn perm(n: &Node, rank: usize) -> Result<Vec<usize>> {
    let p: Vec<usize> = match n.attr_ints("perm") {
        Some(p) => p.iter().map(|&a| axis(n, a, rank)).collect::<Result<_>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut seen = vec![false; rank];
    if p.len() != rank || p.iter().any(|&a| std::mem::replace(&mut seen[a], true)) {
        return Err(n.err(format!("perm {p:?} is not a permutation of {rank} axes")));
    }
    Ok(p)
}

/// Number of elements of `Range(start, limit, delta)`.
pub(crate) fn range_len(n: &Node, start: f64, limit: f64, delta: f64) -> Result<usize> {
    if delta == 0.0 || !delta.is_finite() || !start.is_finite() || !limit.is_finite() {
        return Err(n.err(format!("Range({start}, {limit}, {delta}) needs a finite non-zero delta")));
    }
    let c = ((limit - start) / delta).ceil().max(0.0);
    if c > (1u64 << 31) as f64 {
        return Err(n.err(format!("Range({start}, {limit}, {delta}) has {c} elements")));
    }
    Ok(c as usize)
}

/// Per-axis `(start, count, step)` of a Slice on `dims`.
pub(crate) fn slice_plan(
    n: &Node,
    dims: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<Vec<(usize, usize, i64)>> {
    let r = dims.len();
    let default_axes: Vec<i64> = (0..starts.len() as i64).collect();
    let axes = axes.unwrap_or(&default_axes);
    if starts.len() != ends.len() || axes.len() != starts.len() || steps.is_some_and(|s| s.len() != starts.len()) {
        return Err(n.err(format!("starts {starts:?}, ends {ends:?}, axes {axes:?} differ in length")));
    }
    let mut plan: Vec<(usize, usize, i64)> = dims.iter().map(|&d| (0, d, 1)).collect();
    let mut seen = vec![false; r];
    for (i, &a) in axes.iter().enumerate() {
        let a = axis(n, a, r)?;
        if std::mem::replace(&mut seen[a], true) {
            return Err(n.err(format!("axis {a} sliced twice")));
        }
        let d = dims[a] as i64;
        let step = steps.map(|s| s[i]).unwrap_or(1);
        if step == 0 {
            return Err(n.err("a slice step of 0"));
        }
        let clampi = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
        let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        let (s, e) = if step > 0 {
            (clampi(norm(starts[i]), 0, d), clampi(norm(ends[i]), 0, d))
        } else {
            (clampi(norm(starts[i]), -1, d - 1), clampi(norm(ends[i]), -1, d - 1))
        };
        let count = if step > 0 {
            if e > s {
                (e - s + step - 1) / step
            } else {
                0
            }
        } else if s > e {
            (s - e + (-step) - 1) / (-step)
        } else {
            0
        };
        plan[a] = (s.max(0) as usize, count as usize, step);
    }
    Ok(plan)
}

fn slice_plan_from(cx: &Cx, n: &Node, dims: &[usize], hs: &[Option<&HostTensor>]) -> Result<Vec<(usize, usize, i64)>> {
    if cx.opset < 10 {
        let starts = n.attr_ints("starts").unwrap_or_default();
        let ends = n.attr_ints("ends").unwrap_or_default();
        let axes = n.attr_ints("axes");
        return slice_plan(n, dims, &starts, &ends, axes.as_deref(), None);
    }
    let get = |i: usize| hs.get(i).copied().flatten().map(|t| t.ints());
    let starts = get(1).ok_or_else(|| n.err("starts are required"))?;
    let ends = get(2).ok_or_else(|| n.err("ends are required"))?;
    slice_plan(n, dims, &starts, &ends, get(3).as_deref(), get(4).as_deref())
}

/// `(start, len)` of each output of a Split along `axis`.
pub(crate) fn split_plan(n: &Node, dims: &[usize], split_input: Option<&HostTensor>) -> Result<Vec<(usize, usize)>> {
    let ax = axis(n, n.attr_int("axis", 0), dims.len())?;
    let d = dims[ax];
    let outs = n.outputs.len().max(1);
    let sizes: Vec<usize> = match split_input.map(|t| t.ints()).or_else(|| n.attr_ints("split")) {
        Some(s) => s.iter().map(|&v| to_usize(n, v, "split size")).collect::<Result<_>>()?,
        None => {
            let parts = match n.attr_int("num_outputs", 0) {
                0 => outs,
                k if k as u64 == outs as u64 => outs,
                k => return Err(n.err(format!("num_outputs {k} for {outs} outputs"))),
            };
            let chunk = d.div_ceil(parts);
            (0..parts).map(|i| chunk.min(d.saturating_sub(i * chunk))).collect()
        }
    };
    if sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b)) != Some(d) {
        return Err(n.err(format!("split sizes {sizes:?} do not add up to the axis size {d}")));
    }
    let mut start = 0;
    Ok(sizes
        .iter()
        .map(|&s| {
            let r = (start, s);
            start += s;
            r
        })
        .collect())
}

// ---- host kernels --------------------------------------------------------------------

/// A tensor of `dims` whose element at coordinate `c` (flat index `i`) is `t`'s flat
/// element `src(c, i)`.
fn remap(t: &HostTensor, dims: Vec<usize>, src: impl Fn(&[usize], usize) -> usize) -> HostTensor {
    let total: usize = dims.iter().product();
    let mut c = vec![0usize; dims.len()];
    let mut idx = Vec::with_capacity(total);
    for i in 0..total {
        idx.push(src(&c, i));
        for a in (0..dims.len()).rev() {
            c[a] += 1;
            if c[a] < dims[a] {
                break;
            }
            c[a] = 0;
        }
    }
    let data = match &t.data {
        HostData::F(v) => HostData::F(idx.iter().map(|&j| v[j]).collect()),
        HostData::I(v) => HostData::I(idx.iter().map(|&j| v[j]).collect()),
    };
    HostTensor { elem: t.elem, dims, data }
}

fn expand(t: &HostTensor, dims: &[usize]) -> Result<HostTensor> {
    if t.dims == dims {
        return Ok(t.clone());
    }
    let total = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if total.is_none_or(|t| t > HOST_MAX) {
        return Err(super::super::value::fmt_err(format!("a result of shape {dims:?} {TOO_LARGE}")));
    }
    let off = dims.len() - t.dims.len();
    let st = strides(&t.dims);
    let src = t.dims.clone();
    Ok(remap(t, dims.to_vec(), |c, _| (0..src.len()).map(|i| if src[i] == 1 { 0 } else { c[off + i] * st[i] }).sum()))
}

fn slice(t: &HostTensor, plan: &[(usize, usize, i64)]) -> HostTensor {
    let dims: Vec<usize> = plan.iter().map(|p| p.1).collect();
    let st = strides(&t.dims);
    remap(t, dims, |c, _| {
        c.iter()
            .zip(plan)
            .zip(&st)
            .map(|((&ci, &(s, _, step)), &stride)| ((s as i64 + ci as i64 * step) as usize) * stride)
            .sum()
    })
}

fn concat(n: &Node, parts: &[&HostTensor], ax: i64) -> Result<HostTensor> {
    let first = parts.first().ok_or_else(|| n.err("Concat needs at least one input"))?;
    let r = first.dims.len();
    let a = axis(n, ax, r)?;
    let mut dims = first.dims.clone();
    dims[a] = 0;
    for p in parts {
        let same = p.dims.len() == r && (0..r).all(|i| i == a || p.dims[i] == first.dims[i]);
        if !same || p.elem.is_float() != first.elem.is_float() {
            return Err(n.err(format!("cannot concatenate {:?} with {:?} on axis {a}", first.dims, p.dims)));
        }
        dims[a] += p.dims[a];
    }
    let outer: usize = dims[..a].iter().product();
    let inner: usize = dims[a + 1..].iter().product();
    let mut f = Vec::new();
    let mut i = Vec::new();
    for o in 0..outer {
        for p in parts {
            let chunk = p.dims[a] * inner;
            match &p.data {
                HostData::F(v) => f.extend_from_slice(&v[o * chunk..(o + 1) * chunk]),
                HostData::I(v) => i.extend_from_slice(&v[o * chunk..(o + 1) * chunk]),
            }
        }
    }
    let data = if first.elem.is_float() { HostData::F(f) } else { HostData::I(i) };
    HostTensor::new(first.elem, dims, data)
}

fn gather(n: &Node, t: &HostTensor, idx: &HostTensor, ax: i64) -> Result<HostTensor> {
    let a = axis(n, ax, t.dims.len())?;
    let d = t.dims[a] as i64;
    let ids: Vec<usize> = idx
        .ints()
        .iter()
        .map(|&i| {
            let j = if i < 0 { i + d } else { i };
            if j < 0 || j >= d {
                Err(n.err(format!("index {i} is out of range for axis {a} of size {d}")))
            } else {
                Ok(j as usize)
            }
        })
        .collect::<Result<_>>()?;
    let mut dims = t.dims[..a].to_vec();
    dims.extend_from_slice(&idx.dims);
    dims.extend_from_slice(&t.dims[a + 1..]);
    check_size(n, &dims)?;
    let st = strides(&t.dims);
    let k = idx.dims.len();
    let idst = strides(&idx.dims);
    Ok(remap(t, dims, |c, _| {
        let pos: usize = (0..k).map(|j| c[a + j] * idst[j]).sum();
        let mut off = ids[pos] * st[a];
        for i in 0..a {
            off += c[i] * st[i];
        }
        for i in a + 1..t.dims.len() {
            off += c[i + k - 1] * st[i];
        }
        off
    }))
}

fn binary(n: &Node, op: &str, a: &HostTensor, b: &HostTensor) -> Result<HostTensor> {
    let dims = crate::shape::broadcast_shapes(&a.dims, &b.dims)
        .ok_or_else(|| n.err(format!("shapes {:?} and {:?} cannot be broadcast together", a.dims, b.dims)))?;
    let (x, y) = (expand(a, &dims)?, expand(b, &dims)?);
    let cmp = matches!(op, "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "And" | "Or" | "Xor");
    let len = x.numel();
    if cmp {
        let f = |p: f64, q: f64| -> bool {
            match op {
                "Equal" => p == q,
                "Less" => p < q,
                "LessOrEqual" => p <= q,
                "Greater" => p > q,
                "GreaterOrEqual" => p >= q,
                "And" => p != 0.0 && q != 0.0,
                "Or" => p != 0.0 || q != 0.0,
                _ => (p != 0.0) != (q != 0.0),
            }
        };
        // Integers compare exactly (i64 values above 2^53 do not survive f64).
        let v: Vec<i64> = match (&x.data, &y.data) {
            (HostData::I(p), HostData::I(q)) => (0..len)
                .map(|i| {
                    let (p, q) = (p[i], q[i]);
                    (match op {
                        "Equal" => p == q,
                        "Less" => p < q,
                        "LessOrEqual" => p <= q,
                        "Greater" => p > q,
                        "GreaterOrEqual" => p >= q,
                        _ => f(p as f64, q as f64),
                    }) as i64
                })
                .collect(),
            _ => (0..len).map(|i| f(x.data.f(i), y.data.f(i)) as i64).collect(),
        };
        return HostTensor::new(Elem::Bool, dims, HostData::I(v));
    }
    let elem = a.elem;
    let data = match (&x.data, &y.data) {
        (HostData::I(p), HostData::I(q)) if op != "Pow" => {
            let f = |p: i64, q: i64| -> i64 {
                match op {
                    "Add" | "Sum" => p.wrapping_add(q),
                    "Sub" => p.wrapping_sub(q),
                    "Mul" => p.wrapping_mul(q),
                    "Div" => {
                        if q == 0 {
                            0
                        } else {
                            p.wrapping_div(q)
                        }
                    }
                    "Mod" => {
                        if q == 0 {
                            0
                        } else if n.attr_int("fmod", 0) != 0 {
                            p.wrapping_rem(q)
                        } else {
                            let r = p.wrapping_rem(q);
                            if r != 0 && ((r < 0) != (q < 0)) {
                                r + q
                            } else {
                                r
                            }
                        }
                    }
                    "Max" => p.max(q),
                    _ => p.min(q),
                }
            };
            HostData::I((0..len).map(|i| elem.round(f(p[i], q[i]) as f64) as i64).collect::<Vec<_>>())
        }
        _ => {
            let f = |p: f64, q: f64| -> f64 {
                match op {
                    "Add" | "Sum" => p + q,
                    "Sub" => p - q,
                    "Mul" => p * q,
                    "Div" => p / q,
                    "Pow" => p.powf(q),
                    "Mod" => {
                        if n.attr_int("fmod", 0) != 0 {
                            p % q
                        } else {
                            p - (p / q).floor() * q
                        }
                    }
                    "Max" => {
                        if p.is_nan() || q.is_nan() {
                            f64::NAN
                        } else {
                            p.max(q)
                        }
                    }
                    _ => {
                        if p.is_nan() || q.is_nan() {
                            f64::NAN
                        } else {
                            p.min(q)
                        }
                    }
                }
            };
            let v: Vec<f64> = (0..len).map(|i| elem.round(f(x.data.f(i), y.data.f(i)))).collect();
            if elem.is_float() {
                HostData::F(v)
            } else {
                HostData::I(v.iter().map(|&x| x as i64).collect())
            }
        }
    };
    HostTensor::new(elem, dims, data)
}

fn unary(n: &Node, op: &str, t: &HostTensor) -> Result<HostTensor> {
    let out_elem = if op == "Not" { Elem::Bool } else { t.elem };
    if let (HostData::I(v), true) = (&t.data, matches!(op, "Neg" | "Abs" | "Sign" | "Not" | "Floor" | "Ceil" | "Round"))
    {
        let f = |x: i64| -> i64 {
            match op {
                "Neg" => x.wrapping_neg(),
                "Abs" => x.wrapping_abs(),
                "Sign" => x.signum(),
                "Not" => (x == 0) as i64,
                _ => x,
            }
        };
        return HostTensor::new(out_elem, t.dims.clone(), HostData::I(v.iter().map(|&x| f(x)).collect()));
    }
    if !t.elem.is_float() {
        return Err(n.err(format!("{op} of {} values", t.elem)));
    }
    let f = |x: f64| -> f64 {
        match op {
            "Neg" => -x,
            "Abs" => x.abs(),
            "Floor" => x.floor(),
            "Ceil" => x.ceil(),
            "Round" => x.round_ties_even(),
            "Sqrt" => x.sqrt(),
            "Sign" => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                }
            }
            "Reciprocal" => 1.0 / x,
            "Exp" => x.exp(),
            "Log" => x.ln(),
            _ => (x == 0.0) as i64 as f64,
        }
    };
    HostTensor::from_f64(out_elem, t.dims.clone(), &t.floats().iter().map(|&x| f(x)).collect::<Vec<_>>())
}

fn reduce(
    n: &Node,
    op: &str,
    t: &HostTensor,
    axes: Option<Vec<i64>>,
    keep: bool,
    noop_empty: bool,
) -> Result<HostTensor> {
    let r = t.dims.len();
    let axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a.iter().map(|&x| axis(n, x, r)).collect::<Result<_>>()?,
        _ if noop_empty => return Ok(t.clone()),
        _ => (0..r).collect(),
    };
    let out_dims: Vec<usize> = (0..r).map(|i| if axes.contains(&i) { 1 } else { t.dims[i] }).collect();
    let total: usize = out_dims.iter().product();
    let ost = strides(&out_dims);
    let mut acc: Vec<Option<f64>> = vec![None; total];
    let mut count = vec![0usize; total];
    let ist = strides(&t.dims);
    for i in 0..t.numel() {
        let mut o = 0;
        for a in 0..r {
            let c = (i / ist[a].max(1)) % t.dims[a].max(1);
            if !axes.contains(&a) {
                o += c * ost[a];
            }
        }
        let x = t.data.f(i);
        count[o] += 1;
        acc[o] = Some(match (acc[o], op) {
            (None, _) => x,
            (Some(s), "ReduceSum" | "ReduceMean") => s + x,
            (Some(s), "ReduceProd") => s * x,
            (Some(s), "ReduceMax") => s.max(x),
            (Some(s), _) => s.min(x),
        });
    }
    let vals: Vec<f64> = acc
        .iter()
        .zip(&count)
        .map(|(a, &c)| match (a, op) {
            (Some(s), "ReduceMean") => s / c as f64,
            (Some(s), _) => *s,
            (None, "ReduceProd") => 1.0,
            (None, "ReduceMax") => f64::NEG_INFINITY,
            (None, "ReduceMin") => f64::INFINITY,
            (None, _) => 0.0,
        })
        .collect();
    let dims = if keep { out_dims } else { (0..r).filter(|i| !axes.contains(i)).map(|i| t.dims[i]).collect() };
    HostTensor::from_f64(t.elem, dims, &vals)
}
