//! Vectors whose first element sits on a 128-byte boundary, for the CPU backend's
//! storage. The allocator aligns a large block to 16 bytes only (glibc's `mmap`ped
//! blocks start 16 bytes into a page), so a 128-byte row of a table, 32 f32 values,
//! spans three cache lines instead of two: a row gathered or updated at random then
//! costs three line transfers where two would do (a sparse Adam step over 8,150 rows
//! of three 1M-row tables, plain Rust on this backend's loop: about 1.0–1.2 ms
//! misaligned against 0.6–0.7 ms aligned). Alignment to two lines also keeps a row within the
//! pair the adjacent-line prefetcher loads together.

use std::ops::{Deref, DerefMut};

/// Alignment of the first element of a buffer at least [`ALIGN_FROM_BYTES`] long.
const ALIGN_BYTES: usize = 128;
/// Smaller buffers are not aligned (the room it costs would matter more than it helps).
const ALIGN_FROM_BYTES: usize = 4096;

/// A `Vec<T>` whose elements start `off` elements into its allocation, where the first
/// one is aligned ([`AlignedVec::zeroed`]), or at 0 (a vector taken as it is, [`From`]).
/// The padding before is part of the `Vec` (its length is `off + len`), so shrinking and
/// freeing stay the `Vec`'s own.
pub(crate) struct AlignedVec<T> {
    vec: Vec<T>,
    off: usize,
    /// Elements it has room for from `off` on: what was asked for (the pool matches
    /// buffers by it), never past the allocation, so a length up to it never reallocates.
    room: usize,
}

impl<T: Copy + Default> AlignedVec<T> {
    /// `n` zeros (`T::default()`), aligned when the buffer is large. The allocation is
    /// `vec!`'s (calloc for zero-bit primitives: fresh pages are not touched, so huge
    /// pages can still be asked for).
    pub fn zeroed(n: usize) -> AlignedVec<T> {
        let size = std::mem::size_of::<T>().max(1);
        if n.saturating_mul(size) < ALIGN_FROM_BYTES {
            return AlignedVec { vec: vec![T::default(); n], off: 0, room: n };
        }
        let pad = ALIGN_BYTES / size - 1;
        let mut vec = vec![T::default(); n.saturating_add(pad)];
        let off = (ALIGN_BYTES - vec.as_ptr() as usize % ALIGN_BYTES) % ALIGN_BYTES / size;
        vec.truncate(off + n);
        AlignedVec { vec, off, room: n }
    }

    /// Elements it has room for: the length it was made with, or a taken vector's
    /// capacity.
    pub fn capacity(&self) -> usize {
        self.room
    }

    /// Keep the first `n` elements, zeros past the old length (reallocated, and aligned
    /// again, only when `n` passes the room).
    pub fn reset_len(&mut self, n: usize) {
        if n > self.capacity() {
            let mut grown = AlignedVec::zeroed(n);
            let keep = self.len().min(n);
            grown[..keep].copy_from_slice(&self[..keep]);
            *self = grown;
            return;
        }
        self.vec.truncate(self.off + n);
        self.vec.resize(self.off + n, T::default());
    }
}

impl<T> From<Vec<T>> for AlignedVec<T> {
    /// The vector as it is: no copy, and no alignment beyond the allocator's.
    fn from(vec: Vec<T>) -> AlignedVec<T> {
        AlignedVec { room: vec.capacity(), vec, off: 0 }
    }
}

impl<T: Copy + Default> Clone for AlignedVec<T> {
    /// A copy aligned as a new buffer is (not a clone of the padding, whose length
    /// would not fit the copy's own address).
    fn clone(&self) -> AlignedVec<T> {
        let mut c = AlignedVec::zeroed(self.len());
        c.copy_from_slice(self);
        c
    }
}

impl<T> Deref for AlignedVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.vec[self.off..]
    }
}

impl<T> DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.vec[self.off..]
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for AlignedVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self[..].fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_start_aligned_and_keep_their_values() {
        for n in [1usize, 1000, 1024, 1025, 100_003, 3 << 20] {
            let mut v = AlignedVec::<f32>::zeroed(n);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&x| x == 0.0));
            if n * 4 >= ALIGN_FROM_BYTES {
                assert_eq!(v.as_ptr() as usize % ALIGN_BYTES, 0, "{n} floats");
            }
            v.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
            let c = v.clone();
            assert_eq!(&c[..], &v[..]);
            if n * 4 >= ALIGN_FROM_BYTES {
                assert_eq!(c.as_ptr() as usize % ALIGN_BYTES, 0, "a clone is aligned too");
            }
            // Shorter, then longer within the room: the kept values stay, the rest are 0.
            let cap = v.capacity();
            v.reset_len(n / 2);
            v.reset_len(cap);
            assert_eq!(v.len(), cap);
            assert!(v[..n / 2].iter().enumerate().all(|(i, &x)| x == i as f32));
            assert!(v[n / 2..].iter().all(|&x| x == 0.0));
            // Past the room: reallocated, aligned, values kept.
            v.reset_len(cap + 5);
            assert!(v[..n / 2].iter().enumerate().all(|(i, &x)| x == i as f32) && v[n / 2..].iter().all(|&x| x == 0.0));
            if n * 4 >= ALIGN_FROM_BYTES {
                assert_eq!(v.as_ptr() as usize % ALIGN_BYTES, 0);
            }
        }
        // The backend's outputs: a pooled size and a table past the pool's sizes.
        // The backend's outputs (a pooled size and a table past the pool's sizes) and
        // uploaded values.
        use super::super::buffer::HostBuffer;
        for n in [100_000, 20 << 20] {
            for b in [HostBuffer::zeros(crate::DType::F32, n), HostBuffer::from_f64(crate::DType::F32, &vec![1.5; n])] {
                let v = b.as_f32().expect("f32");
                assert_eq!((v.len(), v.as_ptr() as usize % ALIGN_BYTES), (n, 0), "{n} floats");
            }
        }
        let taken: AlignedVec<i32> = vec![3, 4, 5].into();
        assert_eq!((&taken[..], taken.capacity()), (&[3, 4, 5][..], 3));
        assert_eq!(format!("{taken:?}"), "[3, 4, 5]");
    }
}
