// The subgroup matmul of `matmul_direct_subgroup.wgsl` with eight values per storage
// load (`ShaderCaps::wide_loads`): f32 A and B bound as `array<vec4<u64>>`, and
// `ld8_a`/`ld8_b` (generated) unpack one load into two vec4s with `oct`. On lavapipe a storage load
// is a loop over the SIMD lanes, and that loop bounds a matmul: here each lane owns 8
// consecutive columns and K advances 8 at a time, so a k-step of 8 costs 8 load loops
// for B per 8 columns and one per 8 rows for A, where the quad kernel spends 8 per 4
// columns and two per 8 rows (lavapipe, 1024^3 f32 in the kernel lab: about 1.6x).
// A is [M, K] (not transposed), K % 8 == 0; B is [K, N] with N % 8 == 0, or [N, K].
// TM is a multiple of 8 up to 64: each group of 8 rows keeps its accumulators in a
// struct of named vectors (a private array indexed by a loop would live in memory).
// Every lane runs the same trip count and all loads are clamped, so each shuffle happens
// in uniform control flow with the whole subgroup active.

struct Oct {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// The 8 floats of one wide load, in order (each u64 holds two, the first in its low half).
fn oct(w: vec4<u64>) -> Oct {
    let l = vec4<u32>(w & vec4<u64>(0xfffffffflu));
    let h = vec4<u32>(w >> vec4<u32>(32u));
    return Oct(bitcast<vec4<f32>>(vec4<u32>(l.x, h.x, l.y, h.y)), bitcast<vec4<f32>>(vec4<u32>(l.z, h.z, l.w, h.w)));
}

// One group of 8 rows: row i's columns c0 .. c0 + 3 in a{i}, c0 + 4 .. c0 + 7 in d{i}.
struct Rows8 {
    a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
    a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>,
    d0: vec4<f32>, d1: vec4<f32>, d2: vec4<f32>, d3: vec4<f32>,
    d4: vec4<f32>, d5: vec4<f32>, d6: vec4<f32>, d7: vec4<f32>,
}

// B at one k-step of 8: row kk's 8 columns in b{kk} (low 4) and e{kk} (high 4).
struct Step {
    b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32>,
    b4: vec4<f32>, b5: vec4<f32>, b6: vec4<f32>, b7: vec4<f32>,
    e0: vec4<f32>, e1: vec4<f32>, e2: vec4<f32>, e3: vec4<f32>,
    e4: vec4<f32>, e5: vec4<f32>, e6: vec4<f32>, e7: vec4<f32>,
}

// acc += sum over kk of a[kk] * B[kk] for one row: `x` holds the row's 8 k-values.
fn row_lo(acc: vec4<f32>, x: Oct, s: Step) -> vec4<f32> {
    var v = fma(vec4<f32>(x.lo.x), s.b0, acc);
    v = fma(vec4<f32>(x.lo.y), s.b1, v);
    v = fma(vec4<f32>(x.lo.z), s.b2, v);
    v = fma(vec4<f32>(x.lo.w), s.b3, v);
    v = fma(vec4<f32>(x.hi.x), s.b4, v);
    v = fma(vec4<f32>(x.hi.y), s.b5, v);
    v = fma(vec4<f32>(x.hi.z), s.b6, v);
    return fma(vec4<f32>(x.hi.w), s.b7, v);
}

fn row_hi(acc: vec4<f32>, x: Oct, s: Step) -> vec4<f32> {
    var v = fma(vec4<f32>(x.lo.x), s.e0, acc);
    v = fma(vec4<f32>(x.lo.y), s.e1, v);
    v = fma(vec4<f32>(x.lo.z), s.e2, v);
    v = fma(vec4<f32>(x.lo.w), s.e3, v);
    v = fma(vec4<f32>(x.hi.x), s.e4, v);
    v = fma(vec4<f32>(x.hi.y), s.e5, v);
    v = fma(vec4<f32>(x.hi.z), s.e6, v);
    return fma(vec4<f32>(x.hi.w), s.e7, v);
}

// Row l of the group from lane l's load.
fn lane_row(x: Oct, l: u32) -> Oct {
    return Oct(subgroupShuffle(x.lo, l), subgroupShuffle(x.hi, l));
}

// One k-step for a group of 8 rows whose A values lane l loaded (row l) in `x`.
fn group_step(g: ptr<function, Rows8>, x: Oct, s: Step) {
    var r = lane_row(x, 0u);
    (*g).a0 = row_lo((*g).a0, r, s); (*g).d0 = row_hi((*g).d0, r, s);
    r = lane_row(x, 1u);
    (*g).a1 = row_lo((*g).a1, r, s); (*g).d1 = row_hi((*g).d1, r, s);
    r = lane_row(x, 2u);
    (*g).a2 = row_lo((*g).a2, r, s); (*g).d2 = row_hi((*g).d2, r, s);
    r = lane_row(x, 3u);
    (*g).a3 = row_lo((*g).a3, r, s); (*g).d3 = row_hi((*g).d3, r, s);
    r = lane_row(x, 4u);
    (*g).a4 = row_lo((*g).a4, r, s); (*g).d4 = row_hi((*g).d4, r, s);
    r = lane_row(x, 5u);
    (*g).a5 = row_lo((*g).a5, r, s); (*g).d5 = row_hi((*g).d5, r, s);
    r = lane_row(x, 6u);
    (*g).a6 = row_lo((*g).a6, r, s); (*g).d6 = row_hi((*g).d6, r, s);
    r = lane_row(x, 7u);
    (*g).a7 = row_lo((*g).a7, r, s); (*g).d7 = row_hi((*g).d7, r, s);
}

// Rows 8 q .. 8 q + 7 of the tile, all 8 columns of this lane.
fn store_group(q: u32, g: Rows8) {
    let i = 8u * q;
    store_row(i, g.a0); store_row(i + 1u, g.a1); store_row(i + 2u, g.a2); store_row(i + 3u, g.a3);
    store_row(i + 4u, g.a4); store_row(i + 5u, g.a5); store_row(i + 6u, g.a6); store_row(i + 7u, g.a7);
    half = 1u;
    store_row(i, g.d0); store_row(i + 1u, g.d1); store_row(i + 2u, g.d2); store_row(i + 3u, g.d3);
    store_row(i + 4u, g.d4); store_row(i + 5u, g.d5); store_row(i + 6u, g.d6); store_row(i + 7u, g.d7);
    half = 0u;
}

@compute @workgroup_size(LANES, 1, 1)
fn main(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_invocation_id) sl: u32,
) {
    M = m(0u);
    N = m(1u);
    let K = m(2u);
    let nb = m(3u);
    let offs = batch_offsets(wid.z, nb);
    // Batch offsets and row strides are multiples of 8 (checked by the renderer).
    let off_a = offs.x / 8u;
    let off_b = offs.y / 8u;
    row0 = wid.y * TM;
    c0 = wid.x * LANES * 8u + lid.x * 8u;
    off_c = wid.z * M * N;
    if (M == 0u || N == 0u) {
        return;
    }
    let K8 = K / 8u;
    let N8 = N / 8u;
    // This lane's A loads, one per row group: row row0 + 8g + l.
    let own = sl % 8u;
    var ra: array<u32, 8>;
    for (var g = 0u; g < 8u; g = g + 1u) {
        ra[g] = off_a + min(row0 + 8u * g + own, M - 1u) * K8;
    }
    // B: the lane's 8 columns' rows of B^T, or its block of 8 columns of B.
    var cb: array<u32, 8>;
    for (var j = 0u; j < 8u; j = j + 1u) {
        if (TRANS_B) {
            cb[j] = off_b + min(c0 + j, N - 1u) * K8;
        } else {
            cb[j] = off_b + min(c0 / 8u, N8 - 1u);
        }
    }
    var g0: Rows8; var g1: Rows8; var g2: Rows8; var g3: Rows8;
    var g4: Rows8; var g5: Rows8; var g6: Rows8; var g7: Rows8;
    for (var k8 = 0u; k8 < K8; k8 = k8 + 1u) {
        var s: Step;
        if (TRANS_B) {
            // Column j's 8 k-values, transposed into rows of 8 columns.
            let t0 = ld8_b(cb[0] + k8); let t1 = ld8_b(cb[1] + k8);
            let t2 = ld8_b(cb[2] + k8); let t3 = ld8_b(cb[3] + k8);
            let t4 = ld8_b(cb[4] + k8); let t5 = ld8_b(cb[5] + k8);
            let t6 = ld8_b(cb[6] + k8); let t7 = ld8_b(cb[7] + k8);
            s.b0 = vec4<f32>(t0.lo.x, t1.lo.x, t2.lo.x, t3.lo.x); s.e0 = vec4<f32>(t4.lo.x, t5.lo.x, t6.lo.x, t7.lo.x);
            s.b1 = vec4<f32>(t0.lo.y, t1.lo.y, t2.lo.y, t3.lo.y); s.e1 = vec4<f32>(t4.lo.y, t5.lo.y, t6.lo.y, t7.lo.y);
            s.b2 = vec4<f32>(t0.lo.z, t1.lo.z, t2.lo.z, t3.lo.z); s.e2 = vec4<f32>(t4.lo.z, t5.lo.z, t6.lo.z, t7.lo.z);
            s.b3 = vec4<f32>(t0.lo.w, t1.lo.w, t2.lo.w, t3.lo.w); s.e3 = vec4<f32>(t4.lo.w, t5.lo.w, t6.lo.w, t7.lo.w);
            s.b4 = vec4<f32>(t0.hi.x, t1.hi.x, t2.hi.x, t3.hi.x); s.e4 = vec4<f32>(t4.hi.x, t5.hi.x, t6.hi.x, t7.hi.x);
            s.b5 = vec4<f32>(t0.hi.y, t1.hi.y, t2.hi.y, t3.hi.y); s.e5 = vec4<f32>(t4.hi.y, t5.hi.y, t6.hi.y, t7.hi.y);
            s.b6 = vec4<f32>(t0.hi.z, t1.hi.z, t2.hi.z, t3.hi.z); s.e6 = vec4<f32>(t4.hi.z, t5.hi.z, t6.hi.z, t7.hi.z);
            s.b7 = vec4<f32>(t0.hi.w, t1.hi.w, t2.hi.w, t3.hi.w); s.e7 = vec4<f32>(t4.hi.w, t5.hi.w, t6.hi.w, t7.hi.w);
        } else {
            let k = 8u * k8;
            var t = ld8_b(cb[0] + k * N8); s.b0 = t.lo; s.e0 = t.hi;
            t = ld8_b(cb[0] + (k + 1u) * N8); s.b1 = t.lo; s.e1 = t.hi;
            t = ld8_b(cb[0] + (k + 2u) * N8); s.b2 = t.lo; s.e2 = t.hi;
            t = ld8_b(cb[0] + (k + 3u) * N8); s.b3 = t.lo; s.e3 = t.hi;
            t = ld8_b(cb[0] + (k + 4u) * N8); s.b4 = t.lo; s.e4 = t.hi;
            t = ld8_b(cb[0] + (k + 5u) * N8); s.b5 = t.lo; s.e5 = t.hi;
            t = ld8_b(cb[0] + (k + 6u) * N8); s.b6 = t.lo; s.e6 = t.hi;
            t = ld8_b(cb[0] + (k + 7u) * N8); s.b7 = t.lo; s.e7 = t.hi;
        }
        group_step(&g0, ld8_a(ra[0] + k8), s);
        if (TM > 8u) { group_step(&g1, ld8_a(ra[1] + k8), s); }
        if (TM > 16u) { group_step(&g2, ld8_a(ra[2] + k8), s); }
        if (TM > 24u) { group_step(&g3, ld8_a(ra[3] + k8), s); }
        if (TM > 32u) { group_step(&g4, ld8_a(ra[4] + k8), s); }
        if (TM > 40u) { group_step(&g5, ld8_a(ra[5] + k8), s); }
        if (TM > 48u) { group_step(&g6, ld8_a(ra[6] + k8), s); }
        if (TM > 56u) { group_step(&g7, ld8_a(ra[7] + k8), s); }
    }
    store_group(0u, g0);
    if (TM > 8u) { store_group(1u, g1); }
    if (TM > 16u) { store_group(2u, g2); }
    if (TM > 24u) { store_group(3u, g3); }
    if (TM > 32u) { store_group(4u, g4); }
    if (TM > 40u) { store_group(5u, g5); }
    if (TM > 48u) { store_group(6u, g6); }
    if (TM > 56u) { store_group(7u, g7); }
    flush_rows();
}
