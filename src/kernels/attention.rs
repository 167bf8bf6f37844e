//! Fused scaled-dot-product attention (`shaders/attention.wgsl`): `Op::Attention`
//! rendered as one kernel, its K/V tiles staged in workgroup memory.

use super::{header, load_fn, sources, KernelSpec, ShaderCaps};
use crate::{DType, Error, Result, Tensor};

/// Largest head dim the fused kernel takes (q and the output row live in registers).
pub const MAX_HEAD_DIM: usize = 128;

/// Render the attention producing `root` from its operands' buffers `(q, k, v, bias)`.
pub fn render(root: &Tensor, inputs: Vec<Tensor>, caps: &ShaderCaps) -> Result<KernelSpec> {
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
    let mut src = header(meta.len(), out_dt, uses_f16, caps);
    // 4-aligned f32 rows load as vec4s; otherwise four guarded scalar loads.
    let vec = d % 4 == 0 && inputs[..3].iter().all(|t| t.dtype() == DType::F32);
    for (k, (t, name)) in inputs.iter().zip(["q", "k", "v", "bias"]).enumerate() {
        if vec && k < 3 {
            src.push_str(&format!(
                "@group(0) @binding({}) var<storage, read> in{k}: array<vec4<f32>>;\n\
                 fn ld_{name}4(base: u32, c: u32) -> vec4<f32> {{ return in{k}[(base >> 2u) + c]; }}\n",
                2 + k
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
    src.push_str(&store_fn(out_dt, caps));
    src.push_str(sources::ATTENTION);
    let bh: usize = lead.iter().product();
    let label = format!(
        "attention_{}_d{d}{}{}",
        ins[0].dtype(),
        if causal { "_causal" } else { "" },
        if has_bias { "_mask" } else { "" }
    );
    let max = caps.max_workgroups as usize;
    let gx = t.div_ceil(qw);
    // Heads over y, folded into z past the per-dimension limit.
    let gy = bh.min(max);
    let gz = bh.div_ceil(gy.max(1));
    if gx > max || gz > max || gy * gz != bh {
        return Err(Error::Limit { what: format!("{label}: workgroups"), needed: (gx * bh) as u64, limit: max as u64 });
    }
    let workgroups = if t == 0 || bh == 0 || d == 0 { [0, 1, 1] } else { [gx as u32, gy as u32, gz as u32] };
    Ok(KernelSpec::hand_written(label, src, meta, inputs, root, workgroups, false))
}

/// `store4(base, c, v)`: values `4c .. 4c + 3` (those below D) of the output row starting
/// at element `base`, in the output's storage (pairs packed into `u32`s for the f16
/// fallback, where D is even). Rows are stored a vec4 at a time: passing the whole row
/// array to a function made llvmpipe's GL compiler take minutes.
fn store_fn(dt: DType, caps: &ShaderCaps) -> String {
    let body = match dt {
        DType::F16 if !caps.native_f16 => {
            "    let w = (base + 4u * c) / 2u;\n    out[w] = pack2x16float(v.xy);\n    if (4u * c + 2u < D) {\n        out[w + 1u] = pack2x16float(v.zw);\n    }\n"
        }
        DType::F16 => "    for (var t = 0u; t < 4u; t = t + 1u) {\n        if (4u * c + t < D) {\n            out[base + 4u * c + t] = f16(v[t]);\n        }\n    }\n",
        _ => "    for (var t = 0u; t < 4u; t = t + 1u) {\n        if (4u * c + t < D) {\n            out[base + 4u * c + t] = v[t];\n        }\n    }\n",
    };
    format!("fn store4(base: u32, c: u32, v: vec4<f32>) {{\n{body}}}\n")
}
