//! Host storage of the CPU backend: every dtype at its own width, and the chunks of
//! values that fused expressions compute in (f32 for every float dtype, i32, u32, and
//! one byte per bool).

use super::aligned::AlignedVec;
use crate::quant;
use crate::stats::{Counter, Counters};
use crate::DType;
use half::f16;
use half::slice::HalfFloatSliceExt;
use std::sync::Arc;

/// A realised tensor on the CPU backend.
#[derive(Clone, Debug)]
pub(crate) enum HostBuffer {
    F32(AlignedVec<f32>),
    F16(AlignedVec<f16>),
    I32(AlignedVec<i32>),
    U32(AlignedVec<u32>),
    /// One byte per element, 0 or 1.
    Bool(Vec<u8>),
    /// Q8_0 or Q4_0: GGUF blocks, exactly as given or as quantised.
    Quant(DType, Vec<u8>),
}

/// A [`HostBuffer`] counted in its device's statistics (buffers, bytes in use and
/// allocated) for as long as it lives.
#[derive(Debug)]
pub(crate) struct CpuBuffer {
    data: HostBuffer,
    counters: Arc<Counters>,
}

impl CpuBuffer {
    pub fn new(data: HostBuffer, counters: &Arc<Counters>) -> CpuBuffer {
        let bytes = data.bytes() as i64;
        counters.add(Counter::Buffers, 1);
        counters.allocated(bytes);
        counters.in_use(bytes);
        CpuBuffer { data, counters: counters.clone() }
    }
}

impl CpuBuffer {
    /// The values, to write in place (an in-place kernel that owns the buffer).
    pub fn data_mut(&mut self) -> &mut HostBuffer {
        &mut self.data
    }

    /// A counted copy.
    pub fn duplicate(&self) -> CpuBuffer {
        CpuBuffer::new(self.data.clone(), &self.counters)
    }
}

impl std::ops::Deref for CpuBuffer {
    type Target = HostBuffer;
    fn deref(&self) -> &HostBuffer {
        &self.data
    }
}

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        let bytes = self.data.bytes() as i64;
        self.counters.allocated(-bytes);
        self.counters.in_use(-bytes);
        super::memory::recycle(std::mem::replace(&mut self.data, HostBuffer::Bool(Vec::new())));
    }
}

/// `n` zeros, aligned, backed by huge pages where the OS allows.
fn big<T: Copy + Default>(n: usize) -> AlignedVec<T> {
    let mut v = AlignedVec::zeroed(n);
    super::memory::advise_huge_pages(&mut v);
    v
}

/// `values` in storage laid out as [`big`]'s (an uploaded table is aligned as a
/// computed one).
pub(super) fn filled<T: Copy + Default>(values: impl ExactSizeIterator<Item = T>) -> AlignedVec<T> {
    let mut v = big(values.len());
    v.iter_mut().zip(values).for_each(|(o, x)| *o = x);
    v
}

std::thread_local! {
    /// Chunks' f32 vectors that were stored, kept for the thread's next loads: a chunk of
    /// 8 KiB is past the C allocator's per-thread cache, and a malloc per load and a free
    /// per store were about 6% of a `x.matmul(w) + b` product's profile.
    static SPARE_F32: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty vector with room for `n` f32, from the thread's spares when one is large
/// enough.
pub(crate) fn spare_f32(n: usize) -> Vec<f32> {
    // (Native only: the npm package's size budget.)
    if cfg!(target_arch = "wasm32") {
        return Vec::with_capacity(n);
    }
    SPARE_F32
        .with(|s| {
            let mut s = s.borrow_mut();
            let i = s.iter().position(|v| v.capacity() >= n)?;
            Some(s.swap_remove(i))
        })
        .unwrap_or_else(|| Vec::with_capacity(n))
}

/// Keep `v` for [`spare_f32`] (a few chunk-sized vectors per thread; others are freed).
pub(crate) fn give_f32(mut v: Vec<f32>) {
    if v.capacity() <= 4 * super::expr::CHUNK && cfg!(not(target_arch = "wasm32")) {
        v.clear();
        SPARE_F32.with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < 8 {
                s.push(v);
            }
        });
    }
}

/// Values computed for a chunk of indices, in the compute type of their dtype.
#[derive(Clone, Debug)]
pub(crate) enum Vals {
    F(Vec<f32>),
    I(Vec<i32>),
    U(Vec<u32>),
    B(Vec<u8>),
}

impl Vals {
    pub fn len(&self) -> usize {
        match self {
            Vals::F(v) => v.len(),
            Vals::I(v) => v.len(),
            Vals::U(v) => v.len(),
            Vals::B(v) => v.len(),
        }
    }

    /// `n` copies of `value` (already rounded to `dtype`) in `dtype`'s compute type.
    pub fn splat(dtype: DType, value: f64, n: usize) -> Vals {
        match dtype {
            DType::I32 => Vals::I(vec![value as i32; n]),
            DType::U32 => Vals::U(vec![value as u32; n]),
            DType::Bool => Vals::B(vec![u8::from(value != 0.0); n]),
            _ => Vals::F(vec![value as f32; n]),
        }
    }

    /// Element `i` as f64 (exact).
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Vals::F(v) => v[i] as f64,
            Vals::I(v) => v[i] as f64,
            Vals::U(v) => v[i] as f64,
            Vals::B(v) => v[i] as f64,
        }
    }

    /// The values at `runs` (first index, length), each run stepping by `stride`, read
    /// from `self` as the values of indices `base..` (so index `i` is `self[i - base]`).
    pub fn pick_runs(&self, runs: &[(usize, usize)], stride: usize, base: usize) -> Vals {
        fn go<T: Copy>(v: &[T], runs: &[(usize, usize)], stride: usize, base: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(runs.iter().map(|r| r.1).sum());
            for &(s, l) in runs {
                let s = s - base;
                match stride {
                    1 => out.extend_from_slice(&v[s..s + l]),
                    _ => out.extend((0..l).map(|j| v[s + j * stride])),
                }
            }
            out
        }
        match self {
            Vals::F(v) => Vals::F(go(v, runs, stride, base)),
            Vals::I(v) => Vals::I(go(v, runs, stride, base)),
            Vals::U(v) => Vals::U(go(v, runs, stride, base)),
            Vals::B(v) => Vals::B(go(v, runs, stride, base)),
        }
    }

    /// `src`'s values, in order, written over the stretches `runs` (start, length) of
    /// `self` (both of one compute type).
    pub fn place(&mut self, runs: &[(usize, usize)], src: &Vals) {
        fn go<T: Copy>(dst: &mut [T], runs: &[(usize, usize)], src: &[T]) {
            let mut at = 0;
            for &(p, l) in runs {
                dst[p..p + l].copy_from_slice(&src[at..at + l]);
                at += l;
            }
        }
        match (self, src) {
            (Vals::F(d), Vals::F(s)) => go(d, runs, s),
            (Vals::I(d), Vals::I(s)) => go(d, runs, s),
            (Vals::U(d), Vals::U(s)) => go(d, runs, s),
            (Vals::B(d), Vals::B(s)) => go(d, runs, s),
            _ => debug_assert!(false, "place between compute types"),
        }
    }

    /// Values as indices for gathers: integers as they are, floats truncated.
    pub fn to_i64(&self) -> Vec<i64> {
        match self {
            Vals::F(v) => v.iter().map(|&x| x as i64).collect(),
            Vals::I(v) => v.iter().map(|&x| x as i64).collect(),
            Vals::U(v) => v.iter().map(|&x| x as i64).collect(),
            Vals::B(v) => v.iter().map(|&x| x as i64).collect(),
        }
    }
}

/// Round f32 values to f16 precision in place (what an f16 op stores).
pub(crate) fn round_f16(v: &mut [f32]) {
    let mut tmp = [f16::ZERO; 256];
    for c in v.chunks_mut(256) {
        let t = &mut tmp[..c.len()];
        t.convert_from_f32_slice(c);
        t.convert_to_f32_slice(c);
    }
}

impl HostBuffer {
    /// Host values (already rounded to `dtype`) in `dtype`'s storage.
    pub fn from_f64(dtype: DType, values: &[f64]) -> HostBuffer {
        match dtype {
            DType::F32 => HostBuffer::F32(filled(values.iter().map(|&v| v as f32))),
            DType::F16 => HostBuffer::F16(filled(values.iter().map(|&v| f16::from_f64(v)))),
            DType::I32 => HostBuffer::I32(filled(values.iter().map(|&v| v as i32))),
            DType::U32 => HostBuffer::U32(filled(values.iter().map(|&v| v as u32))),
            DType::Bool => HostBuffer::Bool(values.iter().map(|&v| u8::from(v != 0.0)).collect()),
            DType::Q8_0 | DType::Q4_0 => {
                let f: Vec<f32> = values.iter().map(|&v| v as f32).collect();
                HostBuffer::Quant(dtype, quant::quantize(dtype, &f))
            }
        }
    }

    /// `n` elements of `dtype` from little-endian bytes in its storage layout, with no
    /// f64 in between (a loaded model's tensors: one pass, no transient of twice their
    /// size). `None` for Bool and the quantised dtypes.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8], n: usize) -> Option<HostBuffer> {
        let w = dtype.size_in_bytes();
        let b = bytes.get(..n.checked_mul(w)?)?;
        let four = |c: &[u8]| [c[0], c[1], c[2], c[3]];
        Some(match dtype {
            DType::F32 => HostBuffer::F32(filled(b.chunks_exact(4).map(|c| f32::from_le_bytes(four(c))))),
            DType::I32 => HostBuffer::I32(filled(b.chunks_exact(4).map(|c| i32::from_le_bytes(four(c))))),
            DType::U32 => HostBuffer::U32(filled(b.chunks_exact(4).map(|c| u32::from_le_bytes(four(c))))),
            DType::F16 => {
                HostBuffer::F16(filled(b.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))))
            }
            DType::Bool | DType::Q8_0 | DType::Q4_0 => return None,
        })
    }

    /// An output buffer of `dtype` for `n` elements, written by kernels, all zero.
    /// A large one is backed by huge pages where the OS allows (a table whose rows are
    /// gathered and scattered at random, [`super::memory`]).
    pub fn zeros(dtype: DType, n: usize) -> HostBuffer {
        Self::output(dtype, n, true)
    }

    /// An output buffer for a kernel that writes every one of its `n` elements: a
    /// recycled buffer keeps its old values (initialised, and overwritten before any
    /// read) instead of being zeroed first, a pass over memory saved per output.
    pub fn for_overwrite(dtype: DType, n: usize) -> HostBuffer {
        Self::output(dtype, n, false)
    }

    fn output(dtype: DType, n: usize, zeroed: bool) -> HostBuffer {
        if let Some(b) = super::memory::take(dtype, n, zeroed) {
            return b;
        }
        // A buffer the pool may take back later gets its size class's room, so that
        // next step's buffer of a slightly different length can reuse it. Allocated
        // zeroed (`vec!` of zero bits is calloc): fresh pages come zero from the OS
        // without a pass over them. Aligned ([`AlignedVec`]): rows of a large table
        // then span as few cache lines as they can.
        if let Some(room) = super::memory::pooled_capacity(dtype, n) {
            let mut b = match dtype {
                DType::F32 => HostBuffer::F32(AlignedVec::zeroed(room)),
                DType::F16 => HostBuffer::F16(AlignedVec::zeroed(room)),
                DType::I32 => HostBuffer::I32(AlignedVec::zeroed(room)),
                DType::U32 => HostBuffer::U32(AlignedVec::zeroed(room)),
                _ => HostBuffer::Bool(vec![0; room]),
            };
            b.reset_len(n);
            return b;
        }
        match dtype {
            DType::F32 => HostBuffer::F32(big(n)),
            DType::F16 => HostBuffer::F16(big(n)),
            DType::I32 => HostBuffer::I32(big(n)),
            DType::U32 => HostBuffer::U32(big(n)),
            DType::Bool => HostBuffer::Bool(vec![0; n]),
            DType::Q8_0 | DType::Q4_0 => HostBuffer::Quant(dtype, vec![0; quant::gguf_bytes(dtype, n)]),
        }
    }

    /// Every element as f64 (exact), `n` of them.
    pub fn to_f64(&self, n: usize) -> Vec<f64> {
        match self {
            HostBuffer::F32(v) => v.iter().map(|&x| x as f64).collect(),
            HostBuffer::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            HostBuffer::I32(v) => v.iter().map(|&x| x as f64).collect(),
            HostBuffer::U32(v) => v.iter().map(|&x| x as f64).collect(),
            HostBuffer::Bool(v) => v.iter().map(|&x| x as f64).collect(),
            HostBuffer::Quant(d, b) => quant::dequantize(*d, b).into_iter().take(n).map(f64::from).collect(),
        }
    }

    /// The bytes a GPU buffer of this tensor would hold (the common device encoding:
    /// bool as u32, quantised blocks in the split GPU layout), padded to 4 bytes.
    pub fn device_bytes(&self) -> Vec<u8> {
        let mut out: Vec<u8> = match self {
            HostBuffer::F32(v) => bytemuck::cast_slice(v).to_vec(),
            HostBuffer::F16(v) => v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
            HostBuffer::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostBuffer::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            HostBuffer::Bool(v) => v.iter().flat_map(|&x| u32::from(x).to_le_bytes()).collect(),
            HostBuffer::Quant(d, b) => quant::blocks_to_gpu(*d, b),
        };
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out
    }

    /// Heap bytes held.
    pub fn bytes(&self) -> u64 {
        (match self {
            HostBuffer::F32(v) => v.len() * 4,
            HostBuffer::F16(v) => v.len() * 2,
            HostBuffer::I32(v) => v.len() * 4,
            HostBuffer::U32(v) => v.len() * 4,
            HostBuffer::Bool(v) => v.len(),
            HostBuffer::Quant(_, b) => b.len(),
        }) as u64
    }

    /// Elements `start..start + n` in the compute type.
    pub fn load_range(&self, start: usize, n: usize) -> Vals {
        let r = start..start + n;
        match self {
            HostBuffer::F32(v) => {
                let mut out = spare_f32(n);
                out.extend_from_slice(&v[r]);
                Vals::F(out)
            }
            HostBuffer::F16(v) => {
                let mut out = vec![0.0f32; n];
                v[r].convert_to_f32_slice(&mut out);
                Vals::F(out)
            }
            HostBuffer::I32(v) => Vals::I(v[r].to_vec()),
            HostBuffer::U32(v) => Vals::U(v[r].to_vec()),
            HostBuffer::Bool(v) => Vals::B(v[r].to_vec()),
            HostBuffer::Quant(d, b) => Vals::F(r.map(|i| dequant_at(*d, b, i)).collect()),
        }
    }

    /// The elements of `runs` (first index, length), each run stepping by `stride`
    /// (1: a contiguous copy; 0: one element repeated), concatenated.
    pub fn load_runs(&self, runs: &[(usize, usize)], stride: usize) -> Vals {
        let n = runs.iter().map(|r| r.1).sum();
        // `out` is empty with room for the `n` values.
        fn go<T: Copy, U: Copy>(
            v: &[T],
            runs: &[(usize, usize)],
            stride: usize,
            f: impl Fn(T) -> U,
            mut out: Vec<U>,
        ) -> Vec<U> {
            // Rows of a table gathered at random: start loading a few rows ahead.
            const AHEAD: usize = 16;
            // (wasm has no prefetch instruction: no such loop there.)
            let far = cfg!(not(target_arch = "wasm32")) && stride == 1 && runs.len() > 1;
            if far {
                runs.iter().take(AHEAD).for_each(|&(s, l)| super::memory::prefetch_run(v, s, l));
            }
            for (k, &(s, l)) in runs.iter().enumerate() {
                if far {
                    if let Some(&(s2, l2)) = runs.get(k + AHEAD) {
                        super::memory::prefetch_run(v, s2, l2);
                    }
                }
                match stride {
                    1 => out.extend(v[s..s + l].iter().map(|&x| f(x))),
                    0 => out.extend(std::iter::repeat_n(f(v[s]), l)),
                    _ => out.extend((0..l).map(|j| f(v[s + j * stride]))),
                }
            }
            out
        }
        match self {
            HostBuffer::F32(v) => Vals::F(go(v, runs, stride, |x| x, spare_f32(n))),
            HostBuffer::F16(v) => Vals::F(go(v, runs, stride, |x| x.to_f32(), spare_f32(n))),
            HostBuffer::I32(v) => Vals::I(go(v, runs, stride, |x| x, Vec::with_capacity(n))),
            HostBuffer::U32(v) => Vals::U(go(v, runs, stride, |x| x, Vec::with_capacity(n))),
            HostBuffer::Bool(v) => Vals::B(go(v, runs, stride, |x| x, Vec::with_capacity(n))),
            HostBuffer::Quant(d, b) => {
                let idx: Vec<usize> = runs.iter().flat_map(|&(s, l)| (0..l).map(move |j| s + j * stride)).collect();
                Vals::F(idx.iter().map(|&i| dequant_at(*d, b, i)).collect())
            }
        }
    }

    /// The elements at `idx` in the compute type.
    pub fn load_list(&self, idx: &[usize]) -> Vals {
        match self {
            HostBuffer::F32(v) => Vals::F(idx.iter().map(|&i| v[i]).collect()),
            HostBuffer::F16(v) => Vals::F(idx.iter().map(|&i| v[i].to_f32()).collect()),
            HostBuffer::I32(v) => Vals::I(idx.iter().map(|&i| v[i]).collect()),
            HostBuffer::U32(v) => Vals::U(idx.iter().map(|&i| v[i]).collect()),
            HostBuffer::Bool(v) => Vals::B(idx.iter().map(|&i| v[i]).collect()),
            HostBuffer::Quant(d, b) => Vals::F(idx.iter().map(|&i| dequant_at(*d, b, i)).collect()),
        }
    }

    /// f32 values of a float or quantised buffer (a copy; f16 and blocks converted).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            HostBuffer::F32(v) => v.to_vec(),
            HostBuffer::F16(v) => {
                let mut out = vec![0.0f32; v.len()];
                v.convert_to_f32_slice(&mut out);
                out
            }
            HostBuffer::Quant(d, b) => quant::dequantize(*d, b),
            HostBuffer::I32(v) => v.iter().map(|&x| x as f32).collect(),
            HostBuffer::U32(v) => v.iter().map(|&x| x as f32).collect(),
            HostBuffer::Bool(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }

    /// The dtype these values are stored as.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub fn dtype_tag(&self) -> DType {
        match self {
            HostBuffer::F32(_) => DType::F32,
            HostBuffer::F16(_) => DType::F16,
            HostBuffer::I32(_) => DType::I32,
            HostBuffer::U32(_) => DType::U32,
            HostBuffer::Bool(_) => DType::Bool,
            HostBuffer::Quant(d, _) => *d,
        }
    }

    /// Elements the buffer has room for (bytes for quantised blocks).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub fn capacity(&self) -> usize {
        match self {
            HostBuffer::F32(v) => v.capacity(),
            HostBuffer::F16(v) => v.capacity(),
            HostBuffer::I32(v) => v.capacity(),
            HostBuffer::U32(v) => v.capacity(),
            HostBuffer::Bool(v) | HostBuffer::Quant(_, v) => v.capacity(),
        }
    }

    /// Bytes of the allocation (its capacity, not only its length).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub fn capacity_bytes(&self) -> u64 {
        let width = match self {
            HostBuffer::F32(_) | HostBuffer::I32(_) | HostBuffer::U32(_) => 4,
            HostBuffer::F16(_) => 2,
            HostBuffer::Bool(_) | HostBuffer::Quant(..) => 1,
        };
        (self.capacity() * width) as u64
    }

    /// `n` elements: the first ones keep their values, any past the old length are 0.
    pub fn reset_len(&mut self, n: usize) {
        fn go<T: Copy>(v: &mut Vec<T>, n: usize, zero: T) {
            v.truncate(n);
            v.resize(n, zero);
        }
        match self {
            HostBuffer::F32(v) => v.reset_len(n),
            HostBuffer::F16(v) => v.reset_len(n),
            HostBuffer::I32(v) => v.reset_len(n),
            HostBuffer::U32(v) => v.reset_len(n),
            HostBuffer::Bool(v) | HostBuffer::Quant(_, v) => go(v, n, 0),
        }
    }

    /// f32 values, moved out when this is an f32 buffer (no copy, still aligned), else
    /// [`to_f32`].
    ///
    /// [`to_f32`]: HostBuffer::to_f32
    pub fn into_f32(self) -> AlignedVec<f32> {
        match self {
            HostBuffer::F32(v) => v,
            other => other.to_f32().into(),
        }
    }

    /// The f32 data when this is an f32 buffer (no copy).
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            HostBuffer::F32(v) => Some(v),
            _ => None,
        }
    }
}

/// Element `i` of GGUF blocks of `dtype`, dequantised.
#[inline]
pub(crate) fn dequant_at(dtype: DType, blocks: &[u8], i: usize) -> f32 {
    let (blk, j) = (i / 32, i % 32);
    match dtype {
        DType::Q8_0 => {
            let b = &blocks[blk * 34..blk * 34 + 34];
            f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32() * (b[2 + j] as i8) as f32
        }
        _ => {
            let b = &blocks[blk * 18..blk * 18 + 18];
            let q = if j < 16 { b[2 + j] & 15 } else { b[2 + j - 16] >> 4 };
            f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32() * (q as f32 - 8.0)
        }
    }
}

/// Dequantise the row of `k` values starting at element `start` (a multiple of 32) of
/// GGUF blocks into `out`.
pub(crate) fn dequant_row(dtype: DType, blocks: &[u8], start: usize, out: &mut [f32]) {
    let bb = quant::block_bytes(dtype);
    let b0 = start / 32;
    for (c, o) in out.chunks_mut(32).enumerate() {
        let b = &blocks[(b0 + c) * bb..(b0 + c + 1) * bb];
        let d = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        match dtype {
            DType::Q8_0 => {
                for (o, &q) in o.iter_mut().zip(&b[2..]) {
                    *o = d * (q as i8) as f32;
                }
            }
            _ => {
                for (j, o) in o.iter_mut().enumerate() {
                    let q = if j < 16 { b[2 + j] & 15 } else { b[2 + j - 16] >> 4 };
                    *o = d * (q as f32 - 8.0);
                }
            }
        }
    }
}
