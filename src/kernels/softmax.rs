//! Softmax and log-softmax along one axis (`Op::Softmax`, `shaders/softmax.wgsl`): one
//! workgroup per row, one pass for the max, one for the sum, one for the outputs. On CPU
//! adapters (the direct-matmul choice) one invocation per row instead, without barriers
//! (`shaders/softmax_rows.wgsl`) for rows of 64 or more and enough of them.

use super::{fold_groups, header, sources, KernelSpec, ShaderCaps};
use crate::graph::Op;
use crate::{Result, Tensor};

/// Lanes per row.
const RW: u32 = 64;

/// Render the softmax producing `root` from `inputs`: the buffer holding its input.
pub fn render(root: &Tensor, inputs: Vec<Tensor>, caps: &ShaderCaps) -> Result<KernelSpec> {
    let Op::Softmax { axis, log } = root.node().op else { unreachable!("softmax::render takes a softmax node") };
    let dims = root.dims();
    let a = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let rows = root.numel().checked_div(a).unwrap_or(0);
    let meta = vec![a as u32, inner as u32, rows as u32];
    let f16_in = inputs.iter().any(|t| t.dtype() == crate::DType::F16);
    let mut src = header(meta.len(), root.dtype(), f16_in, caps);
    src.push_str(&super::input_loads(&inputs, caps));
    src.push_str(&format!("const RW: u32 = {RW}u;\nconst LOG: bool = {log};\n"));
    src.push_str(sources::COMMON);
    // Measured on lavapipe (ms, workgroup per row -> invocation per row): 1536x128
    // 6.1 -> 1.9, 6144x512 38.9 -> 15.6, 512x256 2.5 -> 0.6; but rows shorter than 64
    // ran slower and erratically (1536x32: 5.2 -> 40), and fewer than 4 workgroups of
    // rows leave cores idle (64x1024: 0.7 -> 1.4).
    let per_row = caps.direct_matmul
        && a >= 64
        && rows >= 4 * RW as usize
        && std::env::var("TESSERA_SOFTMAX_ROWS").as_deref() != Ok("0");
    src.push_str(if per_row { sources::SOFTMAX_ROWS } else { sources::SOFTMAX });
    let label = if log { "log_softmax" } else { "softmax" }.to_string();
    let groups = if per_row { (rows as u64).div_ceil(RW as u64) } else { rows as u64 };
    let workgroups = fold_groups(groups, caps, &label)?;
    Ok(KernelSpec::hand_written(label, src, meta, inputs, root, workgroups, false))
}
