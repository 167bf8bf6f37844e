// The chain from an rgba32float texture into a storage texture (--tex-a TW --tex-out TW).
// Run: --a-len 4194304 --out-len 4194304 --groups 1024,1,1 --tex-a 1024 --tex-out 1024 --const TW=1024
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var out: texture_storage_2d<rgba32float, write>;
@group(0) @binding(2) var in_a: texture_2d<f32>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;
fn is_nan_f(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn tanh_f(x: f32) -> f32 { return 1.0 - 2.0 / (exp(2.0 * x) + 1.0); }
fn relu_f(x: f32) -> f32 { return select(max(x, 0.0), x, is_nan_f(x)); }
fn ev(p0: f32) -> f32 { return relu_f(tanh_f(exp(p0 * 2.0 + 1.0)) * p0); }
fn ev4(a: vec4<f32>) -> vec4<f32> { return vec4<f32>(ev(a.x), ev(a.y), ev(a.z), ev(a.w)); }
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    if (lid.x == 9999u) { textureStore(out, vec2<u32>(0u), in_b[0] + f32(params[0].x)); }
    let base = wid.x * 256u * 4u + lid.x;
    for (var u = 0u; u < 4u; u = u + 1u) {
        let q = base + u * 256u;
        let c = vec2<u32>(q % TW, q / TW);
        textureStore(out, c, ev4(textureLoad(in_a, c, 0)));
    }
}
