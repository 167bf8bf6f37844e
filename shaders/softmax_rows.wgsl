// Softmax / log-softmax along one axis with one invocation per row and no workgroup
// memory or barriers: the variant for CPU adapters (lavapipe), where a barrier costs
// more than the row it synchronises, and SIMD lanes run neighbouring rows side by side.
// Three passes over the row: its max, the sum of exponentials, the outputs. A row is `A`
// elements `I` apart: row r starts at (r / I) * A * I + r % I. NaN propagates through
// the max as in the reduction kernels.
// meta: [0] A, [1] I, [2] rows. The header defines RW (rows per workgroup), LOG and `ld0`.

@compute @workgroup_size(RW, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let A = m(0u);
    let I = m(1u);
    let row = gid.x + gid.y * nwg.x * RW;
    if (row >= m(2u)) {
        return;
    }
    let base = (row / I) * A * I + row % I;
    var top = -inf_f();
    for (var j = 0u; j < A; j = j + 1u) {
        top = max_f(top, ld0(base + j * I));
    }
    var total = 0.0;
    for (var j = 0u; j < A; j = j + 1u) {
        total = total + exp(ld0(base + j * I) - top);
    }
    let inv = 1.0 / total;
    let log_total = log(total);
    for (var j = 0u; j < A; j = j + 1u) {
        let z = ld0(base + j * I) - top;
        out[base + j * I] = select(exp(z) * inv, z - log_total, LOG);
    }
}
