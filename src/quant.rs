//! GGUF's quantised block formats, Q8_0 and Q4_0: 32 values per block with one f16
//! scale. Host-side quantise and dequantise (bit-exact with ggml's reference code), and
//! the GPU layout, which stores all scales first and all quants after them so kernels
//! make aligned `u32` loads.
//!
//! | format | GGUF block (bytes) | value |
//! | --- | --- | --- |
//! | Q8_0 | f16 `d`, 32 × i8 `q` (34) | `d · q` |
//! | Q4_0 | f16 `d`, 16 bytes of nibbles (18): value `j < 16` is the low nibble of byte `j`, value `j ≥ 16` the high nibble of byte `j − 16` | `d · (q − 8)` |

use crate::{DType, Device, Error, Result, Shape, Tensor};
use half::f16;
use std::panic::Location;

impl Tensor {
    /// A Q8_0 or Q4_0 tensor from GGUF blocks (the last axis a multiple of 32).
    #[track_caller]
    pub fn from_quantized(dtype: DType, shape: impl Into<Shape>, blocks: &[u8], device: &Device) -> Tensor {
        let loc = Location::caller();
        let shape = shape.into();
        match check_blocks("from_quantized", dtype, &shape, blocks.len(), loc) {
            Ok(()) => device.upload_quantized(blocks, shape, dtype),
            Err(e) => Tensor::failed(e, dtype, device),
        }
    }

    /// The GGUF blocks of a quantised tensor, exactly as they were given.
    pub async fn quantized_blocks(&self) -> Result<Vec<u8>> {
        self.check()?;
        if !self.dtype().is_quantized() {
            return Err(Error::DType {
                op: "quantized_blocks",
                dtypes: vec![self.dtype()],
                detail: "not a quantised tensor".into(),
                location: Location::caller(),
            });
        }
        self.realize().await?;
        let bytes = self.device().read_bytes(self).await?;
        Ok(gpu_to_blocks(self.dtype(), &bytes, self.numel()))
    }

    /// Quantise f32 or f16 values to Q8_0 or Q4_0 on the device (lazy, one kernel, with
    /// the expression producing the values fused in), by the same algorithm as
    /// [`quantize`]. The last axis must be a multiple of 32. `cast` to a block format
    /// does the same.
    #[track_caller]
    pub fn quantize(&self, dtype: DType) -> Tensor {
        self.quantize_at(dtype, Location::caller())
    }

    pub(crate) fn quantize_at(&self, dtype: DType, loc: &'static Location<'static>) -> Tensor {
        let check = || -> Result<()> {
            crate::ops::precheck("quantize", &[self], loc)?;
            if !self.dtype().is_float() || !dtype.is_quantized() {
                return Err(Error::DType {
                    op: "quantize",
                    dtypes: vec![self.dtype(), dtype],
                    detail: "quantisation takes f32 or f16 values to q8_0 or q4_0".into(),
                    location: loc,
                });
            }
            check_blocks("quantize", dtype, self.shape(), gguf_bytes(dtype, self.numel()), loc)
        };
        match check() {
            Ok(()) => Tensor::make_at(
                crate::graph::Op::Quantize,
                vec![self.clone()],
                self.shape().clone(),
                dtype,
                self.device(),
                loc,
            ),
            Err(e) => Tensor::failed(e, dtype, self.device()),
        }
    }

    /// Blocking `quantized_blocks` (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn quantized_blocks_blocking(&self) -> Result<Vec<u8>> {
        pollster::block_on(self.quantized_blocks())
    }
}

fn check_blocks(
    op: &'static str,
    dtype: DType,
    shape: &Shape,
    len: usize,
    loc: &'static Location<'static>,
) -> Result<()> {
    let err = |detail: String| Error::InvalidArgument { op, detail, location: loc };
    if !dtype.is_quantized() {
        return Err(err(format!("{dtype} is not a block format")));
    }
    let n = shape.checked_numel().ok_or_else(|| err("element count overflows".into()))?;
    if shape.dims().last().is_some_and(|&d| d % BLOCK != 0) || n % BLOCK != 0 {
        return Err(err(format!("the last axis of {shape} must be a multiple of {BLOCK}")));
    }
    if gguf_bytes(dtype, n) != len {
        return Err(err(format!("{len} bytes given; {shape} in {dtype} needs {}", gguf_bytes(dtype, n))));
    }
    Ok(())
}

/// Quantise a float tensor to Q8_0 or Q4_0 (on the host; the result lives on the same
/// device). The last axis must be a multiple of 32.
pub async fn quantize_tensor(t: &Tensor, dtype: DType) -> Result<Tensor> {
    let loc = Location::caller();
    t.check()?;
    if !t.dtype().is_float() {
        return Err(Error::DType {
            op: "quantize",
            dtypes: vec![t.dtype(), dtype],
            detail: "only f32 and f16 tensors can be quantised".into(),
            location: loc,
        });
    }
    let shape = t.shape().clone();
    check_blocks("quantize", dtype, &shape, gguf_bytes(dtype, shape.numel()), loc)?;
    let values: Vec<f32> = t.to_f64_vec().await?.into_iter().map(|v| v as f32).collect();
    let q = Tensor::from_quantized(dtype, shape, &quantize(dtype, &values), t.device());
    q.check()?;
    Ok(q)
}

/// [`quantize_tensor`] with per-column importance (see [`quantize_weighted`]).
pub async fn quantize_tensor_weighted(t: &Tensor, dtype: DType, importance: &[f32]) -> Result<Tensor> {
    let loc = Location::caller();
    t.check()?;
    let shape = t.shape().clone();
    check_blocks("quantize", dtype, &shape, gguf_bytes(dtype, shape.numel()), loc)?;
    let values: Vec<f32> = t.to_f64_vec().await?.into_iter().map(|v| v as f32).collect();
    let q = Tensor::from_quantized(dtype, shape, &quantize_weighted(dtype, &values, importance), t.device());
    q.check()?;
    Ok(q)
}

/// A float tensor stored in `dtype`: cast to f32 or f16, or quantised to Q8_0/Q4_0
/// (blocking, native only).
#[cfg(not(target_arch = "wasm32"))]
pub fn convert_blocking(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if dtype.is_quantized() {
        quantize_tensor_blocking(t, dtype)
    } else {
        Ok(t.cast(dtype))
    }
}

/// Blocking [`quantize_tensor`] (native only).
#[cfg(not(target_arch = "wasm32"))]
pub fn quantize_tensor_blocking(t: &Tensor, dtype: DType) -> Result<Tensor> {
    pollster::block_on(quantize_tensor(t, dtype))
}

/// Values per block.
pub const BLOCK: usize = 32;

/// Bytes of one GGUF block.
pub fn block_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q8_0 => 34,
        DType::Q4_0 => 18,
        _ => 0,
    }
}

/// Quant bytes of one block (without its scale).
fn quant_bytes(dtype: DType) -> usize {
    block_bytes(dtype) - 2
}

/// The first block of GGUF `blocks` whose f16 scale is NaN or infinite: such a block
/// cannot come from quantising finite values, so a file holding one is corrupt.
pub fn first_bad_scale(dtype: DType, blocks: &[u8]) -> Option<usize> {
    let bb = block_bytes(dtype);
    if bb == 0 {
        return None;
    }
    blocks.chunks_exact(bb).position(|b| !half::f16::from_le_bytes([b[0], b[1]]).is_finite())
}

/// Bytes of GGUF blocks for `numel` values (a multiple of 32).
pub fn gguf_bytes(dtype: DType, numel: usize) -> usize {
    numel / BLOCK * block_bytes(dtype)
}

/// Bytes of the GPU layout: scales (padded to 4 bytes), then quants.
pub fn gpu_bytes(dtype: DType, numel: usize) -> usize {
    let nb = numel.div_ceil(BLOCK);
    (2 * nb).div_ceil(4) * 4 + nb * quant_bytes(dtype)
}

/// Words of the scale region in the GPU layout (where the quants start, in `u32`s).
pub fn gpu_quant_offset_words(numel: usize) -> usize {
    (2 * numel.div_ceil(BLOCK)).div_ceil(4)
}

/// Quantise `values` (a multiple of 32) into GGUF blocks: Q8_0 exactly as ggml's
/// reference does, Q4_0 with a searched scale (see `q4_0_block`).
pub fn quantize(dtype: DType, values: &[f32]) -> Vec<u8> {
    quantize_weighted(dtype, values, &[])
}

/// Quantise with per-column importance (`importance[j]` for column `j` of rows of
/// `importance.len()` values; empty means uniform). Only Q4_0's scale search uses it.
pub fn quantize_weighted(dtype: DType, values: &[f32], importance: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(gguf_bytes(dtype, values.len()));
    for (bi, block) in values.chunks(BLOCK).enumerate() {
        let mut w = [1f32; BLOCK];
        if !importance.is_empty() && importance.len().is_multiple_of(BLOCK) {
            let start = (bi * BLOCK) % importance.len();
            w.copy_from_slice(&importance[start..start + BLOCK]);
        }
        let mut x = [0f32; BLOCK];
        x[..block.len()].copy_from_slice(block);
        match dtype {
            DType::Q8_0 => {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
                out.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
            }
            DType::Q4_0 => {
                let (d, q) = q4_0_block(&x, &w);
                out.extend_from_slice(&d.to_bits().to_le_bytes());
                out.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
            }
            _ => panic!("quantize: {dtype} is not a block format"),
        }
    }
    out
}

/// One Q4_0 block: the scale and 32 codes in 0..16 (value = d · (code − 8)).
///
/// ggml's reference takes `d = max / −8` from the value of largest magnitude. Here that
/// is the first of 41 candidate scales around it (as llama.cpp's `make_qx_quants`
/// searches); for each, the codes are rounded, the scale refitted by least squares and
/// rounded to f16, and the pair with the smallest squared error is kept, each column
/// weighted by its importance where calibration gave one (llama.cpp's imatrix). The format is
/// unchanged; only the choice of `d` and codes improves.
fn q4_0_block(x: &[f32; BLOCK], w: &[f32; BLOCK]) -> (f16, [u8; BLOCK]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let codes = |d: f32| -> [u8; BLOCK] {
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [8u8; BLOCK];
        for (o, &v) in q.iter_mut().zip(x) {
            *o = ((v * id + 8.5) as i32).clamp(0, 15) as u8;
        }
        q
    };
    // Squared error weighted by each column's importance (all ones without calibration).
    let sse = |d: f16, q: &[u8; BLOCK]| -> f32 {
        let d = d.to_f32();
        x.iter().zip(q).zip(w).map(|((&v, &c), &wi)| wi * (v - d * (c as f32 - 8.0)).powi(2)).sum()
    };
    let mut best_d = f16::from_f32(max / -8.0);
    let mut best_q = codes(best_d.to_f32());
    let mut best = sse(best_d, &best_q);
    if amax == 0.0 {
        return (best_d, best_q);
    }
    for step in -20..=20 {
        let d0 = max / -(8.0 + 0.05 * step as f32);
        let q = codes(d0);
        // Least-squares scale for these codes.
        let (mut sxl, mut sll) = (0f32, 0f32);
        for ((&v, &c), &wi) in x.iter().zip(&q).zip(w) {
            let l = c as f32 - 8.0;
            sxl += wi * v * l;
            sll += wi * l * l;
        }
        if sll == 0.0 {
            continue;
        }
        for d in [f16::from_f32(d0), f16::from_f32(sxl / sll)] {
            let q2 = codes(d.to_f32());
            let e = sse(d, &q2);
            if e < best {
                (best, best_d, best_q) = (e, d, q2);
            }
        }
    }
    (best_d, best_q)
}

/// Dequantise GGUF blocks.
pub fn dequantize(dtype: DType, blocks: &[u8]) -> Vec<f32> {
    let bb = block_bytes(dtype);
    let mut out = Vec::with_capacity(blocks.len() / bb.max(1) * BLOCK);
    for b in blocks.chunks_exact(bb) {
        let d = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        match dtype {
            DType::Q8_0 => out.extend(b[2..].iter().map(|&q| d * (q as i8) as f32)),
            DType::Q4_0 => {
                out.extend(b[2..].iter().map(|&q| d * ((q & 15) as f32 - 8.0)));
                out.extend(b[2..].iter().map(|&q| d * ((q >> 4) as f32 - 8.0)));
            }
            _ => {}
        }
    }
    out
}

/// GGUF blocks to the GPU layout (scales, then quants).
pub fn blocks_to_gpu(dtype: DType, blocks: &[u8]) -> Vec<u8> {
    let bb = block_bytes(dtype);
    let nb = blocks.len() / bb;
    let mut out = vec![0u8; gpu_bytes(dtype, nb * BLOCK)];
    let q0 = gpu_quant_offset_words(nb * BLOCK) * 4;
    let qb = quant_bytes(dtype);
    for (i, b) in blocks.chunks_exact(bb).enumerate() {
        out[2 * i..2 * i + 2].copy_from_slice(&b[..2]);
        out[q0 + i * qb..q0 + (i + 1) * qb].copy_from_slice(&b[2..]);
    }
    out
}

/// The GPU layout of `numel` values back to GGUF blocks (exact).
pub fn gpu_to_blocks(dtype: DType, gpu: &[u8], numel: usize) -> Vec<u8> {
    let nb = numel.div_ceil(BLOCK);
    let q0 = gpu_quant_offset_words(numel) * 4;
    let qb = quant_bytes(dtype);
    let mut out = Vec::with_capacity(nb * block_bytes(dtype));
    for i in 0..nb {
        out.extend_from_slice(&gpu[2 * i..2 * i + 2]);
        out.extend_from_slice(&gpu[q0 + i * qb..q0 + (i + 1) * qb]);
    }
    out
}

/// WGSL body of a load function over the GPU layout: element `i` of binding `var`,
/// with the quants starting at word `qoff` (a WGSL expression).
pub(crate) fn wgsl_load(dtype: DType, var: &str, qoff: &str) -> String {
    match dtype {
        DType::Q8_0 => format!(
            "let b = i >> 5u;\n    let d = unpack2x16float({var}[b >> 1u])[b & 1u];\n    \
             let w = {var}[{qoff} + (i >> 2u)];\n    \
             let q = bitcast<i32>(w << (24u - 8u * (i & 3u))) >> 24u;\n    return d * f32(q);"
        ),
        DType::Q4_0 => format!(
            "let b = i >> 5u;\n    let j = i & 31u;\n    let d = unpack2x16float({var}[b >> 1u])[b & 1u];\n    \
             let byte = b * 16u + (j & 15u);\n    \
             let w = ({var}[{qoff} + (byte >> 2u)] >> (8u * (byte & 3u))) & 255u;\n    \
             let q = select(w & 15u, w >> 4u, j >= 16u);\n    return d * (f32(q) - 8.0);"
        ),
        _ => unreachable!("wgsl_load takes a block format"),
    }
}

/// The dtypes a model's Linear weights can be stored in.
pub const MODEL_DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0];

/// Parse `f32`, `f16`, `q8_0`, `q4_0`.
pub fn parse_dtype(s: &str) -> Option<DType> {
    MODEL_DTYPES.into_iter().find(|d| d.name() == s.to_ascii_lowercase())
}

/// Store every Linear weight in `dtype` (f32, f16, Q8_0 or Q4_0). Biases, norms and
/// embeddings stay f32. Quantising reads each weight to the host once.
pub async fn quantize_linears(layers: Vec<&mut crate::nn::Linear>, dtype: DType) -> Result<()> {
    quantize_linears_calibrated(layers, dtype, &[]).await
}

/// [`quantize_linears`] with each layer's input-column importance (the mean square of
/// its inputs over calibration data, in the same order as `layers`; empty: uniform).
pub async fn quantize_linears_calibrated(
    layers: Vec<&mut crate::nn::Linear>,
    dtype: DType,
    importance: &[Vec<f32>],
) -> Result<()> {
    for (i, l) in layers.into_iter().enumerate() {
        let imp = importance.get(i).map(Vec::as_slice).unwrap_or(&[]);
        let w = &l.weight;
        l.weight = match dtype {
            d if d == w.dtype() => continue,
            DType::F32 | DType::F16 if !w.dtype().is_quantized() => {
                let c = w.cast(dtype);
                c.realize().await?;
                c
            }
            q if q.is_quantized() && w.dtype().is_float() => {
                // Blocks run along the input axis: pad it with zero columns to a whole
                // number of blocks (Linear::forward pads its input to match).
                let cols = w.dims().get(1).copied().unwrap_or(0);
                let pad = cols.next_multiple_of(32) - cols;
                if pad == 0 || w.rank() != 2 {
                    quantize_tensor_weighted(w, q, imp).await?
                } else {
                    let wp = w.pad(&[(0, 0), (0, pad)], 0.0);
                    let mut ip = imp.to_vec();
                    if !ip.is_empty() {
                        ip.resize(cols + pad, 0.0);
                    }
                    quantize_tensor_weighted(&wp, q, &ip).await?
                }
            }
            _ => {
                return Err(Error::DType {
                    op: "quantize_linears",
                    dtypes: vec![w.dtype(), dtype],
                    detail: format!("cannot convert {} from {} to {dtype}", l.name, w.dtype()),
                    location: Location::caller(),
                })
            }
        };
    }
    Ok(())
}

/// Q4_0 with GPTQ error compensation: columns are quantised in order, and each
/// column's rounding error is spread over the columns not yet quantised through the
/// inverse Hessian of the layer's calibration inputs, so the layer's *outputs* on those
/// inputs move as little as possible. Each block's scale is searched (`q4_0_block`,
/// weighted by the Hessian diagonal) on the compensated weights when the block starts.
/// The result is ordinary Q4_0.
///
/// As in the GPTQ paper's lazy batches, a block's errors reach the columns after it in
/// one pass per row once the block is done, rather than after every column: the same
/// subtractions in the same order, so the same result, with the weights streamed once
/// per block instead of once per column.
///
/// `w` is `[rows, cols]` row-major; `x` holds `n` calibration inputs of `cols` values.
pub fn gptq_q4_0(w: &[f32], rows: usize, cols: usize, x: &[f32]) -> Vec<u8> {
    let n = x.len() / cols.max(1);
    if n == 0 || !cols.is_multiple_of(BLOCK) || w.len() != rows * cols {
        return quantize(DType::Q4_0, w);
    }
    let h = damped_hessian(x, cols);
    let diag: Vec<f32> = (0..cols).map(|i| h[i * cols + i] as f32).collect();
    let Some(u) = inverse_cholesky_upper(&h, cols) else {
        return quantize(DType::Q4_0, w);
    };
    let mut wk: Vec<f64> = w.iter().map(|&v| v as f64).collect();
    let nb = cols / BLOCK;
    let mut scales = vec![f16::ZERO; rows * nb];
    let mut codes = vec![0u8; rows * cols];
    for b in 0..nb {
        let (c0, c1) = (b * BLOCK, (b + 1) * BLOCK);
        let imp: [f32; BLOCK] = std::array::from_fn(|j| diag[c0 + j]);
        for r in 0..rows {
            let row = &mut wk[r * cols..(r + 1) * cols];
            let blk: [f32; BLOCK] = std::array::from_fn(|j| row[c0 + j] as f32);
            let scale = q4_0_block(&blk, &imp).0;
            scales[r * nb + b] = scale;
            let d = scale.to_f32();
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut err = [0f64; BLOCK];
            for c in c0..c1 {
                let v = row[c] as f32;
                let q = ((v * id + 8.5) as i32).clamp(0, 15) as u8;
                codes[r * cols + c] = q;
                let e = (v as f64 - (d * (q as f32 - 8.0)) as f64) / u[c * cols + c];
                err[c - c0] = e;
                for (wv, uv) in row[c + 1..c1].iter_mut().zip(&u[c * cols + c + 1..c * cols + c1]) {
                    *wv -= e * uv;
                }
            }
            // The block's errors, in column order, reach the rest of the row.
            for (k, e) in err.iter().enumerate() {
                let c = c0 + k;
                for (wv, uv) in row[c1..].iter_mut().zip(&u[c * cols + c1..(c + 1) * cols]) {
                    *wv -= e * uv;
                }
            }
        }
    }
    let mut out = Vec::with_capacity(rows * nb * 18);
    for r in 0..rows {
        for b in 0..nb {
            out.extend_from_slice(&scales[r * nb + b].to_bits().to_le_bytes());
            let q = &codes[r * cols + b * BLOCK..r * cols + (b + 1) * BLOCK];
            out.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
        }
    }
    out
}

/// `H = XᵀX / n` over `n` rows of `cols` inputs, damped by 1% of its mean diagonal
/// (row-major `cols × cols`).
fn damped_hessian(x: &[f32], cols: usize) -> Vec<f64> {
    let n = x.len() / cols;
    let mut h = vec![0f64; cols * cols];
    let mut r64 = vec![0f64; cols];
    // The upper triangle, one input row at a time; the lower is its mirror.
    for r in x.chunks_exact(cols) {
        for (d, &v) in r64.iter_mut().zip(r) {
            *d = v as f64;
        }
        for i in 0..cols {
            let xi = r64[i];
            if xi == 0.0 {
                continue;
            }
            for (hv, &xj) in h[i * cols + i..(i + 1) * cols].iter_mut().zip(&r64[i..]) {
                *hv += xi * xj;
            }
        }
    }
    for i in 0..cols {
        for j in 0..i {
            h[i * cols + j] = h[j * cols + i];
        }
    }
    let mean_diag = (0..cols).map(|i| h[i * cols + i]).sum::<f64>() / cols as f64 / n as f64;
    let damp = 0.01 * mean_diag.max(1e-8);
    for v in &mut h {
        *v /= n as f64;
    }
    for i in 0..cols {
        h[i * cols + i] += damp;
    }
    h
}

/// `a · b` with four partial sums, so the additions do not wait on each other. Not
/// inlined: one copy serves both factorisations (the npm package's size).
#[inline(never)]
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    let (mut s, mut k) = ([0f64; 4], 0);
    while k + 4 <= n {
        for j in 0..4 {
            s[j] += a[k + j] * b[k + j];
        }
        k += 4;
    }
    let mut t = (s[0] + s[1]) + (s[2] + s[3]);
    for j in k..n {
        t += a[j] * b[j];
    }
    t
}

/// Lower Cholesky factor of a symmetric positive-definite `n × n` matrix.
fn cholesky(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            let s = a[i * n + j] - dot(&l[i * n..i * n + j], &l[j * n..j * n + j]);
            if i == j {
                if s <= 0.0 || !s.is_finite() {
                    return None;
                }
                l[i * n + i] = s.sqrt();
            } else {
                l[i * n + j] = s / l[j * n + j];
            }
        }
    }
    Some(l)
}

/// The upper Cholesky factor `U` of `H^{-1}` (`H^{-1} = UᵀU`), as GPTQ uses it
/// (row-major `n × n`).
///
/// With `J` the reversal of the index order, `JHJ = LLᵀ` gives `H = RRᵀ` for the upper
/// triangular `R = JLJ`, so `H^{-1} = R^{-T}R^{-1}` and `U = R^{-1} = J L^{-1} J`: one
/// Cholesky factorisation and one triangular inverse, each a row of dot products.
fn inverse_cholesky_upper(h: &[f64], n: usize) -> Option<Vec<f64>> {
    let rev: Vec<f64> = (0..n * n).map(|k| h[(n - 1 - k / n) * n + (n - 1 - k % n)]).collect();
    let l = cholesky(&rev, n)?;
    let mut u = vec![0f64; n * n];
    // Column c of L^{-1} by forward substitution (L m = e_c), into U reversed.
    let mut m = vec![0f64; n];
    for c in 0..n {
        m[c] = 1.0 / l[c * n + c];
        for i in c + 1..n {
            m[i] = -dot(&l[i * n + c..i * n + i], &m[c..i]) / l[i * n + i];
        }
        for i in c..n {
            u[(n - 1 - i) * n + (n - 1 - c)] = m[i];
        }
    }
    u.iter().all(|v| v.is_finite()).then_some(u)
}

/// Quantise Linear weights to Q4_0 with GPTQ, given each layer's calibration inputs
/// (`[n, in]` f32 values per layer, in the order of `layers`).
///
/// Natively the layers, being independent, are quantised in parallel; in a page, one at
/// a time (no threads, and memory is short).
pub async fn gptq_linears(layers: Vec<&mut crate::nn::Linear>, inputs: &[Vec<f32>]) -> Result<()> {
    let run = |(l, w, x): (&mut crate::nn::Linear, Vec<f32>, &Vec<f32>)| -> Result<()> {
        let (rows, cols) = (l.weight.dims()[0], l.weight.dims()[1]);
        let q = Tensor::from_quantized(DType::Q4_0, [rows, cols], &gptq_q4_0(&w, rows, cols, x), l.weight.device());
        q.check()?;
        l.weight = q;
        Ok(())
    };
    #[cfg(not(target_arch = "wasm32"))]
    let mut jobs = Vec::new();
    for (l, x) in layers.into_iter().zip(inputs) {
        let w: Vec<f32> = l.weight.to_f64_vec().await?.into_iter().map(|v| v as f32).collect();
        #[cfg(target_arch = "wasm32")]
        run((l, w, x))?;
        #[cfg(not(target_arch = "wasm32"))]
        jobs.push((l, w, x));
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        jobs.into_par_iter().try_for_each(run)?;
    }
    Ok(())
}

/// Store a [`Conv2d`](crate::nn::Conv2d) weight in Q8_0 or Q4_0 as the im2col
/// product's matrix `[O, Kp]`: each filter's `C/groups * KH * KW` values in PyTorch's
/// order, then zeros up to a whole number of blocks. With `calibration` (`n` im2col
/// rows of `Kp` values, as [`conv_columns`] gives them) Q4_0 uses GPTQ.
pub async fn quantize_conv(conv: &mut crate::nn::Conv2d, dtype: DType, calibration: Option<&[f32]>) -> Result<()> {
    let w = &conv.weight;
    if w.rank() == 2 && w.dtype() == dtype {
        return Ok(());
    }
    if !dtype.is_quantized() || w.rank() != 4 || !w.dtype().is_float() {
        return Err(Error::DType {
            op: "quantize_conv",
            dtypes: vec![w.dtype(), dtype],
            detail: format!("a {:?} {} convolution weight cannot be stored in {dtype}", w.dims(), w.dtype()),
            location: Location::caller(),
        });
    }
    let (rows, ck) = (w.dims()[0], w.dims()[1] * w.dims()[2] * w.dims()[3]);
    let kp = ck.next_multiple_of(BLOCK);
    let flat: Vec<f32> = w.to_f64_vec().await?.into_iter().map(|v| v as f32).collect();
    let mut m = vec![0f32; rows * kp];
    for (dst, src) in m.chunks_exact_mut(kp).zip(flat.chunks_exact(ck.max(1))) {
        dst[..ck].copy_from_slice(src);
    }
    let blocks = match calibration {
        Some(x) if dtype == DType::Q4_0 => gptq_q4_0(&m, rows, kp, x),
        _ => quantize(dtype, &m),
    };
    let q = Tensor::from_quantized(dtype, [rows, kp], &blocks, w.device());
    q.check()?;
    conv.kernel = (conv.weight.dims()[2], conv.weight.dims()[3]);
    conv.weight = q;
    Ok(())
}

/// The im2col rows a convolution with a `kernel` window reads from `x` `[N, C, H, W]`
/// (groups 1): `[N * OH * OW, C * KH * KW]` row-major, each padded with zeros to `kp`
/// values. GPTQ's calibration inputs for [`quantize_conv`].
pub async fn conv_columns(
    x: &Tensor,
    kernel: (usize, usize),
    o: crate::ops::nn::Conv2dOptions,
    kp: usize,
) -> Result<Vec<f32>> {
    let window = crate::graph::Window { kernel, stride: o.stride, padding: o.padding, dilation: o.dilation };
    let cols = x.im2col(window, 0.0); // [N, C, K, OH, OW]
    cols.check()?;
    let d = cols.dims().to_vec();
    let ck = d[1] * d[2];
    let rows = cols.permute(&[0, 3, 4, 1, 2]).reshape(vec![d[0] * d[3] * d[4], ck]);
    let v = rows.to_f64_vec().await?;
    let mut out = Vec::with_capacity(v.len() / ck.max(1) * kp);
    for r in v.chunks_exact(ck.max(1)) {
        out.extend(r.iter().map(|&x| x as f32));
        out.extend(std::iter::repeat_n(0f32, kp.saturating_sub(ck)));
    }
    Ok(out)
}

/// Store the weights of every Linear and Conv2d layer of `model` in `dtype`.
/// Linear weights take any of [`MODEL_DTYPES`]; convolution weights are quantised for
/// Q8_0 and Q4_0 and otherwise stay as they are. With `calibration` (a batch of
/// inputs), Q4_0 uses GPTQ: the batch runs through the model layer by layer, each
/// layer quantised on the inputs that the layers before it, already quantised, give
/// it. Returns how many layers changed.
pub async fn quantize_model(
    model: &mut crate::nn::Sequential,
    dtype: DType,
    calibration: Option<&Tensor>,
) -> Result<usize> {
    use crate::nn::{Conv2d, Linear};
    let gptq = dtype == DType::Q4_0 && calibration.is_some();
    let mut x = calibration.cloned();
    let mut changed = 0;
    for layer in model.layers.iter_mut() {
        if let Some(any) = layer.as_any_mut() {
            if let Some(l) = any.downcast_mut::<Linear>() {
                let before = l.weight.dtype();
                match (&x, gptq) {
                    (Some(xt), true) if l.weight.dtype().is_float() && l.weight.rank() == 2 => {
                        let (rows, cols) = (l.weight.dims()[0], l.weight.dims()[1]);
                        let kp = cols.next_multiple_of(BLOCK);
                        let inner = xt.dims().last().copied().unwrap_or(0);
                        let x2 = xt.reshape(vec![xt.numel() / inner.max(1), inner]);
                        let x2 = if kp > inner { x2.pad(&[(0, 0), (0, kp - inner)], 0.0) } else { x2 };
                        let xs: Vec<f32> = x2.to_f64_vec().await?.into_iter().map(|v| v as f32).collect();
                        let w = if kp > cols { l.weight.pad(&[(0, 0), (0, kp - cols)], 0.0) } else { l.weight.clone() };
                        let wv: Vec<f32> = w.to_f64_vec().await?.into_iter().map(|v| v as f32).collect();
                        let q =
                            Tensor::from_quantized(DType::Q4_0, [rows, kp], &gptq_q4_0(&wv, rows, kp, &xs), w.device());
                        q.check()?;
                        l.weight = q;
                    }
                    _ => quantize_linears(vec![&mut *l], dtype).await?,
                }
                changed += usize::from(l.weight.dtype() != before);
            } else if let Some(c) = any.downcast_mut::<Conv2d>() {
                if dtype.is_quantized() {
                    let calib = match (&x, gptq) {
                        (Some(xt), true) if c.options.groups == 1 && c.weight.rank() == 4 => {
                            let ck = c.weight.dims()[1] * c.weight.dims()[2] * c.weight.dims()[3];
                            let k = (c.weight.dims()[2], c.weight.dims()[3]);
                            Some(conv_columns(xt, k, c.options, ck.next_multiple_of(BLOCK)).await?)
                        }
                        _ => None,
                    };
                    let before = c.weight.dtype();
                    quantize_conv(c, dtype, calib.as_deref()).await?;
                    changed += usize::from(c.weight.dtype() != before);
                }
            }
        }
        if let Some(xt) = &x {
            let y = layer.forward(xt);
            y.realize().await?;
            x = Some(y);
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect()
    }

    #[test]
    fn q8_0_matches_ggml_and_bounds_error() {
        let x = values(64);
        let b = quantize(DType::Q8_0, &x);
        assert_eq!(b.len(), 68);
        let y = dequantize(DType::Q8_0, &b);
        for (blk, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, c) in xs.iter().zip(ys) {
                assert!((a - c).abs() <= amax / 127.0 * 0.5 + 2e-3 * amax, "block {blk}: {a} vs {c}");
            }
        }
        // The largest magnitude maps to ±127.
        assert!(b[2..34].iter().any(|&q| q as i8 == 127 || q as i8 == -127));
    }

    #[test]
    fn q4_0_matches_ggml_layout() {
        let mut x = vec![0f32; 32];
        x[0] = -8.0; // the extreme value sets d = -8 / -8 = 1
        x[16] = 3.0;
        x[5] = 7.0;
        let b = quantize(DType::Q4_0, &x);
        assert_eq!(b.len(), 18);
        assert_eq!(f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(), 1.0);
        // q = round(x / d) + 8, clamped: -8 -> 0, 3 -> 11, 7 -> 15; value 16 in the high nibble of byte 0.
        assert_eq!(b[2], 11 << 4); // low nibble 0 (value 0), high nibble 11 (value 16)
        assert_eq!(b[2 + 5] & 15, 15);
        let y = dequantize(DType::Q4_0, &b);
        assert_eq!((y[0], y[16], y[5], y[1]), (-8.0, 3.0, 7.0, 0.0));
    }

    #[test]
    fn gptq_beats_round_to_nearest_on_the_layer_outputs() {
        let (rows, cols, n) = (8, 64, 96);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3).collect();
        // Correlated inputs: a few shared directions plus noise.
        let x: Vec<f32> = (0..n * cols)
            .map(|k| {
                let (t, j) = (k / cols, k % cols);
                ((t * 31 + j / 8) % 17) as f32 / 8.0 - 1.0 + ((k * 104729 % 97) as f32 / 97.0 - 0.5) * 0.2
            })
            .collect();
        let out_err = |blocks: &[u8]| -> f64 {
            let wq = dequantize(DType::Q4_0, blocks);
            let mut e = 0.0;
            for t in 0..n {
                for r in 0..rows {
                    let (mut a, mut b) = (0f64, 0f64);
                    for j in 0..cols {
                        a += (w[r * cols + j] * x[t * cols + j]) as f64;
                        b += (wq[r * cols + j] * x[t * cols + j]) as f64;
                    }
                    e += (a - b).powi(2);
                }
            }
            e
        };
        let rtn = out_err(&quantize(DType::Q4_0, &w));
        let gptq = out_err(&gptq_q4_0(&w, rows, cols, &x));
        assert!(gptq < rtn * 0.9, "gptq {gptq} vs round-to-nearest {rtn}");
    }

    /// A symmetric positive-definite `n × n` matrix: `AᵀA / n` plus a little diagonal.
    fn spd(n: usize) -> Vec<f64> {
        let a: Vec<f32> = (0..2 * n * n).map(|k| ((k * 7919 + 13) % 1009) as f32 / 504.5 - 1.0).collect();
        damped_hessian(&a, n)
    }

    #[test]
    fn inverse_cholesky_upper_inverts_the_hessian() {
        for n in [1, 5, 64, 97] {
            let h = spd(n);
            let u = inverse_cholesky_upper(&h, n).unwrap();
            for i in 0..n {
                for j in 0..i {
                    assert_eq!(u[i * n + j], 0.0, "n {n}: U[{i}][{j}] below the diagonal");
                }
                assert!(u[i * n + i] > 0.0);
            }
            // (UᵀU) H = I.
            for i in 0..n {
                for j in 0..n {
                    let mut s = 0.0;
                    for k in 0..n {
                        let hinv_ik: f64 = (0..n).map(|t| u[t * n + i] * u[t * n + k]).sum();
                        s += hinv_ik * h[k * n + j];
                    }
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((s - want).abs() < 1e-9, "n {n}: (H^-1 H)[{i}][{j}] = {s}");
                }
            }
        }
        // Not positive definite: no factor.
        assert!(inverse_cholesky_upper(&[1.0, 2.0, 2.0, 1.0], 2).is_none());
    }

    #[test]
    fn gptq_lazy_blocks_give_the_column_by_column_result() {
        let (rows, cols, n) = (5, 96, 40);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.3).collect();
        let x: Vec<f32> =
            (0..n * cols).map(|k| ((k * 104729 % 997) as f32 / 498.5 - 1.0) * (1 + k % 3) as f32).collect();
        // GPTQ as written in the paper's first form: every column's error reaches every
        // later column at once.
        let h = damped_hessian(&x, cols);
        let u = inverse_cholesky_upper(&h, cols).unwrap();
        let mut wk: Vec<f64> = w.iter().map(|&v| v as f64).collect();
        let mut want = Vec::new();
        for r in 0..rows {
            let row = &mut wk[r * cols..(r + 1) * cols];
            for b in 0..cols / BLOCK {
                let blk: [f32; BLOCK] = std::array::from_fn(|j| row[b * BLOCK + j] as f32);
                let imp: [f32; BLOCK] = std::array::from_fn(|j| h[(b * BLOCK + j) * (cols + 1)] as f32);
                let d = q4_0_block(&blk, &imp).0;
                let id = if d.to_f32() != 0.0 { 1.0 / d.to_f32() } else { 0.0 };
                let mut q = [0u8; BLOCK];
                for (j, qj) in q.iter_mut().enumerate() {
                    let c = b * BLOCK + j;
                    let v = row[c] as f32;
                    *qj = ((v * id + 8.5) as i32).clamp(0, 15) as u8;
                    let e = (v as f64 - (d.to_f32() * (*qj as f32 - 8.0)) as f64) / u[c * cols + c];
                    for t in c + 1..cols {
                        row[t] -= e * u[c * cols + t];
                    }
                }
                want.extend_from_slice(&d.to_bits().to_le_bytes());
                want.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
            }
        }
        assert_eq!(gptq_q4_0(&w, rows, cols, &x), want);
    }

    #[test]
    fn gpu_layout_round_trips_exactly() {
        for dt in DType::QUANTIZED {
            for n in [32, 96, 160] {
                let b = quantize(dt, &values(n));
                let g = blocks_to_gpu(dt, &b);
                assert_eq!(g.len(), gpu_bytes(dt, n));
                assert_eq!(g.len() % 4, 0);
                assert_eq!(gpu_to_blocks(dt, &g, n), b);
            }
        }
    }
}
