//! Training checkpoints: one safetensors file with the model (`model.<name>`), the
//! optimiser state (`optim.<name>`) and metadata (step, learning rate, RNG state,
//! schedule, anything the caller adds). A SHA-256 over every tensor's name, dtype,
//! shape and bytes and over the metadata is stored in the file and verified on load, so
//! a flipped byte anywhere that matters is refused with a clear error. Saves are atomic
//! (temp file in the same directory, fsync, rename, fsync of the directory).

use crate::nn::Module;
use crate::optim::Optimizer;
use crate::{Device, Error, Result, Tensor};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};

/// Metadata key holding the digest.
pub const DIGEST_KEY: &str = "tessera.sha256";
/// Metadata key naming the format.
pub const FORMAT_KEY: &str = "tessera.format";
const FORMAT: &str = "tessera-checkpoint-v1";

fn bad(detail: impl Into<String>) -> Error {
    Error::Format { format: "checkpoint", detail: detail.into() }
}

/// The digest of a safetensors file's content (all but the digest entry itself).
pub fn digest(bytes: &[u8]) -> Result<String> {
    let st = ::safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| bad(format!("not a valid safetensors file: {e}")))?;
    let (_, meta) = ::safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(e.to_string()))?;
    let mut h = Sha256::new();
    let mut names: Vec<(String, ::safetensors::tensor::TensorView)> = st.tensors();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, v) in names {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(format!("{:?}{:?}", v.dtype(), v.shape()).as_bytes());
        h.update([0]);
        h.update((v.data().len() as u64).to_le_bytes());
        h.update(v.data());
    }
    let md: BTreeMap<String, String> = meta.metadata().clone().unwrap_or_default().into_iter().collect();
    for (k, v) in md.iter().filter(|(k, _)| k.as_str() != DIGEST_KEY) {
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Serialise `model` and `opt` (one realisation to read every tensor) with `metadata`.
pub async fn to_bytes(
    model: &mut dyn Module,
    opt: &mut dyn Optimizer,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut tensors: Vec<(String, Tensor)> =
        model.state_dict().into_iter().map(|(n, t)| (format!("model.{n}"), t)).collect();
    tensors.extend(opt.state().into_iter().map(|(n, t)| (format!("optim.{n}"), t.clone())));
    let mut meta = metadata.clone();
    meta.insert(FORMAT_KEY.into(), FORMAT.into());
    meta.insert("tessera.optim.steps".into(), opt.steps().to_string());
    meta.insert("tessera.optim.lr".into(), format!("{:e}", opt.lr()));
    let first = crate::io::safetensors::to_bytes(&tensors, &meta).await?;
    meta.insert(DIGEST_KEY.into(), digest(&first)?);
    // Same tensors, so the second serialisation's payload is the first's.
    let bytes = crate::io::safetensors::to_bytes(&tensors, &meta).await?;
    Ok(bytes)
}

/// Check the stored digest of checkpoint bytes.
pub fn verify(bytes: &[u8]) -> Result<BTreeMap<String, String>> {
    let (_, meta) = ::safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| bad(format!("not a valid safetensors file: {e}")))?;
    let md: BTreeMap<String, String> = meta.metadata().clone().unwrap_or_default().into_iter().collect();
    if md.get(FORMAT_KEY).map(String::as_str) != Some(FORMAT) {
        return Err(bad(format!("{FORMAT_KEY} is not {FORMAT}: not a Tessera checkpoint")));
    }
    let stored = md.get(DIGEST_KEY).ok_or_else(|| bad(format!("no {DIGEST_KEY} entry")))?;
    let actual = digest(bytes)?;
    if *stored != actual {
        return Err(bad(format!(
            "SHA-256 mismatch: stored {stored}, content hashes to {actual}; the file is corrupt or was modified"
        )));
    }
    Ok(md)
}

/// Refuse a checkpoint whose float tensors hold NaN or infinity: resuming from it would
/// only continue a run that had already diverged.
fn check_finite(bytes: &[u8]) -> Result<()> {
    use ::safetensors::Dtype;
    let st = ::safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    for (name, v) in st.tensors() {
        let d = v.data();
        let bad_at = match v.dtype() {
            Dtype::F32 => d.chunks_exact(4).position(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()),
            Dtype::F16 => d.chunks_exact(2).position(|b| !half::f16::from_le_bytes([b[0], b[1]]).is_finite()),
            Dtype::BF16 => d.chunks_exact(2).position(|b| !half::bf16::from_le_bytes([b[0], b[1]]).is_finite()),
            _ => None,
        };
        if let Some(i) = bad_at {
            return Err(bad(format!(
                "tensor {name:?}: element {i} is NaN or infinite (the run that saved this checkpoint had diverged)"
            )));
        }
    }
    Ok(())
}

/// Restore `model` and `opt` from checkpoint bytes; returns the metadata. Nothing is
/// changed unless the whole file verifies and every tensor fits.
pub fn from_bytes(
    bytes: &[u8],
    model: &mut dyn Module,
    opt: &mut dyn Optimizer,
    device: &Device,
) -> Result<BTreeMap<String, String>> {
    let md = verify(bytes)?;
    check_finite(bytes)?;
    let file = crate::io::safetensors::load_bytes(bytes, device)?;
    let mut model_state = HashMap::new();
    let mut opt_state = HashMap::new();
    for (name, t) in file.tensors {
        if let Some(n) = name.strip_prefix("model.") {
            model_state.insert(n.to_string(), t);
        } else if let Some(n) = name.strip_prefix("optim.") {
            opt_state.insert(n.to_string(), t);
        }
    }
    let steps: u64 = md.get("tessera.optim.steps").and_then(|s| s.parse().ok()).unwrap_or(0);
    let lr: Option<f64> = md.get("tessera.optim.lr").and_then(|s| s.parse().ok());
    model.load_state_dict(&crate::nn::StateDict::from(model_state), true)?;
    opt.set_steps(steps);
    if let Some(lr) = lr {
        opt.set_lr(lr);
    }
    if !opt_state.is_empty() || steps > 0 {
        crate::optim::load_state(opt, model, &opt_state)?;
    }
    Ok(md)
}

/// Save a checkpoint atomically (native).
#[cfg(not(target_arch = "wasm32"))]
pub fn save(
    path: impl AsRef<std::path::Path>,
    model: &mut dyn Module,
    opt: &mut dyn Optimizer,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let bytes = pollster::block_on(to_bytes(model, opt, metadata))?;
    super::write_atomic(path.as_ref(), &bytes)
}

/// Load a checkpoint (native); see [`from_bytes`].
#[cfg(not(target_arch = "wasm32"))]
pub fn load(
    path: impl AsRef<std::path::Path>,
    model: &mut dyn Module,
    opt: &mut dyn Optimizer,
    device: &Device,
) -> Result<BTreeMap<String, String>> {
    let p = path.as_ref();
    let bytes = std::fs::read(p).map_err(|e| Error::Io { path: p.display().to_string(), message: e.to_string() })?;
    from_bytes(&bytes, model, opt, device).map_err(|e| match e {
        Error::Format { format, detail } => Error::Format { format, detail: format!("{}: {detail}", p.display()) },
        other => other,
    })
}
