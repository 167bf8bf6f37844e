//! The wgpu backend: adapter choice, device creation, error capture, the pipeline cache,
//! uploads and readback.

use super::pool::{BufferPool, PooledBuffer};
use crate::device::{AdapterDescription, Capabilities, DeviceInfo, DeviceOptions};
use crate::kernels::ShaderCaps;
use crate::stats::{Counter, Counters};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Storage usage of every tensor buffer.
pub(crate) const STORAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

/// A realised tensor on the GPU, with the bounds checks its computation still owes.
pub(crate) struct GpuStorage {
    pub buffer: Arc<PooledBuffer>,
    pub checks: Vec<Arc<super::checks::PendingCheck>>,
}

pub(crate) struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: DeviceInfo,
    pub caps: ShaderCaps,
    pub pool: BufferPool,
    pub counters: Arc<Counters>,
    /// Compiled pipelines by source, each with the tick of its last use, at most
    /// `max_pipelines` of them (the least recently used goes first).
    pipelines: Mutex<Pipelines>,
    pub max_pipelines: usize,
    /// Rendered schedules by graph structure (`super::plan`).
    pub plans: super::plan::PlanCache,
    pub lost: Arc<Mutex<Option<String>>>,
    pub uncaptured: Arc<Mutex<Vec<String>>>,
    /// Test hook (`DeviceOptions::invalid_kernel_for_testing`): kernels whose label
    /// contains this get invalid WGSL, to exercise the compile-error path.
    pub invalid_kernel: Option<String>,
    /// `scaled_dot_product_attention` runs the fused kernel rather than the composition
    /// (the autotuner's measured choice; `TESSERA_FUSED_ATTENTION=1|0` overrides).
    pub fused_attention: bool,
    /// Whether this device must be used under [`GL_LOCK`].
    serial: bool,
}

/// wgpu's GL backend shares one EGL context per adapter between threads and panics
/// when it waits too long for it, so every GL use in the process is serialised here:
/// adapter enumeration, device creation, uploads and realisations.
static GL_LOCK: Mutex<()> = Mutex::new(());

/// How long a readback polls (yielding) before it sleeps until the GPU is done
/// (`TESSERA_READBACK_SPIN_US` overrides it; 0 sleeps at once).
#[cfg(not(target_arch = "wasm32"))]
static READBACK_SPIN: std::sync::LazyLock<std::time::Duration> = std::sync::LazyLock::new(|| {
    let us = std::env::var("TESSERA_READBACK_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    std::time::Duration::from_micros(us)
});

fn gl_lock() -> std::sync::MutexGuard<'static, ()> {
    GL_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
fn type_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
fn backend_rank(b: wgpu::Backend) -> u32 {
    match b {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 | wgpu::Backend::BrowserWebGpu => 0,
        wgpu::Backend::Gl => 1,
        _ => 2,
    }
}

fn capabilities(subgroup_sizes: (u32, u32), features: wgpu::Features, limits: &wgpu::Limits) -> Capabilities {
    let subgroups = features.contains(wgpu::Features::SUBGROUP);
    Capabilities {
        shader_f16: features.contains(wgpu::Features::SHADER_F16),
        subgroups,
        subgroup_min_size: if subgroups { subgroup_sizes.0 } else { 0 },
        subgroup_max_size: if subgroups { subgroup_sizes.1 } else { 0 },
        timestamp_query: features.contains(wgpu::Features::TIMESTAMP_QUERY),
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        max_buffer_size: limits.max_buffer_size,
        max_storage_buffers_per_shader_stage: limits.max_storage_buffers_per_shader_stage,
        max_compute_workgroups_per_dimension: limits.max_compute_workgroups_per_dimension,
        max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
        max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
    }
}

/// Whether this host's CPU has AVX-512, which a CPU adapter (lavapipe) running on it uses.
fn host_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn describe(index: usize, a: &wgpu::Adapter) -> AdapterDescription {
    let info = a.get_info();
    AdapterDescription {
        index,
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
        capabilities: capabilities((info.subgroup_min_size, info.subgroup_max_size), a.features(), &a.limits()),
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn instance() -> &'static wgpu::Instance {
    static INSTANCE: std::sync::OnceLock<wgpu::Instance> = std::sync::OnceLock::new();
    INSTANCE.get_or_init(|| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        if std::env::var("WGPU_BACKEND").is_err() {
            desc.backends = wgpu::Backends::all();
        }
        wgpu::Instance::new(desc)
    })
}

/// Adapters, best first: device type, then backend (Vulkan/Metal/DX12 before GL).
async fn adapters() -> Vec<wgpu::Adapter> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        // Enumerated once per process: re-enumerating creates new GL contexts, which
        // races with GL work on other threads.
        static ADAPTERS: std::sync::OnceLock<Vec<wgpu::Adapter>> = std::sync::OnceLock::new();
        if let Some(v) = ADAPTERS.get() {
            return v.clone();
        }
        let _gl = gl_lock();
        let mut v = pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()));
        v.sort_by_key(|a| {
            let i = a.get_info();
            (type_rank(i.device_type), backend_rank(i.backend))
        });
        ADAPTERS.get_or_init(|| v).clone()
    }
    #[cfg(target_arch = "wasm32")]
    {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
        let opts = wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        };
        instance.request_adapter(&opts).await.into_iter().collect()
    }
}

pub(crate) async fn list_adapters() -> Vec<AdapterDescription> {
    adapters().await.iter().enumerate().map(|(i, a)| describe(i, a)).collect()
}

fn no_adapter_help() -> String {
    if cfg!(target_arch = "wasm32") {
        "this browser exposes no WebGPU adapter: use a browser with WebGPU enabled (Chrome/Edge 113+, or Chromium with --enable-unsafe-webgpu)".into()
    } else {
        "wgpu found no Vulkan, Metal, DX12 or GL adapter. On Linux without a GPU install Mesa's lavapipe (`apt-get install mesa-vulkan-drivers libvulkan1`); or use Device::cpu(), which Device::new() picks by itself".into()
    }
}

/// What each optional feature Tessera requests buys it.
#[cfg(not(target_arch = "wasm32"))]
const WANTED_FEATURES: [(wgpu::Features, &str); 4] = [
    (wgpu::Features::SUBGROUP, "SUBGROUP (subgroup kernels)"),
    (wgpu::Features::SHADER_INT64, "SHADER_INT64 (wide loads and operand textures on CPU adapters)"),
    (wgpu::Features::SHADER_F16, "SHADER_F16 (native f16 kernels)"),
    (wgpu::Features::TIMESTAMP_QUERY, "TIMESTAMP_QUERY (kernel timings)"),
];

/// The features and limits Tessera's own device requests from `adapter`: every limit
/// the adapter has, timestamps, and unless `force_fallback` f16, subgroups and (on CPU
/// adapters, for wide loads) 64-bit integers, as far as the adapter offers them.
pub fn requirements(adapter: &wgpu::Adapter, force_fallback: bool) -> (wgpu::Features, wgpu::Limits) {
    let mut features = wgpu::Features::TIMESTAMP_QUERY;
    if !force_fallback {
        features |= wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP;
        if adapter.get_info().device_type == wgpu::DeviceType::Cpu {
            features |= wgpu::Features::SHADER_INT64;
        }
    }
    (features & adapter.features(), adapter.limits())
}

/// What [`requirements`] would have asked of `device`'s adapter that the device was
/// created without: feature names with what they buy, and limits below the adapter's.
/// Empty where the adapter cannot be found again, and on GL, whose enumeration would
/// create contexts beside the application's.
#[cfg(not(target_arch = "wasm32"))]
fn unrequested(device: &wgpu::Device) -> Vec<String> {
    let info = device.adapter_info();
    if info.backend == wgpu::Backend::Gl {
        return Vec::new();
    }
    // An instance of the device's backend only: no GL display is opened beside an
    // application that renders with Vulkan, Metal or DX12.
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = info.backend.into();
    let found = pollster::block_on(wgpu::Instance::new(desc).enumerate_adapters(info.backend.into()))
        .into_iter()
        .find(|a| a.get_info() == info);
    let Some(adapter) = found else { return Vec::new() };
    let (want, best) = requirements(&adapter, false);
    let (have, got) = (device.features(), device.limits());
    let mut out: Vec<String> = WANTED_FEATURES
        .iter()
        .filter(|(f, _)| want.contains(*f) && !have.contains(*f))
        .map(|(_, what)| what.to_string())
        .collect();
    // Every limit below the adapter's that a kernel's choice or a tensor's size meets.
    macro_rules! below {
        ($($limit:ident),*) => {$(
            if u64::from(got.$limit) < u64::from(best.$limit) {
                out.push(format!(concat!(stringify!($limit), " {} (the adapter allows {})"), got.$limit, best.$limit));
            }
        )*};
    }
    below!(
        max_storage_buffer_binding_size,
        max_buffer_size,
        max_storage_buffers_per_shader_stage,
        max_storage_textures_per_shader_stage,
        max_sampled_textures_per_shader_stage,
        max_texture_dimension_2d,
        max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup,
        max_compute_workgroups_per_dimension
    );
    out
}

impl GpuContext {
    pub async fn open(options: &DeviceOptions) -> Result<GpuContext> {
        let env = DeviceOptions::from_env();
        let wanted = options.adapter.clone().or(env.adapter);
        let force_fallback = options.force_fallback || env.force_fallback;
        let all = adapters().await;
        if all.is_empty() {
            return Err(Error::NoAdapter(no_adapter_help()));
        }
        let adapter = if let Some(i) = options.adapter_index {
            all.into_iter().nth(i).ok_or_else(|| Error::NoAdapter(format!("no adapter at index {i}")))?
        } else if let Some(w) = wanted {
            let wl = w.to_lowercase();
            let names: Vec<String> = all
                .iter()
                .map(|a| {
                    let i = a.get_info();
                    format!("{} ({:?})", i.name, i.backend)
                })
                .collect();
            all.into_iter()
                .find(|a| {
                    let i = a.get_info();
                    i.name.to_lowercase().contains(&wl) || format!("{:?}", i.backend).to_lowercase().contains(&wl)
                })
                .ok_or_else(|| {
                    Error::NoAdapter(format!("no adapter matches TESSERA_ADAPTER={w:?}; found: {}", names.join(", ")))
                })?
        } else {
            all.into_iter().next().ok_or_else(|| Error::NoAdapter(no_adapter_help()))?
        };
        let info = adapter.get_info();
        let _gl = (info.backend == wgpu::Backend::Gl).then(gl_lock);
        let (features, limits) = requirements(&adapter, force_fallback);
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("tessera"),
                required_features: features,
                required_limits: limits,
                experimental_features: wgpu::ExperimentalFeatures::disabled(),
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| Error::NoAdapter(format!("{} ({:?}) refused a device: {e}", info.name, info.backend)))?;
        let mut ctx = GpuContext::from_wgpu(device, queue, force_fallback);
        ctx.pool.set_limit(options.memory_limit.or(env.memory_limit));
        ctx.invalid_kernel = options.invalid_kernel_for_testing.clone();
        ctx.max_pipelines = options.max_pipelines.or(env.max_pipelines).unwrap_or(crate::device::DEFAULT_MAX_PIPELINES);
        // Matmul kernel and tile: explicit, forced family, autotuned, or the default.
        let key = super::autotune::key_of(&ctx.info);
        let tuned = || options.autotune_cache.as_deref().and_then(|p| super::autotune::lookup(p, &key));
        let config = match (options.matmul, options.tiled_matmul) {
            (Some(c), _) => c,
            (None, Some(tiled)) => super::autotune::MatmulConfig::default_for(!tiled),
            (None, None) => tuned().unwrap_or_else(|| {
                super::autotune::MatmulConfig::default_for(crate::kernels::matmul::prefer_direct(&ctx.info.device_type))
            }),
        };
        // Tuned switches: the option, else the environment, else the autotuner's
        // measurement (when the matmul was not forced), else the default.
        let tuned = |field: &str| {
            let free = options.matmul.is_none() && options.tiled_matmul.is_none();
            let path = options.autotune_cache.as_deref().filter(|_| free)?;
            super::autotune::lookup_switch(path, &key, field)
        };
        let switch = |option: Option<bool>, var: &str, field: &str, default: bool| {
            option
                .or(match std::env::var(var).as_deref() {
                    Ok("1") => Some(true),
                    Ok("0") => Some(false),
                    _ => None,
                })
                .or_else(|| tuned(field))
                .unwrap_or(default)
        };
        // Untuned, attention as `from_wgpu` chose it.
        let fused_default = ctx.fused_attention;
        ctx.fused_attention = switch(options.fused_attention, "TESSERA_FUSED_ATTENTION", "attention", fused_default);
        ctx.caps.implicit_gemm = switch(options.implicit_gemm, "TESSERA_IMPLICIT_GEMM", "conv", !config.direct);
        ctx.caps.direct_matmul = config.direct;
        ctx.caps.matmul_tile = (config.tm, config.tn);
        ctx.caps.tiled_vec4 = !config.direct && config.vec4;
        if let Some(w) = options.max_workgroups_per_dimension {
            ctx.caps.max_workgroups = ctx.caps.max_workgroups.min(w.max(1));
        }
        if let Some(b) = options.max_binding_size.or(env.max_binding_size) {
            let c = &mut ctx.info.capabilities;
            c.max_storage_buffer_binding_size = c.max_storage_buffer_binding_size.min(b.max(4096));
        }
        ctx.caps.max_binding = ctx.info.capabilities.max_storage_buffer_binding_size;
        ctx.feature_paths(Some(switch(options.texture_operands, "TESSERA_TEXTURE_OPERANDS", "texture_operands", true)));
        Ok(ctx)
    }

    pub fn from_wgpu(device: wgpu::Device, queue: wgpu::Queue, forced_fallback: bool) -> GpuContext {
        let lost = Arc::new(Mutex::new(None));
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        {
            let lost = lost.clone();
            device.set_device_lost_callback(move |reason, msg| {
                if let Ok(mut l) = lost.lock() {
                    *l = Some(format!("{reason:?}: {msg}"));
                }
            });
            let un = uncaptured.clone();
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                if let Ok(mut u) = un.lock() {
                    u.push(e.to_string());
                }
            }));
        }
        // The adapter the device came from and the features it was created with decide
        // the kernels, for an application's device as for Tessera's own.
        let adapter = device.adapter_info();
        let features = device.features();
        let limits = device.limits();
        let caps = capabilities((adapter.subgroup_min_size, adapter.subgroup_max_size), features, &limits);
        let device_type = format!("{:?}", adapter.device_type);
        let matmul = super::autotune::MatmulConfig::default_for(crate::kernels::matmul::prefer_direct(&device_type));
        let cpu = adapter.device_type == wgpu::DeviceType::Cpu && !cfg!(target_arch = "wasm32");
        let counters = Arc::new(Counters::default());
        let mut ctx = GpuContext {
            caps: ShaderCaps {
                native_f16: caps.shader_f16,
                max_workgroups: caps.max_compute_workgroups_per_dimension,
                direct_matmul: matmul.direct,
                matmul_tile: (matmul.tm, matmul.tn),
                tiled_vec4: !matmul.direct && matmul.vec4,
                implicit_gemm: !matmul.direct,
                max_binding: caps.max_storage_buffer_binding_size,
                subgroup_min: 0,
                wide_loads: false,
                no_avx512: false,
                texture_rows: 0,
            },
            info: DeviceInfo {
                name: adapter.name.clone(),
                backend: format!("{:?}", adapter.backend),
                device_type,
                driver: format!("{} {}", adapter.driver, adapter.driver_info).trim().to_string(),
                forced_fallback,
                capabilities: caps,
                placement: "the application's own wgpu device (Device::from_wgpu)".into(),
                unrequested: Vec::new(),
            },
            pool: BufferPool::new(counters.clone()),
            counters,
            pipelines: Mutex::new(Pipelines::default()),
            max_pipelines: crate::device::DEFAULT_MAX_PIPELINES,
            plans: Default::default(),
            lost,
            uncaptured,
            invalid_kernel: None,
            // Attention fused on native CPU adapters, where the register-tiled kernel
            // (`attention_wide.wgsl`) beats the composition (lavapipe, the tuner's probe:
            // 3.4 against 5.7 ms; MiniLM's batch of 32 sentences 61 dispatches against
            // 78), and composed elsewhere.
            fused_attention: cpu,
            serial: adapter.backend == wgpu::Backend::Gl,
            device,
            queue,
        };
        ctx.feature_paths(None);
        ctx
    }

    /// For an application's device: list what its adapter offers that it was created
    /// without and Tessera would use (`DeviceInfo::unrequested`), and warn if any.
    pub fn note_unrequested(&mut self) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            self.info.unrequested = unrequested(&self.device);
            if !self.info.unrequested.is_empty() {
                log::warn!(
                    "tessera: the wgpu device on {} was created without {}, which its adapter offers; Tessera \
                     runs slower kernels on it. Create it with tessera::Device::wgpu_requirements(&adapter).",
                    self.info.name,
                    self.info.unrequested.join(", ")
                );
            }
        }
    }

    /// The kernel paths that the device's features and its adapter's kind allow: on
    /// native CPU adapters wide loads (`SHADER_INT64`) and operand textures
    /// (`texture_operands`, else `TESSERA_TEXTURE_OPERANDS`, else on); on any native
    /// adapter with `SUBGROUP`, subgroup kernels.
    fn feature_paths(&mut self, texture_operands: Option<bool>) {
        self.caps.wide_loads = self.info.device_type == "Cpu"
            && self.device.features().contains(wgpu::Features::SHADER_INT64)
            && !cfg!(target_arch = "wasm32")
            && std::env::var("TESSERA_WIDE_LOADS").as_deref() != Ok("0");
        self.caps.no_avx512 = self.caps.wide_loads && !host_has_avx512();
        // Lavapipe fetches texels without its loop over the SIMD lanes: the wide matmul
        // reads operands copied into textures (2-core Zen 3, 704x1536x384 with the
        // copies: 20 against 44 GFLOP/s in the kernel lab). Only where every input a
        // kernel may have (`Device::max_kernel_inputs`) can be a texture of either kind
        // (lavapipe: 32 storage buffers, 36 storage and 37 sampled textures a stage).
        self.caps.texture_rows = 0;
        #[cfg(not(target_arch = "wasm32"))]
        {
            let limits = self.device.limits();
            let wanted = texture_operands.unwrap_or(std::env::var("TESSERA_TEXTURE_OPERANDS").as_deref() != Ok("0"));
            if self.caps.wide_loads
                && wanted
                && limits.max_texture_dimension_2d >= crate::kernels::TEXTURE_WIDTH
                && limits.max_storage_textures_per_shader_stage.min(limits.max_sampled_textures_per_shader_stage)
                    >= limits.max_storage_buffers_per_shader_stage.min(64)
            {
                self.caps.texture_rows = limits.max_texture_dimension_2d;
            }
        }
        #[cfg(target_arch = "wasm32")]
        let _ = texture_operands;
        // Subgroup kernels on native backends only: browsers want `enable subgroups;`,
        // which naga's front-end (and so wgpu's native path) refuses.
        let c = &self.info.capabilities;
        self.caps.subgroup_min = 0;
        if c.subgroups && !cfg!(target_arch = "wasm32") && std::env::var("TESSERA_SUBGROUPS").as_deref() != Ok("0") {
            self.caps.subgroup_min = c.subgroup_min_size;
        }
    }

    /// Hold this while using the device where the backend needs serialising (GL).
    pub fn exclusive(&self) -> Option<std::sync::MutexGuard<'static, ()>> {
        self.serial.then(gl_lock)
    }

    /// `Err(DeviceLost)` once the device is gone.
    pub fn check_alive(&self) -> Result<()> {
        match self.lost.lock().ok().and_then(|l| l.clone()) {
            Some(reason) => Err(Error::DeviceLost(reason)),
            None => Ok(()),
        }
    }

    /// Errors wgpu reported outside any scope since the last call.
    pub fn take_uncaptured(&self, context: &str) -> Result<()> {
        let errs: Vec<String> = self.uncaptured.lock().map(|mut u| std::mem::take(&mut *u)).unwrap_or_default();
        if errs.is_empty() {
            Ok(())
        } else {
            Err(Error::Gpu { context: context.into(), message: errs.join("; ") })
        }
    }

    /// A storage buffer holding `bytes` (a multiple of 4).
    pub fn upload(&self, bytes: &[u8]) -> Result<GpuStorage> {
        let _serial = self.exclusive();
        let buffer = self.pool.get(&self.device, bytes.len() as u64, STORAGE)?;
        if !bytes.is_empty() {
            self.queue.write_buffer(buffer.buffer(), 0, bytes);
        }
        Ok(GpuStorage { buffer: Arc::new(buffer), checks: Vec::new() })
    }

    /// The compiled pipeline for `source`, from the cache or compiled now. `trusted`
    /// kernels are compiled without runtime bounds checks.
    ///
    /// A newly compiled pipeline comes with the validation error scope that watched its
    /// compilation (`None` on a cache hit): the caller pops it at once and awaits the
    /// result later, so a kernel that does not compile is reported by name.
    pub fn pipeline(
        &self,
        label: &str,
        source: &str,
        trusted: bool,
    ) -> (Arc<wgpu::ComputePipeline>, Option<wgpu::ErrorScopeGuard>) {
        if let Some(p) = self.cached_pipeline(source) {
            return (p, None);
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let broken;
        let source = match &self.invalid_kernel {
            Some(hook) if label.contains(hook.as_str()) => {
                broken = format!("{source}\nfn tessera_invalid_for_testing() {{ let x: u32 = 1.5; }}\n");
                broken.as_str()
            }
            _ => source,
        };
        if let Some(dir) = std::env::var_os("TESSERA_DUMP_SHADERS") {
            // Debugging aid: every compiled kernel's WGSL, named by its label (`-2`, `-3`, ...
            // for further kernels of one label with other sources).
            let name: String =
                label.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '-' }).collect();
            let _ = std::fs::create_dir_all(&dir);
            for k in 1.. {
                let file = if k == 1 { format!("{name}.wgsl") } else { format!("{name}-{k}.wgsl") };
                let path = std::path::Path::new(&dir).join(file);
                match std::fs::read_to_string(&path) {
                    Ok(old) if old == source => break,
                    Ok(_) => continue,
                    Err(_) => {
                        let _ = std::fs::write(path, source);
                        break;
                    }
                }
            }
        }
        let desc = wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(source.into()) };
        // TESSERA_CHECKED=1 compiles every kernel with bounds checks (for debugging).
        let module = if trusted && std::env::var("TESSERA_CHECKED").as_deref() != Ok("1") {
            // SAFETY: the kernel's own indexing keeps every access in range (KernelSpec::trusted).
            unsafe { self.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        } else {
            self.device.create_shader_module(desc)
        };
        let p = Arc::new(self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            // Every kernel writes its workgroup memory before reading it (shaders/README.md),
            // so none is zeroed first. On GL, where naga emits the zeroing as shader code,
            // it made llvmpipe's compiles up to 14x slower (tests/ops reductions: 31 -> 2.3 s).
            compilation_options: wgpu::PipelineCompilationOptions {
                zero_initialize_workgroup_memory: false,
                ..Default::default()
            },
            cache: None,
        }));
        self.counters.add(Counter::Pipelines, 1);
        if let Ok(mut c) = self.pipelines.lock() {
            c.insert(source, p.clone(), self.max_pipelines);
        }
        (p, Some(scope))
    }

    /// The cached pipeline for `source`, if any (a hit counted).
    pub fn cached_pipeline(&self, source: &str) -> Option<Arc<wgpu::ComputePipeline>> {
        let p = self.pipelines.lock().ok().and_then(|mut c| c.get(source))?;
        self.counters.add(Counter::PipelineHits, 1);
        Some(p)
    }

    /// Threads that may compile pipelines at once: one on GL, whose use is serialised.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn compile_threads(&self) -> usize {
        if self.serial {
            1
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    /// Forget a cached pipeline (one that failed to compile).
    pub fn evict_pipeline(&self, source: &str) {
        if let Ok(mut c) = self.pipelines.lock() {
            c.by_source.remove(source);
        }
    }

    /// Destroy the wgpu device, as a driver reset would (test hook).
    pub fn destroy(&self) {
        if let Ok(mut l) = self.lost.lock() {
            l.get_or_insert_with(|| "Destroyed: the device was destroyed (Device::lose_for_testing)".into());
        }
        self.device.destroy();
    }

    /// Map `buffers` for reading and return their bytes (first `len` bytes of each).
    pub async fn map_read(&self, buffers: &[(&wgpu::Buffer, u64)]) -> Result<Vec<Vec<u8>>> {
        // In a page, `as_uint8array` is the mapping itself: one copy into wasm memory,
        // where dereferencing the view copies it there first and `to_vec` again.
        #[cfg(target_arch = "wasm32")]
        return self.map_read_with(buffers, |v| v.as_uint8array().to_vec()).await;
        #[cfg(not(target_arch = "wasm32"))]
        self.map_read_with(buffers, |v| v.to_vec()).await
    }

    /// Map `buffers` for reading and return `take` of each one's view (its first `len`
    /// bytes): a page takes a JavaScript copy, never passing through wasm memory.
    pub async fn map_read_with<T>(
        &self,
        buffers: &[(&wgpu::Buffer, u64)],
        take: impl Fn(&wgpu::BufferView) -> T,
    ) -> Result<Vec<T>> {
        let mut receivers = Vec::new();
        let mapped = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for (b, len) in buffers {
            let (tx, rx) = futures_channel::oneshot::channel();
            let len = (*len).max(4);
            let mapped = mapped.clone();
            b.map_async(wgpu::MapMode::Read, 0..len, move |r| {
                mapped.fetch_add(1, std::sync::atomic::Ordering::Release);
                let _ = tx.send(r);
            });
            receivers.push(rx);
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let lost = |e: wgpu::PollError| match e {
                wgpu::PollError::Timeout => Error::Gpu { context: "readback".into(), message: e.to_string() },
                _ => Error::DeviceLost(e.to_string()),
            };
            // Poll, yielding the core, for a short while before sleeping on the fence: a
            // small readback (a loss, one element) is done within tens of microseconds,
            // while a thread put to sleep and woken by the driver's queue thread takes
            // longer than that to run again (about 0.2 ms a round trip on lavapipe here).
            let spin = std::time::Instant::now();
            let done = || mapped.load(std::sync::atomic::Ordering::Acquire) == buffers.len();
            while !done() && spin.elapsed() < *READBACK_SPIN {
                self.device.poll(wgpu::PollType::Poll).map_err(lost)?;
                std::thread::yield_now();
            }
            if !done() {
                self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(lost)?;
            }
        }
        let mut out = Vec::new();
        for (rx, (b, len)) in receivers.into_iter().zip(buffers) {
            match rx.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.check_alive()?;
                    return Err(Error::Gpu { context: "readback map".into(), message: e.to_string() });
                }
                Err(_) => {
                    self.check_alive()?;
                    return Err(Error::DeviceLost("readback callback dropped".into()));
                }
            }
            let len = (*len).max(4);
            let bytes = {
                let view = b
                    .get_mapped_range(0..len)
                    .map_err(|e| Error::Gpu { context: "readback view".into(), message: e.to_string() })?;
                take(&view)
            };
            b.unmap();
            out.push(bytes);
        }
        Ok(out)
    }
}

/// A device's compiled pipelines by WGSL source, with the tick of each one's last use.
#[derive(Default)]
struct Pipelines {
    by_source: HashMap<String, (Arc<wgpu::ComputePipeline>, u64)>,
    tick: u64,
}

impl Pipelines {
    fn get(&mut self, source: &str) -> Option<Arc<wgpu::ComputePipeline>> {
        self.tick += 1;
        let (p, used) = self.by_source.get_mut(source)?;
        *used = self.tick;
        Some(p.clone())
    }

    /// Keep `p` under `source`, first dropping the least recently used pipelines while
    /// `max` are kept (a scan: this runs once per compilation, which costs far more).
    fn insert(&mut self, source: &str, p: Arc<wgpu::ComputePipeline>, max: usize) {
        while self.by_source.len() >= max.max(1) && !self.by_source.contains_key(source) {
            let oldest = self.by_source.iter().min_by_key(|(_, (_, used))| *used).map(|(s, _)| s.clone());
            match oldest {
                Some(s) => self.by_source.remove(&s),
                None => break,
            };
        }
        self.tick += 1;
        self.by_source.insert(source.to_string(), (p, self.tick));
    }
}
