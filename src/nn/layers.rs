//! Dense layers: Linear, LayerNorm, RMSNorm, Embedding, Dropout, activations, Flatten
//! and Sequential.

use super::{init, Layer, Module, Visitor, VisitorMut};
use crate::io::safetensors::TensorFile;
use crate::{DType, Device, Result, Tensor};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// `y = x W^T + b`, with `W` stored `[out, in]` as PyTorch stores it. The weight may be
/// f32, f16 (activations are cast to f16 for the product) or Q8_0/Q4_0 (dequantised as
/// the matmul loads its tiles; the product is f32). Inside [`crate::autocast`] an f32
/// weight is cast to the autocast dtype for the product (mixed precision, f32 master
/// weights).
#[derive(Clone, Debug, Module)]
pub struct Linear {
    /// The prefix this layer was loaded under (empty for layers built with `new`).
    pub name: String,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A trainable layer with PyTorch's default initialisation.
    pub fn new(in_features: usize, out_features: usize, bias: bool, seed: u64, dev: &Device) -> Linear {
        let weight = init::torch_default(&[out_features, in_features], in_features, seed, dev).requires_grad();
        let bias = bias.then(|| init::torch_default(&[out_features], in_features, seed ^ 0xb1a5, dev).requires_grad());
        Linear { name: String::new(), weight, bias }
    }

    /// Take `<prefix>.weight` and, if present, `<prefix>.bias` from a file.
    pub fn load(file: &mut TensorFile, prefix: &str) -> Result<Linear> {
        let weight = file.take(&format!("{prefix}.weight"))?;
        let bias = file.tensors.remove(&format!("{prefix}.bias"));
        Ok(Linear { name: prefix.to_string(), weight, bias })
    }

    /// Apply to `x` of shape `[.., in]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let wdt = self.weight.dtype();
        let half = wdt == DType::F16 || (crate::autocast::dtype() == Some(DType::F16) && wdt == DType::F32);
        // Flatten leading axes: one 2-D product instead of a batch of them.
        let (lead, inner) = x.dims().split_at(x.rank().saturating_sub(1));
        let x2 = if x.rank() > 2 { x.reshape(vec![lead.iter().product(), inner[0]]) } else { x.clone() };
        // A block-quantised weight whose input axis was padded to whole blocks: pad the
        // input with zeros to match.
        let kw = self.weight.dims().get(1).copied().unwrap_or(0);
        let x2 = match inner.first() {
            Some(&k) if wdt.is_quantized() && kw > k && kw - k < 32 => x2.pad(&[(0, 0), (0, kw - k)], 0.0),
            _ => x2,
        };
        let y = if half {
            let w = if wdt == DType::F16 { self.weight.clone() } else { self.weight.cast(DType::F16) };
            let xh = if x2.dtype() == DType::F16 { x2.clone() } else { x2.cast(DType::F16) };
            xh.matmul(&w.t()).cast(x.dtype())
        } else {
            x2.matmul(&self.weight.t())
        };
        let y = match &self.bias {
            Some(b) => y.add(b),
            None => y,
        };
        if x.rank() > 2 {
            let mut d = lead.to_vec();
            d.push(self.weight.dims()[0]);
            y.reshape(d)
        } else {
            y
        }
    }
}

impl Layer for Linear {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        Linear::forward(self, x)
    }
}

/// Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) * weight + bias`.
#[derive(Clone, Debug, Module)]
pub struct LayerNorm {
    pub name: String,
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
    /// A trainable layer over `dim` features (weight 1, bias 0).
    pub fn new(dim: usize, eps: f64, dev: &Device) -> LayerNorm {
        LayerNorm {
            name: String::new(),
            weight: Tensor::ones([dim], DType::F32, dev).requires_grad(),
            bias: Tensor::zeros([dim], DType::F32, dev).requires_grad(),
            eps,
        }
    }

    /// Take `<prefix>.weight` and `<prefix>.bias` from a file.
    pub fn load(file: &mut TensorFile, prefix: &str, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm {
            name: prefix.to_string(),
            weight: file.take(&format!("{prefix}.weight"))?,
            bias: file.take(&format!("{prefix}.bias"))?,
            eps,
        })
    }

    /// Normalise `x` over its last axis.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        x.layer_norm(Some(&self.weight), Some(&self.bias), self.eps)
    }
}

impl Layer for LayerNorm {
    fn forward(&self, x: &Tensor) -> Tensor {
        LayerNorm::forward(self, x)
    }
}

/// RMS normalisation over the last axis with a learned scale.
#[derive(Clone, Debug, Module)]
pub struct RMSNorm {
    pub weight: Tensor,
    pub eps: f64,
}

impl RMSNorm {
    /// A trainable layer over `dim` features (weight 1).
    pub fn new(dim: usize, eps: f64, dev: &Device) -> RMSNorm {
        RMSNorm { weight: Tensor::ones([dim], DType::F32, dev).requires_grad(), eps }
    }
}

impl Layer for RMSNorm {
    fn forward(&self, x: &Tensor) -> Tensor {
        x.rms_norm(Some(&self.weight), self.eps)
    }
}

/// A lookup table `[num, dim]`: ids of any shape give `[.., dim]`. The table may be
/// quantised; rows come out f32. With `sparse` (PyTorch's `sparse=True`), the table
/// gets a sparse gradient (the rows a batch touched) for [`crate::optim::SparseAdam`]
/// or [`crate::optim::Adagrad`], and ids are read on the host ([`Embedding::lookup`]).
#[derive(Clone, Debug)]
pub struct Embedding {
    pub name: String,
    pub weight: Tensor,
    pub sparse: bool,
    pub pending: super::sparse::PendingLookups,
}

impl Embedding {
    /// A trainable table initialised from N(0, 1), as PyTorch does.
    pub fn new(num: usize, dim: usize, seed: u64, dev: &Device) -> Embedding {
        Embedding::from_weight(init::normal(&[num, dim], 1.0, seed, dev).requires_grad())
    }

    /// A table over `weight` (dense gradients).
    pub fn from_weight(weight: Tensor) -> Embedding {
        Embedding { name: String::new(), weight, sparse: false, pending: Default::default() }
    }

    /// The same table with sparse gradients.
    pub fn sparse(mut self) -> Embedding {
        self.sparse = true;
        self
    }

    /// Take `<prefix>.weight` from a file.
    pub fn load(file: &mut TensorFile, prefix: &str) -> Result<Embedding> {
        let mut e = Embedding::from_weight(file.take(&format!("{prefix}.weight"))?);
        e.name = prefix.to_string();
        Ok(e)
    }

    /// Rows of the table for integer `ids`. A sparse table reads the ids back (blocking,
    /// native only); [`Embedding::lookup`] takes them from the host.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Tensor {
        let dim = self.weight.dims().last().copied().unwrap_or(0);
        let mut shape = ids.dims().to_vec();
        if self.sparse && crate::autograd::grad_enabled() {
            let r = super::sparse::read_ids(ids).and_then(|v| {
                let v: Vec<u32> = v.iter().map(|&i| u32::try_from(i).unwrap_or(u32::MAX)).collect();
                super::sparse::sparse_lookup(&self.weight, &v, &shape, &self.pending)
            });
            return self.weight.lift(r);
        }
        shape.push(dim);
        self.weight.index_select(0, &ids.flatten()).reshape(shape)
    }

    /// Rows for ids given on the host, shaped `[shape.., dim]`; the gradient is a sorted
    /// segment sum (sparse with `sparse`). Out-of-range ids are an error.
    #[track_caller]
    pub fn lookup(&self, ids: &[u32], shape: &[usize]) -> Tensor {
        let r = if shape.iter().product::<usize>() != ids.len() {
            Err(crate::Error::InvalidArgument {
                op: "embedding",
                detail: format!("{} ids cannot take the shape {shape:?}", ids.len()),
                location: std::panic::Location::caller(),
            })
        } else if self.sparse && crate::autograd::grad_enabled() {
            super::sparse::sparse_lookup(&self.weight, ids, shape, &self.pending)
        } else {
            crate::ops::segment::GatherPlan::new(ids, self.weight.dims()[0], self.weight.device()).map(|p| {
                let mut dims = shape.to_vec();
                dims.push(self.weight.dims()[1]);
                self.weight.gather_rows(&p).reshape(dims)
            })
        };
        self.weight.lift(r)
    }
}

impl Module for Embedding {
    fn visit(&self, v: &mut dyn Visitor) {
        v.tensor("weight", &self.weight, super::Role::Parameter);
    }
    fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>) {
        v.tensor("weight", &mut self.weight, super::Role::Parameter);
    }
    fn own_sparse_lookups(&self) -> Vec<super::sparse::SparseLookup> {
        self.pending.take()
    }
}

impl Layer for Embedding {
    fn forward(&self, x: &Tensor) -> Tensor {
        Embedding::forward(self, x)
    }
}

/// Inverted dropout with a counter-based RNG: each call draws a fresh seeded mask, so
/// a run is reproducible and its RNG state is one counter ([`Dropout::counter`]).
#[derive(Debug)]
pub struct Dropout {
    pub p: f64,
    pub seed: u64,
    counter: AtomicU64,
    training: AtomicBool,
}

impl Dropout {
    /// Drop with probability `p`; masks derive from `seed`.
    pub fn new(p: f64, seed: u64) -> Dropout {
        Dropout { p: p.clamp(0.0, 1.0), seed, counter: AtomicU64::new(0), training: AtomicBool::new(true) }
    }

    /// How many masks have been drawn (the RNG state to checkpoint).
    pub fn counter(&self) -> u64 {
        self.counter.load(Ordering::Relaxed)
    }

    /// Restore the RNG state.
    pub fn set_counter(&self, c: u64) {
        self.counter.store(c, Ordering::Relaxed);
    }
}

impl Clone for Dropout {
    fn clone(&self) -> Self {
        Dropout {
            p: self.p,
            seed: self.seed,
            counter: AtomicU64::new(self.counter()),
            training: AtomicBool::new(self.training.load(Ordering::Relaxed)),
        }
    }
}

impl Module for Dropout {
    fn visit(&self, _v: &mut dyn Visitor) {}
    fn visit_mut<'a>(&'a mut self, _v: &mut dyn VisitorMut<'a>) {}
    fn set_training(&mut self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
    }
}

impl Layer for Dropout {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        if !self.training.load(Ordering::Relaxed) || self.p == 0.0 {
            return x.clone();
        }
        let c = self.counter.fetch_add(1, Ordering::Relaxed);
        let seed = self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(c);
        let keep = Tensor::rand(x.dims().to_vec(), seed, x.device()).ge_scalar(self.p);
        x.mul(&keep.cast(x.dtype())).mul_scalar(1.0 / (1.0 - self.p).max(1e-12))
    }
}

/// Element-wise activations as layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Tanh,
    Sigmoid,
}

impl Activation {
    /// Apply to `x`.
    pub fn apply(self, x: &Tensor) -> Tensor {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Silu => x.silu(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
        }
    }
}

impl Module for Activation {
    fn visit(&self, _v: &mut dyn Visitor) {}
    fn visit_mut<'a>(&'a mut self, _v: &mut dyn VisitorMut<'a>) {}
}

impl Layer for Activation {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        self.apply(x)
    }
}

/// `[N, ...]` to `[N, prod(...)]`.
#[derive(Clone, Copy, Debug, Default, Module)]
pub struct Flatten;

impl Layer for Flatten {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let n = x.dims().first().copied().unwrap_or(1);
        x.reshape(vec![n, x.numel() / n.max(1)])
    }
}

/// Layers applied in order; slots are named by position (`0.weight`, `2.bias`).
#[derive(Default)]
pub struct Sequential {
    pub layers: Vec<Box<dyn Layer>>,
}

impl Sequential {
    /// An empty stack.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Append a layer (builder style).
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, layer: impl Layer + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }
}

/// Layers named by position, as PyTorch's `Sequential` (`0.weight`, `2.bias`).
impl Module for Sequential {
    fn visit(&self, v: &mut dyn Visitor) {
        self.layers.visit(v);
    }
    fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>) {
        self.layers.visit_mut(v);
    }
}

impl Layer for Sequential {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.layers.iter().fold(x.clone(), |h, l| l.forward(&h))
    }
}
