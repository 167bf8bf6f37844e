// The subgroup matmul of `matmul_direct_subgroup.wgsl` with eight values per storage
// load (`ShaderCaps::wide_loads`): f32 A and B bound as `array<vec4<u64>>`, and
// `ld8_a`/`ld8_b` (generated) unpack one load into two vec4s with `oct` (`wide.wgsl`, rendered
// in front, with the row groups and k-steps). On lavapipe a storage load
// is a loop over the SIMD lanes, and that loop bounds a matmul: here each lane owns 8
// consecutive columns and K advances 8 at a time, so a k-step of 8 costs 8 load loops
// for B per 8 columns and one per 8 rows for A, where the quad kernel spends 8 per 4
// columns and two per 8 rows (lavapipe, 1024^3 f32 in the kernel lab: about 1.6x).
// A is [M, K] (not transposed), K % 8 == 0; B is [K, N] with N % 8 == 0, or [N, K].
// TM is a multiple of 8 up to 96: each group of 8 rows keeps its accumulators in a
// struct of named vectors (a private array indexed by a loop would live in memory).
// With COLS = 16 (TM at most 32) a lane owns two blocks of 8 columns: each row's A values
// are shuffled once for both, so the per-row work that is not arithmetic (the shuffles,
// A's texel fetch) is spread over twice the columns.
// Every lane runs the same trip count and all loads are clamped, so each shuffle happens
// in uniform control flow with the whole subgroup active.

// Rows 8 q .. 8 q + 7 of the tile, the lane's block `blk` of 8 columns (quads `2 blk`
// and `2 blk + 1`).
fn store_group(q: u32, g: Rows8, blk: u32) {
    let i = 8u * q;
    lane_quad = 2u * blk;
    store_row(i, g.a0); store_row(i + 1u, g.a1); store_row(i + 2u, g.a2); store_row(i + 3u, g.a3);
    store_row(i + 4u, g.a4); store_row(i + 5u, g.a5); store_row(i + 6u, g.a6); store_row(i + 7u, g.a7);
    lane_quad = 2u * blk + 1u;
    store_row(i, g.d0); store_row(i + 1u, g.d1); store_row(i + 2u, g.d2); store_row(i + 3u, g.d3);
    store_row(i + 4u, g.d4); store_row(i + 5u, g.d5); store_row(i + 6u, g.d6); store_row(i + 7u, g.d7);
    lane_quad = 0u;
}

// One k-step for a group of 8 rows over both blocks of a lane's 16 columns (COLS = 16):
// `g` and `s` the first block's accumulators and B, `h` and `t` the second's.
fn group_step2(g: ptr<function, Rows8>, h: ptr<function, Rows8>, x: Oct, s: Step, t: Step) {
    var r = lane_row(x, 0u);
    (*g).a0 = row_lo((*g).a0, r, s); (*g).d0 = row_hi((*g).d0, r, s);
    (*h).a0 = row_lo((*h).a0, r, t); (*h).d0 = row_hi((*h).d0, r, t);
    r = lane_row(x, 1u);
    (*g).a1 = row_lo((*g).a1, r, s); (*g).d1 = row_hi((*g).d1, r, s);
    (*h).a1 = row_lo((*h).a1, r, t); (*h).d1 = row_hi((*h).d1, r, t);
    r = lane_row(x, 2u);
    (*g).a2 = row_lo((*g).a2, r, s); (*g).d2 = row_hi((*g).d2, r, s);
    (*h).a2 = row_lo((*h).a2, r, t); (*h).d2 = row_hi((*h).d2, r, t);
    r = lane_row(x, 3u);
    (*g).a3 = row_lo((*g).a3, r, s); (*g).d3 = row_hi((*g).d3, r, s);
    (*h).a3 = row_lo((*h).a3, r, t); (*h).d3 = row_hi((*h).d3, r, t);
    r = lane_row(x, 4u);
    (*g).a4 = row_lo((*g).a4, r, s); (*g).d4 = row_hi((*g).d4, r, s);
    (*h).a4 = row_lo((*h).a4, r, t); (*h).d4 = row_hi((*h).d4, r, t);
    r = lane_row(x, 5u);
    (*g).a5 = row_lo((*g).a5, r, s); (*g).d5 = row_hi((*g).d5, r, s);
    (*h).a5 = row_lo((*h).a5, r, t); (*h).d5 = row_hi((*h).d5, r, t);
    r = lane_row(x, 6u);
    (*g).a6 = row_lo((*g).a6, r, s); (*g).d6 = row_hi((*g).d6, r, s);
    (*h).a6 = row_lo((*h).a6, r, t); (*h).d6 = row_hi((*h).d6, r, t);
    r = lane_row(x, 7u);
    (*g).a7 = row_lo((*g).a7, r, s); (*g).d7 = row_hi((*g).d7, r, s);
    (*h).a7 = row_lo((*h).a7, r, t); (*h).d7 = row_hi((*h).d7, r, t);
}

// One k-step for a group of 8 rows: both blocks with COLS = 16, else the first.
fn step_group(g: ptr<function, Rows8>, h: ptr<function, Rows8>, x: Oct, s: Step, t: Step) {
    if (COLS == 16u) {
        group_step2(g, h, x, s, t);
    } else {
        group_step(g, x, s);
    }
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
    c0 = wid.x * LANES * COLS + lid.x * COLS;
    off_c = wid.z * M * N;
    if (M == 0u || N == 0u) {
        return;
    }
    let K8 = K / 8u;
    let N8 = N / 8u;
    // This lane's A loads, one per row group: row row0 + 8g + l.
    let own = sl % 8u;
    var ra: array<u32, 12>;
    for (var g = 0u; g < 12u; g = g + 1u) {
        ra[g] = off_a + min(row0 + 8u * g + own, M - 1u) * K8;
    }
    // B: the lane's columns' rows of B^T, or its blocks of 8 columns of B (cb[0] for the
    // first, cb[8] for the second).
    var cb: array<u32, 16>;
    for (var j = 0u; j < COLS; j = j + 1u) {
        if (TRANS_B) {
            cb[j] = off_b + min(c0 + j, N - 1u) * K8;
        } else {
            cb[j] = off_b + min(c0 / 8u + j / 8u, N8 - 1u);
        }
    }
    var g0: Rows8; var g1: Rows8; var g2: Rows8; var g3: Rows8;
    var g4: Rows8; var g5: Rows8; var g6: Rows8; var g7: Rows8;
    var g8: Rows8; var g9: Rows8; var g10: Rows8; var g11: Rows8;
    // The second block's accumulators (COLS = 16).
    var h0: Rows8; var h1: Rows8; var h2: Rows8; var h3: Rows8;
    for (var k8 = 0u; k8 < K8; k8 = k8 + 1u) {
        var s: Step;
        var t: Step;
        if (TRANS_B) {
            s = transposed(ld8_b(cb[0] + k8), ld8_b(cb[1] + k8), ld8_b(cb[2] + k8), ld8_b(cb[3] + k8),
                ld8_b(cb[4] + k8), ld8_b(cb[5] + k8), ld8_b(cb[6] + k8), ld8_b(cb[7] + k8));
            if (COLS == 16u) {
                t = transposed(ld8_b(cb[8] + k8), ld8_b(cb[9] + k8), ld8_b(cb[10] + k8), ld8_b(cb[11] + k8),
                    ld8_b(cb[12] + k8), ld8_b(cb[13] + k8), ld8_b(cb[14] + k8), ld8_b(cb[15] + k8));
            }
        } else {
            let k = 8u * k8;
            s = step_of_rows(ld8_b(cb[0] + k * N8), ld8_b(cb[0] + (k + 1u) * N8), ld8_b(cb[0] + (k + 2u) * N8),
                ld8_b(cb[0] + (k + 3u) * N8), ld8_b(cb[0] + (k + 4u) * N8), ld8_b(cb[0] + (k + 5u) * N8),
                ld8_b(cb[0] + (k + 6u) * N8), ld8_b(cb[0] + (k + 7u) * N8));
            if (COLS == 16u) {
                t = step_of_rows(ld8_b(cb[8] + k * N8), ld8_b(cb[8] + (k + 1u) * N8), ld8_b(cb[8] + (k + 2u) * N8),
                    ld8_b(cb[8] + (k + 3u) * N8), ld8_b(cb[8] + (k + 4u) * N8), ld8_b(cb[8] + (k + 5u) * N8),
                    ld8_b(cb[8] + (k + 6u) * N8), ld8_b(cb[8] + (k + 7u) * N8));
            }
        }
        step_group(&g0, &h0, ld8_a(ra[0] + k8), s, t);
        if (TM > 8u) { step_group(&g1, &h1, ld8_a(ra[1] + k8), s, t); }
        if (TM > 16u) { step_group(&g2, &h2, ld8_a(ra[2] + k8), s, t); }
        if (TM > 24u) { step_group(&g3, &h3, ld8_a(ra[3] + k8), s, t); }
        if (TM > 32u) { group_step(&g4, ld8_a(ra[4] + k8), s); }
        if (TM > 40u) { group_step(&g5, ld8_a(ra[5] + k8), s); }
        if (TM > 48u) { group_step(&g6, ld8_a(ra[6] + k8), s); }
        if (TM > 56u) { group_step(&g7, ld8_a(ra[7] + k8), s); }
        if (TM > 64u) { group_step(&g8, ld8_a(ra[8] + k8), s); }
        if (TM > 72u) { group_step(&g9, ld8_a(ra[9] + k8), s); }
        if (TM > 80u) { group_step(&g10, ld8_a(ra[10] + k8), s); }
        if (TM > 88u) { group_step(&g11, ld8_a(ra[11] + k8), s); }
    }
    store_group(0u, g0, 0u);
    if (TM > 8u) { store_group(1u, g1, 0u); }
    if (TM > 16u) { store_group(2u, g2, 0u); }
    if (TM > 24u) { store_group(3u, g3, 0u); }
    if (TM > 32u) { store_group(4u, g4, 0u); }
    if (TM > 40u) { store_group(5u, g5, 0u); }
    if (TM > 48u) { store_group(6u, g6, 0u); }
    if (TM > 56u) { store_group(7u, g7, 0u); }
    if (TM > 64u) { store_group(8u, g8, 0u); }
    if (TM > 72u) { store_group(9u, g9, 0u); }
    if (TM > 80u) { store_group(10u, g10, 0u); }
    if (TM > 88u) { store_group(11u, g11, 0u); }
    if (COLS == 16u) {
        store_group(0u, h0, 1u);
        if (TM > 8u) { store_group(1u, h1, 1u); }
        if (TM > 16u) { store_group(2u, h2, 1u); }
        if (TM > 24u) { store_group(3u, h3, 1u); }
    }
    flush_rows();
}
