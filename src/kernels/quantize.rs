//! Quantisation on the device (`Op::Quantize`, `shaders/quantize.wgsl`): f32 or f16
//! values, with the expression producing them fused in, into Q8_0 or Q4_0 blocks in the
//! GPU layout, two blocks per invocation.

use super::codegen::{Gen, Ix};
use super::{fold_groups, header, sources, KernelSpec, ShaderCaps};
use crate::{DType, Result, Tensor};

/// Render the quantisation producing `root` (an `Op::Quantize` node).
pub fn render(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<KernelSpec> {
    let x = &root.node().inputs[0];
    let blocks = root.numel() / crate::quant::BLOCK;
    let mut g = Gen::new(*caps, is_leaf);
    g.slot(blocks as u32);
    g.slot(crate::quant::gpu_quant_offset_words(root.numel()) as u32);
    let v = g.eval(x, &Ix::lin("i"), false);
    let body = std::mem::take(&mut g.body);
    let mut src = header(g.meta.len(), root.dtype(), g.uses_f16, caps);
    src.push_str(&g.leaf_decls());
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&format!("fn quant_input(i: u32) -> f32 {{\n{body}    return f32({v});\n}}\n"));
    src.push_str(&format!("const Q4: bool = {};\n", root.dtype() == DType::Q4_0));
    src.push_str(sources::QUANTIZE);
    let label = format!("quantize_{}_{}", x.dtype(), root.dtype());
    let workgroups = fold_groups((blocks as u64).div_ceil(2 * 64), caps, &label)?;
    Ok(g.finish(label, src, root, workgroups))
}
