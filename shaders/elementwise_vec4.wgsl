// A fused element-wise kernel over whole vectors: the output holds a multiple of 4
// elements and every input is read at the output's own index or is a row of whole
// vectors repeated over leading axes (or, `render_gathered_quads`, a table row
// gathered along an outer axis, read a quad at a time), so each invocation loads its
// inputs as vectors, evaluates the expression once per lane and stores one vector. A
// vector is a quad (vec4, or packed f16 pairs), or with wide loads eight 32-bit values
// in a vec4<u64>; an invocation may also load two quads of each input and store one
// vec4<u64>.
// `store_quad` is generated (src/kernels/elementwise.rs). Each workgroup covers EPT * WG
// consecutive vectors, EPT per invocation, strided by WG.

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let base = (wid.x + wid.y * nwg.x) * WG * EPT + lid.x;
    for (var u = 0u; u < EPT; u = u + 1u) {
        store_quad(base + u * WG);
    }
}
