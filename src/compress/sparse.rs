//! Compressed storage for unstructured sparsity: a module's state dict in one
//! safetensors file where each mostly-zero f32 tensor is a bitmask of its non-zero
//! entries (`<name>::mask`, U8, one bit per entry) plus those entries (`<name>::values`,
//! F32), and every other tensor is stored dense. Loading gives back the exact bits
//! (negative zeros included: an entry is stored unless all its bits are zero).

use crate::nn::Module;
use crate::{DType, Device, Error, Result, Tensor};
use ::safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;

const SPARSE_KEY: &str = "tessera.sparse.";

/// What a save wrote.
#[derive(Clone, Debug)]
pub struct SparseReport {
    /// Bytes of the file.
    pub file_bytes: usize,
    /// Bytes the same tensors take dense (their element bytes).
    pub dense_bytes: usize,
    /// Tensors stored as mask plus values.
    pub sparse_tensors: usize,
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

fn fmt_err(detail: impl Into<String>) -> Error {
    Error::Format { format: "sparse safetensors", detail: detail.into() }
}

/// Serialise `model`'s state dict; f32 tensors whose mask plus values is smaller than
/// dense (density below about 31/32) are stored sparse.
pub fn to_bytes(model: &mut dyn Module) -> Result<(Vec<u8>, SparseReport)> {
    let mut raws: Vec<(String, Raw)> = Vec::new();
    let mut meta: BTreeMap<String, String> = BTreeMap::new();
    let (mut dense_bytes, mut sparse_tensors) = (0usize, 0usize);
    for s in model.slots() {
        let t = &*s.tensor;
        let dims = t.dims().to_vec();
        if t.dtype() != DType::F32 {
            let bytes = crate::dist::host_bytes(t)?;
            dense_bytes += bytes.len();
            let dtype = match t.dtype() {
                DType::F16 => Dtype::F16,
                DType::I32 => Dtype::I32,
                DType::U32 => Dtype::U32,
                DType::Bool => Dtype::BOOL,
                d => return Err(Error::Unsupported(format!("sparse storage of a {d:?} tensor ({})", s.name))),
            };
            raws.push((s.name.clone(), Raw { dtype, shape: dims, data: bytes }));
            continue;
        }
        let v = t.to_vec_blocking::<f32>()?;
        dense_bytes += v.len() * 4;
        let nonzero: Vec<f32> = v.iter().copied().filter(|x| x.to_bits() != 0).collect();
        let mask_bytes = v.len().div_ceil(8);
        if mask_bytes + nonzero.len() * 4 < v.len() * 4 {
            let mut mask = vec![0u8; mask_bytes];
            for (i, x) in v.iter().enumerate() {
                if x.to_bits() != 0 {
                    mask[i / 8] |= 1 << (i % 8);
                }
            }
            meta.insert(format!("{SPARSE_KEY}{}", s.name), serde_json::to_string(&dims).unwrap_or_default());
            raws.push((format!("{}::mask", s.name), Raw { dtype: Dtype::U8, shape: vec![mask_bytes], data: mask }));
            let data: Vec<u8> = nonzero.iter().flat_map(|x| x.to_le_bytes()).collect();
            raws.push((format!("{}::values", s.name), Raw { dtype: Dtype::F32, shape: vec![nonzero.len()], data }));
            sparse_tensors += 1;
        } else {
            let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            raws.push((s.name.clone(), Raw { dtype: Dtype::F32, shape: dims, data }));
        }
    }
    let meta = if meta.is_empty() { None } else { Some(meta.into_iter().collect()) };
    let bytes = ::safetensors::serialize(raws.iter().map(|(n, r)| (n.as_str(), r)), meta)
        .map_err(|e| fmt_err(e.to_string()))?;
    let report = SparseReport { file_bytes: bytes.len(), dense_bytes, sparse_tensors };
    Ok((bytes, report))
}

/// Save atomically; returns the sizes.
pub fn save(path: impl AsRef<std::path::Path>, model: &mut dyn Module) -> Result<SparseReport> {
    let (bytes, report) = to_bytes(model)?;
    crate::io::write_atomic(path.as_ref(), &bytes)?;
    Ok(report)
}

/// Every tensor of a file written by [`save`], dense again, by name.
pub fn from_bytes(bytes: &[u8], dev: &Device) -> Result<BTreeMap<String, Tensor>> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| fmt_err(e.to_string()))?;
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| fmt_err(e.to_string()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let mut out = BTreeMap::new();
    for (key, dims) in meta.iter().filter_map(|(k, v)| k.strip_prefix(SPARSE_KEY).map(|n| (n.to_string(), v))) {
        let dims: Vec<usize> =
            serde_json::from_str(dims).map_err(|e| fmt_err(format!("{key}: shape {dims:?}: {e}")))?;
        let n = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| fmt_err(format!("{key}: shape overflows")))?;
        let mask = st.tensor(&format!("{key}::mask")).map_err(|e| fmt_err(format!("{key}::mask: {e}")))?;
        let values = st.tensor(&format!("{key}::values")).map_err(|e| fmt_err(format!("{key}::values: {e}")))?;
        if mask.dtype() != Dtype::U8 || mask.data().len() != n.div_ceil(8) || values.dtype() != Dtype::F32 {
            return Err(fmt_err(format!("{key}: mask or values do not fit its shape {dims:?}")));
        }
        let m = mask.data();
        let present = (0..n).filter(|&i| m[i / 8] >> (i % 8) & 1 == 1).count();
        if values.data().len() != present * 4 {
            return Err(fmt_err(format!(
                "{key}: the mask marks {present} entries, the file holds {}",
                values.data().len() / 4
            )));
        }
        let mut vals = values.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        let dense: Vec<f32> =
            (0..n).map(|i| if m[i / 8] >> (i % 8) & 1 == 1 { vals.next().unwrap_or(0.0) } else { 0.0 }).collect();
        out.insert(key, Tensor::from_slice(&dense, dims, dev));
    }
    for (name, view) in st.tensors() {
        if name.ends_with("::mask") || name.ends_with("::values") {
            continue;
        }
        let dims = view.shape().to_vec();
        let d = view.data();
        let t = match view.dtype() {
            Dtype::F32 => Tensor::from_slice(&bytemuck::pod_collect_to_vec::<u8, f32>(d), dims, dev),
            Dtype::F16 => Tensor::from_slice(&bytemuck::pod_collect_to_vec::<u8, half::f16>(d), dims, dev),
            Dtype::I32 => Tensor::from_slice(&bytemuck::pod_collect_to_vec::<u8, i32>(d), dims, dev),
            Dtype::U32 => Tensor::from_slice(&bytemuck::pod_collect_to_vec::<u8, u32>(d), dims, dev),
            Dtype::BOOL => Tensor::from_slice(&d.iter().map(|&b| b != 0).collect::<Vec<bool>>(), dims, dev),
            other => return Err(fmt_err(format!("{name}: dtype {other:?}"))),
        };
        out.insert(name, t);
    }
    Ok(out)
}

/// Load a file written by [`save`] into `model` (strict: every key must match).
pub fn load(path: impl AsRef<std::path::Path>, model: &mut dyn Module, dev: &Device) -> Result<()> {
    let p = path.as_ref();
    let bytes = std::fs::read(p).map_err(|e| Error::Io { path: p.display().to_string(), message: e.to_string() })?;
    let dict = from_bytes(&bytes, dev)?;
    model.load_state_dict(&dict.into_iter().collect(), true).map(|_| ())
}
