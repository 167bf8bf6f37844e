//! The matmul autotuner: which kernel (direct or workgroup-tiled) and which register
//! tile (rows x columns per invocation) run fastest on this adapter, measured on two
//! probe products and cached on disk, keyed by adapter, backend, driver and crate
//! version, so the second run starts tuned.
//!
//! `Device::new()` applies a cached result when there is one (`TESSERA_AUTOTUNE=0`
//! ignores the cache); [`ensure`] tunes first when there is none. The cache is
//! `$TESSERA_CACHE_DIR/autotune.json`, else `$XDG_CACHE_HOME/tessera/...`, else
//! `~/.cache/tessera/...`; a missing or corrupt file is treated as empty.

use crate::device::Device;
#[cfg(not(target_arch = "wasm32"))]
use crate::device::DeviceOptions;
#[cfg(not(target_arch = "wasm32"))]
use crate::{Error, Result, Tensor};
use std::path::{Path, PathBuf};
#[cfg(not(target_arch = "wasm32"))]
use std::time::Instant;

/// A matmul configuration: kernel family and the largest register tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulConfig {
    /// The direct (barrier-free) kernel rather than the workgroup-tiled one.
    pub direct: bool,
    /// Most output rows per invocation (direct: rows per workgroup).
    pub tm: u8,
    /// Most output columns per invocation.
    pub tn: u8,
    /// Tiled kernel only: vectorised loads and 4x4 register blocks
    /// (`matmul_vec4.wgsl`) where the operands are 4-aligned. (The direct kernel always
    /// vectorises aligned operands.)
    pub vec4: bool,
}

impl MatmulConfig {
    /// The untuned default for an adapter family.
    pub fn default_for(direct: bool) -> MatmulConfig {
        if direct {
            MatmulConfig { direct, tm: 8, tn: 4, vec4: false }
        } else {
            MatmulConfig { direct, tm: 4, tn: 4, vec4: true }
        }
    }

    /// The kernel family as the cache names it: `direct`, `tiled` or `tiled-vec4`.
    pub fn kernel(&self) -> &'static str {
        match (self.direct, self.vec4) {
            (true, _) => "direct",
            (false, false) => "tiled",
            (false, true) => "tiled-vec4",
        }
    }

    /// `direct 8x4`, `tiled 4x4`, `tiled-vec4 4x4`.
    pub fn name(&self) -> String {
        format!("{} {}x{}", self.kernel(), self.tm, self.tn)
    }
}

/// The configurations tried.
pub const CANDIDATES: [MatmulConfig; 8] = [
    MatmulConfig { direct: true, tm: 8, tn: 4, vec4: false },
    MatmulConfig { direct: true, tm: 4, tn: 4, vec4: false },
    MatmulConfig { direct: true, tm: 8, tn: 2, vec4: false },
    MatmulConfig { direct: false, tm: 8, tn: 8, vec4: true },
    MatmulConfig { direct: false, tm: 4, tn: 4, vec4: true },
    MatmulConfig { direct: false, tm: 4, tn: 4, vec4: false },
    MatmulConfig { direct: false, tm: 2, tn: 4, vec4: false },
    MatmulConfig { direct: false, tm: 2, tn: 2, vec4: false },
];

/// What [`ensure`] found or measured.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// The cache key: adapter, backend, driver, crate version, fallback mode.
    pub key: String,
    /// The fastest configuration.
    pub best: MatmulConfig,
    /// Each candidate's summed median over the probes, in ms (empty when cached).
    pub timings: Vec<(MatmulConfig, f64)>,
    /// Attention: the fused kernel measured faster than the composition.
    pub fused_attention: bool,
    /// Attention probe medians in ms, (composed, fused) (`None` when cached).
    pub attention_ms: Option<(f64, f64)>,
    /// Convolution: reading the windows in place (implicit GEMM) measured faster than
    /// materialising the columns.
    pub implicit_gemm: bool,
    /// Convolution probe medians in ms, (materialised, implicit) (`None` when cached).
    pub conv_ms: Option<(f64, f64)>,
    /// Read from the cache rather than measured now.
    pub cached: bool,
    /// Wall time of this call, in ms.
    pub elapsed_ms: f64,
}

/// Where the cache lives (see the module docs).
pub fn cache_path() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let dir = var("TESSERA_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("tessera")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("tessera")))?;
    Some(dir.join("autotune.json"))
}

/// The cache key of an opened device.
pub fn key(device: &Device) -> String {
    key_of(device.info())
}

/// The cache key of a device with this description.
pub(crate) fn key_of(i: &crate::device::DeviceInfo) -> String {
    format!(
        "{} | {} | {} | tessera {} | tune {TUNE_VERSION} | fallback {}",
        i.name,
        i.backend,
        i.driver,
        env!("CARGO_PKG_VERSION"),
        i.forced_fallback
    )
}

/// Bumped when the candidates or probes change, so older results are measured again.
const TUNE_VERSION: u32 = 6;

fn read_cache(path: &Path) -> serde_json::Map<String, serde_json::Value> {
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.as_object().cloned())
        .unwrap_or_default()
}

/// The cached configuration for `key` in the cache file at `path`, if any.
pub fn lookup(path: &Path, key: &str) -> Option<MatmulConfig> {
    let e = read_cache(path).get(key)?.clone();
    let (direct, vec4) = match e.get("kernel")?.as_str()? {
        "direct" => (true, false),
        "tiled" => (false, false),
        "tiled-vec4" => (false, true),
        _ => return None,
    };
    let tm = e.get("tm")?.as_u64()?;
    let tn = e.get("tn")?.as_u64()?;
    let c = MatmulConfig { direct, tm: tm as u8, tn: tn as u8, vec4 };
    // Only values a kernel supports (a hand-edited file cannot make a bad kernel).
    CANDIDATES.contains(&c).then_some(c)
}

/// A tuned on/off switch of `key` in the cache at `path`: `field` is `attention`
/// (`fused` or `composed`) or `conv` (`implicit` or `materialised`).
pub fn lookup_switch(path: &Path, key: &str, field: &str) -> Option<bool> {
    match (field, read_cache(path).get(key)?.get(field)?.as_str()?) {
        ("attention", "fused") | ("conv", "implicit") => Some(true),
        ("attention", "composed") | ("conv", "materialised") => Some(false),
        _ => None,
    }
}

/// Tune the adapter `options` select, unless the cache at `path` (default
/// [`cache_path`]) already holds its result; store what was measured.
#[cfg(not(target_arch = "wasm32"))]
pub fn ensure(options: &DeviceOptions, path: Option<&Path>) -> Result<Tuning> {
    let t0 = Instant::now();
    let path = path.map(Path::to_path_buf).or_else(cache_path);
    let probe = Device::with_options(DeviceOptions { matmul: None, autotune_cache: None, ..options.clone() })?;
    if probe.is_cpu() {
        return Err(Error::Unsupported(format!("autotune: {probe} is a host backend, with no kernels to tune")));
    }
    let key = key(&probe);
    drop(probe);
    if let Some(best) = path.as_deref().and_then(|p| lookup(p, &key)) {
        return Ok(Tuning {
            fused_attention: path.as_deref().and_then(|p| lookup_switch(p, &key, "attention")) == Some(true),
            attention_ms: None,
            implicit_gemm: path.as_deref().and_then(|p| lookup_switch(p, &key, "conv")).unwrap_or(!best.direct),
            conv_ms: None,
            key,
            best,
            timings: Vec::new(),
            cached: true,
            elapsed_ms: t0.elapsed().as_secs_f64() * 1e3,
        });
    }
    let timings = candidates_ms(options)?;
    let best = timings.iter().min_by(|a, b| a.1.total_cmp(&b.1)).map(|t| t.0).unwrap_or(CANDIDATES[0]);
    let with = |implicit_gemm: bool| {
        let o = DeviceOptions {
            matmul: Some(best),
            autotune_cache: None,
            implicit_gemm: Some(implicit_gemm),
            ..options.clone()
        };
        Device::with_options(o)
    };
    let materialised = with(false)?;
    let attention_ms = attention_probe_ms(&materialised)?;
    let fused_attention = attention_ms.1 < attention_ms.0;
    let conv_ms = conv_probe_ms(&materialised, &with(true)?)?;
    let implicit_gemm = conv_ms.1 < conv_ms.0;
    if let Some(p) = &path {
        let mut cache = read_cache(p);
        cache.insert(
            key.clone(),
            serde_json::json!({
                "kernel": best.kernel(),
                "tm": best.tm,
                "tn": best.tn,
                "attention": if fused_attention { "fused" } else { "composed" },
                "attention_ms": { "composed": attention_ms.0, "fused": attention_ms.1 },
                "conv": if implicit_gemm { "implicit" } else { "materialised" },
                "conv_ms": { "materialised": conv_ms.0, "implicit": conv_ms.1 },
                "probe_ms": timings.iter().map(|(c, ms)| (c.name(), serde_json::json!(ms))).collect::<serde_json::Map<_, _>>(),
            }),
        );
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Io { path: dir.display().to_string(), message: e.to_string() })?;
        }
        let bytes = serde_json::to_vec_pretty(&serde_json::Value::Object(cache)).unwrap_or_default();
        crate::io::write_atomic(p, &bytes)?;
    }
    Ok(Tuning {
        key,
        best,
        timings,
        fused_attention,
        attention_ms: Some(attention_ms),
        implicit_gemm,
        conv_ms: Some(conv_ms),
        cached: false,
        elapsed_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// ms of one run of `work`, realised and waited for.
#[cfg(not(target_arch = "wasm32"))]
fn run_ms((d, work): Work) -> Result<f64> {
    let t0 = Instant::now();
    work()?.realize_blocking()?;
    d.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() * 1e3)
}

/// The middle value of some timings.
#[cfg(not(target_arch = "wasm32"))]
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|x, y| x.total_cmp(y));
    v[v.len() / 2]
}

/// A workload and the device it runs on.
#[cfg(not(target_arch = "wasm32"))]
type Work<'a> = (&'a Device, &'a dyn Fn() -> Result<Tensor>);

/// Each of `n` workloads' median ms (`time(i)` runs workload `i` once): one warm-up
/// round, then `rounds` rounds that each time every workload in turn. A slow burst of a
/// shared host then falls on several of them, where timing one and then the next handed
/// the burst to whichever ran during it (lavapipe, one run: fused attention 4.8 against
/// 4.2 ms composed, where other runs measure 3.4 against 5.7).
#[cfg(not(target_arch = "wasm32"))]
fn interleaved_medians_ms(n: usize, rounds: usize, time: &dyn Fn(usize) -> Result<f64>) -> Result<Vec<f64>> {
    let mut times = vec![Vec::new(); n];
    for round in 0..=rounds {
        for (i, t) in times.iter_mut().enumerate() {
            let ms = time(i)?;
            if round > 0 {
                t.push(ms);
            }
        }
    }
    Ok(times.into_iter().map(median).collect())
}

/// Median ms of two workloads timed alternately, seven rounds after a warm-up.
#[cfg(not(target_arch = "wasm32"))]
fn alternating_median_ms(a: Work, b: Work) -> Result<(f64, f64)> {
    let m = interleaved_medians_ms(2, 7, &|i| run_ms(if i == 0 { a } else { b }))?;
    Ok((m[0], m[1]))
}

/// Median ms of attention (12 heads of 64, sequence 512 on GPUs, 128 on CPU adapters)
/// composed and fused: `(composed, fused)`.
#[cfg(not(target_arch = "wasm32"))]
fn attention_probe_ms(d: &Device) -> Result<(f64, f64)> {
    let t = if d.info().device_type == "Cpu" { 128 } else { 512 };
    let qkv: Vec<Tensor> = (0..3).map(|i| Tensor::rand([1, 12, t, 64], 3 + i, d)).collect();
    crate::read_all_blocking(&qkv)?;
    let sdpa = |fused: bool| {
        let here = std::panic::Location::caller();
        crate::ops::nn::sdpa_impl(&qkv[0], &qkv[1], &qkv[2], None, false, fused, here)
    };
    alternating_median_ms((d, &|| sdpa(false)), (d, &|| sdpa(true)))
}

/// Median ms of a 3x3 convolution (8x64x56x56 -> 64 on GPUs, 2x32x28x28 -> 32 on CPU
/// adapters) on two devices (materialised columns, implicit GEMM).
#[cfg(not(target_arch = "wasm32"))]
fn conv_probe_ms(materialised: &Device, implicit: &Device) -> Result<(f64, f64)> {
    let (n, c, hw) = if materialised.info().device_type == "Cpu" { (2, 32, 28) } else { (8, 64, 56) };
    let inputs = |d: &Device| -> Result<(Tensor, Tensor)> {
        let (x, w) = (Tensor::rand([n, c, hw, hw], 5, d), Tensor::rand([c, c, 3, 3], 6, d));
        crate::read_all_blocking(&[x.clone(), w.clone()])?;
        Ok((x, w))
    };
    let ((xm, wm), (xi, wi)) = (inputs(materialised)?, inputs(implicit)?);
    let conv = |x: &Tensor, w: &Tensor| Ok(x.conv2d(w, None, crate::ops::nn::Conv2dOptions::new(1, 1)));
    alternating_median_ms((materialised, &|| conv(&xm, &wm)), (implicit, &|| conv(&xi, &wi)))
}

/// Each candidate's median ms over the probe products (a square and a BERT-like
/// `x @ w.t()`, sized so each takes long enough to time: a GPU runs 512^3 in
/// launch-overhead time). After a warm-up, five rounds each time every candidate in
/// turn, so a slow burst of a shared host falls on several candidates instead of
/// deciding for one (lavapipe, candidates timed one after the other: direct 8x4 took
/// 16.7 ms in one tuning and 29.0 in the next).
#[cfg(not(target_arch = "wasm32"))]
fn candidates_ms(options: &DeviceOptions) -> Result<Vec<(MatmulConfig, f64)>> {
    let mut probes = Vec::new();
    for c in CANDIDATES {
        let d = Device::with_options(DeviceOptions { matmul: Some(c), autotune_cache: None, ..options.clone() })?;
        let shapes = if d.info().device_type == "Cpu" {
            [(512usize, 512usize, 512usize, false), (128, 1536, 384, true)]
        } else {
            [(2048, 2048, 2048, false), (2048, 4096, 1024, true)]
        };
        let mut operands = Vec::new();
        for (m, n, k, linear) in shapes {
            let a = Tensor::rand([m, k], 1, &d);
            let b = if linear { Tensor::rand([n, k], 2, &d) } else { Tensor::rand([k, n], 2, &d) };
            crate::read_all_blocking(&[a.clone(), b.clone()])?;
            operands.push((a, b, linear));
        }
        probes.push((c, d, operands));
    }
    let time = |(_, d, operands): &(MatmulConfig, Device, Vec<(Tensor, Tensor, bool)>)| -> Result<f64> {
        operands
            .iter()
            .map(|(a, b, linear)| run_ms((d, &|| Ok(if *linear { a.matmul(&b.t()) } else { a.matmul(b) }))))
            .sum()
    };
    let medians = interleaved_medians_ms(probes.len(), 5, &|i| time(&probes[i]))?;
    Ok(probes.iter().zip(medians).map(|(p, ms)| (p.0, ms)).collect())
}
