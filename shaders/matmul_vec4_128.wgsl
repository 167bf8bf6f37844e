// The workgroup-tiled vec4 matmul for large products on discrete GPUs (the autotuner's
// "tiled-vec4 8x8"): a workgroup computes a 128 x 128 tile of C, each of its 16 x 16
// invocations an 8 x 8 block held in 16 vec4 registers. Invocation (y, x) owns rows
// 4y .. 4y+3 and 64+4y .. 64+4y+3, columns 4x .. 4x+3 and 64+4x .. 64+4x+3, so that per
// k the 16 x 16 invocations read consecutive vec4s of workgroup memory (4 vec4 reads
// for 64 fused multiply-adds). K advances BK (8 or 16, from the renderer) at a time; the
// next step's operands are loaded into registers while the current step computes, and
// with DOUBLE (from the renderer) stored into the other half of doubled tiles, so that
// one barrier per step suffices.
// Loads, layouts and preconditions as `matmul_vec4.wgsl` (`ld4_a`, `ld4_b`, TRANS_A,
// TRANS_B, 4-aligned rows); the renderer declares BK.

var<workgroup> tile_a: array<vec4<f32>, STAGES * 32u * BK>; // [stage][k][row group of 4]
var<workgroup> tile_b: array<vec4<f32>, STAGES * 32u * BK>; // [stage][k][column group of 4]

// Operand quads for k-step k0: part p (0 .. BK/8) of this invocation's share.
fn load_a_quad(off: u32, row0: u32, k0: u32, tid: u32, p: u32, M: u32, K: u32) -> vec4<f32> {
    let i = tid + 256u * p;
    if (TRANS_A) {
        let gk = k0 + i / 32u;
        let gr = row0 + 4u * (i % 32u);
        if (gk < K && gr < M) {
            return ld4_a(off + (gk * M + gr) / 4u);
        }
    } else {
        let gr = row0 + i / (BK / 4u);
        let gk = k0 + 4u * (i % (BK / 4u));
        if (gr < M && gk < K) {
            return ld4_a(off + (gr * K + gk) / 4u);
        }
    }
    return vec4<f32>(0.0);
}

fn load_b_quad(off: u32, col0: u32, k0: u32, tid: u32, p: u32, N: u32, K: u32) -> vec4<f32> {
    let i = tid + 256u * p;
    if (TRANS_B) {
        let gc = col0 + i / (BK / 4u);
        let gk = k0 + 4u * (i % (BK / 4u));
        if (gc < N && gk < K) {
            return ld4_b(off + (gc * K + gk) / 4u);
        }
    } else {
        let gk = k0 + i / 32u;
        let gc = col0 + 4u * (i % 32u);
        if (gk < K && gc < N) {
            return ld4_b(off + (gk * N + gc) / 4u);
        }
    }
    return vec4<f32>(0.0);
}

// Store part p of the operand quads into the k-major tiles at `base` (scattered when
// the quad runs along k).
fn stage(base: u32, tid: u32, p: u32, va: vec4<f32>, vb: vec4<f32>) {
    let i = tid + 256u * p;
    if (TRANS_A) {
        tile_a[base + i] = va;
    } else {
        let r = i / (BK / 4u);
        let k = 4u * (i % (BK / 4u));
        for (var t = 0u; t < 4u; t = t + 1u) {
            tile_a[base + (k + t) * 32u + r / 4u][r % 4u] = va[t];
        }
    }
    if (TRANS_B) {
        let c = i / (BK / 4u);
        let k = 4u * (i % (BK / 4u));
        for (var t = 0u; t < 4u; t = t + 1u) {
            tile_b[base + (k + t) * 32u + c / 4u][c % 4u] = vb[t];
        }
    } else {
        tile_b[base + i] = vb;
    }
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let M = m(0u);
    let N = m(1u);
    let K = m(2u);
    let nb = m(3u);
    let offs = batch_offsets(wid.z, nb);
    let off_a = offs.x / 4u;
    let off_b = offs.y / 4u;
    let row0 = wid.y * 128u;
    let col0 = wid.x * 128u;
    let tid = lid.y * 16u + lid.x;

    // acc[8h + 4v + i]: row (64v + 4y + i), columns 64h + 4x .. +3.
    var acc: array<vec4<f32>, 16>;
    var va: array<vec4<f32>, 2>;
    var vb: array<vec4<f32>, 2>;
    for (var p = 0u; p < BK / 8u; p = p + 1u) {
        va[p] = load_a_quad(off_a, row0, 0u, tid, p, M, K);
        vb[p] = load_b_quad(off_b, col0, 0u, tid, p, N, K);
    }
    if (DOUBLE) {
        for (var p = 0u; p < BK / 8u; p = p + 1u) {
            stage(0u, tid, p, va[p], vb[p]);
        }
        workgroupBarrier();
    }
    for (var k0 = 0u; k0 < K; k0 = k0 + BK) {
        let cur = select(0u, ((k0 / BK) & 1u) * 32u * BK, DOUBLE);
        if (!DOUBLE) {
            for (var p = 0u; p < BK / 8u; p = p + 1u) {
                stage(0u, tid, p, va[p], vb[p]);
            }
            workgroupBarrier();
        }
        // Prefetch the next step (beyond K the loads are guarded to zero).
        for (var p = 0u; p < BK / 8u; p = p + 1u) {
            va[p] = load_a_quad(off_a, row0, k0 + BK, tid, p, M, K);
            vb[p] = load_b_quad(off_b, col0, k0 + BK, tid, p, N, K);
        }
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            let a0 = tile_a[cur + kk * 32u + lid.y];
            let a1 = tile_a[cur + kk * 32u + 16u + lid.y];
            let b0 = tile_b[cur + kk * 32u + lid.x];
            let b1 = tile_b[cur + kk * 32u + 16u + lid.x];
            acc[0] = fma(vec4<f32>(a0.x), b0, acc[0]);
            acc[1] = fma(vec4<f32>(a0.y), b0, acc[1]);
            acc[2] = fma(vec4<f32>(a0.z), b0, acc[2]);
            acc[3] = fma(vec4<f32>(a0.w), b0, acc[3]);
            acc[4] = fma(vec4<f32>(a1.x), b0, acc[4]);
            acc[5] = fma(vec4<f32>(a1.y), b0, acc[5]);
            acc[6] = fma(vec4<f32>(a1.z), b0, acc[6]);
            acc[7] = fma(vec4<f32>(a1.w), b0, acc[7]);
            acc[8] = fma(vec4<f32>(a0.x), b1, acc[8]);
            acc[9] = fma(vec4<f32>(a0.y), b1, acc[9]);
            acc[10] = fma(vec4<f32>(a0.z), b1, acc[10]);
            acc[11] = fma(vec4<f32>(a0.w), b1, acc[11]);
            acc[12] = fma(vec4<f32>(a1.x), b1, acc[12]);
            acc[13] = fma(vec4<f32>(a1.y), b1, acc[13]);
            acc[14] = fma(vec4<f32>(a1.z), b1, acc[14]);
            acc[15] = fma(vec4<f32>(a1.w), b1, acc[15]);
        }
        // The other half was last read before the previous step's barrier.
        if (DOUBLE) {
            for (var p = 0u; p < BK / 8u; p = p + 1u) {
                stage(32u * BK - cur, tid, p, va[p], vb[p]);
            }
        }
        workgroupBarrier();
    }

    // Constant indices only, so the accumulators stay in registers.
    let off_c = wid.z * M * N;
    let r0 = row0 + 4u * lid.y;
    let c0 = col0 + 4u * lid.x;
    store_quad(off_c, r0, c0, M, N, acc[0]);
    store_quad(off_c, r0 + 1u, c0, M, N, acc[1]);
    store_quad(off_c, r0 + 2u, c0, M, N, acc[2]);
    store_quad(off_c, r0 + 3u, c0, M, N, acc[3]);
    store_quad(off_c, r0 + 64u, c0, M, N, acc[4]);
    store_quad(off_c, r0 + 65u, c0, M, N, acc[5]);
    store_quad(off_c, r0 + 66u, c0, M, N, acc[6]);
    store_quad(off_c, r0 + 67u, c0, M, N, acc[7]);
    store_quad(off_c, r0, c0 + 64u, M, N, acc[8]);
    store_quad(off_c, r0 + 1u, c0 + 64u, M, N, acc[9]);
    store_quad(off_c, r0 + 2u, c0 + 64u, M, N, acc[10]);
    store_quad(off_c, r0 + 3u, c0 + 64u, M, N, acc[11]);
    store_quad(off_c, r0 + 64u, c0 + 64u, M, N, acc[12]);
    store_quad(off_c, r0 + 65u, c0 + 64u, M, N, acc[13]);
    store_quad(off_c, r0 + 66u, c0 + 64u, M, N, acc[14]);
    store_quad(off_c, r0 + 67u, c0 + 64u, M, N, acc[15]);
}

// C[r, c .. c+3] (those inside the product).
fn store_quad(off_c: u32, r: u32, c: u32, M: u32, N: u32, q: vec4<f32>) {
    if (r < M) {
        for (var j = 0u; j < 4u; j = j + 1u) {
            if (c + j < N) {
                store_c(off_c + r * N + c + j, q[j]);
            }
        }
    }
}
