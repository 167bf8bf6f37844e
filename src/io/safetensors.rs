//! safetensors: load (memory-mapped on native) every dtype the format has, converting
//! to the engine's dtypes, and save.
//!
//! | file dtype | tensor dtype |
//! | --- | --- |
//! | F32, F16, I32, U32, BOOL | the same |
//! | BF16, F64 | F32 (converted) |
//! | I64, I16, I8, U16, U8 | I32 (I64 values must fit) |
//! | U64 | U32 (values must fit) |
//! | F8 and other exotic types | an error naming the tensor |
//!
//! Q8_0/Q4_0 tensors are saved as their GGUF blocks in a U8 tensor, with a metadata
//! entry `tessera.quantized.<name> = "q8_0:<shape>"` that `load` reads back.

use crate::{DType, Device, Error, Result, Shape, Tensor};
use ::safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;

/// The tensors of a file, by name, and its metadata.
pub struct TensorFile {
    pub tensors: BTreeMap<String, Tensor>,
    pub metadata: BTreeMap<String, String>,
}

impl TensorFile {
    /// Take a tensor out by name, or an error naming what is missing.
    pub fn take(&mut self, name: &str) -> Result<Tensor> {
        self.tensors
            .remove(name)
            .ok_or_else(|| Error::Format { format: "safetensors", detail: format!("tensor {name:?} is missing") })
    }
}

/// Metadata key prefix marking a U8 tensor as quantised blocks: value `q8_0:2,64`.
const QUANT_KEY: &str = "tessera.quantized.";

fn shape_text(dims: &[usize]) -> String {
    dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")
}

fn quantized_entry(name: &str, spec: &str, data: &[u8], device: &Device) -> Result<Tensor> {
    let bad = || fmt_err(format!("tensor {name:?}: bad quantisation record {spec:?}"));
    let (dt, shape) = spec.split_once(':').ok_or_else(bad)?;
    let dtype = DType::QUANTIZED.into_iter().find(|d| d.name() == dt).ok_or_else(bad)?;
    let shape: Vec<usize> = if shape.is_empty() {
        Vec::new()
    } else {
        shape.split(',').map(|x| x.parse().map_err(|_| bad())).collect::<Result<_>>()?
    };
    if let Some(b) = crate::quant::first_bad_scale(dtype, data) {
        return Err(fmt_err(format!("tensor {name:?}: block {b} has a NaN or infinite scale")));
    }
    let t = Tensor::from_quantized(dtype, shape, data, device);
    t.check()?;
    Ok(t)
}

fn fmt_err(detail: String) -> Error {
    Error::Format { format: "safetensors", detail }
}

/// Convert one tensor's bytes to an engine tensor.
fn convert(name: &str, dtype: Dtype, shape: &[usize], data: &[u8], device: &Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let chunks = |w: usize| data.chunks_exact(w);
    let (dt, values): (DType, Vec<f64>) = match dtype {
        Dtype::F32 => {
            return Ok(super::tensor_from_le_bytes(DType::F32, shape.to_vec(), data, device));
        }
        Dtype::F16 => {
            return Ok(super::tensor_from_le_bytes(DType::F16, shape.to_vec(), data, device));
        }
        Dtype::I32 => (DType::I32, chunks(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect()),
        Dtype::U32 => (DType::U32, chunks(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64).collect()),
        Dtype::BOOL => (DType::Bool, data.iter().map(|&b| f64::from(b != 0)).collect()),
        Dtype::BF16 => {
            (DType::F32, chunks(2).map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64()).collect())
        }
        Dtype::F64 => {
            (DType::F32, chunks(8).map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f32 as f64).collect())
        }
        Dtype::I64 | Dtype::U64 => {
            let signed = dtype == Dtype::I64;
            let mut v = Vec::with_capacity(n);
            for (i, b) in chunks(8).enumerate() {
                let raw = b.try_into().unwrap_or([0; 8]);
                let x = if signed { i64::from_le_bytes(raw) as i128 } else { u64::from_le_bytes(raw) as i128 };
                let (lo, hi) = if signed { (i32::MIN as i128, i32::MAX as i128) } else { (0, u32::MAX as i128) };
                if x < lo || x > hi {
                    return Err(fmt_err(format!("tensor {name:?}: element {i} = {x} does not fit in 32 bits")));
                }
                v.push(x as f64);
            }
            (if signed { DType::I32 } else { DType::U32 }, v)
        }
        Dtype::I16 => (DType::I32, chunks(2).map(|b| i16::from_le_bytes([b[0], b[1]]) as f64).collect()),
        Dtype::U16 => (DType::I32, chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as f64).collect()),
        Dtype::I8 => (DType::I32, data.iter().map(|&b| b as i8 as f64).collect()),
        Dtype::U8 => (DType::I32, data.iter().map(|&b| b as f64).collect()),
        other => return Err(fmt_err(format!("unsupported tensor type {other:?} in tensor {name:?}"))),
    };
    if values.len() != n {
        return Err(fmt_err(format!("tensor {name:?}: {} values for shape {shape:?}", values.len())));
    }
    Ok(device.upload(values, Shape(shape.to_vec()), dt))
}

/// Load every tensor of a safetensors file held in memory.
pub fn load_bytes(bytes: &[u8], device: &Device) -> Result<TensorFile> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| fmt_err(e.to_string()))?;
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| fmt_err(e.to_string()))?;
    let mut metadata: BTreeMap<String, String> = meta.metadata().clone().unwrap_or_default().into_iter().collect();
    let quantized: BTreeMap<String, String> =
        metadata.iter().filter_map(|(k, v)| k.strip_prefix(QUANT_KEY).map(|n| (n.to_string(), v.clone()))).collect();
    metadata.retain(|k, _| !k.starts_with(QUANT_KEY));
    let mut tensors = BTreeMap::new();
    for (name, view) in st.tensors() {
        let t = match quantized.get(&name) {
            Some(spec) if view.dtype() == Dtype::U8 => quantized_entry(&name, spec, view.data(), device)?,
            _ => convert(&name, view.dtype(), view.shape(), view.data(), device)?,
        };
        t.check()?;
        tensors.insert(name, t);
    }
    Ok(TensorFile { tensors, metadata })
}

/// Load a safetensors file, memory-mapped.
#[cfg(not(target_arch = "wasm32"))]
pub fn load(path: impl AsRef<std::path::Path>, device: &Device) -> Result<TensorFile> {
    let map = super::map_file(path.as_ref())?;
    load_bytes(&map, device).map_err(|e| match e {
        Error::Format { format, detail } => {
            Error::Format { format, detail: format!("{}: {detail}", path.as_ref().display()) }
        }
        other => other,
    })
}

struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl ::safetensors::View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Serialise tensors (read back in one realisation) with metadata.
pub async fn to_bytes(tensors: &[(String, Tensor)], metadata: &BTreeMap<String, String>) -> Result<Vec<u8>> {
    let ts: Vec<Tensor> = tensors.iter().map(|(_, t)| t.clone()).collect();
    let values = match ts.first() {
        Some(t) => t.device().read(&ts).await?,
        None => Vec::new(),
    };
    let mut raws = Vec::with_capacity(tensors.len());
    let mut meta_extra = BTreeMap::new();
    for ((name, t), v) in tensors.iter().zip(values) {
        let (dtype, data) = match t.dtype() {
            DType::F32 => (Dtype::F32, crate::dtype::encode(DType::F32, &v)),
            DType::F16 => {
                (Dtype::F16, v.iter().flat_map(|&x| half::f16::from_f64(x).to_bits().to_le_bytes()).collect())
            }
            DType::I32 => (Dtype::I32, crate::dtype::encode(DType::I32, &v)),
            DType::U32 => (Dtype::U32, crate::dtype::encode(DType::U32, &v)),
            DType::Bool => (Dtype::BOOL, v.iter().map(|&x| u8::from(x != 0.0)).collect()),
            q => {
                // safetensors has no block formats: the GGUF blocks go in as U8, and the
                // metadata records the dtype and shape so `load` restores the tensor.
                let blocks = t.quantized_blocks().await?;
                meta_extra.insert(format!("{QUANT_KEY}{name}"), format!("{}:{}", q.name(), shape_text(t.dims())));
                raws.push((name.clone(), Raw { dtype: Dtype::U8, shape: vec![blocks.len()], data: blocks }));
                continue;
            }
        };
        raws.push((name.clone(), Raw { dtype, shape: t.dims().to_vec(), data }));
    }
    let mut all = metadata.clone();
    all.extend(meta_extra);
    let meta = if all.is_empty() { None } else { Some(all.into_iter().collect()) };
    ::safetensors::serialize(raws.iter().map(|(n, r)| (n.as_str(), r)), meta).map_err(|e| fmt_err(e.to_string()))
}

/// Save tensors and metadata to `path`, atomically (native only).
#[cfg(not(target_arch = "wasm32"))]
pub fn save(
    path: impl AsRef<std::path::Path>,
    tensors: &[(String, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let bytes = pollster::block_on(to_bytes(tensors, metadata))?;
    super::write_atomic(path.as_ref(), &bytes)
}
