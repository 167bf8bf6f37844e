//! Plan replay. A training loop builds the same graph every step with new leaves and new
//! scalars (learning rate, bias corrections, dropout seeds). The graph's structure is
//! hashed ([`Signature`]); a hit replays the cached schedule: kernels, WGSL sources,
//! grids and meta words, with only the scalar slots refilled from the new nodes.
//! Scheduling and rendering are skipped.

use crate::graph::signature::Signature;
use crate::kernels::codegen::ScalarField;
use crate::kernels::{IndexCheck, KernelSpec};
use crate::{DType, Tensor};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Whether cached plans are replayed (`TESSERA_PLAN_CACHE=0` turns it off, to compare).
pub(crate) fn replay_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TESSERA_PLAN_CACHE").map(|v| v != "0").unwrap_or(true))
}

/// Most plans kept per device; past it, the least recently used goes.
const MAX_PLANS: usize = 256;

struct CachedKernel {
    label: String,
    /// Shared with the rendered spec and every replay, which then copy no WGSL.
    source: Arc<str>,
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
    alias: Option<usize>,
    extra_outputs: Vec<usize>,
    extra_aliases: Vec<usize>,
    textured: u32,
}

struct CachedPlan {
    nodes: usize,
    kernels: Vec<CachedKernel>,
    /// The cache's tick at this plan's last use.
    used: std::sync::atomic::AtomicU64,
}

/// A device's plans by graph signature, each with the tick of its last use.
#[derive(Default)]
pub(crate) struct PlanCache {
    plans: Mutex<Plans>,
}

#[derive(Default)]
struct Plans {
    by_signature: HashMap<u64, Arc<CachedPlan>>,
    tick: u64,
}

impl Plans {
    /// Keep `plan` under `hash`, first dropping the least recently used plan when full
    /// (a server that sees more shapes than `max` keeps its busiest ones).
    fn insert(&mut self, hash: u64, plan: CachedPlan, max: usize) {
        if self.by_signature.len() >= max && !self.by_signature.contains_key(&hash) {
            let used = |p: &Arc<CachedPlan>| p.used.load(Ordering::Relaxed);
            let oldest = self.by_signature.iter().min_by_key(|(_, p)| used(p)).map(|(h, _)| *h);
            if let Some(h) = oldest {
                self.by_signature.remove(&h);
            }
        }
        self.tick += 1;
        plan.used.store(self.tick, Ordering::Relaxed);
        self.by_signature.insert(hash, Arc::new(plan));
    }

    fn get(&mut self, hash: u64) -> Option<Arc<CachedPlan>> {
        self.tick += 1;
        let plan = self.by_signature.get(&hash)?;
        plan.used.store(self.tick, Ordering::Relaxed);
        Some(plan.clone())
    }
}

impl PlanCache {
    /// The kernels of a cached plan for this signature, with scalars refilled.
    pub fn replay(&self, sig: &Signature) -> Option<Vec<KernelSpec>> {
        let plan = self.plans.lock().ok()?.get(sig.hash)?;
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
                alias: k.alias.map(|a| sig.nodes[a].clone()),
                extra_outputs: k.extra_outputs.iter().map(|&i| sig.nodes[i].clone()).collect(),
                extra_aliases: k.extra_aliases.iter().map(|&i| sig.nodes[i].clone()).collect(),
                textured: k.textured,
            });
        }
        Some(out)
    }

    /// Remember freshly rendered `specs` under `sig` (skipped if any tensor they name is
    /// outside the signature).
    pub fn store(&self, sig: &Signature, specs: &[KernelSpec]) {
        let at = |t: &Tensor| sig.position(&t.id());
        let mut kernels = Vec::with_capacity(specs.len());
        for s in specs {
            let (Some(output), Some(inputs)) = (at(&s.output), s.inputs.iter().map(at).collect::<Option<Vec<_>>>())
            else {
                return;
            };
            let alias = match &s.alias {
                Some(a) => match at(a) {
                    Some(p) => Some(p),
                    None => return,
                },
                None => None,
            };
            let Some(extra_outputs) = s.extra_outputs.iter().map(at).collect::<Option<Vec<_>>>() else {
                return;
            };
            let Some(extra_aliases) = s.extra_aliases.iter().map(at).collect::<Option<Vec<_>>>() else {
                return;
            };
            let mut patches = Vec::with_capacity(s.patches.len());
            for p in &s.patches {
                let Some(n) = sig.position(&p.node) else { return };
                patches.push((p.index, n, p.field, p.dtype));
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
                alias,
                extra_outputs,
                extra_aliases,
                textured: s.textured,
            });
        }
        if let Ok(mut m) = self.plans.lock() {
            let plan = CachedPlan { nodes: sig.nodes.len(), kernels, used: Default::default() };
            m.insert(sig.hash, plan, MAX_PLANS);
        }
    }
}
