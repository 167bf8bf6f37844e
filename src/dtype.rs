//! Element types. A `DType` is a runtime value: the public `Tensor` is not generic.

use half::f16;

/// The element type of a tensor.
///
/// `Bool` is the mask type produced by comparisons; it is stored as one `u32` (0 or 1)
/// per element so every backend can address it. `Q8_0` and `Q4_0` are GGUF's block
/// formats (32 values and one f16 scale per block): read-only weights that matmul,
/// casts, views and index_select consume, dequantising as they load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32,
    F16,
    I32,
    U32,
    Bool,
    Q8_0,
    Q4_0,
}

impl DType {
    /// Every element dtype (the ones ops compute and store), in a fixed order.
    pub const ALL: [DType; 5] = [DType::F32, DType::F16, DType::I32, DType::U32, DType::Bool];

    /// The quantised block formats.
    pub const QUANTIZED: [DType; 2] = [DType::Q8_0, DType::Q4_0];

    /// Bytes one element occupies in device storage (quantised formats: rounded up;
    /// use [`DType::storage_bytes`] for exact sizes).
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F16 => 2,
            DType::Q8_0 | DType::Q4_0 => 1,
            _ => 4,
        }
    }

    /// Bytes `numel` elements occupy in device storage, before rounding to 4.
    pub fn storage_bytes(self, numel: usize) -> u64 {
        let n = numel as u64;
        match self {
            DType::Q8_0 | DType::Q4_0 => crate::quant::gpu_bytes(self, numel) as u64,
            DType::F16 => 2 * n,
            _ => 4 * n,
        }
    }

    /// Bytes of the device buffer that holds `numel` elements: [`DType::storage_bytes`]
    /// rounded up to whole 4-byte words, at least one word.
    pub fn buffer_bytes(self, numel: usize) -> u64 {
        self.storage_bytes(numel).div_ceil(4).max(1) * 4
    }

    /// True for the GGUF block formats.
    pub fn is_quantized(self) -> bool {
        matches!(self, DType::Q8_0 | DType::Q4_0)
    }

    /// True for F32 and F16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16)
    }

    /// True for I32 and U32.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::U32)
    }

    /// Short lower-case name, as printed by `Display` (`f32`, `f16`, `i32`, `u32`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
        }
    }

    /// Round an exact value to what this dtype can hold (the reference's rounding rule).
    ///
    /// Floats round to nearest; integers wrap like two's-complement hardware after the
    /// value has been truncated toward zero (float inputs to integer dtypes saturate, as
    /// Rust's `as` and WGSL's conversions do).
    pub fn round(self, v: f64) -> f64 {
        match self {
            DType::F32 => v as f32 as f64,
            DType::F16 => f16::from_f64(v).to_f64(),
            DType::I32 => {
                if v.is_nan() {
                    0.0
                } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
                    (v as i64) as i32 as f64
                } else {
                    v as i32 as f64
                }
            }
            DType::U32 => {
                if v.is_nan() {
                    0.0
                } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
                    (v as i64) as u32 as f64
                } else {
                    v as u32 as f64
                }
            }
            DType::Bool => {
                if v != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            // Quantised values are exact dequantised values already.
            DType::Q8_0 | DType::Q4_0 => v,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A host element type that maps to one `DType`: `f32`, `half::f16`, `i32`, `u32`, `bool`.
pub trait Element: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The dtype a tensor of this element type has.
    const DTYPE: DType;
    /// Exact widening to f64 (every supported element fits).
    fn to_f64(self) -> f64;
    /// Conversion from an f64 already rounded to `DTYPE`.
    fn from_f64(v: f64) -> Self;
    /// One element from the bytes device storage holds for it ([`DType::size_in_bytes`]
    /// of them, little-endian; a bool as a `u32`).
    fn from_device_bytes(b: &[u8]) -> Self;
    /// `data` as the bytes device storage holds for it, where that is its own memory
    /// (f32, f16, i32 and u32 on a little-endian host): an upload then needs no copy.
    fn device_bytes(data: &[Self]) -> Option<&[u8]> {
        let _ = data;
        None
    }
}

/// `n` elements of `T` from device bytes, with no f64 in between (a readback of
/// millions of values stays one pass).
pub(crate) fn decode_as<T: Element>(bytes: &[u8], n: usize) -> Vec<T> {
    let w = T::DTYPE.size_in_bytes();
    bytes.chunks_exact(w).take(n).map(T::from_device_bytes).collect()
}

/// Four little-endian bytes from the start of `b`.
fn le4(b: &[u8]) -> [u8; 4] {
    [b[0], b[1], b[2], b[3]]
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn from_device_bytes(b: &[u8]) -> Self {
        f32::from_le_bytes(le4(b))
    }
    fn device_bytes(data: &[Self]) -> Option<&[u8]> {
        cfg!(target_endian = "little").then(|| bytemuck::cast_slice(data))
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn from_device_bytes(b: &[u8]) -> Self {
        f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
    }
    fn device_bytes(data: &[Self]) -> Option<&[u8]> {
        cfg!(target_endian = "little").then(|| bytemuck::cast_slice(data))
    }
}

impl Element for i32 {
    const DTYPE: DType = DType::I32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as i32
    }
    fn from_device_bytes(b: &[u8]) -> Self {
        i32::from_le_bytes(le4(b))
    }
    fn device_bytes(data: &[Self]) -> Option<&[u8]> {
        cfg!(target_endian = "little").then(|| bytemuck::cast_slice(data))
    }
}

impl Element for u32 {
    const DTYPE: DType = DType::U32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as u32
    }
    fn from_device_bytes(b: &[u8]) -> Self {
        u32::from_le_bytes(le4(b))
    }
    fn device_bytes(data: &[Self]) -> Option<&[u8]> {
        cfg!(target_endian = "little").then(|| bytemuck::cast_slice(data))
    }
}

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        if self {
            1.0
        } else {
            0.0
        }
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn from_device_bytes(b: &[u8]) -> Self {
        u32::from_le_bytes(le4(b)) != 0
    }
}

/// Encode values (already rounded to `dtype`) as the bytes device storage holds.
/// The result is padded to a multiple of four bytes.
pub(crate) fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    if dtype.is_quantized() {
        let f: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        return crate::quant::blocks_to_gpu(dtype, &crate::quant::quantize(dtype, &f));
    }
    let mut out = Vec::with_capacity((values.len() * dtype.size_in_bytes()).div_ceil(4) * 4);
    for &v in values {
        match dtype {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16::from_f64(v).to_bits().to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
            DType::Bool => out.extend_from_slice(&u32::from(v != 0.0).to_le_bytes()),
            DType::Q8_0 | DType::Q4_0 => unreachable!("handled above"),
        }
    }
    while out.len() % 4 != 0 {
        out.push(0);
    }
    out
}

/// Decode `n` elements of `dtype` from device bytes.
pub(crate) fn decode(dtype: DType, bytes: &[u8], n: usize) -> Vec<f64> {
    if dtype.is_quantized() {
        let blocks = crate::quant::gpu_to_blocks(dtype, bytes, n);
        return crate::quant::dequantize(dtype, &blocks).into_iter().map(f64::from).collect();
    }
    let w = dtype.size_in_bytes();
    (0..n)
        .map(|i| {
            let b = &bytes[i * w..i * w + w];
            match dtype {
                DType::F32 => f32::from_device_bytes(b) as f64,
                DType::F16 => f16::from_device_bytes(b).to_f64(),
                DType::I32 => i32::from_device_bytes(b) as f64,
                DType::U32 => u32::from_device_bytes(b) as f64,
                DType::Bool => f64::from(bool::from_device_bytes(b)),
                DType::Q8_0 | DType::Q4_0 => unreachable!("handled above"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Typed decoding agrees with the f64 decoding for every element type, from aligned
    /// bytes and from bytes one past an alignment boundary.
    #[test]
    fn decode_as_matches_decode() {
        fn check<T: Element + PartialEq>(values: &[f64]) {
            let bytes = encode(T::DTYPE, values);
            let n = values.len();
            let want: Vec<T> = decode(T::DTYPE, &bytes, n).into_iter().map(T::from_f64).collect();
            assert_eq!(decode_as::<T>(&bytes, n), want, "{} aligned", T::DTYPE);
            let mut shifted = vec![0u8];
            shifted.extend_from_slice(&bytes);
            assert_eq!(decode_as::<T>(&shifted[1..], n), want, "{} unaligned", T::DTYPE);
            assert_eq!(decode_as::<T>(&bytes, n - 1), want[..n - 1], "{} prefix", T::DTYPE);
        }
        let v = [1.5, -2.0, 0.0, 3.25, 1e6, -7.0, 65504.0];
        check::<f32>(&v);
        check::<f16>(&v);
        check::<i32>(&v);
        check::<u32>(&[1.0, 2.0, 0.0, 4e9, 7.0]);
        check::<bool>(&[1.0, 0.0, 1.0, 1.0, 0.0]);
    }
}
