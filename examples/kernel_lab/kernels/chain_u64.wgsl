// The element-wise chain of chain_buf.wgsl, storage bound as vec4<u64>: each storage access
// moves 8 floats, so lavapipe's loop over the SIMD lanes runs once per 8 values, not 4.
// Run: --a-len 4194304 --out-len 4194304 --groups 512,1,1 (needs SHADER_INT64)
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<u64>>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<u64>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<u64>>;
fn is_nan_f(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn tanh_f(x: f32) -> f32 { return 1.0 - 2.0 / (exp(2.0 * x) + 1.0); }
fn relu_f(x: f32) -> f32 { return select(max(x, 0.0), x, is_nan_f(x)); }
fn ev(p0: f32) -> f32 { return relu_f(tanh_f(exp(p0 * 2.0 + 1.0)) * p0); }
fn ev2(a: u64) -> u64 {
    let lo = ev(bitcast<f32>(u32(a & 0xfffffffflu)));
    let hi = ev(bitcast<f32>(u32(a >> 32u)));
    return u64(bitcast<u32>(lo)) | (u64(bitcast<u32>(hi)) << 32u);
}
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    if (lid.x == 9999u) { out[0] = in_b[0] + u64(params[0].x); }
    let base = wid.x * 256u * 4u + lid.x;
    for (var u = 0u; u < 4u; u = u + 1u) {
        let q = base + u * 256u;
        if (q >= arrayLength(&out)) { return; }
        let a = in_a[q];
        out[q] = vec4<u64>(ev2(a.x), ev2(a.y), ev2(a.z), ev2(a.w));
    }
}
