//! [`DistributedSampler`]: each rank's shard of a data set, reshuffled every epoch.

use crate::rng::SplitMix64;

/// PyTorch's `DistributedSampler`: a permutation of `0..len` seeded by `seed + epoch`
/// (the same on every rank), padded by wrapping around to a multiple of the world size
/// (or cut to one with `drop_last`), of which rank `r` takes positions `r, r + size,
/// r + 2 size, ...`. Every rank gets the same number of samples, so the ranks step
/// together; with batch `b` per rank, the union of the ranks' k-th batches is positions
/// `k * b * size .. (k + 1) * b * size` of the permutation, the k-th batch of one
/// process with batch `b * size`.
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    pub len: usize,
    pub rank: usize,
    pub size: usize,
    pub seed: u64,
    pub shuffle: bool,
    pub drop_last: bool,
}

impl DistributedSampler {
    /// Shuffled, padded shards of `0..len` for `rank` of `size`.
    pub fn new(len: usize, rank: usize, size: usize, seed: u64) -> DistributedSampler {
        DistributedSampler { len, rank, size: size.max(1), seed, shuffle: true, drop_last: false }
    }

    /// The permutation all ranks share for `epoch`, before sharding.
    pub fn global_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = SplitMix64(self.seed.wrapping_add(epoch).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5DEE_CE66);
            rng.shuffle(&mut order);
        }
        let total =
            if self.drop_last { self.len / self.size * self.size } else { self.len.div_ceil(self.size) * self.size };
        if total <= order.len() {
            order.truncate(total);
        } else if !order.is_empty() {
            let pad: Vec<usize> = order.iter().cycle().take(total - order.len()).copied().collect();
            order.extend(pad);
        }
        order
    }

    /// This rank's indices for `epoch`.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        self.global_order(epoch).into_iter().skip(self.rank).step_by(self.size).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_padded_permutation_once() {
        for (len, size) in [(10, 3), (64, 2), (7, 7), (5, 8), (0, 2)] {
            let all: Vec<Vec<usize>> = (0..size).map(|r| DistributedSampler::new(len, r, size, 7).indices(3)).collect();
            let n = all[0].len();
            assert!(all.iter().all(|s| s.len() == n), "{len}/{size}: {all:?}");
            let g = DistributedSampler::new(len, 0, size, 7).global_order(3);
            for (r, s) in all.iter().enumerate() {
                for (i, &x) in s.iter().enumerate() {
                    assert_eq!(x, g[r + i * size]);
                }
            }
            let mut seen: Vec<usize> = all.concat();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen, (0..len).collect::<Vec<_>>(), "every sample appears");
        }
        let a = DistributedSampler::new(100, 0, 2, 1);
        assert_ne!(a.indices(0), a.indices(1), "a new epoch reshuffles");
        assert_eq!(a.indices(4), a.indices(4));
        let mut d = DistributedSampler::new(10, 1, 3, 0);
        d.drop_last = true;
        assert_eq!(d.indices(0).len(), 3);
    }
}
