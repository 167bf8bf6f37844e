// `softmax_rows.wgsl` for contiguous rows whose length is a multiple of 4, read and
// written a quad (vec4) at a time: lavapipe pays for a storage access per lane, almost
// as much for a scalar as for a vec4, so quads cost about a quarter as much per value.
// The same three passes and the same NaN rules; sums add a quad at a time.
// meta: [0] A, [1] I (1), [2] rows. The header defines RW, LOG and `ld0q(q)`, values
// 4q .. 4q + 3 of the input; `out` holds vec4s.

@compute @workgroup_size(RW, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let A4 = m(0u) / 4u;
    let row = gid.x + gid.y * nwg.x * RW;
    if (row >= m(2u)) {
        return;
    }
    let base = row * A4;
    var top = -inf_f();
    for (var j = 0u; j < A4; j = j + 1u) {
        let x = ld0q(base + j);
        top = max_f(top, max_f(max_f(x.x, x.y), max_f(x.z, x.w)));
    }
    let t4 = vec4<f32>(top);
    var total = 0.0;
    for (var j = 0u; j < A4; j = j + 1u) {
        let e = exp(ld0q(base + j) - t4);
        total = total + ((e.x + e.y) + (e.z + e.w));
    }
    let inv = 1.0 / total;
    let log_total = log(total);
    for (var j = 0u; j < A4; j = j + 1u) {
        let z = ld0q(base + j) - t4;
        out[base + j] = select(exp(z) * inv, z - vec4<f32>(log_total), LOG);
    }
}
