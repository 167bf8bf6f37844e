//! Fused scaled-dot-product attention (`shaders/attention.wgsl`): `Op::Attention`
//! rendered as one kernel, its K/V tiles staged in workgroup memory.

use super::{header, load_fn, sources, KernelSpec, ShaderCaps};
use crate::{DType, Error, Result, Tensor};

/// Largest head dim the fused kernel takes (q and the output row live in registers).
pub const MAX_HEAD_DIM: usize = 128;

/// Render the attention producing `root` from its operands' buffers `(q, k, v, bias)`;
/// with `moved`, the reshapes and permutes over `root` that the kernel stores through
/// (`graph::schedule::fuse_attention_stores`: quads of f32 rows kept whole), whose
/// result is the kernel's output.
pub fn render(root: &Tensor, moved: Option<&Tensor>, inputs: Vec<Tensor>, caps: &ShaderCaps) -> Result<KernelSpec> {
    let ins = &root.node().inputs;
    let r = root.rank();
    let (t, d) = (ins[0].dims()[r - 2], ins[0].dims()[r - 1]);
    let s = ins[1].dims()[r - 2];
    let causal = matches!(root.node().op, crate::graph::Op::Attention { causal: true });
    let has_bias = ins.len() == 4;
    let lead = &root.dims()[..r - 2];
    let mut meta = vec![t as u32, s as u32, 0, lead.len() as u32];
    if has_bias {
        // Bias strides per axis of the [.., T, S] scores (0 where it broadcasts).
        let bd = ins[3].dims();
        let mut strides = vec![0u32; r];
        let mut acc = 1usize;
        for a in (0..r).rev() {
            strides[a] = if bd[a] == 1 { 0 } else { acc as u32 };
            acc *= bd[a];
        }
        for (a, &size) in lead.iter().enumerate() {
            meta.extend_from_slice(&[size as u32, strides[a]]);
        }
        meta.extend_from_slice(&[strides[r - 2], strides[r - 1]]);
    }
    let out_dt = root.dtype();
    let uses_f16 = inputs.iter().any(|i| i.dtype() == DType::F16) || out_dt == DType::F16;
    // An f32 output whose rows are 4-aligned is bound as quads, stored a vec4 at a time.
    let quad_out = d % 4 == 0 && out_dt == DType::F32;
    // Stored through moves: `dst(i)`, where they send element i (slots after the meta).
    #[cfg(target_arch = "wasm32")]
    let dst: Option<String> = moved.and(None);
    #[cfg(not(target_arch = "wasm32"))]
    let dst = match moved {
        Some(m) if quad_out => {
            let keep = |_: &Tensor| true;
            let mut g = super::codegen::Gen::new(*caps, &keep);
            for &w in &meta {
                g.slot(w);
            }
            let at = super::matmul::store_index(&mut g, m, root);
            let body = g.take_function();
            meta = g.meta.clone();
            Some(format!("{}fn dst(i: u32) -> u32 {{\n{body}    return {at};\n}}\n", g.support(0)))
        }
        Some(_) => {
            return Err(Error::Gpu {
                context: "attention".into(),
                message: "stores through moves only as f32 quads".into(),
            })
        }
        None => None,
    };
    // CPU adapters: one invocation per query, no workgroup memory or barriers. (Native
    // only: measured on lavapipe, not on the browser's SwiftShader, and the wasm build
    // has a size budget.)
    let per_row = cfg!(not(target_arch = "wasm32"))
        && caps.direct_matmul
        && std::env::var("TESSERA_ATTENTION_ROWS").as_deref() != Ok("0");
    // With subgroups of 8 lanes, heads of 8 to 128 (a multiple of 8) take the register-
    // tiled kernel (`attention_wide.wgsl`), which loads 8 values per access: f16 as a
    // `vec4<u32>`, f32 as a `vec4<u64>` (wide loads). It walks keys 64 at a time, so
    // up to 24 keys, where most of its work would be padding, the per-query kernel
    // takes them (lavapipe, 32 x 12 heads of 32: 2.3 against 2.7 ms at 20 keys, 0.85
    // against 1.9 ms at 10; 8 x 8 heads of 128 at 20 keys: 1.4 against 2.9 ms; at 32 to
    // 48 keys the two were within noise of each other, from 64 the wide kernel wins).
    // `TESSERA_ATTENTION_WIDE` = 0 or 1 forces the choice.
    let qkv = ins[0].dtype();
    let wide = per_row
        && caps.subgroup_min >= 8
        && d % 8 == 0
        && d <= 128
        && (qkv == DType::F16 || (qkv == DType::F32 && caps.wide_loads))
        && inputs[..3].iter().all(|t| t.dtype() == qkv)
        && inputs.get(3).is_none_or(|b| b.dtype() == DType::F32)
        && match std::env::var("TESSERA_ATTENTION_WIDE").ok().as_deref() {
            Some("0") => false,
            Some("1") => true,
            _ => s > 24,
        };
    let mut src = match quad_out {
        true => super::header_with_out(meta.len(), "vec4<f32>", uses_f16, caps),
        false => header(meta.len(), out_dt, uses_f16, caps),
    };
    // 4-aligned f32 or f16 rows load a quad at a time (`quad_input_or_texture`); otherwise four
    // guarded scalar loads.
    let vec = d % 4 == 0 && inputs[..3].iter().all(|t| matches!(t.dtype(), DType::F32 | DType::F16));
    let mut textured = 0u32;
    for (k, (t, name)) in inputs.iter().zip(["q", "k", "v", "bias"]).enumerate() {
        if wide && k < 3 && super::texturable(t, caps) {
            // From an operand texture where the adapter allows (`ShaderCaps::texture_rows`).
            src.push_str(&super::texture_ld8(
                2 + k as u32,
                &format!("in{k}"),
                &format!("ld8_{name}"),
                super::TexelRead::Storage,
            ));
            textured |= 1 << k;
            continue;
        }
        if wide && k < 3 {
            let (elem, body) = match qkv {
                DType::F16 => (
                    "vec4<u32>",
                    format!(
                        "let w = in{k}[i];\n    return Oct(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), \
                         vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));"
                    ),
                ),
                _ => ("vec4<u64>", format!("return oct(in{k}[i]);")),
            };
            src.push_str(&format!(
                "@group(0) @binding({}) var<storage, read> in{k}: array<{elem}>;\nfn ld8_{name}(i: u32) -> Oct {{\n    {body}\n}}\n",
                2 + k
            ));
            continue;
        }
        if vec && k < 3 {
            // From an operand texture where the adapter allows (`ShaderCaps::texture_rows`).
            let (load, tex) = super::quad_input_or_texture(k, t, caps);
            src.push_str(&load);
            textured |= u32::from(tex) << k;
            src.push_str(&format!(
                "fn ld_{name}4(base: u32, c: u32) -> vec4<f32> {{ return ld{k}q((base >> 2u) + c); }}\n"
            ));
            continue;
        }
        src.push_str(&super::input_binding(k, t.dtype(), caps));
        src.push_str(&load_fn(&format!("ld_{name}"), &format!("in{k}"), t.dtype(), caps, None));
        if k < 3 {
            src.push_str(&format!(
                "fn ld_{name}1(base: u32, d: u32) -> f32 {{ return select(0.0, ld_{name}(base + min(d, D - 1u)), d < D); }}\n\
                 fn ld_{name}4(base: u32, c: u32) -> vec4<f32> {{\n    \
                 return vec4<f32>(ld_{name}1(base, 4u * c), ld_{name}1(base, 4u * c + 1u), ld_{name}1(base, 4u * c + 2u), ld_{name}1(base, 4u * c + 3u));\n}}\n"
            ));
        }
    }
    if !has_bias {
        // Referenced in a branch HAS_BIAS removes; WGSL still needs a definition.
        src.push_str("fn ld_bias(i: u32) -> f32 { return 0.0; }\n");
    }
    src.push_str(&store_fn(out_dt, caps, quad_out, dst.is_some()));
    src.push_str(dst.as_deref().unwrap_or_default());
    src.push_str(BIAS_HEAD_OFFSET);
    let bh: usize = lead.iter().product();
    let label = format!(
        "attention_{}_d{d}{}{}",
        ins[0].dtype(),
        if causal { "_causal" } else { "" },
        if has_bias { "_mask" } else { "" }
    );
    let (label, qw) = if wide {
        let tm = wide_rows(t, bh, d);
        let bias_rows = has_bias && ins[3].dims()[r - 2] != 1;
        src.push_str(&format!(
            "const D: u32 = {d}u;\nconst TM: u32 = {tm}u;\nconst CAUSAL: bool = {causal};\n\
             const HAS_BIAS: bool = {has_bias};\nconst BIAS_ROWS: bool = {bias_rows};\n"
        ));
        src.push_str(sources::WIDE);
        if qkv == DType::F32 {
            src.push_str(sources::OCT);
        }
        src.push_str(sources::ATTENTION_WIDE);
        (format!("{label}_wide{tm}"), tm)
    } else if per_row {
        let shared = caps.subgroup_min >= 8;
        src.push_str(&format!(
            "const D: u32 = {d}u;\nconst CAUSAL: bool = {causal};\nconst HAS_BIAS: bool = {has_bias};\n"
        ));
        // Two queries per lane halve the loads and shuffles per score (lavapipe, 12
        // heads of 64 at sequence 512: 28 -> 19 ms; four gain nothing more). Fewer
        // queries take fewer lanes: a multiple of 8 up to ROWS_PER_GROUP. With subgroups,
        // up to 24 queries of heads up to 64 take one subgroup of 8 lanes, each lane a
        // third of them at most: the K and V rows it loads and shuffles serve every
        // query of the lane, and no lane idles past the last query (lavapipe, MiniLM's
        // batch of 32: at 22 tokens 2.1 -> 1.55 ms, at 14 tokens 1.05 -> 0.9 ms).
        let (qg, qpl) = match () {
            _ if shared && t <= 24 && d <= 64 => (8, t.div_ceil(8).max(1)),
            _ if shared => (t.next_multiple_of(8).clamp(8, ROWS_PER_GROUP), 1 + (t > ROWS_PER_GROUP) as usize),
            _ => (ROWS_PER_GROUP, 1 + (t > ROWS_PER_GROUP) as usize),
        };
        let shared_bias = shared && has_bias && ins[3].dims()[r - 2] == 1;
        src.push_str(&rows_kernel(d, shared, shared_bias, qg, qpl));
        (format!("{label}_rows{}{qg}_q{qpl}", if shared { "_sg" } else { "" }), qg * qpl)
    } else {
        (label, tiled_kernel(d, causal, has_bias, &mut src))
    };
    let max = caps.max_workgroups as usize;
    let gx = t.div_ceil(qw);
    // Heads over y, folded into z past the per-dimension limit.
    let gy = bh.min(max);
    let gz = bh.div_ceil(gy.max(1));
    if gx > max || gz > max || gy * gz != bh {
        return Err(Error::Limit { what: format!("{label}: workgroups"), needed: (gx * bh) as u64, limit: max as u64 });
    }
    let workgroups = if t == 0 || bh == 0 || d == 0 { [0, 1, 1] } else { [gx as u32, gy as u32, gz as u32] };
    let label =
        format!("{label}{}{}", if textured != 0 { "_tex" } else { "" }, if dst.is_some() { "_moved" } else { "" });
    let mut spec = KernelSpec::hand_written(label, src, meta, inputs, moved.unwrap_or(root), workgroups, false);
    spec.textured = textured;
    Ok(spec)
}

/// WGSL `bias_head_offset(bh, nb)`: where the bias of (batch, head) `bh` starts, from
/// the size and bias stride of each of the `nb` batch axes (meta from word 4, outer
/// first), for both kernels.
const BIAS_HEAD_OFFSET: &str = "fn bias_head_offset(bh: u32, nb: u32) -> u32 {
    var off = 0u;
    var rem = bh;
    for (var a = nb; a > 0u; a = a - 1u) {
        let base = 4u + (a - 1u) * 2u;
        let size = m(base);
        off = off + (rem % size) * m(base + 1u);
        rem = rem / size;
    }
    return off;
}
";

/// Append the tiled kernel's constants and `shaders/attention.wgsl`; returns the queries
/// per workgroup.
fn tiled_kernel(d: usize, causal: bool, has_bias: bool, src: &mut String) -> usize {
    // Tiles of BK keys: K and V tiles together within 16 KiB of workgroup memory (each
    // tile row is ceil(D / 4) vec4s). SPLIT invocations per query, QW queries per
    // workgroup; merging the partial states reuses the tiles (QW rows and states, 528
    // vec4s at most for D = 128, within the 1024 of the tiles).
    let dv = d.div_ceil(4);
    let bk = (512 / dv).clamp(1, 64);
    let (split, qw) = (4, 16);
    src.push_str(&format!(
        "const D: u32 = {d}u;\nconst BK: u32 = {bk}u;\nconst TILE: u32 = {}u;\nconst QW: u32 = {qw}u;\n\
         const SPLIT: u32 = {split}u;\nconst KB: u32 = 8u;\nconst CAUSAL: bool = {causal};\nconst HAS_BIAS: bool = {has_bias};\n",
        bk * dv
    ));
    src.push_str(sources::ATTENTION);
    qw
}

/// Queries per workgroup of the wide kernel: a multiple of 8 up to 32, or 16 for heads
/// past 64 (twice the output per row; `TESSERA_ATTENTION_TM` overrides), lowered while
/// there would be fewer than 4 workgroups.
fn wide_rows(t: usize, heads: usize, d: usize) -> usize {
    let most = if d > 64 { 16 } else { 32 };
    let cap =
        std::env::var("TESSERA_ATTENTION_TM").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(most).clamp(8, 32);
    let mut tm = t.next_multiple_of(8).clamp(8, cap / 8 * 8);
    while tm > 8 && t.div_ceil(tm) * heads < 4 {
        tm -= 8;
    }
    tm
}

/// `store4(base, c, v)`: values `4c .. 4c + 3` (those below D) of the output row starting
/// at element `base`, in the output's storage (pairs packed into `u32`s for the f16
/// fallback, where D is even; one quad for an f32 output bound as quads, D % 4 == 0).
/// Rows are stored a vec4 at a time: passing the whole row array to a function made
/// llvmpipe's GL compiler take minutes.
fn store_fn(dt: DType, caps: &ShaderCaps, quad: bool, moved: bool) -> String {
    let body = match dt {
        _ if quad && moved => "    out[dst(base + 4u * c) >> 2u] = v;\n",
        _ if quad => "    out[(base >> 2u) + c] = v;\n",
        DType::F16 if !caps.native_f16 => {
            "    let w = (base + 4u * c) / 2u;\n    out[w] = pack2x16float(v.xy);\n    if (4u * c + 2u < D) {\n        out[w + 1u] = pack2x16float(v.zw);\n    }\n"
        }
        DType::F16 => "    for (var t = 0u; t < 4u; t = t + 1u) {\n        if (4u * c + t < D) {\n            out[base + 4u * c + t] = f16(v[t]);\n        }\n    }\n",
        _ => "    for (var t = 0u; t < 4u; t = t + 1u) {\n        if (4u * c + t < D) {\n            out[base + 4u * c + t] = v[t];\n        }\n    }\n",
    };
    format!("fn store4(base: u32, c: u32, v: vec4<f32>) {{\n{body}}}\n")
}

/// Lanes per workgroup of the per-query kernel.
const ROWS_PER_GROUP: usize = 32;

/// The per-query kernel for CPU adapters (lavapipe): each invocation owns `qpl` query
/// rows and walks every key with an online softmax, with no workgroup memory or
/// barriers, which cost more there than the work they share. q and the output rows are
/// named vec4 variables (`q0_0`, `o0_0`, ...), since lavapipe keeps a loop-indexed
/// private array in memory. Every key rescales the running output and sum to the new
/// maximum, with no branch: lavapipe runs both sides of a branch under a mask, and
/// stores what a branch assigns through that mask, so rescaling only when the maximum
/// rose by more than 8 cost more than always (MiniLM's batch of 32, 22 keys: 1.19
/// against 1.51-1.55 ms). With `shared` (subgroups of 8 lanes or more) every
/// lane needs the same K and V rows, so each of 8 lanes loads a different vec4 of the
/// row and `subgroupShuffle` hands it to the others: one storage access per 8 vec4s,
/// where lavapipe runs each access as a loop over the lanes. Every lane of a subgroup
/// runs the same key loop, so the shuffles see the whole subgroup.
/// With `shared_bias` (a bias that does not vary over queries, such as a padding mask)
/// each lane loads the bias of one of 8 keys and the key loop takes it by shuffle: one
/// access per 8 keys rather than one per key. A workgroup has `qg` lanes.
fn rows_kernel(d: usize, shared: bool, shared_bias: bool, qg: usize, qpl: usize) -> String {
    let dv = d.div_ceil(4);
    // `f(u, c)` over each query u of the lane and each vec4 c of a row.
    let each = |f: &dyn Fn(usize, usize) -> String| {
        (0..qpl).flat_map(|u| (0..dv).map(move |c| (u, c))).map(|(u, c)| f(u, c)).collect::<String>()
    };
    let per_query = |f: &dyn Fn(usize) -> String| (0..qpl).map(f).collect::<String>();
    // The vec4s of the row starting at `row`, as `{p}0 ..`: shared loads and shuffles, or
    // one load each.
    let row_vec4s = |p: &str| {
        let cs = 0..dv;
        if shared {
            let loads = (0..dv.div_ceil(8))
                .map(|r| format!("        let {p}l{r} = ld_{p}4(row, min(own + {}u, {}u));\n", 8 * r, dv - 1))
                .collect::<String>();
            loads
                + &cs
                    .map(|c| format!("        let {p}{c} = subgroupShuffle({p}l{}, {}u);\n", c / 8, c % 8))
                    .collect::<String>()
        } else {
            cs.map(|c| format!("        let {p}{c} = ld_{p}4(row, {c}u);\n")).collect()
        }
    };
    format!(
        "const QG: u32 = {qg}u;
const QPL: u32 = {qpl}u;
@compute @workgroup_size(QG, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>{sl}) {{
    let T = m(0u);
    let S = m(1u);
    let nb = m(3u);
    let bh = wid.y + wid.z * nwg.y;
    // This lane's queries: i0 + u * QG for u < QPL.
    let i0 = wid.x * QG * QPL + lid.x;
    // Bias offset of this (batch, head), and the strides over queries and keys.
    var boff = 0u;
    if (HAS_BIAS) {{
        boff = bias_head_offset(bh, nb);
    }}
    let bq = select(0u, m(4u + nb * 2u), HAS_BIAS);
    let bs = select(0u, m(5u + nb * 2u), HAS_BIAS);
    {own}
    let scale = inverseSqrt(f32(D));
    let z = vec4<f32>(0.0);
{init}    let kbase = bh * S * D;
    for (var j0 = 0u; j0 < S; j0 = j0 + 8u) {{
{bias_block}    for (var j = j0; j < min(j0 + 8u, S); j = j + 1u) {{
        let row = kbase + j * D;
{k}{dot}{rescale}{v}{acc}    }}
    }}
{store}}}
",
        bias_block = if shared_bias {
            "    let bias8 = ld_bias(boff + min(j0 + own, S - 1u) * bs);\n"
        } else {
            ""
        },
        sl = if shared { ", @builtin(subgroup_invocation_id) sl: u32" } else { "" },
        own = if shared { "let own = sl % 8u;" } else { "" },
        init = per_query(&|u| format!(
            "    let iq{u} = min(i0 + {u}u * QG, max(T, 1u) - 1u);\n    let qrow{u} = (bh * T + iq{u}) * D;\n    \
             // Keys a causal query may see: j <= i + S - T (queries aligned with the end).\n    \
             let last{u} = i32(iq{u}) + i32(S) - i32(T);\n    let boff{u} = boff + iq{u} * bq;\n    \
             var mx{u} = -3.0e38;\n    var l{u} = 0.0;\n"
        )) + &each(&|u, c| format!("    let q{u}_{c} = ld_q4(qrow{u}, {c}u) * scale;\n    var o{u}_{c} = z;\n")),
        // The shared bias of key j, shuffled once for all of the lane's queries.
        k = row_vec4s("k") + if shared_bias { "        let bj = subgroupShuffle(bias8, j - j0);\n" } else { "" },
        dot = per_query(&|u| format!(
            "        var acc{u} = q{u}_0 * k0;\n{}        var s{u} = acc{u}.x + acc{u}.y + acc{u}.z + acc{u}.w;\n        \
             if (HAS_BIAS) {{\n            s{u} = s{u} + {bias};\n        }}\n        \
             // Masked scores are -1e30: a fully masked row averages its values.\n        \
             s{u} = select(s{u}, -1.0e30, CAUSAL && i32(j) > last{u});\n",
            (1..dv).map(|c| format!("        acc{u} = fma(q{u}_{c}, k{c}, acc{u});\n")).collect::<String>(),
            bias = if shared_bias { "bj".to_string() } else { format!("ld_bias(boff{u} + j * bs)") },
        )),
        rescale = per_query(&|u| format!(
            "        let nm{u} = max(mx{u}, s{u});\n        let corr{u} = exp(mx{u} - nm{u});\n        mx{u} = nm{u};\n"
        )),
        v = row_vec4s("v")
            + &per_query(&|u| format!(
                "        let p{u} = exp(s{u} - mx{u});\n        l{u} = l{u} * corr{u} + p{u};\n        let pv{u} = vec4<f32>(p{u});\n"
            )),
        acc = each(&|u, c| format!("        o{u}_{c} = fma(pv{u}, v{c}, o{u}_{c} * corr{u});\n")),
        store = per_query(&|u| format!(
            "    if (i0 + {u}u * QG < T) {{\n        let r{u} = 1.0 / l{u};\n{}    }}\n",
            (0..dv).map(|c| format!("        store4((bh * T + i0 + {u}u * QG) * D, {c}u, o{u}_{c} * r{u});\n")).collect::<String>()
        )),
    )
}
