// Matrix-vector products for decoding: C[M, N] = X[M, K] @ W^T with few rows (M <= 8)
// and W stored [N, K] as a Linear layer holds it: f32 or GGUF blocks (Q8_0, Q4_0),
// read 32 values (one block) at a time with vec4 loads and dequantised in registers.
// A workgroup owns TM rows of X (uniform loads) and COLS * CPL columns of W (CPL per
// lane, strided by COLS, sharing each load of X); SPLIT lanes
// share each column, taking every SPLIT-th block, then add their partial sums in
// workgroup memory (SPLIT = 1 on CPU adapters: one lane streams a whole row of W, no
// barrier; SPLIT = 32 on GPUs: neighbouring lanes read neighbouring blocks).
// X is bound as array<vec4<f32>>, W as array<vec4<u32>>; `dot_block(blk, xv)` (from the
// header, per weight format) returns one block's dot product with 32 values of X.
// meta: [0] M, [1] N, [2] K, [3] batch rank nb, per batch axis size and strides (A, B),
//       then for block formats the word offset of the quants (a multiple of 4).

var<workgroup> partial: array<f32, 256>;

fn x_block(base: u32) -> array<vec4<f32>, 8> {
    var xv: array<vec4<f32>, 8>;
    for (var t = 0u; t < 8u; t = t + 1u) {
        xv[t] = in_a[base + t];
    }
    return xv;
}

@compute @workgroup_size(COLS * SPLIT, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let M = m(0u);
    let N = m(1u);
    let K = m(2u);
    let nb = m(3u);
    let offs = batch_offsets(wid.z, nb);
    let col_in = lid.x / SPLIT;
    let t = lid.x % SPLIT;
    let col0 = wid.x * COLS * CPL + col_in;
    let row0 = wid.y * TM;
    let KB = K / 32u;
    // Block index of each of this lane's columns' first block (its row of W), clamped.
    var wrow: array<u32, CPL>;
    for (var j = 0u; j < CPL; j = j + 1u) {
        wrow[j] = offs.y / 32u + min(col0 + j * COLS, max(N, 1u) - 1u) * KB;
    }
    var rows: array<u32, TM>;
    for (var i = 0u; i < TM; i = i + 1u) {
        rows[i] = offs.x / 4u + min(row0 + i, max(M, 1u) - 1u) * (K / 4u);
    }
    var acc: array<f32, TM * CPL>;
    for (var i = 0u; i < TM * CPL; i = i + 1u) {
        acc[i] = 0.0;
    }
    for (var kb = t; kb < KB; kb = kb + SPLIT) {
        for (var i = 0u; i < TM; i = i + 1u) {
            let xv = x_block(rows[i] + kb * 8u);
            for (var j = 0u; j < CPL; j = j + 1u) {
                acc[i * CPL + j] = acc[i * CPL + j] + dot_block(wrow[j] + kb, xv);
            }
        }
    }
    if (SPLIT > 1u) {
        for (var i = 0u; i < TM; i = i + 1u) {
            partial[lid.x] = acc[i];
            workgroupBarrier();
            for (var s = SPLIT / 2u; s > 0u; s = s / 2u) {
                if (t < s) {
                    partial[lid.x] = partial[lid.x] + partial[lid.x + s];
                }
                workgroupBarrier();
            }
            acc[i] = partial[col_in * SPLIT];  // CPL is 1 when SPLIT > 1
            workgroupBarrier();
        }
    }
    if (t == 0u) {
        let off_c = wid.z * M * N;
        for (var i = 0u; i < TM; i = i + 1u) {
            for (var j = 0u; j < CPL; j = j + 1u) {
                let c = col0 + j * COLS;
                if (row0 + i < M && c < N) {
                    store_c(off_c + (row0 + i) * N + c, acc[i * CPL + j]);
                }
            }
        }
    }
}
