//! The GPU profiler. Where the adapter has timestamp queries, each kernel's GPU time is
//! recorded (`TESSERA_PROFILE=trace.json`, or [`start`]) and written as a Chrome trace
//! that Perfetto and `chrome://tracing` open, one slice per kernel named by its label
//! (`matmul_f32_64x64_nt`, `fused(add,mul,relu)`). [`top`] sums time per kernel name.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

/// One kernel execution.
#[derive(Clone, Debug)]
pub struct KernelTime {
    pub label: String,
    /// Start, in microseconds on the device clock.
    pub start_us: f64,
    pub duration_us: f64,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static EVENTS: Mutex<Vec<KernelTime>> = Mutex::new(Vec::new());

fn env_path() -> Option<&'static str> {
    static PATH: OnceLock<Option<String>> = OnceLock::new();
    PATH.get_or_init(|| std::env::var("TESSERA_PROFILE").ok().filter(|p| !p.is_empty())).as_deref()
}

/// Whether kernels are being timed.
pub fn enabled() -> bool {
    ACTIVE.load(Ordering::Relaxed) || env_path().is_some()
}

/// Start timing kernels (as if `TESSERA_PROFILE` were set).
pub fn start() {
    ACTIVE.store(true, Ordering::Relaxed);
}

/// Stop timing and return what was recorded (the record is cleared).
pub fn stop() -> Vec<KernelTime> {
    ACTIVE.store(false, Ordering::Relaxed);
    std::mem::take(&mut *EVENTS.lock().unwrap_or_else(|e| e.into_inner()))
}

pub(crate) fn record(events: impl IntoIterator<Item = KernelTime>) {
    EVENTS.lock().unwrap_or_else(|e| e.into_inner()).extend(events);
}

/// Kernel executions recorded so far.
pub fn events() -> Vec<KernelTime> {
    EVENTS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Total GPU time per kernel label, largest first: `(label, total ms, count)`.
pub fn top(n: usize) -> Vec<(String, f64, usize)> {
    let mut sums: std::collections::HashMap<String, (f64, usize)> = Default::default();
    for e in EVENTS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let s = sums.entry(e.label.clone()).or_default();
        s.0 += e.duration_us / 1e3;
        s.1 += 1;
    }
    let mut v: Vec<_> = sums.into_iter().map(|(k, (ms, c))| (k, ms, c)).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v.truncate(n);
    v
}

/// The recorded events as Chrome trace JSON.
pub fn chrome_trace() -> String {
    let events = EVENTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let t0 = events.iter().map(|e| e.start_us).fold(f64::INFINITY, f64::min);
    let list: Vec<serde_json::Value> = events
        .iter()
        .map(|e| {
            serde_json::json!({"name": e.label, "cat": "kernel", "ph": "X", "pid": 1, "tid": 1,
                "ts": e.start_us - t0, "dur": e.duration_us})
        })
        .collect();
    serde_json::json!({ "traceEvents": list, "displayTimeUnit": "ms" }).to_string()
}

/// Write the trace to `path` (native).
#[cfg(not(target_arch = "wasm32"))]
pub fn save(path: impl AsRef<std::path::Path>) -> crate::Result<()> {
    let p = path.as_ref();
    std::fs::write(p, chrome_trace())
        .map_err(|e| crate::Error::Io { path: p.display().to_string(), message: e.to_string() })
}

/// Write the trace to `TESSERA_PROFILE`'s path, if set (called when a device drops).
pub(crate) fn save_to_env() {
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(p) = env_path() {
        if !EVENTS.lock().map(|e| e.is_empty()).unwrap_or(true) {
            let _ = save(p);
        }
    }
}
