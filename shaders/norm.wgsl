// Layer and RMS normalisation over the last axis in one kernel, a workgroup per row:
// layer: mean (a tree), then the centred sum of squares (a tree), then
// (x - mean) / sqrt(var + eps) * w + b; RMS: the sum of squares, then x / sqrt(ms + eps) * w.
// meta: [0] D (row length), [1] rows, [2] eps (f32 bits). The header defines RW, RMS,
// HAS_W, HAS_B, `ld0` (x), `ldw` and `ldb` (weight and bias; 0 where absent).

var<workgroup> red: array<f32, RW>;

fn row_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = RW / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(RW, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let D = m(0u);
    let row = wid.x + wid.y * nwg.x;
    if (row >= m(1u)) {
        return;
    }
    let eps = bitcast<f32>(m(2u));
    let base = row * D;
    var mean = 0.0;
    if (!RMS) {
        var s = 0.0;
        for (var j = lid.x; j < D; j = j + RW) {
            s = s + ld0(base + j);
        }
        mean = row_sum(lid.x, s) / f32(D);
    }
    var q = 0.0;
    for (var j = lid.x; j < D; j = j + RW) {
        let c = ld0(base + j) - mean;
        q = q + c * c;
    }
    let rstd = inverseSqrt(row_sum(lid.x, q) / f32(D) + eps);
    for (var j = lid.x; j < D; j = j + RW) {
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
