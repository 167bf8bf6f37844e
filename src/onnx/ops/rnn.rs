//! LSTM, GRU and RNN, unrolled over the sequence when the graph is built: the input
//! projection of every step is one product, then each step is a product with the
//! recurrent weights and one fused element-wise kernel for the gates.

use super::{dev, host_input, input, opt, to_usize, Cx};
use crate::onnx::read::Node;
use crate::onnx::value::Value;
use crate::{DType, Result, Tensor};

fn activation(n: &Node, name: &str, x: &Tensor) -> Result<Tensor> {
    Ok(match name {
        "Sigmoid" => x.sigmoid(),
        "Tanh" => x.tanh(),
        "Relu" => x.relu(),
        a => return Err(n.err(format!("activation '{a}' is not supported (Sigmoid, Tanh, Relu are)"))),
    })
}

pub(crate) fn rnn(cx: &Cx, n: &Node, ins: &[Option<Value>]) -> Result<Vec<Value>> {
    let kind = n.op.as_str();
    let gates = match kind {
        "LSTM" => 4,
        "GRU" => 3,
        _ => 1,
    };
    let v = input(n, ins, 0)?;
    let elem = v.elem();
    let layout = n.attr_int("layout", 0);
    let mut x = cx.tin(n, ins, 0)?;
    if x.rank() != 3 {
        return Err(n.err("X must be 3-D"));
    }
    if layout != 0 {
        x = x.transpose(0, 1);
    }
    let (seq, batch, _) = (x.dims()[0], x.dims()[1], x.dims()[2]);
    let hidden = to_usize(n, n.attr_int("hidden_size", 0), "hidden_size")?;
    let w = cx.tin(n, ins, 1)?;
    let r = cx.tin(n, ins, 2)?;
    let dirs = w.dims().first().copied().unwrap_or(0);
    let rows = hidden.saturating_mul(gates);
    if hidden == 0 || w.rank() != 3 || w.dims()[1] != rows || r.dims() != [dirs, rows, hidden] {
        return Err(n.err(format!(
            "weights W {:?} and R {:?} do not fit hidden_size {hidden} with {gates} gates",
            w.dims(),
            r.dims()
        )));
    }
    let direction = n.attr_str("direction", "forward");
    if (direction == "bidirectional") != (dirs == 2) || dirs == 0 || dirs > 2 {
        return Err(n.err(format!("direction '{direction}' with {dirs} weight sets")));
    }
    if n.has_attr("clip") {
        return Err(n.err("cell clipping is not supported"));
    }
    if n.attr_int("input_forget", 0) != 0 {
        return Err(n.err("input_forget is not supported"));
    }
    if opt(ins, 4).is_some() {
        let lens = host_input(n, ins, 4, "sequence_lens")?.ints();
        if lens.iter().any(|&l| l != seq as i64) {
            return Err(n.err("sequence_lens shorter than the sequence are not supported"));
        }
    }
    let b = cx.topt(n, ins, 3)?;
    let state = |i: usize| -> Result<Option<Tensor>> {
        Ok(cx.topt(n, ins, i)?.map(|t| if layout != 0 { t.transpose(0, 1) } else { t }))
    };
    let h0 = state(5)?;
    let c0 = if kind == "LSTM" { state(6)? } else { None };
    let peep = if kind == "LSTM" { cx.topt(n, ins, 7)? } else { None };
    let defaults: Vec<&str> = match kind {
        "LSTM" => vec!["Sigmoid", "Tanh", "Tanh"],
        "GRU" => vec!["Sigmoid", "Tanh"],
        _ => vec!["Tanh"],
    };
    let acts: Vec<String> = n
        .attr_strs("activations")
        .unwrap_or_else(|| (0..dirs).flat_map(|_| defaults.iter().map(|s| s.to_string())).collect());
    if acts.len() != defaults.len() * dirs {
        return Err(n.err(format!("{} activations for {dirs} directions", acts.len())));
    }
    let lbr = n.attr_int("linear_before_reset", 0) != 0;
    let dt = x.dtype();
    let gh = gates * hidden;

    let mut ys = Vec::new();
    let mut hs = Vec::new();
    let mut cs = Vec::new();
    for d in 0..dirs {
        let act = &acts[d * defaults.len()..(d + 1) * defaults.len()];
        let wd = w.narrow(0, d, 1).reshape([gh, w.dims()[2]]);
        let rd = r.narrow(0, d, 1).reshape([gh, hidden]);
        let (wb, rb) = match &b {
            Some(b) => {
                let bd = b.narrow(0, d, 1).reshape([2 * gh]);
                (Some(bd.narrow(0, 0, gh)), Some(bd.narrow(0, gh, gh)))
            }
            None => (None, None),
        };
        // Every step's input projection at once: [seq * batch, gh].
        let mut xw = x.reshape([seq * batch, x.dims()[2]]).matmul(&wd.t());
        if let Some(wb) = &wb {
            xw = xw.add(wb);
        }
        // GRU's candidate gate adds its recurrent bias inside the reset (linear before
        // reset) or after the product; the other gates add both biases up front.
        if kind != "GRU" {
            if let Some(rb) = &rb {
                xw = xw.add(rb);
            }
        } else if let Some(rb) = &rb {
            xw = xw
                .add(&Tensor::concat(&[rb.narrow(0, 0, 2 * hidden), rb.narrow(0, 2 * hidden, hidden).zeros_like()], 0));
        }
        let xw = xw.reshape([seq, batch, gh]);
        let init = |s: &Option<Tensor>| match s {
            Some(t) => t.narrow(0, d, 1).reshape([batch, hidden]),
            None => Tensor::zeros([batch, hidden], dt, cx.dev),
        };
        let mut h = init(&h0);
        let mut c = init(&c0);
        let p = |k: usize| peep.as_ref().map(|p| p.narrow(0, d, 1).reshape([3 * hidden]).narrow(0, k * hidden, hidden));
        let reverse = direction == "reverse" || d == 1;
        let mut outs: Vec<Option<Tensor>> = vec![None; seq];
        for step in 0..seq {
            let t = if reverse { seq - 1 - step } else { step };
            let g = xw.narrow(0, t, 1).reshape([batch, gh]);
            let gate = |g: &Tensor, k: usize| g.narrow(1, k * hidden, hidden);
            match kind {
                "LSTM" => {
                    let g = g.add(&h.matmul(&rd.t()));
                    let mut i = gate(&g, 0);
                    let mut f = gate(&g, 2);
                    if let Some(pi) = p(0) {
                        i = i.add(&pi.mul(&c));
                    }
                    if let Some(pf) = p(2) {
                        f = f.add(&pf.mul(&c));
                    }
                    let (i, f) = (activation(n, &act[0], &i)?, activation(n, &act[0], &f)?);
                    let cand = activation(n, &act[1], &gate(&g, 3))?;
                    c = f.mul(&c).add(&i.mul(&cand));
                    let mut o = gate(&g, 1);
                    if let Some(po) = p(1) {
                        o = o.add(&po.mul(&c));
                    }
                    h = activation(n, &act[0], &o)?.mul(&activation(n, &act[2], &c)?);
                }
                "GRU" => {
                    let rz = rd.narrow(0, 0, 2 * hidden);
                    let rh = rd.narrow(0, 2 * hidden, hidden);
                    let hzr = h.matmul(&rz.t());
                    let z = activation(n, &act[0], &gate(&g, 0).add(&hzr.narrow(1, 0, hidden)))?;
                    let rr = activation(n, &act[0], &gate(&g, 1).add(&hzr.narrow(1, hidden, hidden)))?;
                    let rbh = rb.as_ref().map(|rb| rb.narrow(0, 2 * hidden, hidden));
                    let inner = if lbr {
                        let mut hh = h.matmul(&rh.t());
                        if let Some(rbh) = &rbh {
                            hh = hh.add(rbh);
                        }
                        rr.mul(&hh)
                    } else {
                        let mut hh = rr.mul(&h).matmul(&rh.t());
                        if let Some(rbh) = &rbh {
                            hh = hh.add(rbh);
                        }
                        hh
                    };
                    let cand = activation(n, &act[1], &gate(&g, 2).add(&inner))?;
                    h = z.neg().add_scalar(1.0).mul(&cand).add(&z.mul(&h));
                }
                _ => {
                    h = activation(n, &act[0], &g.add(&h.matmul(&rd.t())))?;
                }
            }
            outs[t] = Some(h.clone());
        }
        let steps: Vec<Tensor> = outs.into_iter().flatten().collect();
        ys.push(Tensor::stack(&steps, 0)); // [seq, batch, hidden]
        hs.push(h);
        cs.push(c);
    }
    let y = Tensor::stack(&ys, 1); // [seq, dirs, batch, hidden]
    let yh = Tensor::stack(&hs, 0); // [dirs, batch, hidden]
    let yc = Tensor::stack(&cs, 0);
    let (y, yh, yc) =
        if layout != 0 { (y.permute(&[2, 0, 1, 3]), yh.transpose(0, 1), yc.transpose(0, 1)) } else { (y, yh, yc) };
    let _ = DType::F32;
    let mut out = vec![dev(y, elem), dev(yh, elem)];
    if kind == "LSTM" {
        out.push(dev(yc, elem));
    }
    Ok(out)
}
