// The GEMV of `gemv.wgsl` for one row of X on GPUs, shaped for memory bandwidth: each
// group of 32 lanes owns R rows of W (R columns of C) and streams them together, lane t
// taking blocks t, t+32, ... so that neighbouring lanes read neighbouring blocks; each
// lane loads its 32 values of X once for all R rows. The 8 groups of a workgroup
// then add their lanes' partial sums through workgroup memory, one barrier in all.
// No arrays in registers: the R sums and the 8 vec4s of X are named values.
// `dot8(blk, x0 .. x7)` (from the header, per weight format) is one block's dot
// product with 32 values of X. Bindings and meta as `gemv.wgsl`.

var<workgroup> partial: array<f32, 1024>; // [group * R + row][lane]

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let N = m(1u);
    let K = m(2u);
    let nb = m(3u);
    let offs = batch_offsets(wid.z, nb);
    let g = lid.x / 32u;
    let t = lid.x % 32u;
    let c0 = (wid.x * 8u + g) * R;
    let KB = K / 32u;
    let last = max(N, 1u) - 1u;
    // Each row's first block (rows past N clamped to the last: computed, never stored).
    let w0 = offs.y / 32u + min(c0, last) * KB;
    let w1 = offs.y / 32u + min(c0 + 1u, last) * KB;
    let w2 = offs.y / 32u + min(c0 + 2u, last) * KB;
    let w3 = offs.y / 32u + min(c0 + 3u, last) * KB;
    let xr = offs.x / 4u;
    var s0 = 0.0;
    var s1 = 0.0;
    var s2 = 0.0;
    var s3 = 0.0;
    for (var kb = t; kb < KB; kb = kb + 32u) {
        let x = xr + kb * 8u;
        let x0 = in_a[x];
        let x1 = in_a[x + 1u];
        let x2 = in_a[x + 2u];
        let x3 = in_a[x + 3u];
        let x4 = in_a[x + 4u];
        let x5 = in_a[x + 5u];
        let x6 = in_a[x + 6u];
        let x7 = in_a[x + 7u];
        s0 = s0 + dot8(w0 + kb, x0, x1, x2, x3, x4, x5, x6, x7);
        if (R > 1u) {
            s1 = s1 + dot8(w1 + kb, x0, x1, x2, x3, x4, x5, x6, x7);
        }
        if (R > 2u) {
            s2 = s2 + dot8(w2 + kb, x0, x1, x2, x3, x4, x5, x6, x7);
            s3 = s3 + dot8(w3 + kb, x0, x1, x2, x3, x4, x5, x6, x7);
        }
    }
    let p = (g * R) * 32u + t;
    partial[p] = s0;
    if (R > 1u) {
        partial[p + 32u] = s1;
    }
    if (R > 2u) {
        partial[p + 64u] = s2;
        partial[p + 96u] = s3;
    }
    workgroupBarrier();
    // One invocation per column of C: its 32 lanes' sums.
    if (lid.x < 8u * R) {
        var s = 0.0;
        for (var i = 0u; i < 32u; i = i + 1u) {
            s = s + partial[lid.x * 32u + i];
        }
        let c = wid.x * 8u * R + lid.x;
        if (c < N) {
            store_c(wid.z * N + c, s);
        }
    }
}
