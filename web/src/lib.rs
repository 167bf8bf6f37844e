//! Tessera in the browser: the JavaScript API over the `tessera` crate, built with
//! wasm-bindgen for `wasm32-unknown-unknown` and WebGPU.
//!
//! ```js
//! import init, { Tessera, Tensor } from "tessera-web";
//! await init();                        // load the .wasm
//! const tessera = await Tessera.init(); // request a WebGPU adapter and device
//! const x = Tensor.fromArray(new Float32Array([1, 2, 3, 4]), [2, 2]);
//! console.log(await x.matmul(x).relu().toArray());
//! ```
//!
//! Every failure reaches JavaScript as an `Error` whose message says what went wrong:
//! shape and dtype errors as the op is called, GPU and device-loss errors when the
//! promise of a read settles. Nothing here unwraps; a panic hook reports anything that
//! slips through to the console.
//!
//! Files: [`tensor`] (the `Tensor` class), [`files`] (safetensors, GGUF, MNIST),
//! [`embed`] (the sentence embedder), [`train`] (model, optimiser, training step),
//! [`onnx`] (ONNX models).

pub mod embed;
pub mod files;
pub mod js;
pub mod onnx;
pub mod tensor;
pub mod train;

use std::cell::RefCell;
use tessera::{Device, DeviceOptions};
use wasm_bindgen::prelude::*;

thread_local! {
    /// The device every constructor uses, set by `Tessera.init()`.
    static DEVICE: RefCell<Option<Device>> = const { RefCell::new(None) };
}

/// The current device, or the error telling the caller to initialise first.
pub(crate) fn device() -> Result<Device, JsError> {
    DEVICE
        .with(|d| d.borrow().clone())
        .ok_or_else(|| JsError::new("Tessera is not initialised: call `await Tessera.init()` first"))
}

/// An engine error as a JavaScript `Error`.
pub(crate) fn js_err(e: tessera::Error) -> JsError {
    JsError::new(&e.to_string())
}

#[wasm_bindgen(start)]
fn start() {
    console_error_panic_hook::set_once();
}

/// The engine's entry point: `await Tessera.init()` opens a WebGPU device.
#[wasm_bindgen]
pub struct Tessera {
    info: tessera::DeviceInfo,
}

const NO_WEBGPU: &str = "WebGPU is not available here: navigator.gpu is missing. \
Use a browser with WebGPU (Chrome or Edge 113+, Safari 26+, Firefox 141+ on Windows), \
serve the page from https:// or http://localhost (WebGPU needs a secure context), \
or start Chromium with --enable-unsafe-webgpu";

#[wasm_bindgen]
impl Tessera {
    /// Open a device and make it the current one: WebGPU on a hardware adapter, else
    /// the CPU backend (wasm with SIMD), which is faster than a software adapter
    /// (SwiftShader) and runs where `navigator.gpu` is missing. `backend` says which
    /// was chosen and `placement` why.
    /// Options: `{ backend: "webgpu" | "cpu" }` overrides the choice (`"webgpu"` takes
    /// any adapter, software or not, and fails without one); `{ forceFallback: true }`
    /// uses every WebGPU fallback path (packed f16, no subgroups) even where the adapter
    /// has the feature; `{ matmul: "tiled" | "direct" }` picks the WebGPU matmul kernel.
    /// Calling it again (for example after the device was lost) opens a fresh device.
    #[wasm_bindgen(unchecked_return_type = "Promise<Tessera>")]
    pub async fn init(
        #[wasm_bindgen(unchecked_param_type = "InitOptions | undefined")] options: JsValue,
    ) -> Result<Tessera, JsError> {
        let wanted = js::get_str(&options, "backend");
        let gpu = js::get(&js::get(&js_sys::global().into(), "navigator"), "gpu");
        let no_gpu = gpu.is_undefined() || gpu.is_null();
        let cpu = match wanted.as_deref() {
            Some("cpu") => Some("chosen ({ backend: \"cpu\" })"),
            Some("webgpu") if no_gpu => return Err(JsError::new(NO_WEBGPU)),
            Some("webgpu") => None,
            Some(other) => return Err(JsError::new(&format!("backend: {other:?} is not \"webgpu\" or \"cpu\""))),
            None if no_gpu => Some("navigator.gpu is missing (no WebGPU here); the CPU backend runs"),
            None => None,
        };
        if let Some(why) = cpu {
            let device = Device::cpu();
            let mut info = device.info().clone();
            info.placement = why.into();
            DEVICE.with(|d| *d.borrow_mut() = Some(device));
            return Ok(Tessera { info });
        }
        let tiled_matmul = match js::get_str(&options, "matmul").as_deref() {
            None => None,
            Some("tiled") => Some(true),
            Some("direct") => Some(false),
            Some(other) => return Err(JsError::new(&format!("matmul: {other:?} is not \"tiled\" or \"direct\""))),
        };
        let opts = DeviceOptions {
            // "gpu": the best adapter, software or not; none: a hardware adapter, else
            // the CPU backend.
            adapter: wanted.map(|_| "gpu".to_string()),
            force_fallback: js::get_bool(&options, "forceFallback").unwrap_or(false),
            tiled_matmul,
            ..DeviceOptions::default()
        };
        let device = Device::new_async(opts).await.map_err(|e| {
            JsError::new(&format!(
                "{e}. The browser has navigator.gpu but gave no usable adapter: check chrome://gpu, \
                 enable WebGPU (chrome://flags/#enable-unsafe-webgpu), or try another browser"
            ))
        })?;
        let info = device.info().clone();
        DEVICE.with(|d| *d.borrow_mut() = Some(device));
        Ok(Tessera { info })
    }

    /// `"webgpu"` or `"cpu"`: where tensors live and kernels run.
    #[wasm_bindgen(getter)]
    pub fn backend(&self) -> String {
        if self.info.backend == "Cpu" { "cpu" } else { "webgpu" }.into()
    }

    /// Why this backend was chosen: "SwiftShader is a software adapter; the CPU backend
    /// is faster here", "navigator.gpu is missing ...", or how it was asked for.
    #[wasm_bindgen(getter)]
    pub fn placement(&self) -> String {
        self.info.placement.clone()
    }

    /// The adapter: `{ name, backend, deviceType, driver, forcedFallback }`.
    #[wasm_bindgen(getter, unchecked_return_type = "AdapterInfo")]
    pub fn adapter(&self) -> JsValue {
        js::object(&[
            ("name", self.info.name.as_str().into()),
            ("backend", self.info.backend.as_str().into()),
            ("deviceType", self.info.device_type.as_str().into()),
            ("driver", self.info.driver.as_str().into()),
            ("forcedFallback", self.info.forced_fallback.into()),
        ])
    }

    /// What the device can do: `{ f16, subgroups, subgroupMinSize, subgroupMaxSize,
    /// timestampQuery, limits: { maxStorageBufferBindingSize, maxBufferSize, ... } }`.
    /// `f16: false` means f16 tensors use the packed path (pairs of halves in a `u32`).
    #[wasm_bindgen(getter, unchecked_return_type = "Capabilities")]
    pub fn capabilities(&self) -> JsValue {
        let c = &self.info.capabilities;
        let limits = js::object(&[
            ("maxStorageBufferBindingSize", (c.max_storage_buffer_binding_size as f64).into()),
            ("maxBufferSize", (c.max_buffer_size as f64).into()),
            ("maxStorageBuffersPerShaderStage", c.max_storage_buffers_per_shader_stage.into()),
            ("maxComputeWorkgroupsPerDimension", c.max_compute_workgroups_per_dimension.into()),
            ("maxComputeInvocationsPerWorkgroup", c.max_compute_invocations_per_workgroup.into()),
            ("maxComputeWorkgroupStorageSize", c.max_compute_workgroup_storage_size.into()),
        ]);
        js::object(&[
            ("f16", c.shader_f16.into()),
            ("subgroups", c.subgroups.into()),
            ("subgroupMinSize", c.subgroup_min_size.into()),
            ("subgroupMaxSize", c.subgroup_max_size.into()),
            ("timestampQuery", c.timestamp_query.into()),
            ("limits", limits),
        ])
    }

    /// Engine counters since the page loaded: kernels dispatched, submits, pipelines
    /// compiled, buffers allocated, bytes in use and their peak.
    #[wasm_bindgen(unchecked_return_type = "EngineStats")]
    pub fn stats() -> JsValue {
        let s = tessera::stats();
        js::object(&[
            ("kernelsDispatched", (s.kernels_dispatched as f64).into()),
            ("submits", (s.submits as f64).into()),
            ("realizations", (s.realizations as f64).into()),
            ("pipelinesCompiled", (s.pipelines_compiled as f64).into()),
            ("buffersAllocated", (s.buffers_allocated as f64).into()),
            ("bytesInUse", (s.bytes_in_use as f64).into()),
            ("peakBytes", (s.peak_bytes as f64).into()),
        ])
    }

    /// Test hook: destroy the current WebGPU device, as a driver reset or a lost tab
    /// would. Reads in flight reject with a device-lost error; call `Tessera.init()`
    /// to continue on a fresh device.
    #[wasm_bindgen(js_name = loseDeviceForTesting)]
    pub fn lose_device_for_testing() -> Result<(), JsError> {
        device()?.lose_for_testing();
        Ok(())
    }
}

#[wasm_bindgen(typescript_custom_section)]
const TS_TYPES: &str = r#"
/** Options of `Tessera.init`. */
export interface InitOptions { backend?: "webgpu" | "cpu"; forceFallback?: boolean; matmul?: "tiled" | "direct" }
/** The adapter `Tessera.init` opened. */
export interface AdapterInfo { name: string; backend: string; deviceType: string; driver: string; forcedFallback: boolean }
/** What the device can do; `f16: false` means the packed f16 path runs. */
export interface Capabilities {
  f16: boolean; subgroups: boolean; subgroupMinSize: number; subgroupMaxSize: number; timestampQuery: boolean;
  limits: { maxStorageBufferBindingSize: number; maxBufferSize: number; maxStorageBuffersPerShaderStage: number;
            maxComputeWorkgroupsPerDimension: number; maxComputeInvocationsPerWorkgroup: number; maxComputeWorkgroupStorageSize: number };
}
/** Engine counters. */
export interface EngineStats { kernelsDispatched: number; submits: number; realizations: number; pipelinesCompiled: number;
  buffersAllocated: number; bytesInUse: number; peakBytes: number }
/** Geometry of `conv2d`, `convTranspose2d`: numbers or `[rows, cols]`. */
export interface ConvOptions { stride?: number | [number, number]; padding?: number | [number, number];
  dilation?: number | [number, number]; groups?: number; outputPadding?: number | [number, number] }
/** Options of `OnnxModel.load`. */
export interface OnnxLoadOptions { weights?: "f16" | "q8_0" | "q4_0" }
/** A declared ONNX input or output (symbolic dimensions are strings, unknown ones null). */
export interface OnnxValueInfo { name: string; type: string | null; shape: (number | string | null)[] }
/** Element types. */
export type DType = "f32" | "f16" | "i32" | "u32" | "bool" | "q8_0" | "q4_0";
"#;
