// sum_tex.wgsl with its texture declared a read-only storage texture
// (`texture_storage_2d<rgba32float, read>`, `textureLoad` without a level). Lavapipe
// (Mesa 22.3) loads it inline, where a sampled texture's load calls a texel-fetch
// function that handles every lane's mip level: 12.8 M against 28.2 M JIT instructions.
// Run: --a-len 4194304 --out-len 16384 --b-len 64 --groups 16,1,1 --iters 20 --tex-a 1024
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var in_a: texture_storage_2d<rgba32float, read>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    if (lid.x == 9999u + params[0].x) { out[0] = in_b[0]; }
    let i = wid.x * 256u + lid.x;
    var acc = vec4<f32>(0.0);
    for (var j = 0u; j < 256u; j = j + 1u) {
        let q = i + j * 4096u;
        acc = acc + textureLoad(in_a, vec2<u32>(q % 1024u, q / 1024u));
    }
    out[i] = acc;
}
