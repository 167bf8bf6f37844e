//! Reductions (Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare),
//! ArgMax/ArgMin, and Softmax, LogSoftmax and Hardmax with their pre-13 flattening.

use super::{as_float, axis, dev, host_input, input, opt, Cx};
use crate::onnx::read::Node;
use crate::onnx::value::{Elem, Value};
use crate::{DType, Result, Tensor};

pub(crate) fn reduce(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let r = v.dims().len();
    let axes_from_input = cx.opset >= 18 || (n.op == "ReduceSum" && cx.opset >= 13);
    let axes = if axes_from_input {
        match opt(ins, 1) {
            Some(_) => Some(host_input(n, ins, 1, "axes")?.ints()),
            None => None,
        }
    } else {
        n.attr_ints("axes")
    };
    let keep = n.attr_int("keepdims", 1) != 0;
    let axes: Vec<isize> = match axes {
        Some(a) if !a.is_empty() => a.iter().map(|&x| axis(n, x, r).map(|a| a as isize)).collect::<Result<_>>()?,
        _ if n.attr_int("noop_with_empty_axes", 0) != 0 => return Ok(vec![v.clone()]),
        _ => (0..r as isize).collect(),
    };
    let x = cx.tin(n, ins, 0)?;
    let dt = x.dtype();
    let f = if dt == DType::F16 { x.clone() } else { as_float(&x) };
    if r == 0 {
        return Ok(vec![v.clone()]);
    }
    let y = match n.op.as_str() {
        "ReduceSum" if dt == DType::I32 => x.sum(&axes, keep),
        "ReduceMax" => x.max(&axes, keep),
        "ReduceMin" => x.min(&axes, keep),
        "ReduceSum" => f.sum(&axes, keep),
        "ReduceMean" => f.mean(&axes, keep),
        "ReduceL1" => f.abs().sum(&axes, keep),
        "ReduceL2" => f.square().sum(&axes, keep).sqrt(),
        "ReduceSumSquare" => f.square().sum(&axes, keep),
        "ReduceLogSum" => f.sum(&axes, keep).log(),
        "ReduceLogSumExp" => {
            let m = f.max(&axes, true);
            let m = Tensor::where_(&m.abs().eq_scalar(f64::INFINITY), &m.zeros_like(), &m);
            let s = f.sub(&m).exp().sum(&axes, true).log().add(&m);
            if keep {
                s
            } else {
                let dims: Vec<usize> = (0..r).filter(|i| !axes.contains(&(*i as isize))).map(|i| v.dims()[i]).collect();
                s.reshape(dims)
            }
        }
        "ReduceProd" => {
            // |x| multiplied as exp(sum(log|x|)), the sign from the count of negatives,
            // and any zero makes zero.
            let mag = f.abs().log().sum(&axes, keep).exp();
            let negs = f.lt_scalar(0.0).cast(DType::F32).sum(&axes, keep);
            let odd = negs.sub(&negs.div_scalar(2.0).floor().mul_scalar(2.0)).cast(f.dtype());
            let sign = odd.mul_scalar(-2.0).add_scalar(1.0);
            let zero = f.eq_scalar(0.0).cast(DType::F32).max(&axes, keep).gt_scalar(0.0);
            let p = mag.mul(&sign);
            Tensor::where_(&zero, &p.zeros_like(), &p)
        }
        op => return Err(n.err(format!("{op} is not a reduction"))),
    };
    let y = if y.dtype() != dt && !dt.is_float() {
        y.round().cast(dt)
    } else if y.dtype() != dt {
        y.cast(dt)
    } else {
        y
    };
    Ok(vec![dev(y, v.elem())])
}

pub(crate) fn arg(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let ax = axis(n, n.attr_int("axis", 0), v.dims().len())?;
    let keep = n.attr_int("keepdims", 1) != 0;
    let mut x = cx.tin(n, ins, 0)?;
    let d = v.dims()[ax];
    let last = n.attr_int("select_last_index", 0) != 0;
    if last {
        let rev: Vec<i32> = (0..d as i32).rev().collect();
        x = x.index_select(ax as isize, &Tensor::from_slice(&rev, [d], cx.dev));
    }
    let mut i = if n.op == "ArgMax" { x.argmax(&[ax as isize], keep) } else { x.argmin(&[ax as isize], keep) };
    if last {
        i = i.neg().add_scalar(d as f64 - 1.0);
    }
    Ok(vec![dev(i, Elem::I64)])
}

pub(crate) fn softmax(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let dims = v.dims().to_vec();
    let r = dims.len();
    let x = cx.tin(n, ins, 0)?;
    // Before opset 13 the input is flattened to 2-D at `axis` (default 1).
    let (x2, ax) = if cx.opset < 13 {
        let a = axis(n, n.attr_int("axis", 1), r.max(1))?;
        let outer: usize = dims[..a].iter().product();
        (x.reshape(vec![outer, dims[a..].iter().product()]), 1)
    } else {
        (x.clone(), axis(n, n.attr_int("axis", -1), r)?)
    };
    let y = match n.op.as_str() {
        "Softmax" => x2.softmax(ax as isize),
        "LogSoftmax" => x2.log_softmax(ax as isize),
        _ => {
            let d = x2.dims()[ax];
            let i = x2.argmax(&[ax as isize], true);
            let mut shape = vec![1usize; x2.rank()];
            shape[ax] = d;
            let range = Tensor::arange(0.0, d as f64, 1.0, DType::I32, cx.dev).reshape(shape);
            i.eq(&range).cast(x2.dtype())
        }
    };
    Ok(vec![dev(y.reshape(dims), v.elem())])
}

/// NegativeLogLikelihoodLoss, and SoftmaxCrossEntropyLoss (its log-softmax first).
pub(crate) fn nll_loss(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let elem = v.elem();
    let x = cx.tin(n, ins, 0)?;
    let dt = x.dtype();
    let xf = x.cast(DType::F32);
    if xf.rank() < 2 {
        return Err(n.err("the input must be [N, C, ...]"));
    }
    let logp = if n.op == "SoftmaxCrossEntropyLoss" { xf.log_softmax(1) } else { xf.clone() };
    let t = cx.tin(n, ins, 1)?;
    let valid = n.has_attr("ignore_index").then(|| t.ne_scalar(n.attr_int("ignore_index", 0) as f64));
    let safe = match &valid {
        Some(m) => Tensor::where_(m, &t, &t.zeros_like()),
        None => t.clone(),
    };
    let picked = logp.gather(1, &safe.unsqueeze(1)).squeeze(1);
    let mut w = match cx.topt(n, ins, 2)? {
        Some(w) => w.cast(DType::F32).index_select(0, &safe.flatten()).reshape(safe.dims().to_vec()),
        None => picked.ones_like(),
    };
    if let Some(m) = &valid {
        w = Tensor::where_(m, &w, &w.zeros_like());
    }
    let loss = picked.neg().mul(&w);
    let loss = match n.attr_str("reduction", "mean").as_str() {
        "none" => loss,
        "sum" => loss.sum_all(),
        _ => loss.sum_all().div(&w.sum_all()),
    };
    let mut out = vec![dev(loss.cast(dt), elem)];
    if n.wants(1) {
        out.push(dev(logp.cast(dt), elem));
    }
    Ok(out)
}

/// TopK by repeated arg-max (or arg-min) with the winners masked out: k reductions,
/// ties to the lower index, sorted. `k` up to 256.
pub(crate) fn top_k(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let v = input(n, ins, 0)?;
    let r = v.dims().len();
    let ax = axis(n, n.attr_int("axis", -1), r)?;
    let k = match opt(ins, 1) {
        Some(_) => host_input(n, ins, 1, "k")?.ints().first().copied().unwrap_or(0),
        None => n.attr_int("k", 0),
    };
    let d = v.dims()[ax] as i64;
    if k <= 0 || k > d || k > 256 {
        return Err(n.err(format!("k = {k} over an axis of {d} is not supported (1 to 256)")));
    }
    let largest = n.attr_int("largest", 1) != 0;
    let x = cx.tin(n, ins, 0)?;
    let mut cur = as_float(&x).cast(DType::F32);
    let mut shape = vec![1usize; r];
    shape[ax] = d as usize;
    let pos = Tensor::arange(0.0, d as f64, 1.0, DType::I32, cx.dev).reshape(shape);
    let fill = Tensor::full(if largest { f64::NEG_INFINITY } else { f64::INFINITY }, (), DType::F32, cx.dev);
    let (mut vals, mut idxs) = (Vec::new(), Vec::new());
    for _ in 0..k {
        let i = if largest { cur.argmax(&[ax as isize], true) } else { cur.argmin(&[ax as isize], true) };
        vals.push(x.gather(ax as isize, &i));
        cur = Tensor::where_(&pos.eq(&i), &fill, &cur);
        idxs.push(i);
    }
    let cat = |t: Vec<Tensor>| {
        if t.len() == 1 {
            t.into_iter().next().unwrap_or_else(|| unreachable!())
        } else {
            Tensor::concat(&t, ax as isize)
        }
    };
    Ok(vec![dev(cat(vals), v.elem()), dev(cat(idxs), Elem::I64)])
}
