//! Reading ONNX files: the protobuf decoded by prost, then checked into the importer's
//! own graph: tensors bounded and their data (inline or in external files) matched to
//! their shapes, nodes topologically sorted with cycles and dangling names reported,
//! subgraphs nested at most [`MAX_DEPTH`] deep, model-local functions inlined, and every
//! op looked up, so an unsupported op fails here, at load, with the full list.

use super::ops::{self, Lower};
use super::proto;
use super::value::{fmt_err, Elem, HostData, HostTensor, Value};
use super::Prepared;
use crate::{DType, Device, Result, Tensor};
use prost::Message;
use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Deepest nesting of subgraphs (`If` branches inside `If` branches ...).
pub const MAX_DEPTH: usize = 16;
/// Most nodes in one model, subgraphs and inlined functions included.
pub const MAX_NODES: usize = 1 << 20;
/// Initializers with at most this many elements are also kept on the host, for shape
/// arithmetic; larger ones live only on the device.
pub const HOST_COPY_MAX: usize = 4096;

/// A dimension of a declared input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    Fixed(u64),
    /// A symbolic dimension (`batch`, `sequence`).
    Named(String),
    Unknown,
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Named(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// A declared graph input or output.
#[derive(Clone, Debug)]
pub struct IoInfo {
    pub name: String,
    /// `None` when the file declares no tensor type.
    pub elem: Option<Elem>,
    /// `None` when the file declares no shape.
    pub dims: Option<Vec<Dim>>,
}

/// One attribute value.
#[derive(Clone, Debug)]
pub(crate) enum Attr {
    Float(f32),
    Int(i64),
    Str(String),
    Tensor(Value),
    Graph(Arc<Graph>),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strs(Vec<String>),
    /// A kind the importer does not read (sparse tensors, type protos, graph lists).
    Other,
}

/// A checked node.
#[derive(Clone)]
pub(crate) struct Node {
    pub op: String,
    pub name: String,
    /// Input names; an empty name is an absent optional input.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attrs: HashMap<String, Attr>,
    pub lower: Lower,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} '{}'", self.op, self.name)
    }
}

/// A checked graph: nodes in an order where every input is defined first.
#[derive(Clone, Debug)]
pub(crate) struct Graph {
    pub inputs: Vec<IoInfo>,
    pub outputs: Vec<IoInfo>,
    pub consts: HashMap<String, Value>,
    pub nodes: Vec<Node>,
}

/// What the reader needs besides the bytes.
pub(crate) struct Reader<'a> {
    pub dev: &'a Device,
    /// Directory external data is read from (`None` when loading from bytes).
    pub base: Option<PathBuf>,
    pub functions: HashMap<(String, String), proto::FunctionProto>,
    pub nodes: usize,
    pub unsupported: Vec<String>,
    /// Initializers to convert for MatMul/Gemm (name to "already `[N, K]`"), the dtype,
    /// and those also read by other ops (which keep an f32 copy).
    convert: HashMap<String, bool>,
    convert_dtype: Option<DType>,
    keep_f32: HashSet<String>,
    /// The converted weights.
    pub prepared: HashMap<String, Prepared>,
}

/// Decode the protobuf, with prost's nesting limit.
pub(crate) fn decode_model(bytes: &[u8]) -> Result<proto::ModelProto> {
    proto::ModelProto::decode(bytes).map_err(|e| fmt_err(format!("not a valid ONNX protobuf: {e}")))
}

/// The default-domain opset a model imports.
pub(crate) fn default_opset(m: &proto::ModelProto) -> Result<i64> {
    let mut opset = None;
    for o in &m.opset_import {
        if matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")) {
            opset = o.version;
        }
    }
    match opset {
        Some(v) if v >= 1 => Ok(v),
        Some(v) => Err(fmt_err(format!("opset_import gives the default domain version {v}"))),
        None if m.opset_import.is_empty() => Err(fmt_err("the model imports no opset")),
        // Only other domains imported: the default domain at the newest version we know.
        None => Ok(23),
    }
}

impl<'a> Reader<'a> {
    pub fn new(dev: &'a Device, base: Option<PathBuf>) -> Reader<'a> {
        Reader {
            dev,
            base,
            functions: HashMap::new(),
            nodes: 0,
            unsupported: Vec::new(),
            convert: HashMap::new(),
            convert_dtype: None,
            keep_f32: HashSet::new(),
            prepared: HashMap::new(),
        }
    }

    /// Find the top-level MatMul and Gemm weights to convert to `dtype`.
    pub fn plan_conversions(&mut self, g: &proto::GraphProto, dtype: DType) {
        let inits: HashSet<&str> = g.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
        let mut other = HashSet::new();
        for n in &g.node {
            let op = n.op_type.as_deref().unwrap_or("");
            let domain = n.domain.as_deref().unwrap_or("");
            for (i, name) in n.input.iter().enumerate() {
                if !inits.contains(name.as_str()) {
                    continue;
                }
                let ready = match (op, domain) {
                    ("MatMul", "" | "ai.onnx") => Some(false),
                    ("Gemm", "" | "ai.onnx") => {
                        let tb = n.attribute.iter().any(|a| a.name.as_deref() == Some("transB") && a.i == Some(1));
                        Some(tb)
                    }
                    _ => None,
                };
                match ready {
                    Some(t) if i == 1 && self.convert.get(name).is_none_or(|&c| c == t) => {
                        self.convert.insert(name.clone(), t);
                    }
                    Some(_) if i == 1 => {
                        other.insert(name.clone());
                    }
                    _ => {
                        other.insert(name.clone());
                    }
                }
            }
        }
        for o in &g.output {
            if let Some(n) = &o.name {
                other.insert(n.clone());
            }
        }
        self.keep_f32 = other;
        self.convert_dtype = Some(dtype);
    }

    /// `h` (a 2-D float weight) as `[N, K]` in the conversion dtype, if it converts.
    fn convert_weight(&self, h: &HostTensor, ready: bool) -> Option<Tensor> {
        let dtype = self.convert_dtype?;
        if !h.elem.is_float() || h.dims.len() != 2 {
            return None;
        }
        let (r0, r1) = (h.dims[0], h.dims[1]);
        let v = h.floats();
        let (nn, k, vals): (usize, usize, Vec<f32>) = if ready {
            (r0, r1, v.iter().map(|&x| x as f32).collect())
        } else {
            (r1, r0, (0..r1 * r0).map(|i| v[(i % r0) * r1 + i / r0] as f32).collect())
        };
        match dtype {
            DType::F16 => {
                let hv: Vec<half::f16> = vals.iter().map(|&x| half::f16::from_f32(x)).collect();
                Some(Tensor::from_slice(&hv, [nn, k], self.dev))
            }
            d if d.is_quantized() && k % crate::quant::BLOCK == 0 => {
                Some(Tensor::from_quantized(d, [nn, k], &crate::quant::quantize(d, &vals), self.dev))
            }
            _ => None,
        }
    }

    /// Build the checked graph of `g`, whose nodes may also read `outer` names.
    pub fn graph(&mut self, g: &proto::GraphProto, outer: &HashSet<String>, depth: usize) -> Result<Graph> {
        if depth > MAX_DEPTH {
            return Err(fmt_err(format!("subgraphs nested more than {MAX_DEPTH} deep")));
        }
        let mut consts = HashMap::new();
        for t in &g.initializer {
            let name = t.name.clone().unwrap_or_default();
            if name.is_empty() {
                return Err(fmt_err("an initializer has no name"));
            }
            let h = self.tensor(t).map_err(|e| fmt_err(format!("initializer '{name}': {}", detail(&e))))?;
            let mut value = None;
            if depth == 0 {
                if let Some(&ready) = self.convert.get(&name) {
                    if let Some(wt) = self.convert_weight(&h, ready) {
                        if !self.keep_f32.contains(&name) {
                            // Only MatMul/Gemm read it, through `prepared`: no f32 copy.
                            value = Some(Value::Device(wt.clone(), h.elem));
                        }
                        self.prepared.insert(name.clone(), Prepared { wt });
                    }
                }
            }
            let value = match value {
                Some(v) => v,
                None => self.value(h, &name),
            };
            if consts.insert(name.clone(), value).is_some() {
                return Err(fmt_err(format!("two initializers are named '{name}'")));
            }
        }
        if !g.sparse_initializer.is_empty() {
            self.unsupported.push("sparse_initializer (sparse tensors)".into());
        }
        // IR < 4 lists initializers among the inputs too; those are constants (with a
        // default that a caller could override, which we do not support).
        let inputs: Vec<IoInfo> = g.input.iter().map(io_info).filter(|i| !consts.contains_key(&i.name)).collect();
        let outputs: Vec<IoInfo> = g.output.iter().map(io_info).collect();

        let mut raw = Vec::with_capacity(g.node.len());
        for (i, n) in g.node.iter().enumerate() {
            self.expand(n, i, "", &HashMap::new(), &mut raw, 0)?;
        }
        let mut scope: HashSet<String> = outer.clone();
        scope.extend(inputs.iter().map(|i| i.name.clone()));
        scope.extend(consts.keys().cloned());
        for n in &raw {
            scope.extend(n.output.iter().filter(|o| !o.is_empty()).cloned());
        }
        let mut nodes = Vec::with_capacity(raw.len());
        for (i, n) in raw.iter().enumerate() {
            nodes.push(self.node(n, i, &scope, depth)?);
        }
        let nodes = sort(nodes, &inputs, &consts, outer)?;
        for o in &outputs {
            let known = consts.contains_key(&o.name)
                || inputs.iter().any(|i| i.name == o.name)
                || nodes.iter().any(|n| n.outputs.contains(&o.name))
                || outer.contains(&o.name);
            if !known {
                return Err(fmt_err(format!("graph output '{}' is not produced by any node", o.name)));
            }
        }
        Ok(Graph { inputs, outputs, consts, nodes })
    }

    /// Append `n`, or the body of the model-local function it calls, to `out`.
    fn expand(
        &mut self,
        n: &proto::NodeProto,
        index: usize,
        prefix: &str,
        attrs: &HashMap<String, proto::AttributeProto>,
        out: &mut Vec<proto::NodeProto>,
        depth: usize,
    ) -> Result<()> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(fmt_err(format!("more than {MAX_NODES} nodes")));
        }
        let mut n = n.clone();
        // Attributes that refer to the calling node's (inside a function body).
        n.attribute = n
            .attribute
            .iter()
            .filter_map(|a| match &a.ref_attr_name {
                Some(r) if !r.is_empty() => attrs.get(r).map(|v| {
                    let mut v = v.clone();
                    v.name = a.name.clone();
                    v
                }),
                _ => Some(a.clone()),
            })
            .collect();
        let key = (n.domain.clone().unwrap_or_default(), n.op_type.clone().unwrap_or_default());
        let Some(f) = self.functions.get(&key).cloned() else {
            if !prefix.is_empty() {
                if n.name.as_deref().unwrap_or("").is_empty() {
                    n.name = Some(format!("{prefix}node{index}"));
                } else {
                    n.name = Some(format!("{prefix}{}", n.name.as_deref().unwrap_or("")));
                }
            }
            out.push(n);
            return Ok(());
        };
        if depth > MAX_DEPTH {
            return Err(fmt_err(format!("function '{}' calls itself more than {MAX_DEPTH} deep", key.1)));
        }
        // Inline: rename the body's values into a scope of their own.
        let call = format!("{prefix}{}#{}/", key.1, self.nodes);
        let mut rename: HashMap<String, String> = HashMap::new();
        for (formal, actual) in f.input.iter().zip(n.input.iter().chain(std::iter::repeat(&String::new()))) {
            rename.insert(formal.clone(), actual.clone());
        }
        for (formal, actual) in f.output.iter().zip(n.output.iter()) {
            rename.insert(formal.clone(), actual.clone());
        }
        let mut call_attrs: HashMap<String, proto::AttributeProto> = HashMap::new();
        for a in &f.attribute_proto {
            call_attrs.insert(a.name.clone().unwrap_or_default(), a.clone());
        }
        for a in &n.attribute {
            call_attrs.insert(a.name.clone().unwrap_or_default(), a.clone());
        }
        for (i, b) in f.node.iter().enumerate() {
            let mut b = b.clone();
            let map = |s: &String| match rename.get(s) {
                Some(r) => r.clone(),
                None if s.is_empty() => String::new(),
                None => format!("{call}{s}"),
            };
            b.input = b.input.iter().map(map).collect();
            b.output = b.output.iter().map(map).collect();
            self.expand(&b, i, &call, &call_attrs, out, depth + 1)?;
        }
        Ok(())
    }

    fn node(&mut self, n: &proto::NodeProto, index: usize, scope: &HashSet<String>, depth: usize) -> Result<Node> {
        let op = n.op_type.clone().unwrap_or_default();
        let domain = n.domain.clone().unwrap_or_default();
        let name = match n.name.as_deref() {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => format!("#{index}"),
        };
        let lower = match ops::lookup(&domain, &op) {
            Some(f) => f,
            None => {
                let d = if domain.is_empty() || domain == "ai.onnx" { String::new() } else { format!("{domain}::") };
                self.unsupported.push(format!("{d}{op} (node '{name}')"));
                ops::unsupported
            }
        };
        let mut attrs = HashMap::new();
        for a in &n.attribute {
            let key = a.name.clone().unwrap_or_default();
            let v = self
                .attr(a, scope, depth)
                .map_err(|e| fmt_err(format!("node '{name}' ({op}) attribute '{key}': {}", detail(&e))))?;
            attrs.insert(key, v);
        }
        Ok(Node { op, name, inputs: n.input.clone(), outputs: n.output.clone(), attrs, lower })
    }

    fn attr(&mut self, a: &proto::AttributeProto, scope: &HashSet<String>, depth: usize) -> Result<Attr> {
        use proto::attribute_proto::AttributeType as T;
        let ty = a.r#type.and_then(|t| T::try_from(t).ok());
        let utf8 = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Ok(match ty {
            Some(T::Float) => Attr::Float(a.f.unwrap_or(0.0)),
            Some(T::Int) => Attr::Int(a.i.unwrap_or(0)),
            Some(T::String) => Attr::Str(utf8(a.s.as_deref().unwrap_or(&[]))),
            Some(T::Tensor) => {
                let t = a.t.as_ref().ok_or_else(|| fmt_err("tensor attribute without a tensor"))?;
                let h = self.tensor(t)?;
                Attr::Tensor(self.value(h, t.name.as_deref().unwrap_or("constant")))
            }
            Some(T::Graph) => {
                let g = a.g.as_ref().ok_or_else(|| fmt_err("graph attribute without a graph"))?;
                Attr::Graph(Arc::new(self.graph(g, scope, depth + 1)?))
            }
            Some(T::Floats) => Attr::Floats(a.floats.clone()),
            Some(T::Ints) => Attr::Ints(a.ints.clone()),
            Some(T::Strings) => Attr::Strs(a.strings.iter().map(|s| utf8(s)).collect()),
            // IR < 4 files may leave the type out: infer it from the field set.
            None | Some(T::Undefined) => {
                if a.g.is_some() {
                    let g = a.g.as_ref().unwrap_or_else(|| unreachable!());
                    Attr::Graph(Arc::new(self.graph(g, scope, depth + 1)?))
                } else if let Some(t) = &a.t {
                    let h = self.tensor(t)?;
                    Attr::Tensor(self.value(h, t.name.as_deref().unwrap_or("constant")))
                } else if let Some(f) = a.f {
                    Attr::Float(f)
                } else if let Some(i) = a.i {
                    Attr::Int(i)
                } else if let Some(s) = &a.s {
                    Attr::Str(utf8(s))
                } else if !a.ints.is_empty() {
                    Attr::Ints(a.ints.clone())
                } else if !a.floats.is_empty() {
                    Attr::Floats(a.floats.clone())
                } else if !a.strings.is_empty() {
                    Attr::Strs(a.strings.iter().map(|s| utf8(s)).collect())
                } else {
                    Attr::Other
                }
            }
            Some(_) => Attr::Other,
        })
    }

    /// A small host tensor is kept on the host and uploaded; a large one only uploaded.
    pub fn value(&self, h: HostTensor, name: &str) -> Value {
        if h.numel() <= HOST_COPY_MAX {
            match h.to_tensor(name, self.dev) {
                Ok(t) => Value::Both(Arc::new(h), t),
                Err(_) => Value::host(h),
            }
        } else {
            match h.to_tensor(name, self.dev) {
                Ok(t) => Value::Device(t, h.elem),
                Err(_) => Value::host(h),
            }
        }
    }

    /// Decode a `TensorProto`, reading external data relative to the model file.
    pub fn tensor(&self, t: &proto::TensorProto) -> Result<HostTensor> {
        tensor_from_proto(t, self.base.as_deref())
    }
}

/// Decode a `TensorProto` into a host tensor, checking that its data matches its dims.
/// External data is read from `base` (the model's directory); without one, a tensor
/// with external data is an error.
pub fn tensor_from_proto(t: &proto::TensorProto, base: Option<&Path>) -> Result<HostTensor> {
    let code = t.data_type.unwrap_or(0);
    let elem =
        Elem::from_proto(code).ok_or_else(|| fmt_err(format!("data type {} is not supported", type_name(code))))?;
    let mut dims = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if !(0..=(1i64 << 40)).contains(&d) {
            return Err(fmt_err(format!("dimension {d} in dims {:?}", t.dims)));
        }
        dims.push(d as usize);
    }
    if t.segment.is_some() {
        return Err(fmt_err("segmented tensors are not supported"));
    }
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n as u64 <= (1u64 << 40))
        .ok_or_else(|| fmt_err(format!("dims {:?} hold too many elements", t.dims)))?;
    let external = t.data_location == Some(proto::tensor_proto::DataLocation::External as i32);
    let raw: Option<Vec<u8>> =
        if external { Some(read_external(t, base, n.saturating_mul(byte_size(elem)))?) } else { t.raw_data.clone() };
    let data = if let Some(raw) = raw {
        let size = byte_size(elem);
        if raw.len() as u128 != n as u128 * size as u128 {
            return Err(fmt_err(format!(
                "{} bytes of raw data for {n} {elem} values ({} bytes) of dims {:?}",
                raw.len(),
                n as u128 * size as u128,
                t.dims
            )));
        }
        decode_raw(elem, &raw)
    } else {
        let count = match elem {
            Elem::F32 => t.float_data.len(),
            Elem::F64 => t.double_data.len(),
            Elem::I64 => t.int64_data.len(),
            Elem::U32 | Elem::U64 => t.uint64_data.len(),
            _ => t.int32_data.len(),
        };
        if count != n {
            return Err(fmt_err(format!("{count} values for dims {:?} ({n} elements)", t.dims)));
        }
        match elem {
            Elem::F32 => HostData::F(t.float_data.iter().map(|&v| v as f64).collect()),
            Elem::F64 => HostData::F(t.double_data.clone()),
            Elem::I64 => HostData::I(t.int64_data.clone()),
            Elem::U32 | Elem::U64 => HostData::I(t.uint64_data.iter().map(|&v| v as i64).collect()),
            Elem::F16 => HostData::F(t.int32_data.iter().map(|&v| half::f16::from_bits(v as u16).to_f64()).collect()),
            Elem::BF16 => HostData::F(t.int32_data.iter().map(|&v| half::bf16::from_bits(v as u16).to_f64()).collect()),
            e => HostData::I(t.int32_data.iter().map(|&v| e.round(v as f64) as i64).collect()),
        }
    };
    HostTensor::new(elem, dims, data)
}

fn decode_raw(elem: Elem, raw: &[u8]) -> HostData {
    macro_rules! le {
        ($t:ty, $n:expr) => {
            raw.chunks_exact($n).map(|c| <$t>::from_le_bytes(c.try_into().unwrap_or([0; $n])))
        };
    }
    match elem {
        Elem::F32 => HostData::F(le!(f32, 4).map(|v| v as f64).collect()),
        Elem::F64 => HostData::F(le!(f64, 8).collect()),
        Elem::F16 => HostData::F(le!(u16, 2).map(|v| half::f16::from_bits(v).to_f64()).collect()),
        Elem::BF16 => HostData::F(le!(u16, 2).map(|v| half::bf16::from_bits(v).to_f64()).collect()),
        Elem::I8 => HostData::I(raw.iter().map(|&b| b as i8 as i64).collect()),
        Elem::U8 => HostData::I(raw.iter().map(|&b| b as i64).collect()),
        Elem::Bool => HostData::I(raw.iter().map(|&b| (b != 0) as i64).collect()),
        Elem::I16 => HostData::I(le!(i16, 2).map(|v| v as i64).collect()),
        Elem::U16 => HostData::I(le!(u16, 2).map(|v| v as i64).collect()),
        Elem::I32 => HostData::I(le!(i32, 4).map(|v| v as i64).collect()),
        Elem::U32 => HostData::I(le!(u32, 4).map(|v| v as i64).collect()),
        Elem::I64 => HostData::I(le!(i64, 8).collect()),
        Elem::U64 => HostData::I(le!(u64, 8).map(|v| v as i64).collect()),
    }
}

/// Bytes per element in `raw_data`.
pub fn byte_size(e: Elem) -> usize {
    match e {
        Elem::I8 | Elem::U8 | Elem::Bool => 1,
        Elem::F16 | Elem::BF16 | Elem::I16 | Elem::U16 => 2,
        Elem::F32 | Elem::I32 | Elem::U32 => 4,
        Elem::F64 | Elem::I64 | Elem::U64 => 8,
    }
}

/// The bytes of an externally stored tensor: `location` must be a relative path that
/// stays inside the model's directory; `offset` and `length` must lie inside the file.
fn read_external(t: &proto::TensorProto, base: Option<&Path>, expect: usize) -> Result<Vec<u8>> {
    let name = t.name.as_deref().unwrap_or("");
    let get = |k: &str| t.external_data.iter().find(|e| e.key.as_deref() == Some(k)).and_then(|e| e.value.clone());
    let location =
        get("location").ok_or_else(|| fmt_err(format!("tensor '{name}': external data without a location")))?;
    let Some(base) = base else {
        return Err(fmt_err(format!(
            "tensor '{name}' keeps its data in the external file '{location}': load the model from its path, not from bytes"
        )));
    };
    let rel = Path::new(&location);
    if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err(fmt_err(format!(
            "tensor '{name}': external data location '{location}' must be a relative path inside the model's directory"
        )));
    }
    let parse = |k: &str| -> Result<Option<u64>> {
        match get(k) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map(Some)
                .map_err(|_| fmt_err(format!("tensor '{name}': external data {k} '{v}'"))),
        }
    };
    let offset = parse("offset")?.unwrap_or(0);
    let path = base.join(rel);
    let io = |e: std::io::Error| crate::Error::Io { path: path.display().to_string(), message: e.to_string() };
    let len = std::fs::metadata(&path).map_err(io)?.len();
    let length = parse("length")?.unwrap_or(len.saturating_sub(offset));
    if length != expect as u64 {
        return Err(fmt_err(format!("tensor '{name}': external data holds {length} bytes, its dims need {expect}")));
    }
    if offset.checked_add(length).is_none_or(|end| end > len) {
        return Err(fmt_err(format!(
            "tensor '{name}': external data at offset {offset}, length {length} runs past the end of '{location}' ({len} bytes)"
        )));
    }
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(&path).map_err(io)?;
    f.seek(SeekFrom::Start(offset)).map_err(io)?;
    let mut buf = vec![0u8; length as usize];
    f.read_exact(&mut buf).map_err(io)?;
    Ok(buf)
}

fn type_name(code: i32) -> String {
    proto::tensor_proto::DataType::try_from(code)
        .map(|d| d.as_str_name().to_lowercase())
        .unwrap_or_else(|_| format!("#{code}"))
}

fn io_info(v: &proto::ValueInfoProto) -> IoInfo {
    use proto::tensor_shape_proto::dimension::Value as D;
    use proto::type_proto::Value as T;
    let (elem, dims) = match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(T::TensorType(t)) => {
            let dims = t.shape.as_ref().map(|s| {
                s.dim
                    .iter()
                    .map(|d| match &d.value {
                        Some(D::DimValue(n)) if *n >= 0 => Dim::Fixed(*n as u64),
                        Some(D::DimParam(p)) if !p.is_empty() => Dim::Named(p.clone()),
                        _ => Dim::Unknown,
                    })
                    .collect()
            });
            (t.elem_type.and_then(Elem::from_proto), dims)
        }
        _ => (None, None),
    };
    IoInfo { name: v.name.clone().unwrap_or_default(), elem, dims }
}

/// Order nodes so each runs after its inputs' producers (Kahn's algorithm), reporting a
/// cycle or a name nothing defines.
fn sort(
    nodes: Vec<Node>,
    inputs: &[IoInfo],
    consts: &HashMap<String, Value>,
    outer: &HashSet<String>,
) -> Result<Vec<Node>> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        for o in n.outputs.iter().filter(|o| !o.is_empty()) {
            if producer.insert(o, i).is_some() || consts.contains_key(o) || inputs.iter().any(|x| &x.name == o) {
                return Err(fmt_err(format!("value '{o}' is defined twice (node '{}')", n.name)));
            }
        }
    }
    let available =
        |s: &str| s.is_empty() || consts.contains_key(s) || inputs.iter().any(|x| x.name == s) || outer.contains(s);
    // Inputs of a node, plus names its subgraphs read from this scope.
    let needs: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            let mut names: Vec<&str> = n.inputs.iter().map(|s| s.as_str()).collect();
            let mut captured = HashSet::new();
            for a in n.attrs.values() {
                if let Attr::Graph(g) = a {
                    captures(g, &mut captured);
                }
            }
            names.extend(captured.iter().filter_map(|s| producer.get_key_value(s.as_str()).map(|(k, _)| *k)));
            names.iter().filter(|s| !available(s)).filter_map(|s| producer.get(*s).copied()).collect()
        })
        .collect();
    for n in &nodes {
        if let Some(missing) = n.inputs.iter().find(|s| !available(s) && !producer.contains_key(s.as_str())) {
            return Err(fmt_err(format!(
                "node '{}' ({}) reads '{missing}', which no graph input, initializer or node defines",
                n.name, n.op
            )));
        }
    }
    let mut indegree: Vec<usize> = needs.iter().map(|d| d.len()).collect();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, d) in needs.iter().enumerate() {
        for &p in d {
            users[p].push(i);
        }
    }
    let mut ready: Vec<usize> = (0..nodes.len()).filter(|&i| indegree[i] == 0).rev().collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop() {
        order.push(i);
        for &u in users[i].iter().rev() {
            indegree[u] -= 1;
            if indegree[u] == 0 {
                ready.push(u);
            }
        }
    }
    if order.len() != nodes.len() {
        let stuck: Vec<String> =
            (0..nodes.len()).filter(|&i| indegree[i] > 0).take(8).map(|i| format!("'{}'", nodes[i].name)).collect();
        return Err(fmt_err(format!("the graph has a cycle through nodes {}", stuck.join(", "))));
    }
    let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    Ok(order.into_iter().filter_map(|i| slots[i].take()).collect())
}

/// Names a subgraph reads without defining them (outer-scope captures).
fn captures(g: &Graph, out: &mut HashSet<String>) {
    let mut defined: HashSet<&str> = g.inputs.iter().map(|i| i.name.as_str()).collect();
    defined.extend(g.consts.keys().map(|k| k.as_str()));
    for n in &g.nodes {
        defined.extend(n.outputs.iter().map(|s| s.as_str()));
    }
    for n in &g.nodes {
        for i in &n.inputs {
            if !i.is_empty() && !defined.contains(i.as_str()) {
                out.insert(i.clone());
            }
        }
        for a in n.attrs.values() {
            if let Attr::Graph(s) = a {
                let mut inner = HashSet::new();
                captures(s, &mut inner);
                out.extend(inner.into_iter().filter(|s| !defined.contains(s.as_str())));
            }
        }
    }
    for o in &g.outputs {
        if !defined.contains(o.name.as_str()) {
            out.insert(o.name.clone());
        }
    }
}

/// The message of a format error without its "onnx: " prefix.
pub(crate) fn detail(e: &crate::Error) -> String {
    match e {
        crate::Error::Format { detail, .. } => detail.clone(),
        e => e.to_string(),
    }
}
