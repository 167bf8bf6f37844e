//! Softmax and log-softmax along one axis (`Op::Softmax`, `shaders/softmax.wgsl`): one
//! workgroup per row, one pass for the max, one for the sum, one for the outputs. On CPU
//! adapters (the direct-matmul choice) one invocation per row instead, without barriers
//! (`shaders/softmax_rows.wgsl`).

use super::{fold_groups, header, header_with_out, quad_input_or_texture, sources, KernelSpec, ShaderCaps};
use crate::graph::Op;
use crate::{Result, Tensor};

/// Lanes per row.
const RW: u32 = 64;

/// Rows per workgroup of the one-invocation-per-row kernels (softmax, norms): one SIMD
/// width of lavapipe, so a few rows still spread over the adapter's threads.
pub(crate) const ROWS_PER_GROUP: u32 = 8;

/// The shader of a row kernel and its label's suffix: over quads (`_rows4`), one
/// invocation per row (`_rows`, CPU adapters), or a workgroup per row.
pub(crate) fn row_variant(
    per_row: bool,
    quads: bool,
    [vec4, rows, group]: [&'static str; 3],
) -> (&'static str, &'static str) {
    match (per_row, quads) {
        (true, true) => (vec4, "_rows4"),
        (true, false) => (rows, "_rows"),
        _ => (group, ""),
    }
}

/// Render the softmax producing `root` from `inputs`: the buffer holding its input.
pub fn render(root: &Tensor, inputs: Vec<Tensor>, caps: &ShaderCaps) -> Result<KernelSpec> {
    let Op::Softmax { axis, log } = root.node().op else { unreachable!("softmax::render takes a softmax node") };
    let dims = root.dims();
    let a = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let rows = root.numel().checked_div(a).unwrap_or(0);
    let meta = vec![a as u32, inner as u32, rows as u32];
    let f16_in = inputs.iter().any(|t| t.dtype() == crate::DType::F16);
    // Measured on lavapipe (ms, workgroup per row -> invocation per row): 1536x128
    // 6.1 -> 1.9, 6144x512 38.9 -> 15.6, 512x256 2.5 -> 0.6. (Short rows once looked
    // slow and erratic with this kernel: lavapipe recompiled it at every dispatch with
    // the row length inlined, which the header's `m` now prevents.)
    let per_row = caps.direct_matmul && std::env::var("TESSERA_SOFTMAX_ROWS").as_deref() != Ok("0");
    // Contiguous rows of a multiple of 4 values go a quad at a time (lavapipe, 1024 rows
    // of 1024, two interleaved runs: 9.3 and 7.8 -> 4.4 and 3.9 ms).
    let quads = per_row && inner == 1 && a.is_multiple_of(4);
    // Quads come from an operand texture where the adapter allows
    // (`ShaderCaps::texture_rows`): the row is read three times.
    let mut textured = 0;
    let mut src = if quads {
        let (load, tex) = quad_input_or_texture(0, &inputs[0], caps);
        textured = u32::from(tex);
        header_with_out(meta.len(), "vec4<f32>", f16_in, caps) + &load
    } else {
        header(meta.len(), root.dtype(), f16_in, caps) + &super::input_loads(&inputs, caps)
    };
    let lanes = if per_row { ROWS_PER_GROUP } else { RW };
    src.push_str(&format!("const RW: u32 = {lanes}u;\nconst LOG: bool = {log};\n"));
    src.push_str(sources::COMMON);
    let (kernel, suffix) =
        row_variant(per_row, quads, [sources::SOFTMAX_ROWS_VEC4, sources::SOFTMAX_ROWS, sources::SOFTMAX]);
    src.push_str(kernel);
    let tex = if textured != 0 { "_tex" } else { "" };
    let label = format!("{}{suffix}{tex}", if log { "log_softmax" } else { "softmax" });
    let groups = if per_row { (rows as u64).div_ceil(lanes as u64) } else { rows as u64 };
    let workgroups = fold_groups(groups, caps, &label)?;
    let mut spec = KernelSpec::hand_written(label, src, meta, inputs, root, workgroups, false);
    spec.textured = textured;
    Ok(spec)
}
