// Batched matmul without workgroup memory: each invocation accumulates a TM x TN block
// (rows lid.y + 16i, columns lid.x + 16j of the workgroup's BM x BN tile) straight from
// the operands. No barriers: on CPU adapters (lavapipe, llvmpipe, SwiftShader), where a
// barrier switches every invocation of the workgroup and the caches already hold the
// tiles, this beats the staged kernel; GPUs use `matmul.wgsl`. Same header, bindings and
// meta as `matmul.wgsl`.

const BM: u32 = 16u * TM;
const BN: u32 = 16u * TN;

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
    if (M == 0u || N == 0u) {
        return;
    }
    // Clamped indices keep every load in range; out-of-range results are not stored.
    var ra: array<u32, 4>;
    var cb: array<u32, 4>;
    for (var i = 0u; i < TM; i = i + 1u) {
        let r = min(row0 + i * 16u + lid.y, M - 1u);
        ra[i] = select(off_a + r * K, off_a + r, TRANS_A);
    }
    for (var j = 0u; j < TN; j = j + 1u) {
        let c = min(col0 + j * 16u + lid.x, N - 1u);
        cb[j] = select(off_b + c, off_b + c * K, TRANS_B);
    }
    let sa = select(1u, M, TRANS_A);
    let sb = select(N, 1u, TRANS_B);

    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i = i + 1u) {
        acc[i] = 0.0;
    }
    // K in steps of 4 (independent loads in flight), then the remainder.
    let k4 = K - K % 4u;
    for (var k = 0u; k < k4; k = k + 4u) {
        var a: array<vec4<f32>, 4>;
        var b: array<vec4<f32>, 4>;
        for (var i = 0u; i < TM; i = i + 1u) {
            let p = ra[i] + k * sa;
            a[i] = vec4<f32>(ld_a(p), ld_a(p + sa), ld_a(p + 2u * sa), ld_a(p + 3u * sa));
        }
        for (var j = 0u; j < TN; j = j + 1u) {
            let p = cb[j] + k * sb;
            b[j] = vec4<f32>(ld_b(p), ld_b(p + sb), ld_b(p + 2u * sb), ld_b(p + 3u * sb));
        }
        for (var i = 0u; i < TM; i = i + 1u) {
            for (var j = 0u; j < TN; j = j + 1u) {
                acc[i * TN + j] = acc[i * TN + j] + dot(a[i], b[j]);
            }
        }
    }
    for (var k = k4; k < K; k = k + 1u) {
        for (var i = 0u; i < TM; i = i + 1u) {
            let av = ld_a(ra[i] + k * sa);
            for (var j = 0u; j < TN; j = j + 1u) {
                acc[i * TN + j] = fma(av, ld_b(cb[j] + k * sb), acc[i * TN + j]);
            }
        }
    }

    let off_c = wid.z * M * N;
    for (var i = 0u; i < TM; i = i + 1u) {
        for (var j = 0u; j < TN; j = j + 1u) {
            let r = row0 + i * 16u + lid.y;
            let c = col0 + j * 16u + lid.x;
            if (r < M && c < N) {
                out[off_c + r * N + c] = acc[i * TN + j];
            }
        }
    }
}
