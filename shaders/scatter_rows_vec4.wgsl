// `scatter_rows.wgsl` a quad at a time: f32 tables whose rows are a multiple of 4 long,
// with value operands that are buffers, bound as quads. Invocation q rewrites values
// 4q .. 4q + 3 of the [U, D] rows (one row's), by the same rules; a group of writes
// over the same rows applies each in turn to the quad, each to its own table. On
// lavapipe each storage access runs as a loop over the SIMD lanes, whose cost a quad
// shares among 4 values.
// With ROW_LANES (CPU adapters), invocation u rewrites row u's quads one after another
// instead: the lanes of one access then reach as many rows, whose cache misses overlap,
// where quads of one row shared a miss and waited for it together.
// meta: [0] U * D / 4, [1] D / 4, [2] R, [3] U. The header defines `row_of(u)`,
// `write_quads(q, kq)` (every write's gate, new quad kq of its table from quad q of
// the rows, and store) and ROW_LANES.

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    let d4 = m(1u);
    if (ROW_LANES) {
        if (i >= m(3u)) {
            return;
        }
        let r = row_of(i);
        if (r < 0 || u32(r) >= m(2u)) {
            return;
        }
        for (var c = 0u; c < d4; c = c + 1u) {
            write_quads(i * d4 + c, u32(r) * d4 + c);
        }
        return;
    }
    if (i >= m(0u)) {
        return;
    }
    let r = row_of(i / d4);
    if (r < 0 || u32(r) >= m(2u)) {
        return;
    }
    write_quads(i, u32(r) * d4 + i % d4);
}
