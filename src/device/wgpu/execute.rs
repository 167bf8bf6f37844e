//! The GPU executor: render the schedule (or replay it), plan buffers, encode every
//! dispatch into one command encoder, submit once, and read back only what was asked
//! for. A kernel over a tensor larger than one storage binding runs as several
//! dispatches over windows (`plan_dispatches`): element-wise kernels and gathers by
//! windows of their output or of a large input, reductions by blocks of rows or window
//! by window of their input, matrix products by row blocks; what cannot split is an
//! `Error::Limit` naming the kernel.

use super::plan;
use super::pool::{PooledBuffer, PooledTexture};
use super::{GpuContext, GpuStorage, PendingCheck, STORAGE};
use crate::device::{Device, Storage};
use crate::kernels::{plan_kernels, KernelSpec};
use crate::stats::Counter;
use crate::{Error, Result, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// One dispatch of a kernel: its meta words, the byte range bound of its output and of
/// each input, and its workgroups. A kernel is one dispatch over whole buffers, or, when
/// a tensor it touches exceeds the storage binding limit, one dispatch per window (see
/// the module docs).
struct Dispatch {
    meta: Vec<u32>,
    out: (u64, u64),
    inputs: Vec<(u64, u64)>,
    workgroups: [u32; 3],
}

/// Bytes per element of `t`'s storage (packed f16 counts 2).
fn element_bytes(t: &Tensor) -> u64 {
    t.dtype().storage_bytes(1024).div_ceil(1024).max(1)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `grain` widened so that a window starting at any multiple of it, in units of
/// `unit_bytes`, begins on a 256-byte boundary (the largest offset alignment WebGPU
/// allows).
fn aligned_grain(grain: u64, unit_bytes: u64) -> u64 {
    let g = 256 / gcd(256, unit_bytes.max(1));
    grain / gcd(grain, g) * g
}

/// The bytes of `t`'s buffer that units `lo..hi` of `unit_bytes` each occupy, rounded up
/// to whole words and kept inside the buffer.
fn window_bytes(t: &Tensor, lo: u64, hi: u64, unit_bytes: u64) -> (u64, u64) {
    let start = lo * unit_bytes;
    (start, ((hi - lo) * unit_bytes).div_ceil(4).saturating_mul(4).min(t.storage_bytes() - start))
}

/// A matrix product as dispatches over row blocks of A and C (B bound whole), or `None`
/// when B does not fit one binding or a single block of rows does not.
fn row_dispatches(
    ctx: &GpuContext,
    s: &KernelSpec,
    rs: &crate::kernels::RowSplit,
    bind_limit: u64,
) -> Option<Result<Vec<Dispatch>>> {
    let (a, b) = (&s.inputs[0], &s.inputs[1]);
    if b.storage_bytes() > bind_limit {
        return None;
    }
    let (ea, ec) = (element_bytes(a) * rs.a_row, element_bytes(&s.output) * rs.c_row);
    // Row blocks start where both offsets are multiples of 256 bytes.
    let grain = aligned_grain(aligned_grain(1, ea), ec);
    let chunk = (bind_limit / ea.max(ec).max(1)) / grain * grain;
    if chunk == 0 {
        return None;
    }
    let rows = s.meta[rs.m_slot] as u64;
    let mut out = Vec::new();
    let mut lo = 0;
    while lo < rows {
        let hi = (lo + chunk).min(rows);
        let mut meta = s.meta.clone();
        meta[rs.m_slot] = (hi - lo) as u32;
        let y = (hi - lo).div_ceil(rs.rows_per_group);
        if y > ctx.caps.max_workgroups as u64 {
            return Some(Err(Error::Limit {
                what: format!("{}: workgroups over rows", s.label),
                needed: y,
                limit: ctx.caps.max_workgroups as u64,
            }));
        }
        out.push(Dispatch {
            meta,
            out: window_bytes(&s.output, lo, hi, ec),
            inputs: vec![window_bytes(a, lo, hi, ea), (0, b.storage_bytes())],
            workgroups: [s.workgroups[0], y as u32, s.workgroups[2]],
        });
        lo = hi;
    }
    Some(Ok(out))
}

/// Copy bytes `off .. off + size` of `buffer` into an operand texture (of 32-bit words
/// with `words`: an input not f32) for a `KernelSpec::textured` binding, row after row
/// of [`TEXTURE_WIDTH`] texels: the whole rows in one copy, the texels left in a second. The texture comes from `local` (this
/// submit's textures whose kernels are encoded) or the pool.
#[cfg(not(target_arch = "wasm32"))]
fn stage_texture(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    local: &mut Vec<PooledTexture>,
    buffer: &wgpu::Buffer,
    (off, size): (u64, u64),
    words: bool,
) -> Result<PooledTexture> {
    use crate::kernels::TEXTURE_WIDTH;
    let width = u64::from(TEXTURE_WIDTH);
    let texels = size / 16;
    let rows = texels.div_ceil(width);
    if size % 16 != 0 || off % 16 != 0 || rows == 0 || rows > u64::from(ctx.caps.texture_rows) {
        return Err(Error::Gpu {
            context: "operand texture".into(),
            message: format!("bytes {off}..{} are not whole texels within {} rows", off + size, ctx.caps.texture_rows),
        });
    }
    let fits = |t: &PooledTexture| u64::from(t.rows()) >= rows && u64::from(t.rows()) <= 2 * rows && t.words() == words;
    let texture = match local.iter().position(fits) {
        Some(p) => local.swap_remove(p),
        None => ctx.pool.texture(&ctx.device, rows as u32, ctx.caps.texture_rows, words)?,
    };
    let (full, rest) = ((texels / width) as u32, (texels % width) as u32);
    let from = |offset| wgpu::TexelCopyBufferInfo {
        buffer,
        layout: wgpu::TexelCopyBufferLayout { offset, bytes_per_row: Some(TEXTURE_WIDTH * 16), rows_per_image: None },
    };
    let to = |y| wgpu::TexelCopyTextureInfo {
        texture: texture.texture(),
        mip_level: 0,
        origin: wgpu::Origin3d { x: 0, y, z: 0 },
        aspect: wgpu::TextureAspect::All,
    };
    if full > 0 {
        let extent = wgpu::Extent3d { width: TEXTURE_WIDTH, height: full, depth_or_array_layers: 1 };
        encoder.copy_buffer_to_texture(from(off), to(0), extent);
    }
    if rest > 0 {
        let extent = wgpu::Extent3d { width: rest, height: 1, depth_or_array_layers: 1 };
        encoder.copy_buffer_to_texture(from(off + u64::from(full) * width * 16), to(full), extent);
    }
    Ok(texture)
}

/// An operand texture holding `range` of tensor `tensor`'s buffer (32-bit words where
/// `words`), kept for the later kernels of a submit that read the same; shared with the
/// pool's texture cache where the tensor was realised before this submit. (The npm
/// package stages none: operand textures are native only.)
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
struct Staged {
    tensor: u64,
    range: (u64, u64),
    words: bool,
    texture: Arc<PooledTexture>,
}

/// Split every kernel into its dispatches, or fail with `Error::Limit` naming the kernel
/// and the tensor that cannot be bound.
fn plan_dispatches(ctx: &GpuContext, dev: &Device, specs: &[KernelSpec]) -> Result<Vec<Vec<Dispatch>>> {
    let caps = dev.capabilities();
    let bind_limit = caps.max_storage_buffer_binding_size;
    let mut out = Vec::with_capacity(specs.len());
    for s in specs {
        let bytes = s.output.storage_bytes();
        if bytes > caps.max_buffer_size {
            return Err(Error::Limit {
                what: format!("kernel {} output of shape {:?} ({} bytes)", s.label, s.output.dims(), bytes),
                needed: bytes,
                limit: caps.max_buffer_size,
            });
        }
        if s.output.numel() as u64 >= u32::MAX as u64 {
            return Err(Error::Limit {
                what: format!("kernel {} element count", s.label),
                needed: s.output.numel() as u64,
                limit: u32::MAX as u64 - 1,
            });
        }
        let whole = |t: &Tensor| (0, t.storage_bytes());
        let too_big = bytes > bind_limit || s.inputs.iter().any(|t| t.storage_bytes() > bind_limit);
        if let Some(big) = s.extra_outputs.iter().chain(&s.inputs).find(|t| t.storage_bytes() > bind_limit) {
            if !s.extra_outputs.is_empty() {
                return Err(Error::Limit {
                    what: format!("multi-output kernel {}: tensor of shape {:?} in one binding", s.label, big.dims()),
                    needed: big.storage_bytes(),
                    limit: bind_limit,
                });
            }
        }
        if !too_big {
            out.push(vec![Dispatch {
                meta: s.meta.clone(),
                out: whole(&s.output),
                inputs: s.inputs.iter().map(whole).collect(),
                workgroups: s.workgroups,
            }]);
            continue;
        }
        // Products split by rows; element-wise kernels and reductions by windows of
        // their output (inputs read at the output's own index windowed with it) or of
        // one large gathered input; anything else too large is a clear error.
        let limit_err = |t: &Tensor, role: &str| {
            Error::Limit {
            what: format!(
                "kernel {} {role} of shape {:?} in one storage binding (element-wise kernels, reductions and matmuls split into windows; a quantised matmul B, the fused attention kernel's operands and a quantisation's input must fit one)",
                s.label,
                t.dims()
            ),
            needed: t.storage_bytes(),
            limit: bind_limit,
        }
        };
        if let (None, Some(rs)) = (&s.window, &s.rows) {
            out.push(row_dispatches(ctx, s, rs, bind_limit).ok_or_else(|| {
                let big = [&s.output, &s.inputs[0], &s.inputs[1]].into_iter().max_by_key(|t| t.storage_bytes());
                limit_err(big.unwrap_or(&s.output), "operand")
            })??);
            continue;
        }
        let Some(w) = &s.window else {
            let (big, role) = s
                .inputs
                .iter()
                .map(|t| (t, "input"))
                .chain([(&s.output, "output")])
                .max_by_key(|(t, _)| t.storage_bytes())
                .unwrap_or((&s.output, "output"));
            return Err(limit_err(big, role));
        };
        // A large input read at other indices (a gather table, a sliced tensor) goes
        // through windows of its own, one per dispatch (at most one such input).
        let mut gathered: Option<(usize, usize, usize)> = None;
        for (k, (t, base)) in s.inputs.iter().zip(&w.input_base).enumerate() {
            if base.is_none() && t.storage_bytes() > bind_limit {
                // A reduction can only add up partial results where they combine.
                let ok = !w.reduces || w.accumulate.is_some();
                match (w.gather.get(k).copied().flatten(), gathered) {
                    (Some((b, l)), None) if ok => gathered = Some((k, b, l)),
                    _ => return Err(limit_err(t, "input")),
                }
            }
        }
        // Bytes each output element spans in every windowed binding. Windows hold a
        // whole number of workgroups and start where every binding's offset is a
        // multiple of 256 bytes (the largest offset alignment WebGPU allows).
        // Only bindings that do not fit whole are windowed.
        let ipo = w.inputs_per_output;
        let out_windowed = bytes > bind_limit;
        let mut windowed: Vec<Option<usize>> = s
            .inputs
            .iter()
            .zip(&w.input_base)
            .enumerate()
            .map(|(k, (t, b))| b.filter(|_| t.storage_bytes() > bind_limit && gathered.is_none_or(|g| g.0 != k)))
            .collect();
        let mut steps: Vec<u64> = out_windowed.then(|| element_bytes(&s.output)).into_iter().collect();
        steps.extend(s.inputs.iter().zip(&windowed).filter(|(_, b)| b.is_some()).map(|(t, _)| element_bytes(t) * ipo));
        let grain =
            steps.iter().fold(w.outputs_per_group.max(w.per_thread as u64).max(1), |g, &st| aligned_grain(g, st));
        let widest = steps.iter().copied().max().unwrap_or(4);
        let mut chunk = (bind_limit / widest) / grain * grain;
        if chunk == 0 {
            // Rows longer than a binding (a reduction over everything, say): reduce the
            // one large input window by window into the output, combining as it goes.
            let big: Vec<usize> = (0..s.inputs.len()).filter(|&k| windowed[k].is_some()).collect();
            match (big.as_slice(), gathered, w.accumulate, out_windowed) {
                (&[k], None, Some(_), false) if w.gather.get(k).copied().flatten().is_some() => {
                    let (b, l) = w.gather[k].unwrap_or_default();
                    gathered = Some((k, b, l));
                    windowed[k] = None;
                    chunk = s.output.numel().max(1) as u64;
                }
                _ => {
                    let big = s.inputs.iter().max_by_key(|t| t.storage_bytes()).unwrap_or(&s.output);
                    return Err(limit_err(big, "input"));
                }
            }
        }
        // Windows of the gathered input: whole 256-byte units, at most one binding.
        let gather_windows: Vec<(u64, u64)> = match gathered {
            Some((k, ..)) => {
                let t = &s.inputs[k];
                let e = element_bytes(t);
                let unit = aligned_grain(1, e);
                let span = (bind_limit / e) / unit * unit;
                let total = t.numel() as u64;
                if span == 0 {
                    return Err(limit_err(t, "input"));
                }
                (0..total.div_ceil(span)).map(|c| (c * span, ((c + 1) * span).min(total))).collect()
            }
            None => vec![(0, 0)],
        };
        let n = s.output.numel() as u64;
        let per = w.per_thread as u64;
        let mut chunks = Vec::new();
        let mut lo = 0u64;
        while lo < n {
            let hi = (lo + chunk).min(n);
            let mut meta = s.meta.clone();
            meta[w.first] = (lo / per) as u32;
            meta[w.out_base] = if out_windowed { (lo / per) as u32 } else { 0 };
            let mut inputs = Vec::with_capacity(s.inputs.len());
            for (t, base) in s.inputs.iter().zip(&windowed) {
                match base {
                    Some(slot) => {
                        meta[*slot] = (lo * ipo) as u32;
                        inputs.push(window_bytes(t, lo, hi, element_bytes(t) * ipo));
                    }
                    None => inputs.push(whole(t)),
                }
            }
            let workgroups = crate::kernels::fold_groups((hi - lo).div_ceil(w.outputs_per_group), &ctx.caps, &s.label)?;
            let out =
                if out_windowed { window_bytes(&s.output, lo, hi, element_bytes(&s.output)) } else { whole(&s.output) };
            for (gi, &(glo, ghi)) in gather_windows.iter().enumerate() {
                let (mut meta, mut inputs) = (meta.clone(), inputs.clone());
                if let Some(slot) = w.accumulate {
                    meta[slot] = u32::from(gi > 0);
                }
                if let Some((k, base_slot, len_slot)) = gathered {
                    meta[base_slot] = glo as u32;
                    meta[len_slot] = (ghi - glo) as u32;
                    inputs[k] = window_bytes(&s.inputs[k], glo, ghi, element_bytes(&s.inputs[k]));
                }
                chunks.push(Dispatch { meta, out, inputs, workgroups });
            }
            lo = hi;
        }
        out.push(chunks);
    }
    Ok(out)
}

fn binding(buffer: &wgpu::Buffer, offset: u64, size: u64) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset, size: wgpu::BufferSize::new(size) })
}

/// Run a realisation of `targets` on the GPU and return the values of the first `n_read`
/// of them (`None` when `n_read` is 0). With a `sink`, the first target is also written
/// into the sink's texture by one more kernel in the same submit.
pub(crate) async fn run(
    ctx: &GpuContext,
    dev: &Device,
    targets: &[Tensor],
    n_read: usize,
    sink: Option<&super::interop::TextureSink>,
) -> Result<Option<Vec<crate::device::Readback>>> {
    let read = n_read > 0;
    let _serial = ctx.exclusive();
    ctx.check_alive()?;
    ctx.take_uncaptured("an earlier operation")?;
    let sig = crate::graph::signature::Signature::of(targets);
    let cached = if plan::replay_enabled() { ctx.plans.replay(&sig) } else { None };
    let mut specs = match cached {
        Some(specs) => {
            dev.0.counters.add(Counter::Replays, 1);
            specs
        }
        None => {
            let specs = plan_kernels(&ctx.caps, dev.max_kernel_inputs(), targets)?;
            ctx.plans.store(&sig, &specs);
            dev.0.counters.add(Counter::Plans, 1);
            specs
        }
    };
    drop(sig);
    if specs.is_empty() && !read && sink.is_none() {
        // Everything is realised already: nothing to encode, no submit.
        return Ok(None);
    }

    // Bounds-check status words: one buffer, each kernel's checks at its own base.
    let mut n_checks = 0usize;
    let mut all_checks = Vec::new();
    for s in &mut specs {
        if let Some(slot) = s.status_slot {
            s.meta[slot] = 2 * n_checks as u32;
        }
        n_checks += s.checks.len();
        all_checks.extend(s.checks.iter().cloned());
    }
    let dispatches = plan_dispatches(ctx, dev, &specs)?;

    let oom = ctx.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);

    // Meta parameters: one uniform buffer, one aligned slice per kernel.
    let align = ctx.device.limits().min_uniform_buffer_offset_alignment.max(16) as u64;
    let mut meta_bytes: Vec<u8> = Vec::new();
    let mut meta_at = Vec::with_capacity(specs.len());
    for d in dispatches.iter().flatten() {
        let off = (meta_bytes.len() as u64).div_ceil(align) * align;
        meta_bytes.resize(off as usize, 0);
        let words = d.meta.len().div_ceil(4).max(1) * 4;
        for w in 0..words {
            meta_bytes.extend_from_slice(&d.meta.get(w).copied().unwrap_or(0).to_le_bytes());
        }
        meta_at.push((off, (words * 4) as u64));
    }
    let meta_buf = ctx.pool.get(
        &ctx.device,
        meta_bytes.len().max(16) as u64,
        wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    )?;
    if !meta_bytes.is_empty() {
        ctx.queue.write_buffer(meta_buf.buffer(), 0, &meta_bytes);
    }
    let status = (n_checks > 0).then(|| ctx.pool.get(&ctx.device, 8 * n_checks as u64, STORAGE)).transpose()?;

    let mut encoder =
        ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("tessera realise") });
    // Profiling: a begin and an end timestamp around each kernel's pass.
    let profiling = crate::profile::enabled() && ctx.info.capabilities.timestamp_query && !specs.is_empty();
    let n_queries = (2 * specs.len()).min(4096) as u32;
    let queries = profiling.then(|| {
        ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("tessera profile"),
            ty: wgpu::QueryType::Timestamp,
            count: n_queries,
        })
    });
    if let Some(st) = &status {
        encoder.clear_buffer(st.buffer(), 0, None);
    }

    // Buffers: realised inputs bind their own; each kernel's output comes from the pool.
    // An intermediate goes to a local free list after its last reader so later kernels
    // of this submit can reuse it; the pool gets it back only after the submit.
    let mut last_use: HashMap<u64, usize> = HashMap::new();
    for (j, s) in specs.iter().enumerate() {
        for i in s.inputs.iter().chain(&s.alias).chain(&s.extra_aliases) {
            last_use.insert(i.id(), j);
        }
    }
    let target_ids: Vec<u64> = targets.iter().map(|t| t.id()).collect();
    let mut produced: HashMap<u64, Arc<PooledBuffer>> = HashMap::new();
    let mut local_free: Vec<Arc<PooledBuffer>> = Vec::new();
    // Operand textures of kernels already encoded, free for later kernels of this submit.
    #[cfg(not(target_arch = "wasm32"))]
    let mut local_textures: Vec<PooledTexture> = Vec::new();
    // Operand textures that a later kernel of this submit may read again. A copy is shared
    // until the tensor's last reader (MiniLM's Q, K and V products and the residual after
    // them read one activation).
    // (Native only, as all of the operand textures' state: the npm package's size budget.)
    #[cfg(not(target_arch = "wasm32"))]
    let mut staged: Vec<Staged> = Vec::new();
    // Copies of tensors realised before this submit, for the pool's texture cache once the
    // submit is queued (another thread's realisation must not read a copy whose submit
    // it could overtake).
    #[cfg(not(target_arch = "wasm32"))]
    let mut to_cache: Vec<(Arc<PooledBuffer>, Staged)> = Vec::new();
    // Kept copies that kernels of this submit read.
    #[cfg(not(target_arch = "wasm32"))]
    let mut read_kept: Vec<Arc<PooledTexture>> = Vec::new();
    let mut inherited: Vec<Arc<PendingCheck>> = Vec::new();
    let mut dispatched = 0u64;
    // Each newly compiled kernel's own validation scope, popped right after compiling.
    let mut compile_checks = Vec::new();

    let mut buffer_of = |t: &Tensor, produced: &HashMap<u64, Arc<PooledBuffer>>| -> Result<Arc<PooledBuffer>> {
        if let Some(b) = produced.get(&t.id()) {
            return Ok(b.clone());
        }
        match t.storage() {
            Some(Storage::Gpu(g)) => {
                // Carry each unresolved (or failed) check once: passed ones are dropped,
                // so a chain of realisations does not accumulate them.
                for c in &g.checks {
                    if !c.passed() && !inherited.iter().any(|x| Arc::ptr_eq(x, c)) {
                        inherited.push(c.clone());
                    }
                }
                Ok(g.buffer.clone())
            }
            _ => Err(Error::Gpu { context: "realise".into(), message: format!("tensor {} has no GPU buffer", t.id()) }),
        }
    };

    // Each kernel's pipeline from the cache, and the ones this submit compiles on
    // several threads where there are several (a model's first call, a new class of
    // shapes): the driver compiles each when its pipeline is created, and lavapipe
    // compiles on every calling thread at once (2.0-2.2x faster for 12 product and
    // attention kernels on 2 cores). Each keeps its own validation scope, pushed and
    // popped on the thread that compiles it.
    #[cfg(not(target_arch = "wasm32"))]
    let mut pipelines: HashMap<usize, Arc<wgpu::ComputePipeline>> = HashMap::new();
    #[cfg(not(target_arch = "wasm32"))]
    {
        let mut missing: Vec<usize> = Vec::new();
        for (j, s) in specs.iter().enumerate() {
            if !dispatches[j].iter().any(|d| d.workgroups.iter().all(|&w| w > 0)) {
                continue;
            }
            match ctx.cached_pipeline(&s.source) {
                Some(p) => {
                    pipelines.insert(j, p);
                }
                None if !missing.iter().any(|&m| specs[m].source == s.source) => missing.push(j),
                None => {}
            }
        }
        // (The thread count is asked only then: `available_parallelism` reads the
        // cgroup's quota each time, and a replayed plan compiles nothing.)
        let threads = if missing.len() > 1 { ctx.compile_threads().min(missing.len()) } else { 1 };
        if threads > 1 {
            let next = std::sync::atomic::AtomicUsize::new(0);
            let results: Vec<_> = std::thread::scope(|sc| {
                let workers: Vec<_> = (0..threads)
                    .map(|_| {
                        sc.spawn(|| {
                            let mut out = Vec::new();
                            while let Some(&j) = missing.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                                let s = &specs[j];
                                let (p, scope) = ctx.pipeline(&s.label, &s.source, s.trusted);
                                out.push((j, p, scope.map(|scope| scope.pop())));
                            }
                            out
                        })
                    })
                    .collect();
                // A panic in a compiling thread (wgpu's) surfaces here as it would have in this one.
                workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
            });
            for (j, p, check) in results {
                pipelines.insert(j, p);
                if let Some(check) = check {
                    compile_checks.push((j, check));
                }
            }
        }
    }

    let mut meta_index = 0;
    for (j, s) in specs.iter().enumerate() {
        let need = s.output.storage_bytes();
        let out = match (&s.alias, local_free.iter().position(|b| b.class >= need && b.class <= need.max(256) * 2)) {
            // An in-place kernel writes the buffer of the tensor it consumes.
            (Some(a), _) => buffer_of(a, &produced)?,
            (None, Some(p)) => local_free.swap_remove(p),
            (None, None) => Arc::new(ctx.pool.get(&ctx.device, need, STORAGE)?),
        };
        let inputs: Vec<Arc<PooledBuffer>> = s.inputs.iter().map(|i| buffer_of(i, &produced)).collect::<Result<_>>()?;
        let mut extra = Vec::with_capacity(s.extra_outputs.len());
        for (e, t) in s.extra_outputs.iter().enumerate() {
            let need = t.storage_bytes();
            extra.push(
                match (
                    s.extra_aliases.get(e),
                    local_free.iter().position(|b| b.class >= need && b.class <= need.max(256) * 2),
                ) {
                    // A further row write's table, written in place.
                    (Some(a), _) => buffer_of(a, &produced)?,
                    (None, Some(p)) => local_free.swap_remove(p),
                    (None, None) => Arc::new(ctx.pool.get(&ctx.device, need, STORAGE)?),
                },
            );
        }
        // A buffer bound both as an input and as an in-place output, or as two of them,
        // fails validation.
        let written = || std::iter::once(&out).chain(&extra);
        let shared = inputs.iter().any(|b| written().any(|w| Arc::ptr_eq(b, w)))
            || extra.iter().enumerate().any(|(e, b)| written().take(e + 1).any(|w| Arc::ptr_eq(b, w)));
        if (s.alias.is_some() || !s.extra_aliases.is_empty()) && shared {
            return Err(Error::Unsupported(format!(
                "{}: an operand shares the table's buffer; realise a copy of it first",
                s.label
            )));
        }
        // Copies kept of a buffer written in place are stale.
        #[cfg(not(target_arch = "wasm32"))]
        {
            for b in s.alias.iter().map(|_| &out).chain(extra.iter().take(s.extra_aliases.len())) {
                ctx.pool.forget_textures(b);
                to_cache.retain(|c| !Arc::ptr_eq(&c.0, b));
            }
        }
        let mut pipeline_of = None;
        let chunks = &dispatches[j];
        for (c, d) in chunks.iter().enumerate() {
            if !d.workgroups.iter().all(|&w| w > 0) {
                continue;
            }
            let pipeline = match &pipeline_of {
                Some(p) => Arc::clone(p),
                None => {
                    #[cfg(not(target_arch = "wasm32"))]
                    let (p, compile_scope) = match pipelines.remove(&j) {
                        Some(p) => (p, None),
                        None => ctx.pipeline(&s.label, &s.source, s.trusted),
                    };
                    #[cfg(target_arch = "wasm32")]
                    let (p, compile_scope) = ctx.pipeline(&s.label, &s.source, s.trusted);
                    if let Some(scope) = compile_scope {
                        compile_checks.push((j, scope.pop()));
                    }
                    pipeline_of = Some(Arc::clone(&p));
                    p
                }
            };
            let (off, size) = meta_at[meta_index + c];
            let layout = pipeline.get_bind_group_layout(0);
            // Inputs bound as textures: their bytes copied in first, unless an earlier
            // kernel of this submit did (an input bound twice in one kernel gets two).
            #[cfg_attr(target_arch = "wasm32", allow(unused_mut))]
            let mut textures: Vec<(usize, usize, wgpu::TextureView)> = Vec::new();
            // (Native only: the npm package's size budget.)
            #[cfg(not(target_arch = "wasm32"))]
            for (k, (b, range)) in inputs.iter().zip(&d.inputs).enumerate() {
                if s.textured >> k & 1 == 1 {
                    let (tensor, words) = (s.inputs[k].id(), s.inputs[k].dtype() != crate::DType::F32);
                    let same = |x: &Staged| (x.tensor, x.range, x.words) == (tensor, *range, words);
                    let e = match (0..staged.len()).find(|&e| same(&staged[e]) && !textures.iter().any(|t| t.1 == e)) {
                        Some(e) => e,
                        None => {
                            // A tensor realised before this submit may have a copy kept
                            // from an earlier one; what this submit produces is new. (A
                            // second binding in one kernel gets its own copy.)
                            let twice = staged.iter().any(same);
                            let earlier = !produced.contains_key(&tensor) && !twice;
                            let texture = match earlier.then(|| ctx.pool.cached_texture(b, *range, words)).flatten() {
                                Some(t) => t,
                                None => {
                                    let t = Arc::new(stage_texture(
                                        ctx,
                                        &mut encoder,
                                        &mut local_textures,
                                        b.buffer(),
                                        *range,
                                        words,
                                    )?);
                                    dev.0.counters.add(Counter::OperandCopies, 1);
                                    if earlier {
                                        let kept = Staged { tensor, range: *range, words, texture: t.clone() };
                                        to_cache.push((b.clone(), kept));
                                    }
                                    t
                                }
                            };
                            staged.push(Staged { tensor, range: *range, words, texture });
                            staged.len() - 1
                        }
                    };
                    let view = staged[e].texture.texture().create_view(&wgpu::TextureViewDescriptor::default());
                    textures.push((k, e, view));
                }
            }
            let mut entries = vec![
                wgpu::BindGroupEntry { binding: 0, resource: binding(meta_buf.buffer(), off, size) },
                wgpu::BindGroupEntry { binding: 1, resource: binding(out.buffer(), d.out.0, d.out.1) },
            ];
            for (k, (b, range)) in inputs.iter().zip(&d.inputs).enumerate() {
                let resource = match textures.iter().find(|t| t.0 == k) {
                    Some((_, _, view)) => wgpu::BindingResource::TextureView(view),
                    None => binding(b.buffer(), range.0, range.1),
                };
                entries.push(wgpu::BindGroupEntry { binding: 2 + k as u32, resource });
            }
            for (e, (b, t)) in extra.iter().zip(&s.extra_outputs).enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: (2 + s.inputs.len() + e) as u32,
                    resource: binding(b.buffer(), 0, t.storage_bytes()),
                });
            }
            if let (false, Some(st)) = (s.checks.is_empty(), &status) {
                entries.push(wgpu::BindGroupEntry {
                    binding: 2 + s.inputs.len() as u32,
                    resource: binding(st.buffer(), 0, 8 * n_checks as u64),
                });
            }
            let bind = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&s.label),
                layout: &layout,
                entries: &entries,
            });
            // A kernel's timestamps bracket all its windows.
            let (first, last) = (c == 0, c + 1 == chunks.len());
            let timestamp_writes =
                queries.as_ref().filter(|_| 2 * (j as u32) + 1 < n_queries && (first || last)).map(|q| {
                    wgpu::ComputePassTimestampWrites {
                        query_set: q,
                        beginning_of_pass_write_index: first.then_some(2 * j as u32),
                        end_of_pass_write_index: last.then_some(2 * j as u32 + 1),
                    }
                });
            let mut pass =
                encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(&s.label), timestamp_writes });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(d.workgroups[0], d.workgroups[1], d.workgroups[2]);
            dispatched += 1;
            drop(pass);
        }
        meta_index += chunks.len();
        // Textures of tensors no later kernel reads are free for the next copies.
        #[cfg(not(target_arch = "wasm32"))]
        for i in &s.inputs {
            if last_use.get(&i.id()) == Some(&j) {
                while let Some(e) = staged.iter().position(|x| x.tensor == i.id()) {
                    // One the cache keeps is not free, and stays alive until the submit
                    // is queued (a trim may empty the cache meanwhile).
                    match Arc::try_unwrap(staged.swap_remove(e).texture) {
                        Ok(t) => local_textures.push(t),
                        Err(kept) => read_kept.push(kept),
                    }
                }
            }
        }
        produced.insert(s.output.id(), out);
        for (t, b) in s.extra_outputs.iter().zip(extra) {
            produced.insert(t.id(), b);
        }
        for i in &s.inputs {
            if last_use.get(&i.id()) == Some(&j) && !target_ids.contains(&i.id()) && s.alias.is_none() {
                if let Some(b) = produced.remove(&i.id()) {
                    local_free.push(b);
                }
            }
        }
    }

    // The texture write reads the first target where the kernels left it.
    let sink_meta = match (sink, targets.first()) {
        (Some(sink), Some(t)) => {
            let src = buffer_of(t, &produced)?;
            dispatched += 1;
            Some(ctx.encode_texture_write(&mut encoder, &src, sink)?)
        }
        _ => None,
    };

    // Readback copies and status copies go in the same encoder.
    let mut staging = Vec::new();
    if read {
        for t in &targets[..n_read.min(targets.len())] {
            let src = buffer_of(t, &produced)?;
            let bytes = t.storage_bytes();
            let st = ctx.pool.get(&ctx.device, bytes, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST)?;
            encoder.copy_buffer_to_buffer(src.buffer(), 0, st.buffer(), 0, bytes);
            staging.push((st, bytes));
        }
    }
    let pending = match status.as_ref() {
        Some(st) => {
            let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
            let sb = ctx.pool.get(&ctx.device, 8 * n_checks as u64, usage)?;
            encoder.copy_buffer_to_buffer(st.buffer(), 0, sb.buffer(), 0, 8 * n_checks as u64);
            Some(Arc::new(PendingCheck::new(sb, all_checks)))
        }
        None => None,
    };

    let profile_read = queries.as_ref().and_then(|q| {
        let bytes = 8 * n_queries as u64;
        let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tessera profile resolve"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        encoder.resolve_query_set(q, 0..n_queries, &resolve, 0);
        // Profiling is best effort: over a memory budget it skips this realisation.
        let st = ctx.pool.get(&ctx.device, bytes, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST).ok()?;
        encoder.copy_buffer_to_buffer(&resolve, 0, st.buffer(), 0, bytes);
        Some((st, bytes))
    });

    ctx.queue.submit(Some(encoder.finish()));
    dev.0.counters.add(Counter::Submits, 1);
    dev.0.counters.add(Counter::Kernels, dispatched);
    dev.0.counters.add(Counter::Realizations, 1);
    drop(local_free);
    #[cfg(not(target_arch = "wasm32"))]
    drop((local_textures, read_kept, staged));
    drop(sink_meta);

    // Pop both scopes before awaiting either: on the web, error scopes are a per-device
    // stack, and another realisation running while this one awaits would push its own.
    // (Nothing between the pushes and here awaits, so the scopes are still on top.)
    let (v_pop, o_pop) = (validation.pop(), oom.pop());
    let v_err = v_pop.await;
    let o_err = o_pop.await;
    ctx.check_alive()?;
    for (j, check) in compile_checks {
        if let Some(e) = check.await {
            let s = &specs[j];
            ctx.evict_pipeline(&s.source);
            return Err(Error::Gpu { context: format!("kernel {} does not compile", s.label), message: e.to_string() });
        }
    }
    if let Some(e) = o_err {
        let requested = specs.iter().map(|s| s.output.storage_bytes()).sum();
        return Err(Error::OutOfMemory {
            context: format!("realising {} kernels ({e})", specs.len()),
            requested,
            available: None,
        });
    }
    if let Some(e) = v_err {
        let labels: Vec<&str> = specs.iter().map(|s| s.label.as_str()).collect();
        return Err(Error::Gpu { context: format!("kernels [{}]", labels.join(", ")), message: e.to_string() });
    }

    #[cfg(not(target_arch = "wasm32"))]
    for (b, k) in to_cache {
        ctx.pool.cache_texture(&b, k.range, k.words, &k.texture);
    }

    if let Some((st, bytes)) = &profile_read {
        let period = ctx.queue.get_timestamp_period() as f64;
        if let Ok(mut raw) = ctx.map_read(&[(st.buffer(), *bytes)]).await {
            let raw = raw.pop().unwrap_or_default();
            let tick = |i: usize| raw.get(8 * i..8 * i + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
            let events = specs.iter().enumerate().filter_map(|(j, s)| {
                let (a, b) = (tick(2 * j)?, tick(2 * j + 1)?);
                Some(crate::profile::KernelTime {
                    label: format!("{} {:?}", s.label, s.output.dims()),
                    start_us: a as f64 * period / 1e3,
                    duration_us: b.saturating_sub(a) as f64 * period / 1e3,
                })
            });
            crate::profile::record(events.collect::<Vec<_>>());
        }
    }

    let mut checks = inherited;
    checks.extend(pending);
    for t in targets {
        if let Some(b) = produced.get(&t.id()) {
            t.set_storage(Storage::Gpu(Arc::new(GpuStorage { buffer: b.clone(), checks: checks.clone() })));
        }
    }
    drop(produced);
    if !read {
        return Ok(None);
    }
    super::checks::resolve(ctx, &checks).await?;
    let bufs: Vec<(&wgpu::Buffer, u64)> = staging.iter().map(|(b, n)| (b.buffer(), *n)).collect();
    // A page keeps the bytes in JavaScript (one copy, as a raw WebGPU read makes):
    // through wasm memory, a 16 MB read cost two more copies of about 8 ms each.
    #[cfg(target_arch = "wasm32")]
    let read = ctx.map_read_with(&bufs, |v| {
        let a = v.as_uint8array();
        crate::device::Readback::Js(a.slice(0, a.length()))
    });
    #[cfg(not(target_arch = "wasm32"))]
    let read = ctx.map_read_with(&bufs, |v| crate::device::Readback::Bytes(v.to_vec()));
    Ok(Some(read.await?))
}
