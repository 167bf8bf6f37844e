// `norm_rows.wgsl` for rows whose length is a multiple of 4, read and written a quad
// (vec4) at a time: lavapipe pays for a storage access per lane, almost as much for a
// scalar as for a vec4, so quads cost about a quarter as much per value. The same
// passes; sums add a quad at a time. meta: [0] D, [1] rows, [2] eps (f32 bits). The
// header defines RW, RMS, HAS_W, HAS_B and the quad loads `ld0q`, `ldwq` and `ldbq`;
// `out` holds vec4s.

@compute @workgroup_size(RW, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let D = m(0u);
    let D4 = D / 4u;
    let row = gid.x + gid.y * nwg.x * RW;
    if (row >= m(1u)) {
        return;
    }
    let eps = bitcast<f32>(m(2u));
    let base = row * D4;
    var mean = 0.0;
    if (!RMS) {
        var s = 0.0;
        for (var j = 0u; j < D4; j = j + 1u) {
            let x = ld0q(base + j);
            s = s + ((x.x + x.y) + (x.z + x.w));
        }
        mean = s / f32(D);
    }
    let m4 = vec4<f32>(mean);
    var q = 0.0;
    for (var j = 0u; j < D4; j = j + 1u) {
        let c = ld0q(base + j) - m4;
        q = q + dot(c, c);
    }
    let rstd = inverseSqrt(q / f32(D) + eps);
    for (var j = 0u; j < D4; j = j + 1u) {
        var y = (ld0q(base + j) - m4) * rstd;
        if (HAS_W) {
            y = y * ldwq(j);
        }
        if (HAS_B) {
            y = y + ldbq(j);
        }
        out[base + j] = y;
    }
}
