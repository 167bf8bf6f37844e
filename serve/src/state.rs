//! The server's models: every version found in the repository, its state (unloaded,
//! loading, ready, failed), which one is live, a canary taking a fraction of the traffic,
//! and the quality guard that rolls a canary back on its own. Also the result cache.

use crate::batcher::{BatchConfig, Batcher, DeviceCell};
use crate::model::{Input, Output, Runner};
use crate::repo::{self, Manifest};
use moka::sync::Cache;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Thresholds of the canary guard.
#[derive(Clone, Copy, Debug)]
pub struct GuardConfig {
    /// Comparisons (and requests) kept in the sliding window.
    pub window: usize,
    /// Comparisons needed before the guard judges.
    pub min_samples: usize,
    /// Embeddings: the window's mean cosine to the live version must stay above this.
    pub min_cosine: f64,
    /// Classifiers: the window's top-1 agreement must stay above this.
    pub min_agreement: f64,
    /// The canary's error rate over the window must stay below this.
    pub max_error_rate: f64,
    /// The canary's p99 latency may be at most this many times the live version's.
    pub max_p99_ratio: f64,
    /// Of the canary's requests, the fraction the live version also runs to compare.
    pub shadow_fraction: f64,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            window: 50,
            min_samples: 16,
            min_cosine: 0.99,
            min_agreement: 0.9,
            max_error_rate: 0.05,
            max_p99_ratio: 4.0,
            shadow_fraction: 1.0,
        }
    }
}

/// A version's lifecycle.
#[derive(Clone, Debug, PartialEq)]
pub enum VersionState {
    Unloaded,
    Loading,
    Ready,
    Failed(String),
}

impl VersionState {
    fn name(&self) -> &'static str {
        match self {
            VersionState::Unloaded => "unloaded",
            VersionState::Loading => "loading",
            VersionState::Ready => "ready",
            VersionState::Failed(_) => "failed",
        }
    }
}

pub struct Version {
    pub dir: PathBuf,
    pub manifest: Option<Manifest>,
    pub state: VersionState,
    pub batcher: Option<Arc<Batcher>>,
}

/// The canary's window.
pub struct Canary {
    pub version: String,
    pub fraction: f64,
    counter: u64,
    /// Per request: (ok, latency); per comparison: the agreement (cosine or 0/1).
    requests: VecDeque<(bool, Duration)>,
    live_latency: VecDeque<Duration>,
    comparisons: VecDeque<f64>,
}

pub struct Model {
    pub versions: BTreeMap<String, Version>,
    pub live: Option<String>,
    /// Earlier live versions, most recent last (what rollback returns to).
    pub history: Vec<String>,
    pub canary: Option<Canary>,
    pub events: Vec<String>,
    pub embeds: bool,
}

/// Where a request goes.
pub struct Route {
    pub version: String,
    pub batcher: Arc<Batcher>,
    /// The live version to compare with, for a sampled canary request.
    pub shadow: Option<(String, Arc<Batcher>)>,
    pub canary: bool,
    pub dtype: String,
}

/// Why a route could not be found.
pub enum RouteError {
    UnknownModel,
    NotReady,
}

pub struct Registry {
    pub root: PathBuf,
    pub models: RwLock<BTreeMap<String, Model>>,
    pub devices: Arc<DeviceCell>,
    pub batch: BatchConfig,
    pub guard: GuardConfig,
    pub cache: Cache<[u8; 32], Arc<Output>>,
    pub ready: AtomicBool,
    pub shutting_down: AtomicBool,
    requests: AtomicU64,
    /// Serialises loads so two loads of one version cannot race.
    load_lock: Mutex<()>,
}

impl Registry {
    pub fn new(
        root: PathBuf,
        devices: Arc<DeviceCell>,
        batch: BatchConfig,
        guard: GuardConfig,
        cache_bytes: u64,
    ) -> tessera::Result<Registry> {
        let mut models = BTreeMap::new();
        for (name, versions) in repo::scan(&root)? {
            let mut vs = BTreeMap::new();
            let mut embeds = false;
            for v in versions {
                let dir = root.join(&name).join(&v);
                let (manifest, state) = match Manifest::read(&dir) {
                    Ok(m) => {
                        embeds = m.embeds();
                        (Some(m), VersionState::Unloaded)
                    }
                    Err(e) => (None, VersionState::Failed(e.to_string())),
                };
                vs.insert(v, Version { dir, manifest, state, batcher: None });
            }
            models.insert(
                name,
                Model { versions: vs, live: None, history: vec![], canary: None, events: vec![], embeds },
            );
        }
        let cache =
            Cache::builder().weigher(|_k: &[u8; 32], v: &Arc<Output>| v.bytes()).max_capacity(cache_bytes).build();
        Ok(Registry {
            root,
            models: RwLock::new(models),
            devices,
            batch,
            guard,
            cache,
            ready: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            load_lock: Mutex::new(()),
        })
    }

    fn note(&self, model: &str, msg: String) {
        eprintln!("[serve] {model}: {msg}");
        if let Some(m) = self.models.write().unwrap_or_else(|e| e.into_inner()).get_mut(model) {
            m.events.push(msg);
            if m.events.len() > 20 {
                m.events.remove(0);
            }
        }
    }

    /// Load, verify, warm up and start a batcher for `name/version` (blocking). A
    /// version that fails stays `failed` with the reason; the live one keeps serving.
    pub fn load(&self, name: &str, version: &str) -> Result<(), String> {
        let _serial = self.load_lock.lock().unwrap_or_else(|e| e.into_inner());
        let (dir, manifest) = {
            let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
            let m = models.get_mut(name).ok_or_else(|| format!("no model {name:?}"))?;
            let v = m.versions.get_mut(version).ok_or_else(|| format!("model {name:?} has no version {version:?}"))?;
            if v.state == VersionState::Ready {
                return Ok(());
            }
            // Re-read the manifest: it may have been fixed since.
            let manifest = match Manifest::read(&v.dir) {
                Ok(m) => m,
                Err(e) => {
                    v.state = VersionState::Failed(e.to_string());
                    return Err(e.to_string());
                }
            };
            v.state = VersionState::Loading;
            (v.dir.clone(), manifest)
        };
        let t0 = Instant::now();
        let result = (|| -> tessera::Result<(usize, Arc<Batcher>)> {
            manifest.verify(&dir)?;
            let (dev, generation) = self.devices.current();
            let runner = Runner::load(&dir, &manifest, &dev)?;
            // Warm up: checks it runs, and compiles the kernels of every batch size.
            let b = &self.batch;
            let runs = runner.warm_up(b, !dev.is_cpu())?;
            let (d2, m2) = (dir.clone(), manifest.clone());
            let loader: crate::batcher::Loader = Box::new(move |dev| Runner::load(&d2, &m2, dev));
            let labels = (name.to_string(), version.to_string());
            Ok((runs, Batcher::start(runner, loader, self.devices.clone(), generation, self.batch, labels)))
        })();
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        let m = models.get_mut(name).ok_or_else(|| format!("no model {name:?}"))?;
        let v = m.versions.get_mut(version).ok_or_else(|| format!("no version {version:?}"))?;
        match result {
            Ok((runs, b)) => {
                v.state = VersionState::Ready;
                v.manifest = Some(manifest);
                v.batcher = Some(b);
                let secs = t0.elapsed().as_secs_f64();
                let msg = format!("version {version} loaded and warm in {secs:.1} s (warm-up runs: {runs})");
                drop(models);
                self.note(name, msg);
                Ok(())
            }
            Err(e) => {
                let reason = e.to_string();
                v.state = VersionState::Failed(reason.clone());
                drop(models);
                self.note(name, format!("version {version} failed to load: {reason}"));
                Err(reason)
            }
        }
    }

    /// Unload a version that is neither live nor the canary.
    pub fn unload(&self, name: &str, version: &str) -> Result<(), (u16, String)> {
        let b = {
            let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
            let m = models.get_mut(name).ok_or((404, format!("no model {name:?}")))?;
            if m.live.as_deref() == Some(version) || m.canary.as_ref().is_some_and(|c| c.version == version) {
                return Err((
                    409,
                    format!("version {version} is serving (live or canary): promote or roll back first"),
                ));
            }
            let v = m.versions.get_mut(version).ok_or((404, format!("model {name:?} has no version {version:?}")))?;
            v.state = VersionState::Unloaded;
            v.batcher.take()
        };
        if let Some(b) = b {
            // Requests already queued are answered before the worker exits.
            std::thread::spawn(move || b.shutdown());
        }
        self.note(name, format!("version {version} unloaded"));
        Ok(())
    }

    /// Make `version` live, or a canary taking `fraction` of the traffic.
    pub fn promote(&self, name: &str, version: &str, fraction: Option<f64>) -> Result<String, (u16, String)> {
        let msg = {
            let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
            let m = models.get_mut(name).ok_or((404, format!("no model {name:?}")))?;
            let v = m.versions.get(version).ok_or((404, format!("model {name:?} has no version {version:?}")))?;
            if v.state != VersionState::Ready {
                return Err((409, format!("version {version} is {}: load it first", v.state.name())));
            }
            match fraction {
                Some(f) if f > 0.0 && f < 1.0 => {
                    if m.live.as_deref() == Some(version) {
                        return Err((409, format!("version {version} is already live")));
                    }
                    if m.live.is_none() {
                        return Err((409, "a canary needs a live version to compare with".into()));
                    }
                    m.canary = Some(Canary {
                        version: version.to_string(),
                        fraction: f,
                        counter: 0,
                        requests: VecDeque::new(),
                        live_latency: VecDeque::new(),
                        comparisons: VecDeque::new(),
                    });
                    format!("version {version} is a canary taking {:.0}% of requests", f * 100.0)
                }
                Some(f) if !(0.0..=1.0).contains(&f) || f == 0.0 => {
                    return Err((400, format!("canary_fraction {f} must lie in (0, 1]")));
                }
                _ => {
                    if let Some(old) = m.live.replace(version.to_string()) {
                        if old != version {
                            m.history.push(old);
                        }
                    }
                    if m.canary.as_ref().is_some_and(|c| c.version == version) {
                        m.canary = None;
                    }
                    format!("version {version} is live")
                }
            }
        };
        self.note(name, msg.clone());
        Ok(msg)
    }

    /// Cancel the canary, or return the live version to the previous one.
    pub fn rollback(&self, name: &str, reason: &str) -> Result<String, (u16, String)> {
        let msg = {
            let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
            let m = models.get_mut(name).ok_or((404, format!("no model {name:?}")))?;
            if let Some(c) = m.canary.take() {
                format!("canary {} rolled back ({reason})", c.version)
            } else {
                let prev = loop {
                    match m.history.pop() {
                        Some(p) if m.versions.get(&p).is_some_and(|v| v.state == VersionState::Ready) => break p,
                        Some(_) => continue,
                        None => {
                            return Err((409, "nothing to roll back to: no canary and no earlier ready version".into()))
                        }
                    }
                };
                let from = m.live.replace(prev.clone()).unwrap_or_default();
                format!("live version rolled back from {from} to {prev} ({reason})")
            }
        };
        self.note(name, msg.clone());
        Ok(msg)
    }

    /// Pick the version for one request of `name` (live, or the canary's share).
    pub fn route(&self, name: &str) -> Result<Route, RouteError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        let m = models.get_mut(name).ok_or(RouteError::UnknownModel)?;
        let live = m.live.clone().ok_or(RouteError::NotReady)?;
        let pick = |m: &Model, v: &str| -> Option<(Arc<Batcher>, String)> {
            let ver = m.versions.get(v)?;
            let b = ver.batcher.clone()?;
            let dt = ver.manifest.as_ref().map(|x| x.dtype.name().to_string()).unwrap_or_default();
            Some((b, dt))
        };
        let shadow_fraction = self.guard.shadow_fraction;
        if let Some(c) = m.canary.as_mut() {
            c.counter += 1;
            // Deterministic spread: request k goes to the canary when floor(k f) grows.
            let take = ((c.counter as f64) * c.fraction).floor() > (((c.counter - 1) as f64) * c.fraction).floor();
            if take {
                let cv = c.version.clone();
                let shadow = ((c.counter as f64) * shadow_fraction).floor()
                    > (((c.counter - 1) as f64) * shadow_fraction).floor();
                if let (Some((b, dt)), Some((lb, _))) = (pick(m, &cv), pick(m, &live)) {
                    return Ok(Route {
                        version: cv,
                        batcher: b,
                        shadow: shadow.then(|| (live.clone(), lb)),
                        canary: true,
                        dtype: dt,
                    });
                }
            }
        }
        let (b, dt) = pick(m, &live).ok_or(RouteError::NotReady)?;
        Ok(Route { version: live, batcher: b, shadow: None, canary: false, dtype: dt })
    }

    /// Record a canary request's outcome (and, when the live version ran too, how the
    /// outputs agreed); rolls the canary back when the window crosses a threshold.
    pub fn canary_report(
        &self,
        name: &str,
        version: &str,
        ok: bool,
        latency: Duration,
        live_latency: Option<Duration>,
        agreement: Option<f64>,
    ) {
        let verdict = {
            let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
            let Some(m) = models.get_mut(name) else { return };
            let embeds = m.embeds;
            let Some(c) = m.canary.as_mut().filter(|c| c.version == version) else { return };
            let g = self.guard;
            push(&mut c.requests, (ok, latency), g.window);
            if let Some(l) = live_latency {
                push(&mut c.live_latency, l, g.window);
            }
            if let Some(a) = agreement {
                push(&mut c.comparisons, a, g.window);
            }
            judge(c, &g, embeds)
        };
        if let Some(reason) = verdict {
            let _ = self.rollback(name, &format!("automatic: {reason}"));
            metrics::counter!("tessera_canary_rollbacks_total", "model" => name.to_string(), "version" => version.to_string()).increment(1);
        }
    }

    /// The result cache's key: model, version, dtype and the input.
    pub fn cache_key(name: &str, version: &str, dtype: &str, input: &Input) -> [u8; 32] {
        let mut h = Sha256::new();
        for part in [name.as_bytes(), version.as_bytes(), dtype.as_bytes()] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(input.key_bytes());
        h.finalize().into()
    }

    /// `GET /v1/models`.
    pub fn describe(&self) -> serde_json::Value {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        let list: Vec<serde_json::Value> = models
            .iter()
            .map(|(name, m)| {
                let versions: Vec<serde_json::Value> = m
                    .versions
                    .iter()
                    .map(|(v, ver)| {
                        let mut o = json!({
                            "version": v,
                            "state": ver.state.name(),
                            "live": m.live.as_deref() == Some(v.as_str()),
                            "canary": m.canary.as_ref().is_some_and(|c| &c.version == v),
                            "queue_depth": ver.batcher.as_ref().map_or(0, |b| b.depth()),
                        });
                        if let Some(mf) = &ver.manifest {
                            o["dtype"] = mf.dtype.name().into();
                            o["kind"] = mf.kind.name().into();
                        }
                        if let VersionState::Failed(r) = &ver.state {
                            o["error"] = r.clone().into();
                        }
                        o
                    })
                    .collect();
                json!({
                    "id": name,
                    "object": "model",
                    "owned_by": "tessera",
                    "task": if m.embeds { "embeddings" } else { "classification" },
                    "live": m.live,
                    "canary": m.canary.as_ref().map(|c| json!({
                        "version": c.version,
                        "fraction": c.fraction,
                        "requests": c.requests.len(),
                        "comparisons": c.comparisons.len(),
                        "mean_agreement": mean(&c.comparisons),
                    })),
                    "versions": versions,
                    "events": m.events,
                })
            })
            .collect();
        json!({ "object": "list", "data": list })
    }

    /// Batchers of every loaded version (for shutdown).
    pub fn batchers(&self) -> Vec<Arc<Batcher>> {
        let models = self.models.read().unwrap_or_else(|e| e.into_inner());
        models.values().flat_map(|m| m.versions.values().filter_map(|v| v.batcher.clone())).collect()
    }
}

fn push<T>(q: &mut VecDeque<T>, v: T, cap: usize) {
    q.push_back(v);
    while q.len() > cap {
        q.pop_front();
    }
}

fn mean(q: &VecDeque<f64>) -> Option<f64> {
    (!q.is_empty()).then(|| q.iter().sum::<f64>() / q.len() as f64)
}

fn p99(q: &VecDeque<Duration>) -> Option<Duration> {
    if q.is_empty() {
        return None;
    }
    let mut v: Vec<Duration> = q.iter().copied().collect();
    v.sort();
    Some(v[((v.len() as f64) * 0.99).ceil() as usize - 1])
}

/// The guard's verdict on a canary's window: a reason to roll back, or none.
fn judge(c: &Canary, g: &GuardConfig, embeds: bool) -> Option<String> {
    if c.comparisons.len() >= g.min_samples {
        let a = mean(&c.comparisons).unwrap_or(1.0);
        let (floor, what) = if embeds {
            (g.min_cosine, "mean cosine to the live version")
        } else {
            (g.min_agreement, "top-1 agreement with the live version")
        };
        if a < floor {
            return Some(format!("{what} {a:.4} < {floor} over {} comparisons", c.comparisons.len()));
        }
    }
    if c.requests.len() >= g.min_samples {
        let errors = c.requests.iter().filter(|r| !r.0).count() as f64 / c.requests.len() as f64;
        if errors > g.max_error_rate {
            return Some(format!(
                "error rate {:.1}% > {:.1}% over {} requests",
                errors * 100.0,
                g.max_error_rate * 100.0,
                c.requests.len()
            ));
        }
        let lat: VecDeque<Duration> = c.requests.iter().filter(|r| r.0).map(|r| r.1).collect();
        if let (Some(cp), Some(lp)) = (p99(&lat), p99(&c.live_latency)) {
            if c.live_latency.len() >= g.min_samples && cp.as_secs_f64() > g.max_p99_ratio * lp.as_secs_f64() + 0.05 {
                return Some(format!(
                    "p99 latency {:.0} ms > {}x the live version's {:.0} ms",
                    cp.as_secs_f64() * 1e3,
                    g.max_p99_ratio,
                    lp.as_secs_f64() * 1e3
                ));
            }
        }
    }
    None
}

/// How two outputs agree: cosine for embeddings, 1 or 0 for the top class, the overlap
/// of two top-k lists.
pub fn agreement(a: &Output, b: &Output) -> f64 {
    match (a, b) {
        (Output::Embedding(x, ..), Output::Embedding(y, ..)) => {
            let dot: f64 = x.iter().zip(y).map(|(p, q)| *p as f64 * *q as f64).sum();
            let nx: f64 = x.iter().map(|p| (*p as f64).powi(2)).sum::<f64>().sqrt();
            let ny: f64 = y.iter().map(|p| (*p as f64).powi(2)).sum::<f64>().sqrt();
            dot / (nx * ny).max(1e-12)
        }
        (Output::Classes(x), Output::Classes(y)) => (argmax(x) == argmax(y)) as u8 as f64,
        // The share of one top-k list in the other.
        (Output::Items { items: x, .. }, Output::Items { items: y, .. }) => {
            x.iter().filter(|i| y.contains(i)).count() as f64 / x.len().max(1) as f64
        }
        _ => 0.0,
    }
}

pub fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) }).0
}
