//! Neural-network modules, losses and initialisers built from Tensor ops.
//!
//! A [`Module`] exposes its state as named [`Slot`]s: trainable parameters and buffers
//! (running statistics). Names follow PyTorch's state-dict convention (`0.weight`,
//! `encoder.layers.1.linear1.bias`), so a module saves to and loads from safetensors.
//! [`Layer`] adds `forward` for modules that map one tensor to one tensor.

pub mod attention;
pub mod conv;
pub mod init;
pub mod layers;
pub mod loss;

pub use attention::{MultiHeadAttention, TransformerEncoderLayer};
pub use conv::{AvgPool2d, BatchNorm2d, Conv2d, ConvTranspose2d, MaxPool2d};
pub use layers::{Activation, Dropout, Embedding, Flatten, LayerNorm, Linear, RMSNorm, Sequential};

use crate::{Error, Result, Tensor};
use std::collections::HashMap;

/// One named tensor of a module's state.
pub struct Slot<'a> {
    /// Full state-dict name.
    pub name: String,
    /// The tensor; an optimiser replaces it with the updated value.
    pub tensor: &'a mut Tensor,
    /// Trainable parameter (`true`) or buffer such as a running mean (`false`).
    pub trainable: bool,
}

/// `prefix.name`, or `name` when the prefix is empty.
/// The trainable `weight` and optional `bias` slots most layers have.
pub(crate) fn weight_and_bias<'a>(
    prefix: &str,
    weight: &'a mut Tensor,
    bias: Option<&'a mut Tensor>,
    out: &mut Vec<Slot<'a>>,
) {
    out.push(Slot { name: join(prefix, "weight"), tensor: weight, trainable: true });
    if let Some(b) = bias {
        out.push(Slot { name: join(prefix, "bias"), tensor: b, trainable: true });
    }
}

pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// `Send + Sync` on native targets; nothing in the browser, where GPU handles are not
/// thread-safe (wasm is single-threaded).
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSync: Send + Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + Sync> MaybeSync for T {}
/// `Send + Sync` on native targets; nothing in the browser.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSync {}
#[cfg(target_arch = "wasm32")]
impl<T> MaybeSync for T {}

/// Something with named state.
pub trait Module: MaybeSync {
    /// Push every slot of this module (and its children) under `prefix`.
    fn slots<'a>(&'a mut self, prefix: &str, out: &mut Vec<Slot<'a>>);

    /// Switch between training and evaluation behaviour (dropout, batch norm).
    fn set_training(&mut self, _training: bool) {}

    /// Trainable parameters with their names.
    fn named_parameters(&mut self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        self.slots("", &mut v);
        v.into_iter().filter(|s| s.trainable).map(|s| (s.name, s.tensor.clone())).collect()
    }

    /// Every slot (parameters and buffers) with its name.
    fn state_dict(&mut self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        self.slots("", &mut v);
        v.into_iter().map(|s| (s.name, s.tensor.clone())).collect()
    }

    /// Replace every slot with the tensor of the same name and shape from `state`.
    /// Missing names or shape mismatches are errors; nothing changes unless all fit.
    fn load_state_dict(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        let mut v = Vec::new();
        self.slots("", &mut v);
        for s in &v {
            let t = state
                .get(&s.name)
                .ok_or_else(|| Error::Format { format: "state dict", detail: format!("no tensor named {}", s.name) })?;
            if t.dims() != s.tensor.dims() || t.dtype() != s.tensor.dtype() {
                return Err(Error::Format {
                    format: "state dict",
                    detail: format!(
                        "{}: stored {} {:?}, module holds {} {:?}",
                        s.name,
                        t.dtype(),
                        t.dims(),
                        s.tensor.dtype(),
                        s.tensor.dims()
                    ),
                });
            }
        }
        for s in v {
            let t = state[&s.name].clone();
            *s.tensor = if s.trainable { t.detach().requires_grad() } else { t.detach() };
        }
        Ok(())
    }

    /// Number of trainable scalars.
    fn num_parameters(&mut self) -> usize {
        self.named_parameters().iter().map(|(_, t)| t.numel()).sum()
    }
}

/// A module that maps one tensor to one tensor.
pub trait Layer: Module {
    /// Apply to `x`.
    fn forward(&self, x: &Tensor) -> Tensor;
}
