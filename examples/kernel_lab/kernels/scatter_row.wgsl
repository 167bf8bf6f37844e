// The same update, one invocation per row: the SIMD lanes of a gather touch 8 rows.
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let u_n = params[0].x; let rows = params[0].y;
    if (u_n == 0xffffffffu) { out[0] = in_b[0]; }
    let u = gid.x;
    if (u >= u_n) { return; }
    let r = (u * 7919u + 13u) % rows;
    let t = rows * 8u;
    for (var c = 0u; c < 8u; c++) {
        let kq = r * 8u + c;
        let g = in_a[u * 8u + c];
        let m = 0.9 * out[t + kq] + 0.1 * g;
        let v = 0.999 * out[2u * t + kq] + 0.001 * g * g;
        out[t + kq] = m;
        out[2u * t + kq] = v;
        out[kq] = out[kq] - 0.01 * m / (sqrt(v) + 1e-8);
    }
}
