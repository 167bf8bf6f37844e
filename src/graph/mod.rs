//! The lazy IR. A [`Tensor`](crate::Tensor) is a handle to a [`Node`]; each node holds one
//! [`Op`] from a closed enum, its inputs, and its checked shape and dtype. Nothing runs
//! until a realisation asks for values; then [`schedule`] groups nodes into kernels and a
//! backend ([`crate::device`]) runs the schedule.

pub mod dot;
pub mod schedule;
pub mod signature;
pub mod trace;

use crate::{DType, Shape};

/// Element-wise functions of one input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    /// The error function.
    Erf,
    /// gelu with the exact erf.
    GeluErf,
    /// gelu with the tanh approximation.
    GeluTanh,
    Silu,
    Floor,
    Ceil,
    /// Round to nearest, halves to even.
    Round,
    Recip,
    /// Logical not of a mask.
    Not,
}

/// Element-wise functions of two inputs of one shape and dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Pow,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinaryOp {
    /// Comparisons produce a `Bool` mask.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }
}

/// Reductions. The node keeps reduced axes as size 1 (`keepdim`); dropping them is a reshape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    /// Index (as I32) of the first maximum; NaN counts as the maximum.
    ArgMax,
    /// Index (as I32) of the first minimum; NaN counts as the minimum.
    ArgMin,
}

/// Every operation the engine knows. Shapes and dtypes live on the node; an op carries
/// only what its shape and dtype do not say.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Data that came from the host or a previous realisation; storage is attached.
    Input,
    /// Every element equal to `value`.
    Full {
        value: f64,
    },
    /// `start + i * step` along a 1-D tensor.
    Arange {
        start: f64,
        step: f64,
    },
    /// Counter-based random numbers: uniform in [0, 1) or standard normal.
    Rand {
        seed: u64,
        normal: bool,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `where(mask, a, b)`, all three of one shape.
    Where,
    /// Conversion to the node's dtype.
    Cast,
    /// Same elements, new shape (row-major order).
    Reshape,
    /// numpy broadcast of the input to the node's shape.
    Expand,
    /// Output axis `i` is input axis `perm[i]`.
    Permute {
        perm: Vec<usize>,
    },
    /// Output coordinate `c` reads input coordinate `start + c * step`, per axis.
    Slice {
        starts: Vec<usize>,
        steps: Vec<usize>,
    },
    /// Constant padding; `before[i]` elements precede each axis.
    Pad {
        before: Vec<usize>,
        value: f64,
    },
    /// Inputs joined along `axis`.
    Concat {
        axis: usize,
    },
    /// `out[c] = x[c with c[axis] = index[c]]`; inputs `(x, index)`.
    Gather {
        axis: usize,
    },
    /// `out[c] = x[c with c[axis] = index[c[axis]]]`; inputs `(x, index)`, index 1-D.
    IndexSelect {
        axis: usize,
    },
    /// Reduction over `axes`, reduced axes kept as size 1.
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
    },
    /// Batched matmul `[.., m, k] @ [.., k, n]` with broadcast batch axes (same rank).
    Matmul,
    /// Fused attention `softmax(q k^T / sqrt(D) + bias) v` over inputs `(q [.., T, D],
    /// k [.., S, D], v [.., S, D])` and an optional additive f32 `bias` broadcastable to
    /// `[.., T, S]`; `causal` masks keys after each query (queries aligned with the end
    /// of the keys). Masked scores are -1e30.
    Attention {
        causal: bool,
    },
    /// Softmax (or log-softmax with `log`) of f32 values along `axis`, one kernel.
    Softmax {
        axis: usize,
        log: bool,
    },
    /// Layer (or, with `rms`, RMS) normalisation of f32 values over the last axis, times
    /// an optional weight and plus an optional bias (inputs `(x, weight?, bias?)`, each
    /// `[D]`), one kernel.
    Norm {
        rms: bool,
        eps: f64,
        weight: bool,
        bias: bool,
    },
    /// Sliding windows of `[N, C, H, W]` as `[N, C, kh*kw, OH, OW]` (im2col): output
    /// `[n, c, i*kw+j, oh, ow]` reads input `[n, c, oh*sh + i*dh - ph, ow*sw + j*dw - pw]`,
    /// or `pad_value` outside the input.
    Im2col {
        window: Window,
        pad_value: f64,
    },
    /// The adjoint of `Im2col`: `[N, C, kh*kw, OH, OW]` summed back onto the `[N, C, H, W]`
    /// positions each window element came from (col2im).
    Col2im {
        window: Window,
    },
    /// Quantisation of f32/f16 values (last axis a multiple of 32) into the node's block
    /// format, Q8_0 or Q4_0, by the same algorithm as [`crate::quant::quantize`]; one
    /// kernel that writes the GPU block layout.
    Quantize,
    /// Segment reduction over rows: inputs `(values [N, D], offsets [S + 1] I32,
    /// segment_ids [N] I32)`; output `[S, D]` row `s` reduces value rows
    /// `offsets[s]..offsets[s + 1]` by `op` (Sum, Max, or ArgMax: the position of the
    /// first maximum among all N rows, as I32). Empty segments give 0 (ArgMax -1).
    /// `segment_ids[k]` is the segment of row `k`: the kernel does not read it, the
    /// gradient does. Values are f32 and fuse into the kernel, so a gather of embedding
    /// rows times per-sample weights is one kernel (`nn::EmbeddingBag`).
    SegmentReduce {
        op: ReduceOp,
    },
    /// `x` (f32 `[R, D]`) with rows `rows[u]` rewritten by `rule` (see [`RowRule`]):
    /// inputs `(x, rows [U] I32, ..the rule's operands, gate)`, the gate (f32 `[]`, the
    /// rows stay as they are where it is 0) only when `gated`. The kernel writes into
    /// `x`'s buffer in place, so its cost is that of the `U` rows: `x` is consumed
    /// (after the realisation its contents are unspecified). Rows out of range are
    /// skipped; duplicates are the caller's to avoid. What sparse optimisers update
    /// tables with.
    ScatterRows {
        rule: RowRule,
        gated: bool,
    },
    /// Indices (I32, `[.., k]`) of the `k` largest values along the last axis, largest
    /// first, ties to the lower index, NaN the largest; one kernel, its input fused.
    TopK {
        k: usize,
    },
}

/// How `Op::ScatterRows` rewrites row `r = rows[u]` of a table `t`, element by element
/// (`h` is an f32 `[2]` operand, so its values change without changing the kernel):
/// - `Replace`, operands `(src [U, D])`: `t[r] = src[u]`;
/// - `Accumulate`, operands `(g [U, D], h)`: `t[r] = h0 * t[r] + h1 * g[u]` (`g[u]²` when
///   `square`): a moment's decay, or Adagrad's sum of squares;
/// - `Step`, operands `(num, den [R, D], h)`: `t[r] -= h0 * n / (sqrt(den[r]) + h1)`,
///   with `n = num[r]` (a table, `num_rows`) or `num[u]` (`[U, D]`): Adam's and
///   Adagrad's parameter step.
///
/// One pass over the rows, reading each operand once: a sparse optimiser's update is a
/// few such passes instead of gathers, an element-wise kernel and row copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowRule {
    Replace,
    Accumulate { square: bool },
    Step { num_rows: bool },
}

impl RowRule {
    /// The op's name under this rule (messages, DOT, kernel labels).
    pub fn op_name(self) -> &'static str {
        match self {
            RowRule::Replace => "scatter_rows",
            RowRule::Accumulate { .. } => "accumulate_rows",
            RowRule::Step { .. } => "step_rows",
        }
    }

    /// Operands after `(x, rows)`, the gate aside.
    pub fn operands(self) -> usize {
        match self {
            RowRule::Replace => 1,
            RowRule::Accumulate { .. } => 2,
            RowRule::Step { .. } => 3,
        }
    }

    /// Whether operand `i` (after `(x, rows)`) is read at the row written (a table),
    /// not at the touched row's position (`[U, D]`).
    pub fn reads_at_row(self, i: usize) -> bool {
        match self {
            RowRule::Step { num_rows } => (i == 0 && num_rows) || i == 1,
            RowRule::Replace | RowRule::Accumulate { .. } => false,
        }
    }
}

/// Geometry of a 2-D sliding window: `(rows, cols)` pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
}

impl Window {
    /// Output size `(OH, OW)` over an `h x w` input, if the window fits.
    pub fn output_size(&self, h: usize, w: usize) -> Option<(usize, usize)> {
        let one = |n: usize, k: usize, s: usize, p: usize, d: usize| -> Option<usize> {
            let span = d.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
            let padded = n.checked_add(p.checked_mul(2)?)?;
            if s == 0 || d == 0 || padded < span {
                return None;
            }
            Some((padded - span) / s + 1)
        };
        Some((
            one(h, self.kernel.0, self.stride.0, self.padding.0, self.dilation.0)?,
            one(w, self.kernel.1, self.stride.1, self.padding.1, self.dilation.1)?,
        ))
    }
}

impl Op {
    /// A short name for messages, DOT and kernel labels.
    pub fn name(&self) -> String {
        match self {
            Op::Input => "input".into(),
            Op::Full { .. } => "full".into(),
            Op::Arange { .. } => "arange".into(),
            Op::Rand { normal, .. } => if *normal { "randn" } else { "rand" }.into(),
            Op::Unary(u) => format!("{u:?}").to_lowercase(),
            Op::Binary(b) => format!("{b:?}").to_lowercase(),
            Op::Where => "where".into(),
            Op::Cast => "cast".into(),
            Op::Reshape => "reshape".into(),
            Op::Expand => "expand".into(),
            Op::Permute { .. } => "permute".into(),
            Op::Slice { .. } => "slice".into(),
            Op::Pad { .. } => "pad".into(),
            Op::Concat { .. } => "concat".into(),
            Op::Gather { .. } => "gather".into(),
            Op::IndexSelect { .. } => "index_select".into(),
            Op::Reduce { op, .. } => format!("reduce_{op:?}").to_lowercase(),
            Op::Matmul => "matmul".into(),
            Op::Attention { .. } => "attention".into(),
            Op::Softmax { log, .. } => if *log { "log_softmax" } else { "softmax" }.into(),
            Op::Norm { rms, .. } => if *rms { "rms_norm" } else { "layer_norm" }.into(),
            Op::Im2col { .. } => "im2col".into(),
            Op::Col2im { .. } => "col2im".into(),
            Op::Quantize => "quantize".into(),
            Op::SegmentReduce { op } => format!("segment_{op:?}").to_lowercase(),
            Op::ScatterRows { rule, .. } => rule.op_name().into(),
            Op::TopK { .. } => "topk".into(),
        }
    }

    /// The kind of kernel that computes this op: the one list of which ops fuse and
    /// which are always materialised. `None` for `Input` (data, no kernel).
    /// `Elementwise` ops compute one output element from a few input elements and fuse
    /// into the kernel of whatever consumes them (movement ops included: they only remap
    /// indices); every other kind always gets its own kernel and buffer.
    pub fn kernel_kind(&self) -> Option<KernelKind> {
        Some(match self {
            Op::Input => return None,
            Op::Reduce { .. } => KernelKind::Reduce,
            Op::Matmul => KernelKind::Matmul,
            Op::Attention { .. } => KernelKind::Attention,
            Op::Softmax { .. } => KernelKind::Softmax,
            Op::Norm { .. } => KernelKind::Norm,
            Op::Quantize => KernelKind::Quantize,
            Op::SegmentReduce { .. } => KernelKind::Segment,
            Op::ScatterRows { .. } => KernelKind::Scatter,
            Op::TopK { .. } => KernelKind::TopK,
            Op::Full { .. }
            | Op::Arange { .. }
            | Op::Rand { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Cast
            | Op::Reshape
            | Op::Expand
            | Op::Permute { .. }
            | Op::Slice { .. }
            | Op::Pad { .. }
            | Op::Concat { .. }
            | Op::Gather { .. }
            | Op::IndexSelect { .. }
            | Op::Im2col { .. }
            | Op::Col2im { .. } => KernelKind::Elementwise,
        })
    }

    /// Hash what of this op fixes the kernels it becomes: its kind and structural
    /// fields, not the scalars a cached plan refills (fill values, seeds, ranges).
    pub fn hash_structure<H: std::hash::Hasher>(&self, h: &mut H) {
        use std::hash::Hash;
        std::mem::discriminant(self).hash(h);
        match self {
            Op::Rand { normal, .. } => normal.hash(h),
            Op::Unary(u) => u.hash(h),
            Op::Binary(b) => b.hash(h),
            Op::Permute { perm } => perm.hash(h),
            Op::Slice { starts, steps } => (starts, steps).hash(h),
            Op::Pad { before, .. } => before.hash(h),
            Op::Concat { axis } | Op::Gather { axis } | Op::IndexSelect { axis } => axis.hash(h),
            Op::Reduce { op, axes } => (op, axes).hash(h),
            Op::Im2col { window, .. } | Op::Col2im { window } => window.hash(h),
            Op::Attention { causal } => causal.hash(h),
            Op::Softmax { axis, log } => (axis, log).hash(h),
            // eps is rendered into the meta, not patched: it is part of the structure.
            Op::Norm { rms, eps, weight, bias } => (rms, eps.to_bits(), weight, bias).hash(h),
            Op::SegmentReduce { op } => op.hash(h),
            Op::TopK { k } => k.hash(h),
            Op::ScatterRows { rule, gated } => (rule, gated).hash(h),
            Op::Input
            | Op::Full { .. }
            | Op::Arange { .. }
            | Op::Where
            | Op::Cast
            | Op::Reshape
            | Op::Expand
            | Op::Matmul
            | Op::Quantize => {}
        }
    }

    /// Whether this is a permute that swaps the last two axes and keeps the others (a
    /// matrix transpose, which products read in place).
    pub fn swaps_last_two_axes(&self) -> bool {
        matches!(self, Op::Permute { perm }
            if perm.len() >= 2
                && perm[..perm.len() - 2].iter().enumerate().all(|(i, &p)| i == p)
                && perm[perm.len() - 2] == perm.len() - 1)
    }

    /// Hand-written kernels over whole input buffers (attention, softmax, norm): their
    /// inputs are materialised rather than fused into them.
    pub fn reads_whole_buffers(&self) -> bool {
        self.kernel_kind().is_some_and(KernelKind::reads_whole_buffers)
    }

    /// Ops that fuse into a generated element-wise kernel.
    pub fn is_elementwise(&self) -> bool {
        self.kernel_kind() == Some(KernelKind::Elementwise)
    }
}

/// What a kernel computes (see [`Op::kernel_kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// A fused expression of element-wise and movement ops.
    Elementwise,
    /// A reduction, with the expression that feeds it fused in.
    Reduce,
    /// A batched matrix product.
    Matmul,
    /// Fused attention over whole buffers.
    Attention,
    /// Softmax or log-softmax along one axis.
    Softmax,
    /// Layer or RMS norm over the last axis.
    Norm,
    /// Quantisation into a block format, with its input expression fused in.
    Quantize,
    /// A segment reduction over rows, its values expression fused in.
    Segment,
    /// Rows written into a table's buffer in place (its operands materialised first).
    Scatter,
    /// The top k of each row, its input expression fused in.
    TopK,
}

impl KernelKind {
    /// Kernels that read their operands as whole buffers, never as fused expressions.
    pub fn reads_whole_buffers(self) -> bool {
        matches!(self, KernelKind::Attention | KernelKind::Softmax | KernelKind::Norm | KernelKind::Scatter)
    }
}

/// Shape and dtype of a node, as fixed when the op was called.
#[derive(Clone, Debug)]
pub struct NodeType {
    pub shape: Shape,
    pub dtype: DType,
}
