//! BERT (Hugging Face's `BertModel`) and a sentence embedder on top of it: mean pooling
//! over the attention mask, then L2 normalisation, as sentence-transformers'
//! all-MiniLM-L6-v2 does.

#[cfg_attr(target_arch = "wasm32", allow(unused_imports))]
use crate::io::safetensors::{self, TensorFile};
use crate::nn::{Embedding, LayerNorm, Linear, Module, Visitor, VisitorMut};
use crate::{DType, Device, Error, Result, Tensor};

/// The fields of a Hugging Face `config.json` that BERT needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// The original `config.json` text (saved with quantised models).
    pub json: String,
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
            v.get(k)
                .and_then(|x| x.as_u64())
                .map(|x| x as usize)
                .ok_or_else(|| Error::Format { format: "config.json", detail: format!("missing or non-integer {k:?}") })
        };
        let act = v.get("hidden_act").and_then(|x| x.as_str()).unwrap_or("gelu");
        if act != "gelu" {
            return Err(Error::Format { format: "config.json", detail: format!("hidden_act {act:?} (only gelu)") });
        }
        let c = BertConfig {
            json: text.to_string(),
            vocab_size: int("vocab_size")?,
            hidden_size: int("hidden_size")?,
            num_hidden_layers: int("num_hidden_layers")?,
            num_attention_heads: int("num_attention_heads")?,
            intermediate_size: int("intermediate_size")?,
            max_position_embeddings: int("max_position_embeddings")?,
            type_vocab_size: int("type_vocab_size").unwrap_or(2),
            layer_norm_eps: v.get("layer_norm_eps").and_then(|x| x.as_f64()).unwrap_or(1e-12),
        };
        if c.num_attention_heads == 0 || !c.hidden_size.is_multiple_of(c.num_attention_heads) {
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

/// Check a forward pass at `batch` × `seq` fits `device` before anything is loaded:
/// every buffer within the binding limit and the total within `max_buffer_size` (or
/// the device's memory budget: `DeviceOptions::memory_limit` or `TESSERA_MEMORY_LIMIT`,
/// in bytes or with a K/M/G suffix as the device reads it). Returns the estimate, or
/// `Error::Limit`.
pub fn check_memory(c: &BertConfig, batch: usize, seq: usize, dtype: DType, device: &Device) -> Result<MemoryEstimate> {
    let budget = device.memory_limit();
    check_memory_within(c, batch, seq, dtype, device, budget)
}

/// [`check_memory`] against an explicit byte budget for weights plus activations.
pub fn check_memory_within(
    c: &BertConfig,
    batch: usize,
    seq: usize,
    dtype: DType,
    device: &Device,
    budget: Option<u64>,
) -> Result<MemoryEstimate> {
    let est = estimate_memory(c, batch, seq, dtype);
    let caps = device.capabilities();
    if est.largest_buffer > caps.max_storage_buffer_binding_size {
        return Err(Error::Limit {
            what: format!("BERT at batch {batch} × seq {seq}: its largest buffer"),
            needed: est.largest_buffer,
            limit: caps.max_storage_buffer_binding_size,
        });
    }
    if let Some(limit) = budget {
        if est.total() > limit {
            return Err(Error::Limit {
                what: format!(
                    "BERT in {dtype} at batch {batch} × seq {seq} (weights {} B + activations {} B)",
                    est.weights, est.activations
                ),
                needed: est.total(),
                limit,
            });
        }
    }
    Ok(est)
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

#[derive(Clone)]
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
#[derive(Clone)]
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
        self.forward_inner(ids, mask, None)
    }

    /// Importance of each Linear layer's input columns (in [`linears_mut`] order): the
    /// mean of the squared inputs over the unmasked tokens. Used to calibrate Q4_0.
    ///
    /// [`linears_mut`]: BertModel::linears_mut
    pub async fn input_importance(&self, ids: &Tensor, mask: &Tensor) -> Result<Vec<Vec<f32>>> {
        let mut inputs = Vec::new();
        let _ = self.forward_inner(ids, mask, Some(&mut inputs));
        let m = mask.unsqueeze(-1);
        let count = mask.sum_all().maximum_scalar(1.0);
        let stats: Vec<Tensor> = inputs.iter().map(|x| (x.square() * &m).sum(&[0, 1], false) / &count).collect();
        let vals = crate::tensor::read_all(&stats).await?;
        Ok(vals.into_iter().map(|v| v.into_iter().map(|x| x as f32 + 1e-8).collect()).collect())
    }

    /// Each Linear layer's inputs (in [`linears_mut`] order) on the unmasked tokens,
    /// as `[tokens, in]` row-major f32 values: calibration data for GPTQ.
    ///
    /// [`linears_mut`]: BertModel::linears_mut
    pub async fn linear_inputs(&self, ids: &Tensor, mask: &Tensor) -> Result<Vec<Vec<f32>>> {
        let mut inputs = Vec::new();
        let _ = self.forward_inner(ids, mask, Some(&mut inputs));
        let mut all = inputs.clone();
        all.push(mask.clone());
        let mut vals = crate::tensor::read_all(&all).await?;
        let keep = vals.pop().unwrap_or_default();
        Ok(inputs
            .iter()
            .zip(vals)
            .map(|(t, v)| {
                let width = t.dims().last().copied().unwrap_or(1).max(1);
                v.chunks(width)
                    .zip(&keep)
                    .filter(|(_, &m)| m != 0.0)
                    .flat_map(|(row, _)| row.iter().map(|&x| x as f32))
                    .collect()
            })
            .collect())
    }

    fn forward_inner(&self, ids: &Tensor, mask: &Tensor, mut collect: Option<&mut Vec<Tensor>>) -> Tensor {
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
        for l in &self.layers {
            let heads = |t: Tensor| t.reshape([b, s, nh, hd]).permute(&[0, 2, 1, 3]);
            let (q, k, v) = (heads(l.query.forward(&x)), heads(l.key.forward(&x)), heads(l.value.forward(&x)));
            // One attention kernel where the device runs it fused (the CPU backend), else
            // q k^T / sqrt(hd) + bias, softmax, @ v.
            let ctx = Tensor::scaled_dot_product_attention(&q, &k, &v, Some(&bias), false);
            let ctx = ctx.permute(&[0, 2, 1, 3]).reshape([b, s, h]);
            let attn_in = x.clone();
            x = l.attn_ln.forward(&(l.attn_out.forward(&ctx) + &x));
            let act = l.inter.forward(&x).gelu();
            let ff = l.out.forward(&act);
            if let Some(c) = collect.as_deref_mut() {
                // The same order as linears_mut: query, key, value, attn_out, inter, out.
                c.extend([attn_in.clone(), attn_in.clone(), attn_in, ctx.clone(), x.clone(), act.clone()]);
            }
            x = l.out_ln.forward(&(ff + &x));
        }
        x
    }
}

/// Hugging Face's names: each loaded layer carries its full path, so the children are
/// visited under those (`encoder.layer.3.attention.self.query.weight`).
impl Module for BertModel {
    fn visit(&self, v: &mut dyn Visitor) {
        for e in [&self.word, &self.position, &self.token_type] {
            v.module(&e.name, e);
        }
        v.module(&self.emb_ln.name, &self.emb_ln);
        for l in &self.layers {
            for m in [&l.query, &l.key, &l.value, &l.attn_out, &l.inter, &l.out] {
                v.module(&m.name, m);
            }
            v.module(&l.attn_ln.name, &l.attn_ln);
            v.module(&l.out_ln.name, &l.out_ln);
        }
    }

    fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>) {
        for e in [&mut self.word, &mut self.position, &mut self.token_type] {
            let n = e.name.clone();
            v.module(&n, e);
        }
        let n = self.emb_ln.name.clone();
        v.module(&n, &mut self.emb_ln);
        for l in &mut self.layers {
            for m in [&mut l.query, &mut l.key, &mut l.value, &mut l.attn_out, &mut l.inter, &mut l.out] {
                let n = m.name.clone();
                v.module(&n, m);
            }
            let n = l.attn_ln.name.clone();
            v.module(&n, &mut l.attn_ln);
            let n = l.out_ln.name.clone();
            v.module(&n, &mut l.out_ln);
        }
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

/// Generic English sentences used to calibrate Q4_0 scales when no others are given.
pub const CALIBRATION: [&str; 8] = [
    "The weather today is sunny with a light breeze.",
    "Stock markets fell sharply after the announcement.",
    "She plays the piano every evening after dinner.",
    "How do I reset my password?",
    "The library opens at nine in the morning.",
    "Researchers trained a neural network on images of cells.",
    "He ordered a coffee and a croissant.",
    "Rain is expected to continue through the weekend.",
];

/// Metadata key holding `config.json` in files Tessera saves.
pub const CONFIG_KEY: &str = "tessera.bert.config";

/// Read a directory's `config.json`.
#[cfg(not(target_arch = "wasm32"))]
pub fn read_config(dir: &std::path::Path) -> Result<BertConfig> {
    let p = dir.join("config.json");
    let text =
        std::fs::read_to_string(&p).map_err(|e| Error::Io { path: p.display().to_string(), message: e.to_string() })?;
    BertConfig::from_json(&text)
}

/// Load all-MiniLM-L6-v2 (or any BERT checkpoint) from a directory holding
/// `model.safetensors` and `config.json`.
#[cfg(not(target_arch = "wasm32"))]
pub fn load_dir(dir: &std::path::Path, device: &Device) -> Result<BertModel> {
    let config = read_config(dir)?;
    let mut file = safetensors::load(dir.join("model.safetensors"), device)?;
    BertModel::from_file(config, &mut file)
}

/// Save a model (any weight dtypes) as GGUF or safetensors, by the path's extension,
/// with its config in the metadata.
#[cfg(not(target_arch = "wasm32"))]
pub fn save(model: &BertModel, path: &std::path::Path) -> Result<()> {
    let params = model.clone().named_parameters();
    if path.extension().is_some_and(|e| e == "gguf") {
        let tensors = pollster::block_on(crate::io::gguf::tensors_to_data(&params))?;
        let file = crate::io::gguf::GgufFile {
            version: 3,
            metadata: vec![
                ("general.architecture".into(), crate::io::gguf::Value::String("bert".into())),
                (CONFIG_KEY.into(), crate::io::gguf::Value::String(model.config.json.clone())),
            ],
            tensors,
        };
        crate::io::gguf::write(path, &file)
    } else {
        let meta = std::collections::BTreeMap::from([(CONFIG_KEY.to_string(), model.config.json.clone())]);
        safetensors::save(path, &params, &meta)
    }
}

/// Load a model saved by [`save`] (GGUF or safetensors).
#[cfg(not(target_arch = "wasm32"))]
pub fn load_saved(path: &std::path::Path, device: &Device) -> Result<BertModel> {
    let missing = || Error::Format { format: "model file", detail: format!("{} has no {CONFIG_KEY}", path.display()) };
    let (config, mut file) = if path.extension().is_some_and(|e| e == "gguf") {
        let g = crate::io::gguf::read(path)?;
        let cfg = match g.get(CONFIG_KEY) {
            Some(crate::io::gguf::Value::String(s)) => BertConfig::from_json(s)?,
            _ => return Err(missing()),
        };
        (cfg, TensorFile { tensors: g.to_tensors(device)?, metadata: Default::default() })
    } else {
        let f = safetensors::load(path, device)?;
        (BertConfig::from_json(f.metadata.get(CONFIG_KEY).ok_or_else(missing)?)?, f)
    };
    BertModel::from_file(config, &mut file)
}

/// A `tokenizer.json` tokenizer as the embedder uses it: `[CLS] ... [SEP]`, truncated to
/// `max_tokens`, no padding (batches are padded with a mask).
pub struct TextTokenizer {
    tokenizer: tokenizers::Tokenizer,
    /// Longest sequence kept (tokens beyond it are truncated).
    pub max_tokens: usize,
}

impl TextTokenizer {
    /// From the bytes of a `tokenizer.json`.
    pub fn from_bytes(tokenizer_json: &[u8], max_tokens: usize) -> Result<TextTokenizer> {
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| Error::Format { format: "tokenizer.json", detail: e.to_string() })?;
        tokenizer.with_padding(None);
        let _ = tokenizer.with_truncation(None);
        Ok(TextTokenizer { tokenizer, max_tokens: max_tokens.max(2) })
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
}

/// Sentence embeddings: tokenizer, BERT, pooling.
pub struct SentenceEmbedder {
    pub model: BertModel,
    pub tokenizer: TextTokenizer,
}

impl SentenceEmbedder {
    /// Load from a model directory (`model.safetensors`, `config.json`, `tokenizer.json`).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(dir: impl AsRef<std::path::Path>, device: &Device) -> Result<SentenceEmbedder> {
        let dir = dir.as_ref();
        Self::from_model(load_dir(dir, device)?, &dir.join("tokenizer.json"))
    }

    /// An embedder over an already built model and a `tokenizer.json` file.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_model(model: BertModel, tok_path: &std::path::Path) -> Result<SentenceEmbedder> {
        let bytes = std::fs::read(tok_path)
            .map_err(|e| Error::Io { path: tok_path.display().to_string(), message: e.to_string() })?;
        Self::from_parts(model, &bytes)
            .map_err(|e| Error::Format { format: "tokenizer.json", detail: format!("{}: {e}", tok_path.display()) })
    }

    /// An embedder from the bytes of `config.json`, `model.safetensors` and
    /// `tokenizer.json` (what a page has after reading files or fetching them).
    pub fn from_bytes(config: &[u8], weights: &[u8], tokenizer: &[u8], device: &Device) -> Result<SentenceEmbedder> {
        let text = std::str::from_utf8(config)
            .map_err(|_| Error::Format { format: "config.json", detail: "not UTF-8 text".into() })?;
        let config = BertConfig::from_json(text)?;
        let mut file = safetensors::load_bytes(weights, device)?;
        Self::from_parts(BertModel::from_file(config, &mut file)?, tokenizer)
    }

    /// An embedder over a built model and the bytes of a `tokenizer.json`.
    pub fn from_parts(model: BertModel, tokenizer_json: &[u8]) -> Result<SentenceEmbedder> {
        let max_tokens = 256.min(model.config.max_position_embeddings);
        Ok(SentenceEmbedder { model, tokenizer: TextTokenizer::from_bytes(tokenizer_json, max_tokens)? })
    }

    /// Token ids of each text, with [CLS] and [SEP], truncated to the tokenizer's
    /// `max_tokens`.
    pub fn tokenize(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        self.tokenizer.tokenize(texts)
    }

    /// Embeddings `[n, hidden]` of pre-tokenised sequences, padded into one batch.
    pub fn embed_ids(&self, ids: &[Vec<u32>]) -> Tensor {
        let (ids_t, mask_t) = self.batch(ids);
        mean_pool_normalize(&self.model.forward(&ids_t, &mask_t), &mask_t)
    }

    /// Pad sequences into `(ids [b, s] i32, mask [b, s] f32)`.
    fn batch(&self, ids: &[Vec<u32>]) -> (Tensor, Tensor) {
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
        (Tensor::from_slice(&flat, [b, s], d), Tensor::from_slice(&mask, [b, s], d))
    }

    /// Store every Linear weight in `dtype`. Q4_0 uses GPTQ, calibrated on the layer
    /// inputs that `calibration` (default: [`CALIBRATION`]) produces.
    pub async fn quantize(&mut self, dtype: DType, calibration: Option<&[&str]>) -> Result<()> {
        if dtype != DType::Q4_0 {
            return crate::quant::quantize_linears(self.model.linears_mut(), dtype).await;
        }
        let (ids, mask) = self.batch(&self.tokenize(calibration.unwrap_or(&CALIBRATION))?);
        let inputs = self.model.linear_inputs(&ids, &mask).await?;
        crate::quant::gptq_linears(self.model.linears_mut(), &inputs).await
    }

    /// Input importance of every Linear layer over `texts` (for calibrated Q4_0).
    pub async fn importance(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let (ids, mask) = self.batch(&self.tokenize(texts)?);
        self.model.input_importance(&ids, &mask).await
    }

    /// Embeddings of `texts`, one `Vec` of `hidden` floats each.
    pub async fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let ids = self.tokenize(texts)?;
        let e = self.embed_ids(&ids);
        let h = self.model.config.hidden_size;
        let v = e.to_vec::<f32>().await?;
        Ok(v.chunks(h).map(|c| c.to_vec()).collect())
    }

    /// Blocking [`SentenceEmbedder::embed`].
    #[cfg(not(target_arch = "wasm32"))]
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
