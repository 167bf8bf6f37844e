// Shared by `matmul_direct_vec4.wgsl` and `matmul_direct_subgroup.wgsl`, rendered in
// front of either: a workgroup's tile (TM rows, LANES lanes of 4 columns), where its
// invocation stands, and the guarded store of one row's 4 columns.

const BM: u32 = TM;
const BN: u32 = LANES * 4u;

var<private> M: u32;
var<private> N: u32;
var<private> off_c: u32;
var<private> row0: u32;
var<private> c0: u32;

// Row i of the tile, columns c0 .. c0 + 3 (C transposed when OUT_T). With QUAD_STORE
// (C not transposed, N % 4 == 0) the 4 columns are in range together and go as one quad.
fn store_row(i: u32, acc: vec4<f32>) {
    let r = row0 + i;
    if (QUAD_STORE) {
        if (i < TM && r < M && c0 < N) {
            store_c4(off_c + r * N + c0, acc);
        }
        return;
    }
    for (var j = 0u; j < 4u; j = j + 1u) {
        let c = c0 + j;
        if (i < TM && r < M && c < N) {
            store_c(off_c + select(r * N + c, c * M + r, OUT_T), acc[j]);
        }
    }
}
