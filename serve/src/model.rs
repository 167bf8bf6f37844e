//! What a served model does: turn a batch of inputs into a batch of outputs in one
//! realisation. Three kinds: a BERT sentence embedder (safetensors + tokenizer), an MNIST
//! classifier (a checkpoint of `models::mnist`'s architectures), and an ONNX model used
//! as either. Runners live on a batcher's worker thread and block there.

use crate::repo::{Manifest, ModelKind, Task};
use std::path::Path;
use tessera::io::movielens::MovieLens;
use tessera::models::bert::{self, SentenceEmbedder, TextTokenizer};
use tessera::models::recsys::TwoTower;
use tessera::nn::{Layer, Sequential};
use tessera::onnx::{LoadOptions, OnnxModel};
use tessera::{DType, Device, Error, Result, Tensor};

/// Pixels of one MNIST digit.
pub const PIXELS: usize = 784;

/// One request item.
#[derive(Clone, Debug)]
pub enum Input {
    Text(String),
    /// 784 grey levels in [0, 1].
    Pixels(Vec<f32>),
    /// A recommendation request: the `k` best items for `user`, items the user rated
    /// excluded.
    User {
        user: u32,
        k: usize,
    },
}

impl Input {
    /// Bytes that identify the input (for the cache key).
    pub fn key_bytes(&self) -> Vec<u8> {
        match self {
            Input::Text(s) => [b"t".as_slice(), s.as_bytes()].concat(),
            Input::Pixels(p) => std::iter::once(b'p').chain(p.iter().flat_map(|v| v.to_le_bytes())).collect(),
            Input::User { user, k } => [b"u".as_slice(), &user.to_le_bytes(), &(*k as u64).to_le_bytes()].concat(),
        }
    }
}

/// One result.
#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// A unit-length sentence embedding, its JSON text once written, and the tokens the
    /// model read (word pieces, `[CLS]` and `[SEP]` included, after truncation).
    Embedding(Vec<f32>, FloatsJson, usize),
    /// Class probabilities.
    Classes(Vec<f32>),
    /// Recommended items, best first, and their scores.
    Items { items: Vec<u32>, scores: Vec<f32> },
}

impl Output {
    /// An embedding of `tokens` tokens whose JSON text is not written yet.
    pub fn embedding(v: Vec<f32>, tokens: usize) -> Output {
        Output::Embedding(v, FloatsJson::default(), tokens)
    }

    /// Approximate heap bytes (the cache's weight; an embedding's JSON text counted at
    /// up to 16 bytes a value).
    pub fn bytes(&self) -> u32 {
        let n = match self {
            Output::Embedding(v, ..) => 5 * v.len(),
            Output::Classes(v) => v.len(),
            Output::Items { items, .. } => 2 * items.len(),
        };
        (n * 4 + 64) as u32
    }
}

/// Floats as JSON text, written the first time it is asked for and shared by every
/// clone: a cached embedding is answered many times, and writing its floats was most of
/// a cache hit's time. Equality ignores it.
#[derive(Clone, Debug, Default)]
pub struct FloatsJson(std::sync::Arc<std::sync::OnceLock<Option<Box<serde_json::value::RawValue>>>>);

impl FloatsJson {
    /// `v` as a JSON array (each float the shortest text that reads back to it).
    pub fn get(&self, v: &[f32]) -> Option<&serde_json::value::RawValue> {
        self.0.get_or_init(|| serde_json::value::to_raw_value(v).ok()).as_deref()
    }
}

impl PartialEq for FloatsJson {
    fn eq(&self, _: &FloatsJson) -> bool {
        true
    }
}

/// An input ready to batch: its padded cost (tokens for text, 1 for images).
pub struct Prepared {
    pub cost: usize,
    tokens: Option<Vec<u32>>,
    input: Input,
}

/// A loaded model on a device.
pub enum Runner {
    Bert(SentenceEmbedder),
    Classifier {
        model: Sequential,
        arch: String,
        dev: Device,
    },
    OnnxEmbedder {
        model: OnnxModel,
        tokenizer: TextTokenizer,
    },
    OnnxClassifier {
        model: OnnxModel,
        input: String,
        shape: Vec<usize>,
    },
    /// A two-tower recommender: the item table computed once at load, and each user's
    /// rated items (excluded from their recommendations).
    TwoTower {
        model: TwoTower,
        data: MovieLens,
        items: Tensor,
        seen: Vec<Vec<u32>>,
    },
}

/// The longest sequence the warm-up runs: the warm rows are reached below it (128), and
/// the ONNX embedder's tokenizer stops at 256.
pub const WARM_SEQ: usize = 256;

/// The warm-up's default `warm_lengths`: on lavapipe, the kernels of a sentence
/// embedder differ by length up to 32 word pieces (product tiles of 8 to 32 rows,
/// attention with 1 to 3 queries a lane) and not past them, up to the warm rows.
pub const WARM_LENGTHS: usize = 32;

/// Most items one recommendation request may ask for (top-k's limit).
pub const MAX_K: usize = 64;

impl Runner {
    /// Load the model a manifest describes from `dir` onto `dev` (blocking).
    pub fn load(dir: &Path, m: &Manifest, dev: &Device) -> Result<Runner> {
        let file = |name: &str| m.file_path(dir, name);
        match &m.kind {
            ModelKind::BertEmbedder => {
                let config = read(&file("config.json")?)?;
                let weights = read(&file("model.safetensors")?)?;
                let tok = read(&file("tokenizer.json")?)?;
                let mut emb = SentenceEmbedder::from_bytes(&config, &weights, &tok, dev)?;
                if m.dtype != DType::F32 {
                    pollster::block_on(emb.quantize(m.dtype, None))?;
                }
                Ok(Runner::Bert(emb))
            }
            ModelKind::Classifier { architecture } => {
                let mut model = tessera::models::mnist::build(architecture, 0, dev)?;
                let mut opt = tessera::optim::Adam::new(1e-3);
                tessera::io::checkpoint::load(file("model.ckpt")?, &mut model, &mut opt, dev)?;
                tessera::nn::Module::set_training(&mut model, false);
                if m.dtype != DType::F32 {
                    return Err(Error::Unsupported(format!(
                        "classifier dtype {}: classifiers are served in f32",
                        m.dtype
                    )));
                }
                Ok(Runner::Classifier { model, arch: architecture.clone(), dev: dev.clone() })
            }
            ModelKind::TwoTower { dim } => {
                if m.dtype != DType::F32 {
                    return Err(Error::Unsupported(format!("two-tower dtype {}: served in f32", m.dtype)));
                }
                let data = MovieLens::load(&file("ml-100k.bin")?)?;
                let mut model = TwoTower::new(&data, *dim, 0, dev);
                let mut opt = tessera::optim::SparseAdam::new(1e-3);
                tessera::io::checkpoint::load(file("model.ckpt")?, &mut model, &mut opt, dev)?;
                let items = model.item_table(&data)?;
                let all: Vec<usize> = (0..data.len()).collect();
                let seen = tessera::models::recsys::items_by_user(&data, &all);
                Ok(Runner::TwoTower { model, data, items, seen })
            }
            ModelKind::Onnx { task } => {
                let weights = (m.dtype != DType::F32).then_some(m.dtype);
                let model = OnnxModel::load_with(file("model.onnx")?, dev, LoadOptions { weights })?;
                match task {
                    Task::Embedding => {
                        let tokenizer = TextTokenizer::from_bytes(&read(&file("tokenizer.json")?)?, 256)?;
                        Ok(Runner::OnnxEmbedder { model, tokenizer })
                    }
                    Task::Classification => {
                        let i = model
                            .inputs()
                            .first()
                            .ok_or_else(|| Error::Unsupported("the model has no input".into()))?;
                        let shape: Vec<usize> = match &i.dims {
                            Some(d) => d
                                .iter()
                                .map(|x| match x {
                                    tessera::onnx::Dim::Fixed(n) => *n as usize,
                                    _ => 1,
                                })
                                .collect(),
                            None => vec![1, PIXELS],
                        };
                        if shape.iter().product::<usize>() != PIXELS {
                            return Err(Error::Unsupported(format!(
                                "an ONNX classifier must take one 28x28 digit per run; its input is {shape:?}"
                            )));
                        }
                        Ok(Runner::OnnxClassifier { input: i.name.clone(), model, shape })
                    }
                }
            }
        }
    }

    /// Tokenise or check an input; its batching cost.
    pub fn prepare(&self, input: Input) -> Result<Prepared> {
        let tokens = match (self.tokenizer(), self, &input) {
            (Some(t), _, Input::Text(s)) => Some(t.tokenize(&[s])?.into_iter().next().unwrap_or_default()),
            (None, Runner::Classifier { .. } | Runner::OnnxClassifier { .. }, Input::Pixels(p))
                if p.len() == PIXELS =>
            {
                None
            }
            (None, Runner::TwoTower { data, .. }, Input::User { user, k }) => {
                if *user as usize >= data.n_users {
                    return Err(Error::Unsupported(format!(
                        "user {user}: the model knows users 0 to {}",
                        data.n_users - 1
                    )));
                }
                if !(1..=MAX_K).contains(k) {
                    return Err(Error::Unsupported(format!("k = {k}: ask for 1 to {MAX_K} items")));
                }
                None
            }
            _ => return Err(Error::Unsupported("this model does not take that kind of input".into())),
        };
        Ok(Prepared { cost: tokens.as_ref().map_or(1, |t| t.len()), tokens, input })
    }

    /// A text model's embeddings of `items`, built and not yet read.
    fn embeddings(&self, items: &[Prepared]) -> Result<Tensor> {
        let ids: Vec<Vec<u32>> = items.iter().map(|p| p.tokens.clone().unwrap_or_default()).collect();
        match self {
            Runner::Bert(emb) => Ok(emb.embed_ids(&ids)),
            Runner::OnnxEmbedder { model, .. } => {
                let dev = model.device();
                let (b, s) = (ids.len(), ids.iter().map(Vec::len).max().unwrap_or(1).max(1));
                let mut flat = vec![0i32; b * s];
                let mut mask = vec![0i32; b * s];
                for (i, row) in ids.iter().enumerate() {
                    for (j, &t) in row.iter().enumerate() {
                        flat[i * s + j] = t as i32;
                        mask[i * s + j] = 1;
                    }
                }
                let mut feeds = vec![
                    ("input_ids", Tensor::from_slice(&flat, [b, s], dev)),
                    ("attention_mask", Tensor::from_slice(&mask, [b, s], dev)),
                ];
                if model.inputs().iter().any(|i| i.name == "token_type_ids") {
                    feeds.push(("token_type_ids", Tensor::zeros([b, s], DType::I32, dev)));
                }
                let out = model.run(&feeds)?;
                let hidden = &out[0].tensor;
                let maskf = Tensor::from_slice(&mask, [b, s], dev).cast(DType::F32);
                Ok(bert::mean_pool_normalize(hidden, &maskf))
            }
            _ => Err(Error::Unsupported("embeddings of a model that does not embed text".into())),
        }
    }

    /// Run a batch as one realisation.
    pub fn run(&self, items: &[Prepared]) -> Result<Vec<Output>> {
        match self {
            Runner::Bert(_) | Runner::OnnxEmbedder { .. } => {
                let rows = rows(&self.embeddings(items)?, items.len())?;
                Ok(rows.into_iter().zip(items).map(|(r, p)| Output::embedding(r, p.cost)).collect())
            }
            Runner::Classifier { model, arch, dev } => {
                let mut px = Vec::with_capacity(items.len() * PIXELS);
                for p in items {
                    if let Input::Pixels(v) = &p.input {
                        px.extend(tessera::models::mnist::standardize(v));
                    }
                }
                let x = Tensor::from_slice(&px, tessera::models::mnist::input_shape(arch, items.len()), dev);
                let probs = model.forward(&x).softmax(-1);
                Ok(rows(&probs, items.len())?.into_iter().map(Output::Classes).collect())
            }
            Runner::TwoTower { model, data, items: table, seen } => {
                // One realisation: the user tower for the batch, scores against every
                // item, the user's rated items masked, top-k.
                let _g = tessera::no_grad();
                let requests: Vec<(u32, usize)> = items
                    .iter()
                    .filter_map(|p| match p.input {
                        Input::User { user, k } => Some((user, k)),
                        _ => None,
                    })
                    .collect();
                let users: Vec<u32> = requests.iter().map(|r| r.0).collect();
                let n_items = table.dims()[0];
                let mut mask = vec![0f32; users.len() * n_items];
                for (b, &u) in users.iter().enumerate() {
                    for &i in &seen[u as usize] {
                        mask[b * n_items + i as usize] = f32::NEG_INFINITY;
                    }
                }
                let k = requests.iter().map(|r| r.1).max().unwrap_or(1).min(n_items);
                let mask = Tensor::from_slice(&mask, [users.len(), n_items], table.device());
                let scores = model.users(data, &users).matmul(&table.t()).add(&mask);
                let (values, idx) = scores.topk(k);
                let out = tessera::read_all_blocking(&[values, idx])?;
                Ok(requests
                    .iter()
                    .enumerate()
                    .map(|(b, &(_, want))| Output::Items {
                        items: out[1][b * k..b * k + want].iter().map(|&i| i as u32).collect(),
                        scores: out[0][b * k..b * k + want].iter().map(|&s| s as f32).collect(),
                    })
                    .collect())
            }
            Runner::OnnxClassifier { model, input, shape } => {
                // The exported model takes one digit: one lazy run per digit, all
                // realised together.
                let dev = model.device();
                let mut outs = Vec::with_capacity(items.len());
                for p in items {
                    let Input::Pixels(v) = &p.input else { continue };
                    let x = Tensor::from_slice(&tessera::models::mnist::standardize(v), shape.clone(), dev);
                    let o = model.run(&[(input.as_str(), x)])?;
                    outs.push(o[0].tensor.reshape([10]).softmax(-1));
                }
                let vals = tessera::read_all_blocking(&outs)?;
                Ok(vals.into_iter().map(|v| Output::Classes(v.into_iter().map(|x| x as f32).collect())).collect())
            }
        }
    }

    /// Run the model on a warm-up input and, with `warm_batches`, for text on a device
    /// that `compiles` kernels (not the CPU backend) every sequence length up to
    /// `warm_lengths` alone and in a padded pair (an ONNX text model also the last
    /// lengths of each longer class, [`long_edges`]), then once per row count of
    /// [`tessera::kernels::matmul::warm_rows`] up to the largest batch the batcher forms
    /// (`max_batch_tokens` word pieces of text, at most [`WARM_SEQ`] in one sequence, or
    /// `max_batch_size` other inputs): the kernels of short sentences and of large
    /// batches, which take up to seconds each to compile on lavapipe, are then ready
    /// before the version goes live, where its first requests would wait for them.
    /// Returns the runs.
    pub fn warm_up(&self, b: &crate::batcher::BatchConfig, compiles: bool) -> Result<usize> {
        let (max_batch_size, max_batch_tokens) = (b.max_batch_size, b.max_batch_tokens);
        let warm = self.prepare(self.warm_input())?;
        self.run(std::slice::from_ref(&warm))?;
        let mut runs = 1;
        if !b.warm_batches {
            return Ok(runs);
        }
        let item = |tokens: Option<Vec<u32>>| Prepared {
            cost: tokens.as_ref().map_or(1, Vec::len),
            tokens,
            input: warm.input.clone(),
        };
        match &warm.tokens {
            // [CLS], a word piece repeated, [SEP]: one sequence of m pieces.
            Some(t) if t.len() >= 3 => {
                let seq = |m: usize| {
                    let ids = std::iter::once(t[0]).chain(std::iter::repeat_n(t[1], m - 2)).chain(t.last().copied());
                    item(Some(ids.collect()))
                };
                // Where kernels compile, each short length alone and padded in a pair
                // (a padding mask, batched attention), then four (a batch of whole quads):
                // kernels differ by classes of length and batch size (rows per tile,
                // queries per lane, which tensors fill quads), which a new server's
                // first sentences would otherwise wait for.
                let most = max_batch_tokens.min(WARM_SEQ).min(self.tokenizer().map_or(usize::MAX, |t| t.max_tokens));
                let lengths = if compiles { b.warm_lengths.min(most) } else { 0 };
                // n sequences of m, m - 1, .. pieces, where the batcher would form them.
                let fits = |n: usize, m: usize| m > n && n <= max_batch_size && n * m <= max_batch_tokens;
                let batch = |n: usize, m: usize| (0..n).map(|i| seq(m - i)).collect::<Vec<_>>();
                let mut batches = Vec::new();
                for m in 3..=lengths {
                    batches.push(batch(1, m));
                    if fits(2, m) {
                        batches.push(batch(2, m));
                    }
                }
                // Past the short lengths, where attention is composed of products (an
                // ONNX graph), each longer class's last five lengths alone, and padded
                // pairs of three of them (see `long_edges`). The native embedder's fused
                // attention compiles nothing past 32 pieces (checked up to 256).
                let composed = matches!(self, Runner::OnnxEmbedder { .. });
                for edge in if composed { long_edges(lengths, most) } else { Vec::new() } {
                    batches.extend((edge.saturating_sub(4).max(lengths + 1)..=edge).map(|m| batch(1, m)));
                    for m in [edge.saturating_sub(4), edge - 1, edge] {
                        if m > lengths && fits(2, m) {
                            batches.push(batch(2, m));
                        }
                    }
                }
                if fits(4, lengths) {
                    batches.push(batch(4, lengths));
                }
                batches.extend(tessera::kernels::matmul::warm_rows(most).into_iter().map(|m| batch(1, m)));
                self.run_together(&batches)?;
                runs += batches.len();
            }
            // [CLS] and [SEP] alone: no word piece to repeat.
            Some(_) => {}
            None => {
                for b in tessera::kernels::matmul::warm_rows(max_batch_size) {
                    self.run(&(0..b).map(|_| item(None)).collect::<Vec<_>>())?;
                    runs += 1;
                }
            }
        }
        Ok(runs)
    }

    /// A text model's tokenizer.
    fn tokenizer(&self) -> Option<&TextTokenizer> {
        match self {
            Runner::Bert(emb) => Some(&emb.tokenizer),
            Runner::OnnxEmbedder { tokenizer, .. } => Some(tokenizer),
            _ => None,
        }
    }

    /// Run each of `batches` as [`Runner::run`] would, a text model's all in one
    /// realisation: the kernels they lack then compile on several threads at once.
    fn run_together(&self, batches: &[Vec<Prepared>]) -> Result<()> {
        if !self.embeds() {
            return batches.iter().try_for_each(|b| self.run(b).map(drop));
        }
        let outs: Vec<Tensor> = batches.iter().map(|b| self.embeddings(b)).collect::<Result<_>>()?;
        tessera::read_all_blocking(&outs).map(drop)
    }

    /// An input to warm the model up with.
    pub fn warm_input(&self) -> Input {
        match self {
            Runner::Bert(_) | Runner::OnnxEmbedder { .. } => Input::Text("warm up".into()),
            Runner::Classifier { .. } | Runner::OnnxClassifier { .. } => Input::Pixels(vec![0.0; PIXELS]),
            Runner::TwoTower { .. } => Input::User { user: 0, k: 10 },
        }
    }

    /// Whether outputs are embeddings (else class probabilities).
    pub fn embeds(&self) -> bool {
        matches!(self, Runner::Bert(_) | Runner::OnnxEmbedder { .. })
    }
}

/// The longest sequence of each class of lengths past `short` (up to `most`) whose
/// kernels differ where a text model's attention is composed of products (an ONNX
/// graph): a product over a sequence's L keys takes the wide kernel where L is a
/// multiple of 8, the subgroup kernel (tiles of L rounded up to 8 rows, at most 64)
/// where it is one of 4, and the direct kernel otherwise; each takes column blocks by L
/// (up to 64, 65-128, 129-192, 193-256), and a padded batch's mask makes another
/// epilogue. So the warm-up runs the lengths `edge - 4 ..= edge` of each, whose residues
/// mod 8 (4 to 0) reach every kernel (those past `short`); a class cut short by `most`
/// ends there. None where the short lengths are not warmed.
fn long_edges(short: usize, most: usize) -> Vec<usize> {
    if short == 0 {
        return Vec::new();
    }
    let mut edges: Vec<usize> =
        [40, 48, 56, 64, 72, 136, 200, 256].into_iter().map(|e| e.min(most)).filter(|&e| e > short).collect();
    edges.dedup();
    edges
}

/// Split a `[n, d]` result into rows.
fn rows(t: &Tensor, n: usize) -> Result<Vec<Vec<f32>>> {
    let v: Vec<f32> = t.to_vec_blocking()?;
    let d = v.len() / n.max(1);
    Ok(v.chunks(d.max(1)).map(<[f32]>::to_vec).collect())
}

fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).map_err(|e| Error::Io { path: p.display().to_string(), message: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::long_edges;

    #[test]
    fn long_edges_end_each_class_within_the_longest_sequence() {
        assert_eq!(long_edges(32, 256), [40, 48, 56, 64, 72, 136, 200, 256]);
        // A class cut short ends at the longest sequence; the short lengths own the rest.
        assert_eq!(long_edges(8, 160), [40, 48, 56, 64, 72, 136, 160]);
        assert_eq!(long_edges(32, 130), [40, 48, 56, 64, 72, 130]);
        assert_eq!(long_edges(60, 256), [64, 72, 136, 200, 256]);
        assert_eq!(long_edges(32, 36), [36]);
        assert!(long_edges(32, 32).is_empty());
        assert_eq!(long_edges(1, 3), [3]);
        assert!(long_edges(0, 256).is_empty());
    }
}
