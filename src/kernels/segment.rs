//! Kernels over table rows: segment reductions (`shaders/segment_reduce.wgsl`), in-place
//! row writes (`shaders/scatter_rows.wgsl`) and top-k (`shaders/topk.wgsl`). Each fuses
//! its input expressions through the code generator.

use super::codegen::{Gen, Ix};
use super::{fold_groups, header, sources, KernelSpec, ShaderCaps};
use crate::graph::schedule::gathered_rows;
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
    let d = values.dims()[1];
    let quads = |(t, _): &(Tensor, Vec<Tensor>)| t.dtype() == DType::F32 && d.is_multiple_of(4);
    let Some((table, _)) = gathered_rows(values, is_leaf).filter(quads).filter(|_| root.dtype() == DType::F32) else {
        return Ok(None);
    };
    let segments = root.numel() / d.max(1);
    let mut g = Gen::new(*caps, is_leaf);
    g.slot((root.numel() / 4) as u32);
    g.slot(d as u32);
    g.slot(values.dims()[0] as u32);
    g.slot(segments as u32);
    g.quad_reads.insert(table.id());
    let v = g.eval(values, &Ix::lin("i"), false);
    let value_body = g.take_function_body();
    let o = g.eval(offsets, &Ix::lin("j"), false);
    let offset_body = g.take_function_body();
    let functions = format!(
        "fn seg_value4(i: u32) -> vec4<f32> {{\n{value_body}    return {v};\n}}\n\
         fn seg_offset(j: u32) -> i32 {{\n{offset_body}    return i32({o});\n}}\n\
         const ROW_LANES: bool = {};\n",
        row_lanes(caps)
    );
    let mut src = super::header_with_out(g.meta.len(), "vec4<f32>", g.uses_f16, &g.caps);
    src.push_str(&g.leaf_decls());
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&functions);
    src.push_str(sources::SEGMENT_SUM_VEC4);
    let label = "segment_sum_vec4".to_string();
    let lanes = if row_lanes(caps) { segments } else { root.numel() / 4 };
    let workgroups = fold_groups((lanes as u64).div_ceil(64), caps, &label)?;
    Ok(Some(g.finish(label, src, root, workgroups)))
}

/// Whether the quad kernels give each invocation a whole row (`ROW_LANES` in
/// `segment_sum_vec4.wgsl` and `scatter_rows_vec4.wgsl`): on CPU adapters, where the
/// SIMD lanes of one access then reach as many table rows and their cache misses
/// overlap. Lavapipe, a sparse Adam step over 8,162 rows of three 330,000 x 32 tables
/// (kernel lab, 6 alternating runs): about 1.0 against 1.9-2.6 ms; over 5,600 rows of
/// 10,000-row tables, which stay in cache, the same 0.7 ms.
fn row_lanes(caps: &ShaderCaps) -> bool {
    caps.direct_matmul
}

/// Append `fn {name}({var}: u32) -> {ty}`, the value of `t` at linear index `var`.
fn value_fn(g: &mut Gen, functions: &mut String, name: &str, var: &str, t: &Tensor, ty: &str) {
    let v = g.eval(t, &Ix::lin(var), false);
    let body = g.take_function_body();
    functions.push_str(&format!("fn {name}({var}: u32) -> {ty} {{\n{body}    return {ty}({v});\n}}\n"));
}

/// Append a row write's `fn gate_open{suffix}() -> bool`: whether `gate` (none: always)
/// is open.
fn gate_fn(g: &mut Gen, functions: &mut String, gate: Option<&Tensor>, suffix: &str) {
    match gate {
        Some(t) => {
            value_fn(g, functions, &format!("gate_value{suffix}"), "z", t, "f32");
            functions.push_str(&format!(
                "fn gate_open{suffix}() -> bool {{\n    return gate_value{suffix}(0u) != 0.0;\n}}\n"
            ));
        }
        None => functions.push_str(&format!("fn gate_open{suffix}() -> bool {{\n    return true;\n}}\n")),
    }
}

/// Render `Op::ScatterRows` producing `root`: the output is the table's own buffer
/// ([`KernelSpec::alias`]), which the kernel reads only for the rows it rewrites. Each
/// operand is a generated function: `src_value(i)` (per element of the `[U, D]` rows),
/// `num_value`/`den_value(k)` (a table's element `k`), `hyper(j)` and `gate_value`;
/// `new_value(i, k)` applies the rule.
pub fn render_scatter(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<KernelSpec> {
    if let Some(spec) = render_scatter_quads(std::slice::from_ref(root), is_leaf, caps, usize::MAX)? {
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
    gate_fn(&mut g, &mut functions, gated.then(|| &ins[ins.len() - 1]), "");
    functions.push_str(&format!("fn new_value(i: u32, k: u32) -> f32 {{\n    {new_value}\n}}\n"));
    let src = source(&g, root, &functions, sources::SCATTER_ROWS);
    let label = root.op().name();
    let workgroups = fold_groups(((u * d) as u64).div_ceil(64), caps, &label)?;
    let mut spec = g.finish(label, src, root, workgroups);
    spec.alias = Some(table.clone());
    Ok(spec)
}

/// The kernels of row writes over the same rows that the scheduler grouped
/// ([`group_row_writes`](crate::graph::schedule::group_row_writes)): one kernel that
/// applies them all to each touched quad in turn, or, where that kernel does not apply,
/// one kernel per write in order. `max_inputs` bounds the inputs and further outputs.
pub fn render_row_writes(
    roots: &[Tensor],
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
    max_inputs: usize,
) -> Result<Vec<KernelSpec>> {
    if roots.len() > 1 {
        if let Some(spec) = render_scatter_quads(roots, is_leaf, caps, max_inputs)? {
            return Ok(vec![spec]);
        }
    }
    roots.iter().map(|r| render_scatter(r, is_leaf, caps)).collect()
}

/// Row writes a quad at a time (`shaders/scatter_rows_vec4.wgsl`): one write, or a
/// group over the same rows applied in turn to each touched quad, each write's table
/// its own output (the first `out`, the others `out{j}`, in place). Applies to f32
/// tables with rows a multiple of 4 long whose value operands (the rows' values, a
/// step's numerator and denominator) are buffers or, at the row written, an earlier
/// write of the group (its new quad, kept in a variable). `None` otherwise.
fn render_scatter_quads(
    roots: &[Tensor],
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
    max_inputs: usize,
) -> Result<Option<KernelSpec>> {
    let root = &roots[0];
    let (table, rows) = (&root.node().inputs[0], &root.node().inputs[1]);
    let d = table.dims()[1];
    let u = rows.numel();
    if root.dtype() != DType::F32 || d == 0 || !d.is_multiple_of(4) {
        return Ok(None);
    }
    let member = |t: &Tensor| roots.iter().position(|r| r.id() == t.id());
    let mut g = Gen::new(*caps, is_leaf);
    g.slot((u * d / 4) as u32);
    g.slot((d / 4) as u32);
    g.slot(table.dims()[0] as u32);
    g.slot(u as u32);
    let mut functions = format!("const ROW_LANES: bool = {};\n", row_lanes(caps));
    value_fn(&mut g, &mut functions, "row_of", "u", rows, "i32");
    // Each write's statements: its operands, new quad and store; and which writes a
    // later one reads (their new quads are kept in `w{j}`).
    let mut writes: Vec<(RowRule, String, String)> = Vec::new();
    let mut kept = vec![false; roots.len()];
    for (j, w) in roots.iter().enumerate() {
        let Op::ScatterRows { rule, gated } = *w.op() else { unreachable!("scatter kernels root a row write") };
        let ins = &w.node().inputs;
        let values = match rule {
            RowRule::Replace | RowRule::Accumulate { .. } => 1,
            RowRule::Step { .. } => 2,
        };
        if w.dtype() != DType::F32 || w.dims() != root.dims() {
            return Ok(None);
        }
        // A value operand: an earlier write's quad at the row, or a buffer's quads.
        let mut operand = |g: &mut Gen, i: usize| -> Option<String> {
            let t = &ins[2 + i];
            if let Some(p) = member(t) {
                if p >= j || !rule.reads_at_row(i) {
                    return None;
                }
                kept[p] = true;
                return Some(format!("w{p}"));
            }
            let at = if rule.reads_at_row(i) { "kq" } else { "q" };
            let quads = t.dtype() == DType::F32 && t.rank() == 2 && t.dims()[1] == d;
            quads.then(|| g.quad_leaf(t)).flatten().map(|k| format!("ld{k}q({at})"))
        };
        let Some(a) = operand(&mut g, 0) else { return Ok(None) };
        let mut lets = format!("        let a{j} = {a};\n");
        if values == 2 {
            let Some(b) = operand(&mut g, 1) else { return Ok(None) };
            lets.push_str(&format!("        let b{j} = {b};\n"));
        }
        if rule != RowRule::Replace {
            value_fn(&mut g, &mut functions, &format!("hyper{j}"), "j", &ins[2 + values], "f32");
        }
        gate_fn(&mut g, &mut functions, gated.then(|| &ins[ins.len() - 1]), &j.to_string());
        let new_quad = match rule {
            RowRule::Replace => format!("a{j}"),
            RowRule::Accumulate { square } => {
                let x = if square { format!("a{j} * a{j}") } else { format!("a{j}") };
                format!("hyper{j}(0u) * o{j} + hyper{j}(1u) * {x}")
            }
            RowRule::Step { .. } => format!("o{j} - hyper{j}(0u) * a{j} / (sqrt(b{j}) + hyper{j}(1u))"),
        };
        writes.push((rule, lets, new_quad));
    }
    let leaves = g.leaves.len();
    if roots.len() > 1 && (!g.checks.is_empty() || leaves + roots.len() > max_inputs) {
        return Ok(None);
    }
    // Every old quad a rule or a later write needs, loaded before any store; then per
    // write, with its gate open, its new quad stored. `w{j}` is what a later write
    // reads at the row.
    let out = |j: usize| if j == 0 { "out".to_string() } else { format!("out{j}") };
    let mut body = String::new();
    for (j, (rule, ..)) in writes.iter().enumerate() {
        match *rule != RowRule::Replace || kept[j] {
            true => body.push_str(&format!("    let o{j} = {}[kq];\n    var w{j} = o{j};\n", out(j))),
            false => body.push_str(&format!("    var w{j} = vec4<f32>();\n")),
        }
    }
    for (j, (_, lets, new_quad)) in writes.iter().enumerate() {
        body.push_str(&format!(
            "    if (gate_open{j}()) {{\n{lets}        w{j} = {new_quad};\n        {}[kq] = w{j};\n    }}\n",
            out(j)
        ));
    }
    functions.push_str(&format!("fn write_quads(q: u32, kq: u32) {{\n{body}}}\n"));
    let mut src = super::header_with_out(g.meta.len(), "vec4<f32>", g.uses_f16, &g.caps);
    src.push_str(&g.leaf_decls());
    for j in 1..roots.len() {
        src.push_str(&format!(
            "@group(0) @binding({}) var<storage, read_write> out{j}: array<vec4<f32>>;\n",
            1 + leaves + j
        ));
    }
    src.push_str(&g.support((1 + leaves + roots.len()) as u32));
    src.push_str(&functions);
    src.push_str(sources::SCATTER_ROWS_VEC4);
    let names: Vec<String> = roots.iter().map(|r| r.op().name()).collect();
    let label = match names.as_slice() {
        [one] => format!("{one}_vec4"),
        _ => format!("row_writes({})_vec4", names.join(",")),
    };
    let lanes = if row_lanes(caps) { u } else { u * d / 4 };
    let workgroups = fold_groups((lanes as u64).div_ceil(64), caps, &label)?;
    let mut spec = g.finish(label, src, root, workgroups);
    spec.alias = Some(table.clone());
    spec.extra_outputs = roots[1..].to_vec();
    spec.extra_aliases = roots[1..].iter().map(|r| r.node().inputs[0].clone()).collect();
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
