//! The renderer that turns a fused group of element-wise and movement nodes into WGSL.
//!
//! Each node is evaluated at an *index*: either a linear index into its own shape or one
//! coordinate expression per axis. Element-wise ops pass the index through; movement ops
//! rewrite it (permute reorders coordinates, expand zeroes broadcast ones, reshape keeps
//! the linear index, slice and pad shift them, concat branches, gather reads the index
//! tensor). Leaves (realised tensors and other kernels' outputs) are loaded by linear
//! index. All sizes and scalars go to `meta`, so the text depends only on the structure.

use super::{compute_type, input_binding, load_fn_at, IndexCheck, ShaderCaps};
use crate::graph::{BinaryOp, Op, UnaryOp};
use crate::{DType, Tensor};
use std::collections::HashMap;

/// An index into a node: linear, per-axis coordinates, or both.
#[derive(Clone, Debug)]
pub(crate) struct Ix {
    pub lin: Option<String>,
    pub coords: Option<Vec<String>>,
}

impl Ix {
    pub fn lin(s: impl Into<String>) -> Ix {
        Ix { lin: Some(s.into()), coords: None }
    }
    pub fn coords(c: Vec<String>) -> Ix {
        Ix { lin: None, coords: Some(c) }
    }
    pub fn key(&self) -> String {
        match (&self.lin, &self.coords) {
            (Some(l), _) => format!("L{l}"),
            (None, Some(c)) => format!("C{}", c.join(",")),
            (None, None) => String::new(),
        }
    }
}

/// Which scalar of a node a meta slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScalarField {
    /// `Full`'s value, `Pad`'s and `Im2col`'s padding value.
    Value,
    /// `Arange`'s start and step.
    Start,
    Step,
    /// The low and high words of `Rand`'s seed.
    SeedLo,
    SeedHi,
}

/// The memo's key for index texts ([`Gen::index_name`]), apart from node ids.
const LINEAR: u64 = u64::MAX;

/// One spatial axis of a col2im (`Gen::col2im_taps`): the padded output coordinate,
/// its quotient and remainder by the stride where the dilation is 1, and the axis's
/// kernel size, stride, dilation and input size (slots).
struct TapAxis {
    at: String,
    qr: Option<(String, String)>,
    k: String,
    s: String,
    d: String,
    n: String,
}

/// A meta slot filled from a node's scalar: what changes between two graphs of one
/// structure (a learning rate, a dropout seed), so a cached plan refills only these.
#[derive(Clone, Copy, Debug)]
pub struct MetaPatch {
    pub index: usize,
    pub node: u64,
    pub field: ScalarField,
    pub dtype: DType,
}

impl ScalarField {
    /// The meta word this field of `op` gives at `dtype` (as `Gen::scalar` encodes it).
    pub fn word(self, op: &Op, dtype: DType) -> Option<u32> {
        let v = match (self, op) {
            (ScalarField::Value, Op::Full { value } | Op::Pad { value, .. }) => *value,
            (ScalarField::Value, Op::Im2col { pad_value, .. }) => *pad_value,
            (ScalarField::Start, Op::Arange { start, .. }) => *start,
            (ScalarField::Step, Op::Arange { step, .. }) => *step,
            (ScalarField::SeedLo, Op::Rand { seed, .. }) => return Some(*seed as u32),
            (ScalarField::SeedHi, Op::Rand { seed, .. }) => return Some((*seed >> 32) as u32),
            _ => return None,
        };
        Some(match dtype {
            DType::F32 | DType::F16 | DType::Q8_0 | DType::Q4_0 => (v as f32).to_bits(),
            DType::I32 => (v as i64 as i32) as u32,
            DType::U32 => v as i64 as u32,
            DType::Bool => u32::from(v != 0.0),
        })
    }
}

/// Renders one kernel's expression functions.
pub(crate) struct Gen<'a> {
    pub caps: ShaderCaps,
    pub body: String,
    indent: usize,
    pub meta: Vec<u32>,
    pub leaves: Vec<Tensor>,
    /// Per leaf: the meta expression of a quantised leaf's quant offset.
    leaf_qoff: Vec<Option<String>>,
    /// Per leaf: bound as quads (see [`Gen::quad_leaf`]).
    leaf_quad: Vec<bool>,
    leaf_index: HashMap<u64, usize>,
    is_leaf: &'a dyn Fn(&Tensor) -> bool,
    memo: HashMap<(u64, String), String>,
    dims: HashMap<u64, Vec<String>>,
    /// The magic-number slots of each divisor slot [`Gen::divmod`] has divided by.
    udiv_slots: Vec<(String, String, String)>,
    next: usize,
    pub checks: Vec<IndexCheck>,
    pub uses_f16: bool,
    pub ops: Vec<String>,
    /// Meta slot holding this kernel's first status word (set by the executor).
    pub status_slot: Option<usize>,
    /// Meta slots that hold a node's scalar (see [`MetaPatch`]).
    pub patches: Vec<MetaPatch>,
    /// Window mode (element-wise kernels): each non-quantised leaf gets a base slot
    /// subtracted from its load index, and whether every load of it was at index `i`
    /// (the output's own index) is tracked.
    pub windows: bool,
    /// In window mode, the index (`Ix::key`) and shape at which a leaf counts as read
    /// at its consumer's own position; `None` means the linear index `i`.
    pub align: Option<(String, Vec<usize>)>,
    leaf_base: Vec<Option<usize>>,
    leaf_aligned: Vec<bool>,
    /// Per leaf in window mode: a window-length slot. A leaf read at other indices (a
    /// gather, a slice) is loaded through its window, and loads outside it set
    /// `skip_out`, so a dispatch writes (or, in a reduction, counts) only what lies in it.
    leaf_len: Vec<Option<usize>>,
    /// Whether the window arithmetic is emitted (set after evaluation, when a tensor of
    /// the kernel exceeds a binding); otherwise the slots exist but loads are plain.
    pub emit_windows: bool,
    /// Reductions: every windowed leaf's loads are checked against its window (the
    /// input may be split either by rows or as a whole).
    pub check_all_windows: bool,
    /// Leaves read at the output's own index `i` (or repeated over leading axes, see
    /// `param_period`) become the parameters `p{k}` of the expression function instead
    /// of loads (the vec4 element-wise kernel loads them four at a time and passes one
    /// lane each). A load at any other index clears `params_ok`.
    pub param_leaves: bool,
    pub params_ok: bool,
    /// In `param_leaves` mode, per leaf read through a broadcast over leading axes: the
    /// meta slot holding its length in vectors (the vector kernel loads `q % len`).
    pub param_period: HashMap<usize, usize>,
    /// In `param_leaves` mode, the values per vector load: 4 (a quad), or 8 where the
    /// kernel loads 32-bit values as `vec4<u64>` (`ShaderCaps::wide_loads`). A repeated
    /// row must be a whole number of vectors long.
    pub param_lanes: usize,
    /// In `param_leaves` mode, the leaves read at `i` itself.
    param_direct: std::collections::HashSet<usize>,
    /// In `param_leaves` mode, whether a permute that keeps the innermost axis (a
    /// multiple of 4 long) may be read by quads: quad `q` of the output reads quad `pq`
    /// of the permute's input (see [`Gen::permuted_quads`]). Set by the vec4 kernel.
    pub quad_permute: bool,
    /// The WGSL statements that define `pq` from `q`, once a permute took that path.
    pub permute_quad: Option<String>,
    /// Leaves read under that permute: loaded at `pq` (or `pq % len` when repeated).
    pub param_permuted: std::collections::HashSet<usize>,
    /// Whether evaluation is under that permute (its memo entries are kept apart).
    in_permute: bool,
    /// The binding of leaf 0 (leaves follow in order): 2, after the meta and the output,
    /// or later where a kernel binds operands of its own first (a matmul's epilogue).
    pub binding_base: u32,
    /// A node that is not loaded but is the given WGSL value at the output's own index
    /// (a matmul's accumulator, for the epilogue fused into its store);
    /// `value_misread` is set if the expression reads it at another index.
    pub value_leaf: Option<(u64, String)>,
    pub value_misread: bool,
    /// Leaves read as quads wherever they are read: each one's value is the
    /// `vec4<f32>` of the 4 values from the (4-aligned) index (see [`Gen::quad_leaf`]).
    /// The caller makes sure only what keeps the innermost coordinate (gathers along
    /// other axes, reshapes and broadcasts that keep the innermost axis, adds and
    /// multiplies of such values) lies between them and the expression's result.
    pub quad_reads: std::collections::HashSet<u64>,
    /// Coordinates of the form `base + j` (`j < 4`, `base` a multiple of 4) that the run
    /// kernel (`elementwise::render_runs`) evaluates lane `j` of a run at, by their
    /// text: a reshape splitting such a coordinate by an innermost length that is a
    /// multiple of 4 divides `base`, the same division for every lane.
    pub lane_coords: HashMap<String, (String, u32)>,
    /// The meta slots of each node's own constants (a window's sizes, a scalar), so a
    /// node evaluated at several indices reads the same slots (the run kernel's lanes
    /// then share the divisions by them).
    node_slots: HashMap<(u64, &'static str, usize), String>,
    node_scalars: HashMap<(u64, ScalarField), String>,
    /// Read f32 leaves that fit an operand texture and are read through no window as
    /// texels of read-only storage textures (`TexelRead::Storage`; see
    /// [`Gen::texel_bits`]), where `ShaderCaps::texture_rows` allows.
    pub texel_leaves: bool,
}

impl<'a> Gen<'a> {
    pub fn new(caps: ShaderCaps, is_leaf: &'a dyn Fn(&Tensor) -> bool) -> Self {
        Gen {
            caps,
            body: String::new(),
            indent: 1,
            meta: Vec::new(),
            leaves: Vec::new(),
            leaf_qoff: Vec::new(),
            leaf_quad: Vec::new(),
            leaf_index: HashMap::new(),
            is_leaf,
            memo: HashMap::new(),
            lane_coords: HashMap::new(),
            node_slots: HashMap::new(),
            node_scalars: HashMap::new(),
            dims: HashMap::new(),
            udiv_slots: Vec::new(),
            next: 0,
            checks: Vec::new(),
            uses_f16: false,
            ops: Vec::new(),
            status_slot: None,
            patches: Vec::new(),
            windows: false,
            align: None,
            leaf_base: Vec::new(),
            leaf_aligned: Vec::new(),
            leaf_len: Vec::new(),
            emit_windows: false,
            check_all_windows: false,
            param_leaves: false,
            params_ok: true,
            param_period: HashMap::new(),
            param_lanes: 4,
            param_direct: Default::default(),
            quad_permute: false,
            permute_quad: None,
            param_permuted: Default::default(),
            in_permute: false,
            binding_base: 2,
            value_leaf: None,
            value_misread: false,
            quad_reads: Default::default(),
            texel_leaves: false,
        }
    }

    /// Whether leaf `k` is declared an operand texture ([`Gen::texel_leaves`]).
    fn texel_leaf(&self, k: usize) -> bool {
        self.texel_leaves
            && !self.emit_windows
            && self.leaf_qoff[k].is_none()
            && super::texturable(&self.leaves[k], &self.caps)
    }

    /// The leaves declared operand textures, one bit each (`KernelSpec::textured`).
    pub fn texel_bits(&self) -> u32 {
        (0..self.leaves.len()).filter(|&k| self.texel_leaf(k)).fold(0, |b, k| b | 1 << k)
    }

    /// [`Gen::scalar`] for field `field` of node `t`, recorded so a replayed plan can
    /// refill the slot from a new graph's node.
    fn scalar_of(&mut self, t: &Tensor, field: ScalarField, v: f64, dtype: DType) -> String {
        if let Some(e) = self.node_scalars.get(&(t.id(), field)) {
            return e.clone();
        }
        let e = self.scalar(v, dtype);
        self.patches.push(MetaPatch { index: self.meta.len() - 1, node: t.id(), field, dtype });
        self.node_scalars.insert((t.id(), field), e.clone());
        e
    }

    /// The slots of a window's kernel width, strides, dilations and paddings.
    fn window_slots(&mut self, t: &Tensor, w: &crate::graph::Window) -> [String; 7] {
        let v = [w.kernel.1, w.stride.0, w.stride.1, w.dilation.0, w.dilation.1, w.padding.0, w.padding.1];
        let names = ["kw", "sh", "sw", "dh", "dw", "ph", "pw"];
        std::array::from_fn(|k| self.node_slot(t, names[k], 0, v[k]))
    }

    /// One spatial axis of a col2im at output coordinate `out`, with the axis's kernel
    /// size, stride, dilation, padding and input size (`[k, s, d, p, n]`, slots). With
    /// dilation 1 the taps that land on `out` are `r, r + s, ..` from inputs `q, q - 1,
    /// ..`, where `out + p = q s + r`: one division here instead of a test of every tap
    /// with two divisions each (lavapipe divides lane by lane: rapidocr_det's 2x2
    /// stride-2 upsampling to 24 x 320 x 320, 101 -> 21 ms).
    fn col2im_taps(&mut self, out: &str, [k, s, d, p, n]: [&String; 5], unit: bool) -> TapAxis {
        let at = format!("({out} + {p})");
        let qr = if unit { Some(self.divmod(&at, s)) } else { None };
        TapAxis { at, qr, k: k.clone(), s: s.clone(), d: d.clone(), n: n.clone() }
    }

    /// Open the loop over an axis's taps and the test that one lands (two scopes):
    /// the tap and its input coordinate.
    fn open_taps(&mut self, a: TapAxis) -> (String, String) {
        let TapAxis { at, qr, k, s, d, n } = a;
        let tap = self.fresh("k");
        let (q, test) = match qr {
            Some((q, r)) => {
                let t = self.fresh("t");
                self.emit(&format!("for (var {t} = 0u; {t} <= {q} && {r} + {t} * {s} < {k}; {t} = {t} + 1u) {{"));
                self.indent += 1;
                self.emit(&format!("let {tap} = {r} + {t} * {s};"));
                let i = self.let_("i", format!("{q} - {t}"));
                (i.clone(), format!("{i} < {n}"))
            }
            None => {
                self.emit(&format!("for (var {tap} = 0u; {tap} < {k}; {tap} = {tap} + 1u) {{"));
                self.indent += 1;
                let y = self.let_("y", format!("{at} - {tap} * {d}"));
                let (q, r) = self.divmod(&y, &s);
                (q.clone(), format!("{at} >= {tap} * {d} && {r} == 0u && {q} < {n}"))
            }
        };
        self.emit(&format!("if ({test}) {{"));
        self.indent += 1;
        (tap, q)
    }

    /// A slot holding `v`, node `t`'s constant `what` (of axis or input `at`): one slot
    /// however often `t` is evaluated.
    fn node_slot(&mut self, t: &Tensor, what: &'static str, at: usize, v: usize) -> String {
        if let Some(s) = self.node_slots.get(&(t.id(), what, at)) {
            return s.clone();
        }
        let s = self.slot(v as u32);
        self.node_slots.insert((t.id(), what, at), s.clone());
        s
    }

    /// `(q / d, q % d)` as two named values. A divisor held in a meta slot (a dim)
    /// divides by multiplying (`udiv` in shaders/udiv.wgsl), with its magic number and shifts
    /// in two more slots, shared by every division by that slot in the kernel. The npm
    /// package divides plainly: its size budget has no room for this, and GPUs divide
    /// by a uniform in a few instructions where CPU adapters loop over the lanes.
    pub fn divmod(&mut self, q: &str, d: &str) -> (String, String) {
        let slot = d.strip_prefix("m(").and_then(|s| s.strip_suffix("u)")).and_then(|s| s.parse::<usize>().ok());
        let known = slot.and_then(|i| self.meta.get(i).copied()).filter(|&v| v > 0);
        // A constant over a dim folds (the taps of an unrolled reduction or of a
        // depthwise sum, a slice's start).
        if let (Some(n), Some(v)) = (self.constant_of(q), known) {
            return (format!("{}u", n / v), format!("{}u", n % v));
        }
        let Some(v) = known.filter(|_| !cfg!(target_arch = "wasm32")) else {
            let qq = self.let_("q", format!("{q} / {d}"));
            return (qq, self.let_("c", format!("{q} % {d}")));
        };
        let qq = self.udiv(q, d, v);
        let qq = self.let_("q", qq);
        (qq.clone(), self.let_("c", format!("({q}) - {qq} * {d}")))
    }

    /// The value of `q` where it is a constant: a literal, or a node's structural slot
    /// ([`Gen::node_slot`]; neither a patched scalar nor a slot the executor rewrites).
    fn constant_of(&self, q: &str) -> Option<u32> {
        if let Some(n) = q.strip_suffix('u').and_then(|n| n.parse::<u32>().ok()) {
            return Some(n);
        }
        let i = q.strip_prefix("m(")?.strip_suffix("u)")?.parse::<usize>().ok()?;
        self.node_slots.values().any(|s| s == q).then(|| self.meta.get(i).copied())?
    }

    /// `udiv(q, magic, shifts)`: `q` divided by the meta slot `d` (holding `v`) by
    /// multiplying, the magic number and shifts in slots shared by every division by `d`.
    fn udiv(&mut self, q: &str, d: &str, v: u32) -> String {
        let (magic, shifts) = match self.udiv_slots.iter().find(|s| s.0 == d) {
            Some((_, magic, shifts)) => (magic.clone(), shifts.clone()),
            None => {
                let (a, b) = udiv_magic(v);
                let (magic, shifts) = (self.slot(a), self.slot(b));
                self.udiv_slots.push((d.to_string(), magic.clone(), shifts.clone()));
                (magic, shifts)
            }
        };
        format!("udiv({q}, {magic}, {shifts})")
    }

    /// Start the next WGSL function: returns the body rendered so far, and forgets the
    /// values it computed (they are out of scope in the new function).
    pub fn take_function(&mut self) -> String {
        self.memo.clear();
        std::mem::take(&mut self.body)
    }

    /// Reserve a meta slot holding `v`; returns its WGSL read expression.
    /// Start another WGSL function: take the body emitted so far and forget the values
    /// it defined (they are out of scope in the next function).
    pub fn take_function_body(&mut self) -> String {
        self.memo.clear();
        std::mem::take(&mut self.body)
    }

    pub fn slot(&mut self, v: u32) -> String {
        self.meta.push(v);
        format!("m({}u)", self.meta.len() - 1)
    }

    fn fresh(&mut self, p: &str) -> String {
        self.next += 1;
        format!("{p}{}", self.next)
    }

    /// Emit one statement at the current indentation.
    pub fn emit(&mut self, line: &str) {
        for _ in 0..self.indent {
            self.body.push_str("    ");
        }
        self.body.push_str(line);
        self.body.push('\n');
    }

    fn let_(&mut self, prefix: &str, expr: String) -> String {
        let v = self.fresh(prefix);
        self.emit(&format!("let {v} = {expr};"));
        v
    }

    /// Meta expressions for a node's dims (allocated once per kernel).
    pub fn dims_of(&mut self, t: &Tensor) -> Vec<String> {
        if let Some(d) = self.dims.get(&t.id()) {
            return d.clone();
        }
        let d: Vec<String> = t.dims().iter().map(|&x| self.slot(x as u32)).collect();
        self.dims.insert(t.id(), d.clone());
        d
    }

    /// The linear form of `ix` for a node of `t`'s shape.
    pub fn linear(&mut self, ix: &Ix, t: &Tensor) -> String {
        if let Some(l) = &ix.lin {
            return l.clone();
        }
        let coords = ix.coords.clone().unwrap_or_default();
        if coords.is_empty() {
            return "0u".into();
        }
        let dims = self.dims_of(t);
        let mut e = coords[0].clone();
        for d in 1..coords.len() {
            e = format!("({e}) * {} + {}", dims[d], coords[d]);
        }
        self.index_name(e)
    }

    /// A name for the index expression `e`: a constant stays itself (so a division of
    /// it folds); otherwise one name per text in scope, so the loads memoised by
    /// their index find each other (a column broadcast read by the four lanes of a
    /// run: one load, not four).
    fn index_name(&mut self, e: String) -> String {
        if self.constant_of(&e).is_some() {
            return e;
        }
        let key = (LINEAR, e);
        if let Some(v) = self.memo.get(&key) {
            return v.clone();
        }
        let v = self.let_("l", key.1.clone());
        self.memo.insert(key, v.clone());
        v
    }

    /// Coordinates in `src` of the element at coordinates `ix` of `t`, a reshape of
    /// `src`, mapped group by group: axes merged or split by the reshape are combined
    /// and divided within their group only, and axes the reshape leaves alone pass
    /// through, instead of going through the linear index (`None` when `ix` is linear).
    fn reshape_coords(&mut self, ix: &Ix, t: &Tensor, src: &Tensor) -> Option<Vec<String>> {
        let c = ix.coords.as_ref()?;
        let (od, id) = (t.dims(), src.dims());
        if od.contains(&0) {
            return None;
        }
        let onz: Vec<usize> = (0..od.len()).filter(|&a| od[a] > 1).collect();
        let inz: Vec<usize> = (0..id.len()).filter(|&a| id[a] > 1).collect();
        let mut out = vec!["0u".to_string(); id.len()];
        let (mut i, mut j) = (0, 0);
        while i < onz.len() && j < inz.len() {
            // The smallest runs of axes on both sides with equal products.
            let (si, sj) = (i, j);
            let (mut po, mut pi) = (od[onz[i]] as u64, id[inz[j]] as u64);
            (i, j) = (i + 1, j + 1);
            while po != pi {
                if po < pi && i < onz.len() {
                    po *= od[onz[i]] as u64;
                    i += 1;
                } else if pi < po && j < inz.len() {
                    pi *= id[inz[j]] as u64;
                    j += 1;
                } else {
                    return None;
                }
            }
            if i - si == 1 && j - sj == 1 {
                out[inz[sj]] = c[onz[si]].clone();
                continue;
            }
            // One lane of a run, `base + j`, splits as `base` does, plus j innermost.
            let lane = self.lane_coords.get(&c[onz[si]]).cloned();
            let lane = lane.filter(|_| i - si == 1 && id[inz[j - 1]].is_multiple_of(4));
            let mut q = match &lane {
                Some((base, _)) => base.clone(),
                None => {
                    let odims = self.dims_of(t);
                    let mut l = c[onz[si]].clone();
                    for &a in &onz[si + 1..i] {
                        l = format!("({l}) * {} + {}", odims[a], c[a]);
                    }
                    self.index_name(l)
                }
            };
            let idims = self.dims_of(src);
            for (n, &a) in inz[sj..j].iter().enumerate().rev() {
                if n == 0 {
                    out[a] = q.clone();
                } else {
                    let (qq, c) = self.divmod(&q, &idims[a]);
                    (out[a], q) = (c, qq);
                }
            }
            if let Some((_, lane)) = lane {
                let last = inz[j - 1];
                let base = std::mem::take(&mut out[last]);
                out[last] = format!("({base} + {lane}u)");
                self.lane_coords.insert(out[last].clone(), (base, lane));
            }
        }
        (i == onz.len() && j == inz.len()).then_some(out)
    }

    /// The coordinate form of `ix` for a node of `t`'s shape.
    pub fn coords(&mut self, ix: &Ix, t: &Tensor) -> Vec<String> {
        if let Some(c) = &ix.coords {
            return c.clone();
        }
        let lin = ix.lin.clone().unwrap_or_else(|| "0u".into());
        let rank = t.rank();
        if rank == 0 {
            return Vec::new();
        }
        let dims = self.dims_of(t);
        let mut out = vec![String::new(); rank];
        let mut q = lin;
        for d in (0..rank).rev() {
            if t.dims()[d] == 1 {
                out[d] = "0u".into();
                continue;
            }
            if d == 0 {
                out[d] = self.let_("c", q.clone());
            } else {
                let (qq, c) = self.divmod(&q, &dims[d]);
                (out[d], q) = (c, qq);
            }
        }
        out
    }

    fn leaf(&mut self, t: &Tensor) -> usize {
        if let Some(&k) = self.leaf_index.get(&t.id()) {
            return k;
        }
        let k = self.leaves.len();
        self.leaves.push(t.clone());
        let qoff = t.dtype().is_quantized().then(|| self.slot(crate::quant::gpu_quant_offset_words(t.numel()) as u32));
        self.leaf_qoff.push(qoff);
        self.leaf_quad.push(false);
        let base = (self.windows && !t.dtype().is_quantized()).then(|| {
            self.meta.push(0);
            self.meta.len() - 1
        });
        self.leaf_base.push(base);
        self.leaf_aligned.push(base.is_some());
        let len = base.is_some().then(|| {
            self.meta.push(t.numel() as u32);
            self.meta.len() - 1
        });
        self.leaf_len.push(len);
        self.leaf_index.insert(t.id(), k);
        if t.dtype() == DType::F16 {
            self.uses_f16 = true;
        }
        k
    }

    /// Bind leaf `t` (f32 or f16, not windowed) as quads: `ld{k}q(q)` reads its values
    /// `4q .. 4q + 3` (see [`super::quad_load`]); a read of one value, `ld{k}(i)`, goes
    /// through it. Returns `k`, or `None` for a leaf that cannot be.
    pub fn quad_leaf(&mut self, t: &Tensor) -> Option<usize> {
        if !matches!(t.dtype(), DType::F32 | DType::F16) || self.windows || !(self.is_leaf)(t) {
            return None;
        }
        let k = self.leaf(t);
        self.leaf_quad[k] = true;
        Some(k)
    }

    /// In a run kernel, leaf `t` read along its innermost axis (rows a multiple of 4
    /// long) at a lane coordinate `base + j` (`base` a multiple of 4): one quad load at
    /// `base`, shared by the four lanes, lane `j` taking its component `j` (a
    /// per-channel bias beside an input read at the output's own index took four scalar
    /// loads of that input a run).
    fn lane_quad(&mut self, t: &Tensor, ix: &Ix) -> Option<String> {
        let c = ix.coords.as_ref()?;
        let (base, j) = self.lane_coords.get(c.last()?)?.clone();
        if !t.dims().last()?.is_multiple_of(4) || !matches!(t.dtype(), DType::F32 | DType::F16) || self.windows {
            return None;
        }
        let mut c0 = c.clone();
        *c0.last_mut()? = base;
        let key = (t.id(), format!("Q{}", c0.join(",")));
        let q = match self.memo.get(&key) {
            Some(v) => v.clone(),
            None => {
                let k = self.quad_leaf(t)?;
                let l0 = self.linear(&Ix::coords(c0), t);
                let v = self.let_("v", format!("ld{k}q(({l0}) >> 2u)"));
                self.memo.insert(key, v.clone());
                v
            }
        };
        Some(format!("{q}.{}", ["x", "y", "z", "w"][j as usize]))
    }

    /// Declarations for the leaves read so far.
    pub fn leaf_decls(&self) -> String {
        let mut s = String::new();
        for (k, t) in self.leaves.iter().enumerate() {
            if self.texel_leaf(k) {
                let var = format!("in{k}");
                s.push_str(&super::texture_binding(
                    self.binding_base + k as u32,
                    &var,
                    "f32",
                    super::TexelRead::Storage,
                ));
                s.push_str(&format!("fn ld{k}q(q: u32) -> vec4<f32> {{\n    return fetch_{var}(q);\n}}\n"));
                s.push_str(&format!("fn ld{k}(i: u32) -> f32 {{\n    return fetch_{var}(i >> 2u)[i & 3u];\n}}\n"));
                continue;
            }
            if self.leaf_quad[k] {
                s.push_str(&super::quad_load(
                    self.binding_base + k as u32,
                    &format!("in{k}"),
                    &format!("ld{k}q"),
                    t.dtype(),
                ));
                s.push_str(&format!("fn ld{k}(i: u32) -> f32 {{\n    return ld{k}q(i >> 2u)[i & 3u];\n}}\n"));
                continue;
            }
            s.push_str(&input_binding(k, t.dtype(), &self.caps).replacen(
                &format!("@binding({})", 2 + k),
                &format!("@binding({})", self.binding_base as usize + k),
                1,
            ));
            let qoff = self.leaf_qoff[k].as_deref();
            let base = self.leaf_base[k].filter(|_| self.emit_windows).map(|b| format!("m({b}u)"));
            match (self.leaf_len[k], self.leaf_aligned[k] && !self.check_all_windows, &base) {
                (Some(len), false, Some(b)) => {
                    // Read through a window [base, base + len): outside it, skip the output.
                    s.push_str(&load_fn_at(&format!("ld{k}_w"), &format!("in{k}"), t.dtype(), &self.caps, qoff, None));
                    let ct = compute_type(t.dtype());
                    s.push_str(&format!(
                        "fn ld{k}(i: u32) -> {ct} {{\n    let j = i - {b};\n    if (j >= m({len}u)) {{\n        skip_out = true;\n        return {ct}();\n    }}\n    return ld{k}_w(j);\n}}\n"
                    ));
                }
                _ => s.push_str(&load_fn_at(
                    &format!("ld{k}"),
                    &format!("in{k}"),
                    t.dtype(),
                    &self.caps,
                    qoff,
                    base.as_deref(),
                )),
            }
        }
        s
    }

    /// A meta-held scalar of `dtype`, as a WGSL expression of its compute type.
    fn scalar(&mut self, v: f64, dtype: DType) -> String {
        match dtype {
            DType::F32 | DType::F16 | DType::Q8_0 | DType::Q4_0 => {
                let s = self.slot((v as f32).to_bits());
                format!("bitcast<f32>({s})")
            }
            DType::I32 => {
                let s = self.slot((v as i64 as i32) as u32);
                format!("bitcast<i32>({s})")
            }
            DType::U32 => self.slot(v as i64 as u32),
            DType::Bool => {
                let s = self.slot(u32::from(v != 0.0));
                format!("({s} != 0u)")
            }
        }
    }

    /// Evaluate `t` at `ix`; returns a WGSL expression (usually a `let` name) of the
    /// node's compute type.
    pub fn eval(&mut self, t: &Tensor, ix: &Ix, root: bool) -> String {
        if let Some((_, v)) = self.value_leaf.clone().filter(|(id, _)| *id == t.id()) {
            if self.linear(ix, t) != "i" {
                self.value_misread = true;
            }
            return v;
        }
        if !root && (self.is_leaf)(t) {
            if self.quad_reads.contains(&t.id()) {
                let l = self.linear(ix, t);
                if let Some(k) = self.quad_leaf(t) {
                    return self.let_("v", format!("ld{k}q(({l}) >> 2u)"));
                }
            }
            if let Some(v) = self.lane_quad(t, ix) {
                return v;
            }
            let k = self.leaf(t);
            let l = self.linear(ix, t);
            if self.param_leaves {
                if l == "i" && !self.param_period.contains_key(&k) {
                    // One leaf is loaded at one place: the output's quad or the permute's.
                    let (mine, other) = if self.in_permute {
                        (&mut self.param_permuted, &self.param_direct)
                    } else {
                        (&mut self.param_direct, &self.param_permuted)
                    };
                    if other.contains(&k) {
                        self.params_ok = false;
                    }
                    mine.insert(k);
                    return format!("p{k}");
                }
                self.params_ok = false;
            }
            let aligned = match &self.align {
                Some((key, dims)) => ix.key() == *key && t.dims() == dims.as_slice(),
                None => l == "i",
            };
            if !aligned {
                self.leaf_aligned[k] = false;
            }
            // One load per leaf and index (a scalar read by several ops of an epilogue).
            let key = (t.id(), format!("L{l}"));
            if let Some(v) = self.memo.get(&key) {
                return v.clone();
            }
            let v = self.let_("v", format!("ld{k}({l})"));
            self.memo.insert(key, v.clone());
            return v;
        }
        let key = (t.id(), if self.in_permute { format!("P{}", ix.key()) } else { ix.key() });
        if let Some(v) = self.memo.get(&key) {
            return v.clone();
        }
        let n = t.node();
        let dt = t.dtype();
        if !matches!(n.op, Op::Reshape | Op::Expand | Op::Permute { .. } | Op::Slice { .. }) {
            self.ops.push(n.op.name());
        }
        let v = match &n.op {
            Op::Full { value } => return self.scalar_of(t, ScalarField::Value, *value, dt),
            Op::Arange { start, step } => {
                let i = self.linear(ix, t);
                let s = self.scalar_of(t, ScalarField::Start, *start, dt);
                let st = self.scalar_of(t, ScalarField::Step, *step, dt);
                let ty = compute_type(dt);
                self.let_("v", format!("{s} + {ty}({i}) * {st}"))
            }
            Op::Rand { seed, normal } => {
                let i = self.linear(ix, t);
                let lo = self.slot(*seed as u32);
                self.patches.push(MetaPatch {
                    index: self.meta.len() - 1,
                    node: t.id(),
                    field: ScalarField::SeedLo,
                    dtype: DType::U32,
                });
                let hi = self.slot((*seed >> 32) as u32);
                self.patches.push(MetaPatch {
                    index: self.meta.len() - 1,
                    node: t.id(),
                    field: ScalarField::SeedHi,
                    dtype: DType::U32,
                });
                if *normal {
                    self.let_("v", format!("rand_normal({i}, {lo}, {hi})"))
                } else {
                    self.let_("v", format!("rand_uniform({i}, {lo}, {hi}, 0u)"))
                }
            }
            Op::Unary(u) => {
                let x = self.eval(&n.inputs[0], ix, false);
                let e = unary_expr(*u, &x, dt);
                let e = self.round_f16(e, dt);
                self.let_("v", e)
            }
            Op::Binary(b) => {
                let a = self.eval(&n.inputs[0], ix, false);
                let c = self.eval(&n.inputs[1], ix, false);
                let e = binary_expr(*b, &a, &c, n.inputs[0].dtype());
                let e = self.round_f16(e, dt);
                self.let_("v", e)
            }
            Op::Where => {
                let m = self.eval(&n.inputs[0], ix, false);
                let a = self.eval(&n.inputs[1], ix, false);
                let b = self.eval(&n.inputs[2], ix, false);
                self.let_("v", format!("select({b}, {a}, {m})"))
            }
            Op::Cast => {
                let x = self.eval(&n.inputs[0], ix, false);
                let e = self.cast_expr(&x, n.inputs[0].dtype(), dt);
                self.let_("v", e)
            }
            Op::Reshape => match self.reshape_coords(ix, t, &n.inputs[0]) {
                Some(c) => self.eval(&n.inputs[0], &Ix::coords(c), false),
                None => {
                    let l = self.linear(ix, t);
                    self.eval(&n.inputs[0], &Ix::lin(l), false)
                }
            },
            Op::Expand => {
                if let Some(p) = self.periodic_param(t, ix) {
                    return p;
                }
                let src = &n.inputs[0];
                // A broadcast scalar needs none of the output's coordinates.
                let cc = if src.dims().iter().all(|&d| d == 1) {
                    vec!["0u".to_string(); src.rank()]
                } else {
                    let c = self.coords(ix, t);
                    let off = t.rank() - src.rank();
                    (0..src.rank())
                        .map(|j| if src.dims()[j] == 1 { "0u".to_string() } else { c[off + j].clone() })
                        .collect()
                };
                self.eval(src, &Ix::coords(cc), false)
            }
            Op::Permute { perm } => {
                if let Some(v) = self.permuted_quads(t, perm, ix) {
                    return v;
                }
                let c = self.coords(ix, t);
                let mut cc = vec![String::new(); c.len()];
                for (i, &p) in perm.iter().enumerate() {
                    cc[p] = c[i].clone();
                }
                self.eval(&n.inputs[0], &Ix::coords(cc), false)
            }
            Op::Slice { starts, steps } => {
                let c = self.coords(ix, t);
                let mut cc = Vec::with_capacity(c.len());
                for d in 0..c.len() {
                    let sd = t.dims()[d];
                    let e = if sd == 1 {
                        self.node_slot(t, "start", d, starts[d])
                    } else if starts[d] == 0 && steps[d] == 1 {
                        c[d].clone()
                    } else {
                        let (s, st) =
                            (self.node_slot(t, "start", d, starts[d]), self.node_slot(t, "step", d, steps[d]));
                        format!("({s} + {} * {st})", c[d])
                    };
                    cc.push(e);
                }
                self.eval(&n.inputs[0], &Ix::coords(cc), false)
            }
            Op::Pad { before, value } => {
                let c = self.coords(ix, t);
                let src = n.inputs[0].clone();
                let sd = self.dims_of(&src);
                let mut conds = Vec::new();
                let mut cc = Vec::new();
                for d in 0..c.len() {
                    if before[d] == 0 && src.dims()[d] == t.dims()[d] {
                        cc.push(c[d].clone());
                        continue;
                    }
                    let b = self.node_slot(t, "before", d, before[d]);
                    let shifted = self.let_("p", format!("{} - {b}", c[d]));
                    let ok = self.let_("ok", format!("{shifted} < {}", sd[d]));
                    conds.push(ok.clone());
                    cc.push(self.let_("p", format!("select(0u, {shifted}, {ok})")));
                }
                let inner = self.eval(&src, &Ix::coords(cc), false);
                if conds.is_empty() {
                    inner
                } else {
                    let pv = self.scalar_of(t, ScalarField::Value, *value, dt);
                    self.let_("v", format!("select({pv}, {inner}, {})", conds.join(" && ")))
                }
            }
            Op::Concat { axis } => {
                let c = self.coords(ix, t);
                let v = self.fresh("v");
                self.emit(&format!("var {v}: {};", compute_type(dt)));
                let mut offset = 0usize;
                let k = n.inputs.len();
                for (j, inp) in n.inputs.iter().enumerate() {
                    let len = inp.dims()[*axis];
                    let lo = self.node_slot(t, "lo", j, offset);
                    let hi = self.node_slot(t, "hi", j, offset + len);
                    let head = if j == 0 {
                        format!("if ({} < {hi}) {{", c[*axis])
                    } else if j + 1 == k {
                        "} else {".to_string()
                    } else {
                        format!("}} else if ({} < {hi}) {{", c[*axis])
                    };
                    if j > 0 {
                        self.indent -= 1;
                    }
                    self.emit(&head);
                    self.indent += 1;
                    let saved = self.memo.clone();
                    let mut cc = c.clone();
                    cc[*axis] = format!("({} - {lo})", c[*axis]);
                    let x = self.eval(inp, &Ix::coords(cc), false);
                    self.emit(&format!("{v} = {x};"));
                    self.memo = saved;
                    offset += len;
                }
                self.indent -= 1;
                self.emit("}");
                v
            }
            Op::Im2col { window: w, pad_value } => {
                let c = self.coords(ix, t);
                let src = n.inputs[0].clone();
                let sd = self.dims_of(&src);
                let [kw, sh, sw, dh, dw, ph, pw] = self.window_slots(t, w);
                let (ki, kj) = self.divmod(&c[2], &kw);
                let hh = self.let_("h", format!("i32({} * {sh} + {ki} * {dh}) - i32({ph})", c[3]));
                let ww = self.let_("w", format!("i32({} * {sw} + {kj} * {dw}) - i32({pw})", c[4]));
                let ok = self
                    .let_("ok", format!("{hh} >= 0 && {ww} >= 0 && {hh} < i32({}) && {ww} < i32({})", sd[2], sd[3]));
                let pv = self.scalar_of(t, ScalarField::Value, *pad_value, dt);
                if (self.is_leaf)(&src) && !self.param_leaves && !self.windows {
                    // A buffer is read without a branch: outside the image at (h, w) = 0,
                    // then the padding selected (lavapipe runs a branch under a mask,
                    // and a run kernel has four; 180 -> 143 ms for 8x64x56x56's columns).
                    // Not in window mode, where a load outside the bound window skips
                    // the element.
                    let at = |x: &str| format!("u32(select(0i, {x}, {ok}))");
                    let cc = vec![c[0].clone(), c[1].clone(), at(&hh), at(&ww)];
                    let x = self.eval(&src, &Ix::coords(cc), false);
                    return self.let_("v", format!("select({pv}, {x}, {ok})"));
                }
                let v = self.fresh("v");
                self.emit(&format!("var {v}: {} = {pv};", compute_type(dt)));
                self.emit(&format!("if ({ok}) {{"));
                self.indent += 1;
                let saved = self.memo.clone();
                let cc = vec![c[0].clone(), c[1].clone(), format!("u32({hh})"), format!("u32({ww})")];
                let x = self.eval(&src, &Ix::coords(cc), false);
                self.emit(&format!("{v} = {x};"));
                self.memo = saved;
                self.indent -= 1;
                self.emit("}");
                v
            }
            Op::Col2im { window: w } => {
                let c = self.coords(ix, t);
                let src = n.inputs[0].clone();
                let sd = self.dims_of(&src);
                let kh = self.node_slot(t, "kh", 0, w.kernel.0);
                let [kw, sh, sw, dh, dw, ph, pw] = self.window_slots(t, w);
                let ty = compute_type(dt);
                let acc = self.fresh("acc");
                self.emit(&format!("var {acc}: {ty} = {ty}(0);"));
                let rows = self.col2im_taps(&c[2], [&kh, &sh, &dh, &ph, &sd[3]], w.dilation.0 == 1);
                let cols = self.col2im_taps(&c[3], [&kw, &sw, &dw, &pw, &sd[4]], w.dilation.1 == 1);
                let saved = self.memo.clone();
                let (ki, iy) = self.open_taps(rows);
                let (kj, ix_) = self.open_taps(cols);
                let cc = vec![c[0].clone(), c[1].clone(), format!("({ki} * {kw} + {kj})"), iy, ix_];
                let v = self.eval(&src, &Ix::coords(cc), false);
                self.emit(&format!("{acc} = {acc} + {v};"));
                self.memo = saved;
                for _ in 0..4 {
                    self.indent -= 1;
                    self.emit("}");
                }
                acc
            }
            Op::Gather { axis } | Op::IndexSelect { axis } => {
                let c = self.coords(ix, t);
                let (x, idx) = (&n.inputs[0], &n.inputs[1]);
                let iv = if matches!(n.op, Op::Gather { .. }) {
                    self.eval(idx, &Ix::coords(c.clone()), false)
                } else {
                    self.eval(idx, &Ix::lin(c[*axis].clone()), false)
                };
                let size = x.dims()[*axis];
                let sz = self.node_slot(t, "size", 0, size);
                let j = self.let_("j", format!("u32({iv})"));
                let k = self.checks.len();
                let base = match self.status_slot {
                    Some(b) => format!("m({b}u)"),
                    None => {
                        let b = self.slot(0);
                        self.status_slot = Some(self.meta.len() - 1);
                        b
                    }
                };
                self.checks.push(IndexCheck {
                    op: if matches!(n.op, Op::Gather { .. }) { "gather" } else { "index_select" },
                    axis: *axis,
                    size,
                    location: n.location,
                });
                let bad = if idx.dtype() == DType::I32 { format!("bitcast<u32>({iv})") } else { iv.clone() };
                self.emit(&format!(
                    "if ({j} >= {sz}) {{ atomicStore(&status[{base} + {}u], 1u); atomicStore(&status[{base} + {}u], {bad}); }}",
                    2 * k,
                    2 * k + 1
                ));
                let safe = self.let_("j", format!("select(0u, {j}, {j} < {sz})"));
                let mut cc = c.clone();
                cc[*axis] = safe;
                self.eval(x, &Ix::coords(cc), false)
            }
            Op::Input
            | Op::Reduce { .. }
            | Op::Matmul
            | Op::Attention { .. }
            | Op::Softmax { .. }
            | Op::Norm { .. }
            | Op::Quantize
            | Op::SegmentReduce { .. }
            | Op::ScatterRows { .. }
            | Op::TopK { .. } => {
                // Always materialised: reached here only if the scheduler failed to mark it.
                let k = self.leaf(t);
                let l = self.linear(ix, t);
                if l != "i" {
                    self.leaf_aligned[k] = false;
                }
                self.let_("v", format!("ld{k}({l})"))
            }
        };
        self.memo.insert(key, v.clone());
        v
    }

    /// f16 ops round their result to f16 (as the reference does), even when fused.
    fn round_f16(&mut self, e: String, dt: DType) -> String {
        if dt != DType::F16 {
            return e;
        }
        self.uses_f16 = true;
        // `round_f16` (shaders/common.wgsl): a round trip some drivers cannot fold away.
        format!("round_f16({e})")
    }

    fn cast_expr(&mut self, x: &str, from: DType, to: DType) -> String {
        let fc = compute_type(from);
        let tc = compute_type(to);
        if to == DType::F16 {
            self.uses_f16 = true;
            let xf = if fc == "bool" { format!("select(0.0, 1.0, {x})") } else { format!("f32({x})") };
            return format!("round_f16({xf})");
        }
        match (fc, tc) {
            (a, b) if a == b => x.to_string(),
            ("bool", "f32") => format!("select(0.0, 1.0, {x})"),
            ("bool", "i32") => format!("select(0i, 1i, {x})"),
            ("bool", "u32") => format!("select(0u, 1u, {x})"),
            ("f32", "bool") => format!("({x} != 0.0)"),
            ("i32", "bool") => format!("({x} != 0i)"),
            ("u32", "bool") => format!("({x} != 0u)"),
            ("f32", "i32") => format!("f2i({x})"),
            ("f32", "u32") => format!("f2u({x})"),
            (_, t) => format!("{t}({x})"),
        }
    }

    /// The finished kernel: this generator's parameters, leaves and checks.
    pub fn finish(self, label: String, source: String, root: &Tensor, workgroups: [u32; 3]) -> super::KernelSpec {
        super::KernelSpec {
            patches: self.patches,
            label,
            source: source.into(),
            meta: self.meta,
            inputs: self.leaves,
            output: root.clone(),
            checks: self.checks,
            status_slot: self.status_slot,
            workgroups,
            trusted: false,
            window: None,
            rows: None,
            alias: None,
            extra_outputs: Vec::new(),
            extra_aliases: Vec::new(),
            textured: 0,
        }
    }

    /// Input base slots for [`super::Window`]: the slot of each leaf read only at the
    /// output's own index and holding as many elements as `n`.
    /// Window (base, length) slots of the leaves read at other indices than the
    /// output's own (see `leaf_len`).
    pub fn gather_slots(&self) -> Vec<Option<(usize, usize)>> {
        (0..self.leaves.len())
            .map(|k| match (self.leaf_base[k], self.leaf_len[k]) {
                (Some(b), Some(l)) if !self.leaf_aligned[k] || self.check_all_windows => Some((b, l)),
                _ => None,
            })
            .collect()
    }

    /// In `param_leaves` mode, an expand node `t` at the output's own index whose source
    /// is a leaf repeated over leading axes (a bias row): at output index `i` it reads
    /// `i % len`, and a quad of the output reads one quad of it. Its parameter, or `None`.
    fn periodic_param(&mut self, t: &Tensor, ix: &Ix) -> Option<String> {
        if !self.param_leaves || ix.lin.as_deref() != Some("i") {
            return None;
        }
        let (src, len) = self.periodic_leaf(t)?;
        let k = self.leaf(&src);
        // One leaf is loaded at one place: repeated at the output's quads or at the
        // permute's, never also read directly.
        let scoped = self.param_permuted.contains(&k);
        let clash = match self.param_period.contains_key(&k) {
            true => scoped != self.in_permute,
            false => scoped,
        };
        if self.param_direct.contains(&k) || clash {
            self.params_ok = false;
        }
        if self.in_permute {
            self.param_permuted.insert(k);
        }
        if !self.param_period.contains_key(&k) {
            self.meta.push((len / self.param_lanes) as u32);
            self.param_period.insert(k, self.meta.len() - 1);
        }
        Some(format!("p{k}"))
    }

    /// In `param_leaves` mode with `quad_permute`, a permute `t` at the output's own index
    /// that keeps the innermost axis, a multiple of 4 long: the four lanes of an output
    /// quad read four consecutive elements of its input, one quad. Its input is evaluated
    /// as if at its own index, with its leaves loaded at quad `pq` (meta slots hold the
    /// output's strides and dims and the input's strides in output order). Only element-
    /// wise ops, reshapes, constants and repeated rows may lie under it; `None` (the
    /// per-element path) otherwise, or for a second permute.
    fn permuted_quads(&mut self, t: &Tensor, perm: &[usize], ix: &Ix) -> Option<String> {
        let r = t.rank();
        let last = *t.dims().last()?;
        if !self.param_leaves
            || !self.quad_permute
            || std::env::var("TESSERA_VEC4_PERMUTE").as_deref() == Ok("0")
            || self.in_permute
            || self.permute_quad.is_some()
            || ix.lin.as_deref() != Some("i")
            || r < 2
            || perm[r - 1] != r - 1
            || !last.is_multiple_of(4)
            || !self.quad_safe(&t.node().inputs[0])
        {
            return None;
        }
        let input = &t.node().inputs[0];
        let in_strides = crate::Shape(input.dims().to_vec()).strides();
        self.permute_quad = Some(if cfg!(target_arch = "wasm32") {
            // pq = sum over axes d of ((4q / out_stride[d]) % dim[d]) * in_stride[perm[d]] / 4;
            // the innermost axis contributes (4q % last) / 4.
            let out_strides = crate::Shape(t.dims().to_vec()).strides();
            let mut terms = Vec::new();
            for d in 0..r - 1 {
                if t.dims()[d] == 1 {
                    continue;
                }
                let (os, dim, is) = (
                    self.slot(out_strides[d] as u32),
                    self.slot(t.dims()[d] as u32),
                    self.slot((in_strides[perm[d]] / 4) as u32),
                );
                terms.push(format!("((4u * q / {os}) % {dim}) * {is}"));
            }
            let lq = self.slot((last / 4) as u32);
            terms.push(format!("(q % {lq})"));
            format!("    let pq = {};\n", terms.join(" + "))
        } else {
            // Native: q unravelled from the innermost axis out, one division by
            // multiplying per axis (`udiv`; CPU adapters divide lane by lane), the
            // outermost axis left undivided (q is in range).
            let axes: Vec<usize> = (0..r - 1).filter(|&d| t.dims()[d] != 1).collect();
            let lq = self.slot((last / 4) as u32);
            let mut body = format!("    let pq_0 = {};\n", self.udiv("q", &lq, (last / 4) as u32));
            let mut terms = vec![format!("(q - pq_0 * {lq})")];
            for (n, &d) in axes.iter().rev().enumerate() {
                let is = self.slot((in_strides[perm[d]] / 4) as u32);
                if n + 1 == axes.len() {
                    terms.push(format!("pq_{n} * {is}"));
                    break;
                }
                let dim = self.slot(t.dims()[d] as u32);
                let next = self.udiv(&format!("pq_{n}"), &dim, t.dims()[d] as u32);
                body.push_str(&format!("    let pq_{} = {next};\n", n + 1));
                terms.push(format!("(pq_{n} - pq_{} * {dim}) * {is}", n + 1));
            }
            format!("{body}    let pq = {};\n", terms.join(" + "))
        });
        self.in_permute = true;
        let v = self.eval(input, &Ix::lin("i"), false);
        self.in_permute = false;
        Some(v)
    }

    /// Whether everything under `t` down to its leaves reads each leaf at `t`'s own
    /// index or as a repeated row: element-wise ops, casts, reshapes, constants.
    fn quad_safe(&self, t: &Tensor) -> bool {
        if (self.is_leaf)(t) {
            return !t.dtype().is_quantized();
        }
        let n = t.node();
        match n.op {
            Op::Full { .. } => true,
            Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast | Op::Reshape => {
                n.inputs.iter().all(|i| self.quad_safe(i))
            }
            Op::Expand => self.periodic_leaf(t).is_some(),
            _ => false,
        }
    }

    /// For an expand node `t` whose source is a (non-quantised) leaf equal to `t`'s
    /// trailing axes, a whole number of quads long: the leaf and its length.
    fn periodic_leaf(&self, t: &Tensor) -> Option<(Tensor, usize)> {
        let input = t.node().inputs.first()?;
        // Reshapes keep the linear index: the leaf may sit under some.
        let mut src = input.clone();
        while !(self.is_leaf)(&src) && src.node().op == Op::Reshape {
            src = src.node().inputs[0].clone();
        }
        if !(self.is_leaf)(&src) || src.dtype().is_quantized() {
            return None;
        }
        let sd = input.dims();
        let lead = sd.iter().take_while(|&&d| d == 1).count();
        let tail = &sd[lead..];
        let td = t.dims();
        let len: usize = tail.iter().product();
        (tail.len() <= td.len()
            && td[td.len() - tail.len()..] == *tail
            && len.is_multiple_of(self.param_lanes)
            && len > 0
            && src.numel() == len)
            .then_some((src, len))
    }

    /// Whether no leaf is quantised (window mode gives those no base slot).
    pub fn no_quantised_leaves(&self) -> bool {
        self.windows && self.leaf_base.iter().all(Option::is_some)
    }

    /// Decide [`Gen::emit_windows`]: whether `out_bytes` or any leaf exceeds a binding.
    pub fn decide_windows(&mut self, out_bytes: u64) {
        let big = |b: u64| b > self.caps.max_binding;
        self.emit_windows = self.windows && (big(out_bytes) || self.leaves.iter().any(|t| big(t.storage_bytes())));
    }

    pub fn window_bases(&self, n: usize) -> Vec<Option<usize>> {
        // (For a reduction `n` is its input's element count.)
        self.leaves
            .iter()
            .enumerate()
            .map(|(k, t)| self.leaf_base[k].filter(|_| self.leaf_aligned[k] && t.numel() == n))
            .collect()
    }

    /// Helper functions (from `shaders/common.wgsl` and `udiv.wgsl`) plus the status
    /// binding if used.
    pub fn support(&self, status_binding: u32) -> String {
        let mut s = String::from(super::sources::COMMON);
        s.push_str(super::sources::UDIV);
        if !self.checks.is_empty() {
            s.push_str(&format!(
                "@group(0) @binding({status_binding}) var<storage, read_write> status: array<atomic<u32>>;\n"
            ));
        }
        s
    }
}

/// The magic number and packed shifts with which `udiv` (shaders/udiv.wgsl) divides a u32 by
/// `d >= 1`: Granlund and Montgomery's round-up method (Hacker's Delight 10-8), with
/// `l = ceil(log2 d)`, `magic = floor(2^32 (2^l - d) / d) + 1` (below 2^32), and shifts
/// `min(l, 1)` (bit 0) and `max(l, 1) - 1` (bits 1 and up).
pub fn udiv_magic(d: u32) -> (u32, u32) {
    let d = d.max(1);
    let l = 32 - (d - 1).leading_zeros();
    let magic = ((1u64 << 32) * ((1u64 << l) - d as u64) / d as u64 + 1) as u32;
    (magic, (l.max(1) - 1) << 1 | l.min(1))
}

/// `v`, or NaN where `x` is below 0 (WGSL leaves log and sqrt of a negative number
/// undefined), by OR-ing a NaN's bits in: a float select against a NaN constant folded
/// into a wide store's packing on lavapipe (see `relu_f` in common.wgsl), 1.5x slower.
fn nan_below_zero(v: &str, x: &str) -> String {
    format!("bitcast<f32>(bitcast<u32>({v}) | select(0u, 0x7fc00000u, {x} < 0.0))")
}

fn unary_expr(u: UnaryOp, x: &str, dt: DType) -> String {
    let float = dt.is_float();
    match u {
        UnaryOp::Neg => format!("-{x}"),
        UnaryOp::Abs if dt == DType::U32 => x.to_string(),
        UnaryOp::Abs => format!("abs({x})"),
        UnaryOp::Exp => format!("exp({x})"),
        UnaryOp::Log => nan_below_zero(&format!("log({x})"), x),
        UnaryOp::Sqrt => nan_below_zero(&format!("sqrt({x})"), x),
        UnaryOp::Rsqrt => nan_below_zero(&format!("1.0 / sqrt({x})"), x),
        UnaryOp::Sin => format!("sin({x})"),
        UnaryOp::Cos => format!("cos({x})"),
        UnaryOp::Tanh => format!("tanh_f({x})"),
        UnaryOp::Sigmoid => format!("1.0 / (1.0 + exp(-{x}))"),
        UnaryOp::Relu if float => format!("relu_f({x})"),
        UnaryOp::Relu => format!("max({x}, {}(0))", compute_type(dt)),
        UnaryOp::Erf => format!("erf_f({x})"),
        UnaryOp::GeluErf => format!("0.5 * {x} * (1.0 + erf_f({x} * 0.7071067811865476))"),
        UnaryOp::GeluTanh => {
            format!("0.5 * {x} * (1.0 + tanh_f(0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})))")
        }
        UnaryOp::Silu => format!("{x} / (1.0 + exp(-{x}))"),
        UnaryOp::Floor => format!("floor({x})"),
        UnaryOp::Ceil => format!("ceil({x})"),
        // WGSL's round() takes halves to even.
        UnaryOp::Round => format!("round({x})"),
        UnaryOp::Recip => format!("1.0 / {x}"),
        UnaryOp::Not => format!("!{x}"),
    }
}

fn binary_expr(b: BinaryOp, x: &str, y: &str, dt: DType) -> String {
    let float = dt.is_float();
    match b {
        BinaryOp::Add => format!("{x} + {y}"),
        BinaryOp::Sub => format!("{x} - {y}"),
        BinaryOp::Mul => format!("{x} * {y}"),
        BinaryOp::Div if dt == DType::I32 => format!("div_i({x}, {y})"),
        BinaryOp::Div if dt == DType::U32 => format!("div_u({x}, {y})"),
        BinaryOp::Div => format!("{x} / {y}"),
        BinaryOp::Maximum if float => format!("max_f({x}, {y})"),
        BinaryOp::Minimum if float => format!("min_f({x}, {y})"),
        BinaryOp::Maximum => format!("max({x}, {y})"),
        BinaryOp::Minimum => format!("min({x}, {y})"),
        BinaryOp::Pow => format!("pow_f({x}, {y})"),
        BinaryOp::Eq if float => format!("eq_f({x}, {y})"),
        BinaryOp::Ne if float => format!("!eq_f({x}, {y})"),
        BinaryOp::Lt if float => format!("lt_f({x}, {y})"),
        BinaryOp::Le if float => format!("le_f({x}, {y})"),
        BinaryOp::Gt if float => format!("lt_f({y}, {x})"),
        BinaryOp::Ge if float => format!("le_f({y}, {x})"),
        BinaryOp::Eq => format!("{x} == {y}"),
        BinaryOp::Ne => format!("{x} != {y}"),
        BinaryOp::Lt => format!("{x} < {y}"),
        BinaryOp::Le => format!("{x} <= {y}"),
        BinaryOp::Gt => format!("{x} > {y}"),
        BinaryOp::Ge => format!("{x} >= {y}"),
        BinaryOp::And => format!("{x} && {y}"),
        BinaryOp::Or => format!("{x} || {y}"),
    }
}

#[cfg(test)]
mod tests {
    use super::udiv_magic;

    /// udiv.wgsl's `udiv`, step for step in wrapping u32 arithmetic.
    fn udiv(n: u32, magic: u32, shifts: u32) -> u32 {
        let (al, ah, bl, bh) = (magic & 0xffff, magic >> 16, n & 0xffff, n >> 16);
        let (lh, hl) = (al * bh, ah * bl);
        let mid = ((al * bl) >> 16) + (lh & 0xffff) + (hl & 0xffff);
        let t = ah.wrapping_mul(bh) + (lh >> 16) + (hl >> 16) + (mid >> 16);
        (t + ((n - t) >> (shifts & 1))) >> (shifts >> 1)
    }

    #[test]
    fn udiv_by_magic_numbers_is_exact() {
        let mut ds: Vec<u32> = (1..=1100).collect();
        for k in 1..32 {
            let p = 1u32 << k;
            ds.extend([p - 1, p, p + 1]);
        }
        ds.extend([3 * 7 * 11 * 13 * 17, 6_700_417, u32::MAX - 1, u32::MAX, 2_147_483_647]);
        let mut ns: Vec<u32> =
            (0..300).chain([u32::MAX, u32::MAX - 1, 1 << 31, (1 << 31) - 1, 65_535, 65_536]).collect();
        // A fixed xorshift sequence covers the rest of the range.
        let mut x = 0x9e37_79b9u32;
        for _ in 0..400 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            ns.push(x);
        }
        for &d in &ds {
            let (magic, shifts) = udiv_magic(d);
            for &n in
                ns.iter().chain([d - 1, d, d.wrapping_mul(2).max(d), (u32::MAX / d) * d, (u32::MAX / d) * d - 1].iter())
            {
                assert_eq!(udiv(n, magic, shifts), n / d, "{n} / {d} (magic {magic}, shifts {shifts})");
            }
        }
    }
}
