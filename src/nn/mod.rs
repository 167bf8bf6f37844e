//! Neural-network modules built from Tensor ops. Parameters are named as safetensors
//! files name them (`<prefix>.weight`, `<prefix>.bias`), so a module loads straight
//! from a checkpoint.

use crate::io::safetensors::TensorFile;
use crate::{DType, Result, Tensor};

/// Something with named parameters.
pub trait Module {
    /// Every parameter, with its full name.
    fn named_parameters(&self) -> Vec<(String, Tensor)>;
}

/// `y = x W^T + b`, with `W` stored `[out, in]` as PyTorch stores it. The weight may be
/// f32, f16 (activations are cast to f16 for the product) or Q8_0/Q4_0 (dequantised as
/// the matmul loads its tiles; the product is f32).
#[derive(Clone, Debug)]
pub struct Linear {
    pub name: String,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// Take `<prefix>.weight` and, if present, `<prefix>.bias` from a file.
    pub fn load(file: &mut TensorFile, prefix: &str) -> Result<Linear> {
        let weight = file.take(&format!("{prefix}.weight"))?;
        let bias = file.tensors.remove(&format!("{prefix}.bias"));
        Ok(Linear { name: prefix.to_string(), weight, bias })
    }

    /// Apply to `x` of shape `[.., in]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let y = if self.weight.dtype() == DType::F16 && x.dtype() != DType::F16 {
            x.cast(DType::F16).matmul(&self.weight.t()).cast(x.dtype())
        } else {
            x.matmul(&self.weight.t())
        };
        match &self.bias {
            Some(b) => y.add(b),
            None => y,
        }
    }
}

impl Module for Linear {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![(format!("{}.weight", self.name), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push((format!("{}.bias", self.name), b.clone()));
        }
        v
    }
}

/// Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) * weight + bias`.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub name: String,
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f64,
}

impl LayerNorm {
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
        let mu = x.mean(&[-1], true);
        let xc = x - &mu;
        let var = xc.square().mean(&[-1], true);
        xc * (var + self.eps as f32).rsqrt() * &self.weight + &self.bias
    }
}

impl Module for LayerNorm {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![(format!("{}.weight", self.name), self.weight.clone()), (format!("{}.bias", self.name), self.bias.clone())]
    }
}

/// A lookup table `[num, dim]`: ids of any shape give `[.., dim]`. The table may be
/// quantised; rows come out f32.
#[derive(Clone, Debug)]
pub struct Embedding {
    pub name: String,
    pub weight: Tensor,
}

impl Embedding {
    /// Take `<prefix>.weight` from a file.
    pub fn load(file: &mut TensorFile, prefix: &str) -> Result<Embedding> {
        Ok(Embedding { name: prefix.to_string(), weight: file.take(&format!("{prefix}.weight"))? })
    }

    /// Rows of the table for integer `ids`.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Tensor {
        let dim = self.weight.dims().last().copied().unwrap_or(0);
        let mut shape = ids.dims().to_vec();
        shape.push(dim);
        self.weight.index_select(0, &ids.flatten()).reshape(shape)
    }
}

impl Module for Embedding {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![(format!("{}.weight", self.name), self.weight.clone())]
    }
}
