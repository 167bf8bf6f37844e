//! Layer and RMS normalisation over the last axis (`Op::Norm`, `shaders/norm.wgsl`), with
//! the affine weight and bias applied in the same kernel.

use super::{fold_groups, header, header_with_out, quad_input_or_texture, sources, KernelSpec, ShaderCaps};
use crate::graph::Op;
use crate::{Result, Tensor};

/// Lanes per row.
const RW: u32 = 64;

/// Render the normalisation producing `root` from the buffers of its inputs `(x, w?, b?)`.
pub fn render(root: &Tensor, inputs: Vec<Tensor>, caps: &ShaderCaps) -> Result<KernelSpec> {
    let Op::Norm { rms, eps, weight, bias } = root.node().op else { unreachable!("norm::render takes a norm node") };
    let d = root.dims().last().copied().unwrap_or(1);
    let rows = root.numel().checked_div(d).unwrap_or(0);
    let meta = vec![d as u32, rows as u32, (eps as f32).to_bits()];
    let f16_in = inputs.iter().any(|t| t.dtype() == crate::DType::F16);
    // On CPU adapters, one invocation per row without barriers (`norm_rows.wgsl`),
    // ROWS_PER_GROUP rows to a workgroup; elsewhere a workgroup of RW lanes per row.
    let per_row = caps.direct_matmul && std::env::var("TESSERA_NORM_ROWS").as_deref() != Ok("0");
    // Rows of a multiple of 4 values go a quad at a time (`norm_rows_vec4.wgsl`;
    // lavapipe, layer norm over 1024 rows of 1024, two interleaved runs: 7.5 and 6.5 ->
    // 3.4 and 3.9 ms).
    let quads = per_row && d % 4 == 0;
    // Quads come from operand textures where the adapter allows (`ShaderCaps::texture_rows`):
    // lavapipe fetches a texel without the loop over SIMD lanes that a storage load runs.
    let mut textured = 0u32;
    let (mut src, q) = if quads {
        let mut loads = String::new();
        for (k, t) in inputs.iter().enumerate() {
            let (load, tex) = quad_input_or_texture(k, t, caps);
            loads.push_str(&load);
            textured |= u32::from(tex) << k;
        }
        (header_with_out(meta.len(), "vec4<f32>", f16_in, caps) + &loads, "q")
    } else {
        (header(meta.len(), root.dtype(), f16_in, caps) + &super::input_loads(&inputs, caps), "")
    };
    // The bias is input 1 when there is no weight: name the loads by role.
    let (w_at, b_at) = (weight.then_some(1), bias.then_some(1 + usize::from(weight)));
    let ty = if quads { "vec4<f32>" } else { "f32" };
    for (name, at) in [("ldw", w_at), ("ldb", b_at)] {
        match at {
            Some(k) => src.push_str(&format!("fn {name}{q}(i: u32) -> {ty} {{ return ld{k}{q}(i); }}\n")),
            None => src.push_str(&format!("fn {name}{q}(i: u32) -> {ty} {{ return {ty}(0.0); }}\n")),
        }
    }
    let lanes = if per_row { super::softmax::ROWS_PER_GROUP } else { RW };
    src.push_str(&format!("const RW: u32 = {lanes}u;\nconst RMS: bool = {rms};\nconst HAS_W: bool = {weight};\nconst HAS_B: bool = {bias};\n"));
    let (kernel, suffix) =
        super::softmax::row_variant(per_row, quads, [sources::NORM_ROWS_VEC4, sources::NORM_ROWS, sources::NORM]);
    src.push_str(kernel);
    // Quads: the outputs and entry point (`norm_store.wgsl`), sharing the affine's quads
    // by shuffles where subgroups have 8 lanes, the workgroup's (native only;
    // `norm_store_subgroup.wgsl`). Lavapipe, MiniLM's layer norm over 640 rows of 384 in
    // a batch of 32, median kernel time: 0.47-0.49 against 0.65 ms, with the single pass
    // for both sums.
    let shared = cfg!(not(target_arch = "wasm32"))
        && quads
        && caps.subgroup_min >= 8
        && std::env::var("TESSERA_NORM_SHARED").as_deref() != Ok("0");
    if quads {
        src.push_str(if shared { sources::NORM_STORE_SUBGROUP } else { sources::NORM_STORE });
    }
    let suffix = if shared { "_rows4_sg" } else { suffix };
    let tex = if textured != 0 { "_tex" } else { "" };
    let label = format!("{}{suffix}{tex}", if rms { "rms_norm" } else { "layer_norm" });
    let groups = if per_row { (rows as u64).div_ceil(lanes as u64) } else { rows as u64 };
    let workgroups = fold_groups(groups, caps, &label)?;
    let mut spec = KernelSpec::hand_written(label, src, meta, inputs, root, workgroups, false);
    spec.textured = textured;
    Ok(spec)
}
