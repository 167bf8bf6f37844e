//! Lowering ONNX nodes onto lazy [`Tensor`] ops, one file per op family. Each lowering
//! takes the node and its input values and returns its output values; shape arithmetic
//! whose inputs are all known on the host is evaluated there ([`host`]), exactly, so
//! `Reshape`, `Slice` or `Expand` see constant arguments even in graphs with symbolic
//! batch and sequence dimensions.

mod attention;
mod elementwise;
pub(crate) mod host;
mod matmul;
mod movement;
mod nn;
mod reduce;
mod rnn;

use super::read::{Attr, Node};
use super::value::{fmt_err, Elem, HostTensor, Value};
use super::Prepared;
use crate::{DType, Device, Result, Tensor};
use std::collections::HashMap;

/// One lowering: `(context, node, inputs)` to outputs. An absent optional input is `None`.
pub(crate) type Lower = fn(&Cx, &Node, &[Option<Value>]) -> Result<Vec<Value>>;

/// What lowerings share during a run.
pub(crate) struct Cx<'a> {
    pub dev: &'a Device,
    /// The default-domain opset the model imports.
    pub opset: i64,
    /// MatMul and Gemm weights converted at load (f16, Q8_0, Q4_0), by initializer name.
    pub prepared: &'a HashMap<String, Prepared>,
}

/// The lowering for `domain::op`, if the importer supports it.
pub(crate) fn lookup(domain: &str, op: &str) -> Option<Lower> {
    if !matches!(domain, "" | "ai.onnx") {
        return None;
    }
    Some(match op {
        // Element-wise.
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "Equal" | "Less" | "LessOrEqual" | "Greater"
        | "GreaterOrEqual" | "And" | "Or" | "Xor" | "BitShift" => elementwise::binary,
        "Max" | "Min" | "Sum" | "Mean" => elementwise::variadic,
        "Abs" | "Neg" | "Exp" | "Log" | "Sqrt" | "Reciprocal" | "Sin" | "Cos" | "Tan" | "Tanh" | "Sigmoid" | "Relu"
        | "Erf" | "Floor" | "Ceil" | "Round" | "Sign" | "Not" | "IsNaN" | "IsInf" | "Sinh" | "Cosh" | "Softplus"
        | "Softsign" | "Mish" | "LeakyRelu" | "Elu" | "Selu" | "Celu" | "HardSigmoid" | "HardSwish"
        | "ThresholdedRelu" | "Gelu" | "Swish" | "Shrink" => elementwise::unary,
        "PRelu" => elementwise::prelu,
        "Clip" => elementwise::clip,
        "Where" => elementwise::where_,
        "Cast" | "CastLike" => elementwise::cast,
        "Identity" => elementwise::identity,
        "Dropout" => elementwise::dropout,
        // Shapes and data movement.
        "Constant" => movement::constant,
        "ConstantOfShape" => movement::constant_of_shape,
        "Shape" => movement::shape,
        "Size" => movement::size,
        "Range" => movement::range,
        "Reshape" => movement::reshape,
        "Flatten" => movement::flatten,
        "Squeeze" => movement::squeeze,
        "Unsqueeze" => movement::unsqueeze,
        "Transpose" => movement::transpose,
        "Concat" => movement::concat,
        "Split" => movement::split,
        "Slice" => movement::slice,
        "Gather" => movement::gather,
        "GatherElements" => movement::gather_elements,
        "GatherND" => movement::gather_nd,
        "Expand" => movement::expand,
        "Tile" => movement::tile,
        "Pad" => movement::pad,
        "EyeLike" => movement::eye_like,
        "Trilu" => movement::trilu,
        "DepthToSpace" | "SpaceToDepth" => movement::depth_space,
        "OneHot" => movement::one_hot,
        "NonZero" => movement::non_zero,
        "CumSum" => movement::cumsum,
        "Resize" | "Upsample" => movement::resize,
        // Reductions and normalised exponentials.
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1" | "ReduceL2"
        | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceSumSquare" => reduce::reduce,
        "ArgMax" | "ArgMin" => reduce::arg,
        "TopK" => reduce::top_k,
        "Softmax" | "LogSoftmax" | "Hardmax" => reduce::softmax,
        // Neural-network layers.
        "Conv" | "ConvInteger" => nn::conv,
        "ConvTranspose" => nn::conv_transpose,
        "MaxPool" | "AveragePool" | "LpPool" => nn::pool,
        "GlobalAveragePool" | "GlobalMaxPool" => nn::global_pool,
        "BatchNormalization" => nn::batch_norm,
        "InstanceNormalization" => nn::instance_norm,
        "LayerNormalization" => nn::layer_norm,
        "GroupNormalization" => nn::group_norm,
        "LRN" => nn::lrn,
        "MeanVarianceNormalization" => nn::mean_variance_norm,
        "LpNormalization" => nn::lp_norm,
        "RMSNormalization" => nn::rms_norm,
        "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss" => reduce::nll_loss,
        // Products and int8 quantisation.
        "MatMul" => matmul::matmul,
        "Einsum" => matmul::einsum,
        "Gemm" => matmul::gemm,
        "MatMulInteger" => matmul::matmul_integer,
        "QuantizeLinear" => matmul::quantize_linear,
        "DequantizeLinear" => matmul::dequantize_linear,
        "DynamicQuantizeLinear" => matmul::dynamic_quantize_linear,
        "QLinearMatMul" => matmul::qlinear_matmul,
        // Recurrences (unrolled over the sequence) and attention.
        "LSTM" | "GRU" | "RNN" => rnn::rnn,
        "Attention" => attention::attention,
        // Control flow runs in run.rs; the lowering is never called.
        "If" => unsupported,
        _ => return None,
    })
}

/// Stands in for ops that failed the load-time check (never reached at run time).
pub(crate) fn unsupported(_: &Cx, n: &Node, _: &[Option<Value>]) -> Result<Vec<Value>> {
    Err(fmt_err(format!("op {} is not supported", n.op)))
}

// ---- attribute access --------------------------------------------------------------

impl Node {
    pub fn attr_int(&self, k: &str, default: i64) -> i64 {
        match self.attrs.get(k) {
            Some(Attr::Int(i)) => *i,
            Some(Attr::Float(f)) => *f as i64,
            _ => default,
        }
    }

    pub fn attr_float(&self, k: &str, default: f32) -> f32 {
        match self.attrs.get(k) {
            Some(Attr::Float(f)) => *f,
            Some(Attr::Int(i)) => *i as f32,
            _ => default,
        }
    }

    pub fn attr_ints(&self, k: &str) -> Option<Vec<i64>> {
        match self.attrs.get(k) {
            Some(Attr::Ints(v)) => Some(v.clone()),
            Some(Attr::Int(i)) => Some(vec![*i]),
            _ => None,
        }
    }

    pub fn attr_floats(&self, k: &str) -> Option<Vec<f32>> {
        match self.attrs.get(k) {
            Some(Attr::Floats(v)) => Some(v.clone()),
            Some(Attr::Float(f)) => Some(vec![*f]),
            _ => None,
        }
    }

    pub fn attr_str(&self, k: &str, default: &str) -> String {
        match self.attrs.get(k) {
            Some(Attr::Str(s)) => s.clone(),
            _ => default.to_string(),
        }
    }

    pub fn attr_strs(&self, k: &str) -> Option<Vec<String>> {
        match self.attrs.get(k) {
            Some(Attr::Strs(v)) => Some(v.clone()),
            _ => None,
        }
    }

    pub fn has_attr(&self, k: &str) -> bool {
        self.attrs.contains_key(k)
    }

    /// An error about this node's arguments.
    pub fn err(&self, detail: impl std::fmt::Display) -> crate::Error {
        fmt_err(format!("{detail}"))
    }

    /// Whether output `i` is wanted (present and named).
    pub fn wants(&self, i: usize) -> bool {
        self.outputs.get(i).is_some_and(|s| !s.is_empty())
    }
}

// ---- input access ------------------------------------------------------------------

/// Required input `i`.
pub(crate) fn input<'v>(n: &Node, ins: &'v [Option<Value>], i: usize) -> Result<&'v Value> {
    ins.get(i).and_then(|v| v.as_ref()).ok_or_else(|| n.err(format!("input {i} is required")))
}

/// Optional input `i`.
pub(crate) fn opt(ins: &[Option<Value>], i: usize) -> Option<&Value> {
    ins.get(i).and_then(|v| v.as_ref())
}

/// Input `i`'s values, which must be known on the host (a constant or shape arithmetic).
pub(crate) fn host_input<'v>(n: &Node, ins: &'v [Option<Value>], i: usize, what: &str) -> Result<&'v HostTensor> {
    input(n, ins, i)?.as_host().ok_or_else(|| {
        n.err(format!(
            "its {what} (input {i}, '{}') must be known before the graph runs: a constant, an initializer or shape arithmetic, not a computed tensor",
            n.inputs.get(i).map(|s| s.as_str()).unwrap_or("")
        ))
    })
}

/// Host input `i`'s single value (a scalar or a one-element tensor): an empty one is an
/// error, not a read past its end.
pub(crate) fn host_scalar(n: &Node, ins: &[Option<Value>], i: usize, what: &str) -> Result<f64> {
    scalar_of(n, host_input(n, ins, i, what)?, what)
}

/// A host tensor's single value (its first): an empty one is an error.
pub(crate) fn scalar_of(n: &Node, h: &HostTensor, what: &str) -> Result<f64> {
    if h.numel() == 0 {
        return Err(n.err(format!("its {what} is empty; it must hold one value")));
    }
    Ok(h.data.f(0))
}

/// Optional host input `i` as integers.
pub(crate) fn host_ints_opt(n: &Node, ins: &[Option<Value>], i: usize, what: &str) -> Result<Option<Vec<i64>>> {
    match opt(ins, i) {
        None => Ok(None),
        Some(_) => Ok(Some(host_input(n, ins, i, what)?.ints())),
    }
}

impl Cx<'_> {
    /// The device tensor of a value (host values are uploaded; integers outside i32 are
    /// refused, naming the value).
    pub fn t(&self, v: &Value, name: &str) -> Result<Tensor> {
        match v {
            Value::Device(t, _) | Value::Both(_, t) => Ok(t.clone()),
            Value::Host(h) => h.to_tensor(name, self.dev),
        }
    }

    /// Device tensor of required input `i`.
    pub fn tin(&self, n: &Node, ins: &[Option<Value>], i: usize) -> Result<Tensor> {
        let v = input(n, ins, i)?;
        self.t(v, n.inputs.get(i).map(|s| s.as_str()).unwrap_or(""))
    }

    /// Device tensor of optional input `i`.
    pub fn topt(&self, n: &Node, ins: &[Option<Value>], i: usize) -> Result<Option<Tensor>> {
        match opt(ins, i) {
            Some(v) => Ok(Some(self.t(v, n.inputs.get(i).map(|s| s.as_str()).unwrap_or(""))?)),
            None => Ok(None),
        }
    }

    /// A device scalar of `dtype`.
    pub fn scalar(&self, v: f64, dt: DType) -> Tensor {
        Tensor::full(v, (), dt, self.dev)
    }
}

/// A device value of `elem`.
pub(crate) fn dev(t: Tensor, elem: Elem) -> Value {
    Value::Device(t, elem)
}

/// Normalise an axis in `-rank..rank`.
pub(crate) fn axis(n: &Node, a: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let v = if a < 0 { a + r } else { a };
    if v < 0 || v >= r {
        return Err(n.err(format!("axis {a} is out of range for rank {rank}")));
    }
    Ok(v as usize)
}

/// Checked `usize` from a non-negative `i64` argument.
pub(crate) fn to_usize(n: &Node, v: i64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| n.err(format!("{what} {v} must not be negative")))
}

/// Device float tensor for float math on any input type (ints and bools become f32).
pub(crate) fn as_float(t: &Tensor) -> Tensor {
    if t.dtype().is_float() {
        t.clone()
    } else {
        t.cast(DType::F32)
    }
}
