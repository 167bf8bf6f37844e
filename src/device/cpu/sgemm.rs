//! Single-precision matrix products for the CPU backend: `C = alpha · A · B` over
//! strided operands.
//!
//! Natively this is the `gemm` crate (packing, register-blocked micro-kernels for each
//! x86 and Arm SIMD level chosen at run time, AVX-512 included), single-threaded per
//! call, over blocks of C that we spread over rayon's threads ([`native`]). In wasm it
//! is our own kernel on 128-bit SIMD, because the crate's wasm path reaches a fifth of what the
//! hardware allows: B is packed into panels of 8 columns, A into strips of 6 rows, and
//! a 6 × 8 micro-kernel keeps its 12 accumulators in registers (V8 maps them to xmm
//! registers). The blocked kernel is portable Rust over a 4-lane vector type, so the
//! native tests check it too.

/// `C = alpha · A · B` for an `m × k` A and a `k × n` B, both given by pointer and
/// (row stride, column stride) in elements; C is row-major with row stride `c_rs`.
/// `threads` lets the product use the machine's threads (native only).
///
/// # Safety
/// Every pointer must cover the strided matrix it describes, and C must not overlap
/// A or B.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    (a_rs, a_cs): (isize, isize),
    b: *const f32,
    (b_rs, b_cs): (isize, isize),
    c: *mut f32,
    c_rs: isize,
    threads: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(not(target_arch = "wasm32"))]
    if (DOT_ROWS_FROM..=DOT_ROWS).contains(&m) && a_cs == 1 && b_rs == 1 && k >= DOT_DEPTH && dot_rows_on() {
        dot_rows(m, n, k, alpha, (a, a_rs), (b, b_cs), c, c_rs, threads);
    } else {
        native(m, n, k, alpha, (a, a_rs, a_cs), (b, b_rs, b_cs), c, c_rs, threads);
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = threads;
        blocked(m, n, k, alpha, a, (a_rs, a_cs), b, (b_rs, b_cs), c, c_rs);
    }
}

/// Depth of one `gemm` call: longer products run as several, each adding to C.
#[cfg(not(target_arch = "wasm32"))]
const DEPTH: usize = 384;

/// [`sgemm`] natively: C split into one block of columns per thread (of rows where C
/// has too few columns), each block a single-threaded `gemm` call per [`DEPTH`] of depth
/// (the first writes C, the rest add to it). On this repository's AVX-512 host this
/// beat the crate's own threading at every shape measured, from 22 x 384 x 384 (0.15
/// against 0.19 ms) to 2048³ (52.9 against 53.4), and most at small M with a long K
/// (22 x 384 x 1536: 0.36 against 0.94 ms), where its AVX-512 kernels lose to its AVX2
/// ones (see docs/measurements.md).
#[cfg(not(target_arch = "wasm32"))]
#[allow(clippy::too_many_arguments)]
unsafe fn native(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    (a, a_rs, a_cs): (*const f32, isize, isize),
    (b, b_rs, b_cs): (*const f32, isize, isize),
    c: *mut f32,
    c_rs: isize,
    threads: bool,
) {
    let t = super::par::threads();
    let split = threads && m * n * k >= 48 * 48 * 48 && t > 1;
    let by_cols = n >= 32 * t || m < 32 * t;
    let len = if by_cols { n } else { m };
    let parts = if split { t.min(len / 32).max(1) } else { 1 };
    let step = len.div_ceil(parts).next_multiple_of(16).min(len);
    // Raw pointers are not Send; each block touches only its own part of C.
    let (a, b, c) = (a as usize, b as usize, c as usize);
    let block = |p: usize| {
        let x0 = p * step;
        if x0 >= len {
            return;
        }
        let nx = step.min(len - x0);
        let (a, b, c) = (a as *const f32, b as *const f32, c as *mut f32);
        // SAFETY: the offsets stay inside the operands the caller described (block
        // `x0 .. x0 + nx` of C's columns or rows, and the matching part of B or A).
        let (mm, nn, a, b, c) = unsafe {
            match by_cols {
                true => (m, nx, a, b.offset(x0 as isize * b_cs), c.add(x0)),
                false => (nx, n, a.offset(x0 as isize * a_rs), b, c.offset(x0 as isize * c_rs)),
            }
        };
        // At least one call, so that an empty depth (k = 0) still writes C's zeros.
        for k0 in (0..k.max(1)).step_by(DEPTH) {
            let kk = DEPTH.min(k - k0);
            // SAFETY: as above, for depth `k0 .. k0 + kk` of A's columns and B's rows.
            unsafe {
                gemm::gemm(
                    mm,
                    nn,
                    kk,
                    c,
                    1,
                    c_rs,
                    k0 > 0,
                    a.offset(k0 as isize * a_cs),
                    a_cs,
                    a_rs,
                    b.offset(k0 as isize * b_rs),
                    b_cs,
                    b_rs,
                    if k0 > 0 { 1.0 } else { 0.0 },
                    alpha,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
    };
    if parts > 1 {
        use rayon::prelude::*;
        (0..parts).into_par_iter().for_each(block);
    } else {
        block(0);
    }
}

/// Rows of A from which and up to which [`dot_rows`] takes a product. (Its blocks of 4
/// rows repeat the last row where fewer are left: 2 x 384 x 1536 still takes 0.025
/// against `gemm`'s 0.29 ms, but one row is `gemm`'s, at 1 x 384 x 384 0.016 against
/// 0.021; a kernel of one row by 8 of W took 0.10.)
#[cfg(not(target_arch = "wasm32"))]
const DOT_ROWS_FROM: usize = 2;
#[cfg(not(target_arch = "wasm32"))]
const DOT_ROWS: usize = 32;
/// The least depth [`dot_rows`] takes (at 20 x 100 x 64 `gemm` was a little faster).
#[cfg(not(target_arch = "wasm32"))]
const DOT_DEPTH: usize = 128;

/// Whether [`dot_rows`] runs: a CPU with AVX2 and FMA, unless `TESSERA_CPU_DOT_ROWS=0`.
#[cfg(not(target_arch = "wasm32"))]
fn dot_rows_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        super::math::simd() >= super::math::Simd::Avx2 && std::env::var("TESSERA_CPU_DOT_ROWS").as_deref() != Ok("0")
    })
}

/// [`sgemm`] for a few rows of A where A and B both run along K contiguously: a
/// Linear layer's `x · Wᵀ`, B's column j being row j of W. Each output is the dot product
/// of two contiguous rows, taken for a block of rows of A and of W at once, with a
/// vector of running sums per pair and no packing. (`gemm` packs B on every call, which
/// at a sentence's 20 rows costs about as much as the arithmetic.) The columns are
/// spread over rayon's threads; each block of W's rows is read once, from memory, and
/// reused from L1 for every block of A's rows.
#[cfg(not(target_arch = "wasm32"))]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    (a, lda): (*const f32, isize),
    (w, ldw): (*const f32, isize),
    c: *mut f32,
    c_rs: isize,
    threads: bool,
) {
    use super::math::{simd, vectorised, Simd};
    let t = super::par::threads();
    let parts = if threads && t > 1 && m * n * k >= 48 * 48 * 48 { t.min(n / 16).max(1) } else { 1 };
    let step = n.div_ceil(parts).next_multiple_of(4).min(n);
    // Raw pointers are not Send; each part writes only its own columns of C.
    let (a, w, c) = (a as usize, w as usize, c as usize);
    let wide = simd() == Simd::Avx512;
    let part = |p: usize| {
        let j0 = p * step;
        if j0 >= n {
            return;
        }
        let cols = j0..j0 + step.min(n - j0);
        let (a, w, c) = (a as *const f32, w as *const f32, c as *mut f32);
        // SAFETY: the caller's operands cover rows 0..m of A, rows `cols` of W and
        // C's columns `cols`, each K long; the kernels read and write only those.
        vectorised(
            #[inline(always)]
            || unsafe {
                if wide {
                    dot_block::<16, 4, 4>(m, cols, k, alpha, (a, lda), (w, ldw), (c, c_rs))
                } else {
                    dot_block::<8, 2, 4>(m, cols, k, alpha, (a, lda), (w, ldw), (c, c_rs))
                }
            },
        )
    };
    if parts > 1 {
        use rayon::prelude::*;
        (0..parts).into_par_iter().for_each(part);
    } else {
        part(0);
    }
}

/// [`dot_rows`]' kernel for C's columns `cols`: MB rows of A by NB rows of W at a time,
/// L running sums per pair (MB · NB vectors, all in registers: 16 of 32 at AVX-512's
/// 16 lanes, 8 of 16 at AVX2's 8), then each pair's sum in a tree and K's tail. Rows
/// past the ends repeat the last one: computed, never stored.
///
/// # Safety
/// As [`dot_rows`]; called where the CPU has FMA.
#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn dot_block<const L: usize, const MB: usize, const NB: usize>(
    m: usize,
    cols: std::ops::Range<usize>,
    k: usize,
    alpha: f32,
    (a, lda): (*const f32, isize),
    (w, ldw): (*const f32, isize),
    (c, c_rs): (*mut f32, isize),
) {
    let kv = k / L * L;
    for j0 in cols.clone().step_by(NB) {
        let wr: [*const f32; NB] = std::array::from_fn(|q| w.offset((j0 + q).min(cols.end - 1) as isize * ldw));
        for i0 in (0..m).step_by(MB) {
            let ar: [*const f32; MB] = std::array::from_fn(|p| a.offset((i0 + p).min(m - 1) as isize * lda));
            let mut acc = [[[0f32; L]; NB]; MB];
            for kk in (0..kv).step_by(L) {
                let av: [[f32; L]; MB] = std::array::from_fn(|p| (ar[p].add(kk) as *const [f32; L]).read_unaligned());
                let wv: [[f32; L]; NB] = std::array::from_fn(|q| (wr[q].add(kk) as *const [f32; L]).read_unaligned());
                for p in 0..MB {
                    for q in 0..NB {
                        for l in 0..L {
                            acc[p][q][l] = av[p][l].mul_add(wv[q][l], acc[p][q][l]);
                        }
                    }
                }
            }
            for p in 0..MB.min(m - i0) {
                for q in 0..NB.min(cols.end - j0) {
                    let mut v = acc[p][q];
                    let mut half = L / 2;
                    while half > 0 {
                        for l in 0..half {
                            v[l] += v[l + half];
                        }
                        half /= 2;
                    }
                    let mut sum = v[0];
                    for kk in kv..k {
                        sum = (*ar[p].add(kk)).mul_add(*wr[q].add(kk), sum);
                    }
                    *c.offset((i0 + p) as isize * c_rs).add(j0 + q) = alpha * sum;
                }
            }
        }
    }
}

/// Rows of the micro-kernel's tile.
const MR: usize = 4;
/// Columns of the micro-kernel's tile (two vectors).
const NR: usize = 8;
/// Depth of one packed block (A strip and B panel stay in L1 and L2).
const KC: usize = 256;
/// Rows of A packed at once.
const MC: usize = 128;
/// Columns of B packed at once.
const NC: usize = 512;

/// Four f32 lanes: wasm's `v128` where SIMD is enabled, an array elsewhere.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod v4 {
    use core::arch::wasm32::*;
    pub type V = v128;
    #[inline(always)]
    pub fn zero() -> V {
        f32x4_splat(0.0)
    }
    #[inline(always)]
    pub fn splat(x: f32) -> V {
        f32x4_splat(x)
    }
    /// # Safety
    /// `p` must point at four readable f32s.
    #[inline(always)]
    pub unsafe fn load(p: *const f32) -> V {
        v128_load(p as *const v128)
    }
    /// # Safety
    /// `p` must point at a readable f32.
    #[inline(always)]
    pub unsafe fn load_splat(p: *const f32) -> V {
        v128_load32_splat(p as *const u32)
    }
    /// # Safety
    /// `p` must point at four writable f32s.
    #[inline(always)]
    pub unsafe fn store(p: *mut f32, v: V) {
        v128_store(p as *mut v128, v)
    }
    #[inline(always)]
    pub fn mul_add(acc: V, a: V, b: V) -> V {
        f32x4_add(acc, f32x4_mul(a, b))
    }
    #[inline(always)]
    pub fn mul(a: V, b: V) -> V {
        f32x4_mul(a, b)
    }
    #[inline(always)]
    pub fn add(a: V, b: V) -> V {
        f32x4_add(a, b)
    }
}

#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
#[allow(dead_code)]
mod v4 {
    pub type V = [f32; 4];
    #[inline(always)]
    pub fn zero() -> V {
        [0.0; 4]
    }
    #[inline(always)]
    pub fn splat(x: f32) -> V {
        [x; 4]
    }
    /// # Safety
    /// `p` must point at four readable f32s.
    #[inline(always)]
    pub unsafe fn load(p: *const f32) -> V {
        std::ptr::read_unaligned(p as *const V)
    }
    /// # Safety
    /// `p` must point at a readable f32.
    #[inline(always)]
    pub unsafe fn load_splat(p: *const f32) -> V {
        [*p; 4]
    }
    /// # Safety
    /// `p` must point at four writable f32s.
    #[inline(always)]
    pub unsafe fn store(p: *mut f32, v: V) {
        std::ptr::write_unaligned(p as *mut V, v)
    }
    #[inline(always)]
    pub fn mul_add(acc: V, a: V, b: V) -> V {
        [acc[0] + a[0] * b[0], acc[1] + a[1] * b[1], acc[2] + a[2] * b[2], acc[3] + a[3] * b[3]]
    }
    #[inline(always)]
    pub fn mul(a: V, b: V) -> V {
        [a[0] * b[0], a[1] * b[1], a[2] * b[2], a[3] * b[3]]
    }
    #[inline(always)]
    pub fn add(a: V, b: V) -> V {
        [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]
    }
}

/// Pack `kc × nc` of B (from `b`) into panels of [`NR`] columns, each `kc` rows of
/// `NR` values (zero past the last column).
///
/// # Safety
/// `b` must cover the block; `out` holds `kc · nc.div_ceil(NR) · NR` values.
unsafe fn pack_b(out: &mut [f32], b: *const f32, (rs, cs): (isize, isize), kc: usize, nc: usize) {
    for (panel, chunk) in out.chunks_mut(kc * NR).take(nc.div_ceil(NR)).enumerate() {
        let j0 = panel * NR;
        let w = NR.min(nc - j0);
        for p in 0..kc {
            let row = &mut chunk[p * NR..p * NR + NR];
            let src = b.offset(p as isize * rs + j0 as isize * cs);
            if cs == 1 && w == NR {
                row.copy_from_slice(std::slice::from_raw_parts(src, NR));
            } else {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = if j < w { *src.offset(j as isize * cs) } else { 0.0 };
                }
            }
        }
    }
}

/// Pack `mc × kc` of A (from `a`) into strips of [`MR`] rows, each `kc` columns of
/// `MR` values (zero past the last row).
///
/// # Safety
/// `a` must cover the block; `out` holds `kc · mc.div_ceil(MR) · MR` values.
unsafe fn pack_a(out: &mut [f32], a: *const f32, (rs, cs): (isize, isize), mc: usize, kc: usize) {
    for (strip, chunk) in out.chunks_mut(kc * MR).take(mc.div_ceil(MR)).enumerate() {
        let i0 = strip * MR;
        let h = MR.min(mc - i0);
        for p in 0..kc {
            let col = &mut chunk[p * MR..p * MR + MR];
            let src = a.offset(i0 as isize * rs + p as isize * cs);
            for (i, v) in col.iter_mut().enumerate() {
                *v = if i < h { *src.offset(i as isize * rs) } else { 0.0 };
            }
        }
    }
}

/// The [`MR`] × [`NR`] micro-kernel over `kc` packed steps: `C[..mr, ..nr] (+)= alpha · A B`,
/// adding to C unless `first`.
///
/// # Safety
/// `ap` and `bp` hold `kc` packed steps; C covers `mr × nr` at row stride `c_rs`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn micro(
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    c: *mut f32,
    c_rs: isize,
    (mr, nr): (usize, usize),
    first: bool,
    alpha: f32,
) {
    use v4::*;
    // Eight named accumulators (4 rows x 2 vectors) so they stay in registers even
    // where the optimiser does not unroll loops (size-optimised wasm).
    let (mut c00, mut c01, mut c10, mut c11) = (zero(), zero(), zero(), zero());
    let (mut c20, mut c21, mut c30, mut c31) = (zero(), zero(), zero(), zero());
    let (mut ap, mut bp) = (ap, bp);
    for _ in 0..kc {
        let (b0, b1) = (load(bp), load(bp.add(4)));
        let a0 = load_splat(ap);
        c00 = mul_add(c00, a0, b0);
        c01 = mul_add(c01, a0, b1);
        let a1 = load_splat(ap.add(1));
        c10 = mul_add(c10, a1, b0);
        c11 = mul_add(c11, a1, b1);
        let a2 = load_splat(ap.add(2));
        c20 = mul_add(c20, a2, b0);
        c21 = mul_add(c21, a2, b1);
        let a3 = load_splat(ap.add(3));
        c30 = mul_add(c30, a3, b0);
        c31 = mul_add(c31, a3, b1);
        ap = ap.add(MR);
        bp = bp.add(NR);
    }
    let acc = [[c00, c01], [c10, c11], [c20, c21], [c30, c31]];
    let s = splat(alpha);
    if mr == MR && nr == NR {
        for (r, row) in acc.iter().enumerate() {
            let dst = c.offset(r as isize * c_rs);
            for (h, v) in row.iter().enumerate() {
                let v = mul(*v, s);
                let p = dst.add(4 * h);
                store(p, if first { v } else { add(load(p), v) });
            }
        }
    } else {
        let mut tile = [0.0f32; MR * NR];
        for (r, row) in acc.iter().enumerate() {
            for (v, c) in row.iter().enumerate() {
                store(tile.as_mut_ptr().add(r * NR + 4 * v), mul(*c, s));
            }
        }
        for r in 0..mr {
            let dst = c.offset(r as isize * c_rs);
            for j in 0..nr {
                let v = tile[r * NR + j];
                *dst.add(j) = if first { v } else { *dst.add(j) + v };
            }
        }
    }
}

/// The blocked product (see the module docs); `k = 0` writes zeros.
///
/// # Safety
/// As [`sgemm`].
#[allow(clippy::too_many_arguments, dead_code)]
pub(crate) unsafe fn blocked(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    sa: (isize, isize),
    b: *const f32,
    sb: (isize, isize),
    c: *mut f32,
    c_rs: isize,
) {
    if k == 0 {
        for i in 0..m {
            std::slice::from_raw_parts_mut(c.offset(i as isize * c_rs), n).fill(0.0);
        }
        return;
    }
    let mut bpack = vec![0.0f32; KC * NC.min(n).div_ceil(NR) * NR];
    let mut apack = vec![0.0f32; KC * MC.min(m).div_ceil(MR) * MR];
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            pack_b(&mut bpack, b.offset(pc as isize * sb.0 + jc as isize * sb.1), sb, kc, nc);
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                pack_a(&mut apack, a.offset(ic as isize * sa.0 + pc as isize * sa.1), sa, mc, kc);
                for jr in (0..nc).step_by(NR) {
                    for ir in (0..mc).step_by(MR) {
                        micro(
                            kc,
                            apack.as_ptr().add(ir / MR * kc * MR),
                            bpack.as_ptr().add(jr / NR * kc * NR),
                            c.offset((ic + ir) as isize * c_rs + (jc + jr) as isize),
                            c_rs,
                            (MR.min(mc - ir), NR.min(nc - jr)),
                            pc == 0,
                            alpha,
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// The blocked kernel (what wasm runs) against a plain triple loop, on sizes around
    /// its tiles and blocks, with transposed and strided operands.
    #[test]
    fn the_blocked_kernel_matches_a_plain_product() {
        for &(m, n, k) in &[(1, 1, 1), (5, 7, 3), (6, 8, 256), (13, 17, 257), (73, 9, 300), (7, 2050, 5), (2, 3, 0)] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
                let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
                let sa = if ta { (1, m as isize) } else { (k as isize, 1) };
                let sb = if tb { (1, k as isize) } else { (n as isize, 1) };
                let at = |i: usize, p: usize| a[(i as isize * sa.0 + p as isize * sa.1) as usize];
                let bt = |p: usize, j: usize| b[(p as isize * sb.0 + j as isize * sb.1) as usize];
                let mut c = vec![f32::NAN; m * n];
                unsafe { super::blocked(m, n, k, 0.5, a.as_ptr(), sa, b.as_ptr(), sb, c.as_mut_ptr(), n as isize) };
                for i in 0..m {
                    for j in 0..n {
                        let want: f32 = 0.5 * (0..k).map(|p| at(i, p) * bt(p, j)).sum::<f32>();
                        assert_eq!(c[i * n + j], want, "{m}x{n}x{k} ta={ta} tb={tb} at ({i}, {j})");
                    }
                }
            }
        }
    }

    /// The few-rows kernel against an f64 product, on row counts and widths around its
    /// blocks, depths with and without a tail, padded row strides, one thread and all
    /// (called directly, it checks on any CPU); and one product through `sgemm`.
    #[test]
    #[cfg(not(target_arch = "wasm32"))]
    fn the_few_rows_kernel_matches_a_plain_product() {
        for &(m, n, k) in
            &[(2, 5, 130), (3, 33, 256), (4, 1, 128), (5, 3, 131), (22, 17, 400), (32, 64, 384), (9, 130, 1543)]
        {
            for threads in [false, true] {
                let (lda, ldw, ldc) = (k + 3, k + 5, n + 2);
                let a: Vec<f32> = (0..m * lda).map(|i| ((i * 7) % 13) as f32 * 0.25 - 1.5).collect();
                let w: Vec<f32> = (0..n * ldw).map(|i| ((i * 5) % 11) as f32 * 0.5 - 2.5).collect();
                let mut c = vec![f32::NAN; m * ldc];
                let (sa, sw) = ((a.as_ptr(), lda as isize), (w.as_ptr(), ldw as isize));
                unsafe { super::dot_rows(m, n, k, 0.5, sa, sw, c.as_mut_ptr(), ldc as isize, threads) };
                for i in 0..m {
                    for j in 0..n {
                        let want = 0.5 * (0..k).map(|p| a[i * lda + p] as f64 * w[j * ldw + p] as f64).sum::<f64>();
                        let got = c[i * ldc + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                            "{m}x{n}x{k} at ({i}, {j}): {got} against {want}"
                        );
                    }
                    assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|x| x.is_nan()), "row {i}'s padding untouched");
                }
            }
        }
        // Through `sgemm` (W's rows as B's columns): the few-rows kernel where the CPU has
        // AVX2 and FMA, `gemm` elsewhere; either must give this.
        let (m, n, k) = (20, 384, 384);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 3) % 7) as f32 - 3.0).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 5) % 9) as f32 - 4.0).collect();
        let mut c = vec![0f32; m * n];
        unsafe {
            super::sgemm(
                m,
                n,
                k,
                1.0,
                a.as_ptr(),
                (k as isize, 1),
                w.as_ptr(),
                (1, k as isize),
                c.as_mut_ptr(),
                n as isize,
                true,
            )
        };
        for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
            let want: f32 = (0..k).map(|p| a[i * k + p] * w[j * k + p]).sum();
            assert_eq!(c[i * n + j], want, "small integers: exact, at ({i}, {j})");
        }
    }
}
