//! Fused element-wise kernels: a root node and every element-wise or movement node under
//! it, down to materialised leaves, rendered into `shaders/elementwise.wgsl`.

use super::codegen::{Gen, Ix};
use super::{fold_groups, header, sources, storage_type, KernelSpec, ShaderCaps, Window, WG};

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
