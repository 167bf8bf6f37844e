// Softmax / log-softmax along one axis in one pass over a row per workgroup: the row's
// max (a tree in workgroup memory), the sum of exponentials (another tree), then the
// outputs. A row is `A` elements `I` apart: rows = outer * I, row r starts at
// (r / I) * A * I + r % I. NaN propagates through the max as in the reduction kernels.
// meta: [0] A, [1] I, [2] rows. The header defines RW (lanes per row), LOG and `ld0`.

var<workgroup> red: array<f32, RW>;

@compute @workgroup_size(RW, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let A = m(0u);
    let I = m(1u);
    let row = wid.x + wid.y * nwg.x;
    if (row >= m(2u)) {
        return;
    }
    let base = (row / I) * A * I + row % I;
    var mx = -inf_f();
    for (var j = lid.x; j < A; j = j + RW) {
        mx = max_f(mx, ld0(base + j * I));
    }
    red[lid.x] = mx;
    workgroupBarrier();
    for (var s = RW / 2u; s > 0u; s = s / 2u) {
        if (lid.x < s) {
            red[lid.x] = max_f(red[lid.x], red[lid.x + s]);
        }
        workgroupBarrier();
    }
    let top = red[0];
    workgroupBarrier();
    var sum = 0.0;
    for (var j = lid.x; j < A; j = j + RW) {
        sum = sum + exp(ld0(base + j * I) - top);
    }
    red[lid.x] = sum;
    workgroupBarrier();
    for (var s = RW / 2u; s > 0u; s = s / 2u) {
        if (lid.x < s) {
            red[lid.x] = red[lid.x] + red[lid.x + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    let log_total = log(total);
    for (var j = lid.x; j < A; j = j + RW) {
        let z = ld0(base + j * I) - top;
        out[base + j * I] = select(exp(z) / total, z - log_total, LOG);
    }
}
