// Sum 4M f32 read as `vec4<u64>` (8 per storage access), 128 accesses per invocation, to set
// against sum_tex.wgsl (texel fetches) and sum_quad.wgsl (quads): what a read costs when
// little is written.
// Run: --a-len 4194304 --out-len 16384 --b-len 64 --groups 16,1,1 --iters 20
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<u64>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    if (lid.x == 9999u + params[0].x) { out[0] = in_b[0]; }
    let i = wid.x * 256u + lid.x;
    var acc = vec4<f32>(0.0);
    for (var j = 0u; j < 128u; j = j + 1u) {
        let w = in_a[i + j * 4096u];
        let l = vec4<u32>(w & vec4<u64>(0xfffffffflu));
        let h = vec4<u32>(w >> vec4<u32>(32u));
        acc = acc + bitcast<vec4<f32>>(vec4<u32>(l.x, h.x, l.y, h.y)) + bitcast<vec4<f32>>(vec4<u32>(l.z, h.z, l.w, h.w));
    }
    out[i] = acc;
}
