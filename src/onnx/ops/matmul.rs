//! Products: MatMul and Gemm (with weights converted at load to f16, Q8_0 or Q4_0), and
//! the int8 family: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
//! MatMulInteger and QLinearMatMul. Integer products run in f32, exact while the sums
//! stay under 2^24.

use super::{as_float, axis, dev, input, opt, Cx};
use crate::onnx::read::Node;
use crate::onnx::value::{Elem, Value};
use crate::{DType, Result, Tensor};

/// `a @ b` for an `a` of any rank and a 2-D `b` given as `b^T` (`[N, K]`, possibly f16
/// or quantised): leading axes are flattened into one 2-D product, as `nn::Linear` does.
fn times_transposed(a: &Tensor, wt: &Tensor) -> Tensor {
    let (lead, k) = a.dims().split_at(a.rank().saturating_sub(1));
    let k = k.first().copied().unwrap_or(1);
    let a2 = if a.rank() != 2 { a.reshape(vec![lead.iter().product(), k]) } else { a.clone() };
    let y = if wt.dtype() == DType::F16 {
        let a16 = if a2.dtype() == DType::F16 { a2 } else { a2.cast(DType::F16) };
        a16.matmul(&wt.t()).cast(a.dtype())
    } else {
        a2.matmul(&wt.t())
    };
    if a.rank() != 2 {
        let mut d = lead.to_vec();
        d.push(wt.dims()[0]);
        y.reshape(d)
    } else {
        y
    }
}

/// `a @ b` with numpy's matmul rules; a 2-D `b` against a higher-rank `a` is one
/// flattened 2-D product.
pub(crate) fn product(a: &Tensor, b: &Tensor) -> Tensor {
    let dt = a.dtype();
    let (a, b) = if !dt.is_float() || !b.dtype().is_float() {
        (as_float(a), as_float(b))
    } else if b.dtype() != dt {
        (a.clone(), b.cast(dt))
    } else {
        (a.clone(), b.clone())
    };
    let y = if b.rank() == 2 && a.rank() > 2 {
        let (lead, k) = a.dims().split_at(a.rank() - 1);
        let y = a.reshape(vec![lead.iter().product(), k[0]]).matmul(&b);
        let mut d = lead.to_vec();
        d.push(b.dims()[1]);
        y.reshape(d)
    } else {
        a.matmul(&b)
    };
    if dt.is_float() {
        y
    } else {
        y.round().cast(dt)
    }
}

pub(crate) fn matmul(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let elem = input(n, ins, 0)?.elem();
    let a = cx.tin(n, ins, 0)?;
    if let Some(p) = n.inputs.get(1).and_then(|w| cx.prepared.get(w)) {
        return Ok(vec![dev(times_transposed(&a, &p.wt), elem)]);
    }
    let b = cx.tin(n, ins, 1)?;
    Ok(vec![dev(product(&a, &b), elem)])
}

pub(crate) fn gemm(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let elem = input(n, ins, 0)?.elem();
    let mut a = cx.tin(n, ins, 0)?;
    if n.attr_int("transA", 0) != 0 {
        a = a.t();
    }
    let (alpha, beta) = (n.attr_float("alpha", 1.0) as f64, n.attr_float("beta", 1.0) as f64);
    let mut y = match n.inputs.get(1).and_then(|w| cx.prepared.get(w)) {
        Some(p) => times_transposed(&a, &p.wt),
        None => {
            let mut b = cx.tin(n, ins, 1)?;
            if n.attr_int("transB", 0) != 0 {
                b = b.t();
            }
            product(&a, &b)
        }
    };
    if alpha != 1.0 {
        y = y.mul_scalar(alpha);
    }
    if let Some(c) = cx.topt(n, ins, 2)? {
        let c = if c.dtype() != y.dtype() { c.cast(y.dtype()) } else { c };
        y = y.add(&if beta != 1.0 { c.mul_scalar(beta) } else { c });
    }
    Ok(vec![dev(y, elem)])
}

/// A per-axis scale or zero point shaped to broadcast along `axis` of a rank-`r` input.
fn along(n: &Node, t: Tensor, r: usize) -> Result<Tensor> {
    if t.rank() == 0 || t.numel() == 1 {
        return Ok(t.reshape(Vec::<usize>::new()));
    }
    if t.rank() != 1 {
        return Err(n.err("blocked quantisation is not supported (scales must be scalars or 1-D)"));
    }
    let a = axis(n, n.attr_int("axis", 1), r)?;
    let mut d = vec![1usize; r];
    d[a] = t.numel();
    Ok(t.reshape(d))
}

pub(crate) fn quantize_linear(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    if n.attr_int("block_size", 0) != 0 {
        return Err(n.err("blocked quantisation is not supported"));
    }
    let x = as_float(&cx.tin(n, ins, 0)?).cast(DType::F32);
    let r = x.rank();
    let scale = along(n, cx.tin(n, ins, 1)?.cast(DType::F32), r)?;
    let out = match (opt(ins, 2), n.attr_int("output_dtype", 0)) {
        (Some(z), _) => z.elem(),
        (None, 0) => Elem::U8,
        (None, c) => Elem::from_proto(c as i32).ok_or_else(|| n.err(format!("output_dtype {c}")))?,
    };
    let (lo, hi) = out.int_range().ok_or_else(|| n.err(format!("quantising to {out} is not supported")))?;
    let mut q = x.div(&scale).round();
    if let Some(z) = cx.topt(n, ins, 2)? {
        q = q.add(&along(n, as_float(&z).cast(DType::F32), r)?);
    }
    let q = q.maximum_scalar(lo as f64).minimum_scalar(hi as f64).cast(DType::I32);
    Ok(vec![dev(q, out)])
}

pub(crate) fn dequantize_linear(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    if n.attr_int("block_size", 0) != 0 {
        return Err(n.err("blocked quantisation is not supported"));
    }
    let x = as_float(&cx.tin(n, ins, 0)?).cast(DType::F32);
    let r = x.rank();
    let sv = input(n, ins, 1)?;
    let scale = along(n, cx.t(sv, &n.inputs[1])?.cast(DType::F32), r)?;
    let mut y = x;
    if let Some(z) = cx.topt(n, ins, 2)? {
        y = y.sub(&along(n, as_float(&z).cast(DType::F32), r)?);
    }
    let y = y.mul(&scale);
    let elem = sv.elem();
    Ok(vec![dev(y.cast(elem.dtype()), elem)])
}

pub(crate) fn dynamic_quantize_linear(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let x = as_float(&cx.tin(n, ins, 0)?).cast(DType::F32);
    let lo = x.min_all().minimum_scalar(0.0);
    let hi = x.max_all().maximum_scalar(0.0);
    let scale = hi.sub(&lo).div_scalar(255.0);
    // All zeros: any scale works; keep it finite.
    let safe = Tensor::where_(&scale.eq_scalar(0.0), &scale.ones_like(), &scale);
    let zp = lo.neg().div(&safe).round().maximum_scalar(0.0).minimum_scalar(255.0);
    let y = x.div(&safe).round().add(&zp).maximum_scalar(0.0).minimum_scalar(255.0);
    Ok(vec![dev(y.cast(DType::I32), Elem::U8), dev(scale, Elem::F32), dev(zp.cast(DType::I32), Elem::U8)])
}

pub(crate) fn matmul_integer(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let mut a = as_float(&cx.tin(n, ins, 0)?).cast(DType::F32);
    let mut b = as_float(&cx.tin(n, ins, 1)?).cast(DType::F32);
    if let Some(z) = cx.topt(n, ins, 2)? {
        let z = as_float(&z).cast(DType::F32);
        // A per-row zero point of A is `[M]`: one per row, so `[M, 1]`.
        a = a.sub(&if z.numel() > 1 { z.reshape([z.numel(), 1]) } else { z.reshape(Vec::<usize>::new()) });
    }
    if let Some(z) = cx.topt(n, ins, 3)? {
        b = b.sub(&as_float(&z).cast(DType::F32));
    }
    Ok(vec![dev(product(&a, &b).round().cast(DType::I32), Elem::I32)])
}

pub(crate) fn qlinear_matmul(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let deq = |x: usize, s: usize, z: usize| -> Result<Tensor> {
        let v = as_float(&cx.tin(n, ins, x)?).cast(DType::F32);
        let z = as_float(&cx.tin(n, ins, z)?).cast(DType::F32);
        let s = cx.tin(n, ins, s)?.cast(DType::F32);
        Ok(v.sub(&z).mul(&s))
    };
    let y = product(&deq(0, 1, 2)?, &deq(3, 4, 5)?);
    let out = input(n, ins, 7)?.elem();
    let (lo, hi) = out.int_range().ok_or_else(|| n.err(format!("quantising to {out}")))?;
    let s = cx.tin(n, ins, 6)?.cast(DType::F32);
    let z = as_float(&cx.tin(n, ins, 7)?).cast(DType::F32);
    let q = y.div(&s).round().add(&z).maximum_scalar(lo as f64).minimum_scalar(hi as f64);
    Ok(vec![dev(q.cast(DType::I32), out)])
}

/// Einsum by broadcasting: every operand permuted to one letter order, multiplied, and
/// the letters missing from the output summed. Diagonals (a letter twice in one term)
/// are not supported.
pub(crate) fn einsum(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let elem = input(n, ins, 0)?.elem();
    let eq: String = n.attr_str("equation", "").chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    let ts: Vec<Tensor> = (0..terms.len()).map(|i| cx.tin(n, ins, i)).collect::<Result<_>>()?;
    if terms.len() != ts.len() {
        return Err(n.err(format!("equation '{eq}' has {} terms for {} inputs", terms.len(), ts.len())));
    }
    // Expand "..." into placeholder letters ('0', '1', ...) of the broadcast rank.
    // (At most 9 of them; a term naming more axes than its input has, or needing more
    // placeholders, then fails the letter count check below.)
    let mut ell = 0usize;
    for (t, x) in terms.iter().zip(&ts) {
        if t.contains("...") {
            ell = ell.max((x.rank() + 3).saturating_sub(t.chars().count()).min(9));
        }
    }
    let fill = |t: &str, rank: usize| -> Vec<char> {
        let mut out = Vec::new();
        let named = t.chars().filter(|c| c.is_alphabetic()).count();
        for part in t.split("...").enumerate() {
            if part.0 == 1 {
                let k = rank.saturating_sub(named).min(ell);
                out.extend((ell - k..ell).map(|i| char::from(b'0' + i as u8)));
            }
            out.extend(part.1.chars());
        }
        out
    };
    let letters: Vec<Vec<char>> = terms.iter().zip(&ts).map(|(t, x)| fill(t, x.rank())).collect();
    for (l, x) in letters.iter().zip(&ts) {
        let mut seen = std::collections::HashSet::new();
        if l.len() != x.rank() || !l.iter().all(|c| seen.insert(*c)) {
            return Err(
                n.err(format!("einsum term for shape {:?} in '{eq}' is not supported (diagonals are not)", x.dims()))
            );
        }
    }
    let mut all: Vec<char> = (0..ell).map(|i| char::from(b'0' + i as u8)).collect();
    for l in &letters {
        for c in l {
            if !all.contains(c) {
                all.push(*c);
            }
        }
    }
    let out: Vec<char> = match rhs {
        Some(r) => fill(&r, ell + r.chars().filter(|c| c.is_alphabetic()).count()),
        None => {
            let mut once: Vec<char> = all
                .iter()
                .filter(|c| c.is_alphabetic() && letters.iter().flatten().filter(|d| d == c).count() == 1)
                .copied()
                .collect();
            once.sort();
            (0..ell).map(|i| char::from(b'0' + i as u8)).chain(once).collect()
        }
    };
    let mut acc: Option<Tensor> = None;
    for (l, x) in letters.iter().zip(&ts) {
        let present: Vec<char> = all.iter().filter(|c| l.contains(c)).copied().collect();
        let perm: Vec<usize> = present.iter().map(|c| l.iter().position(|d| d == c).unwrap_or(0)).collect();
        let xp = as_float(x).permute(&perm);
        let shape: Vec<usize> =
            all.iter().map(|c| present.iter().position(|d| d == c).map_or(1, |i| xp.dims()[i])).collect();
        let xr = xp.reshape(shape);
        acc = Some(match acc {
            Some(a) => a.mul(&xr),
            None => xr,
        });
    }
    let mut y = acc.ok_or_else(|| n.err("no operands"))?;
    let summed: Vec<isize> = (0..all.len()).filter(|&i| !out.contains(&all[i])).map(|i| i as isize).collect();
    let kept: Vec<char> = all.iter().filter(|c| out.contains(c)).copied().collect();
    if !summed.is_empty() {
        y = y.sum(&summed, false);
    }
    if kept.len() != out.len() {
        return Err(n.err(format!("output letters of '{eq}' do not appear in the inputs")));
    }
    let perm: Vec<usize> = out.iter().map(|c| kept.iter().position(|d| d == c).unwrap_or(0)).collect();
    if perm.iter().enumerate().any(|(i, &p)| i != p) {
        y = y.permute(&perm);
    }
    let dt = ts[0].dtype();
    let y = if dt.is_float() { y.cast(dt) } else { y.round().cast(dt) };
    Ok(vec![dev(y, elem)])
}
