// Shared by `matmul_direct_vec4.wgsl`, `matmul_direct_subgroup.wgsl` and
// `matmul_direct_wide.wgsl`, rendered in
// front of either: a workgroup's tile (TM rows, LANES lanes of 4 columns), where its
// invocation stands, and the guarded store of one row's 4 columns.

const BM: u32 = TM;
const BN: u32 = LANES * 4u;

var<private> M: u32;
var<private> N: u32;
var<private> off_c: u32;
var<private> row0: u32;
var<private> c0: u32;

// Row i of the tile, columns c .. c + 3 (C transposed when OUT_T). With QUAD_STORE
// (C not transposed, N % 4 == 0) the 4 columns are in range together and go as one quad.
fn store_row_at(i: u32, c: u32, acc: vec4<f32>) {
    let r = row0 + i;
    if (QUAD_STORE) {
        if (i < TM && r < M && c < N) {
            store_c4(off_c + r * N + c, acc);
        }
        return;
    }
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (i < TM && r < M && c + j < N) {
            store_c(off_c + select(r * N + c + j, (c + j) * M + r, OUT_T), acc[j]);
        }
    }
}

// With STORE_LOOP (set for products with an epilogue) a row is parked here and
// `flush_rows` stores the tile in one loop, so the epilogue's code appears once instead
// of once per row: lavapipe took 1 to 3 s to compile a 32-row tile whose epilogue reads
// an attention mask, against 0.1 s in the loop. `lane_quad` is which of a lane's QUADS
// quads of columns (2 or 4 in the wide kernel, 8 or 16 columns) is being stored.
var<private> parked: array<vec4<f32>, PARKED>;
var<private> lane_quad: u32;

// Row i of the tile at columns c0 + 4 lane_quad .. c0 + 4 lane_quad + 3.
fn store_row(i: u32, acc: vec4<f32>) {
    if (STORE_LOOP) {
        parked[i * QUADS + lane_quad] = acc;
        return;
    }
    store_row_at(i, c0 + 4u * lane_quad, acc);
}

// Store the parked rows (nothing without STORE_LOOP). The loop ends at the last row in
// range, which the compiler cannot know, so it stays a loop.
fn flush_rows() {
    if (!STORE_LOOP) {
        return;
    }
    for (var i = 0u; i < TM; i = i + 1u) {
        if (row0 + i >= M) {
            break;
        }
        for (var h = 0u; h < QUADS; h = h + 1u) {
            store_row_at(i, c0 + 4u * h, parked[i * QUADS + h]);
        }
    }
}
