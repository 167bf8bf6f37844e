// A fused element-wise kernel: every chain of element-wise and movement ops between two
// materialised tensors becomes one of these. `store_out` and `eval_out` are generated
// from the op table (src/kernels/codegen.rs); this file is the entry point.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Dispatches wider than 65,535 workgroups are folded into y.
    store_out(gid.x + gid.y * nwg.x * WG);
}
