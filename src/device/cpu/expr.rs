//! Fused element-wise expressions on the CPU: the nodes a scheduled kernel fuses,
//! compiled into a [`Program`] and evaluated over chunks of output indices. Each op runs
//! as one tight loop over a chunk (a few thousand elements, so intermediates stay in
//! cache), never op by op over whole tensors. Movement ops rewrite the index set their
//! input is evaluated at: chains of permutes, broadcasts and slices fold into one
//! strided map at compile time; pads, concatenations, gathers and convolution windows
//! evaluate their input on the stretches that exist and place the results.

use super::buffer::{round_f16, CpuBuffer, HostBuffer, Vals};
use super::math::{self, map1, map2};
use crate::graph::{BinaryOp, Op, UnaryOp, Window};
use crate::reference::elementwise as refew;
use crate::{DType, Error, Result, Tensor};
use std::collections::HashMap;
use std::panic::Location;
use std::sync::Arc;

/// Output elements evaluated together: small enough for a chunk's intermediates to stay
/// in the core's cache, large enough that per-op overhead is noise.
pub(crate) const CHUNK: usize = 2048;

/// A set of linear indices into a node's output.
#[derive(Clone, Debug)]
pub(crate) enum Idx {
    /// `start..start + len`.
    Range(usize, usize),
    /// Consecutive stretches `(start, len)`: what a permute or broadcast that keeps the
    /// innermost axis makes of a range.
    Runs(Vec<(usize, usize)>),
    /// Arbitrary indices.
    List(Vec<usize>),
}

impl Idx {
    pub fn len(&self) -> usize {
        match self {
            Idx::Range(_, n) => *n,
            Idx::Runs(r) => r.iter().map(|r| r.1).sum(),
            Idx::List(v) => v.len(),
        }
    }

    /// Every index, in order.
    fn to_vec(&self) -> Vec<usize> {
        match self {
            Idx::Range(s, n) => (*s..s + n).collect(),
            Idx::Runs(r) => r.iter().flat_map(|&(s, n)| s..s + n).collect(),
            Idx::List(v) => v.clone(),
        }
    }

    /// The stretches of this set, as `(start, len)`.
    fn runs(&self) -> Vec<(usize, usize)> {
        match self {
            Idx::Range(s, n) => vec![(*s, *n)],
            Idx::Runs(r) => r.clone(),
            Idx::List(v) => v.iter().map(|&i| (i, 1)).collect(),
        }
    }
}

/// Append a stretch, merging it with the last one where they touch.
fn push_run(out: &mut Vec<(usize, usize)>, (s, n): (usize, usize)) {
    match out.last_mut() {
        Some(last) if last.0 + last.1 == s => last.1 += n,
        _ if n > 0 => out.push((s, n)),
        _ => {}
    }
}

#[derive(Debug)]
enum Kind {
    Leaf(Arc<CpuBuffer>),
    Full(f64),
    Arange {
        start: f64,
        step: f64,
    },
    Rand {
        seed: u64,
        normal: bool,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Where,
    Cast,
    /// Same linear index (a reshape).
    Identity,
    /// Input index `offset + sum(coord[d] * strides[d])` over this node's dims: a folded
    /// chain of permutes, broadcasts and slices.
    Strided {
        offset: usize,
        strides: Vec<usize>,
        contiguous: bool,
    },
    Pad {
        before: Vec<usize>,
        value: f64,
    },
    Concat {
        axis: usize,
    },
    Gather {
        axis: usize,
        loc: &'static Location<'static>,
    },
    IndexSelect {
        axis: usize,
        loc: &'static Location<'static>,
    },
    Im2col {
        window: Window,
        pad_value: f64,
    },
    Col2im {
        window: Window,
    },
}

#[derive(Debug)]
struct PNode {
    kind: Kind,
    dtype: DType,
    dims: Vec<usize>,
    inputs: Vec<usize>,
    /// Read by more than one node of the program: its chunk values are memoised.
    shared: bool,
}

/// A compiled fused expression.
#[derive(Debug)]
pub(crate) struct Program {
    nodes: Vec<PNode>,
    root: usize,
    /// More roots of the root's shape computed alongside it (a multi-output kernel).
    siblings: Vec<usize>,
}

/// How a strided map's input coordinate `e` follows from the output coordinates:
/// `base + mult * coord[src]`, or the constant `base` when `src` is `None`.
#[derive(Clone, Copy)]
struct AxisMap {
    base: usize,
    mult: usize,
    src: Option<usize>,
}

/// The coordinate map of a permute, expand or slice node, if `t` is one.
fn axis_maps(t: &Tensor) -> Option<Vec<AxisMap>> {
    let n = t.node();
    let id = n.inputs.first()?.dims();
    let od = t.dims();
    Some(match &n.op {
        Op::Permute { perm } => {
            let mut m = vec![AxisMap { base: 0, mult: 1, src: None }; id.len()];
            for (k, &p) in perm.iter().enumerate() {
                m[p] = AxisMap { base: 0, mult: 1, src: Some(k) };
            }
            m
        }
        Op::Expand => {
            let off = od.len() - id.len();
            id.iter()
                .enumerate()
                .map(|(j, &s)| AxisMap { base: 0, mult: 1, src: (s != 1).then_some(off + j) })
                .collect()
        }
        Op::Slice { starts, steps } => {
            (0..id.len()).map(|d| AxisMap { base: starts[d], mult: steps[d], src: Some(d) }).collect()
        }
        _ => return None,
    })
}

/// The value of `t` when it is an unrealised constant (`Full`) the kernel computes.
fn constant(t: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool) -> Option<f64> {
    match t.op() {
        Op::Full { value } if !t.is_realized() && !is_leaf(t) => Some(t.dtype().round(*value)),
        _ => None,
    }
}

/// Row-major strides of `dims`.
pub(crate) fn strides_of(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1];
    }
    s
}

impl Program {
    /// Compile the expression under `root` down to the tensors `is_leaf` names. With
    /// `is_kernel`, `root` is the node the kernel materialises (computed even though
    /// the schedule lists it as a buffer); otherwise it is an input expression of a
    /// reduction or quantisation, which may be a buffer itself. `buffer` gives a leaf's
    /// storage.
    pub fn compile(
        root: &Tensor,
        is_kernel: bool,
        is_leaf: &dyn Fn(&Tensor) -> bool,
        buffer: &dyn Fn(&Tensor) -> Result<Arc<CpuBuffer>>,
    ) -> Result<Program> {
        Program::compile_roots(std::slice::from_ref(root), is_kernel, is_leaf, buffer)
    }

    /// One program computing every one of `roots` (of one shape) at each index, with
    /// what they share computed once: a multi-output kernel. A root read by another is
    /// computed, not loaded, so `is_leaf` must not name the roots.
    pub fn compile_roots(
        roots: &[Tensor],
        is_kernel: bool,
        is_leaf: &dyn Fn(&Tensor) -> bool,
        buffer: &dyn Fn(&Tensor) -> Result<Arc<CpuBuffer>>,
    ) -> Result<Program> {
        let mut p = Program { nodes: Vec::new(), root: 0, siblings: Vec::new() };
        let mut ids: HashMap<u64, usize> = HashMap::new();
        let mut uses: HashMap<usize, usize> = HashMap::new();
        for (i, r) in roots.iter().enumerate() {
            let n = p.add(r, is_kernel, is_leaf, buffer, &mut ids, &mut uses)?;
            if i == 0 {
                p.root = n;
            } else {
                p.siblings.push(n);
            }
        }
        for (n, u) in uses {
            if u > 1 {
                p.nodes[n].shared = true;
            }
        }
        Ok(p)
    }

    fn add(
        &mut self,
        t: &Tensor,
        is_root: bool,
        is_leaf: &dyn Fn(&Tensor) -> bool,
        buffer: &dyn Fn(&Tensor) -> Result<Arc<CpuBuffer>>,
        ids: &mut HashMap<u64, usize>,
        uses: &mut HashMap<usize, usize>,
    ) -> Result<usize> {
        if let Some(&i) = ids.get(&t.id()) {
            *uses.entry(i).or_default() += 1;
            return Ok(i);
        }
        // Iterative over deep chains would be nicer; the scheduler bounds fused depth.
        let leaf = t.is_realized() || (!is_root && is_leaf(t)) || (is_root && matches!(t.op(), Op::Input));
        let (kind, inputs) = if leaf {
            (Kind::Leaf(buffer(t)?), Vec::new())
        } else {
            let n = t.node();
            let mut ins: Vec<Tensor> = n.inputs.clone();
            let kind = match &n.op {
                Op::Full { value } => Kind::Full(t.dtype().round(*value)),
                Op::Arange { start, step } => Kind::Arange { start: *start, step: *step },
                Op::Rand { seed, normal } => Kind::Rand { seed: *seed, normal: *normal },
                Op::Unary(u) => Kind::Unary(*u),
                Op::Binary(b) => Kind::Binary(*b),
                Op::Where => Kind::Where,
                Op::Cast => Kind::Cast,
                Op::Reshape => match constant(&n.inputs[0], is_leaf) {
                    Some(v) => {
                        ins = Vec::new();
                        Kind::Full(v)
                    }
                    None => Kind::Identity,
                },
                Op::Permute { .. } | Op::Expand | Op::Slice { .. } => {
                    // Fold the chain of coordinate maps down to its first other node.
                    let mut maps = axis_maps(t).unwrap_or_default();
                    let mut bottom = n.inputs[0].clone();
                    while !bottom.is_realized() && !is_leaf(&bottom) && !ids.contains_key(&bottom.id()) {
                        let Some(inner) = axis_maps(&bottom) else { break };
                        maps = inner
                            .iter()
                            .map(|im| match im.src {
                                None => *im,
                                Some(s) => {
                                    let o = maps[s];
                                    AxisMap { base: im.base + im.mult * o.base, mult: im.mult * o.mult, src: o.src }
                                }
                            })
                            .collect();
                        let next = bottom.node().inputs[0].clone();
                        bottom = next;
                    }
                    let bs = strides_of(bottom.dims());
                    let mut strides = vec![0; t.rank()];
                    let mut offset = 0;
                    for (e, m) in maps.iter().enumerate() {
                        offset += m.base * bs[e];
                        if let Some(s) = m.src {
                            strides[s] += m.mult * bs[e];
                        }
                    }
                    // A reshape keeps linear indices: read straight through it.
                    while !bottom.is_realized()
                        && !is_leaf(&bottom)
                        && !ids.contains_key(&bottom.id())
                        && matches!(bottom.op(), Op::Reshape)
                    {
                        let next = bottom.node().inputs[0].clone();
                        bottom = next;
                    }
                    let own = strides_of(t.dims());
                    let contiguous = t.dims().iter().zip(strides.iter().zip(&own)).all(|(&d, (s, o))| d <= 1 || s == o);
                    match constant(&bottom, is_leaf) {
                        // A view of a constant is the constant.
                        Some(v) => {
                            ins = Vec::new();
                            Kind::Full(v)
                        }
                        None => {
                            ins = vec![bottom];
                            Kind::Strided { offset, strides, contiguous }
                        }
                    }
                }
                Op::Pad { before, value } => Kind::Pad { before: before.clone(), value: *value },
                Op::Concat { axis } => Kind::Concat { axis: *axis },
                Op::Gather { axis } => Kind::Gather { axis: *axis, loc: n.location },
                Op::IndexSelect { axis } => {
                    // A planned gather's sort inputs serve its gradient only.
                    ins.truncate(2);
                    Kind::IndexSelect { axis: *axis, loc: n.location }
                }
                Op::Im2col { window, pad_value } => Kind::Im2col { window: *window, pad_value: *pad_value },
                Op::Col2im { window } => Kind::Col2im { window: *window },
                op => {
                    return Err(Error::Unsupported(format!(
                        "cpu: {} is not an element-wise op and cannot be fused",
                        op.name()
                    )))
                }
            };
            let mut inputs = Vec::with_capacity(ins.len());
            for i in &ins {
                inputs.push(self.add(i, false, is_leaf, buffer, ids, uses)?);
            }
            (kind, inputs)
        };
        self.nodes.push(PNode { kind, dtype: t.dtype(), dims: t.dims().to_vec(), inputs, shared: false });
        let i = self.nodes.len() - 1;
        ids.insert(t.id(), i);
        uses.insert(i, 1);
        Ok(i)
    }

    /// The root's dtype.
    pub fn dtype(&self) -> DType {
        self.nodes[self.root].dtype
    }

    /// The root's values at `idx`.
    pub fn eval(&self, idx: Idx) -> Result<Vals> {
        let mut ev = Evaluator { prog: self, memo: Vec::new(), next: 0 };
        let r = ev.idx(idx);
        ev.eval(self.root, &r)
    }

    /// Evaluate the whole root into a new buffer of its dtype, chunk by chunk (in
    /// parallel where it is large).
    pub fn run(&self, numel: usize) -> Result<HostBuffer> {
        // Zeros (an optimiser's moments, a gradient's start): a zeroed buffer without a
        // pass over it. Fresh pages then come from the OS as rows are first written, as
        // calloc's do: a table pays for the pages its rows use, when it uses them.
        if matches!(self.nodes[self.root].kind, Kind::Full(v) if v.to_bits() == 0) && !self.dtype().is_quantized() {
            return Ok(HostBuffer::zeros(self.dtype(), numel));
        }
        let mut out = HostBuffer::for_overwrite(self.dtype(), numel);
        write_chunks(&mut out, |start, n| self.eval(Idx::Range(start, n)))?;
        Ok(out)
    }

    /// Evaluate the root and its siblings into one new buffer each, chunk by chunk:
    /// every chunk computes all of them in one pass, sharing what they have in common.
    pub fn run_all(&self, numel: usize) -> Result<Vec<HostBuffer>> {
        let roots: Vec<usize> = std::iter::once(self.root).chain(self.siblings.iter().copied()).collect();
        let mut outs: Vec<HostBuffer> =
            roots.iter().map(|&r| HostBuffer::for_overwrite(self.nodes[r].dtype, numel)).collect();
        // Chunk c of every output, side by side.
        let mut per_chunk: Vec<Vec<OutChunk>> = (0..numel.div_ceil(CHUNK)).map(|_| Vec::new()).collect();
        for out in &mut outs {
            for (c, part) in OutChunk::split(out)?.into_iter().enumerate() {
                per_chunk[c].push(part);
            }
        }
        super::par::each(per_chunk, super::par::worth(numel), |c, parts| {
            let mut ev = Evaluator { prog: self, memo: Vec::new(), next: 0 };
            let at = ev.idx(Idx::Range(c * CHUNK, parts.first().map_or(0, OutChunk::len)));
            for (&r, part) in roots.iter().zip(parts) {
                part.store(ev.eval(r, &at)?)?;
            }
            Ok(())
        })?;
        Ok(outs)
    }
}

/// One chunk of an output buffer, to store computed values into.
enum OutChunk<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [half::f16]),
    I32(&'a mut [i32]),
    U32(&'a mut [u32]),
    B(&'a mut [u8]),
}

impl<'a> OutChunk<'a> {
    /// `out` in chunks of [`CHUNK`] elements.
    fn split(out: &'a mut HostBuffer) -> Result<Vec<OutChunk<'a>>> {
        Ok(match out {
            HostBuffer::F32(v) => v.chunks_mut(CHUNK).map(OutChunk::F32).collect(),
            HostBuffer::F16(v) => v.chunks_mut(CHUNK).map(OutChunk::F16).collect(),
            HostBuffer::I32(v) => v.chunks_mut(CHUNK).map(OutChunk::I32).collect(),
            HostBuffer::U32(v) => v.chunks_mut(CHUNK).map(OutChunk::U32).collect(),
            HostBuffer::Bool(v) => v.chunks_mut(CHUNK).map(OutChunk::B).collect(),
            HostBuffer::Quant(..) => {
                return Err(Error::Unsupported("cpu: an element-wise kernel cannot write blocks".into()))
            }
        })
    }

    fn len(&self) -> usize {
        match self {
            OutChunk::F32(c) => c.len(),
            OutChunk::F16(c) => c.len(),
            OutChunk::I32(c) => c.len(),
            OutChunk::U32(c) => c.len(),
            OutChunk::B(c) => c.len(),
        }
    }

    /// Store `v` (values in the compute type of the chunk's dtype). Outputs are not
    /// zeroed first (`HostBuffer::for_overwrite`), so values of another type are an
    /// error, never a chunk left as it was.
    fn store(self, v: Vals) -> Result<()> {
        use half::slice::HalfFloatSliceExt;
        match (self, v) {
            (OutChunk::F32(c), Vals::F(v)) => {
                c.copy_from_slice(&v);
                super::buffer::give_f32(v);
            }
            (OutChunk::F16(c), Vals::F(v)) => {
                c.convert_from_f32_slice(&v);
                super::buffer::give_f32(v);
            }
            (OutChunk::I32(c), Vals::I(v)) => c.copy_from_slice(&v),
            (OutChunk::U32(c), Vals::U(v)) => c.copy_from_slice(&v),
            (OutChunk::B(c), Vals::B(v)) => c.copy_from_slice(&v),
            _ => {
                return Err(Error::Unsupported(
                    "CPU backend: a kernel computed values of another type than its output".into(),
                ))
            }
        }
        Ok(())
    }
}

/// Fill `out` chunk by chunk with `f(start, len)` (in parallel over chunks).
pub(crate) fn write_chunks(out: &mut HostBuffer, f: impl Fn(usize, usize) -> Result<Vals> + Sync) -> Result<()> {
    let parts = OutChunk::split(out)?;
    let total: usize = parts.iter().map(OutChunk::len).sum();
    super::par::each(parts, super::par::worth(total), |c, part| {
        let n = part.len();
        part.store(f(c * CHUNK, n)?)
    })
}

/// An index set with an identity, so shared nodes evaluated at the same set are
/// computed once per chunk.
struct IdxRef {
    id: u64,
    idx: Idx,
}

struct Evaluator<'a> {
    prog: &'a Program,
    memo: Vec<(usize, u64, Vals)>,
    next: u64,
}

/// Elements of one block after `axis` (the product of the later dimensions).
fn inner_len(dims: &[usize], axis: usize) -> usize {
    dims[axis + 1..].iter().product()
}

/// Visit the stretches of `idx` (over `dims`, rank 1 or more; a list is stretches of
/// one) cut at the ends of rows of the innermost axis: `f(position, coords of its first
/// element, length)`.
fn each_row_piece(idx: &Idx, dims: &[usize], mut f: impl FnMut(usize, &[usize], usize)) {
    let r = dims.len();
    let mut c = vec![0usize; r];
    let mut p = 0;
    for (start, n) in idx.runs() {
        if n == 0 {
            continue;
        }
        crate::shape::unravel(start, dims, &mut c);
        let mut left = n;
        while left > 0 {
            let l = (dims[r - 1] - c[r - 1]).min(left);
            f(p, &c, l);
            (p, left) = (p + l, left - l);
            c[r - 1] += l;
            let mut d = r - 1;
            while d > 0 && c[d] == dims[d] {
                c[d] = 0;
                d -= 1;
                c[d] += 1;
            }
        }
    }
}

/// `offset + sum(coord[d] * strides[d])` for every index of `idx` over `dims`.
fn strided_indices(idx: &Idx, dims: &[usize], offset: usize, strides: &[usize]) -> Vec<usize> {
    let r = dims.len();
    let mut out = Vec::with_capacity(idx.len());
    match idx {
        Idx::Range(..) | Idx::Runs(_) if r > 0 => {
            let ls = strides[r - 1];
            for (start, n) in idx.runs() {
                strided_runs(start, n, dims, offset, strides, |(s, l)| out.extend((0..l).map(|j| s + j * ls)));
            }
        }
        Idx::Range(..) | Idx::Runs(_) => out.extend(std::iter::repeat_n(offset, idx.len())),
        Idx::List(v) => {
            for &i in v {
                let mut rem = i;
                let mut acc = offset;
                for d in (0..r).rev() {
                    let n = dims[d].max(1);
                    acc += (rem % n) * strides[d];
                    rem /= n;
                }
                out.push(acc);
            }
        }
    }
    out
}

/// The runs of [`strided_indices`] over `start..start + n`: `f((first source index,
/// length))` for each stretch along the innermost axis (whose stride the caller knows).
/// Called once per stretch of a chunk's index set, so it allocates nothing for ranks up
/// to 8.
fn strided_runs(
    start: usize,
    n: usize,
    dims: &[usize],
    offset: usize,
    strides: &[usize],
    mut f: impl FnMut((usize, usize)),
) {
    let r = dims.len();
    let (mut small, mut large) = ([0usize; 8], Vec::new());
    let c: &mut [usize] = if r <= small.len() {
        &mut small[..r]
    } else {
        large.resize(r, 0);
        &mut large
    };
    crate::shape::unravel(start, dims, c);
    let mut acc = offset + c.iter().zip(strides).map(|(a, b)| a * b).sum::<usize>();
    let (last, ls) = (dims[r - 1], strides[r - 1]);
    let mut left = n;
    while left > 0 {
        let run = (last - c[r - 1]).min(left);
        f((acc, run));
        left -= run;
        acc += run * ls;
        c[r - 1] += run;
        let mut d = r - 1;
        while c[d] == dims[d] && d > 0 {
            acc -= dims[d] * strides[d];
            c[d] = 0;
            d -= 1;
            c[d] += 1;
            acc += strides[d];
        }
    }
}

impl<'a> Evaluator<'a> {
    fn idx(&mut self, idx: Idx) -> IdxRef {
        self.next += 1;
        IdxRef { id: self.next, idx }
    }

    fn eval(&mut self, n: usize, at: &IdxRef) -> Result<Vals> {
        let node = &self.prog.nodes[n];
        if node.shared {
            if let Some((_, _, v)) = self.memo.iter().find(|(m, id, _)| *m == n && *id == at.id) {
                return Ok(v.clone());
            }
        }
        let v = self.compute(n, at)?;
        if node.shared {
            self.memo.push((n, at.id, v.clone()));
        }
        Ok(v)
    }

    /// Evaluate input `n` at fresh indices.
    fn eval_at(&mut self, n: usize, idx: Idx) -> Result<Vals> {
        let r = self.idx(idx);
        self.eval(n, &r)
    }

    /// Input `n` at `idx` (stretches or a list). Many short stretches of an expression
    /// (a nearest-neighbour resize reads each value twice, in stretches of one along its
    /// last axis; a window tap over 14x14 images, rows of 14) are computed once over the
    /// span they cover, where that holds no more values than they ask for, and picked
    /// from it: one element a stretch took 95 ns an element through a resized
    /// hard-swish.
    fn eval_spanned(&mut self, n: usize, idx: Idx) -> Result<Vals> {
        // How many pieces the indices come in, and the span [lo, hi) they cover.
        let (pieces, lo, hi) = match &idx {
            Idx::Range(..) => (1, 0, 0),
            Idx::Runs(r) => r
                .iter()
                .filter(|r| r.1 > 0)
                .fold((r.len(), usize::MAX, 0), |(k, lo, hi), &(s, l)| (k, lo.min(s), hi.max(s + l))),
            Idx::List(v) => v.iter().fold((v.len(), usize::MAX, 0), |(k, lo, hi), &i| (k, lo.min(i), hi.max(i + 1))),
        };
        let len = idx.len();
        let leaf = matches!(self.prog.nodes[n].kind, Kind::Leaf(_));
        if leaf || pieces < 2 || lo >= hi || hi - lo > len {
            return self.eval_at(n, idx);
        }
        let span = self.eval_at(n, Idx::Range(lo, hi - lo))?;
        Ok(span.pick_runs(&idx.runs(), 1, lo))
    }

    /// A chunk of `len` values that are `fill` except at the stretches `pos`, which
    /// hold input `src` evaluated at the stretches `from` (each stepping by `step`), in
    /// order.
    fn placed(
        &mut self,
        dtype: DType,
        len: usize,
        fill: f64,
        src: usize,
        (from, step): (Vec<(usize, usize)>, usize),
        pos: &[(usize, usize)],
    ) -> Result<Vals> {
        let mut out = Vals::splat(dtype, dtype.round(fill), len);
        if !from.is_empty() {
            let v = match (&self.prog.nodes[src].kind, step) {
                (_, 1) => self.eval_spanned(src, Idx::Runs(from))?,
                (Kind::Leaf(b), _) => b.load_runs(&from, step),
                // An expression is computed over each stretch's whole span and every
                // step-th value picked: up to 4x the values, but a stretch at a time (a
                // list, one element at a time, made a 3x3 stride-2 max pool of a
                // batch-normed relu 46 ms over 24 channels of 112x112).
                (_, 2..=4) => {
                    let spans: Vec<(usize, usize)> =
                        from.iter().map(|&(s, l)| (s, (l.max(1) - 1) * step + 1)).collect();
                    let mut at = 0;
                    let picks: Vec<(usize, usize)> = spans
                        .iter()
                        .zip(&from)
                        .map(|(&(_, sl), &(_, l))| {
                            at += sl;
                            (at - sl, l)
                        })
                        .collect();
                    self.eval_at(src, Idx::Runs(spans))?.pick_runs(&picks, step, 0)
                }
                _ => {
                    let list = from.iter().flat_map(|&(s, l)| (0..l).map(move |j| s + j * step)).collect();
                    self.eval_at(src, Idx::List(list))?
                }
            };
            out.place(pos, &v);
        }
        Ok(out)
    }

    /// Binary node `n` as `x op c` or `c op x` with `c` an f32 constant (`x * 2 + 1`):
    /// one pass with the constant in a register, where splatting it first allocated
    /// and filled a chunk of it and the pass read that back. The same float operations
    /// as [`binary`], so the same bits. `None` for other ops, dtypes or operands.
    fn with_constant(&mut self, op: BinaryOp, n: usize, at: &IdxRef) -> Result<Option<Vals>> {
        use BinaryOp::*;
        let prog = self.prog;
        let ins = &prog.nodes[n].inputs;
        let f32s = ins.iter().chain([&n]).all(|&k| prog.nodes[k].dtype == DType::F32);
        if !f32s || !matches!(op, Add | Sub | Mul | Div | Maximum | Minimum) {
            return Ok(None);
        }
        let full = |k: usize| match prog.nodes[k].kind {
            Kind::Full(v) => Some(v as f32),
            _ => None,
        };
        let (x, c, left) = match (full(ins[0]), full(ins[1])) {
            (_, Some(c)) => (ins[0], c, false),
            (Some(c), None) => (ins[1], c, true),
            _ => return Ok(None),
        };
        let nan_or = |a: f32, b: f32, f: fn(f32, f32) -> f32| if a.is_nan() || b.is_nan() { f32::NAN } else { f(a, b) };
        let Vals::F(mut a) = self.eval(x, at)? else {
            return Err(Error::Unsupported("cpu: an f32 node evaluated to other values".into()));
        };
        match (op, left) {
            (Add, false) => map1(&mut a, |a| a + c),
            (Add, true) => map1(&mut a, |a| c + a),
            (Sub, false) => map1(&mut a, |a| a - c),
            (Sub, true) => map1(&mut a, |a| c - a),
            (Mul, false) => map1(&mut a, |a| a * c),
            (Mul, true) => map1(&mut a, |a| c * a),
            (Div, false) => map1(&mut a, |a| a / c),
            (Div, true) => map1(&mut a, |a| c / a),
            (Maximum, false) => map1(&mut a, |a| nan_or(a, c, f32::max)),
            (Maximum, true) => map1(&mut a, |a| nan_or(c, a, f32::max)),
            (Minimum, false) => map1(&mut a, |a| nan_or(a, c, f32::min)),
            _ => map1(&mut a, |a| nan_or(c, a, f32::min)),
        }
        Ok(Some(Vals::F(a)))
    }

    fn compute(&mut self, n: usize, at: &IdxRef) -> Result<Vals> {
        let prog = self.prog;
        let node = &prog.nodes[n];
        let dt = node.dtype;
        let len = at.idx.len();
        let ins = &node.inputs;
        Ok(match &node.kind {
            Kind::Leaf(b) => match &at.idx {
                Idx::Range(s, l) => b.load_range(*s, *l),
                Idx::Runs(r) => b.load_runs(r, 1),
                Idx::List(v) => b.load_list(v),
            },
            Kind::Full(v) => Vals::splat(dt, *v, len),
            Kind::Arange { start, step } => {
                let vals: Vec<f64> = at.idx.to_vec().into_iter().map(|i| dt.round(start + i as f64 * step)).collect();
                from_f64(dt, &vals)
            }
            #[cfg(not(target_arch = "wasm32"))]
            Kind::Rand { seed, normal } if dt == DType::F32 && matches!(at.idx, Idx::Range(..)) => {
                let mut v = vec![0f32; len];
                math::rand_into(&mut v, *seed, *normal, if let Idx::Range(s, _) = at.idx { s } else { 0 });
                Vals::F(v)
            }
            Kind::Rand { seed, normal } => {
                let vals: Vec<f64> =
                    at.idx.to_vec().into_iter().map(|i| dt.round(refew::rand_at(*seed, *normal, i))).collect();
                from_f64(dt, &vals)
            }
            Kind::Unary(u) => {
                let x = self.eval(ins[0], at)?;
                unary(*u, x, dt)
            }
            Kind::Binary(b) => match self.with_constant(*b, n, at)? {
                Some(v) => v,
                None => {
                    let x = self.eval(ins[0], at)?;
                    let y = self.eval(ins[1], at)?;
                    binary(*b, x, y, prog.nodes[ins[0]].dtype, dt)
                }
            },
            Kind::Where => {
                let m = self.eval(ins[0], at)?;
                let a = self.eval(ins[1], at)?;
                let b = self.eval(ins[2], at)?;
                select(m, a, b)
            }
            Kind::Cast => {
                let x = self.eval(ins[0], at)?;
                cast(x, prog.nodes[ins[0]].dtype, dt)
            }
            Kind::Identity => self.eval(ins[0], at)?,
            Kind::Strided { offset, strides, contiguous } => {
                let last = strides.last().copied();
                match (&at.idx, &prog.nodes[ins[0]].kind) {
                    (Idx::Range(s, l), _) if *contiguous => self.eval_at(ins[0], Idx::Range(offset + s, *l))?,
                    (Idx::Runs(r), _) if *contiguous => {
                        self.eval_at(ins[0], Idx::Runs(r.iter().map(|&(s, l)| (offset + s, l)).collect()))?
                    }
                    // Stretches along the innermost axis: a view of a buffer copies them
                    // (rows of a broadcast, say); an expression is evaluated once over
                    // the window they span when that is no more than they hold (a
                    // broadcast repeats its input: each value is computed once, not once
                    // per copy), else on the stretches themselves (once per stretch
                    // when each repeats one value).
                    (Idx::Range(..) | Idx::Runs(_), kind) if last.is_some() => {
                        let ls = last.unwrap_or(1);
                        let mut runs = Vec::new();
                        for (s, l) in at.idx.runs() {
                            strided_runs(s, l, &node.dims, *offset, strides, |run| {
                                // Stretches that touch merge only when they step by 1.
                                if ls == 1 {
                                    push_run(&mut runs, run);
                                } else {
                                    runs.push(run);
                                }
                            });
                        }
                        let (lo, hi) = runs
                            .iter()
                            .filter(|r| r.1 > 0)
                            .fold((usize::MAX, 0), |(lo, hi), &(s, l)| (lo.min(s), hi.max(s + (l - 1) * ls)));
                        match kind {
                            Kind::Leaf(b) => b.load_runs(&runs, ls),
                            _ if lo <= hi && hi - lo < len => {
                                self.eval_at(ins[0], Idx::Range(lo, hi - lo + 1))?.pick_runs(&runs, ls, lo)
                            }
                            _ if ls == 1 => self.eval_at(ins[0], Idx::Runs(runs))?,
                            // Each stretch repeats one value: evaluate those, then repeat.
                            _ if ls == 0 => {
                                let v = self.eval_at(ins[0], Idx::List(runs.iter().map(|r| r.0).collect()))?;
                                let reps: Vec<(usize, usize)> =
                                    runs.iter().enumerate().map(|(j, r)| (j, r.1)).collect();
                                v.pick_runs(&reps, 0, 0)
                            }
                            _ => {
                                self.eval_at(ins[0], Idx::List(strided_indices(&at.idx, &node.dims, *offset, strides)))?
                            }
                        }
                    }
                    (i, _) => self.eval_at(ins[0], Idx::List(strided_indices(i, &node.dims, *offset, strides)))?,
                }
            }
            Kind::Pad { .. } if node.dims.is_empty() => self.eval(ins[0], at)?,
            Kind::Pad { before, value } => {
                // Along each row of the innermost axis the input's part is one stretch.
                let from = &prog.nodes[ins[0]].dims;
                let fs = strides_of(from);
                let r = node.dims.len();
                let (b, f) = (before[r - 1], from[r - 1]);
                let (mut src, mut pos) = (Vec::new(), Vec::new());
                each_row_piece(&at.idx, &node.dims, |p, c, l| {
                    let mut acc = 0;
                    for d in 0..r - 1 {
                        if c[d] < before[d] || c[d] - before[d] >= from[d] {
                            return;
                        }
                        acc += (c[d] - before[d]) * fs[d];
                    }
                    let (lo, hi) = (c[r - 1].max(b), (c[r - 1] + l).min(b + f));
                    if lo < hi {
                        push_run(&mut src, (acc + lo - b, hi - lo));
                        push_run(&mut pos, (p + lo - c[r - 1], hi - lo));
                    }
                });
                self.placed(dt, len, *value, ins[0], (src, 1), &pos)?
            }
            Kind::Concat { axis } => {
                // Each block of the elements after the axis is one stretch of one input:
                // each input is evaluated once, on its stretches, and they are placed.
                let inner = inner_len(&node.dims, *axis);
                let na = node.dims[*axis];
                let mut starts = Vec::with_capacity(ins.len());
                let mut acc = 0;
                for &i in ins {
                    starts.push(acc);
                    acc += prog.nodes[i].dims[*axis];
                }
                // Per input: its stretches, and where their values go in the chunk.
                let mut parts: Vec<[Vec<(usize, usize)>; 2]> = vec![Default::default(); ins.len()];
                let mut p = 0;
                for (start, n) in at.idx.runs() {
                    let mut i = start;
                    while i < start + n {
                        let l = ((i / inner + 1) * inner).min(start + n) - i;
                        let c = (i / inner) % na;
                        let k = starts.partition_point(|&s| s <= c) - 1;
                        let size = prog.nodes[ins[k]].dims[*axis];
                        let src = ((i / inner / na) * size + c - starts[k]) * inner + i % inner;
                        push_run(&mut parts[k][0], (src, l));
                        push_run(&mut parts[k][1], (p, l));
                        (p, i) = (p + l, i + l);
                    }
                }
                let mut out = Vals::splat(dt, 0.0, len);
                for (k, [src, pos]) in parts.into_iter().enumerate() {
                    if !src.is_empty() {
                        let idx = if src.len() == 1 { Idx::Range(src[0].0, src[0].1) } else { Idx::Runs(src) };
                        let v = self.eval_at(ins[k], idx)?;
                        out.place(&pos, &v);
                    }
                }
                out
            }
            Kind::Gather { axis, loc } => {
                let index = self.eval(ins[1], at)?.to_i64();
                let xd = &prog.nodes[ins[0]].dims;
                let xs = strides_of(xd);
                let mut src = Vec::with_capacity(len);
                let mut bad = None;
                let last = node.dims.len() - 1;
                each_row_piece(&at.idx, &node.dims, |p, c, l| {
                    // The input offset of the piece's coordinates off the axis.
                    let base: usize = (0..=last).filter(|&d| d != *axis).map(|d| c[d] * xs[d]).sum();
                    for (j, &v) in index[p..p + l].iter().enumerate() {
                        if v < 0 || v as usize >= xd[*axis] {
                            bad.get_or_insert(v);
                            src.push(0);
                        } else {
                            let along = if last == *axis { 0 } else { j * xs[last] };
                            src.push(base + along + v as usize * xs[*axis]);
                        }
                    }
                });
                if let Some(v) = bad {
                    return Err(out_of_range("gather", v, *axis, xd[*axis], loc));
                }
                self.eval_spanned(ins[0], Idx::List(src))?
            }
            Kind::IndexSelect { axis, loc } => {
                // Rows of a table (or any block after the axis): one index load and one
                // stretch of the input per block, copied by the load.
                let stretches = at.idx.runs();
                let xd = &prog.nodes[ins[0]].dims;
                let inner = inner_len(&node.dims, *axis);
                let (na, xa) = (node.dims[*axis], xd[*axis]);
                let mut blocks = Vec::new();
                for (start, n) in stretches {
                    let mut p = start;
                    while p < start + n {
                        let end = ((p / inner + 1) * inner).min(start + n);
                        blocks.push((p, end - p));
                        p = end;
                    }
                }
                let which: Vec<usize> = blocks.iter().map(|&(p, _)| (p / inner) % na).collect();
                let index = self.eval_at(ins[1], Idx::List(which))?.to_i64();
                if let Some(&v) = index.iter().find(|&&v| v < 0 || v as usize >= xa) {
                    return Err(out_of_range("index_select", v, *axis, xa, loc));
                }
                let runs = blocks
                    .iter()
                    .zip(&index)
                    .map(|(&(p, len), &i)| ((p / inner / na * xa + i as usize) * inner + p % inner, len))
                    .collect();
                self.eval_spanned(ins[0], Idx::Runs(runs))?
            }
            Kind::Im2col { window, pad_value } => {
                // Along an output row (x) a tap reads one stretch of an input row (every
                // stride-th element of it: stretches of one past a stride of 1).
                let xd = &prog.nodes[ins[0]].dims;
                let (h, w) = (xd[2] as isize, xd[3] as isize);
                let (kw, s1) = (window.kernel.1, window.stride.1 as isize);
                let ceil = |a: isize| -((-a).div_euclid(s1));
                let (mut src, mut pos) = (Vec::new(), Vec::new());
                each_row_piece(&at.idx, &node.dims, |p, c, l| {
                    let (k, y, x0) = (c[2], c[3], c[4] as isize);
                    let sh = (y * window.stride.0 + (k / kw) * window.dilation.0) as isize - window.padding.0 as isize;
                    // Input column of output column x: x * s1 + shift.
                    let shift = ((k % kw) * window.dilation.1) as isize - window.padding.1 as isize;
                    let (lo, hi) = (x0.max(ceil(-shift)), (x0 + l as isize).min(ceil(w - shift)));
                    if sh < 0 || sh >= h || lo >= hi {
                        return;
                    }
                    let row = ((c[0] * xd[1] + c[1]) * h as usize + sh as usize) * w as usize;
                    let at = |x: isize| (row as isize + x * s1 + shift) as usize;
                    // Past a stride of 1 the stretch steps by the stride (loaded as such
                    // from a buffer: one element a run took 10 ns an element, a 3x3
                    // stride-2 depthwise convolution 27 ms over 48 channels of 160x160).
                    if s1 == 1 {
                        push_run(&mut src, (at(lo), (hi - lo) as usize));
                    } else {
                        src.push((at(lo), (hi - lo) as usize));
                    }
                    push_run(&mut pos, (p + (lo - x0) as usize, (hi - lo) as usize));
                });
                self.placed(dt, len, *pad_value, ins[0], (src, s1 as usize), &pos)?
            }
            Kind::Col2im { window } => {
                // Along an image row (w) each tap reads one stretch of a column row (past
                // a stride of 1, added to every s1-th pixel): the stretches are read at
                // once, then summed into the row tap by tap (the per-pixel sum's order).
                let cd = &prog.nodes[ins[0]].dims;
                let (kk, oh, ow) = (cd[2], cd[3] as isize, cd[4] as isize);
                let (kh, kw) = window.kernel;
                let (s0, p0, d0) = (window.stride.0, window.padding.0, window.dilation.0);
                let s1 = window.stride.1 as isize;
                let (mut src, mut dst) = (Vec::new(), Vec::new());
                each_row_piece(&at.idx, &node.dims, |p, c, l| {
                    for i in 0..kh {
                        let t = (c[2] + p0) as isize - (i * d0) as isize;
                        if t < 0 || !(t as usize).is_multiple_of(s0) || (t as usize / s0) as isize >= oh {
                            continue;
                        }
                        let y = t as usize / s0;
                        for j in 0..kw {
                            // Column x of image column w: (w + shift) / s1, where it divides.
                            let shift = window.padding.1 as isize - (j * window.dilation.1) as isize;
                            let w0 = c[3] as isize;
                            let (lo, hi) = (w0.max(-shift), (w0 + l as isize).min(ow * s1 - shift));
                            let row = (((c[0] * cd[1] + c[1]) * kk + i * kw + j) * oh as usize + y) * ow as usize;
                            // The image columns the stride reaches, from the first at
                            // or past `lo`: consecutive columns, every s1-th pixel (one
                            // by one, a 3x3 stride-2 convolution's input gradient took
                            // 27 ms over 8x32x56x56).
                            let first = lo + (-(lo + shift)).rem_euclid(s1);
                            if first < hi {
                                let count = ((hi - 1 - first) / s1 + 1) as usize;
                                src.push((row + ((first + shift) / s1) as usize, count));
                                dst.push((p + (first - w0) as usize, count));
                            }
                        }
                    }
                });
                let zero: f32 = std::iter::empty::<f32>().sum();
                let mut out = vec![zero; len];
                if !src.is_empty() {
                    let Vals::F(v) = self.eval_at(ins[0], Idx::Runs(src))? else {
                        return Err(Error::Unsupported("cpu: col2im of a non-float tensor".into()));
                    };
                    let (mut at, step) = (0, s1 as usize);
                    for &(d, l) in &dst {
                        let v = &v[at..at + l];
                        if step == 1 {
                            out[d..d + l].iter_mut().zip(v).for_each(|(o, &x)| *o += x);
                        } else {
                            out[d..].iter_mut().step_by(step).zip(v).for_each(|(o, &x)| *o += x);
                        }
                        at += l;
                    }
                }
                if dt == DType::F16 {
                    round_f16(&mut out);
                }
                Vals::F(out)
            }
        })
    }
}

fn out_of_range(op: &'static str, v: i64, axis: usize, size: usize, loc: &'static Location<'static>) -> Error {
    Error::IndexOutOfRange { op, index: v, axis, size, location: loc }
}

/// Values of `dt` from exact f64s.
fn from_f64(dt: DType, v: &[f64]) -> Vals {
    match dt {
        DType::I32 => Vals::I(v.iter().map(|&x| x as i32).collect()),
        DType::U32 => Vals::U(v.iter().map(|&x| x as u32).collect()),
        DType::Bool => Vals::B(v.iter().map(|&x| u8::from(x != 0.0)).collect()),
        _ => Vals::F(v.iter().map(|&x| x as f32).collect()),
    }
}

/// The slow, exact path for combinations without a typed loop: through the reference.
fn via_f64(x: &Vals, f: impl Fn(f64, usize) -> f64, dt: DType) -> Vals {
    let v: Vec<f64> = (0..x.len()).map(|i| dt.round(f(x.get_f64(i), i))).collect();
    from_f64(dt, &v)
}

fn f16_if(dt: DType, mut v: Vec<f32>) -> Vals {
    if dt == DType::F16 {
        round_f16(&mut v);
    }
    Vals::F(v)
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + math::exp(-x))
}

/// One unary op over a chunk; `dt` is the node's dtype.
// The long functions (tanh, erf, GELU) go to `map1_inlined` in `#[inline(always)]`
// closures: as function items they ran out of line at the baseline's width.
#[allow(clippy::redundant_closure)]
pub(crate) fn unary(u: UnaryOp, x: Vals, dt: DType) -> Vals {
    match x {
        Vals::F(_) if u == UnaryOp::Not && dt == DType::Bool => {
            let Vals::F(v) = x else { unreachable!() };
            Vals::B(v.iter().map(|&x| u8::from(x == 0.0)).collect())
        }
        Vals::F(mut v) => {
            match u {
                UnaryOp::Neg => map1(&mut v, |x| -x),
                UnaryOp::Abs => map1(&mut v, f32::abs),
                UnaryOp::Exp => map1(&mut v, math::exp),
                #[cfg(not(target_arch = "wasm32"))]
                UnaryOp::Log => math::map1_inlined(
                    &mut v,
                    #[inline(always)]
                    |x| math::ln(x),
                ),
                // wasm keeps the library's: the npm package has no room for another loop.
                #[cfg(target_arch = "wasm32")]
                UnaryOp::Log => map1(&mut v, f32::ln),
                UnaryOp::Sqrt => map1(&mut v, f32::sqrt),
                UnaryOp::Rsqrt => map1(&mut v, |x| 1.0 / x.sqrt()),
                #[cfg(not(target_arch = "wasm32"))]
                UnaryOp::Sin => math::sin_cos_in_place(&mut v, false),
                #[cfg(not(target_arch = "wasm32"))]
                UnaryOp::Cos => math::sin_cos_in_place(&mut v, true),
                #[cfg(target_arch = "wasm32")]
                UnaryOp::Sin => map1(&mut v, f32::sin),
                #[cfg(target_arch = "wasm32")]
                UnaryOp::Cos => map1(&mut v, f32::cos),
                UnaryOp::Tanh => math::map1_inlined(
                    &mut v,
                    #[inline(always)]
                    |x| math::tanh(x),
                ),
                UnaryOp::Sigmoid => map1(&mut v, sigmoid),
                UnaryOp::Relu => map1(&mut v, |x| if x < 0.0 { 0.0 } else { x }),
                UnaryOp::Erf => math::map1_inlined(
                    &mut v,
                    #[inline(always)]
                    |x| math::erf(x),
                ),
                UnaryOp::GeluErf => math::map1_inlined(
                    &mut v,
                    #[inline(always)]
                    |x| math::gelu_erf(x),
                ),
                UnaryOp::GeluTanh => map1(&mut v, |x| {
                    let k = (2.0f32 / std::f32::consts::PI).sqrt();
                    0.5 * x * (1.0 + math::tanh(k * (x + 0.044715 * x * x * x)))
                }),
                UnaryOp::Silu => map1(&mut v, |x| x * sigmoid(x)),
                UnaryOp::Floor => map1(&mut v, f32::floor),
                UnaryOp::Ceil => map1(&mut v, f32::ceil),
                UnaryOp::Round => map1(&mut v, f32::round_ties_even),
                UnaryOp::Recip => map1(&mut v, |x| 1.0 / x),
                UnaryOp::Not => map1(&mut v, |x| if x == 0.0 { 1.0 } else { 0.0 }),
            }
            f16_if(dt, v)
        }
        Vals::I(mut v) if matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu) => {
            match u {
                UnaryOp::Neg => map1(&mut v, i32::wrapping_neg),
                UnaryOp::Abs => map1(&mut v, i32::wrapping_abs),
                _ => map1(&mut v, |x| x.max(0)),
            }
            Vals::I(v)
        }
        Vals::U(mut v) if matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu) => {
            if u == UnaryOp::Neg {
                map1(&mut v, u32::wrapping_neg);
            }
            Vals::U(v)
        }
        Vals::B(v) if u == UnaryOp::Not => Vals::B(v.iter().map(|&x| u8::from(x == 0)).collect()),
        x => via_f64(&x, |a, _| refew::unary(u, a, dt), dt),
    }
}

/// One binary op over two chunks of one compute type; `in_dt` is the inputs' dtype and
/// `dt` the node's.
pub(crate) fn binary(op: BinaryOp, x: Vals, y: Vals, in_dt: DType, dt: DType) -> Vals {
    #[inline(always)]
    fn cmp<T: PartialOrd + Copy>(op: BinaryOp, a: &[T], b: &[T]) -> Vals {
        #[inline(always)]
        fn go<T: Copy>(a: &[T], b: &[T], f: impl Fn(T, T) -> bool) -> Vals {
            Vals::B(a.iter().zip(b).map(|(&a, &b)| u8::from(f(a, b))).collect())
        }
        match op {
            BinaryOp::Eq => go(a, b, |a, b| a == b),
            BinaryOp::Ne => go(a, b, |a, b| a != b),
            BinaryOp::Lt => go(a, b, |a, b| a < b),
            BinaryOp::Le => go(a, b, |a, b| a <= b),
            BinaryOp::Gt => go(a, b, |a, b| a > b),
            _ => go(a, b, |a, b| a >= b),
        }
    }
    if op.is_comparison() {
        return match (&x, &y) {
            (Vals::F(a), Vals::F(b)) => cmp(op, a, b),
            (Vals::I(a), Vals::I(b)) => cmp(op, a, b),
            (Vals::U(a), Vals::U(b)) => cmp(op, a, b),
            (Vals::B(a), Vals::B(b)) => cmp(op, a, b),
            _ => generic_binary(op, &x, &y, in_dt, dt),
        };
    }
    match (x, y) {
        (Vals::F(mut a), Vals::F(b)) if !matches!(op, BinaryOp::And | BinaryOp::Or) => {
            match op {
                BinaryOp::Add => map2(&mut a, &b, |a, b| a + b),
                BinaryOp::Sub => map2(&mut a, &b, |a, b| a - b),
                BinaryOp::Mul => map2(&mut a, &b, |a, b| a * b),
                BinaryOp::Div => map2(&mut a, &b, |a, b| a / b),
                BinaryOp::Maximum => {
                    map2(&mut a, &b, |a, b| if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) })
                }
                BinaryOp::Minimum => {
                    map2(&mut a, &b, |a, b| if a.is_nan() || b.is_nan() { f32::NAN } else { a.min(b) })
                }
                _ => map2(&mut a, &b, f32::powf),
            }
            f16_if(dt, a)
        }
        (Vals::I(mut a), Vals::I(b)) if op != BinaryOp::Pow && !matches!(op, BinaryOp::And | BinaryOp::Or) => {
            match op {
                BinaryOp::Add => map2(&mut a, &b, i32::wrapping_add),
                BinaryOp::Sub => map2(&mut a, &b, i32::wrapping_sub),
                BinaryOp::Mul => map2(&mut a, &b, i32::wrapping_mul),
                BinaryOp::Div => map2(&mut a, &b, |a, b| if b == 0 { a } else { a.wrapping_div(b) }),
                BinaryOp::Maximum => map2(&mut a, &b, |a, b| a.max(b)),
                _ => map2(&mut a, &b, |a, b| a.min(b)),
            }
            Vals::I(a)
        }
        (Vals::U(mut a), Vals::U(b)) if op != BinaryOp::Pow && !matches!(op, BinaryOp::And | BinaryOp::Or) => {
            match op {
                BinaryOp::Add => map2(&mut a, &b, u32::wrapping_add),
                BinaryOp::Sub => map2(&mut a, &b, u32::wrapping_sub),
                BinaryOp::Mul => map2(&mut a, &b, u32::wrapping_mul),
                BinaryOp::Div => map2(&mut a, &b, |a, b| a.checked_div(b).unwrap_or(a)),
                BinaryOp::Maximum => map2(&mut a, &b, |a, b| a.max(b)),
                _ => map2(&mut a, &b, |a, b| a.min(b)),
            }
            Vals::U(a)
        }
        (Vals::B(mut a), Vals::B(b)) if matches!(op, BinaryOp::And | BinaryOp::Or) => {
            if op == BinaryOp::And {
                map2(&mut a, &b, |a, b| u8::from(a != 0 && b != 0));
            } else {
                map2(&mut a, &b, |a, b| u8::from(a != 0 || b != 0));
            }
            Vals::B(a)
        }
        (x, y) => generic_binary(op, &x, &y, in_dt, dt),
    }
}

fn generic_binary(op: BinaryOp, x: &Vals, y: &Vals, in_dt: DType, dt: DType) -> Vals {
    via_f64(x, |a, i| refew::binary(op, a, y.get_f64(i), in_dt), dt)
}

fn select(m: Vals, a: Vals, b: Vals) -> Vals {
    let Vals::B(m) = m else {
        return a;
    };
    fn go<T: Copy>(m: &[u8], mut a: Vec<T>, b: &[T]) -> Vec<T> {
        for ((a, &b), &m) in a.iter_mut().zip(b).zip(m) {
            if m == 0 {
                *a = b;
            }
        }
        a
    }
    match (a, b) {
        (Vals::F(a), Vals::F(b)) => Vals::F(go(&m, a, &b)),
        (Vals::I(a), Vals::I(b)) => Vals::I(go(&m, a, &b)),
        (Vals::U(a), Vals::U(b)) => Vals::U(go(&m, a, &b)),
        (Vals::B(a), Vals::B(b)) => Vals::B(go(&m, a, &b)),
        (a, _) => a,
    }
}

/// Conversion between dtypes with the reference's rules (floats to integers truncate
/// and saturate at the largest f32 inside the range, NaN to 0; integers wrap).
pub(crate) fn cast(x: Vals, from: DType, to: DType) -> Vals {
    match (x, to) {
        (Vals::F(v), DType::F32) => Vals::F(v),
        (Vals::F(v), DType::F16) => f16_if(DType::F16, v),
        (Vals::F(v), DType::I32) => Vals::I(v.iter().map(|&x| (x as i32).min(2_147_483_520)).collect()),
        (Vals::F(v), DType::U32) => Vals::U(v.iter().map(|&x| (x as u32).min(4_294_967_040)).collect()),
        (Vals::F(v), DType::Bool) => Vals::B(v.iter().map(|&x| u8::from(x != 0.0)).collect()),
        (Vals::I(v), DType::F32 | DType::F16) => f16_if(to, v.iter().map(|&x| x as f32).collect()),
        (Vals::U(v), DType::F32 | DType::F16) => f16_if(to, v.iter().map(|&x| x as f32).collect()),
        (Vals::B(v), DType::F32 | DType::F16) => Vals::F(v.iter().map(|&x| x as f32).collect()),
        (Vals::I(v), DType::I32) => Vals::I(v),
        (Vals::I(v), DType::U32) => Vals::U(v.iter().map(|&x| x as u32).collect()),
        (Vals::U(v), DType::I32) => Vals::I(v.iter().map(|&x| x as i32).collect()),
        (Vals::U(v), DType::U32) => Vals::U(v),
        (Vals::I(v), DType::Bool) => Vals::B(v.iter().map(|&x| u8::from(x != 0)).collect()),
        (Vals::U(v), DType::Bool) => Vals::B(v.iter().map(|&x| u8::from(x != 0)).collect()),
        (Vals::B(v), DType::I32) => Vals::I(v.iter().map(|&x| x as i32).collect()),
        (Vals::B(v), DType::U32) => Vals::U(v.iter().map(|&x| x as u32).collect()),
        (Vals::B(v), DType::Bool) => Vals::B(v),
        (x, to) => via_f64(&x, |a, _| refew::cast(a, from, to), to),
    }
}
