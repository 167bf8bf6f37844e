// The direct (CPU-adapter) matmul of `matmul_direct.wgsl` with vec4 loads, for f32 or
// f16 operands whose rows are 4-aligned (`ld4_a(i)`/`ld4_b(i)` from the header load the
// i-th group of 4 values: one vec4<f32>, or two u32 words of f16 pairs). On lavapipe every storage load that is not
// provably uniform runs as a loop over the SIMD lanes; a vec4 load takes one trip of
// that loop for four values, so this kernel issues a quarter of the loads.
// A workgroup owns TM whole rows of C (uniform A loads); each of its LANES lanes owns 4
// consecutive columns. K advances 4 at a time (K % 4 == 0).
// Groups of 4 along:
//   A row-major [M, K]: a row's 4 k-values are one vec4 (TRANS_A false);
//   A stored [K, M] (TRANS_A): 4 consecutive rows at one k are one vec4 (M % 4 == 0);
//   B row-major [K, N]: a lane's 4 columns at one k are one vec4 (N % 4 == 0);
//   B stored [N, K] (TRANS_B): one column's 4 k-values are one vec4.

const BM: u32 = TM;
const BN: u32 = LANES * 4u;

@compute @workgroup_size(LANES, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let M = m(0u);
    let N = m(1u);
    let K = m(2u);
    let nb = m(3u);
    let offs = batch_offsets(wid.z, nb);
    // Batch offsets and row strides are multiples of 4 (checked by the renderer).
    let off_a = offs.x / 4u;
    let off_b = offs.y / 4u;
    let row0 = wid.y * BM;
    let c0 = wid.x * BN + lid.x * 4u;
    if (M == 0u || N == 0u) {
        return;
    }
    let K4 = K / 4u;
    let M4 = M / 4u;
    let N4 = N / 4u;

    // Where each operand's loads start (in vec4 units); clamped, so always in range.
    var ra: array<u32, TM>;
    for (var i = 0u; i < TM; i = i + 1u) {
        if (TRANS_A) {
            // Row group i/4 of the tile: rows row0 + 4q .. + 3 (row0 is a multiple of 4).
            ra[i] = off_a + min(row0 / 4u + i / 4u, M4 - 1u);
        } else {
            ra[i] = off_a + min(row0 + i, M - 1u) * K4;
        }
    }
    var cb: array<u32, 4>;
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (TRANS_B) {
            cb[j] = off_b + min(c0 + j, N - 1u) * K4;
        } else {
            cb[j] = off_b + min(c0 / 4u, N4 - 1u);
        }
    }

    var acc: array<vec4<f32>, TM>;
    for (var i = 0u; i < TM; i = i + 1u) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var k4 = 0u; k4 < K4; k4 = k4 + 1u) {
        // b[kk] = B[4 k4 + kk, c0 .. c0 + 3]
        var b: array<vec4<f32>, 4>;
        if (TRANS_B) {
            let t0 = ld4_b(cb[0] + k4);
            let t1 = ld4_b(cb[1] + k4);
            let t2 = ld4_b(cb[2] + k4);
            let t3 = ld4_b(cb[3] + k4);
            b[0] = vec4<f32>(t0.x, t1.x, t2.x, t3.x);
            b[1] = vec4<f32>(t0.y, t1.y, t2.y, t3.y);
            b[2] = vec4<f32>(t0.z, t1.z, t2.z, t3.z);
            b[3] = vec4<f32>(t0.w, t1.w, t2.w, t3.w);
        } else {
            for (var kk = 0u; kk < 4u; kk = kk + 1u) {
                b[kk] = ld4_b(cb[0] + (4u * k4 + kk) * N4);
            }
        }
        if (TRANS_A) {
            for (var kk = 0u; kk < 4u; kk = kk + 1u) {
                for (var q = 0u; q < TM / 4u; q = q + 1u) {
                    let a = ld4_a(ra[4u * q] + (4u * k4 + kk) * M4);
                    acc[4u * q] = fma(vec4<f32>(a.x), b[kk], acc[4u * q]);
                    acc[4u * q + 1u] = fma(vec4<f32>(a.y), b[kk], acc[4u * q + 1u]);
                    acc[4u * q + 2u] = fma(vec4<f32>(a.z), b[kk], acc[4u * q + 2u]);
                    acc[4u * q + 3u] = fma(vec4<f32>(a.w), b[kk], acc[4u * q + 3u]);
                }
            }
        } else {
            for (var i = 0u; i < TM; i = i + 1u) {
                let a = ld4_a(ra[i] + k4);
                acc[i] = fma(vec4<f32>(a.x), b[0], acc[i]);
                acc[i] = fma(vec4<f32>(a.y), b[1], acc[i]);
                acc[i] = fma(vec4<f32>(a.z), b[2], acc[i]);
                acc[i] = fma(vec4<f32>(a.w), b[3], acc[i]);
            }
        }
    }

    let off_c = wid.z * M * N;
    for (var i = 0u; i < TM; i = i + 1u) {
        let r = row0 + i;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let c = c0 + j;
            if (r < M && c < N) {
                store_c(off_c + select(r * N + c, c * M + r, OUT_T), acc[i][j]);
            }
        }
    }
}
