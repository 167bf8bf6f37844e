//! Counters since process start: kernels, submits, pipelines, buffers and bytes.
//! Each device keeps its own; [`stats`] sums them process-wide.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Compute dispatches encoded.
    pub kernels_dispatched: u64,
    /// Queue submissions.
    pub submits: u64,
    /// Realisations run (each is at most one submit).
    pub realizations: u64,
    /// Compute pipelines compiled (cache misses).
    pub pipelines_compiled: u64,
    /// Pipeline cache hits.
    pub pipeline_cache_hits: u64,
    /// Realisations that scheduled and rendered their graph (plan cache misses).
    pub plans_built: u64,
    /// Realisations that replayed a cached plan of the same graph structure.
    pub plans_replayed: u64,
    /// Device buffers created (pool misses), operand textures included
    /// (`ShaderCaps::texture_rows`).
    pub buffers_allocated: u64,
    /// Copies of operands into textures (`ShaderCaps::texture_rows`; one per tensor and
    /// byte range in a submit, none where an earlier submit's copy of a tensor is kept).
    pub operand_copies: u64,
    /// Bytes of device buffers (and operand textures) held by live tensors and running
    /// plans, and by the operand textures kept for later submits (the texture cache of
    /// CPU adapters, released with the tensors they copy).
    pub bytes_in_use: u64,
    /// The most `bytes_in_use` has been.
    pub peak_bytes: u64,
    /// Bytes of every device buffer and operand texture created and not yet destroyed,
    /// pooled ones included.
    pub bytes_allocated: u64,
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kernels {} | submits {} | realizations {} | plans built {} replayed {} | pipelines {} (cache hits {}) | buffers {} | operand copies {} | in use {} B (peak {} B) | allocated {} B",
            self.kernels_dispatched,
            self.submits,
            self.realizations,
            self.plans_built,
            self.plans_replayed,
            self.pipelines_compiled,
            self.pipeline_cache_hits,
            self.buffers_allocated,
            self.operand_copies,
            self.bytes_in_use,
            self.peak_bytes,
            self.bytes_allocated
        )
    }
}

/// Live counters of one device (and of the whole process).
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub kernels: AtomicU64,
    pub submits: AtomicU64,
    pub realizations: AtomicU64,
    pub pipelines: AtomicU64,
    pub pipeline_hits: AtomicU64,
    pub plans: AtomicU64,
    pub replays: AtomicU64,
    pub buffers: AtomicU64,
    pub operand_copies: AtomicU64,
    pub in_use: AtomicU64,
    pub peak: AtomicU64,
    pub allocated: AtomicU64,
}

pub(crate) static GLOBAL: Counters = Counters {
    kernels: AtomicU64::new(0),
    submits: AtomicU64::new(0),
    realizations: AtomicU64::new(0),
    pipelines: AtomicU64::new(0),
    pipeline_hits: AtomicU64::new(0),
    plans: AtomicU64::new(0),
    replays: AtomicU64::new(0),
    buffers: AtomicU64::new(0),
    operand_copies: AtomicU64::new(0),
    in_use: AtomicU64::new(0),
    peak: AtomicU64::new(0),
    allocated: AtomicU64::new(0),
};

/// Which counter to bump.
#[derive(Clone, Copy)]
pub(crate) enum Counter {
    Kernels,
    Submits,
    Realizations,
    Pipelines,
    PipelineHits,
    Plans,
    Replays,
    Buffers,
    // Operand textures are native only.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    OperandCopies,
}

impl Counters {
    fn field(&self, c: Counter) -> &AtomicU64 {
        match c {
            Counter::Kernels => &self.kernels,
            Counter::Submits => &self.submits,
            Counter::Realizations => &self.realizations,
            Counter::Pipelines => &self.pipelines,
            Counter::PipelineHits => &self.pipeline_hits,
            Counter::Plans => &self.plans,
            Counter::Replays => &self.replays,
            Counter::Buffers => &self.buffers,
            Counter::OperandCopies => &self.operand_copies,
        }
    }

    /// Add `n` to counter `c` here and in the process-wide total.
    pub fn add(&self, c: Counter, n: u64) {
        self.field(c).fetch_add(n, Relaxed);
        GLOBAL.field(c).fetch_add(n, Relaxed);
    }

    /// Bytes checked out of the pool (positive) or returned (negative).
    pub fn in_use(&self, delta: i64) {
        for c in [self, &GLOBAL] {
            let now = if delta >= 0 {
                c.in_use.fetch_add(delta as u64, Relaxed) + delta as u64
            } else {
                c.in_use.fetch_sub((-delta) as u64, Relaxed) - (-delta) as u64
            };
            c.peak.fetch_max(now, Relaxed);
        }
    }

    /// Bytes of buffers created (positive) or destroyed (negative).
    pub fn allocated(&self, delta: i64) {
        for c in [self, &GLOBAL] {
            if delta >= 0 {
                c.allocated.fetch_add(delta as u64, Relaxed);
            } else {
                c.allocated.fetch_sub((-delta) as u64, Relaxed);
            }
        }
    }

    /// Start the high-water mark again from what is in use now.
    pub fn reset_peak(&self) {
        self.peak.store(self.in_use.load(Relaxed), Relaxed);
    }

    pub fn snapshot(&self) -> Stats {
        Stats {
            kernels_dispatched: self.kernels.load(Relaxed),
            submits: self.submits.load(Relaxed),
            realizations: self.realizations.load(Relaxed),
            pipelines_compiled: self.pipelines.load(Relaxed),
            pipeline_cache_hits: self.pipeline_hits.load(Relaxed),
            plans_built: self.plans.load(Relaxed),
            plans_replayed: self.replays.load(Relaxed),
            buffers_allocated: self.buffers.load(Relaxed),
            operand_copies: self.operand_copies.load(Relaxed),
            bytes_in_use: self.in_use.load(Relaxed),
            peak_bytes: self.peak.load(Relaxed),
            bytes_allocated: self.allocated.load(Relaxed),
        }
    }
}

/// Process-wide counters since start, summed over every device.
pub fn stats() -> Stats {
    GLOBAL.snapshot()
}
