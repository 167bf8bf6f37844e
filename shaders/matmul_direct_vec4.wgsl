// The direct (CPU-adapter) matmul with vec4 loads (`ld4_a`/`ld4_b`: 4 values of f32 or
// f16), for rows 4-aligned; K % 4 == 0. A workgroup owns TM <= 8 whole rows of C
// (uniform A loads), each of its LANES lanes 4 consecutive columns. A [K, M] (TRANS_A)
// loads 4 rows at one k as a vec4 (M % 4 == 0); B [N, K] (TRANS_B) one column's 4 k.
// Accumulators and row starts are named and the row code unrolled under `if (TM > i)`:
// lavapipe and SwiftShader keep a loop-indexed private array in memory (SwiftShader
// 1024^3: 0.71 -> 2.25 GFLOP/s).

// acc += a.x B[k] + a.y B[k+1] + a.z B[k+2] + a.w B[k+3].
fn step4(acc: vec4<f32>, a: vec4<f32>, b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32>) -> vec4<f32> {
    var s = fma(vec4<f32>(a.x), b0, acc);
    s = fma(vec4<f32>(a.y), b1, s);
    s = fma(vec4<f32>(a.z), b2, s);
    return fma(vec4<f32>(a.w), b3, s);
}

// Where row i's A loads start (vec4s, clamped): its row, or (TRANS_A) its quad.
fn row_start(off_a: u32, i: u32, K4: u32, M4: u32) -> u32 {
    if (TRANS_A) {
        return off_a + min(row0 / 4u + i / 4u, M4 - 1u);
    }
    return off_a + min(row0 + i, M - 1u) * K4;
}

@compute @workgroup_size(LANES, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    M = m(0u);
    N = m(1u);
    let K = m(2u);
    let nb = m(3u);
    let offs = batch_offsets(wid.z, nb);
    // Batch offsets and row strides are multiples of 4 (checked by the renderer).
    let off_a = offs.x / 4u;
    let off_b = offs.y / 4u;
    row0 = wid.y * BM;
    c0 = wid.x * BN + lid.x * 4u;
    off_c = wid.z * M * N;
    if (M == 0u || N == 0u) {
        return;
    }
    let K4 = K / 4u;
    let M4 = M / 4u;
    let N4 = N / 4u;

    // Where B's loads start: 4 columns (B stored [N, K]) or one group of 4.
    let cb0 = select(off_b + min(c0 / 4u, N4 - 1u), off_b + min(c0, N - 1u) * K4, TRANS_B);
    let cb1 = off_b + min(c0 + 1u, N - 1u) * K4;
    let cb2 = off_b + min(c0 + 2u, N - 1u) * K4;
    let cb3 = off_b + min(c0 + 3u, N - 1u) * K4;
    let ra0 = row_start(off_a, 0u, K4, M4);
    let ra1 = row_start(off_a, 1u, K4, M4);
    let ra2 = row_start(off_a, 2u, K4, M4);
    let ra3 = row_start(off_a, 3u, K4, M4);
    let ra4 = row_start(off_a, 4u, K4, M4);
    let ra5 = row_start(off_a, 5u, K4, M4);
    let ra6 = row_start(off_a, 6u, K4, M4);
    let ra7 = row_start(off_a, 7u, K4, M4);

    let z = vec4<f32>(0.0);
    var acc0 = z; var acc1 = z; var acc2 = z; var acc3 = z; var acc4 = z; var acc5 = z; var acc6 = z; var acc7 = z;
    for (var k4 = 0u; k4 < K4; k4 = k4 + 1u) {
        // bkk = B[4 k4 + kk, c0 .. c0 + 3]
        var b0: vec4<f32>;
        var b1: vec4<f32>;
        var b2: vec4<f32>;
        var b3: vec4<f32>;
        if (TRANS_B) {
            let t0 = ld4_b(cb0 + k4);
            let t1 = ld4_b(cb1 + k4);
            let t2 = ld4_b(cb2 + k4);
            let t3 = ld4_b(cb3 + k4);
            b0 = vec4<f32>(t0.x, t1.x, t2.x, t3.x);
            b1 = vec4<f32>(t0.y, t1.y, t2.y, t3.y);
            b2 = vec4<f32>(t0.z, t1.z, t2.z, t3.z);
            b3 = vec4<f32>(t0.w, t1.w, t2.w, t3.w);
        } else {
            let kb = cb0 + 4u * k4 * N4;
            b0 = ld4_b(kb);
            b1 = ld4_b(kb + N4);
            b2 = ld4_b(kb + 2u * N4);
            b3 = ld4_b(kb + 3u * N4);
        }
        if (TRANS_A) {
            // Quad q: rows 4q .. 4q + 3, one vec4 per k.
            {
                let base = ra0 + 4u * k4 * M4;
                let x0 = ld4_a(base); let x1 = ld4_a(base + M4); let x2 = ld4_a(base + 2u * M4); let x3 = ld4_a(base + 3u * M4);
                acc0 = step4(acc0, vec4<f32>(x0.x, x1.x, x2.x, x3.x), b0, b1, b2, b3);
                acc1 = step4(acc1, vec4<f32>(x0.y, x1.y, x2.y, x3.y), b0, b1, b2, b3);
                acc2 = step4(acc2, vec4<f32>(x0.z, x1.z, x2.z, x3.z), b0, b1, b2, b3);
                acc3 = step4(acc3, vec4<f32>(x0.w, x1.w, x2.w, x3.w), b0, b1, b2, b3);
            }
            if (TM > 4u) {
                let base = ra4 + 4u * k4 * M4;
                let x0 = ld4_a(base); let x1 = ld4_a(base + M4); let x2 = ld4_a(base + 2u * M4); let x3 = ld4_a(base + 3u * M4);
                acc4 = step4(acc4, vec4<f32>(x0.x, x1.x, x2.x, x3.x), b0, b1, b2, b3);
                acc5 = step4(acc5, vec4<f32>(x0.y, x1.y, x2.y, x3.y), b0, b1, b2, b3);
                acc6 = step4(acc6, vec4<f32>(x0.z, x1.z, x2.z, x3.z), b0, b1, b2, b3);
                acc7 = step4(acc7, vec4<f32>(x0.w, x1.w, x2.w, x3.w), b0, b1, b2, b3);
            }
        } else {
            acc0 = step4(acc0, ld4_a(ra0 + k4), b0, b1, b2, b3);
            if (TM > 1u) { acc1 = step4(acc1, ld4_a(ra1 + k4), b0, b1, b2, b3); }
            if (TM > 2u) { acc2 = step4(acc2, ld4_a(ra2 + k4), b0, b1, b2, b3); }
            if (TM > 3u) { acc3 = step4(acc3, ld4_a(ra3 + k4), b0, b1, b2, b3); }
            if (TM > 4u) { acc4 = step4(acc4, ld4_a(ra4 + k4), b0, b1, b2, b3); }
            if (TM > 5u) { acc5 = step4(acc5, ld4_a(ra5 + k4), b0, b1, b2, b3); }
            if (TM > 6u) { acc6 = step4(acc6, ld4_a(ra6 + k4), b0, b1, b2, b3); }
            if (TM > 7u) { acc7 = step4(acc7, ld4_a(ra7 + k4), b0, b1, b2, b3); }
        }
    }

    store_row(0u, acc0);
    if (TM > 1u) { store_row(1u, acc1); }
    if (TM > 2u) { store_row(2u, acc2); }
    if (TM > 3u) { store_row(3u, acc3); }
    if (TM > 4u) { store_row(4u, acc4); }
    if (TM > 5u) { store_row(5u, acc5); }
    if (TM > 6u) { store_row(6u, acc6); }
    if (TM > 7u) { store_row(7u, acc7); }
    flush_rows();
}
