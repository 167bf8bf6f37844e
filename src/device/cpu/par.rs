//! Data parallelism for the CPU backend: rayon's pool natively, the calling thread in
//! wasm (a page without cross-origin isolation has no threads). Work smaller than a
//! few chunks runs inline: spreading it would cost more than it saves.

use crate::Result;

/// Below this many elements a loop is not worth sending to other threads.
const PARALLEL_FROM: usize = 16 * 1024;

/// Threads the backend uses.
pub(crate) fn threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    {
        rayon::current_num_threads()
    }
    #[cfg(target_arch = "wasm32")]
    {
        1
    }
}

/// `f(first index, chunk)` over `out` in chunks of `chunk` elements, in parallel when
/// `out` is large; the first error wins.
pub(crate) fn chunks<T: Send>(
    out: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) -> Result<()> + Sync + Send,
) -> Result<()> {
    let chunk = chunk.max(1);
    #[cfg(not(target_arch = "wasm32"))]
    if out.len() >= PARALLEL_FROM && threads() > 1 {
        use rayon::prelude::*;
        return out.par_chunks_mut(chunk).enumerate().try_for_each(|(i, c)| f(i * chunk, c));
    }
    for (i, c) in out.chunks_mut(chunk).enumerate() {
        f(i * chunk, c)?;
    }
    Ok(())
}

/// `f(i)` for `i` in `0..n`, collected in order; in parallel when `parallel`.
pub(crate) fn map<R: Send>(n: usize, parallel: bool, f: impl Fn(usize) -> Result<R> + Sync + Send) -> Result<Vec<R>> {
    #[cfg(not(target_arch = "wasm32"))]
    if parallel && n > 1 && threads() > 1 {
        use rayon::prelude::*;
        return (0..n).into_par_iter().map(f).collect();
    }
    let _ = parallel;
    (0..n).map(f).collect()
}

/// `f(i, item)` for each of `items`, in parallel when `parallel`; the first error wins.
pub(crate) fn each<T: Send>(
    items: Vec<T>,
    parallel: bool,
    f: impl Fn(usize, T) -> Result<()> + Sync + Send,
) -> Result<()> {
    #[cfg(not(target_arch = "wasm32"))]
    if parallel && items.len() > 1 && threads() > 1 {
        use rayon::prelude::*;
        return items.into_par_iter().enumerate().try_for_each(|(i, t)| f(i, t));
    }
    let _ = parallel;
    items.into_iter().enumerate().try_for_each(|(i, t)| f(i, t))
}

/// Whether a loop over `work` elements should be spread over threads.
pub(crate) fn worth(work: usize) -> bool {
    work >= PARALLEL_FROM && threads() > 1
}

/// `f(row index, row)` over `out` in rows of `row` elements, in parallel when `out` is
/// large.
pub(crate) fn for_rows<T: Send>(out: &mut [T], row: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    let row = row.max(1);
    let _ = chunks(out, row, |first, c| {
        f(first / row, c);
        Ok(())
    });
}
