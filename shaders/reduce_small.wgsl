// A short reduction: one invocation per output element, a serial loop over the reduced
// elements. meta: [0] output count, [1] reduction length.

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = m(2u) + gid.x + gid.y * nwg.x * WG;
    if (o >= m(0u)) {
        return;
    }
    let len = m(1u);
    var acc = acc_identity();
    for (var r = 0u; r < len; r += 1u) {
        skip_out = false;
        let x = reduce_input(o, r);
        // A load outside this dispatch's window of a split input contributes nothing.
        if (!WINDOWED || !skip_out) {
            acc = combine(acc, Acc(x, r));
        }
    }
    store_result(o, acc);
}
