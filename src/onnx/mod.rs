//! ONNX import and export.
//!
//! [`OnnxModel::load`] reads a `.onnx` file (or [`OnnxModel::from_bytes`], in the
//! browser too), checks it, and lowers every node onto the lazy [`Tensor`] ops, so a
//! run is one fused graph realised like any other: nothing executes until the outputs
//! are read, and [`crate::read_all`] reads them in one submit.
//!
//! ```no_run
//! use tessera::{onnx::OnnxModel, Device, Tensor};
//! let dev = Device::new()?;
//! let model = OnnxModel::load("mnist.onnx", &dev)?;
//! let x = Tensor::zeros([1, 1, 28, 28], tessera::DType::F32, &dev);
//! let out = model.run(&[("input", x)])?;
//! let logits: Vec<f32> = out[0].tensor.to_vec_blocking()?;
//! # Ok::<(), tessera::Error>(())
//! ```
//!
//! - Default-domain opsets 7 to 23 as the ops' own versions define them; f32, f16,
//!   int64 and int32 (computed in 32-bit on devices: values that do not fit are errors
//!   naming the tensor), bool, and int8/uint8 for the quantisation ops. Doubles are
//!   computed in f32.
//! - Symbolic dimensions work: each run sees its inputs' shapes, and shape arithmetic
//!   is evaluated exactly on the host.
//! - An op outside the supported set fails at load with every unsupported op and node.
//! - [`LoadOptions::weights`] converts MatMul and Gemm weights to f16, Q8_0 or Q4_0.
//! - [`export`] writes a Tessera model out as ONNX (opset 17).

#[cfg(not(target_arch = "wasm32"))]
mod export;
mod ops;
pub mod proto;
mod read;
pub mod testcase;
mod value;

#[cfg(not(target_arch = "wasm32"))]
pub use export::{export, export_bytes, export_with, OPSET as EXPORT_OPSET};
pub use read::{tensor_from_proto, Dim, IoInfo, MAX_DEPTH, MAX_NODES};
pub use value::{Elem, HostData, HostTensor, Value};

use crate::{DType, Device, Error, Result, Tensor};
use ops::Cx;
use read::{detail, Attr, Graph, Node, Reader};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// How to load a model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Convert the constant weights of MatMul and Gemm to this dtype: `F16`, `Q8_0` or
    /// `Q4_0` (block formats need the reduced axis to be a multiple of 32; other weights
    /// stay f32). `None` keeps the file's types.
    pub weights: Option<DType>,
}

/// What a model declares, and what it contains.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub ir_version: i64,
    /// The default-domain opset.
    pub opset: i64,
    pub producer: String,
    pub inputs: Vec<IoInfo>,
    pub outputs: Vec<IoInfo>,
    /// Op type and count, most frequent first (subgraphs and inlined functions included).
    pub ops: Vec<(String, usize)>,
    pub nodes: usize,
    /// Constant parameters (initializer and constant elements).
    pub parameters: usize,
    /// Weights converted by [`LoadOptions::weights`].
    pub converted_weights: usize,
}

/// One output of a run: a lazy tensor and the ONNX type it stands for (an int64 output
/// is an i32 tensor whose `elem` is `I64`).
#[derive(Clone, Debug)]
pub struct Output {
    pub name: String,
    pub tensor: Tensor,
    pub elem: Elem,
}

/// A MatMul or Gemm weight converted at load: `B^T`, `[N, K]`.
#[derive(Clone, Debug)]
pub(crate) struct Prepared {
    pub wt: Tensor,
}

/// An imported ONNX model, bound to a device.
pub struct OnnxModel {
    graph: Graph,
    opset: i64,
    device: Device,
    prepared: HashMap<String, Prepared>,
    info: ModelInfo,
}

impl std::fmt::Debug for OnnxModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OnnxModel(opset {}, {} nodes)", self.opset, self.info.nodes)
    }
}

impl OnnxModel {
    /// Load a model file; external data files are read relative to it.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(path: impl AsRef<std::path::Path>, dev: &Device) -> Result<OnnxModel> {
        OnnxModel::load_with(path, dev, LoadOptions::default())
    }

    /// Load a model file with options.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load_with(path: impl AsRef<std::path::Path>, dev: &Device, opts: LoadOptions) -> Result<OnnxModel> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| Error::Io { path: path.display().to_string(), message: e.to_string() })?;
        let base = path
            .parent()
            .map(|p| if p.as_os_str().is_empty() { std::path::Path::new(".") } else { p })
            .map(std::path::Path::to_path_buf);
        OnnxModel::load_inner(&bytes, base, dev, opts)
    }

    /// Load a model from its bytes (external data is not available this way).
    pub fn from_bytes(bytes: &[u8], dev: &Device, opts: LoadOptions) -> Result<OnnxModel> {
        OnnxModel::load_inner(bytes, None, dev, opts)
    }

    fn load_inner(
        bytes: &[u8],
        base: Option<std::path::PathBuf>,
        dev: &Device,
        opts: LoadOptions,
    ) -> Result<OnnxModel> {
        if let Some(w) = opts.weights {
            if !matches!(w, DType::F16 | DType::Q8_0 | DType::Q4_0) {
                return Err(Error::InvalidArgument {
                    op: "onnx",
                    detail: format!("weights can be converted to f16, q8_0 or q4_0, not {w}"),
                    location: std::panic::Location::caller(),
                });
            }
        }
        let m = read::decode_model(bytes)?;
        let opset = read::default_opset(&m)?;
        let g = m.graph.as_ref().ok_or_else(|| value::fmt_err("the model has no graph"))?;
        let mut functions = HashMap::new();
        for f in &m.functions {
            functions.insert((f.domain.clone().unwrap_or_default(), f.name.clone().unwrap_or_default()), f.clone());
        }
        let mut reader = Reader::new(dev, base);
        reader.functions = functions;
        if let Some(w) = opts.weights {
            reader.plan_conversions(g, w);
        }
        let graph = reader.graph(g, &HashSet::new(), 0)?;
        if !reader.unsupported.is_empty() {
            let mut by_op: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for u in &reader.unsupported {
                let (op, node) = u.split_once(" (").unwrap_or((u.as_str(), ""));
                by_op.entry(op.to_string()).or_default().push(node.trim_end_matches(')').to_string());
            }
            let list: Vec<String> = by_op.iter().map(|(op, nodes)| format!("{op} ({})", nodes.join(", "))).collect();
            return Err(Error::Unsupported(format!(
                "this ONNX model uses {} unsupported op type(s): {}",
                by_op.len(),
                list.join("; ")
            )));
        }
        let mut info = info(&m, &graph, opset);
        info.converted_weights = reader.prepared.len();
        Ok(OnnxModel { info, graph, opset, device: dev.clone(), prepared: reader.prepared })
    }

    /// What the model declares and contains.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The declared inputs (initializers excluded).
    pub fn inputs(&self) -> &[IoInfo] {
        &self.graph.inputs
    }

    /// The declared outputs.
    pub fn outputs(&self) -> &[IoInfo] {
        &self.graph.outputs
    }

    /// The device the model's weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Run on device tensors: the outputs are lazy, the whole graph one realisation.
    /// Integer inputs declared int64 are given as i32 tensors.
    pub fn run(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<Output>> {
        let declared: HashMap<&str, Option<Elem>> =
            self.graph.inputs.iter().map(|i| (i.name.as_str(), i.elem)).collect();
        let vals = inputs
            .iter()
            .map(|(k, t)| {
                let e = declared.get(k).copied().flatten().unwrap_or_else(|| Elem::of_dtype(t.dtype()));
                (k.to_string(), Value::Device(t.clone(), e))
            })
            .collect();
        self.run_values(vals)
    }

    /// Run on values that may be host tensors (a host input takes part in shape
    /// arithmetic and in `If` conditions; the CLI passes `.npy` data this way).
    pub fn run_values(&self, inputs: Vec<(String, Value)>) -> Result<Vec<Output>> {
        let mut given: HashMap<String, Value> = HashMap::new();
        for (k, v) in inputs {
            let Some(decl) = self.graph.inputs.iter().find(|i| i.name == k) else {
                let names: Vec<&str> = self.graph.inputs.iter().map(|i| i.name.as_str()).collect();
                return Err(arg(format!("the model has no input '{k}' (its inputs: {})", names.join(", "))));
            };
            given.insert(k, self.check_input(decl, v)?);
        }
        let missing: Vec<&str> =
            self.graph.inputs.iter().filter(|i| !given.contains_key(&i.name)).map(|i| i.name.as_str()).collect();
        if !missing.is_empty() {
            return Err(arg(format!("missing input(s): {}", missing.join(", "))));
        }
        let cx = Cx { dev: &self.device, opset: self.opset, prepared: &self.prepared };
        let outs = run_graph(&cx, &self.graph, given, None, 0)?;
        self.graph
            .outputs
            .iter()
            .zip(outs)
            .map(|(o, v)| {
                let elem = v.elem();
                let tensor = cx.t(&v, &o.name)?;
                Ok(Output { name: o.name.clone(), tensor, elem })
            })
            .collect()
    }

    /// A given input checked against its declaration and placed: small host values
    /// stay on the host (and are uploaded once), large ones go to the device.
    fn check_input(&self, decl: &IoInfo, v: Value) -> Result<Value> {
        let dims = v.dims().to_vec();
        if let Some(d) = &decl.dims {
            let fits = d.len() == dims.len()
                && d.iter().zip(&dims).all(|(want, &got)| !matches!(want, Dim::Fixed(w) if *w != got as u64));
            if !fits {
                let want: Vec<String> = d.iter().map(|x| x.to_string()).collect();
                return Err(arg(format!(
                    "input '{}' has shape {dims:?}, the model declares [{}]",
                    decl.name,
                    want.join(", ")
                )));
            }
        }
        if let Some(e) = decl.elem {
            let ok = match &v {
                Value::Device(t, _) | Value::Both(_, t) => t.dtype() == e.dtype(),
                Value::Host(h) => h.elem.is_float() == e.is_float() || e == Elem::Bool,
            };
            if !ok {
                return Err(arg(format!(
                    "input '{}' is declared {e} ({} on a device), given {}",
                    decl.name,
                    e.dtype(),
                    match &v {
                        Value::Device(t, _) | Value::Both(_, t) => t.dtype().to_string(),
                        Value::Host(h) => h.elem.to_string(),
                    }
                )));
            }
        }
        Ok(match v {
            Value::Host(h) => {
                let h = Arc::try_unwrap(h).unwrap_or_else(|a| (*a).clone());
                let h = match decl.elem {
                    Some(e) if e != h.elem => h.cast(e),
                    _ => h,
                };
                Reader::new(&self.device, None).value(h, &decl.name)
            }
            Value::Device(t, e) => Value::Device(t, decl.elem.unwrap_or(e)),
            other => other,
        })
    }
}

fn arg(detail: String) -> Error {
    Error::InvalidArgument { op: "onnx run", detail, location: std::panic::Location::caller() }
}

/// A scope of values: a graph's own, falling back to the enclosing graphs'.
struct Scope<'p> {
    vals: HashMap<String, Value>,
    parent: Option<&'p Scope<'p>>,
}

impl Scope<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.vals.get(k).or_else(|| self.parent.and_then(|p| p.get(k)))
    }
}

/// Run `g` with `inputs` (and the enclosing scope), returning its outputs in order.
fn run_graph(
    cx: &Cx,
    g: &Graph,
    inputs: HashMap<String, Value>,
    parent: Option<&Scope>,
    depth: usize,
) -> Result<Vec<Value>> {
    let mut scope = Scope { vals: inputs, parent };
    for (k, v) in &g.consts {
        scope.vals.insert(k.clone(), v.clone());
    }
    for n in &g.nodes {
        let ins: Vec<Option<Value>> =
            n.inputs.iter().map(|s| if s.is_empty() { None } else { scope.get(s).cloned() }).collect();
        if let Some(i) = n.inputs.iter().zip(&ins).position(|(s, v)| !s.is_empty() && v.is_none()) {
            return Err(at(n, value::fmt_err(format!("input '{}' has no value", n.inputs[i]))));
        }
        let outs = if n.op == "If" {
            run_if(cx, n, &ins, &scope, depth).map_err(|e| at(n, e))?
        } else {
            match ops::host::fold(cx, n, &ins) {
                Some(r) => r,
                None => (n.lower)(cx, n, &ins),
            }
            .map_err(|e| at(n, e))?
        };
        for (name, v) in n.outputs.iter().zip(outs) {
            if name.is_empty() {
                continue;
            }
            if let Value::Device(t, _) = &v {
                if let Some(e) = t.error() {
                    return Err(at(n, e.clone()));
                }
            }
            scope.vals.insert(name.clone(), v);
        }
        if let Some(o) = n.outputs.iter().find(|o| !o.is_empty() && !scope.vals.contains_key(*o)) {
            return Err(at(n, value::fmt_err(format!("output '{o}' is not produced"))));
        }
    }
    g.outputs
        .iter()
        .map(|o| {
            scope.get(&o.name).cloned().ok_or_else(|| value::fmt_err(format!("graph output '{}' has no value", o.name)))
        })
        .collect()
}

/// `If`: a condition known on the host runs one branch. A computed condition runs both
/// and selects element-wise (`where`), which keeps the run one lazy graph; that needs
/// both branches to produce outputs of one shape.
fn run_if(cx: &Cx, n: &Node, ins: &[Option<Value>], scope: &Scope, depth: usize) -> Result<Vec<Value>> {
    if depth >= read::MAX_DEPTH {
        return Err(value::fmt_err("subgraphs nested too deep"));
    }
    let branch = |name: &str| -> Result<Vec<Value>> {
        let Some(Attr::Graph(g)) = n.attrs.get(name) else {
            return Err(value::fmt_err(format!("If has no {name}")));
        };
        run_graph(cx, g, HashMap::new(), Some(scope), depth + 1)
    };
    let cond = ops_input(n, ins)?;
    if cond.dims().iter().product::<usize>() != 1 {
        return Err(value::fmt_err("If's condition must hold one value"));
    }
    if let Some(h) = cond.as_host() {
        return branch(if h.data.f(0) != 0.0 { "then_branch" } else { "else_branch" });
    }
    let c = cx.t(cond, &n.inputs[0])?.reshape(Vec::<usize>::new());
    let c = if c.dtype() == DType::Bool { c } else { c.ne_scalar(0.0) };
    let (a, b) = (branch("then_branch")?, branch("else_branch")?);
    a.iter()
        .zip(&b)
        .map(|(x, y)| {
            if x.dims() != y.dims() {
                return Err(value::fmt_err(format!(
                    "If's condition is computed on the device and its branches give different shapes ({:?} and {:?}): \
                     this needs the condition known before the run",
                    x.dims(),
                    y.dims()
                )));
            }
            let (tx, ty) = (cx.t(x, "then")?, cx.t(y, "else")?);
            let ty = if ty.dtype() != tx.dtype() { ty.cast(tx.dtype()) } else { ty };
            Ok(Value::Device(Tensor::where_(&c, &tx, &ty), x.elem()))
        })
        .collect()
}

fn ops_input<'v>(n: &Node, ins: &'v [Option<Value>]) -> Result<&'v Value> {
    ins.first().and_then(|v| v.as_ref()).ok_or_else(|| value::fmt_err(format!("{} needs input 0", n.op)))
}

/// An error inside node `n`, naming it (resource errors keep their own kind).
fn at(n: &Node, e: Error) -> Error {
    match e {
        Error::OutOfMemory { .. } | Error::DeviceLost(_) | Error::Limit { .. } | Error::Gpu { .. } => e,
        e => Error::Format { format: "onnx", detail: format!("node '{}' ({}): {}", n.name, n.op, detail(&e)) },
    }
}

fn info(m: &proto::ModelProto, g: &Graph, opset: i64) -> ModelInfo {
    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut params = 0usize;
    fn walk(g: &Graph, counts: &mut HashMap<String, usize>, params: &mut usize) {
        *params += g.consts.values().map(|v| v.dims().iter().product::<usize>()).sum::<usize>();
        for n in &g.nodes {
            *counts.entry(n.op.clone()).or_default() += 1;
            for a in n.attrs.values() {
                match a {
                    Attr::Graph(s) => walk(s, counts, params),
                    Attr::Tensor(v) => *params += v.dims().iter().product::<usize>(),
                    _ => {}
                }
            }
        }
    }
    walk(g, &mut counts, &mut params);
    let mut ops: Vec<(String, usize)> = counts.into_iter().collect();
    ops.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ModelInfo {
        ir_version: m.ir_version.unwrap_or(0),
        opset,
        producer: format!(
            "{} {}",
            m.producer_name.as_deref().unwrap_or(""),
            m.producer_version.as_deref().unwrap_or("")
        )
        .trim()
        .to_string(),
        inputs: g.inputs.clone(),
        outputs: g.outputs.clone(),
        nodes: ops.iter().map(|o| o.1).sum(),
        ops,
        parameters: params,
        converted_weights: 0,
    }
}
