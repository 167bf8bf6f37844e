//! GGUF (version 3): header, metadata and tensors, read and written. F32, F16, Q8_0 and
//! Q4_0 tensors load into engine tensors; any other type is a clear error. Reading
//! bounds every length by the bytes that remain, so a corrupt file gives an error, not
//! an allocation the file could not back. A file written here reads back and writes
//! again to the same bytes.
//!
//! GGUF lists dimensions innermost first (`ne[0]` is the row length); shapes here are
//! row-major, outermost first, as everywhere in Tessera.

use crate::quant;
use crate::{DType, Device, Error, Result, Tensor};

const MAGIC: &[u8; 4] = b"GGUF";
/// Default data alignment (`general.alignment` overrides it).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type code and elements (the type is kept so empty arrays round-trip).
    Array(u32, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    fn type_code(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(..) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// The value as an unsigned integer, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
}

/// ggml type codes of the tensor types Tessera reads.
fn ggml_type(dtype: DType) -> Option<u32> {
    match dtype {
        DType::F32 => Some(0),
        DType::F16 => Some(1),
        DType::Q4_0 => Some(2),
        DType::Q8_0 => Some(8),
        _ => None,
    }
}

fn ggml_name(code: u32) -> String {
    let names = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
        "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16",
        "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    names.get(code as usize).map(|s| s.to_string()).unwrap_or_else(|| format!("#{code}"))
}

/// One tensor: its row-major shape, dtype and raw bytes as stored in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorData {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub data: Vec<u8>,
}

impl TensorData {
    /// Bytes a tensor of this shape and dtype occupies.
    pub fn expected_bytes(dtype: DType, shape: &[usize]) -> Option<usize> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
        match dtype {
            DType::F32 => n.checked_mul(4),
            DType::F16 => n.checked_mul(2),
            q if q.is_quantized() => (n % quant::BLOCK == 0).then(|| quant::gguf_bytes(q, n)),
            _ => None,
        }
    }

    /// Upload to `device`.
    pub fn to_tensor(&self, device: &Device) -> Tensor {
        super::tensor_from_le_bytes(self.dtype, self.shape.clone(), &self.data, device)
    }
}

/// A GGUF file: version, metadata (in file order) and tensors (in file order).
#[derive(Clone, Debug, PartialEq)]
pub struct GgufFile {
    pub version: u32,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorData>,
}

impl GgufFile {
    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.get("general.alignment")
            .and_then(Value::as_u64)
            .filter(|&a| a > 0 && a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Upload every tensor to `device`, by name.
    pub fn to_tensors(&self, device: &Device) -> Result<std::collections::BTreeMap<String, Tensor>> {
        let mut out = std::collections::BTreeMap::new();
        for t in &self.tensors {
            let x = t.to_tensor(device);
            x.check()?;
            out.insert(t.name.clone(), x);
        }
        Ok(out)
    }
}

fn err(detail: impl Into<String>) -> Error {
    Error::Format { format: "gguf", detail: detail.into() }
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or_else(|| {
            err(format!("{what}: needs {n} bytes at offset {}, the file has {}", self.pos, self.b.len()))
        })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().map_err(|_| err(what))?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().map_err(|_| err(what))?))
    }
    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }
    /// A count of items each at least `min` bytes long, bounded by what remains.
    fn count(&mut self, min: usize, what: &str) -> Result<usize> {
        let n = self.u64(what)?;
        if n > (self.remaining() / min.max(1)) as u64 {
            return Err(err(format!("{what} is {n}, more than the {} remaining bytes can hold", self.remaining())));
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(1, &format!("{what} length"))?;
        let s = self.take(n, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| err(format!("{what} is not UTF-8")))
    }
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value> {
        let w = |r: &mut Self, n: usize| r.take(n, key).map(|s| s.to_vec());
        Ok(match ty {
            0 => Value::U8(w(self, 1)?[0]),
            1 => Value::I8(w(self, 1)?[0] as i8),
            2 => {
                let b = w(self, 2)?;
                Value::U16(u16::from_le_bytes([b[0], b[1]]))
            }
            3 => {
                let b = w(self, 2)?;
                Value::I16(i16::from_le_bytes([b[0], b[1]]))
            }
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(self.u32(key)? as i32),
            6 => Value::F32(f32::from_bits(self.u32(key)?)),
            7 => match w(self, 1)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(err(format!("metadata {key:?}: bool byte {b}"))),
            },
            8 => Value::String(self.string(&format!("metadata {key:?}"))?),
            9 => {
                if depth > 4 {
                    return Err(err(format!("metadata {key:?}: arrays nested too deeply")));
                }
                let et = self.u32(key)?;
                let min = match et {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8..=12 => 8,
                    _ => return Err(err(format!("metadata {key:?}: unknown array element type {et}"))),
                };
                let n = self.count(min, &format!("metadata {key:?} array length"))?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.value(et, key, depth + 1)?);
                }
                Value::Array(et, v)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(self.u64(key)? as i64),
            12 => Value::F64(f64::from_bits(self.u64(key)?)),
            t => return Err(err(format!("metadata {key:?}: unknown value type {t}"))),
        })
    }
}

/// Parse a GGUF file held in memory. Tensors of types other than F32, F16, Q8_0 and
/// Q4_0 are an error naming the type and the tensor.
pub fn parse(bytes: &[u8]) -> Result<GgufFile> {
    let mut r = Reader { b: bytes, pos: 0 };
    if r.take(4, "magic")? != MAGIC {
        return Err(err("not a GGUF file (bad magic)"));
    }
    let version = r.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(err(format!("unsupported GGUF version {version}")));
    }
    // Each tensor info takes at least 8 (name) + 4 + 4 + 8 bytes; each kv at least 8 + 4 + 1.
    let n_tensors = r.count(24, "tensor count")?;
    let n_kv = r.count(13, "metadata count")?;
    let mut metadata = Vec::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = r.string(&format!("metadata key {i}"))?;
        let ty = r.u32(&key)?;
        let v = r.value(ty, &key, 0)?;
        metadata.push((key, v));
    }
    let mut infos: Vec<(String, Vec<usize>, DType, u64)> = Vec::with_capacity(n_tensors);
    let mut names = std::collections::HashSet::new();
    for i in 0..n_tensors {
        let name = r.string(&format!("tensor {i} name"))?;
        if !names.insert(name.clone()) {
            return Err(err(format!("tensor {name:?} appears twice")));
        }
        let nd = r.u32(&format!("tensor {name:?} rank"))? as usize;
        if nd > 8 {
            return Err(err(format!("tensor {name:?}: rank {nd} is more than 8")));
        }
        let mut ne = Vec::with_capacity(nd);
        for _ in 0..nd {
            let d = r.u64(&format!("tensor {name:?} dims"))?;
            ne.push(usize::try_from(d).map_err(|_| err(format!("tensor {name:?}: dimension {d} too large")))?);
        }
        let code = r.u32(&format!("tensor {name:?} type"))?;
        let offset = r.u64(&format!("tensor {name:?} offset"))?;
        let dtype = [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0]
            .into_iter()
            .find(|&d| ggml_type(d) == Some(code))
            .ok_or_else(|| err(format!("unsupported tensor type {} in tensor {name:?}", ggml_name(code))))?;
        ne.reverse();
        infos.push((name, ne, dtype, offset));
    }
    let file = GgufFile { version, metadata, tensors: Vec::new() };
    let align = file.alignment();
    let data_start = (r.pos as u64).div_ceil(align) * align;
    let mut tensors = Vec::with_capacity(infos.len());
    // Tensors lie in order, each at the aligned end of the one before (as llama.cpp
    // requires): no overlaps, no gaps, no data outside the file.
    let mut expected_offset = 0u64;
    for (name, shape, dtype, offset) in infos {
        let len = TensorData::expected_bytes(dtype, &shape)
            .ok_or_else(|| err(format!("tensor {name:?}: shape {shape:?} does not fit {dtype}")))?;
        if offset % align != 0 {
            return Err(err(format!("tensor {name:?}: offset {offset} is not a multiple of the alignment {align}")));
        }
        if offset != expected_offset {
            let how = if offset < expected_offset {
                "overlaps the tensor before it"
            } else {
                "leaves a gap after the tensor before it"
            };
            return Err(err(format!("tensor {name:?}: offset {offset} {how} (expected {expected_offset})")));
        }
        expected_offset = offset.saturating_add(len as u64).div_ceil(align).saturating_mul(align);
        let range = data_start
            .checked_add(offset)
            .and_then(|s| s.checked_add(len as u64).map(|e| (s, e)))
            .filter(|&(_, e)| e <= bytes.len() as u64)
            .ok_or_else(|| {
                err(format!(
                    "tensor {name:?}: {len} bytes at offset {offset} lie outside the {}-byte file",
                    bytes.len()
                ))
            })?;
        let data = &bytes[range.0 as usize..range.1 as usize];
        if let Some(b) = crate::quant::first_bad_scale(dtype, data) {
            return Err(err(format!("tensor {name:?}: block {b} has a NaN or infinite scale")));
        }
        tensors.push(TensorData { name, shape, dtype, data: data.to_vec() });
    }
    Ok(GgufFile { tensors, ..file })
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_bits().to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array(t, xs) => {
            out.extend(t.to_le_bytes());
            out.extend((xs.len() as u64).to_le_bytes());
            for x in xs {
                put_value(out, x);
            }
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_bits().to_le_bytes()),
    }
}

/// Serialise a GGUF file: tensors laid out in order, each aligned, zero padding.
pub fn to_bytes(file: &GgufFile) -> Result<Vec<u8>> {
    let align = file.alignment();
    let mut out = Vec::new();
    out.extend(MAGIC);
    out.extend(3u32.to_le_bytes());
    out.extend((file.tensors.len() as u64).to_le_bytes());
    out.extend((file.metadata.len() as u64).to_le_bytes());
    for (k, v) in &file.metadata {
        put_string(&mut out, k);
        out.extend(v.type_code().to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for t in &file.tensors {
        let code =
            ggml_type(t.dtype).ok_or_else(|| err(format!("tensor {:?}: GGUF cannot hold {}", t.name, t.dtype)))?;
        if TensorData::expected_bytes(t.dtype, &t.shape) != Some(t.data.len()) {
            return Err(err(format!("tensor {:?}: {} bytes for {:?} {}", t.name, t.data.len(), t.shape, t.dtype)));
        }
        put_string(&mut out, &t.name);
        out.extend((t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            out.extend((d as u64).to_le_bytes());
        }
        out.extend(code.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offsets.push(offset);
        offset = (offset + t.data.len() as u64).div_ceil(align) * align;
    }
    let start = (out.len() as u64).div_ceil(align) * align;
    out.resize(start as usize, 0);
    for (t, off) in file.tensors.iter().zip(offsets) {
        out.resize((start + off) as usize, 0);
        out.extend(&t.data);
    }
    Ok(out)
}

/// Read a GGUF file (memory-mapped) from disk.
#[cfg(not(target_arch = "wasm32"))]
pub fn read(path: impl AsRef<std::path::Path>) -> Result<GgufFile> {
    let map = super::map_file(path.as_ref())?;
    parse(&map).map_err(|e| match e {
        Error::Format { format, detail } => {
            Error::Format { format, detail: format!("{}: {detail}", path.as_ref().display()) }
        }
        other => other,
    })
}

/// Write a GGUF file atomically.
#[cfg(not(target_arch = "wasm32"))]
pub fn write(path: impl AsRef<std::path::Path>, file: &GgufFile) -> Result<()> {
    super::write_atomic(path.as_ref(), &to_bytes(file)?)
}

/// Read device tensors back as GGUF tensor data (F32, F16, Q8_0, Q4_0; one realisation
/// for the float ones).
pub async fn tensors_to_data(tensors: &[(String, Tensor)]) -> Result<Vec<TensorData>> {
    let floats: Vec<Tensor> =
        tensors.iter().filter(|(_, t)| !t.dtype().is_quantized()).map(|(_, t)| t.clone()).collect();
    let mut values = match floats.first() {
        Some(t) => t.device().read(&floats).await?.into_iter(),
        None => Vec::new().into_iter(),
    };
    let mut out = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let data = match t.dtype() {
            DType::F32 | DType::F16 => {
                let v = values.next().unwrap_or_default();
                crate::dtype::encode(t.dtype(), &v)[..TensorData::expected_bytes(t.dtype(), t.dims()).unwrap_or(0)]
                    .to_vec()
            }
            DType::Q8_0 | DType::Q4_0 => t.quantized_blocks().await?,
            other => return Err(err(format!("tensor {name:?}: GGUF cannot hold {other}"))),
        };
        out.push(TensorData { name: name.clone(), shape: t.dims().to_vec(), dtype: t.dtype(), data });
    }
    Ok(out)
}
