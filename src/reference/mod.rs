//! The reference implementation: every [`Op`] in plain Rust, computed in f64 and rounded
//! to the node's dtype after each op. It is the oracle for every GPU test and the engine
//! of the CPU device. Clarity over speed.

pub mod attention;
pub mod elementwise;
pub mod matmul;
pub mod movement;
pub mod reduce;
pub mod segment;

use crate::graph::Op;
use crate::{Result, Tensor};

/// Compute node `t` from its inputs' values (row-major, one f64 per element).
pub fn eval(t: &Tensor, inputs: &[&[f64]]) -> Result<Vec<f64>> {
    eval_with(t, inputs, false)
}

/// [`eval`]; with `exact`, float results keep full f64 precision (no rounding to the
/// node's dtype).
pub fn eval_with(t: &Tensor, inputs: &[&[f64]], exact: bool) -> Result<Vec<f64>> {
    let n = t.node();
    let dt = t.dtype();
    let numel = t.numel();
    let dims = |i: usize| n.inputs[i].dims();
    let mut out = match &n.op {
        Op::Input => unreachable!("inputs are realised"),
        Op::Full { value } => vec![*value; numel],
        Op::Arange { start, step } => (0..numel).map(|i| start + i as f64 * step).collect(),
        Op::Rand { seed, normal } => elementwise::rand(*seed, *normal, numel),
        Op::Unary(u) => inputs[0].iter().map(|&x| elementwise::unary(*u, x, dt)).collect(),
        Op::Binary(b) => {
            let in_dt = n.inputs[0].dtype();
            inputs[0].iter().zip(inputs[1]).map(|(&x, &y)| elementwise::binary(*b, x, y, in_dt)).collect()
        }
        Op::Where => (0..numel).map(|i| if inputs[0][i] != 0.0 { inputs[1][i] } else { inputs[2][i] }).collect(),
        Op::Cast => {
            let from = n.inputs[0].dtype();
            inputs[0].iter().map(|&x| elementwise::cast(x, from, dt)).collect()
        }
        Op::Reshape => inputs[0].to_vec(),
        Op::Expand => movement::expand(inputs[0], dims(0), t.dims()),
        Op::Permute { perm } => movement::permute(inputs[0], dims(0), perm),
        Op::Slice { starts, steps } => movement::slice(inputs[0], dims(0), starts, steps, t.dims()),
        Op::Pad { before, value } => movement::pad(inputs[0], dims(0), before, *value, t.dims()),
        Op::Concat { axis } => {
            let shapes: Vec<&[usize]> = n.inputs.iter().map(|i| i.dims()).collect();
            movement::concat(inputs, &shapes, *axis, t.dims())
        }
        Op::Gather { axis } => movement::gather(inputs[0], dims(0), inputs[1], dims(1), *axis, n.location)?,
        Op::IndexSelect { axis } => movement::index_select(inputs[0], dims(0), inputs[1], *axis, t.dims(), n.location)?,
        Op::Reduce { op, axes } => reduce::reduce(*op, inputs[0], dims(0), axes),
        Op::Matmul => matmul::matmul(inputs[0], dims(0), inputs[1], dims(1), t.dims()),
        Op::Norm { rms, eps, weight, bias } => {
            let w = weight.then(|| inputs[1]);
            let b = bias.then(|| inputs[1 + usize::from(*weight)]);
            reduce::norm(inputs[0], t.dims(), *rms, *eps, w, b)
        }
        Op::Softmax { axis, log } => reduce::softmax(inputs[0], t.dims(), *axis, *log),
        Op::Attention { causal } => {
            let bias = (inputs.len() == 4).then(|| (inputs[3], dims(3)));
            let s = dims(1)[dims(1).len() - 2];
            attention::attention(inputs[0], inputs[1], inputs[2], bias, *causal, t.dims(), s)
        }
        Op::Im2col { window, pad_value } => movement::im2col(inputs[0], dims(0), window, *pad_value, t.dims()),
        Op::Col2im { window } => movement::col2im(inputs[0], dims(0), window, t.dims()),
        Op::Quantize => quantize(dt, inputs[0]).0,
        Op::SegmentReduce { op } => segment::segment_reduce(*op, inputs[0], inputs[1], dims(0)[1]),
        Op::ScatterRows { rule, gated } => segment::scatter_rows(*rule, *gated, inputs, dims(0)[1]),
        Op::TopK { k } => segment::topk(inputs[0], dims(0).last().copied().unwrap_or(1), *k),
    };
    if exact && dt.is_float() || dt.is_quantized() {
        return Ok(out);
    }
    if !matches!(n.op, Op::Cast) {
        for v in &mut out {
            *v = dt.round(*v);
        }
    }
    Ok(out)
}

/// `Op::Quantize`: the dequantised values and the GGUF blocks of `x` in `dtype`.
pub fn quantize(dtype: crate::DType, x: &[f64]) -> (Vec<f64>, Vec<u8>) {
    let xs: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let blocks = crate::quant::quantize(dtype, &xs);
    let values = crate::quant::dequantize(dtype, &blocks).into_iter().map(f64::from).collect();
    (values, blocks)
}
