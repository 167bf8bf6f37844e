// `segment_reduce.wgsl`'s sum a quad at a time, where the values are rows of an f32
// buffer (a multiple of 4 long) gathered through index_select along rows: invocation q
// sums quad q of the [S, D] output, reading each value row's 4 values with one load
// and its row indices once instead of 4 times. On lavapipe each storage access runs as
// a loop over the SIMD lanes, so this makes a quarter of the loads.
// meta: [0] S * D / 4, [1] D, [2] N (value rows). The header defines `seg_value4(i)`
// (values i .. i + 3 of the fused [N, D] values, i a multiple of 4) and `seg_offset(j)`.
// Offsets are clamped into 0..N and made non-decreasing, as in the scalar kernel.

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let q = gid.x + gid.y * nwg.x * 64u;
    if (q >= m(0u)) {
        return;
    }
    let d = m(1u);
    let n = m(2u);
    let d4 = d / 4u;
    let s = q / d4;
    let c = (q % d4) * 4u;
    let start = u32(clamp(seg_offset(s), 0, i32(n)));
    let end = max(start, u32(clamp(seg_offset(s + 1u), 0, i32(n))));
    var acc = vec4<f32>(0.0);
    for (var k = start; k < end; k = k + 1u) {
        acc = acc + seg_value4(k * d + c);
    }
    out[q] = acc;
}
