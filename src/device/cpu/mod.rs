//! The CPU backend: the same schedule the wgpu backend renders, run on the host with
//! every dtype at its own precision.
//!
//! - `buffer`: storage per dtype (f32, f16, i32, u32, bool, GGUF blocks) and the
//!   chunks of values expressions compute in;
//! - `expr`: fused element-wise kernels, compiled once per realisation and evaluated
//!   over chunks of output indices on rayon's threads;
//! - `reduce`: reductions over any axis set, their input expression fused;
//! - `matmul`: batched products over `sgemm` (the `gemm` crate natively, a SIMD128
//!   kernel of our own in wasm), quantised weights dequantised panel by panel;
//! - `rows`: softmax, layer/RMS norm and attention, each its own loop;
//! - `scatter`: row writes in place, consecutive ones over the same rows in one pass;
//! - `reference`: the f64 interpreter over `src/reference/`, the tests' oracle
//!   ([`Device::reference`](crate::Device::reference)).
//!
//! A convolution reaches here as `Im2col` (an element-wise kernel, materialised because
//! it is a matmul operand) under a matmul: im2col plus GEMM.

mod aligned;
pub(crate) mod buffer;
mod expr;
mod math;
mod matmul;
mod memory;
mod par;
mod reduce;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod reference;
mod rows;
mod scatter;
mod sgemm;

use crate::device::{Device, Readback, Storage};
use crate::graph::schedule::{buffer_source, matmul_operand, KernelKind};
use crate::graph::Op;
use crate::stats::Counter;
use crate::{Error, Result, Tensor};
use buffer::{CpuBuffer, HostBuffer};
use expr::Program;
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) use par::threads;

/// Empty the pool of freed buffers (shared by every CPU device); the bytes released.
pub(crate) fn trim_pool() -> u64 {
    memory::trim()
}

/// Record kernel `k` (with the `n - 1` that follow it when they ran as one pass),
/// started at `t0`, in the profile.
#[cfg(not(target_arch = "wasm32"))]
fn record_kernel(k: &crate::graph::schedule::ScheduledKernel, n: usize, t0: std::time::Instant) {
    let start_us = t0.duration_since(*epoch()).as_secs_f64() * 1e6;
    let more = if n > 1 { format!(" and {} more", n - 1) } else { String::new() };
    let label = format!("cpu {}{more} {:?}", k.root.op().name(), k.root.dims());
    let duration_us = t0.elapsed().as_secs_f64() * 1e6;
    crate::profile::record([crate::profile::KernelTime { label, start_us, duration_us }]);
}

/// Realise `targets` on the CPU backend and return the values of the first `n_read`
/// as device bytes (`None` when `n_read` is 0).
pub(crate) fn run(dev: &Device, targets: &[Tensor], n_read: usize) -> Result<Option<Vec<Readback>>> {
    let mut sched = crate::graph::schedule::schedule_with(targets, usize::MAX, u64::MAX, false);
    if std::env::var("TESSERA_EPILOGUE").as_deref() != Ok("0") {
        crate::graph::schedule::fuse_epilogues(&mut sched, targets, usize::MAX, u64::MAX, true);
    }
    if std::env::var("TESSERA_MULTI_OUTPUT").as_deref() != Ok("0") {
        crate::graph::schedule::group_siblings(&mut sched, usize::MAX, u64::MAX);
        if cfg!(not(target_arch = "wasm32")) {
            crate::graph::schedule::group_row_writes(&mut sched, usize::MAX);
        }
    }
    if let Some(k) = sched.kernels.iter().find(|k| k.root.dtype().is_quantized() && k.kind != KernelKind::Quantize) {
        return Err(crate::kernels::quantized_output(&k.root));
    }
    // Each buffer is dropped after its last reader unless it is a target.
    let mut last_use: HashMap<u64, usize> = HashMap::new();
    for (j, k) in sched.kernels.iter().enumerate() {
        let mut stack: Vec<Tensor> = k.root.node().inputs.clone();
        for sib in &k.siblings {
            stack.extend(sib.node().inputs.iter().cloned());
        }
        let mut seen = std::collections::HashSet::new();
        while let Some(t) = stack.pop() {
            if !seen.insert(t.id()) {
                continue;
            }
            match buffer_source(&t, &sched.materialised) {
                Some(b) => {
                    last_use.insert(b.id(), j);
                }
                None => stack.extend(t.node().inputs.iter().cloned()),
            }
        }
    }
    let mut produced: HashMap<u64, Arc<CpuBuffer>> = HashMap::new();
    let target_ids: Vec<u64> = targets.iter().map(|t| t.id()).collect();
    for (j, k) in sched.kernels.iter().enumerate() {
        // The kernel's outputs: its root's, then its siblings' (a multi-output kernel,
        // or row writes over the same rows).
        let roots: Vec<Tensor> = std::iter::once(k.root.clone()).chain(k.siblings.iter().cloned()).collect();
        if k.kind == KernelKind::Scatter {
            if cfg!(target_arch = "wasm32") {
                return Err(crate::kernels::rows_left_out());
            }
            #[cfg(not(target_arch = "wasm32"))]
            let t0 = crate::profile::enabled().then(std::time::Instant::now);
            scatter::run_group(&roots, &sched.materialised, &mut produced)?;
            #[cfg(not(target_arch = "wasm32"))]
            if let Some(t0) = t0 {
                record_kernel(k, roots.len(), t0);
            }
            continue;
        }
        for t in &roots {
            reserve(dev, t.dtype().storage_bytes(t.numel()))?;
        }
        let outs = {
            let buffer = |t: &Tensor| buffer_of(t, &sched.materialised, &produced);
            #[cfg(not(target_arch = "wasm32"))]
            let t0 = crate::profile::enabled().then(std::time::Instant::now);
            let outs = if k.siblings.is_empty() {
                let is_leaf = |t: &Tensor| sched.is_buffer(t);
                vec![kernel(k, &sched.materialised, &is_leaf, &buffer, &dev.0.counters)?]
            } else {
                // The siblings are computed with the root; one that another reads is
                // computed, not loaded.
                let ids: Vec<u64> = roots.iter().map(Tensor::id).collect();
                let leaf = |t: &Tensor| !ids.contains(&t.id()) && sched.is_buffer(t);
                Program::compile_roots(&roots, true, &leaf, &buffer)?.run_all(k.root.numel())?
            };
            #[cfg(not(target_arch = "wasm32"))]
            if let Some(t0) = t0 {
                record_kernel(k, 1, t0);
            }
            outs
        };
        for (t, o) in roots.iter().zip(outs) {
            produced.insert(t.id(), Arc::new(CpuBuffer::new(o, &dev.0.counters)));
        }
        produced.retain(|id, _| last_use.get(id).is_none_or(|&l| l > j) || target_ids.contains(id));
    }
    dev.0.counters.add(Counter::Kernels, sched.kernels.len() as u64);
    dev.0.counters.add(Counter::Realizations, 1);
    dev.0.counters.add(Counter::Plans, 1);
    let mut out = Vec::with_capacity(n_read);
    for (i, t) in targets.iter().enumerate() {
        let b = match produced.get(&t.id()) {
            Some(b) => {
                t.set_storage(Storage::Cpu(b.clone()));
                b.clone()
            }
            None => match t.storage() {
                Some(Storage::Cpu(b)) => b,
                _ => return Err(Error::Unsupported(format!("cpu: tensor {} was not computed", t.id()))),
            },
        };
        if i < n_read {
            out.push(Readback::Bytes(b.device_bytes()));
        }
    }
    Ok((n_read > 0).then_some(out))
}

/// The buffer holding `t`'s values: computed in this realisation (`produced`) or the
/// storage of a realised tensor.
fn buffer_of(
    t: &Tensor,
    materialised: &std::collections::HashSet<u64>,
    produced: &HashMap<u64, Arc<CpuBuffer>>,
) -> Result<Arc<CpuBuffer>> {
    let src = buffer_source(t, materialised).unwrap_or_else(|| t.clone());
    match (produced.get(&src.id()), src.storage()) {
        (Some(b), _) => Ok(b.clone()),
        (None, Some(Storage::Cpu(b))) => Ok(b),
        _ => Err(Error::Unsupported(format!("cpu: tensor {} has no CPU buffer", src.id()))),
    }
}

/// Refuse an output of `bytes` the host cannot hold: past the device's memory budget
/// ([`Device::memory_limit`]), or past what the host can give ([`host_room`]). Tensors
/// already computed stay valid.
fn reserve(dev: &Device, bytes: u64) -> Result<()> {
    if let Some(limit) = dev.memory_limit() {
        let used = dev.0.counters.in_use.load(std::sync::atomic::Ordering::Relaxed);
        if used.saturating_add(bytes) > limit {
            let context = "cpu: a kernel's output".to_string();
            return Err(Error::OutOfMemory { context, requested: bytes, available: Some(limit.saturating_sub(used)) });
        }
    }
    host_room(bytes, "a kernel's output")
}

/// Refuse `bytes` (of `what`) that the host cannot back: past its free memory
/// ([`memory::host_available`]: with overcommit the allocator grants more, and the
/// process is killed when the pages are written), or more than the allocator grants.
pub(crate) fn host_room(bytes: u64, what: &str) -> Result<()> {
    if bytes >= memory::HOST_CHECK_FROM_BYTES {
        if let Some(room) = memory::host_available().filter(|&room| bytes > room) {
            let context = format!("cpu: {what} (the host's free memory)");
            return Err(Error::OutOfMemory { context, requested: bytes, available: Some(room) });
        }
    }
    // Probe the allocator so an impossible size is an error rather than an abort.
    let mut probe: Vec<u8> = Vec::new();
    match usize::try_from(bytes).ok().map(|b| probe.try_reserve_exact(b)) {
        Some(Ok(())) => Ok(()),
        _ => Err(Error::OutOfMemory { context: format!("cpu: {what}"), requested: bytes, available: None }),
    }
}

/// The clock profile timestamps count from.
#[cfg(not(target_arch = "wasm32"))]
fn epoch() -> &'static std::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(std::time::Instant::now)
}

/// Compute all of `t` (a kernel's input that the kernel reads whole), after checking
/// that the host can hold it: an unrealised input can be a broadcast far larger than
/// anything stored.
fn whole_input(
    t: &Tensor,
    is_leaf: &dyn Fn(&Tensor) -> bool,
    buffer: &dyn Fn(&Tensor) -> Result<Arc<CpuBuffer>>,
) -> Result<HostBuffer> {
    let bytes = (t.numel() as u64).saturating_mul(8);
    host_room(bytes, "a kernel's input")?;
    Program::compile(t, false, is_leaf, buffer)?.run(t.numel())
}

/// Compute one scheduled kernel.
fn kernel(
    k: &crate::graph::schedule::ScheduledKernel,
    materialised: &std::collections::HashSet<u64>,
    is_leaf: &dyn Fn(&Tensor) -> bool,
    buffer: &dyn Fn(&Tensor) -> Result<Arc<CpuBuffer>>,
    counters: &Arc<crate::stats::Counters>,
) -> Result<HostBuffer> {
    let (kind, root) = (k.kind, &k.root);
    let ins = &root.node().inputs;
    match kind {
        KernelKind::Elementwise => Program::compile(root, true, is_leaf, buffer)?.run(root.numel()),
        KernelKind::Reduce => {
            let Op::Reduce { op, axes } = root.op() else { unreachable!("reduce kernels root a reduction") };
            let prog = Program::compile(&ins[0], false, is_leaf, buffer)?;
            reduce::reduce(&prog, ins[0].dims(), *op, axes, root.dtype())
        }
        KernelKind::Quantize => {
            let values = whole_input(&ins[0], is_leaf, buffer)?.into_f32();
            let out = HostBuffer::Quant(root.dtype(), crate::quant::quantize(root.dtype(), &values));
            memory::recycle(HostBuffer::F32(values));
            Ok(out)
        }
        KernelKind::Segment => {
            let Op::SegmentReduce { op } = root.op() else { unreachable!("segment kernels root a segment reduction") };
            let offsets = whole_input(&ins[1], is_leaf, buffer)?.to_f64(ins[1].numel());
            let d = ins[0].dims()[1];
            // Sums of rows gathered from a table read the table's rows where they are.
            if *op == crate::graph::ReduceOp::Sum {
                if let Some((table, rows)) = reduce::gathered_rows(&ins[0], is_leaf, buffer)? {
                    if let Some(t) = table.as_f32().filter(|t| rows.iter().all(|&r| (r + 1) * d <= t.len())) {
                        return Ok(reduce::segment_sum_rows(t, &rows, &offsets, d));
                    }
                }
            }
            let values = whole_input(&ins[0], is_leaf, buffer)?.into_f32();
            let out = reduce::segment(*op, &values, &offsets, d);
            memory::recycle(HostBuffer::F32(values));
            Ok(out)
        }
        KernelKind::TopK => {
            let Op::TopK { k } = root.op() else { unreachable!("top-k kernels root a top-k") };
            let values = whole_input(&ins[0], is_leaf, buffer)?.into_f32();
            let out = reduce::topk(&values, ins[0].dims().last().copied().unwrap_or(1), *k);
            memory::recycle(HostBuffer::F32(values));
            Ok(out)
        }
        KernelKind::Scatter => unreachable!("scatters run in place in `run`"),
        KernelKind::Matmul => {
            let operand = |t: &Tensor| -> Result<matmul::Operand> {
                let (b, transposed) = matmul_operand(t, materialised).ok_or_else(|| {
                    Error::Unsupported(format!("cpu: matmul operand {} was not materialised", t.id()))
                })?;
                Ok(matmul::Operand { buf: buffer(&b)?, dims: t.dims().to_vec(), transposed })
            };
            let prod = k.product.as_ref().unwrap_or(root);
            let ins = &prod.node().inputs;
            let c = matmul::matmul(prod.dims(), &operand(&ins[0])?, &operand(&ins[1])?)?;
            match &k.product {
                None => Ok(c),
                // The epilogue, over the product as it leaves the kernel.
                Some(p) => {
                    let c = Arc::new(CpuBuffer::new(c, counters));
                    let leaf = |t: &Tensor| t.id() == p.id() || is_leaf(t);
                    let buf = |t: &Tensor| if t.id() == p.id() { Ok(c.clone()) } else { buffer(t) };
                    Program::compile(root, true, &leaf, &buf)?.run(root.numel())
                }
            }
        }
        KernelKind::Softmax => {
            let Op::Softmax { axis, log } = root.op() else { unreachable!("softmax kernels root a softmax") };
            rows::softmax(&*buffer(&ins[0])?, root.dims(), *axis, *log)
        }
        KernelKind::Norm => {
            let Op::Norm { rms, eps, weight, bias } = root.op() else { unreachable!("norm kernels root a norm") };
            let w = weight.then(|| buffer(&ins[1])).transpose()?;
            let b = bias.then(|| buffer(&ins[1 + usize::from(*weight)])).transpose()?;
            let d = root.dims().last().copied().unwrap_or(1);
            rows::norm(&*buffer(&ins[0])?, d, *rms, *eps, w.as_deref().map(|b| &**b), b.as_deref().map(|b| &**b))
        }
        KernelKind::Attention => {
            let Op::Attention { causal } = root.op() else { unreachable!("attention kernels root attention") };
            let bias = ins.get(3).map(|b| buffer(b).map(|buf| (buf, b.dims().to_vec()))).transpose()?;
            let s = ins[1].dims()[ins[1].rank() - 2];
            rows::attention(
                &*buffer(&ins[0])?,
                &*buffer(&ins[1])?,
                &*buffer(&ins[2])?,
                bias.as_ref().map(|(b, d)| (&***b, d.as_slice())),
                *causal,
                root.dims(),
                s,
                root.dtype(),
            )
        }
    }
}
