//! The test harness: one test body runs on the CPU reference (the oracle) and on every
//! GPU adapter present, each also with its fallback paths forced, and the results are
//! compared at per-dtype tolerances.
#![allow(dead_code)]

use std::sync::OnceLock;
use tessera::{DType, Device, DeviceOptions, Tensor};

/// Every GPU device under test: each adapter, plus a forced-fallback twin where the
/// adapter has native f16 or subgroups. The twin also runs the other matmul kernel than
/// the adapter's own choice (workgroup-tiled on CPU adapters, direct on GPUs), so both
/// kernels are checked on every machine. `TESSERA_TEST_ADAPTERS=vulkan` (a substring of
/// name or backend) narrows the list.
pub fn gpu_devices() -> &'static [Device] {
    static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let filter = std::env::var("TESSERA_TEST_ADAPTERS").ok().map(|s| s.to_lowercase());
        let mut out = Vec::new();
        for a in Device::list() {
            let label = format!("{} {}", a.name, a.backend).to_lowercase();
            if filter.as_ref().is_some_and(|f| !f.split(',').any(|p| label.contains(p.trim()))) {
                continue;
            }
            let cpu_adapter = a.device_type == "Cpu";
            let open = |force_fallback: bool| {
                Device::with_options(DeviceOptions {
                    adapter_index: Some(a.index),
                    force_fallback,
                    tiled_matmul: force_fallback.then_some(cpu_adapter),
                    ..Default::default()
                })
            };
            match open(false) {
                Ok(d) => out.push(d),
                Err(e) => eprintln!("skipping adapter {} ({}): {e}", a.name, a.backend),
            }
            if a.capabilities.shader_f16 || a.capabilities.subgroups {
                if let Ok(d) = open(true) {
                    out.push(d);
                }
            }
        }
        if out.is_empty() && std::env::var("TESSERA_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            panic!("TESSERA_REQUIRE_GPU=1 but no adapter could be opened");
        }
        out
    })
}

/// A readable name for a device under test.
pub fn label(d: &Device) -> String {
    format!(
        "{} [{}{}{}]",
        d.info().name,
        d.info().backend,
        if d.info().forced_fallback { ", fallback" } else { "" },
        if d.direct_matmul() { ", direct matmul" } else { ", tiled matmul" }
    )
}

/// Tolerance for comparing a device's values with the reference.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub atol: f64,
    pub rtol: f64,
}

impl Tol {
    /// The per-dtype default: f32 1e-5/1e-5, f16 1e-3/1e-3, exact for integers and bool.
    pub fn for_dtype(dt: DType) -> Tol {
        match dt {
            DType::F32 => Tol { atol: 1e-5, rtol: 1e-5 },
            DType::F16 => Tol { atol: 1e-3, rtol: 2e-3 },
            _ => Tol { atol: 0.0, rtol: 0.0 },
        }
    }

    /// Scale the absolute tolerance by a reduction length.
    pub fn scaled(self, len: usize) -> Tol {
        Tol { atol: self.atol * (len.max(1) as f64).sqrt().max(1.0), rtol: self.rtol }
    }
}

/// Compare `got` with `want` elementwise; NaN must match NaN, infinities must match.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: Tol) {
    assert_eq!(got.len(), want.len(), "{what}: length {} vs reference {}", got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}: element {i} is {g}, reference NaN");
            continue;
        }
        assert!(!g.is_nan(), "{what}: element {i} is NaN, reference {w}");
        if w.is_infinite() {
            assert_eq!(g, w, "{what}: element {i} is {g}, reference {w}");
            continue;
        }
        let err = (g - w).abs();
        assert!(
            err <= tol.atol + tol.rtol * w.abs(),
            "{what}: element {i} is {g}, reference {w} (error {err:e}, atol {:e}, rtol {:e})",
            tol.atol,
            tol.rtol
        );
    }
}

/// Build the graph with `build` on the CPU reference and on every GPU device; compare
/// every output (shape, dtype and values). `tol` overrides the per-dtype default.
pub fn check_with(name: &str, tol: Option<Tol>, build: impl Fn(&Device) -> Vec<Tensor>) {
    let cpu = Device::cpu();
    let want_t = build(&cpu);
    let want = tessera::read_all_blocking(&want_t).unwrap_or_else(|e| panic!("{name}: reference failed: {e}"));
    for dev in gpu_devices() {
        let got_t = build(dev);
        let got = tessera::read_all_blocking(&got_t).unwrap_or_else(|e| panic!("{name} on {}: {e}", label(dev)));
        for (k, ((g, w), (gt, wt))) in got.iter().zip(&want).zip(got_t.iter().zip(&want_t)).enumerate() {
            assert_eq!(gt.dims(), wt.dims(), "{name} output {k} on {}: shape", label(dev));
            assert_eq!(gt.dtype(), wt.dtype(), "{name} output {k} on {}: dtype", label(dev));
            let t = tol.unwrap_or_else(|| Tol::for_dtype(wt.dtype()));
            assert_close(&format!("{name} output {k} on {}", label(dev)), g, w, t);
        }
    }
}

/// `check_with` at the default tolerances.
pub fn check(name: &str, build: impl Fn(&Device) -> Vec<Tensor>) {
    check_with(name, None, build)
}

/// Deterministic test data: `n` values in `[lo, hi)`.
pub fn data(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f64) / (1u64 << 24) as f64;
            (lo + (hi - lo) * u) as f32
        })
        .collect()
}

/// A random f32 tensor of `shape` with values in `[lo, hi)`.
pub fn rand_t(shape: &[usize], seed: u64, lo: f64, hi: f64, dev: &Device) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_slice(&data(n, seed, lo, hi), shape, dev)
}

/// The MiniLM directory (`TESSERA_MINILM_DIR`, or `minilm` under `TESSERA_DATA` or
/// `~/.cache/tessera`), or None (a skip) when the model was not fetched; with
/// `TESSERA_REQUIRE_MODEL=1` a missing model fails instead.
pub fn model_dir() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("TESSERA_MINILM_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| {
        let base = std::env::var_os("TESSERA_DATA").map(std::path::PathBuf::from).unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tessera")
        });
        base.join("minilm")
    });
    if dir.join("model.safetensors").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("TESSERA_REQUIRE_MODEL").map_or(true, |v| v != "1"),
        "TESSERA_REQUIRE_MODEL=1 but {} has no model (run scripts/fetch_minilm.sh)",
        dir.display()
    );
    eprintln!("skipping: no MiniLM in {} (run scripts/fetch_minilm.sh)", dir.display());
    None
}
