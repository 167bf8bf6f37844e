// C = A B, B stored [K, N], the shape of shaders/matmul_direct_vec4.wgsl: a workgroup
// owns TM whole rows, every lane loads each of its TM rows of A itself (one storage load
// loop per row and k-step on lavapipe) and 4 columns of B. Consts TM, LANES.
// Run: --const TM=8 --const LANES=64 --bm 8 --bn 256
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;
const BM: u32 = TM;
const BN: u32 = LANES * 4u;
@compute @workgroup_size(LANES, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let M = params[0].x; let N = params[0].y; let K = params[0].z;
    let row0 = wid.y * BM;
    let c0 = wid.x * BN + lid.x * 4u;
    let K4 = K / 4u; let N4 = N / 4u;
    var ra: array<u32, TM>;
    for (var i = 0u; i < TM; i = i + 1u) { ra[i] = min(row0 + i, M - 1u) * K4; }
    let cb = min(c0 / 4u, N4 - 1u);
    var acc: array<vec4<f32>, TM>;
    for (var i = 0u; i < TM; i = i + 1u) { acc[i] = vec4<f32>(0.0); }
    for (var k4 = 0u; k4 < K4; k4 = k4 + 1u) {
        var b: array<vec4<f32>, 4>;
        for (var kk = 0u; kk < 4u; kk = kk + 1u) { b[kk] = in_b[cb + (4u * k4 + kk) * N4]; }
        for (var i = 0u; i < TM; i = i + 1u) {
            let a = in_a[ra[i] + k4];
            acc[i] = fma(vec4<f32>(a.x), b[0], acc[i]);
            acc[i] = fma(vec4<f32>(a.y), b[1], acc[i]);
            acc[i] = fma(vec4<f32>(a.z), b[2], acc[i]);
            acc[i] = fma(vec4<f32>(a.w), b[3], acc[i]);
        }
    }
    for (var i = 0u; i < TM; i = i + 1u) {
        let r = row0 + i;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let c = c0 + j;
            if (r < M && c < N) { out[r * N + c] = acc[i][j]; }
        }
    }
}
