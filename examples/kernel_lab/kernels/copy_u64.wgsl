// Copy 4M f32 as one 64-bit word per access (`u64`, needs SHADER_INT64), to set against
// copy_u64x4.wgsl, copy_u64x2.wgsl, copy_u64.wgsl and copy.wgsl (quads): what a storage
// access costs per component of lavapipe's loop over the SIMD lanes.
// Run: --a-len 4194304 --out-len 4194304 --b-len 64 --groups 512,1,1 --iters 20
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<u64>;
@group(0) @binding(2) var<storage, read> in_a: array<u64>;
@group(0) @binding(3) var<storage, read> in_b: array<u64>;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    if (lid.x == 9999u + params[0].x) { out[0] = in_b[0]; }
    let base = wid.x * 256u * 4u * 4u + lid.x;
    for (var u = 0u; u < 4u * 4u; u = u + 1u) {
        let q = base + u * 256u;
        if (q >= arrayLength(&out)) { return; }
        out[q] = in_a[q];
    }
}
