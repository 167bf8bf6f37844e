//! The buffer pool: device buffers in size classes, reused once their holder drops them.

use crate::stats::Counters;
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Round a byte size up to its pool class: powers of two and 1.5× powers of two, at
/// least 256 bytes.
pub fn size_class(bytes: u64) -> u64 {
    let b = bytes.max(256);
    let p = b.next_power_of_two();
    let mid = p / 4 * 3;
    if b <= mid && mid >= 256 {
        mid
    } else {
        p
    }
}

pub(crate) struct PoolInner {
    free: Mutex<HashMap<(u32, u64), Vec<wgpu::Buffer>>>,
    pub(crate) counters: Arc<Counters>,
    /// Bytes of device buffers this pool holds (in use and free).
    held: AtomicU64,
    /// The memory budget (`DeviceOptions::memory_limit`): buffers beyond it are refused
    /// with `Error::OutOfMemory` instead of being created. 0 means none.
    limit: AtomicU64,
}

/// A pooled buffer; dropping it returns the buffer to its pool. A borrowed one (an
/// application's buffer wrapped by `Tensor::from_wgpu_buffer`) never enters the pool.
pub(crate) struct PooledBuffer {
    buffer: Option<wgpu::Buffer>,
    pub class: u64,
    usage: wgpu::BufferUsages,
    pool: Arc<PoolInner>,
    borrowed: bool,
}

impl PooledBuffer {
    pub fn buffer(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("pooled buffer present until drop")
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if self.borrowed {
            return;
        }
        if let Some(b) = self.buffer.take() {
            self.pool.counters.in_use(-(self.class as i64));
            if let Ok(mut free) = self.pool.free.lock() {
                free.entry((self.usage.bits(), self.class)).or_default().push(b);
            }
        }
    }
}

/// Buffers by (usage, size class).
#[derive(Clone)]
pub(crate) struct BufferPool(pub Arc<PoolInner>);

impl BufferPool {
    pub fn new(counters: Arc<Counters>) -> Self {
        BufferPool(Arc::new(PoolInner {
            free: Mutex::new(HashMap::new()),
            counters,
            held: AtomicU64::new(0),
            limit: AtomicU64::new(0),
        }))
    }

    /// Set (or with `None` clear) the memory budget.
    pub fn set_limit(&self, bytes: Option<u64>) {
        self.0.limit.store(bytes.unwrap_or(0), Ordering::Relaxed);
    }

    /// The memory budget, if one is set.
    pub fn limit(&self) -> Option<u64> {
        Some(self.0.limit.load(Ordering::Relaxed)).filter(|&b| b > 0)
    }

    /// Bytes of buffers held, in use or free.
    pub fn held(&self) -> u64 {
        self.0.held.load(Ordering::Relaxed)
    }

    /// A buffer of at least `bytes`, from the free list or newly created. Over the
    /// memory budget, free buffers are released first; if that is not enough the
    /// result is `Error::OutOfMemory` with the bytes requested and available.
    pub fn get(&self, device: &wgpu::Device, bytes: u64, usage: wgpu::BufferUsages) -> Result<PooledBuffer> {
        let class = size_class(bytes);
        let reused = self.0.free.lock().ok().and_then(|mut f| f.get_mut(&(usage.bits(), class)).and_then(|v| v.pop()));
        let buffer = match reused {
            Some(b) => b,
            None => {
                // Readback staging (host-visible, transient) is outside the budget, so
                // tensors already on the device stay readable when the budget is spent.
                let limit = self.0.limit.load(Ordering::Relaxed);
                let budgeted = !usage.contains(wgpu::BufferUsages::MAP_READ);
                if budgeted && limit > 0 && self.held() + class > limit {
                    self.trim();
                    let held = self.held();
                    if held + class > limit {
                        return Err(Error::OutOfMemory {
                            context: format!("a {bytes}-byte buffer over the device's {limit}-byte memory budget:"),
                            requested: class,
                            available: Some(limit.saturating_sub(held)),
                        });
                    }
                }
                self.0.counters.add(crate::stats::Counter::Buffers, 1);
                self.0.counters.allocated(class as i64);
                if budgeted {
                    self.0.held.fetch_add(class, Ordering::Relaxed);
                }
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("tessera"),
                    size: class,
                    usage,
                    mapped_at_creation: false,
                })
            }
        };
        self.0.counters.in_use(class as i64);
        Ok(PooledBuffer { buffer: Some(buffer), class, usage, pool: self.0.clone(), borrowed: false })
    }

    /// An application's buffer, used in place and never pooled, counted or destroyed.
    pub fn borrow(&self, buffer: wgpu::Buffer) -> PooledBuffer {
        let (class, usage) = (buffer.size(), buffer.usage());
        PooledBuffer { buffer: Some(buffer), class, usage, pool: self.0.clone(), borrowed: true }
    }

    /// Destroy every free buffer; returns the bytes released.
    pub fn trim(&self) -> u64 {
        let (mut freed, mut budgeted) = (0, 0);
        if let Ok(mut f) = self.0.free.lock() {
            for ((usage, class), bufs) in f.drain() {
                let in_budget = !wgpu::BufferUsages::from_bits_truncate(usage).contains(wgpu::BufferUsages::MAP_READ);
                for b in bufs {
                    b.destroy();
                    freed += class;
                    budgeted += if in_budget { class } else { 0 };
                }
            }
        }
        self.0.counters.allocated(-(freed as i64));
        self.0.held.fetch_sub(budgeted, Ordering::Relaxed);
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn size_classes_cover_and_bound_waste() {
        for b in [0u64, 1, 255, 256, 257, 1000, 4096, 5000, 1 << 20, (1 << 20) + 1] {
            let c = size_class(b);
            assert!(c >= b.max(256), "{b} -> {c}");
            assert!(c <= b.max(256) * 2, "{b} -> {c}");
        }
        assert_eq!(size_class(3000), 3072);
    }
}
