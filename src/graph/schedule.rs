//! The scheduler: which nodes become kernels, in what order.
//!
//! A node is *materialised* (gets a buffer and a kernel) when it is a requested target,
//! when its op is not element-wise ([`Op::kernel_kind`]: reductions, matmuls, softmax,
//! norms, attention, quantisation), or when it is an operand of a matmul or of a
//! whole-buffer kernel. A matmul operand that is a buffer, a reshape of one or a
//! transpose of one is read as it is; with implicit GEMM, a chain of index remaps over
//! convolution windows is read in place ([`reads_operand_in_place`]). Everything else,
//! element-wise and movement ops alike, is fused into the kernel of the materialised
//! node that consumes it. Fusion is bounded: an expression shared by several consumers
//! (slices that partition it aside) and costly to recompute gets its own buffer
//! ([`SHARED_COST`]), and so does one that computes much per element under a broadcast
//! repeating it over millions of elements, or anything computed under a convolution's
//! windows over as many ([`EXPANDED_WORK`]); chains deeper than [`MAX_FUSED_DEPTH`] are
//! cut, and a group that would bind more inputs than the device allows, or grow past
//! [`MAX_FUSED_OPS`], is split by materialising its largest sub-expression.

pub use super::KernelKind;
use super::Op;
use crate::Tensor;
use std::collections::{HashMap, HashSet};

/// Most ops one generated kernel may contain.
pub const MAX_FUSED_OPS: usize = 96;

/// Fused cost (window gathers weighted by their work) from which an expression read by
/// two or more consumers gets its own buffer.
pub const SHARED_COST: usize = 8;

/// Work (per element: 1 for an element-wise op or a load, 8 for a uniform random
/// number, 32 for a col2im sum) that a broadcast may repeat before the expression under
/// it gets its own buffer.
pub const EXPANDED_WORK: usize = 1 << 22;

/// Whether the `EXPANDED_WORK` rule applies: natively. The npm package leaves it out
/// for its gzip budget, so in a page a fresh weight broadcast over millions of elements
/// is still drawn once per element.
const EXPAND_RULE: bool = cfg!(not(target_arch = "wasm32"));

/// Longest chain of fused ops from a kernel's root to its leaves.
pub const MAX_FUSED_DEPTH: usize = 48;

/// One kernel of a schedule: the node it materialises.
#[derive(Clone)]
pub struct ScheduledKernel {
    pub root: Tensor,
    pub kind: KernelKind,
    /// More element-wise roots of the root's shape that the same kernel computes and
    /// stores, each at the same index (see [`group_siblings`]); empty for most kernels.
    pub siblings: Vec<Tensor>,
    /// A matmul kernel whose root is the element-wise expression over its product (see
    /// [`fuse_epilogues`]): the product node, which gets no buffer of its own.
    pub product: Option<Tensor>,
}

/// Kernels in execution order.
#[derive(Clone, Default)]
pub struct Schedule {
    pub kernels: Vec<ScheduledKernel>,
    /// Ids of every materialised node.
    pub materialised: HashSet<u64>,
}

impl Schedule {
    /// Whether `t` is read from a buffer (realised already, or produced by a kernel here).
    pub fn is_buffer(&self, t: &Tensor) -> bool {
        t.is_realized() || self.materialised.contains(&t.id())
    }
}

/// Follow reshapes down to the node that owns the buffer, if there is one: a reshape of a
/// buffer is the same buffer.
pub fn buffer_source(t: &Tensor, materialised: &HashSet<u64>) -> Option<Tensor> {
    let mut cur = t.clone();
    loop {
        if cur.is_realized() || materialised.contains(&cur.id()) {
            return Some(cur);
        }
        if cur.node().op == Op::Reshape {
            let next = cur.node().inputs[0].clone();
            cur = next;
        } else {
            return None;
        }
    }
}

/// The buffer `[R, D]` whose rows `values` (`[N, D]`) are, and the `index_select`s
/// along rows between them (each one's node, outermost first): `values` itself, or
/// rows gathered from it once or several times over, through reshapes that keep rows of
/// D. `None` for anything else. What an embedding bag's sums read, on both backends.
pub fn gathered_rows(values: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool) -> Option<(Tensor, Vec<Tensor>)> {
    let d = *values.dims().get(1)?;
    let mut gathers = Vec::new();
    let mut t = values.clone();
    loop {
        if t.rank() != 2 || t.dims()[1] != d || d == 0 {
            return None;
        }
        if is_leaf(&t) {
            return Some((t, gathers));
        }
        match t.op() {
            Op::Reshape => {}
            Op::IndexSelect { axis: 0 } => gathers.push(t.clone()),
            _ => return None,
        }
        let next = t.node().inputs[0].clone();
        t = next;
    }
}

fn strip_leading_ones(d: &[usize]) -> &[usize] {
    let k = d.iter().take_while(|&&x| x == 1).count();
    &d[k..]
}

/// The input of `t` when `t` swaps the last two axes and keeps the others.
fn transposed_input(t: &Tensor) -> Option<Tensor> {
    t.op().swaps_last_two_axes().then(|| t.node().inputs[0].clone())
}

/// `t` under the reshapes that only add or drop leading unit axes (free for a product).
fn under_unit_reshapes(t: &Tensor) -> Tensor {
    let mut cur = t.clone();
    loop {
        let next = {
            let n = cur.node();
            match &n.op {
                Op::Reshape if strip_leading_ones(n.inputs[0].dims()) == strip_leading_ones(cur.dims()) => {
                    n.inputs[0].clone()
                }
                _ => return cur.clone(),
            }
        };
        cur = next;
    }
}

/// Whether a product reads operand `t` transposed, as [`matmul_operand`] finds it: a
/// swap of the last two axes under reshapes that only add or drop leading unit axes.
pub fn reads_transposed(t: &Tensor) -> bool {
    under_unit_reshapes(t).op().swaps_last_two_axes()
}

/// A matmul operand as a buffer: `(the tensor owning it, transposed)`. Reshapes that only
/// add or drop leading unit axes are free, and so is a swap of the last two axes of a
/// buffer: the kernel reads it transposed instead of materialising the transpose.
pub fn matmul_operand(t: &Tensor, materialised: &HashSet<u64>) -> Option<(Tensor, bool)> {
    if let Some(b) = buffer_source(t, materialised) {
        return Some((b, false));
    }
    transposed_input(&under_unit_reshapes(t)).and_then(|i| buffer_source(&i, materialised)).map(|b| (b, true))
}

/// Whether `t`, a matmul operand that is not a buffer, is read by the product itself
/// (an implicit GEMM) rather than materialised first: a chain of index remaps (reshape,
/// permute, expand, slice, pad) over sliding windows (`Im2col`) of one buffer, as a
/// convolution's column matrix is. `is_buffer` says which nodes are buffers; the
/// buffer must fit one storage binding.
pub fn reads_operand_in_place(t: &Tensor, is_buffer: &dyn Fn(&Tensor) -> bool, max_binding: u64) -> bool {
    remap_chain(t, is_buffer, max_binding) == Some(true)
}

/// `Some(whether it passes through Im2col)` when `t` is a chain of index remaps down to
/// one buffer that fits a binding (what a product can still read in place once later
/// scheduling passes have materialised part of the chain); `None` otherwise.
pub fn remap_chain(t: &Tensor, is_buffer: &dyn Fn(&Tensor) -> bool, max_binding: u64) -> Option<bool> {
    let mut cur = t.clone();
    let mut windows = false;
    loop {
        if is_buffer(&cur) {
            return (cur.storage_bytes() <= max_binding).then_some(windows);
        }
        let next = {
            let n = cur.node();
            match n.op {
                Op::Im2col { .. } => windows = true,
                Op::Reshape | Op::Permute { .. } | Op::Expand | Op::Slice { .. } | Op::Pad { .. } => {}
                _ => return None,
            }
            n.inputs[0].clone()
        };
        cur = next;
    }
}

/// Unrealised nodes reachable from `targets`, inputs before consumers.
pub fn topo_order(targets: &[Tensor]) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<(Tensor, bool)> = targets.iter().rev().map(|t| (t.clone(), false)).collect();
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if t.is_realized() || !seen.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        for i in t.node().inputs.iter().rev() {
            if !i.is_realized() && !seen.contains(&i.id()) {
                stack.push((i.clone(), false));
            }
        }
    }
    order
}

/// Group the graph under `targets` into kernels. `max_inputs` is the most storage
/// buffers one kernel may read.
pub fn schedule(targets: &[Tensor], max_inputs: usize) -> Schedule {
    schedule_with(targets, max_inputs, u64::MAX, false)
}

/// [`schedule`] for a device whose storage bindings hold at most `max_binding` bytes:
/// a transposed matmul A larger than that is materialised (a copy that splits into
/// windows) so the product can split by rows. With `implicit_gemm`, a matmul operand
/// that gathers sliding windows is read in place by the product (see
/// [`reads_operand_in_place`]) rather than materialised.
pub fn schedule_with(targets: &[Tensor], max_inputs: usize, max_binding: u64, implicit_gemm: bool) -> Schedule {
    let order = topo_order(targets);
    let mut mat: HashSet<u64> = HashSet::new();
    // Matmul operands left to be read in place (implicit GEMM), checked again below.
    let mut in_place_operands: Vec<Tensor> = Vec::new();
    for t in targets {
        if !t.is_realized() {
            mat.insert(t.id());
        }
    }
    for t in &order {
        let kind = t.op().kernel_kind();
        // Every kind but fused element-wise expressions gets its own kernel.
        if kind.is_some_and(|k| k != KernelKind::Elementwise) {
            mat.insert(t.id());
        }
        match kind {
            Some(KernelKind::Matmul) => {
                for (j, i) in t.node().inputs.iter().enumerate() {
                    match matmul_operand(i, &mat) {
                        None => {
                            // In place only where nothing needs splitting: the product, this
                            // operand's buffer and the other operand fit one binding each.
                            let is_buffer = |x: &Tensor| x.is_realized() || mat.contains(&x.id());
                            let fits = |x: &Tensor| x.storage_bytes() <= max_binding;
                            let other = &t.node().inputs[1 - j];
                            let in_place = implicit_gemm
                                && fits(t)
                                && matmul_operand(other, &mat).is_none_or(|(b, _)| fits(&b))
                                && reads_operand_in_place(i, &is_buffer, max_binding);
                            if in_place {
                                in_place_operands.push(i.clone());
                            } else if let Some(inner) = transposed_input(i) {
                                // A transpose of an expression: materialise the expression
                                // in its own layout and read it transposed (no strided
                                // writes); a large A is copied below like any other.
                                mat.insert(inner.id());
                                if j == 0
                                    && !inner.dtype().is_quantized()
                                    && buffer_source(&inner, &mat).is_some_and(|b| b.storage_bytes() > max_binding)
                                {
                                    mat.insert(i.id());
                                }
                            } else {
                                mat.insert(i.id());
                            }
                        }
                        Some((b, true)) if j == 0 && !b.dtype().is_quantized() && b.storage_bytes() > max_binding => {
                            mat.insert(i.id());
                        }
                        Some(_) => {}
                    }
                }
            }
            Some(k) if k.reads_whole_buffers() => {
                for i in &t.node().inputs {
                    if buffer_source(i, &mat).is_none() {
                        mat.insert(i.id());
                    }
                }
            }
            _ => {}
        }
    }
    // An expression that computes much per element (random numbers, a col2im sum, a
    // dozen loads and ops) under a broadcast that repeats it over many more elements, or
    // any computed expression under a convolution's windows, is computed once, before
    // the broadcast or the windows: a freshly initialised weight, still a random
    // expression, is otherwise drawn again for every element it multiplies, and a
    // convolution's output gradient again for every weight it reaches. `work` is each
    // fused expression's: an element-wise op or a load from a buffer counts 1.
    if EXPAND_RULE {
        let mut work: HashMap<u64, usize> = HashMap::new();
        for t in &order {
            let n = t.node();
            let mut w: usize = match n.op {
                Op::Col2im { .. } => 32,
                Op::Rand { normal, .. } => 8 << usize::from(normal),
                Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast => 1,
                _ => 0,
            };
            for i in &n.inputs {
                let fused = !i.is_realized() && !mat.contains(&i.id());
                let iw = if fused { work.get(&i.id()).copied().unwrap_or(0) } else { 1 };
                let redone = t.numel().saturating_sub(i.numel()).saturating_mul(iw);
                let repeated = match n.op {
                    Op::Expand => iw >= SHARED_COST,
                    // Windows read each value about kernel-area times: any computed input
                    // (an activation after a bias add, a concat) is stored once first (an
                    // ONNX model's convolutions over 901 x 161, lavapipe: 17-18 -> 12.7 s).
                    Op::Im2col { .. } => iw >= 2,
                    _ => false,
                };
                if repeated && redone >= EXPANDED_WORK {
                    mat.insert(i.id());
                } else {
                    w = w.saturating_add(iw);
                }
            }
            work.insert(t.id(), if mat.contains(&t.id()) { 0 } else { w });
        }
    }
    // A costly expression read by several consumers is computed once into a buffer
    // instead of once per consuming kernel (a window gather, say, that feeds both a
    // weight gradient and a bias gradient).
    // Consumers that are slices reading at most the whole expression between them (the
    // column blocks of a product's B past a binding) do not count: each computes its own
    // part, and storing the whole first only adds a copy of every part (an ONNX model's
    // 1152 x 145061 column matrix in 10 blocks, lavapipe: 2.2 s to store, 5.5 s to copy).
    let mut uses: HashMap<u64, usize> = HashMap::new();
    // (input id) -> (slices reading it, their elements, its elements)
    let mut sliced: HashMap<u64, (usize, usize, usize)> = HashMap::new();
    for t in &order {
        let slice = matches!(t.node().op, Op::Slice { .. });
        for i in &t.node().inputs {
            *uses.entry(i.id()).or_default() += 1;
            if slice {
                let e = sliced.entry(i.id()).or_insert((0, 0, i.numel()));
                *e = (e.0 + 1, e.1.saturating_add(t.numel()), e.2);
            }
        }
    }
    for (id, (n, elems, whole)) in sliced {
        if elems <= whole && uses.get(&id) == Some(&n) {
            uses.insert(id, 0);
        }
    }
    let mut cost: HashMap<u64, usize> = HashMap::new();
    for t in &order {
        let own = match t.node().op {
            Op::Im2col { .. } => 8,
            Op::Col2im { .. } => 32,
            _ => 0,
        };
        let c = t
            .node()
            .inputs
            .iter()
            .filter(|i| !i.is_realized() && !mat.contains(&i.id()))
            .map(|i| cost.get(&i.id()).copied().unwrap_or(0))
            .fold(own, usize::saturating_add);
        let shared = t.node().op.is_elementwise() && uses.get(&t.id()).copied().unwrap_or(0) >= 2 && c >= SHARED_COST;
        if shared {
            // A broadcast's input is stored instead, un-repeated: the consumers read the
            // broadcast of a smaller buffer (a convolution's windows expanded over its
            // output channels, read by the product and the weight gradient).
            let mut m = t.clone();
            while m.node().op == Op::Expand {
                let i = m.node().inputs[0].clone();
                if i.is_realized() || mat.contains(&i.id()) {
                    break;
                }
                m = i;
            }
            mat.insert(m.id());
        }
        cost.insert(t.id(), if shared || mat.contains(&t.id()) { 0 } else { c });
    }
    // Bound the depth of every fused expression: a long unrealised chain (a loop that
    // keeps adding to a tensor) is cut into kernels instead of one deep recursion.
    let mut depth: HashMap<u64, usize> = HashMap::new();
    for t in &order {
        let d = 1 + t
            .node()
            .inputs
            .iter()
            .filter(|i| !i.is_realized() && !mat.contains(&i.id()))
            .map(|i| depth.get(&i.id()).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        if d > MAX_FUSED_DEPTH {
            mat.insert(t.id());
        }
        depth.insert(t.id(), if mat.contains(&t.id()) { 0 } else { d });
    }
    // An operand left in place whose chain the passes above cut (a shared column matrix
    // made a buffer) is still read in place if that buffer fits a binding; else it is
    // materialised, and the copy splits like any other.
    for i in &in_place_operands {
        let is_buffer = |x: &Tensor| x.is_realized() || mat.contains(&x.id());
        if !is_buffer(i) && remap_chain(i, &is_buffer, max_binding).is_none() {
            mat.insert(i.id());
        }
    }
    // Split groups that read too many buffers or hold too many ops.
    loop {
        let mut changed = false;
        for t in &order {
            if !mat.contains(&t.id()) || t.node().op == Op::Matmul || t.node().op.reads_whole_buffers() {
                continue;
            }
            if let Some(split) = oversized(t, &mat, max_inputs) {
                mat.insert(split);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let kernels = order
        .iter()
        .filter(|t| mat.contains(&t.id()))
        .map(|t| ScheduledKernel {
            root: t.clone(),
            kind: t.op().kernel_kind().unwrap_or(KernelKind::Elementwise),
            siblings: Vec::new(),
            product: None,
        })
        .collect();
    Schedule { kernels: scatters_last(kernels, &mat), materialised: mat }
}

/// The node under a kernel root that is a chain of reshapes and permutes holding at
/// least one permute (a head split, `[b, s, h] -> [b, heads, s, d]`), with as many
/// elements: an epilogue is evaluated at the product's index below the chain and
/// stored where the chain puts that element (the matmul shaders' `dst(i)` on the
/// GPU). `None` for any other root.
pub fn permuted_base(root: &Tensor) -> Option<Tensor> {
    let mut t = root.clone();
    let mut permuted = false;
    while matches!(t.op(), Op::Reshape | Op::Permute { .. }) {
        permuted |= matches!(t.op(), Op::Permute { .. });
        let next = t.node().inputs[0].clone();
        t = next;
    }
    (permuted && t.numel() == root.numel()).then_some(t)
}

/// Matmul epilogues: an element-wise kernel that reads a matmul's product only at its
/// own index, through element-wise ops and reshapes (a bias add, an activation, a
/// residual add, a cast), is fused into the product's store, where nothing else reads
/// the product: the matmul kernel then materialises the expression and the product
/// gets no buffer (`Linear` then GELU is one kernel). Under reshapes and permutes
/// ([`permuted_base`]: a projection's bias add then its head split), the expression
/// below them is what must read the product at its own index, and the store puts each
/// element where the permutes send it. Where the expression holds a
/// data-dependent gather or a quantised leaf, its output is f16 without `f16_out`
/// (a kernel storing single packed halves would race) or any other dtype than f32,
/// the product is a target, or a tensor exceeds one binding of `max_binding` bytes
/// (row-split products), the two stay separate kernels.
pub fn fuse_epilogues(s: &mut Schedule, targets: &[Tensor], max_inputs: usize, max_binding: u64, f16_out: bool) {
    let targets: HashSet<u64> = targets.iter().map(|t| t.id()).collect();
    let at: HashMap<u64, usize> = s.kernels.iter().enumerate().map(|(j, k)| (k.root.id(), j)).collect();
    let mut readers: HashMap<u64, Vec<u64>> = HashMap::new();
    for t in topo_order(&s.kernels.iter().map(|k| k.root.clone()).collect::<Vec<_>>()) {
        for i in &t.node().inputs {
            readers.entry(i.id()).or_default().push(t.id());
        }
    }
    // Which kernels evaluate each node (a fused node shared by two kernels is computed
    // in both, so a product it reads is read by both).
    let mut evaluated_by: HashMap<u64, Vec<usize>> = HashMap::new();
    for (j, k) in s.kernels.iter().enumerate() {
        let mut stack = vec![k.root.clone()];
        let mut seen = HashSet::new();
        while let Some(t) = stack.pop() {
            let buffer = t.id() != k.root.id() && (t.is_realized() || s.materialised.contains(&t.id()));
            if buffer || !seen.insert(t.id()) {
                continue;
            }
            evaluated_by.entry(t.id()).or_default().push(j);
            stack.extend(t.node().inputs.iter().cloned());
        }
    }
    let fits = |t: &Tensor| t.storage_bytes() <= max_binding;
    let mut fused: Vec<(usize, usize)> = Vec::new();
    for (j, k) in s.kernels.iter().enumerate() {
        let e = &k.root;
        let dtype_ok = e.dtype() == crate::DType::F32 || (e.dtype() == crate::DType::F16 && f16_out);
        if k.kind != KernelKind::Elementwise || !k.siblings.is_empty() || !dtype_ok || !fits(e) {
            continue;
        }
        // E's group: its nodes, the buffers it reads, and the nodes read at E's own
        // index (element-wise ops and reshapes, reached from E through such ops only;
        // under a head split, from its base). A buffer also read through a movement op
        // (at another index) is `off_path`.
        let (mut group, mut pure, mut leaves, mut off_path) =
            (HashSet::new(), HashSet::new(), Vec::new(), HashSet::new());
        let base = permuted_base(e).filter(|b| !b.is_realized() && !s.materialised.contains(&b.id()));
        let mut stack = vec![(e.clone(), base.is_none())];
        let base_id = base.as_ref().map(|b| b.id());
        let mut clean = true;
        while let Some((t, on_path)) = stack.pop() {
            let buffer = t.id() != e.id() && (t.is_realized() || s.materialised.contains(&t.id()));
            if buffer {
                if !on_path {
                    off_path.insert(t.id());
                }
                if !leaves.iter().any(|l: &Tensor| l.id() == t.id()) {
                    leaves.push(t.clone());
                }
                continue;
            }
            // Element-wise ops and reshapes keep the linear index.
            let on_path = on_path || Some(t.id()) == base_id;
            let elementwise = matches!(t.op(), Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast | Op::Reshape);
            let here = on_path && elementwise && t.numel() == e.numel();
            if here {
                pure.insert(t.id());
            }
            if !group.insert((t.id(), here)) {
                continue;
            }
            if matches!(t.op(), Op::Gather { .. } | Op::IndexSelect { .. }) {
                clean = false;
            }
            stack.extend(t.node().inputs.iter().map(|i| (i.clone(), here)));
        }
        if !clean || leaves.iter().any(|l| l.dtype().is_quantized() || !fits(l)) || leaves.len() + 1 > max_inputs {
            continue;
        }
        let product = leaves.iter().find(|m| {
            let Some(&mj) = at.get(&m.id()) else { return false };
            let mk = &s.kernels[mj];
            mk.kind == KernelKind::Matmul
                && mk.product.is_none()
                && m.numel() == e.numel()
                && m.dtype() == crate::DType::F32
                && !targets.contains(&m.id())
                && !off_path.contains(&m.id())
                && fits(m)
                && m.node().inputs.iter().all(|i| matmul_operand(i, &s.materialised).is_none_or(|(b, _)| fits(&b)))
                && readers.get(&m.id()).is_some_and(|r| {
                    r.iter().all(|id| pure.contains(id) && evaluated_by.get(id).is_some_and(|ks| ks == &[j]))
                })
        });
        if let Some(m) = product {
            fused.push((j, at[&m.id()]));
        }
    }
    if fused.is_empty() {
        return;
    }
    let gone: HashSet<usize> = fused.iter().map(|&(_, m)| m).collect();
    for &(j, m) in &fused {
        let prod = s.kernels[m].root.clone();
        s.materialised.remove(&prod.id());
        let k = &mut s.kernels[j];
        k.kind = KernelKind::Matmul;
        k.product = Some(prod);
    }
    let kernels = std::mem::take(&mut s.kernels);
    s.kernels = kernels.into_iter().enumerate().filter(|(j, _)| !gone.contains(j)).map(|(_, k)| k).collect();
}

/// Attention stores (wgpu): an element-wise kernel that only moves an attention's
/// output, through reshapes and permutes that keep each quad of its rows whole (the
/// heads merged back, `[b, heads, s, d] -> [b, s, heads * d]`), where nothing else reads
/// that output, becomes the attention's kernel (`product` is the attention node): the
/// attention stores each quad where the permutes send it, and the copy and its buffer
/// are gone. f32 only, head dims a multiple of 4; not for targets. (Native only: the
/// npm package's size budget.)
#[cfg(not(target_arch = "wasm32"))]
pub fn fuse_attention_stores(s: &mut Schedule, targets: &[Tensor]) {
    let targets: HashSet<u64> = targets.iter().map(|t| t.id()).collect();
    let at: HashMap<u64, usize> = s.kernels.iter().enumerate().map(|(j, k)| (k.root.id(), j)).collect();
    // How many unrealised nodes read each node.
    let mut readers: HashMap<u64, usize> = HashMap::new();
    for t in topo_order(&s.kernels.iter().map(|k| k.root.clone()).collect::<Vec<_>>()) {
        for i in &t.node().inputs {
            *readers.entry(i.id()).or_default() += 1;
        }
    }
    let quads = |t: &Tensor| t.dims().last().is_some_and(|&d| d % 4 == 0);
    let mut fused: Vec<(usize, usize)> = Vec::new();
    for (j, k) in s.kernels.iter().enumerate() {
        if k.kind != KernelKind::Elementwise || !k.siblings.is_empty() || k.root.dtype() != crate::DType::F32 {
            continue;
        }
        // Down the chain of reshapes and permutes, each read only by the one above it,
        // to the buffer under it.
        let mut t = k.root.clone();
        let (mut ok, mut permuted) = (true, false);
        while matches!(t.op(), Op::Reshape | Op::Permute { .. }) {
            if let Op::Permute { perm } = t.op() {
                ok &= perm.last() == Some(&(perm.len() - 1));
                permuted = true;
            }
            ok &= quads(&t) && (t.id() == k.root.id() || readers.get(&t.id()) == Some(&1));
            let next = t.node().inputs[0].clone();
            t = next;
            if s.is_buffer(&t) {
                break;
            }
        }
        let Some(&m) = at.get(&t.id()) else { continue };
        if !ok
            || !permuted
            || s.kernels[m].kind != KernelKind::Attention
            || s.kernels[m].product.is_some()
            || t.dtype() != crate::DType::F32
            || !quads(&t)
            || t.numel() != k.root.numel()
            || targets.contains(&t.id())
            || readers.get(&t.id()) != Some(&1)
        {
            continue;
        }
        fused.push((j, m));
    }
    if fused.is_empty() {
        return;
    }
    let gone: HashSet<usize> = fused.iter().map(|&(_, m)| m).collect();
    for &(j, m) in &fused {
        let prod = s.kernels[m].root.clone();
        s.materialised.remove(&prod.id());
        let k = &mut s.kernels[j];
        k.kind = KernelKind::Attention;
        k.product = Some(prod);
    }
    let kernels = std::mem::take(&mut s.kernels);
    s.kernels = kernels.into_iter().enumerate().filter(|(j, _)| !gone.contains(j)).map(|(_, k)| k).collect();
}

/// Most roots one multi-output element-wise kernel computes.
pub const MAX_SIBLINGS: usize = 6;

/// Horizontal fusion: element-wise kernels of one shape that share an input, or read
/// one another's outputs, become one kernel with several outputs (an optimiser's new
/// weight and both moments: one kernel per parameter instead of three). The first keeps
/// its place in the order and the others join it as `siblings`; inside the kernel a
/// sibling read by another is computed, not loaded. A kernel joins a group only when
/// every buffer it reads is realised, produced before the group's place or a member of
/// the group; when no in-place row write lies between; when the group's inputs and
/// extra outputs stay within `max_inputs` bindings; and when every tensor involved fits
/// one binding of `max_binding` bytes (multi-output kernels do not split into windows).
pub fn group_siblings(s: &mut Schedule, max_inputs: usize, max_binding: u64) {
    let mat = &s.materialised;
    let at: HashMap<u64, usize> = s.kernels.iter().enumerate().map(|(j, k)| (k.root.id(), j)).collect();
    // The buffers each kernel's fused expression reads.
    let reads = |root: &Tensor| -> Vec<Tensor> {
        let (mut out, mut seen) = (Vec::new(), HashSet::new());
        let mut stack: Vec<Tensor> = root.node().inputs.clone();
        while let Some(t) = stack.pop() {
            if !seen.insert(t.id()) {
                continue;
            }
            if t.is_realized() || mat.contains(&t.id()) {
                out.push(t);
            } else {
                stack.extend(t.node().inputs.iter().cloned());
            }
        }
        out
    };
    struct Group {
        first: usize,
        members: Vec<usize>,
        ids: HashSet<u64>,
        leaves: HashSet<u64>,
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut joined: HashMap<usize, usize> = HashMap::new();
    for (j, k) in s.kernels.iter().enumerate() {
        let fits = |t: &Tensor| t.storage_bytes() <= max_binding;
        if k.kind == KernelKind::Scatter {
            // No group reaches across an in-place write.
            groups.clear();
            continue;
        }
        if k.kind != KernelKind::Elementwise || !fits(&k.root) {
            continue;
        }
        let leaves = reads(&k.root);
        if !leaves.iter().all(fits) {
            continue;
        }
        let found = groups.iter().rposition(|g| {
            let head = &s.kernels[g.first].root;
            let ready = leaves.iter().all(|l| at.get(&l.id()).is_none_or(|&p| p < g.first || g.ids.contains(&l.id())));
            let related = leaves.iter().any(|l| g.leaves.contains(&l.id()) || g.ids.contains(&l.id()));
            let mut all: HashSet<u64> = g.leaves.iter().copied().chain(leaves.iter().map(|l| l.id())).collect();
            all.retain(|id| !g.ids.contains(id) && *id != k.root.id());
            head.dims() == k.root.dims()
                && ready
                && related
                && g.members.len() < MAX_SIBLINGS
                && all.len() + g.members.len() <= max_inputs
        });
        match found {
            Some(gi) => {
                let g = &mut groups[gi];
                g.members.push(j);
                g.ids.insert(k.root.id());
                g.leaves.extend(leaves.iter().map(|l| l.id()));
                joined.insert(j, g.first);
            }
            None => groups.push(Group {
                first: j,
                members: vec![j],
                ids: HashSet::from([k.root.id()]),
                leaves: leaves.iter().map(|l| l.id()).collect(),
            }),
        }
    }
    if joined.is_empty() {
        return;
    }
    let mut siblings: HashMap<usize, Vec<Tensor>> = HashMap::new();
    for (&j, &first) in &joined {
        siblings.entry(first).or_default().push(s.kernels[j].root.clone());
    }
    let mut kernels = Vec::with_capacity(s.kernels.len() - joined.len());
    for (j, mut k) in std::mem::take(&mut s.kernels).into_iter().enumerate() {
        if joined.contains_key(&j) {
            continue;
        }
        if let Some(mut sib) = siblings.remove(&j) {
            sib.sort_by_key(|t| at[&t.id()]);
            k.siblings = sib;
        }
        kernels.push(k);
    }
    s.kernels = kernels;
}

/// Group consecutive row writes (`ScatterRows`) over the same rows into one kernel: the
/// first keeps its place and the others become its `siblings`. For each touched row the
/// kernel applies every write in turn, so a sparse Adam step (both moments, then the
/// weights reading them) visits each row of its three tables once instead of in three
/// passes. A write joins when it has the group's rows and table shape, a table of its
/// own, and reads the group's tables only as an earlier write's result at the row it
/// writes (what the pass holds); its operands must leave room within `max_inputs`
/// bindings, counting each further table as one. Row writes promise distinct rows, so
/// one pass computes what the writes one after another would.
pub fn group_row_writes(s: &mut Schedule, max_inputs: usize) {
    /// The open group: its rows, table shape, tables, roots and the buffers it reads.
    struct Group {
        rows: u64,
        dims: Vec<usize>,
        tables: Vec<u64>,
        roots: Vec<u64>,
        reads: HashSet<u64>,
    }
    let mat = &s.materialised;
    let source = |t: &Tensor| buffer_source(t, mat).unwrap_or_else(|| t.clone()).id();
    let mut kernels: Vec<ScheduledKernel> = Vec::with_capacity(s.kernels.len());
    let mut open: Option<Group> = None;
    for k in std::mem::take(&mut s.kernels) {
        let Op::ScatterRows { rule, .. } = *k.root.op() else {
            open = None;
            kernels.push(k);
            continue;
        };
        let ins = &k.root.node().inputs;
        let (table, rows) = (source(&ins[0]), source(&ins[1]));
        // Each operand (after the table and rows) and the buffer it reads.
        let reads: Vec<(usize, u64)> = ins[2..].iter().enumerate().map(|(i, t)| (i, source(t))).collect();
        let joins = open.as_ref().is_some_and(|g| {
            let mut all = g.reads.clone();
            all.extend(reads.iter().map(|&(_, r)| r).filter(|r| !g.roots.contains(r)));
            g.rows == rows
                && g.dims == k.root.dims()
                && !g.tables.contains(&table)
                && !g.roots.contains(&table)
                && reads.iter().all(|&(i, r)| {
                    !g.tables.contains(&r) && r != table && (!g.roots.contains(&r) || rule.reads_at_row(i))
                })
                && g.roots.len() < MAX_SIBLINGS
                && all.len() + g.roots.len() < max_inputs
        });
        match open.as_mut().filter(|_| joins) {
            Some(g) => {
                g.tables.push(table);
                let roots = &g.roots;
                g.reads.extend(reads.iter().map(|&(_, r)| r).filter(|r| !roots.contains(r)));
                g.roots.push(k.root.id());
                kernels.last_mut().expect("the group's first write").siblings.push(k.root.clone());
            }
            None => {
                let reads = std::iter::once(rows).chain(reads.iter().map(|&(_, r)| r)).collect();
                open = Some(Group {
                    rows,
                    dims: k.root.dims().to_vec(),
                    tables: vec![table],
                    roots: vec![k.root.id()],
                    reads,
                });
                kernels.push(k);
            }
        }
    }
    s.kernels = kernels;
}

/// Move in-place row writes (`ScatterRows`) after every other kernel, so whatever reads
/// a table's old rows in this realisation (a forward pass, a gradient) runs before the
/// table is overwritten. Kept in place when a later kernel reads a write's result.
fn scatters_last(kernels: Vec<ScheduledKernel>, mat: &HashSet<u64>) -> Vec<ScheduledKernel> {
    let (scatters, rest): (Vec<_>, Vec<_>) = kernels.iter().cloned().partition(|k| k.kind == KernelKind::Scatter);
    if scatters.is_empty() {
        return kernels;
    }
    let written: HashSet<u64> = scatters.iter().map(|k| k.root.id()).collect();
    for k in &rest {
        let mut stack: Vec<Tensor> = k.root.node().inputs.clone();
        let mut seen = HashSet::new();
        while let Some(t) = stack.pop() {
            if !seen.insert(t.id()) {
                continue;
            }
            if written.contains(&t.id()) {
                return kernels;
            }
            if !t.is_realized() && !mat.contains(&t.id()) {
                stack.extend(t.node().inputs.iter().cloned());
            } else if t.node().op == Op::Reshape {
                stack.push(t.node().inputs[0].clone());
            }
        }
    }
    rest.into_iter().chain(scatters).collect()
}

/// If the fused group under `root` is too large, the id of a node to materialise.
fn oversized(root: &Tensor, mat: &HashSet<u64>, max_inputs: usize) -> Option<u64> {
    // For each node in the group: the set of leaves under it and its op count.
    let mut info: HashMap<u64, (HashSet<u64>, usize)> = HashMap::new();
    let mut group = Vec::new();
    fn visit(
        t: &Tensor,
        root: bool,
        mat: &HashSet<u64>,
        info: &mut HashMap<u64, (HashSet<u64>, usize)>,
        group: &mut Vec<Tensor>,
    ) -> (HashSet<u64>, usize) {
        if !root && (t.is_realized() || mat.contains(&t.id())) {
            return (HashSet::from([t.id()]), 0);
        }
        if let Some(v) = info.get(&t.id()) {
            return v.clone();
        }
        let mut leaves = HashSet::new();
        let mut ops = 1;
        for i in &t.node().inputs {
            let (l, o) = visit(i, false, mat, info, group);
            leaves.extend(l);
            ops = usize::saturating_add(ops, o);
        }
        info.insert(t.id(), (leaves.clone(), ops));
        group.push(t.clone());
        (leaves, ops)
    }
    let (leaves, ops) = visit(root, true, mat, &mut info, &mut group);
    if leaves.len() <= max_inputs && ops <= MAX_FUSED_OPS {
        return None;
    }
    // The largest proper sub-expression that itself fits; else the largest child.
    let best = group
        .iter()
        .filter(|t| t.id() != root.id() && !t.node().inputs.is_empty())
        .filter_map(|t| info.get(&t.id()).map(|(l, o)| (t, l.len(), *o)))
        .filter(|(_, l, o)| *l <= max_inputs && *o <= MAX_FUSED_OPS && (*l >= 2 || *o >= 2))
        .max_by_key(|(_, l, o)| (*l, *o))
        .map(|(t, _, _)| t.id());
    best.or_else(|| {
        root.node()
            .inputs
            .iter()
            .filter(|i| !i.is_realized() && !mat.contains(&i.id()))
            .max_by_key(|i| info.get(&i.id()).map(|(l, o)| (l.len(), *o)))
            .map(|i| i.id())
    })
}
