// Sparse Adam over U rows of three [R, 32] tables (w, m, v, one after another in out),
// as shaders/scatter_rows_vec4.wgsl: ROW_LANES=0, one invocation per quad; ROW_LANES=1,
// one per row, so the SIMD lanes of an access reach 8 rows. params: M = U, N = R.
// Run (three 330,000 x 32 tables, 8,162 rows): --m 8162 --n 330000 --k 1 --a-len 261184
//   --out-len 31680000 --const ROW_LANES=0 --groups 1021,1,1 (ROW_LANES=1: --groups 128,1,1)
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;

fn update(u: u32, c: u32, rows: u32) {
    let r = (u * 7919u + 13u) % rows;
    let kq = r * 8u + c;
    let t = rows * 8u;
    let g = in_a[u * 8u + c];
    let m = 0.9 * out[t + kq] + 0.1 * g;
    let v = 0.999 * out[2u * t + kq] + 0.001 * g * g;
    out[t + kq] = m;
    out[2u * t + kq] = v;
    out[kq] = out[kq] - 0.01 * m / (sqrt(v) + 1e-8);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let u_n = params[0].x;
    let rows = params[0].y;
    if (u_n == 0xffffffffu) { out[0] = in_b[0]; }
    if (ROW_LANES == 1u) {
        if (gid.x >= u_n) { return; }
        for (var c = 0u; c < 8u; c++) {
            update(gid.x, c, rows);
        }
    } else {
        if (gid.x >= u_n * 8u) { return; }
        update(gid.x / 8u, gid.x % 8u, rows);
    }
}
