//! Recommendation models on MovieLens-100K ([`crate::io::movielens`]): matrix
//! factorisation trained with BPR, DeepFM over the user and item features, and a
//! two-tower retrieval model with in-batch negatives; the ranking metrics over the full
//! item set (Recall@K, NDCG@K, seen items excluded) and RMSE. Every table is an
//! `Embedding`/`EmbeddingBag` with sparse gradients, trained by `optim::SparseAdam`.

use crate::io::movielens::MovieLens;
use crate::nn::{init, loss, BagMode, Bags, Embedding, EmbeddingBag, Linear, Module};
use crate::{DType, Device, Result, Tensor};

/// Items each user has in a set of rating indices (sorted, distinct).
pub fn items_by_user(data: &MovieLens, idx: &[usize]) -> Vec<Vec<u32>> {
    let mut out = vec![Vec::new(); data.n_users];
    for &k in idx {
        out[data.users[k] as usize].push(data.items[k]);
    }
    for v in &mut out {
        v.sort_unstable();
        v.dedup();
    }
    out
}

/// Recall@K and NDCG@K over users with at least one held-out item: `scores` is
/// `[users, items]` (lazy), `seen` the items to exclude per user (set to -inf before
/// ranking), `held_out` the relevant items. Top-K is one kernel over all items.
pub fn rank_metrics(scores: &Tensor, seen: &[Vec<u32>], held_out: &[Vec<u32>], k: usize) -> Result<(f64, f64)> {
    let (users, items) = (scores.dims()[0], scores.dims()[1]);
    let mut mask = vec![0f32; users * items];
    for (u, s) in seen.iter().enumerate() {
        for &i in s {
            mask[u * items + i as usize] = 1.0;
        }
    }
    let mask = Tensor::from_slice(&mask, [users, items], scores.device()).gt_scalar(0.5);
    let masked = Tensor::where_(&mask, &scores.full_like(f64::NEG_INFINITY), scores);
    let top = masked.topk(k).1.to_vec_blocking::<i32>()?;
    let (mut recall, mut ndcg, mut n) = (0.0, 0.0, 0usize);
    for (u, rel) in held_out.iter().enumerate() {
        if rel.is_empty() {
            continue;
        }
        let hits: Vec<bool> = top[u * k..(u + 1) * k].iter().map(|&i| rel.binary_search(&(i as u32)).is_ok()).collect();
        let found = hits.iter().filter(|&&h| h).count();
        recall += found as f64 / rel.len() as f64;
        let dcg: f64 = hits.iter().enumerate().filter(|(_, &h)| h).map(|(r, _)| 1.0 / (r as f64 + 2.0).log2()).sum();
        let idcg: f64 = (0..rel.len().min(k)).map(|r| 1.0 / (r as f64 + 2.0).log2()).sum();
        ndcg += dcg / idcg;
        n += 1;
    }
    Ok((recall / n.max(1) as f64, ndcg / n.max(1) as f64))
}

/// Matrix factorisation: a user and an item table; the score is their dot product.
#[derive(Debug, Module)]
pub struct MatrixFactorization {
    pub users: Embedding,
    pub items: Embedding,
}

impl MatrixFactorization {
    /// Xavier-normal tables of width `dim` (RecBole's BPR initialisation).
    pub fn new(n_users: usize, n_items: usize, dim: usize, seed: u64, dev: &Device) -> MatrixFactorization {
        let xavier =
            |n: usize, s: u64| init::normal(&[n, dim], (2.0 / (n + dim) as f64).sqrt(), s, dev).requires_grad();
        MatrixFactorization {
            users: Embedding::from_weight(xavier(n_users, seed)).sparse(),
            items: Embedding::from_weight(xavier(n_items, seed + 1)).sparse(),
        }
    }

    /// BPR loss of (user, positive, negative) triples: `-log σ(s(u, i⁺) - s(u, i⁻))`.
    pub fn bpr_loss(&self, users: &[u32], pos: &[u32], neg: &[u32]) -> Tensor {
        let n = users.len();
        let u = self.users.lookup(users, &[n]);
        let items: Vec<u32> = pos.iter().chain(neg).copied().collect();
        let it = self.items.lookup(&items, &[2 * n]);
        let (p, q) = (it.narrow(0, 0, n), it.narrow(0, n, n));
        let diff = u.mul(&p.sub(&q)).sum_axes(&[1], false);
        loss::bce_with_logits(&diff, &diff.ones_like())
    }

    /// Scores of every user for every item, `[users, items]`.
    pub fn all_scores(&self) -> Tensor {
        self.users.weight.matmul(&self.items.weight.t())
    }
}

/// The features of one rating for DeepFM: five categorical fields and the genre bag.
pub struct Features {
    pub user: Vec<u32>,
    pub item: Vec<u32>,
    pub gender: Vec<u32>,
    pub age: Vec<u32>,
    pub occupation: Vec<u32>,
    pub genres: Bags,
}

impl Features {
    /// The features of ratings `idx`.
    pub fn of(data: &MovieLens, idx: &[usize]) -> Result<Features> {
        let (mut ids, mut offsets) = (Vec::new(), Vec::new());
        for &k in idx {
            offsets.push(ids.len() as i64);
            let g = data.genres[data.items[k] as usize];
            ids.extend((0..32).filter(|b| g >> b & 1 == 1).map(i64::from));
        }
        let user_of = |k: usize| data.users[k] as usize;
        Ok(Features {
            user: idx.iter().map(|&k| data.users[k]).collect(),
            item: idx.iter().map(|&k| data.items[k]).collect(),
            gender: idx.iter().map(|&k| u32::from(data.gender[user_of(k)])).collect(),
            age: idx.iter().map(|&k| u32::from(data.age[user_of(k)])).collect(),
            occupation: idx.iter().map(|&k| u32::from(data.occupation[user_of(k)])).collect(),
            genres: Bags::from_offsets(&ids, &offsets, None)?,
        })
    }
}

/// DeepFM (Guo et al., 2017): a first-order term, the factorisation machine's pairwise
/// interactions and an MLP, all over the same field embeddings. Each table's column 0
/// is the field's first-order weight, the rest its embedding.
#[derive(Debug, Module)]
pub struct DeepFm {
    pub user: Embedding,
    pub item: Embedding,
    pub gender: Embedding,
    pub age: Embedding,
    pub occupation: Embedding,
    pub genres: EmbeddingBag,
    pub fc1: Linear,
    pub fc2: Linear,
    pub out: Linear,
    pub bias: Tensor,
}

const FIELDS: usize = 6;

impl DeepFm {
    pub fn new(data: &MovieLens, dim: usize, hidden: usize, seed: u64, dev: &Device) -> DeepFm {
        let table = |n: usize, s: u64| {
            Embedding::from_weight(init::normal(&[n, dim + 1], 0.01, seed + s, dev).requires_grad()).sparse()
        };
        let mut genres = EmbeddingBag::new(data.genre_names.len(), dim + 1, BagMode::Mean, true, seed + 6, dev);
        genres.weight = init::normal(&[data.genre_names.len(), dim + 1], 0.01, seed + 6, dev).requires_grad();
        DeepFm {
            user: table(data.n_users, 1),
            item: table(data.n_items, 2),
            gender: table(2, 3),
            age: table(7, 4),
            occupation: table(data.occupation_names.len(), 5),
            genres,
            fc1: Linear::new(FIELDS * dim, hidden, true, seed + 7, dev),
            fc2: Linear::new(hidden, hidden, true, seed + 8, dev),
            out: Linear::new(hidden, 1, true, seed + 9, dev),
            bias: Tensor::full(3.5, [1], DType::F32, dev).requires_grad(),
        }
    }

    /// Predicted ratings `[B]`.
    pub fn forward(&self, f: &Features) -> Tensor {
        let n = f.user.len();
        let fields = [
            self.user.lookup(&f.user, &[n]),
            self.item.lookup(&f.item, &[n]),
            self.gender.lookup(&f.gender, &[n]),
            self.age.lookup(&f.age, &[n]),
            self.occupation.lookup(&f.occupation, &[n]),
            self.genres.forward(&f.genres),
        ];
        let d = fields[0].dims()[1] - 1;
        let all = Tensor::stack(&fields, 1); // [B, F, d + 1]
        let first = all.narrow(2, 0, 1).sum_axes(&[1, 2], false);
        let e = all.narrow(2, 1, d); // [B, F, d]
        let sum = e.sum_axes(&[1], false);
        let fm = sum.square().sub(&e.square().sum_axes(&[1], false)).sum_axes(&[1], false).mul_scalar(0.5);
        let h = self.fc1.forward(&e.reshape(vec![n, FIELDS * d])).relu();
        let h = self.fc2.forward(&h).relu();
        let deep = self.out.forward(&h).reshape(vec![n]);
        first.add(&fm).add(&deep).add(&self.bias.broadcast_to(vec![n]))
    }

    /// Mean squared error against `ratings`.
    pub fn loss(&self, f: &Features, ratings: &[f32]) -> Tensor {
        let y = Tensor::from_slice(ratings, [ratings.len()], self.bias.device());
        loss::mse(&self.forward(f), &y)
    }
}

/// Two towers over the user's and the item's ids and features, each ending in an
/// L2-normalised vector; trained with in-batch negatives (softmax over the batch's
/// items at a temperature).
#[derive(Debug, Module)]
pub struct TwoTower {
    pub user: Embedding,
    pub gender: Embedding,
    pub age: Embedding,
    pub occupation: Embedding,
    pub item: Embedding,
    pub genres: EmbeddingBag,
    pub user_fc: Linear,
    pub item_fc: Linear,
}

/// The softmax temperature of [`TwoTower::loss`].
pub const TEMPERATURE: f64 = 0.1;

impl TwoTower {
    pub fn new(data: &MovieLens, dim: usize, seed: u64, dev: &Device) -> TwoTower {
        let table = |n: usize, s: u64| {
            Embedding::from_weight(init::normal(&[n, dim], 0.1, seed + s, dev).requires_grad()).sparse()
        };
        let mut genres = EmbeddingBag::new(data.genre_names.len(), dim, BagMode::Mean, true, seed + 6, dev);
        genres.weight = init::normal(&[data.genre_names.len(), dim], 0.1, seed + 6, dev).requires_grad();
        TwoTower {
            user: table(data.n_users, 1),
            gender: table(2, 2),
            age: table(7, 3),
            occupation: table(data.occupation_names.len(), 4),
            item: table(data.n_items, 5),
            genres,
            user_fc: Linear::new(4 * dim, dim, true, seed + 7, dev),
            item_fc: Linear::new(2 * dim, dim, true, seed + 8, dev),
        }
    }

    fn normalise(x: &Tensor) -> Tensor {
        x.div(&x.square().sum_axes(&[1], true).add_scalar(1e-12).sqrt())
    }

    /// User vectors `[B, dim]`.
    pub fn users(&self, data: &MovieLens, users: &[u32]) -> Tensor {
        let n = users.len();
        let feat = |f: &dyn Fn(usize) -> u8| users.iter().map(|&u| u32::from(f(u as usize))).collect::<Vec<u32>>();
        let parts = [
            self.user.lookup(users, &[n]),
            self.gender.lookup(&feat(&|u| data.gender[u]), &[n]),
            self.age.lookup(&feat(&|u| data.age[u]), &[n]),
            self.occupation.lookup(&feat(&|u| data.occupation[u]), &[n]),
        ];
        Self::normalise(&self.user_fc.forward(&Tensor::concat(&parts, 1)))
    }

    /// Item vectors `[B, dim]`.
    pub fn items(&self, data: &MovieLens, items: &[u32]) -> Result<Tensor> {
        let n = items.len();
        let (mut ids, mut offsets) = (Vec::new(), Vec::new());
        for &i in items {
            offsets.push(ids.len() as i64);
            let g = data.genres[i as usize];
            ids.extend((0..32).filter(|b| g >> b & 1 == 1).map(i64::from));
        }
        let genres = self.genres.forward(&Bags::from_offsets(&ids, &offsets, None)?);
        let x = Tensor::concat(&[self.item.lookup(items, &[n]), genres], 1);
        Ok(Self::normalise(&self.item_fc.forward(&x)))
    }

    /// In-batch softmax loss of (user, item) pairs: each user's item against the
    /// others of the batch. `log_q` (per item of the catalogue: the log of its share of
    /// the training pairs) corrects the sampling bias of in-batch negatives (Yi et al.,
    /// 2019): popular items are negatives more often, so their logits are lowered by
    /// `log_q` during training only.
    pub fn loss(&self, data: &MovieLens, users: &[u32], items: &[u32], log_q: Option<&[f32]>) -> Result<Tensor> {
        let mut logits = self.users(data, users).matmul(&self.items(data, items)?.t()).mul_scalar(1.0 / TEMPERATURE);
        let n = users.len();
        if let Some(q) = log_q {
            let q: Vec<f32> = items.iter().map(|&i| q.get(i as usize).copied().unwrap_or(0.0)).collect();
            logits = logits.sub(&Tensor::from_slice(&q, [1, n], logits.device()));
        }
        let targets: Vec<i32> = (0..n as i32).collect();
        Ok(loss::cross_entropy(&logits, &Tensor::from_slice(&targets, [n], logits.device())))
    }

    /// The top `k` items for `user` (excluding `seen`), as one realisation: the user
    /// tower, scores against the item table, top-k. `item_table` is
    /// [`TwoTower::item_table`], computed once.
    pub fn recommend(
        &self,
        data: &MovieLens,
        item_table: &Tensor,
        user: u32,
        seen: &[u32],
        k: usize,
    ) -> Result<Vec<u32>> {
        let _g = crate::no_grad();
        let items = item_table.dims()[0];
        let mut mask = vec![0f32; items];
        for &i in seen {
            if let Some(m) = mask.get_mut(i as usize) {
                *m = f32::NEG_INFINITY;
            }
        }
        let scores = self.users(data, &[user]).matmul(&item_table.t());
        let scores = scores.add(&Tensor::from_slice(&mask, [1, items], item_table.device()));
        Ok(scores.topk(k).1.to_vec_blocking::<i32>()?.into_iter().map(|i| i as u32).collect())
    }

    /// Every item's vector, `[items, dim]` (realised).
    pub fn item_table(&self, data: &MovieLens) -> Result<Tensor> {
        let _g = crate::no_grad();
        let all: Vec<u32> = (0..data.n_items as u32).collect();
        let t = self.items(data, &all)?;
        t.realize_blocking()?;
        Ok(t)
    }
}
