//! Memory hints for gathers and scatters over large tables: a row read or written at a
//! random place in a table of hundreds of megabytes misses the caches and, with 4 KiB
//! pages, the TLB. Prefetching the rows a few steps ahead keeps several misses in
//! flight at once, and transparent huge pages (2 MiB) let the TLB cover the table.
//! Both are hints: they change no value, and where the platform has neither they do
//! nothing.

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

#[cfg(test)]
mod tests {
    use super::*;

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
