//! Model files: safetensors (mmap'd, every dtype the format has) and GGUF (F32, F16,
//! Q8_0, Q4_0), both read and written.

pub mod checkpoint;
#[cfg(not(target_arch = "wasm32"))]
#[doc(hidden)]
pub mod fuzz;
pub mod gguf;
pub mod mnist;
pub mod movielens;
pub mod safetensors;
#[cfg(not(target_arch = "wasm32"))]
pub mod tensorboard;

use crate::{DType, Device, Shape, Tensor};
#[cfg(not(target_arch = "wasm32"))]
use crate::{Error, Result};

/// Read a whole file, or map it where the platform can (native), as bytes.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn map_file(path: &std::path::Path) -> Result<memmap2::Mmap> {
    let io = |e: std::io::Error| Error::Io { path: path.display().to_string(), message: e.to_string() };
    let f = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and lives only while the bytes are converted into
    // tensors; a file changed underneath would give wrong values, not unsafety, because
    // every length and offset is checked against the map's size before use.
    unsafe { memmap2::Mmap::map(&f) }.map_err(io)
}

/// Write `bytes` to `path` atomically: a temp file in the same directory, fsync, rename.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let io = |e: std::io::Error| Error::Io { path: path.display().to_string(), message: e.to_string() };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    // Temp files left by a save that was killed are removed by the next one.
    let stem = format!(".{name}.tmp-");
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&stem) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let tmp = dir.join(format!("{stem}{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    let written = f.write_all(bytes).and_then(|_| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// A tensor from little-endian bytes already in `dtype`'s storage layout.
pub(crate) fn tensor_from_le_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8], device: &Device) -> Tensor {
    if dtype.is_quantized() {
        return Tensor::from_quantized(dtype, shape, bytes, device);
    }
    device.upload_le_bytes(bytes, Shape(shape), dtype)
}
