// Layer and RMS normalisation over the last axis with one invocation per row and no
// workgroup memory or barriers: the variant for CPU adapters (lavapipe), where a barrier
// costs more than the row it synchronises, and SIMD lanes run neighbouring rows side by
// side. Passes over the row: its mean (layer norm only), the centred sum of squares,
// the outputs. meta as `norm.wgsl`: [0] D, [1] rows, [2] eps (f32 bits). The header
// defines RW (rows per workgroup), RMS, HAS_W, HAS_B, `ld0`, `ldw` and `ldb`.

@compute @workgroup_size(RW, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let D = m(0u);
    let row = gid.x + gid.y * nwg.x * RW;
    if (row >= m(1u)) {
        return;
    }
    let eps = bitcast<f32>(m(2u));
    let base = row * D;
    var mean = 0.0;
    if (!RMS) {
        var s = 0.0;
        for (var j = 0u; j < D; j = j + 1u) {
            s = s + ld0(base + j);
        }
        mean = s / f32(D);
    }
    var q = 0.0;
    for (var j = 0u; j < D; j = j + 1u) {
        let c = ld0(base + j) - mean;
        q = q + c * c;
    }
    let rstd = inverseSqrt(q / f32(D) + eps);
    for (var j = 0u; j < D; j = j + 1u) {
        var y = (ld0(base + j) - mean) * rstd;
        if (HAS_W) {
            y = y * ldw(j);
        }
        if (HAS_B) {
            y = y + ldb(j);
        }
        out[base + j] = y;
    }
}
