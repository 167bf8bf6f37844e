// A reduction: one workgroup of RWG invocations per output element, a strided serial pass per invocation,
// then a tree in workgroup memory. The input expression is fused in (`reduce_input`).
// meta: [0] output count, [1] reduction length, [2] first output of this dispatch,
// [3] output binding base (the last two non-zero when a large input runs in windows).

var<workgroup> partial: array<Acc, RWG>;

@compute @workgroup_size(RWG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = m(2u) + wid.x + wid.y * nwg.x;
    let t = lid.x;
    let n_out = m(0u);
    let len = m(1u);
    var acc = acc_identity();
    if (o < n_out) {
        for (var r = t; r < len; r += RWG) {
            skip_out = false;
        let x = reduce_input(o, r);
        // A load outside this dispatch's window of a split input contributes nothing.
        if (!WINDOWED || !skip_out) {
            acc = combine(acc, Acc(x, r));
        }
        }
    }
    partial[t] = acc;
    workgroupBarrier();
    for (var s = RWG / 2u; s > 0u; s = s >> 1u) {
        if (t < s) {
            partial[t] = combine(partial[t], partial[t + s]);
        }
        workgroupBarrier();
    }
    if (t == 0u && o < n_out) {
        store_result(o, partial[0]);
    }
}
