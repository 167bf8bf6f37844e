//! Export to ONNX (opset 17): trace one forward pass, then write the lazy graph it built
//! as ONNX nodes. Parameters become initializers under their module names (`0.weight`),
//! the example inputs become graph inputs, and the composite calls recorded during the
//! trace ([`crate::graph::trace`]) become single `Conv`, `ConvTranspose`, `MaxPool` and
//! `AveragePool` nodes. Shapes are those of the example inputs (no symbolic dims).

use super::proto;
use crate::graph::trace::{self, Call, Composite};
use crate::graph::{BinaryOp, Op, ReduceOp, UnaryOp};
use crate::nn::{Layer, Module};
use crate::{DType, Error, Result, Tensor};
use prost::Message;
use std::collections::HashMap;

/// The opset the exporter writes.
pub const OPSET: i64 = 17;

/// Trace `module.forward` on the one example input and write ONNX to `path`: graph
/// input `input`, output `output`.
#[cfg(not(target_arch = "wasm32"))]
pub fn export<L: Layer>(module: &L, example_inputs: &[Tensor], path: impl AsRef<std::path::Path>) -> Result<()> {
    let bytes = export_bytes(module, example_inputs)?;
    let path = path.as_ref();
    std::fs::write(path, bytes).map_err(|e| Error::Io { path: path.display().to_string(), message: e.to_string() })
}

/// [`export`] to bytes.
#[cfg(not(target_arch = "wasm32"))]
pub fn export_bytes<L: Layer>(module: &L, example_inputs: &[Tensor]) -> Result<Vec<u8>> {
    let [x] = example_inputs else {
        return Err(Error::Unsupported(format!(
            "a Layer takes one input, {} given (export_with traces any forward function)",
            example_inputs.len()
        )));
    };
    export_with(module, &[("input", x.clone())], || vec![("output".to_string(), module.forward(x))])
}

/// Trace any forward pass: `inputs` name the graph inputs (the tensors `forward` reads),
/// `forward` returns the named outputs, and `module`'s parameters and buffers give the
/// initializers their names.
#[cfg(not(target_arch = "wasm32"))]
pub fn export_with(
    module: &dyn Module,
    inputs: &[(&str, Tensor)],
    forward: impl FnOnce() -> Vec<(String, Tensor)>,
) -> Result<Vec<u8>> {
    let (outputs, calls) = trace::capture(|| {
        let _guard = crate::no_grad();
        forward()
    });
    for (name, t) in &outputs {
        t.check().map_err(|e| Error::Unsupported(format!("export: output '{name}' failed to build: {e}")))?;
    }
    let mut x = Exporter::default();
    for (name, t) in module.named_parameters().into_iter().chain(module.named_buffers()) {
        x.params.entry(t.id()).or_insert(name);
    }
    for (name, t) in inputs {
        x.inputs.insert(t.id(), name.to_string());
        x.graph_inputs.push(info(name, t));
    }
    x.calls = calls;
    for (name, t) in &outputs {
        let v = x.value(t)?;
        x.nodes.push(node("Identity", &[&v], name, vec![]));
        x.graph_outputs.push(info(name, t));
    }
    let model = proto::ModelProto {
        ir_version: Some(8),
        producer_name: Some("tessera".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        opset_import: vec![proto::OperatorSetIdProto { domain: Some(String::new()), version: Some(OPSET) }],
        graph: Some(proto::GraphProto {
            name: Some("tessera".into()),
            node: x.nodes,
            initializer: x.inits,
            input: x.graph_inputs,
            output: x.graph_outputs,
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok(model.encode_to_vec())
}

/// `TensorProto.DataType` of a dtype (block formats are written dequantised, as float).
fn onnx_type(dt: DType) -> i32 {
    match dt {
        DType::F16 => 10,
        DType::I32 => 6,
        DType::U32 => 12,
        DType::Bool => 9,
        _ => 1,
    }
}

fn info(name: &str, t: &Tensor) -> proto::ValueInfoProto {
    use proto::tensor_shape_proto::{dimension::Value as D, Dimension};
    let shape = proto::TensorShapeProto {
        dim: t.dims().iter().map(|&d| Dimension { value: Some(D::DimValue(d as i64)), denotation: None }).collect(),
    };
    proto::ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(proto::type_proto::Tensor {
                elem_type: Some(onnx_type(t.dtype())),
                shape: Some(shape),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

fn attr_i(name: &str, v: i64) -> proto::AttributeProto {
    proto::AttributeProto { name: Some(name.into()), r#type: Some(2), i: Some(v), ..Default::default() }
}

fn attr_f(name: &str, v: f32) -> proto::AttributeProto {
    proto::AttributeProto { name: Some(name.into()), r#type: Some(1), f: Some(v), ..Default::default() }
}

fn attr_is(name: &str, v: &[i64]) -> proto::AttributeProto {
    proto::AttributeProto { name: Some(name.into()), r#type: Some(7), ints: v.to_vec(), ..Default::default() }
}

fn attr_t(name: &str, t: proto::TensorProto) -> proto::AttributeProto {
    proto::AttributeProto { name: Some(name.into()), r#type: Some(4), t: Some(t), ..Default::default() }
}

fn node(op: &str, inputs: &[&str], output: &str, attribute: Vec<proto::AttributeProto>) -> proto::NodeProto {
    proto::NodeProto {
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.to_string()],
        name: Some(format!("{op}_{output}")),
        attribute,
        ..Default::default()
    }
}

/// A tensor proto of `dtype` holding `values`.
fn tensor_proto(name: &str, dims: &[usize], dtype: DType, values: &[f64]) -> proto::TensorProto {
    let mut t = proto::TensorProto {
        name: Some(name.into()),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: Some(onnx_type(dtype)),
        ..Default::default()
    };
    let raw: Vec<u8> = match dtype {
        DType::F16 => values.iter().flat_map(|&v| half::f16::from_f64(v).to_le_bytes()).collect(),
        DType::I32 => values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
        DType::U32 => values.iter().flat_map(|&v| (v as u32).to_le_bytes()).collect(),
        DType::Bool => values.iter().map(|&v| (v != 0.0) as u8).collect(),
        _ => values.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
    };
    t.raw_data = Some(raw);
    t
}

#[derive(Default)]
struct Exporter {
    nodes: Vec<proto::NodeProto>,
    inits: Vec<proto::TensorProto>,
    graph_inputs: Vec<proto::ValueInfoProto>,
    graph_outputs: Vec<proto::ValueInfoProto>,
    /// Names already given to tensors (by id).
    names: HashMap<u64, String>,
    params: HashMap<u64, String>,
    inputs: HashMap<u64, String>,
    calls: HashMap<u64, Call>,
    counter: usize,
}

impl Exporter {
    fn fresh(&mut self, hint: &str) -> String {
        self.counter += 1;
        format!("{hint}_{}", self.counter)
    }

    fn emit(&mut self, op: &str, inputs: &[&str], attrs: Vec<proto::AttributeProto>) -> String {
        let out = self.fresh(&op.to_lowercase());
        self.nodes.push(node(op, inputs, &out, attrs));
        out
    }

    fn const_i64(&mut self, v: &[i64]) -> String {
        let name = self.fresh("shape");
        let mut t = proto::TensorProto {
            name: Some(name.clone()),
            dims: vec![v.len() as i64],
            data_type: Some(7),
            ..Default::default()
        };
        t.raw_data = Some(v.iter().flat_map(|x| x.to_le_bytes()).collect());
        self.inits.push(t);
        name
    }

    fn const_scalar(&mut self, v: f64, dt: DType) -> String {
        let name = self.fresh("const");
        self.inits.push(tensor_proto(&name, &[], dt, &[v]));
        name
    }

    /// The ONNX value name of `t`, emitting what it needs first (depth-first, with an
    /// explicit stack so deep graphs cannot overflow the call stack).
    fn value(&mut self, root: &Tensor) -> Result<String> {
        let mut stack: Vec<(Tensor, bool)> = vec![(root.clone(), false)];
        while let Some((t, expanded)) = stack.pop() {
            if self.names.contains_key(&t.id()) {
                continue;
            }
            let children = self.children(&t);
            if !expanded {
                stack.push((t.clone(), true));
                for c in children.into_iter().rev() {
                    if !self.names.contains_key(&c.id()) {
                        stack.push((c, false));
                    }
                }
                continue;
            }
            let name = self.node_of(&t)?;
            self.names.insert(t.id(), name);
        }
        Ok(self.names[&root.id()].clone())
    }

    /// What `t` is computed from: a leaf has nothing, a composite call its arguments.
    fn children(&self, t: &Tensor) -> Vec<Tensor> {
        if self.inputs.contains_key(&t.id()) || self.params.contains_key(&t.id()) {
            return vec![];
        }
        if let Some(c) = self.calls.get(&t.id()) {
            return c.inputs.clone();
        }
        if let Some(w) = self.linear_weight(t) {
            return vec![t.node().inputs[0].clone(), w];
        }
        t.node().inputs.clone()
    }

    /// `W` when `t` is `x @ W.t()` for a 2-D `x` and a 2-D parameter `W`.
    fn linear_weight(&self, t: &Tensor) -> Option<Tensor> {
        if !matches!(t.op(), Op::Matmul) {
            return None;
        }
        let (a, b) = (&t.node().inputs[0], &t.node().inputs[1]);
        match b.op() {
            Op::Permute { perm } if perm == &[1, 0] && a.rank() == 2 => {
                let w = &b.node().inputs[0];
                self.params.contains_key(&w.id()).then(|| w.clone())
            }
            _ => None,
        }
    }

    fn name_of(&self, t: &Tensor) -> String {
        self.names.get(&t.id()).cloned().unwrap_or_default()
    }

    fn node_of(&mut self, t: &Tensor) -> Result<String> {
        if let Some(n) = self.inputs.get(&t.id()) {
            return Ok(n.clone());
        }
        let dt = t.dtype();
        if let Some(n) = self.params.get(&t.id()).cloned() {
            let v = t.to_f64_vec_blocking()?;
            let dt = if dt.is_quantized() { DType::F32 } else { dt };
            self.inits.push(tensor_proto(&n, t.dims(), dt, &v));
            return Ok(n);
        }
        if let Some(call) = self.calls.get(&t.id()).cloned() {
            return self.composite(&call);
        }
        let ins: Vec<String> = t.node().inputs.iter().map(|i| self.name_of(i)).collect();
        let i = |k: usize| ins[k].clone();
        let in_dims = |k: usize| t.node().inputs[k].dims().to_vec();
        let out = match t.op() {
            Op::Input => {
                let name = self.fresh("const");
                let v = t.to_f64_vec_blocking()?;
                let dt = if dt.is_quantized() { DType::F32 } else { dt };
                self.inits.push(tensor_proto(&name, t.dims(), dt, &v));
                name
            }
            Op::Full { value } => {
                if t.numel() <= 16 {
                    let name = self.fresh("const");
                    self.inits.push(tensor_proto(&name, t.dims(), dt, &vec![*value; t.numel()]));
                    name
                } else {
                    let dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
                    let shape = self.const_i64(&dims);
                    let value = tensor_proto("value", &[1], dt, &[*value]);
                    self.emit("ConstantOfShape", &[&shape], vec![attr_t("value", value)])
                }
            }
            Op::Arange { start, step } => {
                let n = t.numel() as f64;
                let (s, l, d) = (
                    self.const_scalar(*start, dt),
                    self.const_scalar(start + n * step, dt),
                    self.const_scalar(*step, dt),
                );
                self.emit("Range", &[&s, &l, &d], vec![])
            }
            Op::Rand { .. } => {
                return Err(Error::Unsupported(
                    "export: the forward pass draws random numbers (call set_training(false) first)".into(),
                ))
            }
            Op::Unary(u) => self.unary(*u, &i(0), dt),
            Op::Binary(b) => {
                let op = match b {
                    BinaryOp::Add => "Add",
                    BinaryOp::Sub => "Sub",
                    BinaryOp::Mul => "Mul",
                    BinaryOp::Div => "Div",
                    BinaryOp::Maximum => "Max",
                    BinaryOp::Minimum => "Min",
                    BinaryOp::Pow => "Pow",
                    BinaryOp::Eq | BinaryOp::Ne => "Equal",
                    BinaryOp::Lt => "Less",
                    BinaryOp::Le => "LessOrEqual",
                    BinaryOp::Gt => "Greater",
                    BinaryOp::Ge => "GreaterOrEqual",
                    BinaryOp::And => "And",
                    BinaryOp::Or => "Or",
                };
                let y = self.emit(op, &[&i(0), &i(1)], vec![]);
                if *b == BinaryOp::Ne {
                    self.emit("Not", &[&y], vec![])
                } else {
                    y
                }
            }
            Op::Where => self.emit("Where", &[&i(0), &i(1), &i(2)], vec![]),
            Op::Cast => self.emit("Cast", &[&i(0)], vec![attr_i("to", onnx_type(dt) as i64)]),
            Op::Reshape | Op::Expand => {
                let dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
                let shape = self.const_i64(&dims);
                let op = if matches!(t.op(), Op::Reshape) { "Reshape" } else { "Expand" };
                self.emit(op, &[&i(0), &shape], vec![])
            }
            Op::Permute { perm } => {
                let p: Vec<i64> = perm.iter().map(|&a| a as i64).collect();
                self.emit("Transpose", &[&i(0)], vec![attr_is("perm", &p)])
            }
            Op::Slice { starts, steps } => {
                let r = starts.len();
                let ends: Vec<i64> =
                    (0..r).map(|a| starts[a] as i64 + (t.dims()[a] as i64 - 1) * steps[a] as i64 + 1).collect();
                let st: Vec<i64> = starts.iter().map(|&s| s as i64).collect();
                let ax: Vec<i64> = (0..r as i64).collect();
                let sp: Vec<i64> = steps.iter().map(|&s| s as i64).collect();
                let (a, b, c, d) =
                    (self.const_i64(&st), self.const_i64(&ends), self.const_i64(&ax), self.const_i64(&sp));
                self.emit("Slice", &[&i(0), &a, &b, &c, &d], vec![])
            }
            Op::Pad { before, value } => {
                let d = in_dims(0);
                let mut pads: Vec<i64> = before.iter().map(|&b| b as i64).collect();
                pads.extend((0..d.len()).map(|a| (t.dims()[a] - d[a] - before[a]) as i64));
                let p = self.const_i64(&pads);
                let v = self.const_scalar(*value, dt);
                self.emit("Pad", &[&i(0), &p, &v], vec![])
            }
            Op::Concat { axis } => {
                let names: Vec<&str> = ins.iter().map(|s| s.as_str()).collect();
                self.emit("Concat", &names, vec![attr_i("axis", *axis as i64)])
            }
            Op::Gather { axis } => self.emit("GatherElements", &[&i(0), &i(1)], vec![attr_i("axis", *axis as i64)]),
            Op::IndexSelect { axis } => self.emit("Gather", &[&i(0), &i(1)], vec![attr_i("axis", *axis as i64)]),
            Op::Reduce { op, axes } => {
                let ax: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
                match op {
                    ReduceOp::Sum => {
                        let a = self.const_i64(&ax);
                        self.emit("ReduceSum", &[&i(0), &a], vec![attr_i("keepdims", 1)])
                    }
                    ReduceOp::Max | ReduceOp::Min => {
                        let name = if *op == ReduceOp::Max { "ReduceMax" } else { "ReduceMin" };
                        self.emit(name, &[&i(0)], vec![attr_is("axes", &ax), attr_i("keepdims", 1)])
                    }
                    ReduceOp::ArgMax | ReduceOp::ArgMin => {
                        let [a] = ax.as_slice() else {
                            return Err(Error::Unsupported("export: argmax over several axes".into()));
                        };
                        let name = if *op == ReduceOp::ArgMax { "ArgMax" } else { "ArgMin" };
                        let y = self.emit(name, &[&i(0)], vec![attr_i("axis", *a), attr_i("keepdims", 1)]);
                        self.emit("Cast", &[&y], vec![attr_i("to", 6)])
                    }
                }
            }
            Op::Matmul => {
                // `x @ W.t()` with a 2-D parameter W (nn::Linear): Gemm with transB, as
                // PyTorch writes it, so importers see the weight itself.
                match self.linear_weight(t) {
                    Some(w) => {
                        let wn = self.value(&w)?;
                        self.emit("Gemm", &[&i(0), &wn], vec![attr_i("transB", 1)])
                    }
                    None => self.emit("MatMul", &[&i(0), &i(1)], vec![]),
                }
            }
            Op::Attention { causal } => {
                let q = t.node().inputs[0].clone();
                let k = &t.node().inputs[1];
                let (tq, s, d) = (q.dims()[q.rank() - 2], k.dims()[k.rank() - 2], q.dims()[q.rank() - 1]);
                let r = k.rank() as i64;
                let mut perm: Vec<i64> = (0..r).collect();
                perm.swap(r as usize - 2, r as usize - 1);
                let kt = self.emit("Transpose", &[&i(1)], vec![attr_is("perm", &perm)]);
                let sc = self.emit("MatMul", &[&i(0), &kt], vec![]);
                let f = self.const_scalar(1.0 / (d as f64).sqrt(), dt);
                let mut sc = self.emit("Mul", &[&sc, &f], vec![]);
                if ins.len() > 3 {
                    let b = if t.node().inputs[3].dtype() != dt {
                        self.emit("Cast", &[&i(3)], vec![attr_i("to", onnx_type(dt) as i64)])
                    } else {
                        i(3)
                    };
                    sc = self.emit("Add", &[&sc, &b], vec![]);
                }
                if *causal {
                    // Queries aligned with the end of the keys, as the engine's kernel.
                    let mask: Vec<f64> = (0..tq * s)
                        .map(|p| if (p % s) as i64 > (p / s) as i64 + s as i64 - tq as i64 { -1e30 } else { 0.0 })
                        .collect();
                    let name = self.fresh("causal");
                    self.inits.push(tensor_proto(
                        &name,
                        &[tq, s],
                        if dt == DType::F16 { DType::F32 } else { dt },
                        &mask,
                    ));
                    let m = if dt == DType::F16 { self.emit("Cast", &[&name], vec![attr_i("to", 10)]) } else { name };
                    sc = self.emit("Add", &[&sc, &m], vec![]);
                }
                let p = self.emit("Softmax", &[&sc], vec![attr_i("axis", -1)]);
                self.emit("MatMul", &[&p, &i(2)], vec![])
            }
            Op::Softmax { axis, log } => {
                self.emit(if *log { "LogSoftmax" } else { "Softmax" }, &[&i(0)], vec![attr_i("axis", *axis as i64)])
            }
            Op::Norm { rms, eps, weight, bias } => {
                let dlast = t.dims().last().copied().unwrap_or(1);
                let w = if *weight {
                    i(1)
                } else {
                    let name = self.fresh("ones");
                    self.inits.push(tensor_proto(&name, &[dlast], dt, &vec![1.0; dlast]));
                    name
                };
                if *rms {
                    let sq = self.emit("Mul", &[&i(0), &i(0)], vec![]);
                    let m = self.emit("ReduceMean", &[&sq], vec![attr_is("axes", &[-1]), attr_i("keepdims", 1)]);
                    let e = self.const_scalar(*eps, dt);
                    let m = self.emit("Add", &[&m, &e], vec![]);
                    let s = self.emit("Sqrt", &[&m], vec![]);
                    let y = self.emit("Div", &[&i(0), &s], vec![]);
                    self.emit("Mul", &[&y, &w], vec![])
                } else {
                    let mut args = vec![i(0), w];
                    if *bias {
                        args.push(i(if *weight { 2 } else { 1 }));
                    }
                    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
                    self.emit("LayerNormalization", &a, vec![attr_i("axis", -1), attr_f("epsilon", *eps as f32)])
                }
            }
            Op::Im2col { .. } | Op::Col2im { .. } => {
                return Err(Error::Unsupported(
                    "export: a sliding-window op outside conv2d / conv_transpose2d / max_pool2d / avg_pool2d".into(),
                ))
            }
            Op::Quantize => return Err(Error::Unsupported("export: on-device quantisation".into())),
            Op::SegmentReduce { .. } | Op::ScatterRows { .. } | Op::TopK { .. } => {
                return Err(Error::Unsupported(format!("export: {}", t.op().name())))
            }
        };
        Ok(out)
    }

    fn unary(&mut self, u: UnaryOp, x: &str, dt: DType) -> String {
        let simple = match u {
            UnaryOp::Neg => Some("Neg"),
            UnaryOp::Abs => Some("Abs"),
            UnaryOp::Exp => Some("Exp"),
            UnaryOp::Log => Some("Log"),
            UnaryOp::Sqrt => Some("Sqrt"),
            UnaryOp::Sin => Some("Sin"),
            UnaryOp::Cos => Some("Cos"),
            UnaryOp::Tanh => Some("Tanh"),
            UnaryOp::Sigmoid => Some("Sigmoid"),
            UnaryOp::Relu => Some("Relu"),
            UnaryOp::Erf => Some("Erf"),
            UnaryOp::Floor => Some("Floor"),
            UnaryOp::Ceil => Some("Ceil"),
            UnaryOp::Round => Some("Round"),
            UnaryOp::Recip => Some("Reciprocal"),
            UnaryOp::Not => Some("Not"),
            _ => None,
        };
        if let Some(op) = simple {
            return self.emit(op, &[x], vec![]);
        }
        match u {
            UnaryOp::Rsqrt => {
                let s = self.emit("Sqrt", &[x], vec![]);
                self.emit("Reciprocal", &[&s], vec![])
            }
            UnaryOp::Silu => {
                let s = self.emit("Sigmoid", &[x], vec![]);
                self.emit("Mul", &[x, &s], vec![])
            }
            UnaryOp::GeluErf => {
                // x/2 * (1 + erf(x / sqrt 2)), as PyTorch exports it.
                let c = self.const_scalar(std::f64::consts::FRAC_1_SQRT_2, dt);
                let a = self.emit("Mul", &[x, &c], vec![]);
                let e = self.emit("Erf", &[&a], vec![]);
                let one = self.const_scalar(1.0, dt);
                let b = self.emit("Add", &[&e, &one], vec![]);
                let half = self.const_scalar(0.5, dt);
                let h = self.emit("Mul", &[x, &half], vec![]);
                self.emit("Mul", &[&h, &b], vec![])
            }
            _ => {
                // GeluTanh: x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).
                let x3a = self.emit("Mul", &[x, x], vec![]);
                let x3 = self.emit("Mul", &[&x3a, x], vec![]);
                let c1 = self.const_scalar(0.044715, dt);
                let t1 = self.emit("Mul", &[&x3, &c1], vec![]);
                let s = self.emit("Add", &[x, &t1], vec![]);
                let c2 = self.const_scalar((2.0 / std::f64::consts::PI).sqrt(), dt);
                let s2 = self.emit("Mul", &[&s, &c2], vec![]);
                let th = self.emit("Tanh", &[&s2], vec![]);
                let one = self.const_scalar(1.0, dt);
                let b = self.emit("Add", &[&th, &one], vec![]);
                let half = self.const_scalar(0.5, dt);
                let h = self.emit("Mul", &[x, &half], vec![]);
                self.emit("Mul", &[&h, &b], vec![])
            }
        }
    }

    fn composite(&mut self, call: &Call) -> Result<String> {
        let names: Vec<String> = call.inputs.iter().map(|t| self.name_of(t)).collect();
        let args: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        let g = match &call.op {
            Composite::Conv { geometry, .. }
            | Composite::ConvTranspose { geometry, .. }
            | Composite::MaxPool { geometry }
            | Composite::AvgPool { geometry } => *geometry,
        };
        let mut attrs = vec![
            attr_is("kernel_shape", &[g.kernel.0 as i64, g.kernel.1 as i64]),
            attr_is("strides", &[g.stride.0 as i64, g.stride.1 as i64]),
            attr_is("pads", &[g.padding.0 as i64, g.padding.1 as i64, g.padding.0 as i64, g.padding.1 as i64]),
        ];
        let op = match &call.op {
            Composite::Conv { groups, .. } => {
                attrs.push(attr_is("dilations", &[g.dilation.0 as i64, g.dilation.1 as i64]));
                attrs.push(attr_i("group", *groups as i64));
                "Conv"
            }
            Composite::ConvTranspose { groups, output_padding, .. } => {
                attrs.push(attr_is("dilations", &[g.dilation.0 as i64, g.dilation.1 as i64]));
                attrs.push(attr_i("group", *groups as i64));
                attrs.push(attr_is("output_padding", &[output_padding.0 as i64, output_padding.1 as i64]));
                "ConvTranspose"
            }
            Composite::MaxPool { .. } => "MaxPool",
            Composite::AvgPool { .. } => {
                attrs.push(attr_i("count_include_pad", 1));
                "AveragePool"
            }
        };
        Ok(self.emit(op, &args, attrs))
    }
}
