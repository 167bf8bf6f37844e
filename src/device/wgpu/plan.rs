//! Plan replay. A training loop builds the same graph every step with new leaves and new
//! scalars (learning rate, bias corrections, dropout seeds). The graph's structure (ops
//! without their scalars, shapes, dtypes, which nodes are realised, and the wiring) is
//! hashed; a hit replays the cached schedule: kernels, WGSL sources, grids and meta words,
//! with only the scalar slots refilled from the new nodes. Scheduling and rendering are
//! skipped.

use crate::graph::schedule::topo_order;
use crate::graph::Op;
use crate::kernels::codegen::ScalarField;
use crate::kernels::{IndexCheck, KernelSpec};
use crate::{DType, Tensor};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// Whether cached plans are replayed (`TESSERA_PLAN_CACHE=0` turns it off, to compare).
pub(crate) fn replay_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TESSERA_PLAN_CACHE").map(|v| v != "0").unwrap_or(true))
}

/// Most plans kept per device; the cache starts over when full.
const MAX_PLANS: usize = 256;

struct CachedKernel {
    label: String,
    source: String,
    meta: Vec<u32>,
    /// (meta index, node position, field, dtype)
    patches: Vec<(usize, usize, ScalarField, DType)>,
    inputs: Vec<usize>,
    output: usize,
    checks: Vec<IndexCheck>,
    status_slot: Option<usize>,
    workgroups: [u32; 3],
    trusted: bool,
    window: Option<crate::kernels::Window>,
    rows: Option<crate::kernels::RowSplit>,
}

struct CachedPlan {
    nodes: usize,
    kernels: Vec<CachedKernel>,
}

/// A device's plans by graph signature.
#[derive(Default)]
pub(crate) struct PlanCache {
    plans: Mutex<HashMap<u64, Arc<CachedPlan>>>,
}

/// The graph under `targets` in a fixed order (leaves and unrealised nodes) and the hash
/// of its structure.
pub(crate) struct Signature {
    pub hash: u64,
    pub nodes: Vec<Tensor>,
    pos: HashMap<u64, usize>,
}

fn hash_op(op: &Op, h: &mut DefaultHasher) {
    std::mem::discriminant(op).hash(h);
    match op {
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

impl Signature {
    pub fn of(targets: &[Tensor]) -> Signature {
        let order = topo_order(targets);
        let mut h = DefaultHasher::new();
        let mut nodes = Vec::with_capacity(order.len() + 8);
        let mut pos: HashMap<u64, usize> = HashMap::with_capacity(order.len() + 8);
        let leaf = |t: &Tensor, nodes: &mut Vec<Tensor>, pos: &mut HashMap<u64, usize>, h: &mut DefaultHasher| {
            let next = nodes.len();
            let p = *pos.entry(t.id()).or_insert(next);
            if p == next {
                nodes.push(t.clone());
                (0xfeed_u32, t.dims(), t.dtype()).hash(h);
            }
            p
        };
        for t in &order {
            let mut ins = Vec::with_capacity(t.node().inputs.len());
            for i in &t.node().inputs {
                ins.push(if i.is_realized() { leaf(i, &mut nodes, &mut pos, &mut h) } else { pos[&i.id()] });
            }
            pos.insert(t.id(), nodes.len());
            nodes.push(t.clone());
            hash_op(&t.node().op, &mut h);
            (t.dims(), t.dtype(), &ins).hash(&mut h);
        }
        for t in targets {
            let p = if t.is_realized() { leaf(t, &mut nodes, &mut pos, &mut h) } else { pos[&t.id()] };
            (0x7a6_u32, p).hash(&mut h);
        }
        Signature { hash: h.finish(), nodes, pos }
    }
}

impl PlanCache {
    /// The kernels of a cached plan for this signature, with scalars refilled.
    pub fn replay(&self, sig: &Signature) -> Option<Vec<KernelSpec>> {
        let plan = self.plans.lock().ok()?.get(&sig.hash).cloned()?;
        if plan.nodes != sig.nodes.len() {
            return None;
        }
        let mut out = Vec::with_capacity(plan.kernels.len());
        for k in &plan.kernels {
            let mut meta = k.meta.clone();
            for &(idx, p, field, dt) in &k.patches {
                meta[idx] = field.word(&sig.nodes[p].node().op, dt)?;
            }
            out.push(KernelSpec {
                label: k.label.clone(),
                source: k.source.clone(),
                meta,
                inputs: k.inputs.iter().map(|&i| sig.nodes[i].clone()).collect(),
                output: sig.nodes[k.output].clone(),
                checks: k.checks.clone(),
                status_slot: k.status_slot,
                workgroups: k.workgroups,
                trusted: k.trusted,
                patches: Vec::new(),
                window: k.window.clone(),
                rows: k.rows.clone(),
            });
        }
        Some(out)
    }

    /// Remember freshly rendered `specs` under `sig` (skipped if any tensor they name is
    /// outside the signature).
    pub fn store(&self, sig: &Signature, specs: &[KernelSpec]) {
        let at = |t: &Tensor| sig.pos.get(&t.id()).copied();
        let mut kernels = Vec::with_capacity(specs.len());
        for s in specs {
            let (Some(output), Some(inputs)) = (at(&s.output), s.inputs.iter().map(at).collect::<Option<Vec<_>>>())
            else {
                return;
            };
            let mut patches = Vec::with_capacity(s.patches.len());
            for p in &s.patches {
                let Some(n) = sig.pos.get(&p.node) else { return };
                patches.push((p.index, *n, p.field, p.dtype));
            }
            kernels.push(CachedKernel {
                label: s.label.clone(),
                source: s.source.clone(),
                meta: s.meta.clone(),
                patches,
                inputs,
                output,
                checks: s.checks.clone(),
                status_slot: s.status_slot,
                trusted: s.trusted,
                workgroups: s.workgroups,
                window: s.window.clone(),
                rows: s.rows.clone(),
            });
        }
        if let Ok(mut m) = self.plans.lock() {
            if m.len() >= MAX_PLANS {
                m.clear();
            }
            m.insert(sig.hash, Arc::new(CachedPlan { nodes: sig.nodes.len(), kernels }));
        }
    }
}
