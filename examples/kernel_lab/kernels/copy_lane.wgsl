// The same copy as copy_uniform.wgsl, each lane loading its own vec4.
// Run: --m 1 --n 262144 --k 4 --a-len 16 --groups 8192,1,1
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;
@compute @workgroup_size(8)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (lid.x == 9999u) { out[0] = in_a[0] + f32(params[0].x); }
    let g = (wid.x + wid.y * nwg.x) * 8u;
    out[g + lid.x] = in_b[g + lid.x];
}
