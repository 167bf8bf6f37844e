// A short reduction: one invocation per output element, a serial loop over the reduced
// elements. meta: [0] output count, [1] reduction length. Blocks of 32 are combined
// first and their results then, so a long f32 sum is about as accurate as a workgroup's
// tree (CPU adapters take this kernel for reductions of thousands).

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = m(2u) + gid.x + gid.y * nwg.x * WG;
    if (o >= m(0u)) {
        return;
    }
    let len = m(1u);
    var acc = acc_identity();
    for (var r0 = 0u; r0 < len; r0 += 32u) {
        var block = acc_identity();
        for (var r = r0; r < min(r0 + 32u, len); r += 1u) {
            skip_out = false;
            let x = reduce_input(o, r);
            // A load outside this dispatch's window of a split input contributes nothing.
            if (!WINDOWED || !skip_out) {
                block = combine(block, Acc(x, r));
            }
        }
        acc = combine(acc, block);
    }
    store_result(o, acc);
}
