//! Softmax and log-softmax along one axis (`Op::Softmax`, `shaders/softmax.wgsl`): one
//! workgroup per row, one pass for the max, one for the sum, one for the outputs.

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
    src.push_str(sources::SOFTMAX);
    let label = if log { "log_softmax" } else { "softmax" }.to_string();
    let workgroups = fold_groups(rows as u64, caps, &label)?;
    Ok(KernelSpec::hand_written(label, src, meta, inputs, root, workgroups, false))
}
