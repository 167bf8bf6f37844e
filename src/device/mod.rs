//! Devices: placement, capabilities, and the backends a schedule runs on, one folder
//! each: [`wgpu`](self::wgpu) (WGSL kernels through wgpu) and `cpu` (fused loops over
//! chunks on rayon's threads, and the f64 reference interpreter that tests compare
//! against).
//!
//! Inside this module `wgpu` names the backend folder; the crate is `::wgpu`.

pub(crate) mod cpu;
pub mod wgpu;

pub use self::wgpu::autotune;

use crate::stats::{Counters, Stats};
use crate::{DType, Error, Result, Shape, Tensor};
use std::sync::Arc;

/// What an adapter can do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// `shader-f16` is available (and not disabled by a forced fallback).
    pub shader_f16: bool,
    /// Subgroup operations are available.
    pub subgroups: bool,
    /// Smallest and largest subgroup size the adapter reports (0 when unknown).
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    /// Timestamp queries are available.
    pub timestamp_query: bool,
    /// The largest storage buffer one binding may cover.
    pub max_storage_buffer_binding_size: u64,
    /// The largest buffer.
    pub max_buffer_size: u64,
    /// Storage buffers one compute stage may bind.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Workgroups per dispatch dimension.
    pub max_compute_workgroups_per_dimension: u32,
    /// Invocations per workgroup.
    pub max_compute_invocations_per_workgroup: u32,
    /// Workgroup memory in bytes.
    pub max_compute_workgroup_storage_size: u32,
}

/// Describes a device: its adapter and capabilities.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Adapter name (`llvmpipe (LLVM 15.0.6, 256 bits)`, `NVIDIA H200`, `cpu (2 threads)`).
    pub name: String,
    /// `Vulkan`, `Gl`, `Metal`, `Dx12`, `BrowserWebGpu`, `Cpu` for the CPU backend, or
    /// `Reference`.
    pub backend: String,
    /// `DiscreteGpu`, `IntegratedGpu`, `Cpu`, ...
    pub device_type: String,
    /// Driver name and version, where the adapter reports them.
    pub driver: String,
    /// Whether the f16 path is the packed fallback because it was forced.
    pub forced_fallback: bool,
    pub capabilities: Capabilities,
    /// Why this device was chosen: "NVIDIA H200 is a hardware GPU", "llvmpipe (...) is
    /// a software adapter; the CPU backend is faster here", or how it was asked for.
    pub placement: String,
    /// For an application's device ([`Device::from_wgpu`]): the features Tessera would
    /// use (with what each buys) and the limits above the device's that its adapter
    /// offers and the device was created without, so Tessera runs slower kernels or
    /// refuses larger tensors on it. Empty for Tessera's own devices, on GL and in the
    /// browser. [`Device::wgpu_requirements`] gives what to create the device with.
    pub unrequested: Vec<String>,
}

/// What a device opened on a software OpenGL adapter says about it.
#[cfg(not(target_arch = "wasm32"))]
const GL_SOFTWARE: &str = "a software OpenGL adapter: its compute runs far slower than Mesa's \
     lavapipe through Vulkan (install mesa-vulkan-drivers; scripts/setup.sh does)";

/// An adapter found by [`Device::list`].
#[derive(Clone, Debug)]
pub struct AdapterDescription {
    /// Position in the list; pass it as [`DeviceOptions::adapter_index`].
    pub index: usize,
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub capabilities: Capabilities,
}

/// How to pick and open a device.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// Pick the first adapter whose name or backend contains this (case-insensitive).
    /// Defaults to the `TESSERA_ADAPTER` environment variable.
    pub adapter: Option<String>,
    /// Pick the adapter at this index of [`Device::list`].
    pub adapter_index: Option<usize>,
    /// Use every fallback path (packed f16, no subgroups). Defaults to
    /// `TESSERA_FORCE_FALLBACK=1`.
    pub force_fallback: bool,
    /// Test hook: pretend the device allows at most this many workgroups per dispatch
    /// dimension, so the folding of large dispatches is exercised on small tensors.
    pub max_workgroups_per_dimension: Option<u32>,
    /// Choose the matmul kernel: `Some(true)` the workgroup-tiled one, `Some(false)` the
    /// direct one; `None` lets the adapter decide (direct on CPU adapters) or
    /// `TESSERA_MATMUL=tiled|direct`.
    pub tiled_matmul: Option<bool>,
    /// Use this matmul kernel and register tile (overrides `tiled_matmul` and the
    /// autotune cache).
    pub matmul: Option<autotune::MatmulConfig>,
    /// Apply the autotuner's cached result for this adapter from this file, if it holds
    /// one. [`DeviceOptions::from_env`] sets the default cache unless
    /// `TESSERA_AUTOTUNE=0`; `Default` reads no cache.
    pub autotune_cache: Option<std::path::PathBuf>,
    /// Read convolution windows in place in the matmul (implicit GEMM): `None` takes
    /// `TESSERA_IMPLICIT_GEMM=1|0`, else the autotuner's measurement, else the tiled
    /// kernel's default (on).
    pub implicit_gemm: Option<bool>,
    /// Run `scaled_dot_product_attention` as the fused kernel: `None` takes
    /// `TESSERA_FUSED_ATTENTION=1|0`, else the autotuner's measurement, else off.
    pub fused_attention: Option<bool>,
    /// A memory budget in bytes for this device's buffers: past it, allocations fail
    /// with `Error::OutOfMemory` (requested and available bytes) and tensors already on
    /// the device stay intact. Defaults to `TESSERA_MEMORY_LIMIT` (bytes, or with a
    /// K/M/G suffix); `None` leaves the limit to the driver.
    pub memory_limit: Option<u64>,
    /// Test hook: kernels whose label contains this string are compiled from invalid
    /// WGSL, so tests can check that a kernel that fails to compile is reported as
    /// `Error::Gpu` naming it, and that the device stays usable.
    #[doc(hidden)]
    pub invalid_kernel_for_testing: Option<String>,
    /// Treat storage bindings as holding at most this many bytes (below the adapter's
    /// own limit), so tests run the path that splits large element-wise kernels into
    /// windows on small tensors. Defaults to `TESSERA_MAX_BINDING_SIZE` (bytes or K/M/G).
    pub max_binding_size: Option<u64>,
    /// Most compiled kernels a device keeps (a GPU device's pipelines); past it the least
    /// recently used is dropped, and compiled again if it is needed again. Defaults to
    /// `TESSERA_MAX_PIPELINES`, else [`DEFAULT_MAX_PIPELINES`]. Lavapipe holds a few
    /// megabytes of machine code per pipeline, so a process that builds ever new graphs
    /// would otherwise grow without end.
    pub max_pipelines: Option<usize>,
    /// Read operands from textures on CPU adapters (`ShaderCaps::texture_rows`): the
    /// products' (f32, f16 and quantised) and their epilogues', and those of the norms,
    /// softmax and attention.
    /// `None` takes `TESSERA_TEXTURE_OPERANDS=1|0`, else on wherever wide loads are.
    pub texture_operands: Option<bool>,
}

/// The pipelines a device keeps by default ([`DeviceOptions::max_pipelines`]); a model
/// needs tens to a few hundred.
pub const DEFAULT_MAX_PIPELINES: usize = 1024;

/// Whether an adapter is real graphics hardware, not a CPU emulation such as lavapipe,
/// llvmpipe, SwiftShader or WARP. Browsers say only whether an adapter is a fallback
/// one (wgpu's `Cpu` type; others are `Other`), so there the name is checked too.
pub(crate) fn is_hardware(a: &AdapterDescription) -> bool {
    let name = a.name.to_lowercase();
    let software = ["swiftshader", "llvmpipe", "lavapipe", "softpipe", "microsoft basic render", "warp"];
    match a.device_type.as_str() {
        "DiscreteGpu" | "IntegratedGpu" | "VirtualGpu" => true,
        "Other" => a.backend == "BrowserWebGpu" && !software.iter().any(|s| name.contains(s)),
        _ => false,
    }
}

/// Parse `123`, `64K`, `512M` or `2G` (powers of 1024).
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let (num, mul) = match t.char_indices().last()? {
        (i, 'k' | 'K') => (&t[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&t[..i], 1 << 20),
        (i, 'g' | 'G') => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mul)
}

impl DeviceOptions {
    /// Options from the environment (`TESSERA_ADAPTER`, `TESSERA_FORCE_FALLBACK`).
    pub fn from_env() -> Self {
        let env = |k: &str| {
            #[cfg(not(target_arch = "wasm32"))]
            {
                std::env::var(k).ok().filter(|v| !v.is_empty())
            }
            #[cfg(target_arch = "wasm32")]
            {
                let _ = k;
                None::<String>
            }
        };
        DeviceOptions {
            adapter: env("TESSERA_ADAPTER"),
            adapter_index: None,
            force_fallback: env("TESSERA_FORCE_FALLBACK").is_some_and(|v| v != "0"),
            max_workgroups_per_dimension: None,
            tiled_matmul: None,
            matmul: None,
            autotune_cache: if env("TESSERA_AUTOTUNE").as_deref() == Some("0") { None } else { autotune::cache_path() },
            implicit_gemm: None,
            fused_attention: None,
            memory_limit: env("TESSERA_MEMORY_LIMIT").as_deref().and_then(parse_bytes),
            invalid_kernel_for_testing: None,
            max_binding_size: env("TESSERA_MAX_BINDING_SIZE").as_deref().and_then(parse_bytes),
            max_pipelines: env("TESSERA_MAX_PIPELINES").and_then(|v| v.trim().parse().ok()),
            texture_operands: None,
        }
    }
}

pub(crate) enum Backend {
    Gpu(Box<self::wgpu::GpuContext>),
    /// The CPU backend: every dtype at its own precision, on rayon's threads.
    Cpu,
    /// The f64 reference interpreter; `exact` skips rounding to each node's dtype.
    Reference {
        exact: bool,
    },
}

pub(crate) struct DeviceInner {
    pub info: DeviceInfo,
    pub backend: Backend,
    pub counters: Arc<Counters>,
    /// How the device was opened (`None` for `from_wgpu` and the CPU backends), so
    /// [`Device::recover`] can open its replacement.
    pub options: Option<DeviceOptions>,
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        crate::profile::save_to_env();
    }
}

/// A compute device: a wgpu adapter's device, the CPU backend, or the f64 reference.
/// Cheap to clone; tensors keep their device alive.
#[derive(Clone)]
pub struct Device(pub(crate) Arc<DeviceInner>);

/// A realised value.
#[derive(Clone)]
pub(crate) enum Storage {
    Gpu(Arc<self::wgpu::GpuStorage>),
    /// A tensor on the CPU backend, at its dtype's width.
    Cpu(Arc<cpu::buffer::CpuBuffer>),
    /// A tensor on the reference device, one f64 per element.
    Host(Arc<Vec<f64>>),
    /// A quantised tensor on the reference device: its values and its exact GGUF blocks.
    HostQuantized(#[cfg_attr(target_arch = "wasm32", allow(dead_code))] Arc<Vec<f64>>, Arc<Vec<u8>>),
}

impl Device {
    /// The best device here: a hardware GPU (discrete, then integrated, then virtual)
    /// when there is one, else the CPU backend, which beats a software adapter such as
    /// lavapipe or SwiftShader on the same cores. [`DeviceInfo::placement`] says why.
    /// `TESSERA_ADAPTER` overrides (`cpu`, `gpu` for the best wgpu adapter of any kind,
    /// `reference`, or part of an adapter's name or backend), as does
    /// `TESSERA_FORCE_FALLBACK`. Blocks (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Device> {
        pollster::block_on(Self::new_async(DeviceOptions::from_env()))
    }

    /// Open a device with explicit options (native only; blocks).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn with_options(options: DeviceOptions) -> Result<Device> {
        pollster::block_on(Self::new_async(options))
    }

    /// Open a device; the async form works on every target.
    pub async fn new_async(mut options: DeviceOptions) -> Result<Device> {
        #[cfg(not(target_arch = "wasm32"))]
        let wanted = options.adapter.clone().or_else(|| DeviceOptions::from_env().adapter);
        #[cfg(target_arch = "wasm32")]
        let wanted = options.adapter.clone();
        let wanted = wanted.map(|w| w.trim().to_lowercase());
        let (placement, open_best) = match (wanted.as_deref(), options.adapter_index) {
            (Some("cpu"), _) => {
                let why = "chosen (TESSERA_ADAPTER or DeviceOptions::adapter is \"cpu\")";
                return Ok(Device::cpu_placed(why.into(), Some(options)));
            }
            (Some("reference"), _) => return Ok(Device::reference()),
            (Some("gpu"), None) => ("chosen (\"gpu\": the best wgpu adapter of any kind)".to_string(), true),
            (Some(w), None) => (format!("chosen (the first adapter matching {w:?})"), false),
            (_, Some(i)) => (format!("chosen (adapter index {i})"), false),
            (None, None) => {
                let adapters = self::wgpu::list_adapters().await;
                match adapters.iter().find(|a| is_hardware(a)) {
                    Some(a) => (format!("{} is a hardware GPU ({})", a.name, a.device_type), true),
                    None => {
                        let why = match adapters.first() {
                            Some(a) => format!(
                                "{} is a software adapter; the CPU backend is faster here (TESSERA_ADAPTER=gpu picks it anyway)",
                                if a.name.is_empty() { "the only adapter, a fallback one," } else { a.name.as_str() }
                            ),
                            None => "no GPU adapter found; the CPU backend runs here".into(),
                        };
                        return Ok(Device::cpu_placed(why, Some(options)));
                    }
                }
            }
        };
        if open_best {
            options.adapter = None;
            options.adapter_index = Some(0);
        }
        let mut ctx = self::wgpu::GpuContext::open(&options).await?;
        // Found when Mesa's Vulkan driver is missing: wgpu falls back to llvmpipe
        // through OpenGL, whose compute ran 5-10x slower than lavapipe here (a matmul
        // at 1 against 10 GFLOP/s, MiniLM at 580 against 116 ms a sentence).
        #[cfg(not(target_arch = "wasm32"))]
        let placement = match (ctx.info.backend.as_str(), ctx.info.device_type.as_str()) {
            ("Gl", "Cpu") => format!("{placement}; {GL_SOFTWARE}"),
            _ => placement,
        };
        ctx.info.placement = placement;
        Ok(Device::from_context(ctx, Some(options)))
    }

    /// A fresh device to replace this one after it was lost: the same adapter and
    /// options, new buffers, empty caches. Tensors stay with the device they were made
    /// on; bring a model across by loading its last checkpoint on the new device
    /// (`io::checkpoint::load`), or re-creating it from host data. The CPU backend
    /// returns itself; a device from [`Device::from_wgpu`] cannot be re-created here.
    pub async fn recover_async(&self) -> Result<Device> {
        match (&self.0.backend, &self.0.options) {
            (Backend::Cpu | Backend::Reference { .. }, _) => Ok(self.clone()),
            (_, Some(options)) => Device::new_async(options.clone()).await,
            (_, None) => Err(Error::Unsupported(
                "Device::recover: this device came from Device::from_wgpu; create a new wgpu device and wrap it".into(),
            )),
        }
    }

    /// [`Device::recover_async`], blocking (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn recover(&self) -> Result<Device> {
        pollster::block_on(self.recover_async())
    }

    /// Whether the device was lost (a driver reset, `wgpu::Device::destroy`): every
    /// realisation on it now fails with `Error::DeviceLost`.
    pub fn is_lost(&self) -> bool {
        match &self.0.backend {
            Backend::Gpu(g) => g.check_alive().is_err(),
            Backend::Cpu | Backend::Reference { .. } => false,
        }
    }

    /// Test hook: destroy the wgpu device as a driver reset would. Reads in flight
    /// and every later realisation fail with `Error::DeviceLost`.
    #[doc(hidden)]
    pub fn lose_for_testing(&self) {
        if let Backend::Gpu(g) = &self.0.backend {
            g.destroy();
        }
    }

    /// Every adapter wgpu offers, best first (native only; blocks).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn list() -> Vec<AdapterDescription> {
        pollster::block_on(self::wgpu::list_adapters())
    }

    /// Every adapter wgpu offers, best first.
    pub async fn list_async() -> Vec<AdapterDescription> {
        self::wgpu::list_adapters().await
    }

    /// Wrap an application's own wgpu device and queue, so a renderer and Tessera share
    /// one GPU. The adapter the device came from (`wgpu::Device::adapter_info`) and the
    /// features it was created with decide the kernel variants, as for [`Device::new`]:
    /// a device made with all of its adapter's features runs the kernels Tessera's own
    /// would (on lavapipe, 64-bit loads, subgroups and operand textures).
    ///
    /// The application must use the same wgpu major version as Tessera (re-exported as
    /// `tessera::wgpu`; eframe 0.37 uses the same). Tensors then pass to the renderer
    /// without a copy: see [`crate::interop`].
    pub fn from_wgpu(device: ::wgpu::Device, queue: ::wgpu::Queue) -> Device {
        let mut ctx = self::wgpu::GpuContext::from_wgpu(device, queue, false);
        ctx.note_unrequested();
        Device::from_context(ctx, None)
    }

    /// The features and limits Tessera's own device would request from `adapter`, as
    /// far as the adapter offers them. An application that creates its device with
    /// them (adding its own) gets the kernels [`Device::new`] would run there:
    ///
    /// ```no_run
    /// # async fn open(adapter: wgpu::Adapter) -> Result<(), wgpu::RequestDeviceError> {
    /// let (required_features, required_limits) = tessera::Device::wgpu_requirements(&adapter);
    /// let (device, queue) = adapter
    ///     .request_device(&wgpu::DeviceDescriptor { required_features, required_limits, ..Default::default() })
    ///     .await?;
    /// let dev = tessera::Device::from_wgpu(device, queue);
    /// assert!(dev.info().unrequested.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn wgpu_requirements(adapter: &::wgpu::Adapter) -> (::wgpu::Features, ::wgpu::Limits) {
        self::wgpu::requirements(adapter, false)
    }

    /// The CPU backend: the same fused schedule run on the host's cores, every dtype at
    /// its own precision, matrix products through the `gemm` crate. What
    /// [`Device::new`] picks where the only GPU adapters are software ones.
    pub fn cpu() -> Device {
        Device::cpu_placed("chosen (Device::cpu)".into(), None)
    }

    /// The reference backend: every op computed in f64 by `src/reference/` and rounded
    /// to its dtype, one op at a time. It is the tests' oracle; it is slow.
    pub fn reference() -> Device {
        Device::reference_with(false)
    }

    /// The reference backend without rounding: every float op (and every float upload)
    /// keeps f64 precision whatever the dtype says. Finite-difference gradient checks
    /// run here.
    pub fn reference_exact() -> Device {
        Device::reference_with(true)
    }

    /// The matmul kernel and register tile this device uses (`None` on the CPU device).
    pub fn matmul_config(&self) -> Option<autotune::MatmulConfig> {
        match &self.0.backend {
            Backend::Gpu(g) => Some(autotune::MatmulConfig {
                direct: g.caps.direct_matmul,
                tm: g.caps.matmul_tile.0,
                tn: g.caps.matmul_tile.1,
                vec4: g.caps.tiled_vec4,
            }),
            Backend::Cpu | Backend::Reference { .. } => None,
        }
    }

    /// Whether matmuls run the direct (barrier-free) kernel rather than the tiled one.
    pub fn direct_matmul(&self) -> bool {
        match &self.0.backend {
            Backend::Gpu(g) => g.caps.direct_matmul,
            Backend::Cpu | Backend::Reference { .. } => false,
        }
    }

    /// Whether `scaled_dot_product_attention` runs as one attention kernel here: on a
    /// GPU where the autotuner measured the fused kernel faster than the composition
    /// (or `TESSERA_FUSED_ATTENTION=1`), always on the CPU backend (its own loop).
    pub fn fused_attention(&self) -> bool {
        match &self.0.backend {
            Backend::Gpu(g) => g.fused_attention,
            Backend::Cpu => std::env::var("TESSERA_FUSED_ATTENTION").as_deref() != Ok("0"),
            Backend::Reference { .. } => false,
        }
    }

    /// Whether products read convolution windows in place (implicit GEMM) here.
    pub fn implicit_gemm(&self) -> bool {
        match &self.0.backend {
            Backend::Gpu(g) => g.caps.implicit_gemm,
            Backend::Cpu | Backend::Reference { .. } => false,
        }
    }

    /// Whether this is the unrounded reference backend ([`Device::reference_exact`]).
    pub fn is_exact(&self) -> bool {
        matches!(self.0.backend, Backend::Reference { exact: true })
    }

    /// Whether this is the reference backend (rounded or exact).
    pub fn is_reference(&self) -> bool {
        matches!(self.0.backend, Backend::Reference { .. })
    }

    fn cpu_placed(placement: String, options: Option<DeviceOptions>) -> Device {
        let threads = cpu::threads();
        let name = format!("cpu ({threads} thread{})", if threads == 1 { "" } else { "s" });
        Device::host(name, placement, Backend::Cpu, options)
    }

    fn reference_with(exact: bool) -> Device {
        let name = if exact { "reference (exact f64)" } else { "reference (f64, rounded per op)" };
        Device::host(name.into(), "chosen (Device::reference)".into(), Backend::Reference { exact }, None)
    }

    /// A device on the host: no binding or dispatch limits.
    fn host(name: String, placement: String, backend: Backend, options: Option<DeviceOptions>) -> Device {
        let caps = Capabilities {
            shader_f16: true,
            subgroups: false,
            subgroup_min_size: 0,
            subgroup_max_size: 0,
            timestamp_query: false,
            max_storage_buffer_binding_size: u64::MAX,
            max_buffer_size: u64::MAX,
            max_storage_buffers_per_shader_stage: u32::MAX,
            max_compute_workgroups_per_dimension: u32::MAX,
            max_compute_invocations_per_workgroup: 1,
            max_compute_workgroup_storage_size: 0,
        };
        Device(Arc::new(DeviceInner {
            info: DeviceInfo {
                backend: if matches!(backend, Backend::Cpu) { "Cpu" } else { "Reference" }.into(),
                name,
                device_type: "Cpu".into(),
                driver: String::new(),
                forced_fallback: false,
                capabilities: caps,
                placement,
                unrequested: Vec::new(),
            },
            backend,
            counters: Arc::new(Counters::default()),
            options,
        }))
    }

    fn from_context(ctx: self::wgpu::GpuContext, options: Option<DeviceOptions>) -> Device {
        let counters = ctx.counters.clone();
        let info = ctx.info.clone();
        Device(Arc::new(DeviceInner { info, backend: Backend::Gpu(Box::new(ctx)), counters, options }))
    }

    /// Adapter, backend and capabilities.
    pub fn info(&self) -> &DeviceInfo {
        &self.0.info
    }

    /// Capabilities (shortcut for `info().capabilities`).
    pub fn capabilities(&self) -> &Capabilities {
        &self.0.info.capabilities
    }

    /// True for the devices that run on the host: the CPU backend and the reference.
    pub fn is_cpu(&self) -> bool {
        matches!(self.0.backend, Backend::Cpu | Backend::Reference { .. })
    }

    /// This device's counters since it was opened.
    pub fn stats(&self) -> Stats {
        self.0.counters.snapshot()
    }

    /// Restart this device's `peak_bytes` from the bytes in use now, to measure what
    /// one piece of work holds at most.
    pub fn reset_peak_bytes(&self) {
        self.0.counters.reset_peak();
    }

    /// The wgpu device and queue, for applications that share the GPU.
    pub fn wgpu(&self) -> Option<(&::wgpu::Device, &::wgpu::Queue)> {
        match &self.0.backend {
            Backend::Gpu(g) => Some((&g.device, &g.queue)),
            Backend::Cpu | Backend::Reference { .. } => None,
        }
    }

    /// Block until the GPU has finished all submitted work (native only; a no-op on the
    /// CPU device). Benchmarks use it; ordinary code never needs to.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn synchronize(&self) -> Result<()> {
        match &self.0.backend {
            Backend::Gpu(g) => {
                let _serial = g.exclusive();
                g.device
                    .poll(::wgpu::PollType::wait_indefinitely())
                    .map(|_| ())
                    .map_err(|e| Error::DeviceLost(e.to_string()))
            }
            Backend::Cpu | Backend::Reference { .. } => Ok(()),
        }
    }

    /// The memory budget in bytes (`DeviceOptions::memory_limit`, or
    /// `TESSERA_MEMORY_LIMIT` with an optional K/M/G suffix), if one is set.
    pub fn memory_limit(&self) -> Option<u64> {
        match &self.0.backend {
            Backend::Gpu(g) => g.pool.limit(),
            Backend::Cpu | Backend::Reference { .. } => {
                self.0.options.as_ref().and_then(|o| o.memory_limit).or_else(|| DeviceOptions::from_env().memory_limit)
            }
        }
    }

    /// Release pooled buffers no tensor holds; returns the bytes released.
    pub fn trim_pool(&self) -> u64 {
        match &self.0.backend {
            Backend::Gpu(g) => g.pool.trim(),
            // The CPU backend's pool is the process's: every CPU device shares it.
            Backend::Cpu => cpu::trim_pool(),
            Backend::Reference { .. } => 0,
        }
    }

    /// Whether two handles are the same device.
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Most storage buffers a generated kernel may read.
    pub(crate) fn max_kernel_inputs(&self) -> usize {
        // Output and status take two of the stage's storage bindings.
        (self.capabilities().max_storage_buffers_per_shader_stage.min(64) as usize).saturating_sub(2).max(2)
    }

    /// Put host values (already rounded to `dtype`) on this device. A tensor over the
    /// device's buffer limits becomes a tensor carrying `Error::Limit`.
    #[track_caller]
    pub(crate) fn upload(&self, values: Vec<f64>, shape: Shape, dtype: DType) -> Tensor {
        if let Some(failed) = self.over_limit(values.len(), &shape, dtype) {
            return failed;
        }
        let storage = match &self.0.backend {
            Backend::Gpu(g) => match g.upload(&crate::dtype::encode(dtype, &values)) {
                Ok(s) => Storage::Gpu(Arc::new(s)),
                Err(e) => return Tensor::failed(e, dtype, self),
            },
            Backend::Cpu => Storage::Cpu(Arc::new(cpu::buffer::CpuBuffer::new(
                cpu::buffer::HostBuffer::from_f64(dtype, &values),
                &self.0.counters,
            ))),
            Backend::Reference { .. } => Storage::Host(Arc::new(values)),
        };
        Tensor::from_storage(storage, shape, dtype, self)
    }

    /// Put GGUF blocks of `dtype` (Q8_0 or Q4_0) on this device, exactly.
    /// A tensor carrying `Error::Limit` when `n` elements of `dtype` exceed the device's
    /// buffer limit (buffers may exceed one storage binding: kernels that read them bind
    /// windows).
    fn over_limit(&self, n: usize, shape: &Shape, dtype: DType) -> Option<Tensor> {
        let bytes = dtype.storage_bytes(n);
        let limit = self.capabilities().max_buffer_size;
        (bytes > limit).then(|| {
            let what = format!("a {dtype} tensor of shape {shape} ({bytes} bytes)");
            Tensor::failed(Error::Limit { what, needed: bytes, limit }, dtype, self)
        })
    }

    /// [`Device::upload`] from little-endian `bytes` already in `dtype`'s storage layout
    /// (f32, f16, i32, u32): the GPU and the CPU backend take them with no f64 in
    /// between, so loading a model needs no transient twice its size. Other dtypes, the
    /// reference device and the browser's build go through f64.
    #[track_caller]
    pub(crate) fn upload_le_bytes(&self, bytes: &[u8], shape: Shape, dtype: DType) -> Tensor {
        let n = shape.numel();
        // Fewer bytes than the shape needs (a `gguf::TensorData` built by hand, say): an
        // error, not a decode past the end.
        if !dtype.is_quantized() && n.checked_mul(dtype.size_in_bytes()).is_none_or(|b| b > bytes.len()) {
            let e = Error::InvalidArgument {
                op: "upload",
                detail: format!("{} bytes for {n} {dtype} values", bytes.len()),
                location: std::panic::Location::caller(),
            };
            return Tensor::failed(e, dtype, self);
        }
        // Native only: the npm package's size budget (its files are small anyway).
        let direct = !cfg!(target_arch = "wasm32")
            && matches!(dtype, DType::F32 | DType::F16 | DType::I32 | DType::U32)
            && matches!(self.0.backend, Backend::Gpu(_) | Backend::Cpu);
        if !direct {
            return self.upload(crate::dtype::decode(dtype, bytes, n), shape, dtype);
        }
        if let Some(failed) = self.over_limit(n, &shape, dtype) {
            return failed;
        }
        let used = &bytes[..n * dtype.size_in_bytes()];
        let storage = match &self.0.backend {
            Backend::Gpu(g) => {
                let r = if used.len().is_multiple_of(4) {
                    g.upload(used)
                } else {
                    let mut padded = used.to_vec();
                    padded.resize(used.len().next_multiple_of(4), 0);
                    g.upload(&padded)
                };
                match r {
                    Ok(s) => Storage::Gpu(Arc::new(s)),
                    Err(e) => return Tensor::failed(e, dtype, self),
                }
            }
            _ => match cpu::buffer::HostBuffer::from_le_bytes(dtype, used, n) {
                Some(h) => Storage::Cpu(Arc::new(cpu::buffer::CpuBuffer::new(h, &self.0.counters))),
                None => return self.upload(crate::dtype::decode(dtype, bytes, n), shape, dtype),
            },
        };
        Tensor::from_storage(storage, shape, dtype, self)
    }

    pub(crate) fn upload_quantized(&self, blocks: &[u8], shape: Shape, dtype: DType) -> Tensor {
        let storage = match &self.0.backend {
            Backend::Gpu(g) => match g.upload(&crate::quant::blocks_to_gpu(dtype, blocks)) {
                Ok(s) => Storage::Gpu(Arc::new(s)),
                Err(e) => return Tensor::failed(e, dtype, self),
            },
            Backend::Cpu => Storage::Cpu(Arc::new(cpu::buffer::CpuBuffer::new(
                cpu::buffer::HostBuffer::Quant(dtype, blocks.to_vec()),
                &self.0.counters,
            ))),
            Backend::Reference { .. } => {
                let values = crate::quant::dequantize(dtype, blocks).into_iter().map(f64::from).collect();
                Storage::HostQuantized(Arc::new(values), Arc::new(blocks.to_vec()))
            }
        };
        Tensor::from_storage(storage, shape, dtype, self)
    }

    /// The raw device bytes of a realised tensor (one copy and one submit on a GPU).
    pub(crate) async fn read_bytes(&self, t: &Tensor) -> Result<Vec<u8>> {
        match (&self.0.backend, t.storage()) {
            (Backend::Gpu(g), Some(Storage::Gpu(s))) => {
                let bytes = t.storage_bytes();
                let _serial = g.exclusive();
                let staging =
                    g.pool.get(&g.device, bytes, ::wgpu::BufferUsages::MAP_READ | ::wgpu::BufferUsages::COPY_DST)?;
                let mut enc = g.device.create_command_encoder(&Default::default());
                enc.copy_buffer_to_buffer(s.buffer.buffer(), 0, staging.buffer(), 0, bytes);
                g.queue.submit(Some(enc.finish()));
                self.0.counters.add(crate::stats::Counter::Submits, 1);
                let mut out = g.map_read(&[(staging.buffer(), bytes)]).await?;
                Ok(out.pop().unwrap_or_default())
            }
            (_, Some(Storage::Cpu(b))) => Ok(b.device_bytes()),
            (_, Some(Storage::Host(v))) => Ok(crate::dtype::encode(t.dtype(), &v)),
            (_, Some(Storage::HostQuantized(_, blocks))) => Ok(crate::quant::blocks_to_gpu(t.dtype(), &blocks)),
            _ => Err(Error::Unsupported(format!("tensor {} is not realised on {}", t.id(), self))),
        }
    }

    /// Realise `targets` (one submit on a GPU) and keep their values on the device.
    pub async fn realize(&self, targets: &[Tensor]) -> Result<()> {
        self.run(targets, 0).await.map(|_| ())
    }

    /// Realise `targets` and read them back as f64 (one submit on a GPU).
    pub async fn read(&self, targets: &[Tensor]) -> Result<Vec<Vec<f64>>> {
        let read = self.run(targets, targets.len()).await?.unwrap_or_default();
        Ok(read.into_iter().zip(targets).map(|(r, t)| r.into_f64(t)).collect())
    }

    /// Realise `t` and read back the bytes its storage holds (one submit on a GPU; the
    /// reference device encodes its f64 values as the dtype's device bytes).
    pub(crate) async fn read_bytes_of(&self, t: &Tensor) -> Result<Vec<u8>> {
        Ok(self.read_one(t).await?.map(|r| r.into_bytes(t)).unwrap_or_default())
    }

    /// Realise `t` and read it back as its backend read it (one submit on a GPU).
    async fn read_one(&self, t: &Tensor) -> Result<Option<Readback>> {
        Ok(self.run(std::slice::from_ref(t), 1).await?.unwrap_or_default().pop())
    }

    /// `read_bytes_of` into a JavaScript array: from WebGPU without passing through
    /// wasm memory.
    #[cfg(target_arch = "wasm32")]
    pub(crate) async fn read_js_bytes_of(&self, t: &Tensor) -> Result<js_sys::Uint8Array> {
        Ok(match self.read_one(t).await? {
            Some(Readback::Js(a)) => a,
            Some(r) => js_sys::Uint8Array::from(&r.into_bytes(t)[..]),
            None => js_sys::Uint8Array::new_with_length(0),
        })
    }

    /// Realise `read` and `keep` together (one submit on a GPU); read back only `read`.
    /// A training step uses it: the loss is read, the new parameters stay on the device.
    pub async fn read_and_realize(&self, read: &[Tensor], keep: &[Tensor]) -> Result<Vec<Vec<f64>>> {
        let mut all = read.to_vec();
        all.extend_from_slice(keep);
        let values = self.run(&all, read.len()).await?.unwrap_or_default();
        Ok(values.into_iter().zip(read).map(|(r, t)| r.into_f64(t)).collect())
    }

    /// Realise `target` and write it into a texture in the same submit (wgpu only).
    pub(crate) async fn realize_with_sink(
        &self,
        target: &Tensor,
        sink: &self::wgpu::interop::TextureSink,
    ) -> Result<()> {
        target.check()?;
        match &self.0.backend {
            Backend::Gpu(g) => {
                self::wgpu::execute::run(g, self, std::slice::from_ref(target), 0, Some(sink)).await.map(|_| ())
            }
            _ => Err(Error::Unsupported(format!("a texture write needs a wgpu device; this one is {self}"))),
        }
    }

    async fn run(&self, targets: &[Tensor], n_read: usize) -> Result<Option<Vec<Readback>>> {
        for t in targets {
            t.check()?;
            if !t.device().same(self) {
                return Err(Error::DeviceMismatch {
                    op: "realize",
                    a: self.info().name.clone(),
                    b: t.device().info().name.clone(),
                    location: t.location(),
                });
            }
        }
        match &self.0.backend {
            Backend::Gpu(g) => self::wgpu::execute::run(g, self, targets, n_read, None).await,
            Backend::Cpu => cpu::run(self, targets, n_read),
            #[cfg(not(target_arch = "wasm32"))]
            Backend::Reference { exact } => {
                let mut vals = cpu::reference::run(targets, *exact)?;
                vals.truncate(n_read);
                Ok((n_read > 0).then(|| vals.into_iter().map(Readback::F64).collect()))
            }
            // The package's size budget: a page has the CPU backend and WebGPU.
            #[cfg(target_arch = "wasm32")]
            Backend::Reference { .. } => {
                Err(Error::Unsupported("the reference interpreter is not in the web build".into()))
            }
        }
    }
}

/// A target's values as a backend read them: the bytes device storage holds (wgpu, the
/// CPU backend), or f64 (the reference interpreter, exact).
pub(crate) enum Readback {
    Bytes(Vec<u8>),
    #[cfg(not(target_arch = "wasm32"))]
    F64(Vec<f64>),
    /// A page's WebGPU read: the device bytes, still in JavaScript.
    #[cfg(target_arch = "wasm32")]
    Js(js_sys::Uint8Array),
}

impl Readback {
    /// The values of `t` as f64.
    fn into_f64(self, t: &Tensor) -> Vec<f64> {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            Readback::F64(v) => v,
            b => crate::dtype::decode(t.dtype(), &b.into_bytes(t), t.numel()),
        }
    }

    /// The device bytes of `t` (the reference interpreter's f64 encoded as its dtype).
    #[cfg_attr(target_arch = "wasm32", allow(unused_variables))]
    fn into_bytes(self, t: &Tensor) -> Vec<u8> {
        match self {
            Readback::Bytes(b) => b,
            #[cfg(not(target_arch = "wasm32"))]
            Readback::F64(v) => crate::dtype::encode(t.dtype(), &v),
            #[cfg(target_arch = "wasm32")]
            Readback::Js(a) => a.to_vec(),
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({} on {})", self.info().name, self.info().backend)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.info().name, self.info().backend)
    }
}
