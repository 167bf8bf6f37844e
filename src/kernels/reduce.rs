//! Reductions (sum, max, min, argmax, argmin) over any set of axes, with the input
//! expression fused in. Long reductions use a workgroup per output (`reduce.wgsl`),
//! short ones an invocation per output: unrolled (`reduce_all`, generated here) over a
//! window, or looping (`reduce_small.wgsl`) where there is no window's index to fold, a
//! tensor exceeds a binding or the unrolled text would be long, and on CPU adapters
//! for all but a few long ones (`serial_on_cpu`).

use super::codegen::{Gen, Ix};
use super::{compute_type, fold_groups, header, sources, KernelSpec, ShaderCaps, WG};
use crate::graph::{Op, ReduceOp};
use crate::{DType, Result, Tensor};

/// Reductions no longer than this run one invocation per output.
pub const SMALL_LEN: usize = 64;

/// Invocations per workgroup of the tree reduction: few outputs get wide workgroups
/// (one workgroup must do the whole reduction), many outputs narrow ones (fewer
/// barrier rounds; 4x faster for 1024 row sums of 1024 on lavapipe than 256 wide).
pub fn reduce_workgroup(n_out: usize) -> u32 {
    if n_out < 64 {
        256
    } else {
        32
    }
}

/// Whether a CPU adapter runs this reduction one invocation per output
/// (`reduce_small.wgsl`) rather than a workgroup's tree: the tree's barriers cost more
/// there than its parallelism gives, except for a few outputs of a long reduction, where
/// the serial kernel would leave all but one thread and SIMD lane idle. Lavapipe, 2-core
/// Zen 4, `x * 2` summed over rows, tree against serial (fastest of 20, us): 32 x 384
/// 641 / 55 (MiniLM's pooled norms), 1024 x 1024 3207 / 1181, 256 x 512 643 / 330,
/// 64 x 100000 10358 / 9405, 8 x 16384 348 / 323, 1 x 4096 96 / 83, 1 x 65536 165 / 759.
fn serial_on_cpu(n_out: usize, len: usize) -> bool {
    len <= 4096 || (n_out >= 8 && len <= 1 << 17)
}

/// An unrolled short reduction whose kernel text would exceed this keeps the loop (a
/// long fused expression copied for every element compiles slowly).
const UNROLL_BYTES: usize = 96 * 1024;

/// Render the reduction producing `root` (an `Op::Reduce` node). A short one over a
/// window (a pooling window) is unrolled: each invocation unravels its output index once
/// and reads every element at constant reduced coordinates (a window's taps fold to
/// constants), where the loop unravelled the output index and divided the tap index at
/// every element (lavapipe: a 3x3 max pool over 8x24x112x112, 157-172 -> 33-38 ms; 5x5
/// over 8x64x56x56, 351 -> 51-54 ms). Tensors past one binding keep the loop, whose
/// loads follow the executor's windows. So do reductions with nothing to fold
/// ([`folds_taps`]), whose text then does not depend on their length.
pub fn render(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<KernelSpec> {
    if reduced_len(root) <= SMALL_LEN && folds_taps(root, is_leaf) {
        let spec = render_with(root, is_leaf, caps, true)?;
        let big = |t: &Tensor| t.storage_bytes() > caps.max_binding;
        if spec.source.len() <= UNROLL_BYTES && !big(root) && !spec.inputs.iter().any(big) {
            return Ok(spec);
        }
    }
    render_with(root, is_leaf, caps, false)
}

/// Whether unrolling the reduction `root` folds index arithmetic into constants: its
/// fused input reads a window (`Op::Im2col`), or it reduces more than one axis longer
/// than 1 (a non-overlapping pool's two window axes), whose loop would divide every
/// element's index. A plain sum over one axis gains nothing from it, and an unrolled
/// kernel's text holds its length: a sentence embedder's pooling over the tokens
/// compiled two new kernels for every sentence length (100-450 ms each on lavapipe).
fn folds_taps(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool) -> bool {
    let node = root.node();
    let Op::Reduce { axes, .. } = &node.op else { return false };
    let x = &node.inputs[0];
    if axes.iter().filter(|&&a| x.dims()[a] > 1).count() > 1 {
        return true;
    }
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![x.clone()];
    while let Some(t) = stack.pop() {
        if is_leaf(&t) || !seen.insert(t.id()) {
            continue;
        }
        if matches!(t.node().op, Op::Im2col { .. }) {
            return true;
        }
        stack.extend(t.node().inputs.iter().cloned());
    }
    false
}

/// The number of input elements each output of the reduction `root` combines.
fn reduced_len(root: &Tensor) -> usize {
    match &root.node().op {
        Op::Reduce { axes, .. } => axes.iter().map(|&a| root.node().inputs[0].dims()[a]).product(),
        _ => 0,
    }
}

fn render_with(
    root: &Tensor,
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
    unroll: bool,
) -> Result<KernelSpec> {
    let node = root.node();
    let Op::Reduce { op, axes } = &node.op else { unreachable!("reduce::render called on {}", node.op.name()) };
    let x = &node.inputs[0];
    let n_out = root.numel();
    let len = reduced_len(root);
    let mut g = Gen::new(*caps, is_leaf);
    g.slot(n_out as u32);
    g.slot(len as u32);
    // meta[2], meta[3]: the first output of this dispatch and the output binding's base
    // (0 unless the executor splits a reduction over trailing axes into windows).
    g.slot(0);
    g.slot(0);
    // meta[4]: combine with the output's current value (a later window of the input).
    g.slot(0);
    // The loop's loads follow the executor's windows over a split input; the unrolled
    // form runs only where every tensor fits one binding.
    g.windows = !unroll;
    g.check_all_windows = !unroll;
    g.texel_leaves = true;

    // Output coordinates from o, reduced coordinates from r, merged into x's coordinates.
    let oc = g.coords(&Ix::lin("o"), root);
    let red: Vec<usize> = axes.clone();
    let red_shape: Vec<usize> = red.iter().map(|&a| x.dims()[a]).collect();
    let merged = |rc: &[String]| -> Ix {
        Ix::coords(
            (0..x.rank())
                .map(|d| match red.iter().position(|&a| a == d) {
                    Some(j) => rc[j].clone(),
                    None => oc[d].clone(),
                })
                .collect(),
        )
    };
    let function = if unroll {
        g.emit("var acc = acc_identity();");
        for r in 0..len {
            // The reduced coordinates of element r, as constants.
            let mut rc = vec![String::new(); red.len()];
            let mut q = r;
            for j in (0..red.len()).rev() {
                rc[j] = format!("{}u", q % red_shape[j]);
                q /= red_shape[j];
            }
            let v = g.eval(x, &merged(&rc), false);
            g.emit(&format!("acc = combine(acc, Acc({v}, {r}u));"));
        }
        format!("fn reduce_all(o: u32) -> Acc {{\n{}    return acc;\n}}\n", std::mem::take(&mut g.body))
    } else {
        let xd = g.dims_of(x);
        let mut rc = vec![String::new(); red.len()];
        let mut q = "r".to_string();
        for j in (0..red.len()).rev() {
            if red_shape[j] == 1 {
                rc[j] = "0u".into();
            } else if j == 0 {
                rc[j] = q.clone();
            } else {
                let (qq, c) = g.divmod(&q, &xd[red[j]]);
                rc[j] = c;
                q = qq;
            }
        }
        let xi = merged(&rc);
        g.align = Some((xi.key(), x.dims().to_vec()));
        let v = g.eval(x, &xi, false);
        g.decide_windows(root.storage_bytes());
        let body = std::mem::take(&mut g.body);
        format!("fn reduce_input(o: u32, r: u32) -> {} {{\n{body}    return {v};\n}}\n", compute_type(x.dtype()))
    };

    let ct = compute_type(x.dtype());
    let out_dt = root.dtype();
    let mut src = header(g.meta.len(), out_dt, g.uses_f16, caps);
    src.push_str(&g.leaf_decls());
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&format!("struct Acc {{ v: {ct}, i: u32 }}\n"));
    src.push_str(&combine(*op, x.dtype()));
    src.push_str(&function);
    let store = match op {
        ReduceOp::ArgMax | ReduceOp::ArgMin => "i32(a.i)",
        _ => "a.v",
    };
    let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
    src.push_str(&format!("const WINDOWED: bool = {};\nvar<private> skip_out: bool;\n", g.emit_windows));
    let merge = if arg {
        ""
    } else {
        "    if (WINDOWED && m(4u) != 0u) {\n        a = combine(Acc(out[o - m(3u)], 0u), a);\n    }\n"
    };
    src.push_str(&format!(
        "fn store_result(o: u32, acc: Acc) {{\n    var a = acc;\n{merge}    out[o - m(3u)] = {store};\n}}\n"
    ));
    let small = len <= SMALL_LEN || (caps.direct_matmul && serial_on_cpu(n_out, len));
    if !small {
        src.push_str(&format!("const RWG: u32 = {}u;\n", reduce_workgroup(n_out)));
    }
    src.push_str(match (unroll, small) {
        (true, _) => UNROLLED_MAIN,
        (false, true) => sources::REDUCE_SMALL,
        (false, false) => sources::REDUCE,
    });

    let textured = g.texel_bits();
    let tex = if textured != 0 { "_tex" } else { "" };
    let label = format!("reduce_{}_{}{tex}", format!("{op:?}").to_lowercase(), x.dtype());
    let groups = if small { (n_out as u64).div_ceil(WG as u64) } else { n_out as u64 };
    let workgroups = fold_groups(groups, caps, &label)?;
    // Over trailing axes, a run of outputs reads one contiguous run of the input, so
    // the reduction can be split into windows.
    let trailing = axes.iter().enumerate().all(|(j, &a)| a == x.rank() - axes.len() + j);
    let input_base = if trailing { g.window_bases(x.numel()) } else { vec![None; g.leaves.len()] };
    let gather = g.gather_slots();
    let mut spec = g.finish(label, src, root, workgroups);
    spec.textured = textured;
    spec.window = Some(super::Window {
        first: 2,
        out_base: 3,
        input_base,
        per_thread: 1,
        inputs_per_output: len as u64,
        outputs_per_group: if small { WG as u64 } else { 1 },
        gather,
        accumulate: (!arg).then_some(4),
        reduces: true,
    });
    Ok(spec)
}

/// The unrolled reduction's entry point: one invocation per output.
const UNROLLED_MAIN: &str = "@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = m(2u) + gid.x + gid.y * nwg.x * WG;
    if (o < m(0u)) {
        store_result(o, reduce_all(o));
    }
}
";

/// The accumulator's identity and combine rule. Ties keep the lower index; NaN wins
/// max/min (as in PyTorch).
fn combine(op: ReduceOp, dt: DType) -> String {
    let float = dt.is_float();
    let (lowest, highest) = match dt {
        DType::I32 => ("-2147483647i - 1i", "2147483647i"),
        DType::U32 => ("0u", "4294967295u"),
        _ => ("-inf_f()", "inf_f()"),
    };
    let zero = match dt {
        DType::I32 => "0i",
        DType::U32 => "0u",
        _ => "0.0",
    };
    let none = "4294967295u";
    let nan_rule = if float {
        "    if (is_nan_f(a.v)) { if (is_nan_f(b.v) && b.i < a.i) { return b; } return a; }\n    if (is_nan_f(b.v)) { return b; }\n"
    } else {
        ""
    };
    match op {
        ReduceOp::Sum => format!(
            "fn acc_identity() -> Acc {{ return Acc({zero}, {none}); }}\nfn combine(a: Acc, b: Acc) -> Acc {{\n    return Acc(a.v + b.v, min(a.i, b.i));\n}}\n"
        ),
        ReduceOp::Max | ReduceOp::ArgMax | ReduceOp::Min | ReduceOp::ArgMin => {
            let is_max = matches!(op, ReduceOp::Max | ReduceOp::ArgMax);
            let (ident, cmp) = if is_max { (lowest, ">") } else { (highest, "<") };
            format!(
                "fn acc_identity() -> Acc {{ return Acc({ident}, {none}); }}\nfn combine(a: Acc, b: Acc) -> Acc {{\n{nan_rule}    if (b.v {cmp} a.v || (b.v == a.v && b.i < a.i)) {{ return b; }}\n    return a;\n}}\n"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::variants::all_caps;
    use crate::{Device, Tensor};

    fn source(t: &Tensor) -> String {
        let specs = crate::kernels::plan_kernels(&all_caps()[0], 14, std::slice::from_ref(t)).expect("plan");
        let r = specs.iter().find(|s| s.label.starts_with("reduce_"));
        r.unwrap_or_else(|| panic!("no reduction among {:?}", specs.iter().map(|s| &s.label).collect::<Vec<_>>()))
            .source
            .to_string()
    }

    #[test]
    fn only_window_reductions_unroll() {
        let d = Device::cpu();
        // A sentence embedder's pooling: tokens times their mask, summed over the
        // tokens. One kernel text for every sentence length.
        let pooled = |len: usize| {
            let h = Tensor::rand([2, len, 8], 1, &d);
            let mask = Tensor::rand([2, len, 1], 2, &d);
            crate::read_all_blocking(&[h.clone(), mask.clone()]).expect("realise");
            source(&(&h * &mask).sum(&[1], false))
        };
        let (short, long) = (pooled(5), pooled(18));
        assert!(!short.contains("fn reduce_all"), "a plain sum loops:\n{short}");
        assert_eq!(short, long, "the text must not hold the length");
        let img = Tensor::rand([1, 2, 8, 8], 3, &d);
        crate::read_all_blocking(std::slice::from_ref(&img)).expect("realise");
        for (what, t) in [
            ("a 3x3 window", img.max_pool2d(3, 2, 1)),
            ("a 2x2 non-overlapping pool", img.avg_pool2d(2, 2, 0)),
            ("a window over an expression", img.exp().max_pool2d(5, 1, 2)),
        ] {
            let src = source(&t);
            assert!(src.contains("fn reduce_all"), "{what} unrolls:\n{src}");
        }
    }
}
