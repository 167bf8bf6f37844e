"""gen_shared_rows.py with B bound as vec4<u64> (SHADER_INT64): each load of B brings 8
columns, so each lane owns 8 columns and a k-step costs 4 load loops for B per 8
columns, not per 4. `python3 gen_shared_rows_wide.py 32 > /tmp/wide32.wgsl`, then run the
lab with --const LANES=16 --bm 32 --bn 128 (BN = LANES * 8).

`window` as a second argument rereads the first 32 rows of B (64 KiB at N = 512) for
every k-step, and `uniform` does so from B bound as a uniform buffer (a 64 KiB
`array<vec4<f32>, 4096>`), whose loads lavapipe gathers without a loop over the lanes:
run both with --n 512 --b-len 16384 (the check then does not apply).

`tex` reads B from an rgba32float texture N / 4 texels wide (run with --tex-b N/4), and
`tex_ab` A too, K / 4 texels wide (--tex-a K/4): texel fetches run without the loop
over the lanes. The copies that stage them run inside every timed run."""
import sys

TM = int(sys.argv[1])
B_MODE = sys.argv[2] if len(sys.argv) > 2 else "full"
KSTEP = "(k4 % 8u)" if B_MODE in ("window", "uniform") else "k4"
groups=(TM+7)//8
s=f"""@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 1>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> in_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> in_b: array<vec4<u64>>;
const BN: u32 = LANES * 8u;
fn lo(w: u64) -> f32 {{ return bitcast<f32>(u32(w & 0xfffffffflu)); }}
fn hi(w: u64) -> f32 {{ return bitcast<f32>(u32(w >> 32u)); }}
@compute @workgroup_size(LANES, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_invocation_id) sl: u32) {{
    let M = params[0].x; let N = params[0].y; let K = params[0].z;
    let row0 = wid.y * {TM}u;
    let c0 = wid.x * BN + lid.x * 8u;
    let K4 = K / 4u; let N8 = N / 8u;
    let cb = min(c0 / 8u, N8 - 1u);
"""
for g in range(groups):
    s+=f"    let ra{g} = min(row0 + {8*g}u + (sl % 8u), M - 1u) * K4;\n"
for i in range(TM):
    s+=f"    var acc{i} = vec4<f32>(0.0); var acd{i} = vec4<f32>(0.0);\n"
s+="    for (var k4 = 0u; k4 < K4; k4 = k4 + 1u) {\n"
for kk in range(4):
    if B_MODE in ("tex", "tex_ab"):
        s+=f"        let b{kk} = textureLoad(in_b, vec2<u32>(2u * cb, 4u * k4 + {kk}u), 0);\n"
        s+=f"        let d{kk} = textureLoad(in_b, vec2<u32>(2u * cb + 1u, 4u * k4 + {kk}u), 0);\n"
        continue
    if B_MODE == "uniform":
        s+=f"        let i{kk} = cb + (4u * {KSTEP} + {kk}u) * N8;\n"
        s+=f"        let b{kk} = in_b[2u * i{kk}]; let d{kk} = in_b[2u * i{kk} + 1u];\n"
        continue
    s+=f"        let w{kk} = in_b[cb + (4u * {KSTEP} + {kk}u) * N8];\n"
    s+=f"        let b{kk} = vec4<f32>(lo(w{kk}.x), hi(w{kk}.x), lo(w{kk}.y), hi(w{kk}.y));\n"
    s+=f"        let d{kk} = vec4<f32>(lo(w{kk}.z), hi(w{kk}.z), lo(w{kk}.w), hi(w{kk}.w));\n"
for g in range(groups):
    if B_MODE == "tex_ab":
        s+=f"        let av{g} = textureLoad(in_a, vec2<u32>(k4, ra{g} / K4), 0);\n"
    else:
        s+=f"        let av{g} = in_a[ra{g} + k4];\n"
for i in range(TM):
    s+=f"        {{ let a = subgroupShuffle(av{i//8}, {i%8}u);"
    for acc, b in (("acc","b"),("acd","d")):
        s+=f" {acc}{i} = fma(vec4<f32>(a.x), {b}0, {acc}{i}); {acc}{i} = fma(vec4<f32>(a.y), {b}1, {acc}{i}); {acc}{i} = fma(vec4<f32>(a.z), {b}2, {acc}{i}); {acc}{i} = fma(vec4<f32>(a.w), {b}3, {acc}{i});"
    s+=" }\n"
s+="    }\n"
for i in range(TM):
    s+=f"    if (row0 + {i}u < M) {{ let r = row0 + {i}u; for (var j = 0u; j < 4u; j = j + 1u) {{ if (c0 + j < N) {{ out[r * N + c0 + j] = acc{i}[j]; }} if (c0 + 4u + j < N) {{ out[r * N + c0 + 4u + j] = acd{i}[j]; }} }} }}\n"
s+="}\n"
if B_MODE in ("tex", "tex_ab"):
    s=s.replace("var<storage, read> in_b: array<vec4<u64>>;", "var in_b: texture_2d<f32>;")
if B_MODE == "tex_ab":
    s=s.replace("var<storage, read> in_a: array<vec4<f32>>;", "var in_a: texture_2d<f32>;")
if B_MODE == "uniform":
    s=s.replace("var<storage, read> in_b: array<vec4<u64>>;", "var<uniform> in_b: array<vec4<f32>, 4096>;")
print(s, end="")
