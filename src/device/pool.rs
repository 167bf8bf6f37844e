//! The buffer pool: device buffers in size classes, reused once their holder drops them.

use crate::stats::Counters;
use std::collections::HashMap;
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
}

/// A pooled buffer; dropping it returns the buffer to its pool.
pub(crate) struct PooledBuffer {
    buffer: Option<wgpu::Buffer>,
    pub class: u64,
    usage: wgpu::BufferUsages,
    pool: Arc<PoolInner>,
}

impl PooledBuffer {
    pub fn buffer(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("pooled buffer present until drop")
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
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
        BufferPool(Arc::new(PoolInner { free: Mutex::new(HashMap::new()), counters }))
    }

    /// A buffer of at least `bytes`, from the free list or newly created.
    pub fn get(&self, device: &wgpu::Device, bytes: u64, usage: wgpu::BufferUsages) -> PooledBuffer {
        let class = size_class(bytes);
        let reused = self.0.free.lock().ok().and_then(|mut f| f.get_mut(&(usage.bits(), class)).and_then(|v| v.pop()));
        let buffer = reused.unwrap_or_else(|| {
            self.0.counters.add(crate::stats::Counter::Buffers, 1);
            self.0.counters.allocated(class as i64);
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tessera"),
                size: class,
                usage,
                mapped_at_creation: false,
            })
        });
        self.0.counters.in_use(class as i64);
        PooledBuffer { buffer: Some(buffer), class, usage, pool: self.0.clone() }
    }

    /// Destroy every free buffer; returns the bytes released.
    pub fn trim(&self) -> u64 {
        let mut freed = 0;
        if let Ok(mut f) = self.0.free.lock() {
            for ((_, class), bufs) in f.drain() {
                for b in bufs {
                    b.destroy();
                    freed += class;
                }
            }
        }
        self.0.counters.allocated(-(freed as i64));
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
