//! BERT (Hugging Face's `BertModel`) and a sentence embedder on top of it: mean pooling
//! over the attention mask, then L2 normalisation, as sentence-transformers'
//! all-MiniLM-L6-v2 does.

use crate::io::safetensors::{self, TensorFile};
use crate::nn::{Embedding, LayerNorm, Linear, Module};
use crate::{DType, Device, Error, Result, Tensor};

/// The fields of a Hugging Face `config.json` that BERT needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
}

impl BertConfig {
    /// Parse `config.json`.
    pub fn from_json(text: &str) -> Result<BertConfig> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::Format { format: "config.json", detail: e.to_string() })?;
        let int = |k: &str| {
            v.get(k).and_then(|x| x.as_u64()).map(|x| x as usize).ok_or_else(|| Error::Format {
                format: "config.json",
                detail: format!("missing or non-integer {k:?}"),
            })
        };
        let act = v.get("hidden_act").and_then(|x| x.as_str()).unwrap_or("gelu");
        if act != "gelu" {
            return Err(Error::Format { format: "config.json", detail: format!("hidden_act {act:?} (only gelu)") });
        }
        let c = BertConfig {
            vocab_size: int("vocab_size")?,
            hidden_size: int("hidden_size")?,
            num_hidden_layers: int("num_hidden_layers")?,
            num_attention_heads: int("num_attention_heads")?,
            intermediate_size: int("intermediate_size")?,
            max_position_embeddings: int("max_position_embeddings")?,
            type_vocab_size: int("type_vocab_size").unwrap_or(2),
            layer_norm_eps: v.get("layer_norm_eps").and_then(|x| x.as_f64()).unwrap_or(1e-12),
        };
        if c.num_attention_heads == 0 || c.hidden_size % c.num_attention_heads != 0 {
            return Err(Error::Format { format: "config.json", detail: "hidden_size must divide into heads".into() });
        }
        Ok(c)
    }

    /// Number of parameters of the encoder (embeddings and layers; no pooler).
    pub fn parameter_count(&self) -> usize {
        let h = self.hidden_size;
        let emb = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h;
        let layer = 4 * (h * h + h) + 2 * h * self.intermediate_size + self.intermediate_size + h + 4 * h;
        emb + self.num_hidden_layers * layer
    }
}

/// The GPU memory a forward pass needs, by part, for a batch and sequence length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Bytes of weights.
    pub weights: u64,
    /// Bytes of activations live at once (an upper bound).
    pub activations: u64,
    /// The largest single buffer (weights or activations).
    pub largest_buffer: u64,
}

impl MemoryEstimate {
    /// Weights plus activations.
    pub fn total(&self) -> u64 {
        self.weights + self.activations
    }
}

/// Estimate the memory of a forward pass at `batch` × `seq` with weights in `dtype`.
pub fn estimate_memory(c: &BertConfig, batch: usize, seq: usize, dtype: DType) -> MemoryEstimate {
    let h = c.hidden_size as u64;
    let linear = (4 * h * h + 2 * h * c.intermediate_size as u64) * c.num_hidden_layers as u64;
    let other = c.parameter_count() as u64 - linear;
    let wbytes = |n: u64| dtype.storage_bytes(n as usize).div_ceil(4) * 4;
    let weights = wbytes(linear) + 4 * other;
    let (b, s) = (batch as u64, seq as u64);
    let tokens = b * s * h * 4;
    let inter = b * s * c.intermediate_size as u64 * 4;
    let scores = b * c.num_attention_heads as u64 * s * s * 4;
    // Residual stream, q/k/v, context, FFN activations and two score tensors.
    let activations = 6 * tokens + 2 * inter + 2 * scores;
    let largest = [c.vocab_size as u64 * h * 4, inter, scores, tokens].into_iter().max().unwrap_or(0);
    MemoryEstimate { weights, activations, largest_buffer: largest }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_ln: LayerNorm,
    inter: Linear,
    out: Linear,
    out_ln: LayerNorm,
}

/// A BERT encoder.
pub struct BertModel {
    pub config: BertConfig,
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    emb_ln: LayerNorm,
    layers: Vec<Layer>,
}

impl BertModel {
    /// Build from a loaded safetensors file (names as Hugging Face's `BertModel`; a
    /// `bert.` prefix is accepted).
    pub fn from_file(config: BertConfig, file: &mut TensorFile) -> Result<BertModel> {
        let names: Vec<String> = file.tensors.keys().cloned().collect();
        for n in names {
            if let Some(stripped) = n.strip_prefix("bert.") {
                if let Some(t) = file.tensors.remove(&n) {
                    file.tensors.insert(stripped.to_string(), t);
                }
            }
        }
        let eps = config.layer_norm_eps;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            layers.push(Layer {
                query: Linear::load(file, &format!("{p}.attention.self.query"))?,
                key: Linear::load(file, &format!("{p}.attention.self.key"))?,
                value: Linear::load(file, &format!("{p}.attention.self.value"))?,
                attn_out: Linear::load(file, &format!("{p}.attention.output.dense"))?,
                attn_ln: LayerNorm::load(file, &format!("{p}.attention.output.LayerNorm"), eps)?,
                inter: Linear::load(file, &format!("{p}.intermediate.dense"))?,
                out: Linear::load(file, &format!("{p}.output.dense"))?,
                out_ln: LayerNorm::load(file, &format!("{p}.output.LayerNorm"), eps)?,
            });
        }
        Ok(BertModel {
            word: Embedding::load(file, "embeddings.word_embeddings")?,
            position: Embedding::load(file, "embeddings.position_embeddings")?,
            token_type: Embedding::load(file, "embeddings.token_type_embeddings")?,
            emb_ln: LayerNorm::load(file, "embeddings.LayerNorm", eps)?,
            layers,
            config,
        })
    }

    /// Every Linear layer, for quantisation: `(name, layer)`.
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v = Vec::new();
        for l in &mut self.layers {
            v.extend([&mut l.query, &mut l.key, &mut l.value, &mut l.attn_out, &mut l.inter, &mut l.out]);
        }
        v
    }

    /// Hidden states `[batch, seq, hidden]` for token `ids` `[batch, seq]` (i32) and an
    /// attention `mask` `[batch, seq]` (f32, 1 for tokens, 0 for padding).
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Tensor {
        let (b, s) = (ids.dims()[0], ids.dims().get(1).copied().unwrap_or(0));
        let c = &self.config;
        let (h, nh) = (c.hidden_size, c.num_attention_heads);
        let hd = h / nh;
        let d = ids.device();
        let pos = Tensor::arange(0.0, s as f64, 1.0, DType::I32, d);
        let types = Tensor::zeros([b, s], DType::I32, d);
        let x = self.word.forward(ids) + self.position.forward(&pos) + self.token_type.forward(&types);
        let mut x = self.emb_ln.forward(&x);
        // Additive mask: 0 where attended, a large negative number on padding.
        let bias = ((mask - 1.0) * 1e9).reshape([b, 1, 1, s]);
        let scale = 1.0 / (hd as f32).sqrt();
        for l in &self.layers {
            let heads = |t: Tensor, perm: &[usize]| t.reshape([b, s, nh, hd]).permute(perm);
            let q = heads(l.query.forward(&x), &[0, 2, 1, 3]);
            let k = heads(l.key.forward(&x), &[0, 2, 3, 1]);
            let v = heads(l.value.forward(&x), &[0, 2, 1, 3]);
            let p = (q.matmul(&k) * scale + &bias).softmax(-1);
            let ctx = p.matmul(&v).permute(&[0, 2, 1, 3]).reshape([b, s, h]);
            x = l.attn_ln.forward(&(l.attn_out.forward(&ctx) + &x));
            let ff = l.out.forward(&l.inter.forward(&x).gelu());
            x = l.out_ln.forward(&(ff + &x));
        }
        x
    }
}

impl Module for BertModel {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        v.extend(self.word.named_parameters());
        v.extend(self.position.named_parameters());
        v.extend(self.token_type.named_parameters());
        v.extend(self.emb_ln.named_parameters());
        for l in &self.layers {
            for m in [&l.query, &l.key, &l.value, &l.attn_out, &l.inter, &l.out] {
                v.extend(m.named_parameters());
            }
            v.extend(l.attn_ln.named_parameters());
            v.extend(l.out_ln.named_parameters());
        }
        v
    }
}

/// Mean of `hidden` `[b, s, h]` over the tokens where `mask` `[b, s]` is 1, then L2
/// normalised: sentence embeddings `[b, h]`.
pub fn mean_pool_normalize(hidden: &Tensor, mask: &Tensor) -> Tensor {
    let m = mask.unsqueeze(-1);
    let summed = (hidden * &m).sum(&[1], false);
    let count = m.sum(&[1], false).maximum_scalar(1e-9);
    let mean = summed / count;
    let norm = mean.square().sum(&[-1], true).sqrt().maximum_scalar(1e-12);
    mean / norm
}

/// Load all-MiniLM-L6-v2 (or any BERT checkpoint) from a directory holding
/// `model.safetensors` and `config.json`.
#[cfg(not(target_arch = "wasm32"))]
pub fn load_dir(dir: &std::path::Path, device: &Device) -> Result<BertModel> {
    let io = |e: std::io::Error, p: &std::path::Path| Error::Io { path: p.display().to_string(), message: e.to_string() };
    let cfg_path = dir.join("config.json");
    let config = BertConfig::from_json(&std::fs::read_to_string(&cfg_path).map_err(|e| io(e, &cfg_path))?)?;
    let mut file = safetensors::load(dir.join("model.safetensors"), device)?;
    BertModel::from_file(config, &mut file)
}

/// Sentence embeddings: tokenizer, BERT, pooling.
#[cfg(not(target_arch = "wasm32"))]
pub struct SentenceEmbedder {
    pub model: BertModel,
    tokenizer: tokenizers::Tokenizer,
    /// Longest sequence kept (tokens beyond it are truncated).
    pub max_tokens: usize,
}

#[cfg(not(target_arch = "wasm32"))]
impl SentenceEmbedder {
    /// Load from a model directory (`model.safetensors`, `config.json`, `tokenizer.json`).
    pub fn load(dir: impl AsRef<std::path::Path>, device: &Device) -> Result<SentenceEmbedder> {
        let dir = dir.as_ref();
        let model = load_dir(dir, device)?;
        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| Error::Format { format: "tokenizer.json", detail: format!("{}: {e}", tok_path.display()) })?;
        // Batches are padded here, with a mask; truncation is ours too.
        tokenizer.with_padding(None);
        let _ = tokenizer.with_truncation(None);
        let max_tokens = 256.min(model.config.max_position_embeddings);
        Ok(SentenceEmbedder { model, tokenizer, max_tokens })
    }

    /// Token ids of each text, with [CLS] and [SEP], truncated to `max_tokens`.
    pub fn tokenize(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        texts
            .iter()
            .map(|t| {
                let enc = self
                    .tokenizer
                    .encode(*t, true)
                    .map_err(|e| Error::Format { format: "tokenizer", detail: e.to_string() })?;
                let mut ids = enc.get_ids().to_vec();
                if ids.len() > self.max_tokens {
                    let sep = *ids.last().unwrap_or(&102);
                    ids.truncate(self.max_tokens - 1);
                    ids.push(sep);
                }
                Ok(ids)
            })
            .collect()
    }

    /// Embeddings `[n, hidden]` of pre-tokenised sequences, padded into one batch.
    pub fn embed_ids(&self, ids: &[Vec<u32>]) -> Tensor {
        let d = self.model.word_device();
        let b = ids.len();
        let s = ids.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut flat = vec![0i32; b * s];
        let mut mask = vec![0f32; b * s];
        for (i, row) in ids.iter().enumerate() {
            for (j, &t) in row.iter().enumerate() {
                flat[i * s + j] = t as i32;
                mask[i * s + j] = 1.0;
            }
        }
        let ids_t = Tensor::from_slice(&flat, [b, s], d);
        let mask_t = Tensor::from_slice(&mask, [b, s], d);
        mean_pool_normalize(&self.model.forward(&ids_t, &mask_t), &mask_t)
    }

    /// Embeddings of `texts`, one `Vec` of `hidden` floats each.
    pub async fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let ids = self.tokenize(texts)?;
        let e = self.embed_ids(&ids);
        let h = self.model.config.hidden_size;
        let v = e.to_vec::<f32>().await?;
        Ok(v.chunks(h).map(|c| c.to_vec()).collect())
    }

    /// Blocking [`SentenceEmbedder::embed`].
    pub fn embed_blocking(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        pollster::block_on(self.embed(texts))
    }
}

impl BertModel {
    /// The device the weights live on.
    pub fn word_device(&self) -> &Device {
        self.word.weight.device()
    }
}
