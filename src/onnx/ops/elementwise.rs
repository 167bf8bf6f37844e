//! Element-wise ONNX ops: arithmetic and comparisons with numpy broadcasting, the
//! unary functions and activations, Clip, Where, Cast, Identity and Dropout.

use super::{as_float, dev, input, opt, Cx};
use crate::onnx::read::Node;
use crate::onnx::value::{Elem, Value};
use crate::{DType, Result, Tensor};

pub(crate) fn binary(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let elem = input(n, ins, 0)?.elem();
    let (x, y) = (cx.tin(n, ins, 0)?, cx.tin(n, ins, 1)?);
    let out = |t: Tensor| Ok(vec![dev(t, elem)]);
    let mask = |t: Tensor| Ok(vec![dev(t, Elem::Bool)]);
    // Mixed device dtypes (an f16 model fed an f32 constant, say): follow the first.
    let y = if y.dtype() != x.dtype() && n.op != "Pow" && n.op != "BitShift" { y.cast(x.dtype()) } else { y };
    match n.op.as_str() {
        "Add" => out(x.add(&y)),
        "Sub" => out(x.sub(&y)),
        "Mul" => out(x.mul(&y)),
        "Div" => out(x.div(&y)),
        "Pow" => {
            if x.dtype().is_float() {
                out(x.pow(&y.cast(x.dtype())))
            } else {
                out(as_float(&x).pow(&as_float(&y)).round().cast(x.dtype()))
            }
        }
        "Mod" => {
            let (xf, yf) = (as_float(&x), as_float(&y));
            let q = xf.div(&yf);
            let whole = if n.attr_int("fmod", 0) != 0 {
                // C's fmod: the quotient truncated toward zero.
                Tensor::where_(&q.lt_scalar(0.0), &q.ceil(), &q.floor())
            } else {
                q.floor()
            };
            let r = xf.sub(&whole.mul(&yf));
            out(if x.dtype().is_float() { r } else { r.round().cast(x.dtype()) })
        }
        "BitShift" => {
            let p = cx.scalar(2.0, DType::F32).pow(&as_float(&y));
            let r =
                if n.attr_str("direction", "") == "LEFT" { as_float(&x).mul(&p) } else { as_float(&x).div(&p).floor() };
            out(r.cast(x.dtype()))
        }
        "Equal" => mask(x.eq(&y)),
        "Less" => mask(x.lt(&y)),
        "LessOrEqual" => mask(x.le(&y)),
        "Greater" => mask(x.gt(&y)),
        "GreaterOrEqual" => mask(x.ge(&y)),
        "And" => mask(x.logical_and(&y)),
        "Or" => mask(x.logical_or(&y)),
        "Xor" => mask(x.ne(&y)),
        op => Err(n.err(format!("{op} is not a binary op"))),
    }
}

/// Max, Min, Sum and Mean of any number of inputs, broadcasting.
pub(crate) fn variadic(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let elem = input(n, ins, 0)?.elem();
    let mut ts = Vec::new();
    for (i, v) in ins.iter().enumerate() {
        if let Some(v) = v {
            ts.push(cx.t(v, &n.inputs[i])?);
        }
    }
    let count = ts.len();
    let mut acc = ts[0].clone();
    for t in &ts[1..] {
        let t = if t.dtype() != acc.dtype() { t.cast(acc.dtype()) } else { t.clone() };
        acc = match n.op.as_str() {
            "Max" => acc.maximum(&t),
            "Min" => acc.minimum(&t),
            _ => acc.add(&t),
        };
    }
    if n.op == "Mean" {
        acc = acc.div_scalar(count as f64);
    }
    Ok(vec![dev(acc, elem)])
}

pub(crate) fn unary(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let elem = input(n, ins, 0)?.elem();
    let x = cx.tin(n, ins, 0)?;
    let a = |k: &str, d: f32| n.attr_float(k, d) as f64;
    let mask = |t: Tensor| Ok(vec![dev(t, Elem::Bool)]);
    let y = match n.op.as_str() {
        "Abs" => x.abs(),
        "Neg" => x.neg(),
        "Not" => return mask(x.logical_not()),
        "Sign" => {
            let one = |m: Tensor| m.cast(x.dtype());
            one(x.gt_scalar(0.0)).sub(&one(x.lt_scalar(0.0)))
        }
        "IsNaN" => return mask(x.ne(&x)),
        "IsInf" => {
            let pos = x.eq_scalar(f64::INFINITY);
            let neg = x.eq_scalar(f64::NEG_INFINITY);
            return mask(match (n.attr_int("detect_positive", 1) != 0, n.attr_int("detect_negative", 1) != 0) {
                (true, true) => pos.logical_or(&neg),
                (true, false) => pos,
                (false, true) => neg,
                (false, false) => x.ne(&x).logical_and(&x.eq(&x)),
            });
        }
        "Floor" if !x.dtype().is_float() => x,
        "Ceil" if !x.dtype().is_float() => x,
        "Round" if !x.dtype().is_float() => x,
        "Relu" => x.relu(),
        _ if !x.dtype().is_float() => {
            return Err(n.err(format!("{} of {} values is not supported", n.op, elem)));
        }
        "Exp" => x.exp(),
        "Log" => x.log(),
        "Sqrt" => x.sqrt(),
        "Reciprocal" => x.recip(),
        "Sin" => x.sin(),
        "Cos" => x.cos(),
        "Tan" => x.sin().div(&x.cos()),
        "Tanh" => x.tanh(),
        "Sigmoid" => x.sigmoid(),
        "Erf" => x.erf(),
        "Floor" => x.floor(),
        "Ceil" => x.ceil(),
        "Round" => x.round(),
        "Sinh" => x.exp().sub(&x.neg().exp()).mul_scalar(0.5),
        "Cosh" => x.exp().add(&x.neg().exp()).mul_scalar(0.5),
        "Softplus" => softplus(&x),
        "Softsign" => x.div(&x.abs().add_scalar(1.0)),
        "Mish" => x.mul(&softplus(&x).tanh()),
        "LeakyRelu" => {
            let alpha = a("alpha", 0.01);
            Tensor::where_(&x.lt_scalar(0.0), &x.mul_scalar(alpha), &x)
        }
        "Elu" => {
            let alpha = a("alpha", 1.0);
            Tensor::where_(&x.lt_scalar(0.0), &x.exp().sub_scalar(1.0).mul_scalar(alpha), &x)
        }
        "Selu" => {
            let (alpha, gamma) = (a("alpha", 1.673_263_2), a("gamma", 1.050_701));
            Tensor::where_(&x.le_scalar(0.0), &x.exp().sub_scalar(1.0).mul_scalar(alpha), &x).mul_scalar(gamma)
        }
        "Celu" => {
            let alpha = a("alpha", 1.0);
            x.relu().add(&x.div_scalar(alpha).exp().sub_scalar(1.0).mul_scalar(alpha).minimum_scalar(0.0))
        }
        "HardSigmoid" => {
            x.mul_scalar(a("alpha", 0.2)).add_scalar(a("beta", 0.5)).maximum_scalar(0.0).minimum_scalar(1.0)
        }
        "HardSwish" => x.mul(&x.div_scalar(6.0).add_scalar(0.5).maximum_scalar(0.0).minimum_scalar(1.0)),
        "Swish" => x.mul(&x.mul_scalar(a("alpha", 1.0)).sigmoid()),
        "Shrink" => {
            let (l, b) = (a("lambd", 0.5), a("bias", 0.0));
            let zero = x.zeros_like();
            Tensor::where_(
                &x.lt_scalar(-l),
                &x.add_scalar(b),
                &Tensor::where_(&x.gt_scalar(l), &x.sub_scalar(b), &zero),
            )
        }
        "ThresholdedRelu" => Tensor::where_(&x.gt_scalar(a("alpha", 1.0)), &x, &x.zeros_like()),
        "Gelu" => {
            if n.attr_str("approximate", "none") == "tanh" {
                x.gelu_tanh()
            } else {
                x.gelu()
            }
        }
        op => return Err(n.err(format!("{op} is not a unary op"))),
    };
    let _ = cx;
    Ok(vec![dev(y, elem)])
}

/// `log(1 + e^x)` without overflow: `max(x, 0) + log(1 + e^-|x|)`.
fn softplus(x: &Tensor) -> Tensor {
    x.relu().add(&x.abs().neg().exp().add_scalar(1.0).log())
}

pub(crate) fn prelu(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let elem = input(n, ins, 0)?.elem();
    let x = cx.tin(n, ins, 0)?;
    let s = cx.tin(n, ins, 1)?;
    let s = if s.dtype() != x.dtype() { s.cast(x.dtype()) } else { s };
    Ok(vec![dev(Tensor::where_(&x.lt_scalar(0.0), &x.mul(&s), &x), elem)])
}

pub(crate) fn clip(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let elem = input(n, ins, 0)?.elem();
    let mut x = cx.tin(n, ins, 0)?;
    if cx.opset < 11 {
        let (lo, hi) = (n.attr_float("min", f32::MIN) as f64, n.attr_float("max", f32::MAX) as f64);
        return Ok(vec![dev(x.maximum_scalar(lo).minimum_scalar(hi), elem)]);
    }
    for (i, upper) in [(1, false), (2, true)] {
        let Some(b) = opt(ins, i) else { continue };
        x = match b.as_host() {
            Some(h) if h.numel() == 1 => {
                let v = h.data.f(0);
                if upper {
                    x.minimum_scalar(v)
                } else {
                    x.maximum_scalar(v)
                }
            }
            _ => {
                let t = cx.t(b, &n.inputs[i])?;
                let t = if t.dtype() != x.dtype() { t.cast(x.dtype()) } else { t };
                if upper {
                    x.minimum(&t)
                } else {
                    x.maximum(&t)
                }
            }
        };
    }
    Ok(vec![dev(x, elem)])
}

pub(crate) fn where_(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let elem = input(n, ins, 1)?.elem();
    let c = cx.tin(n, ins, 0)?;
    let c = if c.dtype() == DType::Bool { c } else { c.ne_scalar(0.0) };
    let (a, b) = (cx.tin(n, ins, 1)?, cx.tin(n, ins, 2)?);
    let b = if b.dtype() != a.dtype() { b.cast(a.dtype()) } else { b };
    Ok(vec![dev(Tensor::where_(&c, &a, &b), elem)])
}

pub(crate) fn cast(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let to = if n.op == "CastLike" {
        input(n, ins, 1)?.elem()
    } else {
        let code = n.attr_int("to", 0) as i32;
        Elem::from_proto(code).ok_or_else(|| n.err(format!("casting to data type {code} is not supported")))?
    };
    let v = input(n, ins, 0)?;
    if let Some(h) = v.as_host() {
        if h.numel() <= super::host::HOST_MAX && !matches!(v, Value::Device(..)) && h.numel() <= 1024 {
            return Ok(vec![Value::host(h.cast(to))]);
        }
    }
    let x = cx.t(v, &n.inputs[0])?;
    let y = if to == Elem::Bool && x.dtype() != DType::Bool {
        x.ne_scalar(0.0)
    } else if !to.is_float() && x.dtype().is_float() {
        // Float to integer truncates toward zero, then narrow types wrap into range.
        narrow(x.cast(DType::I32), to)
    } else if !to.is_float() && to != Elem::Bool && x.dtype() == DType::I32 {
        narrow(x, to)
    } else {
        x.cast(to.dtype())
    };
    Ok(vec![dev(y, to)])
}

/// Wrap i32 values into an 8- or 16-bit type's range, as a C cast does.
fn narrow(x: Tensor, to: Elem) -> Tensor {
    let bits = match to {
        Elem::I8 | Elem::U8 => 8,
        Elem::I16 | Elem::U16 => 16,
        _ => return x,
    };
    let m = (1i64 << bits) as f64;
    let xf = x.cast(DType::F32);
    let mut r = xf.sub(&xf.div_scalar(m).floor().mul_scalar(m));
    if matches!(to, Elem::I8 | Elem::I16) {
        let half = m / 2.0;
        r = Tensor::where_(&r.ge_scalar(half), &r.sub_scalar(m), &r);
    }
    r.cast(DType::I32)
}

pub(crate) fn identity(_: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    Ok(vec![input(n, ins, 0)?.clone()])
}

pub(crate) fn dropout(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    if let Some(t) = opt(ins, 2) {
        if t.as_host().is_none_or(|h| h.numel() != 1 || h.data.f(0) != 0.0) {
            return Err(n.err("Dropout in training mode is not supported (inference only)"));
        }
    }
    let x = input(n, ins, 0)?.clone();
    let mut out = vec![x.clone()];
    if n.wants(1) {
        let dims = x.dims().to_vec();
        out.push(dev(Tensor::full(1.0, dims, DType::Bool, cx.dev), Elem::Bool));
    }
    Ok(out)
}
