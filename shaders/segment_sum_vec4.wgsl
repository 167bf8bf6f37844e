// `segment_reduce.wgsl`'s sum a quad at a time, where the values are rows of an f32
// buffer (a multiple of 4 long) gathered through index_select along rows: invocation q
// sums quad q of the [S, D] output, reading each value row's 4 values with one load
// and its row indices once instead of 4 times. On lavapipe each storage access runs as
// a loop over the SIMD lanes, so this makes a quarter of the loads.
// With ROW_LANES (CPU adapters), invocation s sums all of segment s's quads, one after
// another: the lanes of one access then reach rows of as many segments, whose cache
// misses overlap, where the quads of one row shared a miss and waited for it together.
// meta: [0] S * D / 4, [1] D, [2] N (value rows), [3] S. The header defines
// `seg_value4(i)` (values i .. i + 3 of the fused [N, D] values, i a multiple of 4),
// `seg_offset(j)` and ROW_LANES.
// Offsets are clamped into 0..N and made non-decreasing, as in the scalar kernel.

/// The sum of quad `c` (its first value's column) over value rows start..end.
fn segment_quad(start: u32, end: u32, d: u32, c: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var k = start; k < end; k = k + 1u) {
        acc = acc + seg_value4(k * d + c);
    }
    return acc;
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    let d = m(1u);
    let n = m(2u);
    let d4 = d / 4u;
    let s = select(i / max(d4, 1u), i, ROW_LANES);
    if (select(i >= m(0u), s >= m(3u), ROW_LANES)) {
        return;
    }
    let start = u32(clamp(seg_offset(s), 0, i32(n)));
    let end = max(start, u32(clamp(seg_offset(s + 1u), 0, i32(n))));
    if (ROW_LANES) {
        for (var c = 0u; c < d4; c = c + 1u) {
            out[s * d4 + c] = segment_quad(start, end, d, c * 4u);
        }
        return;
    }
    out[i] = segment_quad(start, end, d, (i % d4) * 4u);
}
