// Each workgroup (8 lanes, one subgroup) loads 8 vec4 at indices from the workgroup id
// only (uniform), outside any control flow; lane l keeps vec4 l. Against copy_lane.wgsl:
// lavapipe (Mesa 22.3) has no fast path for uniform storage loads, each one still runs
// as a loop over the lanes. Run: --m 1 --n 262144 --k 4 --a-len 16 --groups 8192,1,1
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;
@compute @workgroup_size(8)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (lid.x == 9999u) { out[0] = in_a[0] + f32(params[0].x); }
    let g = (wid.x + wid.y * nwg.x) * 8u;
    let v0 = in_b[g]; let v1 = in_b[g + 1u]; let v2 = in_b[g + 2u]; let v3 = in_b[g + 3u];
    let v4 = in_b[g + 4u]; let v5 = in_b[g + 5u]; let v6 = in_b[g + 6u]; let v7 = in_b[g + 7u];
    let l = lid.x;
    var v = v0;
    v = select(v, v1, l == 1u); v = select(v, v2, l == 2u); v = select(v, v3, l == 3u);
    v = select(v, v4, l == 4u); v = select(v, v5, l == 5u); v = select(v, v6, l == 6u); v = select(v, v7, l == 7u);
    out[g + l] = v;
}
