// A fused element-wise kernel: every chain of element-wise and movement ops between two
// materialised tensors becomes one of these. `store_out` and `eval_out` are generated
// from the op table (src/kernels/codegen.rs); this file is the entry point.
// Each workgroup covers EPT * WG consecutive outputs, EPT per invocation (strided by WG,
// so neighbouring invocations touch neighbouring words): fewer workgroups to launch.

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Dispatches wider than 65,535 workgroups are folded into y. meta[1] is the first
    // thread of this dispatch (non-zero when a large tensor runs in several windows).
    let base = m(1u) + (wid.x + wid.y * nwg.x) * WG * EPT + lid.x;
    for (var u = 0u; u < EPT; u = u + 1u) {
        store_out(base + u * WG);
    }
}
