//! Matrix multiplication with PyTorch's `matmul` rules: 1-D operands are promoted and
//! the added axis removed; batch axes broadcast.

use super::{dtype_err, precheck, shape_err, Loc};
use crate::graph::Op;
use crate::shape::broadcast_shapes;
use crate::{DType, Result, Shape, Tensor};
use std::panic::Location;

impl Tensor {
    /// `self @ other`. f32 and f16 operands (f16 results are computed in f32 and rounded).
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        let loc = Location::caller();
        self.lift(matmul_impl(self, other, loc))
    }
}

/// Most column blocks a B larger than one binding splits into (each block is a node).
const MAX_B_BLOCKS: usize = 4096;

fn matmul_impl(a: &Tensor, b: &Tensor, loc: Loc) -> Result<Tensor> {
    precheck("matmul", &[a, b], loc)?;
    // Two f32 or two f16 operands, or one of them quantised (dequantised as tiles load);
    // the result has the float operand's dtype.
    let out_dt = match (a.dtype(), b.dtype()) {
        (x, y) if x == y && x.is_float() => x,
        (x, q) | (q, x) if x.is_float() && q.is_quantized() => x,
        _ => {
            return Err(dtype_err(
                "matmul",
                &[a.dtype(), b.dtype()],
                "matmul needs two f32 or two f16 operands, or one float and one quantised operand",
                loc,
            ))
        }
    };
    if a.rank() == 0 || b.rank() == 0 {
        return Err(shape_err("matmul", &[a.dims(), b.dims()], "matmul needs operands of rank 1 or more", loc));
    }
    let a2 = if a.rank() == 1 { a.reshape_at(&[1, a.dims()[0]], loc) } else { a.clone() };
    let b2 = if b.rank() == 1 { b.reshape_at(&[b.dims()[0], 1], loc) } else { b.clone() };
    let (ra, rb) = (a2.rank(), b2.rank());
    let (m, k) = (a2.dims()[ra - 2], a2.dims()[ra - 1]);
    let (k2, n) = (b2.dims()[rb - 2], b2.dims()[rb - 1]);
    if k != k2 {
        return Err(shape_err("matmul", &[a.dims(), b.dims()], format!("inner dimensions differ ({k} vs {k2})"), loc));
    }
    let batch = broadcast_shapes(&a2.dims()[..ra - 2], &b2.dims()[..rb - 2])
        .ok_or_else(|| shape_err("matmul", &[a.dims(), b.dims()], "batch dimensions cannot be broadcast", loc))?;
    let r = batch.len() + 2;
    let pad = |t: &Tensor| {
        let mut d = vec![1; r - t.rank()];
        d.extend_from_slice(t.dims());
        t.reshape_at(&d, loc)
    };
    let (a3, b3) = (pad(&a2), pad(&b2));
    let mut out = batch.clone();
    out.extend([m, n]);
    super::check_numel("matmul", &out, loc)?;
    // A GPU holds no tensor past one buffer; refused here, before a graph of blocks.
    let caps = a.device().capabilities();
    let gpu = !a.device().is_cpu();
    let out_bytes = DType::F32.storage_bytes(out.iter().product());
    if gpu && out_bytes > caps.max_buffer_size {
        let what = format!("matmul output of shape {out:?}");
        return Err(crate::Error::Limit { what, needed: out_bytes, limit: caps.max_buffer_size });
    }
    // A B larger than one storage binding (a GPU binds B whole): products with column
    // blocks of B, each under half a binding, concatenated. The block copies and the
    // concatenation are element-wise kernels, which split into windows themselves.
    let limit = caps.max_storage_buffer_binding_size;
    let b_bytes = b3.dtype().storage_bytes(b3.numel());
    let blocks = (gpu && b3.dtype().is_float() && b_bytes > limit && n > 1)
        .then(|| (b_bytes.div_ceil((limit / 2).max(1)) as usize).min(n));
    if let Some(blocks) = blocks.filter(|&b| b > MAX_B_BLOCKS) {
        let what = format!("matmul operand B of shape {:?} (in blocks of half a binding)", b3.dims());
        return Err(crate::Error::Limit { what, needed: blocks as u64, limit: MAX_B_BLOCKS as u64 });
    }
    let product = |b: Tensor| aligned_product(&a3, b, &batch, m, k, loc);
    let mut y = match (blocks, split_k_factor(&batch, m, n, k, a.dtype(), b.dtype())) {
        (Some(blocks), _) => {
            // Block widths a multiple of 8, so that only the last may need padding.
            let w = n.div_ceil(blocks).next_multiple_of(8);
            let parts: Vec<Tensor> = (0..n).step_by(w).map(|lo| product(b3.narrow(-1, lo, w.min(n - lo)))).collect();
            Tensor::concat(&parts, -1)
        }
        (None, Some(s)) => split_k(&a3, &b3, s, m, n, k, r, loc),
        (None, None) => product(b3),
    };
    if out_dt == DType::F16 {
        y = y.cast_at(DType::F16, loc);
    }
    // Drop the axes added for 1-D operands.
    let mut fin = batch;
    if a.rank() > 1 {
        fin.push(m);
    }
    if b.rank() > 1 {
        fin.push(n);
    }
    Ok(y.reshape_at(&fin, loc))
}

/// The product node `a @ b` (`a` `[.., m, k]`, `b` `[.., k, n]`, batch axes `batch`).
/// The direct kernels of CPU adapters load B's rows 4 or 8 values at a time, so a B
/// read in its own layout with rows that are not 4-aligned took the scalar kernel:
/// lavapipe, 64x1152x14507 590 ms against 63 ms at 14512 columns, 300x384x1001 99
/// against 9 ms at 1008. Such a B is padded with zero columns to a multiple of 8 (a
/// copy, which an expression's own materialisation absorbs) and the extra columns of
/// the product dropped. (Thin products, under 64 columns, are computed transposed.)
fn aligned_product(a: &Tensor, b: Tensor, batch: &[usize], m: usize, k: usize, loc: Loc) -> Tensor {
    let n = b.dims()[b.rank() - 1];
    let pad = a.device().direct_matmul()
        && !n.is_multiple_of(4)
        && n >= 64
        && m > 8
        && k.is_multiple_of(4)
        && a.dtype() == DType::F32
        && b.dtype() == DType::F32
        && !crate::graph::schedule::reads_transposed(&b);
    let cols = if pad { n.next_multiple_of(8) } else { n };
    let b = if pad {
        let mut pads = vec![(0, 0); b.rank()];
        pads[b.rank() - 1] = (0, cols - n);
        b.pad(&pads, 0.0)
    } else {
        b
    };
    let mut shape = batch.to_vec();
    shape.extend([m, cols]);
    let y = Tensor::make_at(Op::Matmul, vec![a.clone(), b], Shape(shape), DType::F32, a.device(), loc);
    if pad {
        y.narrow(-1, 0, n)
    } else {
        y
    }
}

/// Slices of K for a split-K product, when the output has too few tiles to occupy the
/// device and K is long (a weight gradient `x^T @ dy` over a large batch, say).
fn split_k_factor(batch: &[usize], m: usize, n: usize, k: usize, da: DType, db: DType) -> Option<usize> {
    let tiles = m.div_ceil(64) * n.div_ceil(64) * batch.iter().product::<usize>();
    if !da.is_float() || !db.is_float() || tiles > 8 || k < 2048 {
        return None;
    }
    Some((k / 1024).clamp(2, 32))
}

/// `a @ b` as `s` independent products over slices of K, summed: `[s, m, k/s] @ [s, k/s, n]`.
#[allow(clippy::too_many_arguments)]
fn split_k(a: &Tensor, b: &Tensor, s: usize, m: usize, n: usize, k: usize, r: usize, loc: Loc) -> Tensor {
    let kc = k.div_ceil(s);
    let extra = kc * s - k;
    let lead = vec![1usize; r - 2];
    let (a2, b2) = (a.reshape_at(&[m, k], loc), b.reshape_at(&[k, n], loc));
    let (a2, b2) =
        if extra > 0 { (a2.pad(&[(0, 0), (0, extra)], 0.0), b2.pad(&[(0, extra), (0, 0)], 0.0)) } else { (a2, b2) };
    let ap = a2.reshape_at(&[m, s, kc], loc).permute(&[1, 0, 2]);
    let bp = b2.reshape_at(&[s, kc, n], loc);
    let part = Tensor::make_at(Op::Matmul, vec![ap, bp], Shape(vec![s, m, n]), DType::F32, a.device(), loc);
    let mut out = lead;
    out.extend([m, n]);
    part.sum(&[0], false).reshape_at(&out, loc)
}
