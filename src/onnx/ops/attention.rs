//! Opset 23's Attention: 3-D (heads packed in the last axis) or 4-D inputs, grouped
//! query heads, a boolean or additive mask, causal masking aligned after the past keys,
//! past key/value caches, softcap, and the optional QK output. The common case (no
//! softcap, default scale, no QK output) is `scaled_dot_product_attention`.

use super::{dev, input, opt, to_usize, Cx};
use crate::onnx::read::Node;
use crate::onnx::value::Value;
use crate::{DType, Result, Tensor};

/// `[B, S, heads * H]` to `[B, heads, S, H]`.
fn split_heads(n: &Node, t: Tensor, heads: usize) -> Result<Tensor> {
    if t.rank() == 4 {
        return Ok(t);
    }
    let d = t.dims().to_vec();
    if t.rank() != 3 || heads == 0 || !d[2].is_multiple_of(heads) {
        return Err(n.err(format!("cannot split {d:?} into {heads} heads")));
    }
    Ok(t.reshape(vec![d[0], d[1], heads, d[2] / heads]).permute(&[0, 2, 1, 3]))
}

pub(crate) fn attention(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let qv = input(n, ins, 0)?;
    let elem = qv.elem();
    let three_d = qv.dims().len() == 3;
    let qh = to_usize(n, n.attr_int("q_num_heads", 0), "q_num_heads")?;
    let kvh = to_usize(n, n.attr_int("kv_num_heads", 0), "kv_num_heads")?;
    let q = split_heads(n, cx.tin(n, ins, 0)?, qh)?;
    let mut k = split_heads(n, cx.tin(n, ins, 1)?, kvh)?;
    let mut v = split_heads(n, cx.tin(n, ins, 2)?, kvh)?;
    if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
        return Err(n.err("Q, K and V must be 3-D or 4-D"));
    }
    let past = match (cx.topt(n, ins, 4)?, cx.topt(n, ins, 5)?) {
        (Some(pk), Some(pv)) => {
            if pk.rank() != 4 || pv.rank() != 4 {
                return Err(n.err("past_key and past_value must be 4-D"));
            }
            let p = pk.dims()[2];
            k = Tensor::concat(&[pk, k], 2);
            v = Tensor::concat(&[pv, v], 2);
            // (A V that does not fit surfaces as the result's error.)
            k.check()?;
            p
        }
        (None, None) => 0,
        _ => return Err(n.err("past_key and past_value come together")),
    };
    let present = (k.clone(), v.clone());
    let (b, heads, s, hd) = (q.dims()[0], q.dims()[1], q.dims()[2], q.dims()[3]);
    let (kheads, l) = (k.dims()[1], k.dims()[2]);
    if kheads == 0 || heads % kheads != 0 {
        return Err(n.err(format!("{heads} query heads over {kheads} key heads")));
    }
    // Grouped-query attention: each key head serves heads / kheads query heads.
    let repeat = |t: &Tensor| -> Tensor {
        if kheads == heads || t.rank() != 4 {
            return t.clone();
        }
        let d = t.dims().to_vec();
        t.unsqueeze(2)
            .broadcast_to(vec![d[0], kheads, heads / kheads, d[2], d[3]])
            .reshape(vec![d[0], heads, d[2], d[3]])
    };
    let (kr, vr) = (repeat(&k), repeat(&v));
    let dt = q.dtype();
    // The user's mask as an additive bias (true = attend), padded to the keys with -inf.
    let neg = |b: &Tensor| {
        Tensor::where_(
            b,
            &Tensor::full(0.0, (), DType::F32, cx.dev),
            &Tensor::full(f64::NEG_INFINITY, (), DType::F32, cx.dev),
        )
    };
    let mut bias: Option<Tensor> = match opt(ins, 3) {
        Some(m) => {
            let t = cx.t(m, &n.inputs[3])?;
            let t = if t.dtype() == DType::Bool { neg(&t) } else { t.cast(DType::F32) };
            let md = t.dims().to_vec();
            let t = match md.last() {
                Some(&last) if last < l => {
                    let mut pads = vec![(0usize, 0usize); md.len()];
                    pads[md.len() - 1].1 = l - last;
                    t.pad(&pads, f64::NEG_INFINITY)
                }
                _ => t,
            };
            Some(t)
        }
        None => None,
    };
    // Structural masking, computed on the host: causal and sliding windows aligned after
    // the past keys (or, with nonpad_kv_seqlen, after each batch's valid keys), and the
    // padding beyond nonpad_kv_seqlen.
    let nonpad: Option<Vec<i64>> = match opt(ins, 6) {
        Some(v) => Some(v.as_host().ok_or_else(|| n.err("nonpad_kv_seqlen must be known on the host"))?.ints()),
        None => None,
    };
    let causal = n.attr_int("is_causal", 0) != 0;
    let (left, right) = (n.attr_int("left_window_size", -1), n.attr_int("right_window_size", -1));
    if causal || left >= 0 || right >= 0 || nonpad.is_some() {
        let rows = nonpad.as_ref().map_or(1, |v| v.len());
        let mut m = vec![0f32; rows * s * l];
        for bi in 0..rows {
            let offset = match &nonpad {
                Some(v) if past == 0 => v[bi] - s as i64,
                _ => past as i64,
            };
            for i in 0..s {
                for j in 0..l {
                    let diff = i as i64 + offset - j as i64;
                    let mut ok = !causal || diff >= 0;
                    ok &= left < 0 || diff <= left;
                    ok &= right < 0 || -diff <= right;
                    ok &= nonpad.as_ref().is_none_or(|v| (j as i64) < v[bi]);
                    if !ok {
                        m[(bi * s + i) * l + j] = f32::NEG_INFINITY;
                    }
                }
            }
        }
        let shape = if rows > 1 { vec![rows, 1, s, l] } else { vec![s, l] };
        let st = Tensor::from_slice(&m, shape, cx.dev);
        bias = Some(match bias {
            Some(b) => b.add(&st),
            None => st,
        });
    }
    let scale = n.attr_float("scale", 0.0) as f64;
    let softcap = n.attr_float("softcap", 0.0) as f64;
    let mode = n.attr_int("qk_matmul_output_mode", 0);
    let simple = (scale == 0.0 || (scale - 1.0 / (hd as f64).sqrt()).abs() < 1e-7) && softcap == 0.0 && !n.wants(3);
    let (y, qk) = if simple && bias.is_none() {
        (Tensor::scaled_dot_product_attention(&q, &kr, &vr, None, false), None)
    } else {
        let scale = if scale == 0.0 { 1.0 / (hd as f64).sqrt() } else { scale };
        let qf = q.cast(DType::F32);
        let raw = qf.matmul(&kr.cast(DType::F32).transpose(-2, -1)).mul_scalar(scale);
        let capped = if softcap > 0.0 { raw.div_scalar(softcap).tanh().mul_scalar(softcap) } else { raw };
        let biased = match &bias {
            Some(m) => capped.add(m),
            None => capped.clone(),
        };
        let mx = biased.max(&[-1], true);
        let safe = Tensor::where_(&mx.eq_scalar(f64::NEG_INFINITY), &mx.zeros_like(), &mx);
        let e = biased.sub(&safe).exp();
        let sum = e.sum(&[-1], true);
        let p = e.div(&Tensor::where_(&sum.eq_scalar(0.0), &sum.ones_like(), &sum));
        // Rows the mask hides entirely give zeros.
        let p = match &bias {
            Some(m) => {
                let hidden = m.max(&[-1], true).eq_scalar(f64::NEG_INFINITY);
                Tensor::where_(&hidden, &p.zeros_like(), &p)
            }
            None => p,
        };
        let y = p.matmul(&vr.cast(DType::F32)).cast(dt);
        let qk = match mode {
            0 | 1 => capped,
            2 => biased,
            _ => p,
        };
        (y, Some(qk))
    };
    // Shapes that do not fit together surface here, before the result's axes are read.
    y.check()?;
    let y = if three_d {
        let hv = y.dims()[3];
        y.permute(&[0, 2, 1, 3]).reshape(vec![b, s, heads * hv])
    } else {
        y
    };
    let mut out = vec![dev(y, elem), dev(present.0, elem), dev(present.1, elem)];
    if let Some(qk) = qk {
        out.push(dev(qk.cast(dt), elem));
    }
    Ok(out)
}
