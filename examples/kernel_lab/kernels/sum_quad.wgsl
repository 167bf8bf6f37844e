// Sum 4M f32 read as quads (`vec4<f32>`), 256 accesses per invocation: see sum_u64.wgsl.
// Run: --a-len 4194304 --out-len 16384 --b-len 64 --groups 16,1,1 --iters 20
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    if (lid.x == 9999u + params[0].x) { out[0] = in_b[0]; }
    let i = wid.x * 256u + lid.x;
    var acc = vec4<f32>(0.0);
    for (var j = 0u; j < 256u; j = j + 1u) {
        acc = acc + in_a[i + j * 4096u];
    }
    out[i] = acc;
}
