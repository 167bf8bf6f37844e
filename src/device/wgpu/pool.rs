//! The buffer pool: device buffers in size classes, reused once their holder drops them;
//! and the operand textures of `KernelSpec::textured` kernels, in classes of rows.

#[cfg(not(target_arch = "wasm32"))]
use crate::kernels::TEXTURE_WIDTH;
use crate::stats::Counters;
use crate::{Error, Result};
use std::collections::HashMap;
#[cfg(not(target_arch = "wasm32"))]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

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
    /// Free operand textures ([`TEXTURE_WIDTH`] texels a row) by (words: `rgba32uint`
    /// rather than `rgba32float`, rows).
    #[cfg(not(target_arch = "wasm32"))]
    free_textures: Mutex<HashMap<(bool, u32), Vec<wgpu::Texture>>>,
    pub(crate) counters: Arc<Counters>,
    /// Bytes of device buffers this pool holds (in use and free).
    held: AtomicU64,
    /// The memory budget (`DeviceOptions::memory_limit`): buffers beyond it are refused
    /// with `Error::OutOfMemory` instead of being created. 0 means none.
    limit: AtomicU64,
    /// Operand textures kept across submits ([`TextureCache`]).
    #[cfg(not(target_arch = "wasm32"))]
    texture_cache: Mutex<TextureCache>,
}

/// Operand textures kept across submits, so a tensor that kernels read as texels again
/// and again (a model's weights, a benchmark's input) is copied once, not per submit. An
/// entry holds the copy of a byte range of a live pooled buffer and is dropped when that
/// buffer is (`PooledBuffer`'s drop), written in place ([`BufferPool::forget_textures`]),
/// evicted (least recently used first, past [`TextureCache::capacity`]) or trimmed.
/// Lavapipe copies about 10 GB/s on one thread: MiniLM's 42 MB of weights cost a
/// sentence about 4 ms, a 4M-float input 1.6 ms.
#[cfg(not(target_arch = "wasm32"))]
#[derive(Default)]
struct TextureCache {
    entries: Vec<CachedTexture>,
    bytes: u64,
    clock: u64,
}

#[cfg(not(target_arch = "wasm32"))]
struct CachedTexture {
    /// The source buffer's address (its `Arc<PooledBuffer>`'s), its range and format.
    buffer: usize,
    range: (u64, u64),
    words: bool,
    texture: Arc<PooledTexture>,
    bytes: u64,
    used: u64,
}

#[cfg(not(target_arch = "wasm32"))]
impl CachedTexture {
    /// Whether it is the copy of `range` of the buffer at `key` (as words where `words`).
    fn copies(&self, key: usize, range: (u64, u64), words: bool) -> bool {
        (self.buffer, self.range, self.words) == (key, range, words)
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl TextureCache {
    /// Bytes of textures kept without a memory budget; a quarter of the budget with one.
    const CAPACITY: u64 = 512 << 20;

    fn capacity(limit: u64) -> u64 {
        if limit > 0 {
            (limit / 4).min(Self::CAPACITY)
        } else {
            Self::CAPACITY
        }
    }

    /// Take out the entries `drop_it` selects (to be dropped after the lock is released:
    /// a texture's drop takes the free list's lock).
    fn take(&mut self, drop_it: impl Fn(&CachedTexture) -> bool) -> Vec<CachedTexture> {
        if !self.entries.iter().any(&drop_it) {
            return Vec::new();
        }
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.entries).into_iter().partition(drop_it);
        self.entries = kept;
        self.bytes -= gone.iter().map(|e| e.bytes).sum::<u64>();
        gone
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl PoolInner {
    /// Drop the cached textures copied from the buffer at `key`.
    fn forget_textures_of(&self, key: usize) {
        let gone = self.texture_cache.lock().map(|mut c| c.take(|e| e.buffer == key)).unwrap_or_default();
        drop(gone);
    }
}

/// A pooled buffer; dropping it returns the buffer to its pool. A borrowed one (an
/// application's buffer wrapped by `Tensor::from_wgpu_buffer`) never enters the pool.
pub(crate) struct PooledBuffer {
    buffer: Option<wgpu::Buffer>,
    pub class: u64,
    usage: wgpu::BufferUsages,
    pool: Arc<PoolInner>,
    borrowed: bool,
    /// Lent to the application (`Tensor::wgpu_buffer`), which may write it: no texture
    /// copy of it is kept.
    #[cfg(not(target_arch = "wasm32"))]
    lent: AtomicBool,
}

impl PooledBuffer {
    pub fn buffer(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("pooled buffer present until drop")
    }

    /// Its address, which keys the texture cache while it lives.
    #[cfg(not(target_arch = "wasm32"))]
    fn key(&self) -> usize {
        self as *const PooledBuffer as usize
    }

    /// Mark it lent to the application, which may write it: the texture copies kept of
    /// it go, and none is kept again.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn lend(&self) {
        self.lent.store(true, Ordering::Relaxed);
        self.pool.forget_textures_of(self.key());
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if self.borrowed {
            return;
        }
        #[cfg(not(target_arch = "wasm32"))]
        self.pool.forget_textures_of(self.key());
        if let Some(b) = self.buffer.take() {
            self.pool.counters.in_use(-(self.class as i64));
            if let Ok(mut free) = self.pool.free.lock() {
                free.entry((self.usage.bits(), self.class)).or_default().push(b);
            }
        }
    }
}

/// Bytes of one texture row: [`TEXTURE_WIDTH`] `rgba32float` texels.
#[cfg(not(target_arch = "wasm32"))]
const TEXTURE_ROW_BYTES: u64 = TEXTURE_WIDTH as u64 * 16;

/// Round a texture's rows up to its class: 3, then 1.5x powers of two and powers of two
/// plus one, at most `max` (one row less where `max` is a power of two and `rows` fits).
/// No class is a power of two. llvmpipe (lavapipe) compiles a kernel anew for every
/// combination of its textures' power-of-two sizes (`pot_width`/`pot_height` in its
/// sampler state), and a large matmul kernel takes seconds to compile (10 to 40 s for
/// the tall tiles of the time): with heights of 64 or 128 rows among 48 or 96, MiniLM's
/// batch of 12 or 24 sentences recompiled its products where 16 and 32 did not (a
/// server stalled on each new batch size).
#[cfg(not(target_arch = "wasm32"))]
fn rows_class(rows: u32, max: u32) -> u32 {
    let p = rows.max(1).next_power_of_two();
    let mid = p / 4 * 3;
    let class = if rows <= 3 {
        3
    } else if rows <= mid {
        mid
    } else {
        p + 1
    };
    if class < max {
        class
    } else if max.is_power_of_two() && rows < max {
        max - 1
    } else {
        max
    }
}

/// A pooled operand texture; dropping it returns it to its pool (its height is its
/// class of rows).
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub(crate) struct PooledTexture {
    texture: Option<wgpu::Texture>,
    /// Weak: the pool's texture cache holds textures, and they must not keep it alive.
    pool: Weak<PoolInner>,
}

impl PooledTexture {
    #[cfg(not(target_arch = "wasm32"))]
    pub fn texture(&self) -> &wgpu::Texture {
        self.texture.as_ref().expect("pooled texture present until drop")
    }

    /// Its rows (its class).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn rows(&self) -> u32 {
        self.texture().height()
    }

    /// Whether it holds 32-bit words (`rgba32uint`) rather than floats.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn words(&self) -> bool {
        self.texture().format() == wgpu::TextureFormat::Rgba32Uint
    }
}

// (Native only, as operand textures are: the npm package's size budget.)
#[cfg(not(target_arch = "wasm32"))]
impl Drop for PooledTexture {
    fn drop(&mut self) {
        if let (Some(t), Some(pool)) = (self.texture.take(), self.pool.upgrade()) {
            pool.counters.in_use(-((u64::from(t.height()) * TEXTURE_ROW_BYTES) as i64));
            if let Ok(mut free) = pool.free_textures.lock() {
                free.entry((t.format() == wgpu::TextureFormat::Rgba32Uint, t.height())).or_default().push(t);
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
            #[cfg(not(target_arch = "wasm32"))]
            free_textures: Mutex::new(HashMap::new()),
            counters,
            held: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            #[cfg(not(target_arch = "wasm32"))]
            texture_cache: Mutex::new(TextureCache::default()),
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
                let budgeted = !usage.contains(wgpu::BufferUsages::MAP_READ);
                if budgeted {
                    self.reserve(class, &format!("a {bytes}-byte buffer"))?;
                }
                self.0.counters.add(crate::stats::Counter::Buffers, 1);
                self.0.counters.allocated(class as i64);
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("tessera"),
                    size: class,
                    usage,
                    mapped_at_creation: false,
                })
            }
        };
        self.0.counters.in_use(class as i64);
        Ok(PooledBuffer {
            buffer: Some(buffer),
            class,
            usage,
            pool: self.0.clone(),
            borrowed: false,
            #[cfg(not(target_arch = "wasm32"))]
            lent: AtomicBool::new(false),
        })
    }

    /// Count `class` more bytes as held, first releasing free buffers and textures when
    /// that would pass the memory budget; past it even then, `Error::OutOfMemory`
    /// naming `what`.
    fn reserve(&self, class: u64, what: &str) -> Result<()> {
        let limit = self.0.limit.load(Ordering::Relaxed);
        if limit > 0 && self.held() + class > limit {
            self.trim();
            let held = self.held();
            if held + class > limit {
                return Err(Error::OutOfMemory {
                    context: format!("{what} over the device's {limit}-byte memory budget:"),
                    requested: class,
                    available: Some(limit.saturating_sub(held)),
                });
            }
        }
        self.0.held.fetch_add(class, Ordering::Relaxed);
        Ok(())
    }

    /// An `rgba32float` texture (`rgba32uint` with `words`) [`TEXTURE_WIDTH`] texels wide
    /// with at least `rows` rows (at most `max_rows`), for operands copied in
    /// (`TEXTURE_BINDING | COPY_DST`); from the free list or newly created, within the
    /// memory budget as buffers are.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn texture(&self, device: &wgpu::Device, rows: u32, max_rows: u32, words: bool) -> Result<PooledTexture> {
        let class = rows_class(rows, max_rows);
        let bytes = u64::from(class) * TEXTURE_ROW_BYTES;
        let reused =
            self.0.free_textures.lock().ok().and_then(|mut f| f.get_mut(&(words, class)).and_then(|v| v.pop()));
        let texture = match reused {
            Some(t) => t,
            None => {
                self.reserve(bytes, &format!("a {rows}-row operand texture"))?;
                self.0.counters.add(crate::stats::Counter::Buffers, 1);
                self.0.counters.allocated(bytes as i64);
                device.create_texture(&wgpu::TextureDescriptor {
                    label: Some("tessera operand"),
                    size: wgpu::Extent3d { width: TEXTURE_WIDTH, height: class, depth_or_array_layers: 1 },
                    mip_level_count: 1,
                    sample_count: 1,
                    dimension: wgpu::TextureDimension::D2,
                    format: if words { wgpu::TextureFormat::Rgba32Uint } else { wgpu::TextureFormat::Rgba32Float },
                    // Sampled, or read as storage (`kernels::TexelRead`).
                    usage: wgpu::TextureUsages::TEXTURE_BINDING
                        | wgpu::TextureUsages::STORAGE_BINDING
                        | wgpu::TextureUsages::COPY_DST,
                    view_formats: &[],
                })
            }
        };
        self.0.counters.in_use(bytes as i64);
        Ok(PooledTexture { texture: Some(texture), pool: Arc::downgrade(&self.0) })
    }

    /// The cached copy of `range` of `buffer` (as words where `words`), if one is kept.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn cached_texture(&self, buffer: &PooledBuffer, range: (u64, u64), words: bool) -> Option<Arc<PooledTexture>> {
        let mut c = self.0.texture_cache.lock().ok()?;
        c.clock += 1;
        let now = c.clock;
        let e = c.entries.iter_mut().find(|e| e.copies(buffer.key(), range, words))?;
        e.used = now;
        Some(e.texture.clone())
    }

    /// Keep `texture`, the copy of `range` of `buffer`, for later submits (not for an
    /// application's buffer, or one lent to it, which it may write at any time),
    /// evicting the least recently used past the cache's capacity. Call it once the
    /// submit that copies is queued: a realisation that finds the copy must not be able
    /// to overtake it.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn cache_texture(&self, buffer: &PooledBuffer, range: (u64, u64), words: bool, texture: &Arc<PooledTexture>) {
        let bytes = u64::from(texture.rows()) * TEXTURE_ROW_BYTES;
        let capacity = TextureCache::capacity(self.0.limit.load(Ordering::Relaxed));
        if buffer.borrowed || buffer.lent.load(Ordering::Relaxed) || bytes > capacity {
            return;
        }
        let evicted = match self.0.texture_cache.lock() {
            Ok(mut c) => {
                c.clock += 1;
                let used = c.clock;
                let key = buffer.key();
                if c.entries.iter().any(|e| e.copies(key, range, words)) {
                    return; // another realisation kept its copy first
                }
                c.entries.push(CachedTexture { buffer: key, range, words, texture: texture.clone(), bytes, used });
                c.bytes += bytes;
                let mut evicted = Vec::new();
                while c.bytes > capacity {
                    let Some(oldest) = c.entries.iter().map(|e| e.used).min() else { break };
                    evicted.extend(c.take(|e| e.used == oldest));
                }
                evicted
            }
            Err(_) => Vec::new(),
        };
        drop(evicted);
    }

    /// Drop the cached copies of `buffer`: it is written in place.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forget_textures(&self, buffer: &PooledBuffer) {
        self.0.forget_textures_of(buffer.key());
    }

    /// An application's buffer, used in place and never pooled, counted or destroyed.
    pub fn borrow(&self, buffer: wgpu::Buffer) -> PooledBuffer {
        let (class, usage) = (buffer.size(), buffer.usage());
        PooledBuffer {
            buffer: Some(buffer),
            class,
            usage,
            pool: self.0.clone(),
            borrowed: true,
            #[cfg(not(target_arch = "wasm32"))]
            lent: AtomicBool::new(false),
        }
    }

    /// Destroy every free buffer and texture; returns the bytes released.
    pub fn trim(&self) -> u64 {
        let (mut freed, mut budgeted) = (0, 0);
        // Cached textures go back to the free list first (those a running submit still
        // reads return when it lets them go).
        #[cfg(not(target_arch = "wasm32"))]
        drop(self.0.texture_cache.lock().map(|mut c| c.take(|_| true)).unwrap_or_default());
        #[cfg(not(target_arch = "wasm32"))]
        if let Ok(mut f) = self.0.free_textures.lock() {
            for ((_, rows), textures) in f.drain() {
                for t in textures {
                    t.destroy();
                    freed += u64::from(rows) * TEXTURE_ROW_BYTES;
                    budgeted += u64::from(rows) * TEXTURE_ROW_BYTES;
                }
            }
        }
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

    #[test]
    fn texture_row_classes_cover_and_stop_at_the_limit() {
        use super::rows_class;
        let got: Vec<u32> = [0, 1, 2, 3, 4, 5, 7, 8, 100, 16384].iter().map(|&r| rows_class(r, 16384)).collect();
        assert_eq!(got, [3, 3, 3, 3, 5, 6, 9, 9, 129, 16384]);
        assert_eq!(rows_class(13000, 16384), 16383);
        assert_eq!(rows_class(16000, 12000), 12000);
        // Every class holds its rows, wastes at most half of them plus a row, and is no power
        // of two below the limit: one texture state per kernel on llvmpipe.
        for rows in 1..=20000u32 {
            let c = rows_class(rows, 16384);
            if rows <= 16384 {
                assert!(c >= rows, "{rows} -> {c}");
            }
            if rows < 16384 {
                assert!(!c.is_power_of_two(), "{rows} -> {c}");
                assert!(rows <= 3 || c <= rows + rows / 2 + 1, "{rows} -> {c}");
            }
        }
    }
}
