"""The subgroup-shared matmul with TM rows per workgroup (a multiple of 8) in named
accumulators, as shaders/matmul_direct_subgroup.wgsl: every 8 rows share one load of A
per k-step. `python3 gen_shared_rows.py 32 > /tmp/shared32.wgsl`, then run the lab with
--const LANES=32 --bm 32 --bn 128 (lavapipe 1024^3: about 3x matmul_rows.wgsl)."""
import sys

TM = int(sys.argv[1])
groups=(TM+7)//8
s=f"""@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<f32>>;
const BN: u32 = LANES * 4u;
@compute @workgroup_size(LANES, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_invocation_id) sl: u32) {{
    let M = params[0].x; let N = params[0].y; let K = params[0].z;
    let row0 = wid.y * {TM}u;
    let c0 = wid.x * BN + lid.x * 4u;
    let K4 = K / 4u; let N4 = N / 4u;
    let cb = min(c0 / 4u, N4 - 1u);
"""
for g in range(groups):
    s+=f"    let ra{g} = min(row0 + {8*g}u + (sl % 8u), M - 1u) * K4;\n"
for i in range(TM):
    s+=f"    var acc{i} = vec4<f32>(0.0);\n"
s+="""    for (var k4 = 0u; k4 < K4; k4 = k4 + 1u) {
        let b0 = in_b[cb + (4u * k4) * N4];
        let b1 = in_b[cb + (4u * k4 + 1u) * N4];
        let b2 = in_b[cb + (4u * k4 + 2u) * N4];
        let b3 = in_b[cb + (4u * k4 + 3u) * N4];
"""
for g in range(groups):
    s+=f"        let av{g} = in_a[ra{g} + k4];\n"
for i in range(TM):
    s+=f"        {{ let a = subgroupShuffle(av{i//8}, {i%8}u); acc{i} = fma(vec4<f32>(a.x), b0, acc{i}); acc{i} = fma(vec4<f32>(a.y), b1, acc{i}); acc{i} = fma(vec4<f32>(a.z), b2, acc{i}); acc{i} = fma(vec4<f32>(a.w), b3, acc{i}); }}\n"
s+="    }\n"
for i in range(TM):
    s+=f"    if (row0 + {i}u < M) {{ let r = row0 + {i}u; for (var j = 0u; j < 4u; j = j + 1u) {{ if (c0 + j < N) {{ out[r * N + c0 + j] = acc{i}[j]; }} }} }}\n"
s+="}\n"
print(s, end="")
