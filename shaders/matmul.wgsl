// Batched matmul C[b] = A[b] @ B[b] with broadcast batch axes. Each workgroup computes a
// BM x BN tile of C; each of its 16 x 16 invocations a TM x TN block in registers,
// strided by 16 (rows lid.y + 16i, columns lid.x + 16j) so neighbouring invocations read
// neighbouring workgroup-memory words and write neighbouring outputs.
// K advances in BK-wide tiles staged in workgroup memory. The header's
// `load_a(batch, offset, row, k)` and `load_b(batch, offset, k, column)` read the
// operands: from buffers (TRANS_A / TRANS_B read one stored transposed, so `x @ w.t()`
// needs no copy), or through generated index remaps (an implicit GEMM, matmul.rs).
// meta: [0] M, [1] N, [2] K, [3] batch rank nb, then per batch axis (outer first):
//       size, A stride, B stride (stride 0 where that operand broadcasts).

// TM and TN (rows and columns per invocation, 1, 2 or 4) come from the header:
// BM = 16 * TM and BN = 16 * TN, so thin outputs do not waste a 64-wide tile.
const BM: u32 = 16u * TM;
const BN: u32 = 16u * TN;
const BK: u32 = 16u;

var<workgroup> tile_a: array<f32, 1024>; // BK x BM, k-major
var<workgroup> tile_b: array<f32, 1024>; // BK x BN, k-major

@compute @workgroup_size(16, 16, 1)
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
    let tid = lid.y * 16u + lid.x;

    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i = i + 1u) {
        acc[i] = 0.0;
    }

    for (var k0 = 0u; k0 < K; k0 = k0 + BK) {
        for (var l = 0u; l < TM; l = l + 1u) {
            let e = tid + l * 256u;
            // Neighbouring invocations read neighbouring addresses: along K for a
            // row-major A, along M for a transposed one.
            let r = select(e / BK, e % BM, TRANS_A);
            let kk = select(e % BK, e / BM, TRANS_A);
            let gr = row0 + r;
            let gk = k0 + kk;
            var v = 0.0;
            if (gr < M && gk < K) {
                v = load_a(wid.z, off_a, gr, gk);
            }
            tile_a[kk * BM + r] = v;
        }
        for (var l = 0u; l < TN; l = l + 1u) {
            let e = tid + l * 256u;
            // Along N for a row-major B, along K for a transposed one.
            let kk = select(e / BN, e % BK, TRANS_B);
            let c = select(e % BN, e / BK, TRANS_B);
            let gk = k0 + kk;
            let gc = col0 + c;
            var v = 0.0;
            if (gk < K && gc < N) {
                v = load_b(wid.z, off_b, gk, gc);
            }
            tile_b[kk * BN + c] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            var a: array<f32, 4>;
            var b: array<f32, 4>;
            for (var i = 0u; i < TM; i = i + 1u) {
                a[i] = tile_a[kk * BM + i * 16u + lid.y];
            }
            for (var j = 0u; j < TN; j = j + 1u) {
                b[j] = tile_b[kk * BN + j * 16u + lid.x];
            }
            for (var i = 0u; i < TM; i = i + 1u) {
                for (var j = 0u; j < TN; j = j + 1u) {
                    acc[i * TN + j] = fma(a[i], b[j], acc[i * TN + j]);
                }
            }
        }
        workgroupBarrier();
    }

    let off_c = wid.z * M * N;
    for (var i = 0u; i < TM; i = i + 1u) {
        for (var j = 0u; j < TN; j = j + 1u) {
            let r = row0 + i * 16u + lid.y;
            let c = col0 + j * 16u + lid.x;
            if (r < M && c < N) {
                store_c(off_c + r * N + c, acc[i * TN + j]);
            }
        }
    }
}
