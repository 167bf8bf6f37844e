//! Batched matrix products on the CPU over [`sgemm`] (the `gemm` crate natively, our
//! own SIMD kernel in wasm). Operands are read in place with strides, so a transposed
//! operand costs nothing; f16 operands are widened once; a Q8_0/Q4_0 weight read as
//! `w^T` (a Linear layer) is dequantised panel by panel as the product needs it.

use super::buffer::{dequant_row, CpuBuffer, HostBuffer};
use super::par;
use super::sgemm::sgemm;
use crate::{DType, Result};
use std::borrow::Cow;
use std::sync::Arc;

/// A matmul operand as the scheduler hands it over: a buffer, the operand's logical
/// dims `[.., rows, cols]` (batch axes broadcast to the product's rank), and whether
/// the buffer holds it transposed (`[.., cols, rows]` in memory).
pub(crate) struct Operand {
    pub buf: Arc<CpuBuffer>,
    pub dims: Vec<usize>,
    pub transposed: bool,
}

impl Operand {
    /// (row stride, column stride) within one matrix.
    fn strides(&self) -> (isize, isize) {
        let r = self.dims.len();
        let (rows, cols) = (self.dims[r - 2], self.dims[r - 1]);
        if self.transposed {
            (1, rows as isize)
        } else {
            (cols as isize, 1)
        }
    }

    /// Offset of each batch index of `out_batch` into this operand (0 where it
    /// broadcasts).
    fn batch_offsets(&self, out_batch: &[usize]) -> Vec<usize> {
        let r = self.dims.len();
        let mat = self.dims[r - 2] * self.dims[r - 1];
        let mut strides = vec![0; r - 2];
        let mut acc = mat;
        for d in (0..r - 2).rev() {
            strides[d] = if self.dims[d] == 1 { 0 } else { acc };
            acc *= self.dims[d];
        }
        let count: usize = out_batch.iter().product();
        let mut c = vec![0; out_batch.len()];
        (0..count)
            .map(|i| {
                crate::shape::unravel(i, out_batch, &mut c);
                c.iter().zip(&strides).map(|(a, b)| a * b).sum()
            })
            .collect()
    }

    /// The values as f32 (borrowed when they are f32 already).
    fn f32(&self) -> Cow<'_, [f32]> {
        match self.buf.as_f32() {
            Some(v) => Cow::Borrowed(v),
            None => Cow::Owned(self.buf.to_f32()),
        }
    }
}

/// A raw pointer that may cross to rayon's threads: each thread writes a disjoint block
/// of the output.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer `off` elements on (a method, so closures capture the whole wrapper).
    ///
    /// # Safety
    /// `off` must stay inside the allocation.
    unsafe fn at(self, off: usize) -> *mut f32 {
        self.0.add(off)
    }
}

/// Products at least this large (m·n·k) use the machine's threads each; smaller ones
/// in a batch run one per thread.
const THREADED_FROM: usize = 48 * 48 * 48;

/// The batched product `[.., m, k] @ [.., k, n]` into `out_dims` `[.., m, n]` (f32).
pub(crate) fn matmul(out_dims: &[usize], a: &Operand, b: &Operand) -> Result<HostBuffer> {
    let r = out_dims.len();
    let (m, n) = (out_dims[r - 2], out_dims[r - 1]);
    let k = a.dims[r - 1];
    let batch = &out_dims[..r - 2];
    let count: usize = batch.iter().product();
    if m == 0 || n == 0 || count == 0 || k == 0 {
        return Ok(HostBuffer::zeros(DType::F32, count * m * n));
    }
    // Every element is written (`sgemm` stores C, it does not add to it), so a
    // recycled buffer is not zeroed first.
    let mut out = HostBuffer::for_overwrite(DType::F32, count * m * n).into_f32();
    let (mut ao, mut bo) = (a.batch_offsets(batch), b.batch_offsets(batch));
    // One B for every batch and A's matrices back to back (a Linear layer over
    // [batch, seq, features]): one product of count·m rows, not count small ones.
    let (mut m, mut count) = (m, count);
    if count > 1 && !a.transposed && bo.iter().all(|&o| o == 0) && ao.iter().enumerate().all(|(i, &o)| o == i * m * k) {
        (m, count) = (m * count, 1);
        (ao, bo) = (vec![0], vec![0]);
    }
    // A quantised weight read transposed: dequantise panels of its rows on the fly.
    if let (HostBuffer::Quant(qd, blocks), true, true) = (&**b.buf, b.transposed, k.is_multiple_of(32)) {
        let av = a.f32();
        quantized_product(&mut out, &av, a.strides(), &ao, blocks, *qd, &bo, (m, n, k));
        return Ok(HostBuffer::F32(out));
    }
    let (av, bv) = (a.f32(), b.f32());
    let (sa, sb) = (a.strides(), b.strides());
    let dst = SendPtr(out.as_mut_ptr());
    let per_product = m * n * k;
    // Many small products: one per thread task; few large ones: the crate's threads.
    let across = count > 1 && par::worth(per_product * count / 64) && per_product < THREADED_FROM * 8;
    par::map(count, across, |i| {
        // SAFETY: product i writes only its own m x n block of `out`; the operand
        // offsets and strides stay inside the buffers the scheduler checked.
        unsafe {
            sgemm(
                m,
                n,
                k,
                1.0,
                av.as_ptr().add(ao[i]),
                sa,
                bv.as_ptr().add(bo[i]),
                sb,
                dst.at(i * m * n),
                n as isize,
                !across,
            );
        }
        Ok(())
    })?;
    Ok(HostBuffer::F32(out))
}

/// Columns of the output (rows of a quantised `w`) dequantised per panel.
const PANEL: usize = 64;

/// `out = a @ w^T` per batch with `w` `[n, k]` in GGUF blocks.
#[allow(clippy::too_many_arguments)]
fn quantized_product(
    out: &mut [f32],
    a: &[f32],
    sa: (isize, isize),
    ao: &[usize],
    blocks: &[u8],
    dtype: DType,
    bo: &[usize],
    (m, n, k): (usize, usize, usize),
) {
    let dst = SendPtr(out.as_mut_ptr());
    let panels = n.div_ceil(PANEL);
    for (i, (&a_off, &b_off)) in ao.iter().zip(bo).enumerate() {
        let _ = par::map(panels, par::worth(m * n * k / 16), |p| {
            let (j0, j1) = (p * PANEL, ((p + 1) * PANEL).min(n));
            let mut panel = vec![0.0f32; (j1 - j0) * k];
            for (j, row) in (j0..j1).zip(panel.chunks_mut(k)) {
                dequant_row(dtype, blocks, b_off + j * k, row);
            }
            // SAFETY: panel p writes columns j0..j1 of product i only.
            unsafe {
                sgemm(
                    m,
                    j1 - j0,
                    k,
                    1.0,
                    a.as_ptr().add(a_off),
                    sa,
                    panel.as_ptr(),
                    (1, k as isize),
                    dst.at(i * m * n + j0),
                    n as isize,
                    false,
                );
            }
            Ok(())
        });
    }
}
