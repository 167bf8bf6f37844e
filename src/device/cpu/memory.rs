//! Memory hints for gathers and scatters over large tables: a row read or written at a
//! random place in a table of hundreds of megabytes misses the caches and, with 4 KiB
//! pages, the TLB. Prefetching the rows a few steps ahead keeps several misses in
//! flight at once, and transparent huge pages (2 MiB) let the TLB cover the table.
//! Both are hints: they change no value, and where the platform has neither they do
//! nothing.
//!
//! Freed buffers are recycled ([`take`], [`recycle`]): a training step frees
//! and allocates the same sizes every time, and glibc hands large freed blocks back to
//! the kernel (munmap, or a trim of the heap's top), so each step's outputs would
//! otherwise fault in and zero fresh pages: about 700 faults a step for a sparse step
//! on a 1M-row table. The pool keeps buffers of 64 KiB to 64 MiB, 256 MiB in all,
//! oldest out first; `Device::trim_pool` empties it. wasm's allocator never returns
//! memory, so the page's build has no pool.

use super::buffer::HostBuffer;

/// Buffers at least this large ask for huge pages.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const HUGE_FROM_BYTES: usize = 8 << 20;

/// Ask the CPU to start loading the cache line of `v[i]` (nothing when `i` is out of
/// range or the target has no prefetch instruction we use).
#[inline(always)]
pub(crate) fn prefetch<T>(v: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if i < v.len() {
        // SAFETY: `i` is in bounds, so the pointer is valid; a prefetch never faults
        // and writes nothing.
        #[allow(unused_unsafe)]
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(v.as_ptr().add(i) as *const i8);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (v, i);
}

/// Prefetch the cache lines of `v[start..start + len]` (at most four lines: a row of a
/// table, not a whole tensor).
#[inline(always)]
pub(crate) fn prefetch_run<T>(v: &[T], start: usize, len: usize) {
    let per_line = (64 / std::mem::size_of::<T>().max(1)).max(1);
    let mut i = start;
    let end = start.saturating_add(len.min(4 * per_line));
    while i < end {
        prefetch(v, i);
        i += per_line;
    }
    if len > 0 {
        prefetch(v, start + len - 1);
    }
}

/// Back a large buffer by transparent huge pages where the kernel allows it (Linux's
/// `madvise(MADV_HUGEPAGE)` over the 2 MiB-aligned pages inside the buffer). Best
/// before the pages are first written: a zeroed `Vec` from the allocator has not
/// touched them yet.
pub(crate) fn advise_huge_pages<T>(v: &mut [T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let bytes = std::mem::size_of_val(v);
        let start = v.as_mut_ptr() as usize;
        let first = start.next_multiple_of(HUGE);
        let end = (start + bytes) / HUGE * HUGE;
        if bytes >= HUGE_FROM_BYTES && end > first {
            // SAFETY: the range lies inside `v`'s allocation and is page-aligned;
            // MADV_HUGEPAGE changes how the kernel backs it, never its contents. A
            // refusal (no THP support) is ignored: the hint is optional.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

/// Smallest buffer the pool keeps (smaller ones stay in malloc's heap anyway).
const POOL_MIN_BYTES: u64 = 64 << 10;
/// Largest buffer the pool keeps: per-step activations, not whole tables.
const POOL_MAX_BUFFER: u64 = 64 << 20;
/// Bytes the pool holds at most.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
const POOL_MAX_BYTES: u64 = 256 << 20;

#[cfg(not(target_arch = "wasm32"))]
mod pool {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// Freed buffers, oldest first, and their bytes.
    pub(super) static POOL: Mutex<(VecDeque<HostBuffer>, u64)> = Mutex::new((VecDeque::new(), 0));

    pub(super) fn lock() -> std::sync::MutexGuard<'static, (VecDeque<HostBuffer>, u64)> {
        POOL.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The size class of `n` elements: the next power of two, or 1.5 times a power of
/// two where that is enough (so a buffer wastes at most a third of its room).
fn size_class(n: usize) -> usize {
    let p = n.max(1).next_power_of_two();
    let mid = p / 4 * 3;
    if n <= mid && mid > 0 {
        mid
    } else {
        p
    }
}

/// The room (in elements) to give a new buffer of `dtype` and `n` elements that the
/// pool will keep once it is freed, or `None` when the pool would not keep it.
pub(crate) fn pooled_capacity(dtype: crate::DType, n: usize) -> Option<usize> {
    let width = match dtype {
        crate::DType::F32 | crate::DType::I32 | crate::DType::U32 => 4,
        crate::DType::F16 => 2,
        crate::DType::Bool => 1,
        _ => return None,
    };
    let room = size_class(n);
    (cfg!(not(target_arch = "wasm32")) && (POOL_MIN_BYTES..=POOL_MAX_BUFFER).contains(&((room * width) as u64)))
        .then_some(room)
}

/// A pooled buffer of `dtype` holding `n` elements, if the pool has one with room for
/// them within their size class: zeros, or (`zeroed` false, for a writer of every
/// element) whatever it last held.
pub(crate) fn take(dtype: crate::DType, n: usize, zeroed: bool) -> Option<HostBuffer> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        if dtype.is_quantized() {
            return None;
        }
        let room = size_class(n);
        let mut g = pool::lock();
        let i = g.0.iter().position(|b| b.dtype_tag() == dtype && (n..=room).contains(&b.capacity()))?;
        let mut b = g.0.remove(i)?;
        g.1 -= b.capacity_bytes();
        drop(g);
        if zeroed {
            b.reset_len(0);
        }
        b.reset_len(n);
        Some(b)
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = (dtype, n, zeroed);
        None
    }
}

/// Give a freed buffer to the pool (dropped instead when it is outside the pool's
/// sizes; the oldest buffers leave when the pool would pass its budget).
pub(crate) fn recycle(b: HostBuffer) {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let bytes = b.capacity_bytes();
        // Quantised blocks are weights, not per-step outputs.
        if !(POOL_MIN_BYTES..=POOL_MAX_BUFFER).contains(&bytes) || matches!(b, HostBuffer::Quant(..)) {
            return;
        }
        let mut evicted = Vec::new();
        let mut g = pool::lock();
        while g.1 + bytes > POOL_MAX_BYTES {
            let Some(old) = g.0.pop_front() else { break };
            g.1 -= old.capacity_bytes();
            evicted.push(old);
        }
        g.1 += bytes;
        g.0.push_back(b);
        drop(g);
        // Freed outside the lock.
        drop(evicted);
    }
    #[cfg(target_arch = "wasm32")]
    drop(b);
}

/// Empty the pool; returns the bytes released.
pub(crate) fn trim() -> u64 {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let mut g = pool::lock();
        let freed = std::mem::take(&mut g.0);
        let bytes = std::mem::replace(&mut g.1, 0);
        drop(g);
        drop(freed);
        bytes
    }
    #[cfg(target_arch = "wasm32")]
    0
}

/// Outputs at least this large are checked against the host's free memory (reading
/// /proc costs microseconds, nothing beside filling 64 MiB).
pub(crate) const HOST_CHECK_FROM_BYTES: u64 = 64 << 20;

/// Bytes the host can still give this process before the kernel's OOM killer steps
/// in, where Linux says: `MemAvailable` plus free swap, and less where a cgroup v2
/// limit (a container's) leaves less room. `None` where the platform does not say.
///
/// The allocator cannot answer this: with overcommit, a reservation of more than is
/// free succeeds, and the process is killed when the kernel writes the pages.
pub(crate) fn host_available() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let read = |p: &str| std::fs::read_to_string(p).ok();
        available_from(&meminfo, read("/sys/fs/cgroup/memory.max"), read("/sys/fs/cgroup/memory.current"))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// [`host_available`] from the text of /proc/meminfo and of the cgroup's `memory.max`
/// and `memory.current` (absent outside a cgroup v2 hierarchy).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn available_from(meminfo: &str, cg_max: Option<String>, cg_current: Option<String>) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb.saturating_mul(1024))
    };
    let host = field("MemAvailable:")?.saturating_add(field("SwapFree:").unwrap_or(0));
    // "max" when the cgroup has no limit.
    let cg = match (cg_max.and_then(|m| m.trim().parse::<u64>().ok()), cg_current) {
        (Some(max), Some(cur)) => cur.trim().parse::<u64>().ok().map(|c| max.saturating_sub(c)),
        _ => None,
    };
    Some(cg.map_or(host, |c| c.min(host)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_room_counts_free_swap_and_a_containers_limit() {
        let meminfo = "MemTotal:       24000000 kB\nMemAvailable:    2000000 kB\nSwapFree:        1000000 kB\n";
        assert_eq!(super::available_from(meminfo, None, None), Some(3_000_000 * 1024));
        let cg = |max: &str, cur: &str| super::available_from(meminfo, Some(max.into()), Some(cur.into()));
        assert_eq!(cg("max\n", "5000\n"), Some(3_000_000 * 1024), "no cgroup limit");
        assert_eq!(cg("1073741824\n", "73741824\n"), Some(1_000_000_000), "the container's room");
        assert_eq!(super::available_from("MemTotal: 1 kB\n", None, None), None, "no MemAvailable line");
    }

    #[test]
    fn pooled_buffers_come_back_zeroed_and_within_budget() {
        // Sizes no other test allocates, so tests running beside this one cannot take them.
        let n = (POOL_MIN_BYTES as usize / 4) + 4321;
        let mut b = HostBuffer::zeros(crate::DType::F32, n);
        if let HostBuffer::F32(v) = &mut b {
            v.iter_mut().for_each(|x| *x = 7.0);
        }
        recycle(b);
        // For a writer of every element: the old values stay, with no pass over them.
        let kept = take(crate::DType::F32, n - 3, false).expect("the freed buffer is pooled");
        assert!(matches!(&kept, HostBuffer::F32(v) if v.len() == n - 3 && v.iter().all(|&x| x == 7.0)));
        recycle(kept);
        let again = take(crate::DType::F32, n, true).expect("the freed buffer is pooled");
        assert!(matches!(&again, HostBuffer::F32(v) if v.len() == n && v.iter().all(|&x| x == 0.0)));
        // Another dtype or length is not a match; too small or too large is not kept.
        recycle(again);
        assert!(take(crate::DType::I32, n, true).is_none());
        assert!(take(crate::DType::F32, 4 * n, true).is_none());
        // A length of the same size class reuses the allocation.
        let shorter = take(crate::DType::F32, n - 3, true).expect("same class");
        assert!(matches!(&shorter, HostBuffer::F32(v) if v.len() == n - 3 && v.iter().all(|&x| x == 0.0)));
        recycle(shorter);
        recycle(HostBuffer::zeros(crate::DType::F32, 1000));
        assert!(take(crate::DType::F32, 1000, true).is_none());
        // The budget holds: the oldest buffers leave first. (Room without values: the
        // pages are never touched.)
        let big: Vec<HostBuffer> = (0..(POOL_MAX_BYTES / POOL_MAX_BUFFER + 2))
            .map(|_| HostBuffer::F32(Vec::with_capacity(POOL_MAX_BUFFER as usize / 4).into()))
            .collect();
        big.into_iter().for_each(recycle);
        assert!(pool::lock().1 <= POOL_MAX_BYTES);
        assert!(take(crate::DType::F32, n, true).is_none(), "the oldest left first");
        assert!(trim() >= POOL_MAX_BYTES / 2);
    }

    #[test]
    fn hints_keep_values() {
        let mut v = vec![0.0f32; (HUGE_FROM_BYTES / 4) + 12345];
        advise_huge_pages(&mut v);
        for (i, x) in v.iter_mut().enumerate() {
            *x = i as f32;
        }
        prefetch_run(&v, v.len() - 3, 100);
        prefetch(&v, v.len());
        assert_eq!(v[v.len() - 1], (v.len() - 1) as f32);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as f32));
    }
}
