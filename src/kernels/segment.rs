//! Kernels over table rows: segment reductions (`shaders/segment_reduce.wgsl`), in-place
//! row writes (`shaders/scatter_rows.wgsl`) and top-k (`shaders/topk.wgsl`). Each fuses
//! its input expressions through the code generator.

use super::codegen::{Gen, Ix};
use super::{fold_groups, header, sources, KernelSpec, ShaderCaps};
use crate::graph::{Op, ReduceOp, RowRule};
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
    if let Some(spec) = render_segment_sum_quads(root, is_leaf, caps)? {
        return Ok(spec);
    }
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

/// The f32 buffer `[R, D]` whose rows `values` ([N, D], D a multiple of 4) are: itself,
/// or gathered from it by index_select along rows (once or several times over, and
/// through reshapes to other row counts).
fn gathered_rows(values: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool) -> Option<Tensor> {
    let d = *values.dims().get(1)?;
    let mut t = values.clone();
    loop {
        if t.rank() != 2 || t.dims()[1] != d || d == 0 || !d.is_multiple_of(4) || t.dtype() != DType::F32 {
            return None;
        }
        if is_leaf(&t) {
            return Some(t);
        }
        // A reshape that keeps rows of D (their values in order) is read through.
        if !matches!(t.op(), Op::IndexSelect { axis: 0 } | Op::Reshape) {
            return None;
        }
        let source = t.node().inputs[0].clone();
        t = source;
    }
}

/// [`render_segment`]'s sum a quad at a time (`shaders/segment_sum_vec4.wgsl`), for
/// f32 values that are rows of a buffer gathered along rows (an EmbeddingBag's
/// forward, its gradient's sum per distinct row). `None` otherwise.
fn render_segment_sum_quads(
    root: &Tensor,
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
) -> Result<Option<KernelSpec>> {
    let Op::SegmentReduce { op: ReduceOp::Sum } = root.op() else { return Ok(None) };
    let ins = &root.node().inputs;
    let (values, offsets) = (&ins[0], &ins[1]);
    let Some(table) = gathered_rows(values, is_leaf).filter(|_| root.dtype() == DType::F32) else { return Ok(None) };
    let d = values.dims()[1];
    let mut g = Gen::new(*caps, is_leaf);
    g.slot((root.numel() / 4) as u32);
    g.slot(d as u32);
    g.slot(values.dims()[0] as u32);
    g.quad_read = Some(table.id());
    let v = g.eval(values, &Ix::lin("i"), false);
    let value_body = g.take_function_body();
    let o = g.eval(offsets, &Ix::lin("j"), false);
    let offset_body = g.take_function_body();
    let functions = format!(
        "fn seg_value4(i: u32) -> vec4<f32> {{\n{value_body}    return {v};\n}}\n\
         fn seg_offset(j: u32) -> i32 {{\n{offset_body}    return i32({o});\n}}\n"
    );
    let mut src = super::header_with_out(g.meta.len(), "vec4<f32>", g.uses_f16, &g.caps);
    src.push_str(&g.leaf_decls());
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&functions);
    src.push_str(sources::SEGMENT_SUM_VEC4);
    let label = "segment_sum_vec4".to_string();
    let workgroups = fold_groups((root.numel() as u64 / 4).div_ceil(64), caps, &label)?;
    Ok(Some(g.finish(label, src, root, workgroups)))
}

/// Append `fn {name}({var}: u32) -> {ty}`, the value of `t` at linear index `var`.
fn value_fn(g: &mut Gen, functions: &mut String, name: &str, var: &str, t: &Tensor, ty: &str) {
    let v = g.eval(t, &Ix::lin(var), false);
    let body = g.take_function_body();
    functions.push_str(&format!("fn {name}({var}: u32) -> {ty} {{\n{body}    return {ty}({v});\n}}\n"));
}

/// Append a row write's `fn gate_open() -> bool`: whether `gate` (none: always) is open.
fn gate_fn(g: &mut Gen, functions: &mut String, gate: Option<&Tensor>) {
    match gate {
        Some(t) => {
            value_fn(g, functions, "gate_value", "z", t, "f32");
            functions.push_str("fn gate_open() -> bool {\n    return gate_value(0u) != 0.0;\n}\n");
        }
        None => functions.push_str("fn gate_open() -> bool {\n    return true;\n}\n"),
    }
}

/// Render `Op::ScatterRows` producing `root`: the output is the table's own buffer
/// ([`KernelSpec::alias`]), which the kernel reads only for the rows it rewrites. Each
/// operand is a generated function: `src_value(i)` (per element of the `[U, D]` rows),
/// `num_value`/`den_value(k)` (a table's element `k`), `hyper(j)` and `gate_value`;
/// `new_value(i, k)` applies the rule.
pub fn render_scatter(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<KernelSpec> {
    if let Some(spec) = render_scatter_quads(root, is_leaf, caps)? {
        return Ok(spec);
    }
    let Op::ScatterRows { rule, gated } = *root.op() else { unreachable!("scatter kernels root a row write") };
    let ins = &root.node().inputs;
    let (table, rows) = (&ins[0], &ins[1]);
    let d = table.dims()[1];
    let u = rows.numel();
    let mut g = Gen::new(*caps, is_leaf);
    g.slot((u * d) as u32);
    g.slot(d as u32);
    g.slot(table.dims()[0] as u32);
    let mut functions = String::new();
    let mut function =
        |g: &mut Gen, name: &str, var: &str, t: &Tensor, ty: &str| value_fn(g, &mut functions, name, var, t, ty);
    function(&mut g, "row_of", "u", rows, "i32");
    let new_value = match rule {
        RowRule::Replace => {
            function(&mut g, "src_value", "i", &ins[2], "f32");
            "return src_value(i);".to_string()
        }
        RowRule::Accumulate { square } => {
            function(&mut g, "src_value", "i", &ins[2], "f32");
            function(&mut g, "hyper", "j", &ins[3], "f32");
            let x = if square { "g * g" } else { "g" };
            format!("let g = src_value(i);\n    return hyper(0u) * out[k] + hyper(1u) * {x};")
        }
        RowRule::Step { num_rows } => {
            function(&mut g, "num_value", "k", &ins[2], "f32");
            function(&mut g, "den_value", "k", &ins[3], "f32");
            function(&mut g, "hyper", "j", &ins[4], "f32");
            let n = if num_rows { "num_value(k)" } else { "num_value(i)" };
            format!("return out[k] - hyper(0u) * {n} / (sqrt(den_value(k)) + hyper(1u));")
        }
    };
    gate_fn(&mut g, &mut functions, gated.then(|| &ins[ins.len() - 1]));
    functions.push_str(&format!("fn new_value(i: u32, k: u32) -> f32 {{\n    {new_value}\n}}\n"));
    let src = source(&g, root, &functions, sources::SCATTER_ROWS);
    let label = root.op().name();
    let workgroups = fold_groups(((u * d) as u64).div_ceil(64), caps, &label)?;
    let mut spec = g.finish(label, src, root, workgroups);
    spec.alias = Some(table.clone());
    Ok(spec)
}

/// [`render_scatter`] a quad at a time (`shaders/scatter_rows_vec4.wgsl`), for an f32
/// table with rows a multiple of 4 long whose value operands (the rows' values, a
/// step's numerator and denominator) are buffers (f32, as every operand of a row
/// write is), not fused expressions. `None` otherwise.
fn render_scatter_quads(
    root: &Tensor,
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
) -> Result<Option<KernelSpec>> {
    let Op::ScatterRows { rule, gated } = *root.op() else { unreachable!("scatter kernels root a row write") };
    let ins = &root.node().inputs;
    let (table, rows) = (&ins[0], &ins[1]);
    let d = table.dims()[1];
    let values = match rule {
        RowRule::Replace | RowRule::Accumulate { .. } => 1,
        RowRule::Step { .. } => 2,
    };
    let quads = |t: &Tensor| is_leaf(t) && t.dtype() == DType::F32 && t.rank() == 2 && t.dims()[1] == d;
    if root.dtype() != DType::F32 || d == 0 || !d.is_multiple_of(4) || !ins[2..2 + values].iter().all(quads) {
        return Ok(None);
    }
    let u = rows.numel();
    let mut g = Gen::new(*caps, is_leaf);
    g.slot((u * d / 4) as u32);
    g.slot((d / 4) as u32);
    g.slot(table.dims()[0] as u32);
    let mut functions = String::new();
    let mut function =
        |g: &mut Gen, name: &str, var: &str, t: &Tensor, ty: &str| value_fn(g, &mut functions, name, var, t, ty);
    function(&mut g, "row_of", "u", rows, "i32");
    if rule != RowRule::Replace {
        function(&mut g, "hyper", "j", &ins[2 + values], "f32");
    }
    gate_fn(&mut g, &mut functions, gated.then(|| &ins[ins.len() - 1]));
    let mut quad = |t: &Tensor| g.quad_leaf(t).map(|k| format!("ld{k}q"));
    let (Some(a), b) = (quad(&ins[2]), if values == 2 { quad(&ins[3]) } else { None }) else { return Ok(None) };
    let new_quad = match rule {
        RowRule::Replace => format!("return {a}(q);"),
        RowRule::Accumulate { square } => {
            let x = if square { "g * g" } else { "g" };
            format!("let g = {a}(q);\n    return hyper(0u) * out[kq] + hyper(1u) * {x};")
        }
        RowRule::Step { num_rows } => {
            let Some(b) = b else { return Ok(None) };
            let n = if num_rows { "kq" } else { "q" };
            format!("return out[kq] - hyper(0u) * {a}({n}) / (sqrt({b}(kq)) + hyper(1u));")
        }
    };
    functions.push_str(&format!("fn new_quad(q: u32, kq: u32) -> vec4<f32> {{\n    {new_quad}\n}}\n"));
    let mut src = super::header_with_out(g.meta.len(), "vec4<f32>", g.uses_f16, &g.caps);
    src.push_str(&g.leaf_decls());
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&functions);
    src.push_str(sources::SCATTER_ROWS_VEC4);
    let label = format!("{}_vec4", root.op().name());
    let workgroups = fold_groups(((u * d / 4) as u64).div_ceil(64), caps, &label)?;
    let mut spec = g.finish(label, src, root, workgroups);
    spec.alias = Some(table.clone());
    Ok(Some(spec))
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
