//! Graphviz DOT of a graph, before fusion (one node per op) and after (one cluster per
//! kernel, labelled with the kernel's name).

use super::schedule::topo_order;
use crate::Tensor;
use std::fmt::Write;

fn node_line(t: &Tensor, out: &mut String, indent: &str) {
    let _ = writeln!(
        out,
        "{indent}n{} [label=\"{}\\n{:?} {}\"{}];",
        t.id(),
        t.op().name(),
        t.dims(),
        t.dtype(),
        if t.is_realized() { ", style=filled, fillcolor=lightgrey" } else { "" }
    );
}

fn edges(nodes: &[Tensor], out: &mut String) {
    for t in nodes {
        for i in &t.node().inputs {
            let _ = writeln!(out, "  n{} -> n{};", i.id(), t.id());
        }
    }
}

/// Every node under `targets`, realised inputs shaded.
pub fn graph_dot(targets: &[Tensor]) -> String {
    let mut nodes = topo_order(targets);
    let mut leaves: Vec<Tensor> = Vec::new();
    for t in &nodes {
        for i in &t.node().inputs {
            if i.is_realized() && !leaves.iter().any(|l| l.id() == i.id()) {
                leaves.push(i.clone());
            }
        }
    }
    for t in targets {
        if t.is_realized() && !leaves.iter().any(|l| l.id() == t.id()) {
            leaves.push(t.clone());
        }
    }
    let mut out = String::from("digraph tessera {\n  rankdir=LR;\n  node [shape=box, fontname=monospace];\n");
    for t in leaves.iter().chain(&nodes) {
        node_line(t, &mut out, "  ");
    }
    nodes.extend(leaves);
    edges(&nodes, &mut out);
    out.push_str("}\n");
    out
}

/// The same graph grouped into the kernels the scheduler would launch (with
/// `implicit_gemm`, convolution windows inside the products that read them; element-wise
/// epilogues inside their products, f16 ones with `f16_out`; with `siblings`, sibling
/// outputs and row writes over the same rows in one kernel, and attentions stored with
/// the moves over them, as the wgpu backend runs them).
pub fn schedule_dot(
    targets: &[Tensor],
    max_inputs: usize,
    implicit_gemm: bool,
    f16_out: bool,
    siblings: bool,
) -> String {
    let mut sched = super::schedule::schedule_with(targets, max_inputs, u64::MAX, implicit_gemm);
    super::schedule::fuse_epilogues(&mut sched, targets, max_inputs, u64::MAX, f16_out);
    if siblings {
        #[cfg(not(target_arch = "wasm32"))]
        super::schedule::fuse_attention_stores(&mut sched, targets);
        super::schedule::group_siblings(&mut sched, max_inputs, u64::MAX);
        super::schedule::group_row_writes(&mut sched, max_inputs);
    }
    let nodes = topo_order(targets);
    let mut owner: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    // A node belongs to the first kernel (in order) whose fused region reaches it.
    for (k, kern) in sched.kernels.iter().enumerate() {
        let mut stack: Vec<Tensor> = std::iter::once(kern.root.clone()).chain(kern.siblings.iter().cloned()).collect();
        while let Some(t) = stack.pop() {
            if owner.contains_key(&t.id()) {
                continue;
            }
            owner.insert(t.id(), k);
            for i in &t.node().inputs {
                if !sched.is_buffer(i) {
                    stack.push(i.clone());
                }
            }
        }
    }
    let mut out = String::from("digraph tessera_fused {\n  rankdir=LR;\n  node [shape=box, fontname=monospace];\n");
    for (k, kern) in sched.kernels.iter().enumerate() {
        let _ = writeln!(
            out,
            "  subgraph cluster_{k} {{\n    label=\"kernel {k}: {:?} -> n{}\";",
            kern.kind,
            kern.root.id()
        );
        for t in nodes.iter().filter(|t| owner.get(&t.id()) == Some(&k)) {
            node_line(t, &mut out, "    ");
        }
        out.push_str("  }\n");
    }
    for t in &nodes {
        for i in &t.node().inputs {
            if i.is_realized() {
                node_line(i, &mut out, "  ");
            }
        }
    }
    edges(&nodes, &mut out);
    out.push_str("}\n");
    out
}
