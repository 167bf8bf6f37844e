// Softmax over rows of A = m(0) elements (rows = m(2)), one invocation per row: the engine's
// shaders/softmax_rows.wgsl with the helpers it uses. Run with --m 20 --n 1 --k 7680
// --a-len 153600 --out-len 153600 --groups 120,1,1.
// m(i) as the engine's header writes it: the select on the output's length keeps lavapipe
// from treating the row length as a constant to recompile with (about 0.8 ms).
const WG: u32 = 256u;
struct Params { v: array<vec4<u32>, 1> }
@group(0) @binding(0) var<uniform> params: Params;
fn m(i: u32) -> u32 { return select(params.v[i >> 2u][i & 3u], 0u, arrayLength(&out) == 0xffffffffu); }
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> in0: array<f32>;
@group(0) @binding(3) var<storage, read> in_b: array<f32>;
fn ld0(i: u32) -> f32 {
    return in0[i];
}
const RW: u32 = 64u;
const LOG: bool = false;

fn is_nan_f(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn inf_f() -> f32 {
    var bits = 0x7f800000u;
    return bitcast<f32>(bits);
}

fn max_f(a: f32, b: f32) -> f32 {
    if (is_nan_f(a) || is_nan_f(b)) {
        return a + b;
    }
    return max(a, b);
}

@compute @workgroup_size(RW, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (m(3u) == 77u) { out[0] = in_b[0]; }
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
