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
// Every lane runs the same trip count and all loads are clamped, so each shuffle happens
// in uniform control flow with the whole subgroup active.

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
    var ra: array<u32, 12>;
    for (var g = 0u; g < 12u; g = g + 1u) {
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
    var g8: Rows8; var g9: Rows8; var g10: Rows8; var g11: Rows8;
    for (var k8 = 0u; k8 < K8; k8 = k8 + 1u) {
        var s: Step;
        if (TRANS_B) {
            s = transposed(ld8_b(cb[0] + k8), ld8_b(cb[1] + k8), ld8_b(cb[2] + k8), ld8_b(cb[3] + k8),
                ld8_b(cb[4] + k8), ld8_b(cb[5] + k8), ld8_b(cb[6] + k8), ld8_b(cb[7] + k8));
        } else {
            let k = 8u * k8;
            s = step_of_rows(ld8_b(cb[0] + k * N8), ld8_b(cb[0] + (k + 1u) * N8), ld8_b(cb[0] + (k + 2u) * N8),
                ld8_b(cb[0] + (k + 3u) * N8), ld8_b(cb[0] + (k + 4u) * N8), ld8_b(cb[0] + (k + 5u) * N8),
                ld8_b(cb[0] + (k + 6u) * N8), ld8_b(cb[0] + (k + 7u) * N8));
        }
        group_step(&g0, ld8_a(ra[0] + k8), s);
        if (TM > 8u) { group_step(&g1, ld8_a(ra[1] + k8), s); }
        if (TM > 16u) { group_step(&g2, ld8_a(ra[2] + k8), s); }
        if (TM > 24u) { group_step(&g3, ld8_a(ra[3] + k8), s); }
        if (TM > 32u) { group_step(&g4, ld8_a(ra[4] + k8), s); }
        if (TM > 40u) { group_step(&g5, ld8_a(ra[5] + k8), s); }
        if (TM > 48u) { group_step(&g6, ld8_a(ra[6] + k8), s); }
        if (TM > 56u) { group_step(&g7, ld8_a(ra[7] + k8), s); }
        if (TM > 64u) { group_step(&g8, ld8_a(ra[8] + k8), s); }
        if (TM > 72u) { group_step(&g9, ld8_a(ra[9] + k8), s); }
        if (TM > 80u) { group_step(&g10, ld8_a(ra[10] + k8), s); }
        if (TM > 88u) { group_step(&g11, ld8_a(ra[11] + k8), s); }
    }
    store_group(0u, g0);
    if (TM > 8u) { store_group(1u, g1); }
    if (TM > 16u) { store_group(2u, g2); }
    if (TM > 24u) { store_group(3u, g3); }
    if (TM > 32u) { store_group(4u, g4); }
    if (TM > 40u) { store_group(5u, g5); }
    if (TM > 48u) { store_group(6u, g6); }
    if (TM > 56u) { store_group(7u, g7); }
    if (TM > 64u) { store_group(8u, g8); }
    if (TM > 72u) { store_group(9u, g9); }
    if (TM > 80u) { store_group(10u, g10); }
    if (TM > 88u) { store_group(11u, g11); }
    flush_rows();
}
