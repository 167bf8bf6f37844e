//! The test harness: one test body runs on the f64 reference (the oracle), on the CPU
//! backend, and on every GPU adapter present, each also with its fallback paths forced,
//! and the results are compared at per-dtype tolerances.
//!
//! A run that cannot compare on a GPU fails: with no adapter, `gpu_devices()` panics
//! with what to install, unless `TESSERA_ALLOW_NO_GPU=1`, which prints loudly what is
//! skipped. A fallback twin that fails to open fails too. Every comparison is counted
//! per device in `$TESSERA_TEST_LOG` (when set), which `scripts/test.sh` sums up.
#![allow(dead_code)]

use std::sync::OnceLock;
use tessera::{DType, Device, DeviceOptions, Tensor};

/// Whether this host's CPU has AVX-512, which lavapipe running on it uses (the engine's
/// `ShaderCaps::no_avx512` is its negation on CPU adapters with wide loads).
pub fn host_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether a run without any GPU adapter was explicitly allowed.
pub fn no_gpu_allowed() -> bool {
    std::env::var("TESSERA_ALLOW_NO_GPU").is_ok_and(|v| v == "1")
}

/// Every GPU device under test: each adapter, plus a forced-fallback twin where the
/// adapter has native f16 or subgroups. The twin also runs the other matmul kernel than
/// the adapter's own choice (workgroup-tiled on CPU adapters, direct on GPUs), so both
/// kernels are checked on every machine. `TESSERA_TEST_ADAPTERS=vulkan` (a substring of
/// name or backend) narrows the list. Panics when nothing can be opened, unless
/// `TESSERA_ALLOW_NO_GPU=1`.
pub fn gpu_devices() -> &'static [Device] {
    static DEVICES: OnceLock<Vec<Device>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let filter = std::env::var("TESSERA_TEST_ADAPTERS").ok().map(|s| s.to_lowercase());
        let mut out = Vec::new();
        let mut failures = Vec::new();
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
                Err(e) => failures.push(format!("adapter {} ({}): {e}", a.name, a.backend)),
            }
            if a.capabilities.shader_f16 || a.capabilities.subgroups {
                match open(true) {
                    Ok(d) => out.push(d),
                    Err(e) => failures.push(format!("fallback twin of {} ({}): {e}", a.name, a.backend)),
                }
            }
        }
        assert!(failures.is_empty(), "devices under test failed to open:\n  {}", failures.join("\n  "));
        if out.is_empty() {
            let help = "no GPU adapter to test on. Install Mesa's lavapipe (apt-get install mesa-vulkan-drivers \
                        libvulkan1; scripts/setup.sh does it), or set TESSERA_ALLOW_NO_GPU=1 to run only the CPU \
                        backend against the reference";
            assert!(no_gpu_allowed(), "{help}");
            eprintln!(
                "\n*** TESSERA_ALLOW_NO_GPU=1: NO GPU ADAPTER. Every GPU comparison in this test binary is SKIPPED; \
                 only the CPU backend is compared with the reference. ***\n"
            );
        }
        out
    })
}

/// A device of its own on the first GPU adapter, so its counters see only the calling
/// test. Without an adapter the test fails with what to install, unless
/// `TESSERA_ALLOW_NO_GPU=1` (then `None`, said loudly); a device that fails to open
/// always fails.
pub fn private_gpu(opts: DeviceOptions) -> Option<Device> {
    let Some(first) = Device::list().into_iter().next() else {
        assert!(
            no_gpu_allowed(),
            "no GPU adapter: install Mesa's lavapipe (scripts/setup.sh), or set TESSERA_ALLOW_NO_GPU=1 to skip GPU-only tests"
        );
        eprintln!(
            "\n*** TESSERA_ALLOW_NO_GPU=1: test {:?} needs a GPU and is SKIPPED ***\n",
            std::thread::current().name().unwrap_or("?")
        );
        return None;
    };
    let opts = DeviceOptions { adapter_index: Some(first.index), ..opts };
    Some(Device::with_options(opts.clone()).unwrap_or_else(|e| panic!("{} refused {opts:?}: {e}", first.name)))
}

/// The CPU backend under test.
pub fn cpu_device() -> &'static Device {
    static CPU: OnceLock<Device> = OnceLock::new();
    CPU.get_or_init(Device::cpu)
}

/// Every device under test: the CPU backend, then the GPU devices.
pub fn devices() -> Vec<Device> {
    std::iter::once(cpu_device().clone()).chain(gpu_devices().iter().cloned()).collect()
}

/// The first GPU device, or the CPU backend where no GPU run was allowed.
pub fn first_device() -> Device {
    gpu_devices().first().cloned().unwrap_or_else(|| cpu_device().clone())
}

/// Count one comparison on `dev` in `$TESSERA_TEST_LOG` (one line per comparison:
/// test binary, device), so CI can print how many cases ran on which adapter.
pub fn record(dev: &Device) {
    let Some(path) = std::env::var_os("TESSERA_TEST_LOG") else { return };
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().split('-').next().unwrap_or("").to_string()))
        .unwrap_or_default();
    use std::io::Write;
    // One write per line: tests append from several threads at once.
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(format!("{bin}\t{}\n", label(dev)).as_bytes());
    }
}

/// A readable name for a device under test.
pub fn label(d: &Device) -> String {
    if d.is_cpu() {
        return format!("{} [{}]", d.info().name, d.info().backend);
    }
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

/// Build the graph with `build` on the reference and on every device under test (the
/// CPU backend and every GPU device); compare every output (shape, dtype and values).
/// `tol` overrides the per-dtype default.
pub fn check_with(name: &str, tol: Option<Tol>, build: impl Fn(&Device) -> Vec<Tensor>) {
    let oracle = Device::reference();
    let want_t = build(&oracle);
    let want = tessera::read_all_blocking(&want_t).unwrap_or_else(|e| panic!("{name}: reference failed: {e}"));
    for dev in devices() {
        let got_t = build(&dev);
        let got = tessera::read_all_blocking(&got_t).unwrap_or_else(|e| panic!("{name} on {}: {e}", label(&dev)));
        assert_eq!(got.len(), want.len(), "{name} on {}: output count", label(&dev));
        for (k, ((g, w), (gt, wt))) in got.iter().zip(&want).zip(got_t.iter().zip(&want_t)).enumerate() {
            assert_eq!(gt.dims(), wt.dims(), "{name} output {k} on {}: shape", label(&dev));
            assert_eq!(gt.dtype(), wt.dtype(), "{name} output {k} on {}: dtype", label(&dev));
            let t = tol.unwrap_or_else(|| Tol::for_dtype(wt.dtype()));
            assert_close(&format!("{name} output {k} on {}", label(&dev)), g, w, t);
        }
        record(&dev);
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
/// `~/.cache/tessera`). A missing model fails the test with how to fetch it, unless
/// `TESSERA_ALLOW_NO_MODEL=1`, which returns `None` and says loudly what is skipped.
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
        std::env::var("TESSERA_ALLOW_NO_MODEL").is_ok_and(|v| v == "1"),
        "no MiniLM model in {}: run scripts/fetch_minilm.sh (or set TESSERA_ALLOW_NO_MODEL=1 to skip the model tests)",
        dir.display()
    );
    eprintln!("\n*** TESSERA_ALLOW_NO_MODEL=1: no MiniLM in {}; this model test is SKIPPED ***\n", dir.display());
    None
}
