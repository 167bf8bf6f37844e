//! Values flowing through an imported graph: host tensors (constants, shapes and the
//! arithmetic on them, exact in 64-bit) and lazy device tensors, each tagged with the
//! ONNX element type the file declares.

use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

/// An ONNX element type (`TensorProto.DataType`) that the importer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    F16,
    BF16,
    F64,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    Bool,
}

impl Elem {
    /// From `TensorProto.DataType`; `None` for strings, complex and 8-bit floats.
    pub fn from_proto(code: i32) -> Option<Elem> {
        Some(match code {
            1 => Elem::F32,
            2 => Elem::U8,
            3 => Elem::I8,
            4 => Elem::U16,
            5 => Elem::I16,
            6 => Elem::I32,
            7 => Elem::I64,
            9 => Elem::Bool,
            10 => Elem::F16,
            11 => Elem::F64,
            12 => Elem::U32,
            13 => Elem::U64,
            16 => Elem::BF16,
            _ => return None,
        })
    }

    /// The `TensorProto.DataType` code.
    pub fn to_proto(self) -> i32 {
        match self {
            Elem::F32 => 1,
            Elem::U8 => 2,
            Elem::I8 => 3,
            Elem::U16 => 4,
            Elem::I16 => 5,
            Elem::I32 => 6,
            Elem::I64 => 7,
            Elem::Bool => 9,
            Elem::F16 => 10,
            Elem::F64 => 11,
            Elem::U32 => 12,
            Elem::U64 => 13,
            Elem::BF16 => 16,
        }
    }

    /// The name ONNX uses (`float`, `int64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "float",
            Elem::F16 => "float16",
            Elem::BF16 => "bfloat16",
            Elem::F64 => "double",
            Elem::I8 => "int8",
            Elem::U8 => "uint8",
            Elem::I16 => "int16",
            Elem::U16 => "uint16",
            Elem::I32 => "int32",
            Elem::U32 => "uint32",
            Elem::I64 => "int64",
            Elem::U64 => "uint64",
            Elem::Bool => "bool",
        }
    }

    /// Floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F16 | Elem::BF16 | Elem::F64)
    }

    /// The dtype that holds this type on a device: f16 stays f16, every other float is
    /// computed in f32, every integer in i32 (values outside i32 are refused on upload,
    /// naming the tensor), bool is a mask.
    pub fn dtype(self) -> DType {
        match self {
            Elem::F16 => DType::F16,
            Elem::F32 | Elem::BF16 | Elem::F64 => DType::F32,
            Elem::Bool => DType::Bool,
            _ => DType::I32,
        }
    }

    /// The element type that a device dtype reads back as, when nothing else says.
    pub fn of_dtype(dt: DType) -> Elem {
        match dt {
            DType::F16 => Elem::F16,
            DType::I32 => Elem::I32,
            DType::U32 => Elem::U32,
            DType::Bool => Elem::Bool,
            _ => Elem::F32,
        }
    }

    /// The representable range of an integer type (`None` for floats and bool).
    pub fn int_range(self) -> Option<(i64, i64)> {
        Some(match self {
            Elem::I8 => (-128, 127),
            Elem::U8 => (0, 255),
            Elem::I16 => (-32768, 32767),
            Elem::U16 => (0, 65535),
            Elem::I32 => (i32::MIN as i64, i32::MAX as i64),
            Elem::U32 => (0, u32::MAX as i64),
            Elem::I64 | Elem::U64 => (i64::MIN, i64::MAX),
            _ => return None,
        })
    }

    /// Round a float to what this type stores (integers truncate and wrap as numpy's
    /// `astype` does for in-range values; floats round to their precision).
    pub fn round(self, v: f64) -> f64 {
        match self {
            Elem::F32 => v as f32 as f64,
            Elem::F16 => half::f16::from_f64(v).to_f64(),
            Elem::BF16 => half::bf16::from_f64(v).to_f64(),
            Elem::F64 => v,
            Elem::Bool => (v != 0.0) as i64 as f64,
            _ => {
                let (lo, hi) = self.int_range().unwrap_or((i64::MIN, i64::MAX));
                if v.is_nan() {
                    0.0
                } else {
                    (v.trunc().clamp(lo as f64, hi as f64) as i64) as f64
                }
            }
        }
    }
}

impl std::fmt::Display for Elem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The values of a host tensor: every float type as `f64`, every integer type and
/// bool as `i64` (exact: shape arithmetic uses `INT64_MAX` as "to the end").
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    F(Vec<f64>),
    I(Vec<i64>),
}

impl HostData {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            HostData::F(v) => v.len(),
            HostData::I(v) => v.len(),
        }
    }

    /// True when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `i` as f64.
    pub fn f(&self, i: usize) -> f64 {
        match self {
            HostData::F(v) => v[i],
            HostData::I(v) => v[i] as f64,
        }
    }
}

/// A tensor held on the host: initializers and constants, a host input, and the shape
/// arithmetic the importer evaluates without a device.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub elem: Elem,
    pub dims: Vec<usize>,
    pub data: HostData,
}

impl HostTensor {
    /// A float32 tensor.
    pub fn f32(dims: Vec<usize>, values: &[f32]) -> Result<HostTensor> {
        HostTensor::new(Elem::F32, dims, HostData::F(values.iter().map(|&v| v as f64).collect()))
    }

    /// An int64 tensor.
    pub fn i64(dims: Vec<usize>, values: Vec<i64>) -> Result<HostTensor> {
        HostTensor::new(Elem::I64, dims, HostData::I(values))
    }

    /// A tensor of `elem` from f64 values (rounded to the type).
    pub fn from_f64(elem: Elem, dims: Vec<usize>, values: &[f64]) -> Result<HostTensor> {
        let data = if elem.is_float() {
            HostData::F(values.iter().map(|&v| elem.round(v)).collect())
        } else {
            HostData::I(values.iter().map(|&v| elem.round(v) as i64).collect())
        };
        HostTensor::new(elem, dims, data)
    }

    /// Checked construction: the data length must equal the product of `dims`, and the
    /// data kind must match the element type.
    pub fn new(elem: Elem, dims: Vec<usize>, data: HostData) -> Result<HostTensor> {
        let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n != Some(data.len()) {
            return Err(fmt_err(format!("{} values for a tensor of shape {dims:?}", data.len())));
        }
        if elem.is_float() != matches!(data, HostData::F(_)) {
            return Err(fmt_err(format!(
                "{elem} tensor given {} data",
                if elem.is_float() { "integer" } else { "float" }
            )));
        }
        Ok(HostTensor { elem, dims, data })
    }

    /// A scalar of `elem`.
    pub fn scalar(elem: Elem, v: f64) -> HostTensor {
        HostTensor::from_f64(elem, vec![], &[v]).expect("one value for a scalar")
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The values as integers (floats truncated).
    pub fn ints(&self) -> Vec<i64> {
        match &self.data {
            HostData::I(v) => v.clone(),
            HostData::F(v) => v.iter().map(|&x| x as i64).collect(),
        }
    }

    /// The values as f64.
    pub fn floats(&self) -> Vec<f64> {
        match &self.data {
            HostData::F(v) => v.clone(),
            HostData::I(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }

    /// The same values converted to `elem`.
    pub fn cast(&self, elem: Elem) -> HostTensor {
        let data = match (&self.data, elem.is_float()) {
            (HostData::F(v), true) => HostData::F(v.iter().map(|&x| elem.round(x)).collect()),
            (HostData::I(v), true) => HostData::F(v.iter().map(|&x| elem.round(x as f64)).collect()),
            (HostData::F(v), false) => HostData::I(v.iter().map(|&x| elem.round(x) as i64).collect()),
            (HostData::I(v), false) => HostData::I(v.iter().map(|&x| cast_int(x, elem)).collect()),
        };
        HostTensor { elem, dims: self.dims.clone(), data }
    }

    /// Upload to `dev` in [`Elem::dtype`]; integers outside i32 are an error naming
    /// `name`. A tensor whose values are all equal becomes a lazy constant (no upload).
    pub fn to_tensor(&self, name: &str, dev: &Device) -> Result<Tensor> {
        let dt = self.elem.dtype();
        if let HostData::I(v) = &self.data {
            if dt == DType::I32 {
                if let Some(bad) = v.iter().find(|&&x| x < i32::MIN as i64 || x > i32::MAX as i64) {
                    return Err(fmt_err(format!(
                        "tensor '{name}' ({}): value {bad} does not fit in the 32-bit integers a device computes with",
                        self.elem
                    )));
                }
            }
        }
        let all_same =
            self.numel() > 0 && (0..self.numel()).all(|i| self.data.f(i).to_bits() == self.data.f(0).to_bits());
        if all_same && self.numel() > 1 {
            return Ok(Tensor::full(self.data.f(0), self.dims.clone(), dt, dev));
        }
        let t = Tensor::from_f64(&self.floats(), self.dims.clone(), dt, dev);
        t.check()?;
        Ok(t)
    }
}

/// Integer conversion with numpy's wrap-around for narrower types.
fn cast_int(x: i64, elem: Elem) -> i64 {
    match elem {
        Elem::I8 => x as i8 as i64,
        Elem::U8 => x as u8 as i64,
        Elem::I16 => x as i16 as i64,
        Elem::U16 => x as u16 as i64,
        Elem::I32 => x as i32 as i64,
        Elem::U32 => x as u32 as i64,
        Elem::Bool => (x != 0) as i64,
        _ => x,
    }
}

/// A value in an imported graph.
#[derive(Clone, Debug)]
pub enum Value {
    /// Known on the host.
    Host(Arc<HostTensor>),
    /// A lazy device tensor and the element type it stands for.
    Device(Tensor, Elem),
    /// Both: a small initializer kept on the host for shape arithmetic and uploaded
    /// once for device ops.
    Both(Arc<HostTensor>, Tensor),
}

impl Value {
    /// A host value.
    pub fn host(h: HostTensor) -> Value {
        Value::Host(Arc::new(h))
    }

    /// The ONNX element type.
    pub fn elem(&self) -> Elem {
        match self {
            Value::Host(h) | Value::Both(h, _) => h.elem,
            Value::Device(_, e) => *e,
        }
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        match self {
            Value::Host(h) | Value::Both(h, _) => &h.dims,
            Value::Device(t, _) => t.dims(),
        }
    }

    /// The host tensor, when known on the host.
    pub fn as_host(&self) -> Option<&HostTensor> {
        match self {
            Value::Host(h) | Value::Both(h, _) => Some(h),
            Value::Device(..) => None,
        }
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        let e = Elem::of_dtype(t.dtype());
        Value::Device(t, e)
    }
}

impl From<HostTensor> for Value {
    fn from(h: HostTensor) -> Value {
        Value::host(h)
    }
}

pub(crate) fn fmt_err(detail: impl Into<String>) -> Error {
    Error::Format { format: "onnx", detail: detail.into() }
}
