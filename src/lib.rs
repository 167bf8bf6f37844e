//! # Tessera
//!
//! A tensor engine in which every kernel is a WGSL compute shader run through wgpu, so the
//! same code runs on Vulkan, Metal, DX12, GL and WebGPU in the browser.
//!
//! Tensors are lazy: ops record a graph, checked at once for shape and dtype errors (which
//! are carried, with the caller's location, to the realisation). Asking for values
//! schedules the graph into fused kernels and runs them: on a GPU, every dispatch in one
//! command encoder and one submit; on the CPU backend (what `Device::new()` picks
//! without a hardware GPU), fused loops over chunks on every core.
//!
//! Training reads like PyTorch (`tessera::prelude` has the usual imports): modules with
//! `#[derive(Module)]`, `loss::cross_entropy`, `opt.step(&mut model, &loss)`,
//! `LrScheduler`, `autocast(DType::F16)`.
//!
//! ```no_run
//! use tessera::{Device, Tensor, DType};
//! let dev = Device::new()?;
//! let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0, -4.0], [2, 2], &dev);
//! let w = Tensor::randn([2, 3], 42, &dev);
//! let y = (x.matmul(&w) + 1.0).relu().sum_dim(-1);
//! println!("{y}");
//! let values: Vec<f32> = y.to_vec_blocking()?;
//! # Ok::<(), tessera::Error>(())
//! ```

// On wasm32, wgpu handles are not Send (the page is single-threaded); the Arcs that
// share them natively are still the right shape there.
#![cfg_attr(target_arch = "wasm32", allow(clippy::arc_with_non_send_sync))]

// `#[derive(Module)]` names `::tessera`, which inside this crate is the crate itself.
extern crate self as tessera;

pub mod autocast;
pub mod autograd;
#[cfg(not(target_arch = "wasm32"))]
pub mod compress;
pub mod device;
mod display;
#[cfg(not(target_arch = "wasm32"))]
pub mod dist;
pub mod dtype;
pub mod error;
pub mod explain;
pub mod graph;
pub mod interop;
pub mod io;
pub mod kernels;
pub mod models;
pub mod nn;
pub mod onnx;
pub mod ops;
pub mod optim;
pub mod prelude;
pub mod profile;
pub mod quant;
pub mod reference;
pub mod rng;
pub mod shape;
pub mod stats;
pub mod tensor;

/// The wgpu this crate is built on (for [`Device::from_wgpu`] and [`Device::wgpu`]).
pub use ::wgpu;
pub use autocast::autocast;
pub use autograd::{no_grad, Gradients};
pub use device::{AdapterDescription, Capabilities, Device, DeviceInfo, DeviceOptions};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use half::f16;
pub use shape::Shape;
pub use stats::{stats, Stats};
#[cfg(not(target_arch = "wasm32"))]
pub use tensor::read_all_blocking;
pub use tensor::{read_all, Tensor};

/// README's Rust examples, compiled and run by `cargo test --doc` so what README shows
/// keeps working.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeExamples;
