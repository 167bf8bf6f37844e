//! Multi-head attention and the transformer encoder layer.

use super::{join, Activation, Dropout, Layer, LayerNorm, Linear, Module, Slot};
use crate::{Device, Tensor};

/// Multi-head self- or cross-attention with separate q/k/v/out projections.
#[derive(Clone, Debug)]
pub struct MultiHeadAttention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub out_proj: Linear,
    pub heads: usize,
}

impl MultiHeadAttention {
    /// `dim` split over `heads` (must divide).
    pub fn new(dim: usize, heads: usize, seed: u64, dev: &Device) -> MultiHeadAttention {
        MultiHeadAttention {
            q_proj: Linear::new(dim, dim, true, seed, dev),
            k_proj: Linear::new(dim, dim, true, seed + 1, dev),
            v_proj: Linear::new(dim, dim, true, seed + 2, dev),
            out_proj: Linear::new(dim, dim, true, seed + 3, dev),
            heads: heads.max(1),
        }
    }

    /// Attend from `x` `[B, T, D]` to `context` `[B, S, D]` (self-attention when the same
    /// tensor). `mask` is a Bool keep-mask broadcastable to `[B, H, T, S]`.
    pub fn attend(&self, x: &Tensor, context: &Tensor, mask: Option<&Tensor>, causal: bool) -> Tensor {
        let d = x.dims();
        if d.len() != 3 {
            return x.reshape(vec![0, 0, 0, 0]); // carries a shape error
        }
        let (b, t, dim) = (d[0], d[1], d[2]);
        let s = context.dims().get(1).copied().unwrap_or(0);
        let h = self.heads;
        let hd = dim / h;
        let split = |y: Tensor, n: usize| y.reshape(vec![b, n, h, hd]).permute(&[0, 2, 1, 3]);
        let q = split(self.q_proj.forward(x), t);
        let k = split(self.k_proj.forward(context), s);
        let v = split(self.v_proj.forward(context), s);
        let o = Tensor::scaled_dot_product_attention(&q, &k, &v, mask, causal);
        self.out_proj.forward(&o.permute(&[0, 2, 1, 3]).reshape(vec![b, t, dim]))
    }
}

impl Module for MultiHeadAttention {
    fn slots<'a>(&'a mut self, prefix: &str, out: &mut Vec<Slot<'a>>) {
        self.q_proj.slots(&join(prefix, "q_proj"), out);
        self.k_proj.slots(&join(prefix, "k_proj"), out);
        self.v_proj.slots(&join(prefix, "v_proj"), out);
        self.out_proj.slots(&join(prefix, "out_proj"), out);
    }
}

impl Layer for MultiHeadAttention {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.attend(x, x, None, false)
    }
}

/// A transformer encoder layer as PyTorch's `TransformerEncoderLayer`: self-attention
/// and a feed-forward block, each with a residual, dropout and layer norm (after the
/// block by default, before it with `norm_first`).
#[derive(Clone, Debug)]
pub struct TransformerEncoderLayer {
    pub self_attn: MultiHeadAttention,
    pub linear1: Linear,
    pub linear2: Linear,
    pub norm1: LayerNorm,
    pub norm2: LayerNorm,
    pub dropout: Dropout,
    pub activation: Activation,
    pub norm_first: bool,
    /// Hide future positions (a decoder-only language model).
    pub causal: bool,
}

impl TransformerEncoderLayer {
    /// `dim` wide, `heads` heads, a feed-forward of `ff` units.
    pub fn new(dim: usize, heads: usize, ff: usize, dropout: f64, seed: u64, dev: &Device) -> TransformerEncoderLayer {
        TransformerEncoderLayer {
            self_attn: MultiHeadAttention::new(dim, heads, seed, dev),
            linear1: Linear::new(dim, ff, true, seed + 10, dev),
            linear2: Linear::new(ff, dim, true, seed + 11, dev),
            norm1: LayerNorm::new(dim, 1e-5, dev),
            norm2: LayerNorm::new(dim, 1e-5, dev),
            dropout: Dropout::new(dropout, seed + 12),
            activation: Activation::Relu,
            norm_first: false,
            causal: false,
        }
    }

    /// Apply to `x` `[B, T, D]` with an optional keep-mask.
    pub fn forward_masked(&self, x: &Tensor, mask: Option<&Tensor>) -> Tensor {
        let attn = |h: &Tensor| self.dropout.forward(&self.self_attn.attend(h, h, mask, self.causal));
        let ff =
            |h: &Tensor| self.dropout.forward(&self.linear2.forward(&self.activation.apply(&self.linear1.forward(h))));
        if self.norm_first {
            let x = x.add(&attn(&self.norm1.forward(x)));
            x.add(&ff(&self.norm2.forward(&x)))
        } else {
            let x = self.norm1.forward(&x.add(&attn(x)));
            self.norm2.forward(&x.add(&ff(&x)))
        }
    }
}

impl Module for TransformerEncoderLayer {
    fn slots<'a>(&'a mut self, prefix: &str, out: &mut Vec<Slot<'a>>) {
        self.self_attn.slots(&join(prefix, "self_attn"), out);
        self.linear1.slots(&join(prefix, "linear1"), out);
        self.linear2.slots(&join(prefix, "linear2"), out);
        self.norm1.slots(&join(prefix, "norm1"), out);
        self.norm2.slots(&join(prefix, "norm2"), out);
    }

    fn set_training(&mut self, training: bool) {
        self.dropout.set_training(training);
    }
}

impl Layer for TransformerEncoderLayer {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.forward_masked(x, None)
    }
}
