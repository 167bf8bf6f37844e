//! The wgpu backend: every kernel is WGSL rendered by [`crate::kernels`] and run through
//! wgpu (Vulkan, Metal, DX12, GL, and WebGPU in the browser).
//!
//! - `context`: adapter choice, device creation, error capture, the pipeline cache,
//!   uploads and readback;
//! - `checks`: bounds checks a realisation still owes, read once however many
//!   realisations inherit them;
//! - `pool`: buffers by size class, under an optional memory budget;
//! - `plan`: replay of rendered schedules by graph structure;
//! - `execute`: render (or replay), plan buffers and dispatches, encode, one submit;
//! - `interop`: application buffers wrapped in place, and the kernel that writes a
//!   tensor into an application's storage texture in the producer's submit;
//! - [`autotune`]: the matmul kernel, attention and convolution choices per adapter.

pub mod autotune;
mod checks;
mod context;
pub(crate) mod execute;
pub(crate) mod interop;
pub(crate) mod plan;
pub(crate) mod pool;

pub(crate) use checks::PendingCheck;
pub(crate) use context::{list_adapters, requirements, GpuContext, GpuStorage, STORAGE};
