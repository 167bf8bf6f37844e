//! Kernels over table rows: segment reductions (`shaders/segment_reduce.wgsl`), in-place
//! row writes (`shaders/scatter_rows.wgsl`) and top-k (`shaders/topk.wgsl`). Each fuses
//! its input expressions through the code generator.

use super::codegen::{Gen, Ix};
use super::{fold_groups, header, sources, KernelSpec, ShaderCaps};
use crate::graph::{Op, ReduceOp};
use crate::{DType, Result, Tensor};

/// The whole source: header, bindings, support code, then `functions` (the generated
/// WGSL functions and constants the file uses) and the file itself.
fn source(g: &Gen, root: &Tensor, functions: &str, file: &str) -> String {
    let mut src = header(g.meta.len(), root.dtype(), g.uses_f16, &g.caps);
    src.push_str(&g.leaf_decls());
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(functions);
    src.push_str(file);
    src
}

/// Render `Op::SegmentReduce` producing `root`.
pub fn render_segment(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<KernelSpec> {
    let Op::SegmentReduce { op } = root.op() else { unreachable!("segment kernels root a segment reduction") };
    let ins = &root.node().inputs;
    let (values, offsets) = (&ins[0], &ins[1]);
    let d = values.dims()[1];
    let mut g = Gen::new(*caps, is_leaf);
    g.slot(root.numel() as u32);
    g.slot(d as u32);
    g.slot(values.dims()[0] as u32);
    let v = g.eval(values, &Ix::lin("i"), false);
    let value_body = g.take_function_body();
    let o = g.eval(offsets, &Ix::lin("j"), false);
    let offset_body = g.take_function_body();
    let mode = match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 1,
        _ => 2,
    };
    let store = if root.dtype() == DType::I32 { "out[i] = at;" } else { "out[i] = v;" };
    let functions = format!(
        "fn seg_value(i: u32) -> f32 {{\n{value_body}    return f32({v});\n}}\n\
         fn seg_offset(j: u32) -> i32 {{\n{offset_body}    return i32({o});\n}}\n\
         fn store_seg(i: u32, v: f32, at: i32) {{\n    {store}\n}}\nconst MODE: u32 = {mode}u;\n"
    );
    let src = source(&g, root, &functions, sources::SEGMENT_REDUCE);
    let label = format!("segment_{op:?}").to_lowercase();
    let workgroups = fold_groups((root.numel() as u64).div_ceil(64), caps, &label)?;
    Ok(g.finish(label, src, root, workgroups))
}

/// Render `Op::ScatterRows` producing `root`: the output is the table's own buffer
/// ([`KernelSpec::alias`]), which the kernel does not read.
pub fn render_scatter(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<KernelSpec> {
    let ins = &root.node().inputs;
    let (table, rows, src_rows) = (&ins[0], &ins[1], &ins[2]);
    let d = table.dims()[1];
    let mut g = Gen::new(*caps, is_leaf);
    g.slot(src_rows.numel() as u32);
    g.slot(d as u32);
    g.slot(table.dims()[0] as u32);
    let v = g.eval(src_rows, &Ix::lin("i"), false);
    let value_body = g.take_function_body();
    let r = g.eval(rows, &Ix::lin("u"), false);
    let row_body = g.take_function_body();
    let functions = format!(
        "fn src_value(i: u32) -> f32 {{\n{value_body}    return f32({v});\n}}\n\
         fn row_of(u: u32) -> i32 {{\n{row_body}    return i32({r});\n}}\n"
    );
    let src = source(&g, root, &functions, sources::SCATTER_ROWS);
    let label = "scatter_rows".to_string();
    let workgroups = fold_groups((src_rows.numel() as u64).div_ceil(64), caps, &label)?;
    let mut spec = g.finish(label, src, root, workgroups);
    spec.alias = Some(table.clone());
    Ok(spec)
}

/// Render `Op::TopK` producing `root`.
pub fn render_topk(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<KernelSpec> {
    let Op::TopK { k } = root.op() else { unreachable!("top-k kernels root a top-k") };
    let x = &root.node().inputs[0];
    let n = x.dims().last().copied().unwrap_or(1);
    let rows = x.numel() / n.max(1);
    let mut g = Gen::new(*caps, is_leaf);
    g.slot(rows as u32);
    g.slot(n as u32);
    let v = g.eval(x, &Ix::lin("i"), false);
    let body = g.take_function_body();
    let functions = format!("fn topk_input(i: u32) -> f32 {{\n{body}    return f32({v});\n}}\nconst K: u32 = {k}u;\n");
    let src = source(&g, root, &functions, sources::TOPK);
    let label = format!("topk_{k}");
    let workgroups = fold_groups((rows as u64).div_ceil(64), caps, &label)?;
    Ok(g.finish(label, src, root, workgroups))
}
