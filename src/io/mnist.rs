//! The compact MNIST file of `data/mnist.bin` (see `data/README.md`): 10,000 real
//! digits with labels, parsed with every length checked.

use crate::{Error, Result};

/// Digits as grey levels and labels.
#[derive(Clone, Debug)]
pub struct Mnist {
    pub rows: usize,
    pub cols: usize,
    /// One byte per pixel (0 background .. 255 ink), image after image.
    pub pixels: Vec<u8>,
    pub labels: Vec<u8>,
}

fn bad(detail: impl Into<String>) -> Error {
    Error::Format { format: "mnist", detail: detail.into() }
}

impl Mnist {
    /// Parse the bytes of `mnist.bin`.
    pub fn parse(bytes: &[u8]) -> Result<Mnist> {
        if bytes.len() < 24 || &bytes[..8] != b"TMNIST01" {
            return Err(bad("not a TMNIST01 file (magic missing or file shorter than its header)"));
        }
        let u = |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]) as usize;
        let (n, rows, cols, bits) = (u(8), u(12), u(16), u(20));
        if bits != 8 && bits != 1 {
            return Err(bad(format!("bits per pixel {bits} (1 or 8 expected)")));
        }
        let px = n.checked_mul(rows).and_then(|v| v.checked_mul(cols)).ok_or_else(|| bad("image size overflows"))?;
        let px_bytes = if bits == 8 { px } else { px.div_ceil(8) };
        let need = 24usize.checked_add(n).and_then(|v| v.checked_add(px_bytes)).ok_or_else(|| bad("size overflows"))?;
        if bytes.len() != need {
            return Err(bad(format!("{} bytes, the header says {need}", bytes.len())));
        }
        let labels = bytes[24..24 + n].to_vec();
        if let Some(l) = labels.iter().find(|&&l| l > 9) {
            return Err(bad(format!("label {l} is not a digit")));
        }
        let raw = &bytes[24 + n..];
        let pixels = if bits == 8 {
            raw.to_vec()
        } else {
            (0..px).map(|i| if raw[i / 8] >> (7 - i % 8) & 1 == 1 { 255 } else { 0 }).collect()
        };
        Ok(Mnist { rows, cols, pixels, labels })
    }

    /// Read `path` (native).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(path: &std::path::Path) -> Result<Mnist> {
        let bytes = std::fs::read(path).map_err(|e| Error::Io {
            path: path.display().to_string(),
            message: format!("{e} (run scripts/fetch_mnist.sh to create it)"),
        })?;
        Mnist::parse(&bytes)
    }

    /// Number of digits.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no digits.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Pixels of digits `idx` scaled to [0, 1], flattened (`idx.len() * rows * cols`).
    pub fn images_f32(&self, idx: &[usize]) -> Vec<f32> {
        let p = self.rows * self.cols;
        let mut out = Vec::with_capacity(idx.len() * p);
        for &i in idx {
            out.extend(self.pixels[i * p..(i + 1) * p].iter().map(|&b| b as f32 / 255.0));
        }
        out
    }

    /// Labels of digits `idx` as i32.
    pub fn labels_i32(&self, idx: &[usize]) -> Vec<i32> {
        idx.iter().map(|&i| self.labels[i] as i32).collect()
    }
}
