// `scatter_rows.wgsl` a quad at a time: f32 tables whose rows are a multiple of 4 long,
// with value operands that are buffers, bound as quads. Invocation q rewrites values
// 4q .. 4q + 3 of the [U, D] rows (one row's), by the same rules; a group of writes
// over the same rows applies each in turn to the quad, each to its own table. On
// lavapipe each storage access runs as a loop over the SIMD lanes, whose cost a quad
// shares among 4 values.
// meta: [0] U * D / 4, [1] D / 4, [2] R. The header defines `row_of(u)` and
// `write_quads(q, kq)` (every write's gate, new quad kq of its table from quad q of
// the rows, and store).

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let q = gid.x + gid.y * nwg.x * 64u;
    if (q >= m(0u)) {
        return;
    }
    let d4 = m(1u);
    let r = row_of(q / d4);
    if (r < 0 || u32(r) >= m(2u)) {
        return;
    }
    write_quads(q, u32(r) * d4 + q % d4);
}
