//! Multi-head attention and the transformer encoder layer.

use super::{init, Activation, Dropout, Layer, LayerNorm, Linear, Module};
use crate::{DType, Device, Tensor};

/// Multi-head self- or cross-attention, laid out as PyTorch's `nn.MultiheadAttention`
/// so its state dicts load as they are: the q, k and v projections stacked in
/// `in_proj_weight` `[3·dim, dim]` and `in_proj_bias` `[3·dim]`, then `out_proj`.
/// Inputs are batch-first, `[batch, seq, dim]` (PyTorch's `batch_first=True`).
#[derive(Clone, Debug, Module)]
pub struct MultiHeadAttention {
    pub in_proj_weight: Tensor,
    pub in_proj_bias: Option<Tensor>,
    pub out_proj: Linear,
    pub heads: usize,
}

impl MultiHeadAttention {
    /// `dim` split over `heads`, which must be at least 1 and divide `dim`; otherwise
    /// the layer carries an error that every forward pass returns.
    #[track_caller]
    pub fn new(dim: usize, heads: usize, seed: u64, dev: &Device) -> MultiHeadAttention {
        let loc = std::panic::Location::caller();
        let in_proj_weight = if heads == 0 || !dim.is_multiple_of(heads) {
            let detail = format!("heads ({heads}) must be at least 1 and divide dim ({dim})");
            let e = crate::Error::InvalidArgument { op: "MultiHeadAttention", detail, location: loc };
            Tensor::failed(e, DType::F32, dev)
        } else {
            // PyTorch: xavier_uniform_ over the stacked [3·dim, dim] matrix.
            init::xavier_uniform(&[3 * dim, dim], seed, dev).requires_grad()
        };
        MultiHeadAttention {
            in_proj_weight,
            in_proj_bias: Some(Tensor::zeros([3 * dim], DType::F32, dev).requires_grad()),
            out_proj: Linear::new(dim, dim, true, seed + 3, dev),
            heads,
        }
    }

    /// Attend from `x` `[B, T, D]` to `context` `[B, S, D]` (self-attention when the same
    /// tensor). `mask` is a Bool keep-mask or a float bias broadcastable to `[B, H, T, S]`.
    #[track_caller]
    pub fn attend(&self, x: &Tensor, context: &Tensor, mask: Option<&Tensor>, causal: bool) -> Tensor {
        let loc = std::panic::Location::caller();
        let bad_rank = |t: &Tensor, what: &str| {
            let e = crate::Error::Shape {
                op: "MultiHeadAttention",
                shapes: vec![t.dims().to_vec()],
                detail: format!("{what} must be [batch, seq, dim] (rank 3), got rank {}", t.rank()),
                location: loc,
            };
            Tensor::failed(e, t.dtype(), t.device())
        };
        if x.rank() != 3 {
            return bad_rank(x, "the query input");
        }
        if context.rank() != 3 {
            return bad_rank(context, "the key/value input");
        }
        if let Some(e) = self.in_proj_weight.error() {
            return Tensor::failed(e.clone(), x.dtype(), x.device());
        }
        let (b, t, dim) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let s = context.dims()[1];
        let h = self.heads;
        let hd = dim / h.max(1);
        let proj = |y: &Tensor, part: usize, parts: usize| {
            let w = self.in_proj_weight.narrow(0, part * dim, parts * dim);
            let b = self.in_proj_bias.as_ref().map(|b| b.narrow(0, part * dim, parts * dim));
            Linear { name: String::new(), weight: w, bias: b }.forward(y)
        };
        let split = |y: Tensor, n: usize| y.reshape(vec![b, n, h, hd]).permute(&[0, 2, 1, 3]);
        let (q, k, v) = if x.id() == context.id() {
            // Self-attention: one product for q, k and v.
            let qkv = proj(x, 0, 3);
            (qkv.narrow(-1, 0, dim), qkv.narrow(-1, dim, dim), qkv.narrow(-1, 2 * dim, dim))
        } else {
            let kv = proj(context, 1, 2);
            (proj(x, 0, 1), kv.narrow(-1, 0, dim), kv.narrow(-1, dim, dim))
        };
        let (q, k, v) = (split(q, t), split(k, s), split(v, s));
        let o = Tensor::scaled_dot_product_attention(&q, &k, &v, mask, causal);
        self.out_proj.forward(&o.permute(&[0, 2, 1, 3]).reshape(vec![b, t, dim]))
    }
}

impl Layer for MultiHeadAttention {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.attend(x, x, None, false)
    }
}

/// A transformer encoder layer as PyTorch's `TransformerEncoderLayer`: self-attention
/// and a feed-forward block, each with a residual, dropout and layer norm (after the
/// block by default, before it with `norm_first`). Its state dict has PyTorch's names
/// (`self_attn.in_proj_weight`, `linear1.weight`, `norm2.bias`, ...). Batch-first.
#[derive(Clone, Debug, Module)]
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

impl Layer for TransformerEncoderLayer {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.forward_masked(x, None)
    }
}
