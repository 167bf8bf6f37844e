//! Layer and RMS normalisation over the last axis (`Op::Norm`, `shaders/norm.wgsl`), with
//! the affine weight and bias applied in the same kernel.

use super::{fold_groups, header, sources, KernelSpec, ShaderCaps};
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
    let mut src = header(meta.len(), root.dtype(), f16_in, caps);
    src.push_str(&super::input_loads(&inputs, caps));
    // The bias is input 1 when there is no weight: name the loads by role.
    let (w_at, b_at) = (weight.then_some(1), bias.then_some(1 + usize::from(weight)));
    for (name, at) in [("ldw", w_at), ("ldb", b_at)] {
        match at {
            Some(k) => src.push_str(&format!("fn {name}(i: u32) -> f32 {{ return ld{k}(i); }}\n")),
            None => src.push_str(&format!("fn {name}(i: u32) -> f32 {{ return 0.0; }}\n")),
        }
    }
    // On CPU adapters, one invocation per row without barriers (`norm_rows.wgsl`),
    // ROWS_PER_GROUP rows to a workgroup; elsewhere a workgroup of RW lanes per row.
    let per_row = caps.direct_matmul && std::env::var("TESSERA_NORM_ROWS").as_deref() != Ok("0");
    let lanes = if per_row { super::softmax::ROWS_PER_GROUP } else { RW };
    src.push_str(&format!("const RW: u32 = {lanes}u;\nconst RMS: bool = {rms};\nconst HAS_W: bool = {weight};\nconst HAS_B: bool = {bias};\n"));
    src.push_str(if per_row { sources::NORM_ROWS } else { sources::NORM });
    let label = if rms { "rms_norm" } else { "layer_norm" }.to_string();
    let label = if per_row { format!("{label}_rows") } else { label };
    let groups = if per_row { (rows as u64).div_ceil(lanes as u64) } else { rows as u64 };
    let workgroups = fold_groups(groups, caps, &label)?;
    Ok(KernelSpec::hand_written(label, src, meta, inputs, root, workgroups, false))
}
