//! Fused element-wise kernels: a root node and every element-wise or movement node under
//! it, down to materialised leaves, rendered into `shaders/elementwise.wgsl`.

use super::codegen::{Gen, Ix};
use super::{fold_groups, header, header_with_out, sources, storage_type, KernelSpec, ShaderCaps, Window, WG};

/// Outputs per invocation of an element-wise kernel (fewer workgroups to launch: on
/// lavapipe a 1M-element chain runs about 1.5x faster with 4 than with 1).
pub const EPT: u32 = 4;
use crate::{DType, Result, Tensor};

/// Render the kernel that materialises `root`. `is_leaf` says which nodes are read from
/// buffers rather than recomputed.
pub fn render(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<KernelSpec> {
    let mut g = Gen::new(*caps, is_leaf);
    let n = root.numel();
    g.slot(n as u32); // meta[0]: element count
                      // meta[1], meta[2]: the first thread of this dispatch and the output binding's base
                      // (both 0 unless the executor splits the kernel into windows).
    g.slot(0);
    g.slot(0);
    g.windows = true;
    let v = g.eval(root, &Ix::lin("i"), true);
    g.decide_windows(root.storage_bytes());
    let quads = n > 0 && n.is_multiple_of(4) && !g.emit_windows && g.no_quantised_leaves();
    if quads && std::env::var("TESSERA_VEC4").as_deref() != Ok("0") {
        if let Some(spec) = render_quads(root, is_leaf, caps)? {
            return Ok(spec);
        }
    }
    let body = std::mem::take(&mut g.body);
    let dt = root.dtype();
    let packed = dt == DType::F16 && !caps.native_f16;
    if dt == DType::F16 {
        g.uses_f16 = true;
    }
    let mut src = header(g.meta.len(), dt, g.uses_f16, caps);
    src.push_str(&g.leaf_decls());
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&format!("fn eval_out(i: u32) -> {} {{\n{body}    return {v};\n}}\n", super::compute_type(dt)));
    let store = match dt {
        DType::F16 if packed => "    let j = 2u * i;\n    if (j >= m(0u)) { return; }\n    let a = eval_out(j);\n    var b = 0.0;\n    if (j + 1u < m(0u)) { b = eval_out(j + 1u); }\n    out[i - m(2u)] = pack2x16float(vec2<f32>(a, b));\n".to_string(),
        // A load outside a gathered input's window (`Gen::leaf_len`) skips the store.
        DType::Bool if g.emit_windows => "    if (i >= m(0u)) { return; }\n    skip_out = false;\n    let v = select(0u, 1u, eval_out(i));\n    if (skip_out) { return; }\n    out[i - m(2u)] = v;\n".to_string(),
        DType::Bool => "    if (i >= m(0u)) { return; }\n    out[i] = select(0u, 1u, eval_out(i));\n".to_string(),
        _ if g.emit_windows => format!(
            "    if (i >= m(0u)) {{ return; }}\n    skip_out = false;\n    let v = {}(eval_out(i));\n    if (skip_out) {{ return; }}\n    out[i - m(2u)] = v;\n",
            storage_type(dt, caps)
        ),
        _ => format!("    if (i >= m(0u)) {{ return; }}\n    out[i] = {}(eval_out(i));\n", storage_type(dt, caps)),
    };
    if g.emit_windows {
        src.push_str("var<private> skip_out: bool;\n");
    }
    src.push_str(&format!("fn store_out(i: u32) {{\n{store}}}\n"));
    let threads = if packed { n.div_ceil(2) } else { n } as u64;
    let ept = EPT as u64;
    src.push_str(&format!("const EPT: u32 = {EPT}u;\n"));
    src.push_str(sources::ELEMENTWISE);
    let label = label(&g.ops);
    let workgroups = fold_groups(threads.div_ceil(WG as u64 * ept), caps, &label)?;
    let input_base = g.window_bases(n);
    let gather = g.gather_slots();
    let mut spec = g.finish(label, src, root, workgroups);
    let per_thread = if packed { 2 } else { 1 };
    spec.window = Some(Window {
        first: 1,
        out_base: 2,
        input_base,
        per_thread,
        inputs_per_output: 1,
        outputs_per_group: WG as u64 * ept * per_thread as u64,
        // Packed f16 stores two outputs per word, which may come from two windows.
        gather: if packed { Vec::new() } else { gather },
        accumulate: None,
        reduces: false,
    });
    Ok(spec)
}

/// The vec4 variant: `root` has a multiple of 4 elements, fits one binding, and every
/// leaf is read only at the output's own index or is a row (a whole number of quads)
/// repeated over leading axes. Each invocation loads a quad of every
/// input as one vector, evaluates the expression per lane (the leaves are parameters of
/// `eval_out`) and stores one vector: a quarter of the loads, stores and bounds checks,
/// and no per-element index arithmetic. `None` if some leaf turns out not to qualify.
fn render_quads(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<Option<KernelSpec>> {
    let mut g = Gen::new(*caps, is_leaf);
    let n = root.numel();
    g.slot((n / 4) as u32); // meta[0]: quad count
    g.windows = true;
    g.param_leaves = true;
    g.quad_permute = true;
    let v = g.eval(root, &Ix::lin("i"), true);
    if !g.params_ok || !g.no_quantised_leaves() {
        return Ok(None);
    }
    let body = std::mem::take(&mut g.body);
    let dt = root.dtype();
    let packed = dt == DType::F16 && !caps.native_f16;
    if dt == DType::F16 {
        g.uses_f16 = true;
    }
    // Per dtype: the vector a quad is stored as, and how lane `c` of loaded value `a`
    // reads in the compute type.
    let vec_type = |t: DType| match t {
        DType::F32 => "vec4<f32>",
        DType::I32 => "vec4<i32>",
        DType::F16 if caps.native_f16 => "vec4<f16>",
        DType::F16 => "vec2<u32>",
        _ => "vec4<u32>",
    };
    const LANE: [&str; 4] = ["x", "y", "z", "w"];
    let lane = |t: DType, a: &str, c: usize| match t {
        DType::Bool => format!("({a}.{} != 0u)", LANE[c]),
        DType::F16 if caps.native_f16 => format!("f32({a}.{})", LANE[c]),
        DType::F16 => format!("unpack2x16float({a}.{})[{}u]", LANE[c / 2], c % 2),
        _ => format!("{a}.{}", LANE[c]),
    };
    let mut src = header_with_out(g.meta.len(), vec_type(dt), g.uses_f16, caps);
    let mut params = vec!["i: u32".to_string()];
    let mut loads = String::new();
    let mut args = vec![String::new(); 4];
    for (k, t) in g.leaves.iter().enumerate() {
        src.push_str(&format!(
            "@group(0) @binding({}) var<storage, read> in{k}: array<{}>;\n",
            2 + k,
            vec_type(t.dtype())
        ));
        params.push(format!("p{k}: {}", super::compute_type(t.dtype())));
        // Under a permute read by quads, the leaf's quad is the permute input's `pq`.
        let q = if g.param_permuted.contains(&k) { "pq" } else { "q" };
        match g.param_period.get(&k) {
            Some(slot) => loads.push_str(&format!("    let a{k} = in{k}[{q} % m({slot}u)];\n")),
            None => loads.push_str(&format!("    let a{k} = in{k}[{q}];\n")),
        }
        for (c, a) in args.iter_mut().enumerate() {
            a.push_str(&format!(", {}", lane(t.dtype(), &format!("a{k}"), c)));
        }
    }
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&format!(
        "fn eval_out({}) -> {} {{\n{body}    return {v};\n}}\n",
        params.join(", "),
        super::compute_type(dt)
    ));
    let lanes: Vec<String> = (0..4)
        .map(|c| {
            let i = if c == 0 { "i".to_string() } else { format!("i + {c}u") };
            let e = format!("eval_out({i}{})", args[c]);
            match dt {
                DType::Bool => format!("select(0u, 1u, {e})"),
                DType::F16 if packed => e,
                _ => format!("{}({e})", storage_type(dt, caps)),
            }
        })
        .collect();
    let value = if packed {
        format!(
            "vec2<u32>(pack2x16float(vec2<f32>({}, {})), pack2x16float(vec2<f32>({}, {})))",
            lanes[0], lanes[1], lanes[2], lanes[3]
        )
    } else {
        format!("{}({})", vec_type(dt), lanes.join(", "))
    };
    let pq = g.permute_quad.as_ref().map(|e| format!("    let pq = {e};\n")).unwrap_or_default();
    src.push_str(&format!(
        "fn store_quad(q: u32) {{\n    if (q >= m(0u)) {{ return; }}\n    let i = 4u * q;\n{pq}{loads}    out[q] = {value};\n}}\n"
    ));
    src.push_str(&format!("const EPT: u32 = {EPT}u;\n"));
    src.push_str(sources::ELEMENTWISE_VEC4);
    let label = label(&g.ops);
    let workgroups = fold_groups(((n / 4) as u64).div_ceil(WG as u64 * EPT as u64), caps, &label)?;
    let mut spec = g.finish(label, src, root, workgroups);
    // Trusted (no runtime bounds checks): every access is at quad `q < n / 4` of the
    // output and of inputs read at its own index (which hold at least its element count),
    // or at `q % len` of a repeated row of `len` quads; gathers never take this kernel.
    spec.trusted = std::env::var("TESSERA_VEC4_CHECKED").as_deref() != Ok("1");
    Ok(Some(spec))
}

/// The kernels of element-wise `roots` of one shape that the scheduler grouped
/// ([`group_siblings`](crate::graph::schedule::group_siblings)): one kernel that evaluates
/// them all at each index and stores each (a root read by another is computed, not
/// loaded), or, where that kernel does not apply (packed f16 outputs off whole quads,
/// bounds-checked gathers, windows), one kernel per root in order.
pub fn render_siblings(
    roots: &[Tensor],
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
) -> Result<Vec<KernelSpec>> {
    let ids: std::collections::HashSet<u64> = roots.iter().map(|r| r.id()).collect();
    let inner = |t: &Tensor| is_leaf(t) && !ids.contains(&t.id());
    let n = roots[0].numel();
    if n > 0 && n.is_multiple_of(4) && std::env::var("TESSERA_VEC4").as_deref() != Ok("0") {
        if let Some(spec) = render_multi(roots, &inner, caps, true)? {
            return Ok(vec![spec]);
        }
    }
    if let Some(spec) = render_multi(roots, &inner, caps, false)? {
        return Ok(vec![spec]);
    }
    roots.iter().map(|r| render(r, is_leaf, caps)).collect()
}

/// The multi-output kernel of [`render_siblings`], over quads (`quads`, the vec4 form of
/// [`render_quads`]) or element by element; `None` where it does not apply.
fn render_multi(
    roots: &[Tensor],
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
    quads: bool,
) -> Result<Option<KernelSpec>> {
    let mut g = Gen::new(*caps, is_leaf);
    let n = roots[0].numel();
    g.slot(if quads { n / 4 } else { n } as u32); // meta[0]: quad or element count
    if !quads {
        // meta[1], meta[2]: the scalar entry point's first thread and output base (0:
        // a multi-output kernel is one dispatch over whole buffers).
        g.slot(0);
        g.slot(0);
    }
    g.windows = true;
    g.param_leaves = quads;
    let vals: Vec<String> = roots.iter().map(|r| g.eval(r, &Ix::lin("i"), true)).collect();
    let biggest = roots.iter().map(|r| r.storage_bytes()).max().unwrap_or(0);
    g.decide_windows(biggest);
    let packed = |t: &Tensor| t.dtype() == DType::F16 && !caps.native_f16;
    let ok = !g.emit_windows
        && g.checks.is_empty()
        && (!quads || (g.params_ok && g.no_quantised_leaves()))
        && (quads || !roots.iter().any(packed));
    if !ok {
        return Ok(None);
    }
    let body = std::mem::take(&mut g.body);
    if roots.iter().any(|r| r.dtype() == DType::F16) {
        g.uses_f16 = true;
    }
    let vec_type = |t: DType| match t {
        DType::F32 => "vec4<f32>",
        DType::I32 => "vec4<i32>",
        DType::F16 if caps.native_f16 => "vec4<f16>",
        DType::F16 => "vec2<u32>",
        _ => "vec4<u32>",
    };
    let elem_type = |t: DType| if quads { vec_type(t) } else { storage_type(t, caps) };
    let mut src = header_with_out(g.meta.len(), elem_type(roots[0].dtype()), g.uses_f16, caps);
    // Inputs at 2.., then the further outputs.
    let leaves = g.leaves.len();
    let mut params = vec!["i: u32".to_string()];
    let mut loads = String::new();
    let mut args = vec![String::new(); 4];
    const LANE: [&str; 4] = ["x", "y", "z", "w"];
    for (k, t) in g.leaves.iter().enumerate() {
        if quads {
            src.push_str(&format!(
                "@group(0) @binding({}) var<storage, read> in{k}: array<{}>;\n",
                2 + k,
                vec_type(t.dtype())
            ));
            params.push(format!("p{k}: {}", super::compute_type(t.dtype())));
            match g.param_period.get(&k) {
                Some(slot) => loads.push_str(&format!("    let a{k} = in{k}[q % m({slot}u)];\n")),
                None => loads.push_str(&format!("    let a{k} = in{k}[q];\n")),
            }
            for (c, a) in args.iter_mut().enumerate() {
                let v = format!("a{k}");
                a.push_str(&match t.dtype() {
                    DType::Bool => format!(", ({v}.{} != 0u)", LANE[c]),
                    DType::F16 if caps.native_f16 => format!(", f32({v}.{})", LANE[c]),
                    DType::F16 => format!(", unpack2x16float({v}.{})[{}u]", LANE[c / 2], c % 2),
                    _ => format!(", {v}.{}", LANE[c]),
                });
            }
        }
    }
    if !quads {
        src.push_str(&g.leaf_decls());
    }
    for (j, r) in roots.iter().enumerate().skip(1) {
        src.push_str(&format!(
            "@group(0) @binding({}) var<storage, read_write> out{j}: array<{}>;\n",
            1 + leaves + j,
            elem_type(r.dtype())
        ));
    }
    src.push_str(&g.support(1 + (leaves + roots.len()) as u32));
    let fields: Vec<String> =
        roots.iter().enumerate().map(|(j, r)| format!("o{j}: {}", super::compute_type(r.dtype()))).collect();
    src.push_str(&format!("struct Outs {{ {} }}\n", fields.join(", ")));
    src.push_str(&format!(
        "fn eval_out({}) -> Outs {{\n{body}    return Outs({});\n}}\n",
        params.join(", "),
        vals.join(", ")
    ));
    let name = |j: usize| if j == 0 { "out".to_string() } else { format!("out{j}") };
    let store = |t: DType, e: String| match t {
        DType::Bool => format!("select(0u, 1u, {e})"),
        _ => format!("{}({e})", storage_type(t, caps)),
    };
    if quads {
        let mut body = String::new();
        for (c, a) in args.iter().enumerate() {
            let i = if c == 0 { "i".to_string() } else { format!("i + {c}u") };
            body.push_str(&format!("    let r{c} = eval_out({i}{a});\n"));
        }
        for (j, r) in roots.iter().enumerate() {
            let dt = r.dtype();
            let value = if packed(r) {
                format!(
                    "vec2<u32>(pack2x16float(vec2<f32>(r0.o{j}, r1.o{j})), pack2x16float(vec2<f32>(r2.o{j}, r3.o{j})))"
                )
            } else {
                let lanes: Vec<String> = (0..4).map(|c| store(dt, format!("r{c}.o{j}"))).collect();
                format!("{}({})", vec_type(dt), lanes.join(", "))
            };
            body.push_str(&format!("    {}[q] = {value};\n", name(j)));
        }
        src.push_str(&format!(
            "fn store_quad(q: u32) {{\n    if (q >= m(0u)) {{ return; }}\n    let i = 4u * q;\n{loads}{body}}}\n"
        ));
        src.push_str(&format!("const EPT: u32 = {EPT}u;\n"));
        src.push_str(sources::ELEMENTWISE_VEC4);
    } else {
        let mut body = String::from("    if (i >= m(0u)) { return; }\n    let r = eval_out(i);\n");
        for (j, r) in roots.iter().enumerate() {
            body.push_str(&format!("    {}[i] = {};\n", name(j), store(r.dtype(), format!("r.o{j}"))));
        }
        src.push_str(&format!("fn store_out(i: u32) {{\n{body}}}\n"));
        src.push_str(&format!("const EPT: u32 = {EPT}u;\n"));
        src.push_str(sources::ELEMENTWISE);
    }
    let label = format!("multi{}_{}", roots.len(), label(&g.ops));
    let per_group = WG as u64 * EPT as u64;
    let units = if quads { n / 4 } else { n } as u64;
    let workgroups = fold_groups(units.div_ceil(per_group), caps, &label)?;
    let mut spec = g.finish(label, src, &roots[0], workgroups);
    spec.extra_outputs = roots[1..].to_vec();
    // Trusted as the single-output kernels of the same form: every access is at the
    // output's own index (quad) or a repeated row's, and gathers are bounds-checked
    // (kernels with checks do not take this form).
    spec.trusted = quads && std::env::var("TESSERA_VEC4_CHECKED").as_deref() != Ok("1");
    Ok(Some(spec))
}

/// `fused(add,mul,gelu)`, or `copy` for a pure data movement.
fn label(ops: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for o in ops.iter().rev() {
        if !seen.contains(&o.as_str()) {
            seen.push(o);
        }
    }
    if seen.is_empty() {
        "copy".into()
    } else {
        format!("fused({})", seen.join(","))
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::variants::all_caps;
    use crate::{DType, Device, Tensor};

    fn source(t: &Tensor, caps: &crate::kernels::ShaderCaps) -> String {
        let specs = crate::kernels::plan_kernels(caps, 14, std::slice::from_ref(t)).expect("plan");
        specs.last().expect("a kernel").source.clone()
    }

    #[test]
    fn whole_quads_read_at_their_own_index_take_the_vec4_kernel() {
        let d = Device::cpu();
        let caps = all_caps()[0];
        let x = Tensor::rand([4, 8], 1, &d);
        let row = Tensor::rand([8], 2, &d);
        let col = Tensor::rand([4, 1], 3, &d);
        crate::read_all_blocking(&[x.clone(), row.clone(), col.clone()]).expect("realise");
        let xs = x;
        for (what, t, quads) in [
            ("contiguous chain", (&xs * 2.0 + 1.0).exp().tanh().relu() * &xs, true),
            ("f16 in, f32 out", xs.cast(DType::F16).cast(DType::F32) + &xs, true),
            ("odd length", xs.narrow(1, 0, 7).exp(), false),
            ("transposed read", xs.t().exp(), false),
            ("a bias row repeated over rows", (&xs + &row).relu() * &row, true),
            ("a row through a reshape", &xs * &row.reshape([1, 8]), true),
            ("a sliced row", &xs + &xs.narrow(0, 0, 1), false),
            ("a column repeated along rows", &xs + &col, false),
            // BERT's head split: a bias add, then [b, s, h, d] -> [b, h, s, d].
            ("a head split", (&xs + &row).reshape([2, 2, 2, 4]).permute(&[0, 2, 1, 3]), true),
            ("a permute of rows of 2", xs.reshape([4, 4, 2]).permute(&[1, 0, 2]), false),
            ("a permute moving the last axis", xs.reshape([4, 2, 4]).permute(&[0, 2, 1]), false),
            ("a leaf read both ways", xs.reshape([2, 2, 8]).permute(&[1, 0, 2]).reshape([4, 8]) + &xs, false),
            ("an op over a permuted leaf", xs.reshape([2, 2, 8]).permute(&[1, 0, 2]).exp(), true),
        ] {
            let src = source(&t, &caps);
            assert_eq!(src.contains("fn store_quad"), quads, "{what}:\n{src}");
        }
        // Where a tensor may exceed a binding (window mode), the scalar kernel.
        let windowed = all_caps()[4];
        assert!(!source(&(xs.exp()), &windowed).contains("fn store_quad"), "windowed caps use the scalar kernel");
    }
}
