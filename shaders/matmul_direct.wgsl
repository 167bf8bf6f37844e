// Batched matmul without workgroup memory, for CPU adapters (lavapipe, llvmpipe,
// SwiftShader). There a workgroup runs as SIMD lanes on one core, a barrier switches
// every invocation, and each lane's load is a gather, unless its address is the same on
// every lane: then it is one scalar load. So a workgroup owns TM whole rows of C (their
// A addresses depend only on the workgroup and k: uniform, one load per row and k) and
// its 64 lanes spread over the columns, each accumulating TM x TN outputs (columns
// lid.x + 64j, so neighbouring lanes read neighbouring B words). Per k a lane then does
// TN gathers for TM * TN fused multiply-adds. GPUs use `matmul.wgsl`. Same bindings and
// meta as `matmul.wgsl`; TM (1 to 8) and TN (1 to 4) come from the header.

const BM: u32 = TM;
const BN: u32 = LANES * TN;

@compute @workgroup_size(LANES, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let M = m(0u);
    let N = m(1u);
    let K = m(2u);
    let nb = m(3u);

    let offs = batch_offsets(wid.z, nb);
    let off_a = offs.x;
    let off_b = offs.y;

    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    if (M == 0u || N == 0u) {
        return;
    }
    // Clamped indices keep every load in range; out-of-range results are not stored.
    var ra: array<u32, TM>;
    var cb: array<u32, TN>;
    for (var i = 0u; i < TM; i = i + 1u) {
        let r = min(row0 + i, M - 1u);
        ra[i] = select(off_a + r * K, off_a + r, TRANS_A);
    }
    for (var j = 0u; j < TN; j = j + 1u) {
        let c = min(col0 + j * LANES + lid.x, N - 1u);
        cb[j] = select(off_b + c, off_b + c * K, TRANS_B);
    }
    let sa = select(1u, M, TRANS_A);
    let sb = select(N, 1u, TRANS_B);

    var acc: array<f32, TM * TN>;
    for (var i = 0u; i < TM * TN; i = i + 1u) {
        acc[i] = 0.0;
    }
    // K in steps of 2 (independent gathers in flight), then the remainder.
    let k2 = K - K % 2u;
    for (var k = 0u; k < k2; k = k + 2u) {
        var b0: array<f32, TN>;
        var b1: array<f32, TN>;
        for (var j = 0u; j < TN; j = j + 1u) {
            let p = cb[j] + k * sb;
            b0[j] = ld_b(p);
            b1[j] = ld_b(p + sb);
        }
        for (var i = 0u; i < TM; i = i + 1u) {
            let p = ra[i] + k * sa;
            let a0 = ld_a(p);
            let a1 = ld_a(p + sa);
            for (var j = 0u; j < TN; j = j + 1u) {
                acc[i * TN + j] = fma(a1, b1[j], fma(a0, b0[j], acc[i * TN + j]));
            }
        }
    }
    if (k2 < K) {
        for (var j = 0u; j < TN; j = j + 1u) {
            let bv = ld_b(cb[j] + k2 * sb);
            for (var i = 0u; i < TM; i = i + 1u) {
                acc[i * TN + j] = fma(ld_a(ra[i] + k2 * sa), bv, acc[i * TN + j]);
            }
        }
    }

    let off_c = wid.z * M * N;
    for (var i = 0u; i < TM; i = i + 1u) {
        for (var j = 0u; j < TN; j = j + 1u) {
            let r = row0 + i;
            let c = col0 + j * LANES + lid.x;
            if (r < M && c < N) {
                // OUT_T: this is C^T of the product asked for (see matmul.rs).
                store_c(off_c + select(r * N + c, c * M + r, OUT_T), acc[i * TN + j]);
            }
        }
    }
}
