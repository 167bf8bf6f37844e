// Top-k along the last axis (`Op::TopK`): one invocation per row keeps the K largest
// values seen so far in a sorted private list (insertion), then writes their indices.
// Largest first, ties to the lower index, NaN the largest. meta: [0] rows, [1] n (row
// length). The header defines K and `topk_input(i)` (element i of the fused input).

var<private> vals: array<f32, K>;
var<private> idxs: array<i32, K>;

// Whether value a at index ia ranks before value b at index ib.
fn ranks_before(a: f32, ia: i32, b: f32, ib: i32) -> bool {
    let a_nan = a != a;
    let b_nan = b != b;
    if (a_nan != b_nan) {
        return a_nan;
    }
    if (a_nan || a == b) {
        return ia < ib;
    }
    return a > b;
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = gid.x + gid.y * nwg.x * 64u;
    if (row >= m(0u)) {
        return;
    }
    let n = m(1u);
    var filled = 0u;
    for (var j = 0u; j < n; j = j + 1u) {
        let v = topk_input(row * n + j);
        let ij = i32(j);
        if (filled == K && !ranks_before(v, ij, vals[K - 1u], idxs[K - 1u])) {
            continue;
        }
        // Insert: shift the entries that rank after v down by one.
        var p = min(filled, K - 1u);
        loop {
            if (p == 0u || ranks_before(vals[p - 1u], idxs[p - 1u], v, ij)) {
                break;
            }
            vals[p] = vals[p - 1u];
            idxs[p] = idxs[p - 1u];
            p = p - 1u;
        }
        vals[p] = v;
        idxs[p] = ij;
        filled = min(filled + 1u, K);
    }
    for (var t = 0u; t < K; t = t + 1u) {
        out[row * K + t] = idxs[t];
    }
}
