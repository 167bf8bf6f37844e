// Segment reduction over rows (`Op::SegmentReduce`): output [S, D], one invocation per
// output element; row s reduces value rows offsets[s]..offsets[s + 1] of column d.
// meta: [0] S * D, [1] D, [2] N (value rows). The header defines `seg_value(i)`
// (element i of the fused [N, D] values), `seg_offset(j)` (offsets[j]), and MODE:
// 0 sum, 1 max, 2 argmax (the row position of the first maximum, -1 when empty).
// Offsets are clamped into 0..N and made non-decreasing, so any offsets read in range.

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= m(0u)) {
        return;
    }
    let d = m(1u);
    let n = m(2u);
    let s = i / d;
    let c = i % d;
    let start = u32(clamp(seg_offset(s), 0, i32(n)));
    let end = max(start, u32(clamp(seg_offset(s + 1u), 0, i32(n))));
    if (MODE == 0u) {
        var acc = 0.0;
        for (var k = start; k < end; k = k + 1u) {
            acc = acc + seg_value(k * d + c);
        }
        store_seg(i, acc, 0);
        return;
    }
    var best = 0.0;
    var at = -1;
    for (var k = start; k < end; k = k + 1u) {
        let v = seg_value(k * d + c);
        // The first maximum; NaN counts as the maximum and stays.
        let best_nan = best != best;
        if (at < 0 || (!best_nan && (v > best || v != v))) {
            best = v;
            at = i32(k);
        }
    }
    store_seg(i, best, at);
}
