// The workgroup-tiled matmul of `matmul.wgsl` with vectorised loads, for GPUs and f32 or
// f16 operands whose loaded rows are 4-aligned (`ld4_a(i)`/`ld4_b(i)` from the header
// load the i-th group of 4 values: one vec4<f32>, or two u32 words of f16 pairs).
// A workgroup computes a 64 x 64 tile of C; each of its 16 x 16 invocations a 4 x 4
// block of contiguous rows and columns, accumulated as four vec4s. K advances 16 at a
// time: each invocation loads one vec4 of A and one of B into workgroup memory (256
// vec4 = 64 x 16 values each), then per k reads one vec4 of 4 rows of A and one of 4
// columns of B and does 16 fused multiply-adds.
// Groups of 4 along:
//   A row-major [M, K]: a row's 4 k-values (K % 4 == 0), scattered into the k-major tile;
//   A stored [K, M] (TRANS_A): 4 consecutive rows at one k (M % 4 == 0);
//   B row-major [K, N]: 4 consecutive columns at one k (N % 4 == 0);
//   B stored [N, K] (TRANS_B): one column's 4 k-values, scattered into the tile.
// Same bindings and meta as `matmul.wgsl`.

const BK: u32 = 16u;

var<workgroup> tile_a: array<vec4<f32>, 256>; // [k][row group]: rows 4g .. 4g+3 at k
var<workgroup> tile_b: array<vec4<f32>, 256>; // [k][column group]: columns 4g .. 4g+3 at k

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let M = m(0u);
    let N = m(1u);
    let K = m(2u);
    let nb = m(3u);
    let offs = batch_offsets(wid.z, nb);
    // Batch offsets and row strides are multiples of 4 (checked by the renderer).
    let off_a = offs.x / 4u;
    let off_b = offs.y / 4u;
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let tid = lid.y * 16u + lid.x;

    var acc: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i = i + 1u) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var k0 = 0u; k0 < K; k0 = k0 + BK) {
        if (TRANS_A) {
            // Rows 4g .. 4g+3 at k: one vec4 of the [K, M] buffer, stored as is.
            let kk = tid / 16u;
            let g = tid % 16u;
            let gk = k0 + kk;
            let gr = row0 + 4u * g;
            var v = vec4<f32>(0.0);
            if (gk < K && gr < M) {
                v = ld4_a(off_a + (gk * M + gr) / 4u);
            }
            tile_a[kk * 16u + g] = v;
        } else {
            // Row r's k-values 4q .. 4q+3: one vec4, scattered over four k rows.
            let r = tid / 4u;
            let q = tid % 4u;
            let gr = row0 + r;
            let gk = k0 + 4u * q;
            var v = vec4<f32>(0.0);
            if (gr < M && gk < K) {
                v = ld4_a(off_a + (gr * K + gk) / 4u);
            }
            for (var t = 0u; t < 4u; t = t + 1u) {
                tile_a[(4u * q + t) * 16u + r / 4u][r % 4u] = v[t];
            }
        }
        if (TRANS_B) {
            // Column c's k-values 4q .. 4q+3 of the [N, K] buffer, scattered.
            let c = tid / 4u;
            let q = tid % 4u;
            let gc = col0 + c;
            let gk = k0 + 4u * q;
            var v = vec4<f32>(0.0);
            if (gc < N && gk < K) {
                v = ld4_b(off_b + (gc * K + gk) / 4u);
            }
            for (var t = 0u; t < 4u; t = t + 1u) {
                tile_b[(4u * q + t) * 16u + c / 4u][c % 4u] = v[t];
            }
        } else {
            // Columns 4g .. 4g+3 at k: one vec4, stored as is.
            let kk = tid / 16u;
            let g = tid % 16u;
            let gk = k0 + kk;
            let gc = col0 + 4u * g;
            var v = vec4<f32>(0.0);
            if (gk < K && gc < N) {
                v = ld4_b(off_b + (gk * N + gc) / 4u);
            }
            tile_b[kk * 16u + g] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            let a = tile_a[kk * 16u + lid.y];
            let b = tile_b[kk * 16u + lid.x];
            acc[0] = fma(vec4<f32>(a.x), b, acc[0]);
            acc[1] = fma(vec4<f32>(a.y), b, acc[1]);
            acc[2] = fma(vec4<f32>(a.z), b, acc[2]);
            acc[3] = fma(vec4<f32>(a.w), b, acc[3]);
        }
        workgroupBarrier();
    }

    let off_c = wid.z * M * N;
    let c = col0 + 4u * lid.x;
    for (var i = 0u; i < 4u; i = i + 1u) {
        let r = row0 + 4u * lid.y + i;
        if (r < M) {
            for (var j = 0u; j < 4u; j = j + 1u) {
                if (c + j < N) {
                    store_c(off_c + r * N + c + j, acc[i][j]);
                }
            }
        }
    }
}
