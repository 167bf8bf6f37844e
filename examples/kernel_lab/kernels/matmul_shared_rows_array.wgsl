// The same product with each group of 8 rows of A loaded once per k-step (lane l loads
// row l) and shared by subgroupShuffle: about 2x matmul_rows.wgsl on lavapipe at TM=8.
// The accumulators are an array indexed by a loop: past TM=8 the loop is not unrolled
// and lavapipe keeps the array in memory (TM=16 ran at a tenth of the speed). See
// gen_shared_rows.py for the form with named accumulators the engine uses.
// Consts TM (at most 8), LANES. Run: --const TM=8 --const LANES=64 --bm 8 --bn 256
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;

const BN: u32 = LANES * 4u;
@compute @workgroup_size(LANES, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_invocation_id) sl: u32) {
    let M = params[0].x; let N = params[0].y; let K = params[0].z;
    let row0 = wid.y * TM;
    let c0 = wid.x * BN + lid.x * 4u;
    let K4 = K / 4u; let N4 = N / 4u;
    let ra = min(row0 + (sl % TM), M - 1u) * K4;
    let cb = min(c0 / 4u, N4 - 1u);
    var acc: array<vec4<f32>, TM>;
    for (var i = 0u; i < TM; i = i + 1u) { acc[i] = vec4<f32>(0.0); }
    for (var k4 = 0u; k4 < K4; k4 = k4 + 1u) {
        let b0 = in_b[cb + (4u * k4) * N4];
        let b1 = in_b[cb + (4u * k4 + 1u) * N4];
        let b2 = in_b[cb + (4u * k4 + 2u) * N4];
        let b3 = in_b[cb + (4u * k4 + 3u) * N4];
        let av = in_a[ra + k4];
        for (var i = 0u; i < TM; i = i + 1u) {
            let a = subgroupShuffle(av, i);
            acc[i] = fma(vec4<f32>(a.x), b0, acc[i]);
            acc[i] = fma(vec4<f32>(a.y), b1, acc[i]);
            acc[i] = fma(vec4<f32>(a.z), b2, acc[i]);
            acc[i] = fma(vec4<f32>(a.w), b3, acc[i]);
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
