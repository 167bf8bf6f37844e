//! [`DistributedDataParallel`]: PyTorch DDP's semantics over any [`Communicator`].

use super::{from_host_bytes, host_bytes, weights_hash, Communicator};
use crate::nn::Module;
use crate::optim::{GradScaler, Optimizer};
use crate::{DType, Error, Gradients, Result, Tensor};
use std::collections::BTreeMap;
use std::time::Instant;

/// How [`DistributedDataParallel`] reduces and checks.
#[derive(Clone, Debug)]
pub struct DdpOptions {
    /// Gradient bytes (as f32) per all-reduce bucket; PyTorch's default is 25 MB.
    pub bucket_bytes: usize,
    /// Every this many steps, compare a hash of the weights across ranks (0: never).
    /// A difference is an error naming the step.
    pub check_every: u64,
    /// Broadcast buffers (BatchNorm running statistics) from rank 0 after every step,
    /// as PyTorch's `broadcast_buffers=True` does before every forward.
    pub broadcast_buffers: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions { bucket_bytes: 25 * 1024 * 1024, check_every: 100, broadcast_buffers: true }
    }
}

/// What a data-parallel step does besides averaging and updating.
#[derive(Default)]
pub struct DdpStep<'a> {
    /// Clip the global norm of the averaged gradients to this.
    pub clip_norm: Option<f64>,
    /// Dynamic loss scaling: a step is skipped on every rank when any rank's gradients
    /// overflow.
    pub scaler: Option<&'a mut GradScaler>,
    /// More tensors to compute and read with the loss (this rank's values).
    pub read: &'a [Tensor],
}

/// The outcome of one data-parallel step.
#[derive(Clone, Debug)]
pub struct DdpResult {
    /// This rank's loss.
    pub loss: f64,
    /// This rank's values of the `read` tensors.
    pub values: Vec<Vec<f64>>,
    /// False when every rank skipped the step for non-finite gradients.
    pub applied: bool,
    /// The global norm of the averaged gradients, before clipping (with `clip_norm`).
    pub grad_norm: Option<f64>,
    /// Seconds spent in the all-reduce (readback of buckets included).
    pub comm_seconds: f64,
}

/// PyTorch's `DistributedDataParallel` for a Tessera [`Module`]:
///
/// - construction broadcasts every parameter and buffer from rank 0;
/// - [`step`](Self::step) runs backward, averages the gradients across ranks in buckets
///   (the all-reduce of one bucket overlaps the readback of the next), clips by the
///   global norm of the *averaged* gradients, and updates;
/// - with a [`GradScaler`], a step whose averaged gradients are not finite is skipped on
///   every rank: an inf on any rank makes the sum inf everywhere, so the ranks agree
///   without another message;
/// - [`backward_no_sync`](Self::backward_no_sync) accumulates gradients locally, as
///   PyTorch's `no_sync()`; the next `step` reduces the sum;
/// - buffers are broadcast from rank 0 after every step (not synchronised BatchNorm:
///   batch statistics stay per rank, running statistics follow rank 0);
/// - every `check_every` steps the ranks compare a hash of their weights.
pub struct DistributedDataParallel {
    comm: Box<dyn Communicator>,
    options: DdpOptions,
    /// Trainable parameters: name, element count.
    params: Vec<(String, usize)>,
    /// Indices into `params` per bucket (parameters in reverse order, as PyTorch fills
    /// them in the order backward produces gradients).
    buckets: Vec<Vec<usize>>,
    bucket_sizes: Vec<usize>,
    /// Gradients accumulated by `backward_no_sync` (f32, flat, realised).
    pending: Option<Vec<Tensor>>,
    steps: u64,
    /// Host buffers per bucket, kept across steps (touched once, not per step).
    send: Vec<Vec<f32>>,
    recv: Vec<Vec<f32>>,
}

impl DistributedDataParallel {
    /// Wrap `model`'s training for the group `comm`: checks that every rank has the same
    /// parameter and buffer layout, then broadcasts rank 0's values to all.
    pub fn new(comm: Box<dyn Communicator>, model: &mut dyn Module, options: DdpOptions) -> Result<Self> {
        let params: Vec<(String, usize)> =
            model.slots().iter().filter(|s| s.trainable).map(|s| (s.name.clone(), s.tensor.numel())).collect();
        let per_bucket = (options.bucket_bytes / 4).max(1);
        let mut buckets: Vec<Vec<usize>> = Vec::new();
        let mut sizes: Vec<usize> = Vec::new();
        for j in (0..params.len()).rev() {
            let n = params[j].1;
            match (buckets.last_mut(), sizes.last_mut()) {
                (Some(b), Some(s)) if *s + n <= per_bucket => {
                    b.push(j);
                    *s += n;
                }
                _ => {
                    buckets.push(vec![j]);
                    sizes.push(n);
                }
            }
        }
        let ddp = DistributedDataParallel {
            comm,
            options,
            params,
            buckets,
            bucket_sizes: sizes,
            pending: None,
            steps: 0,
            send: Vec::new(),
            recv: Vec::new(),
        };
        ddp.check_layout(model)?;
        ddp.broadcast_state(model, true)?;
        Ok(ddp)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// The communicator (for the caller's own collectives).
    pub fn comm(&self) -> &dyn Communicator {
        self.comm.as_ref()
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Set the step count (after resuming from a checkpoint).
    pub fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }

    /// Element counts of the all-reduce buckets.
    pub fn bucket_sizes(&self) -> &[usize] {
        &self.bucket_sizes
    }

    /// Every rank must hold the same slots (names, shapes, dtypes, roles).
    fn check_layout(&self, model: &mut dyn Module) -> Result<()> {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for s in model.slots() {
            h.update(format!("{}:{:?}:{:?}:{};", s.name, s.tensor.dims(), s.tensor.dtype(), s.trainable));
        }
        let d = h.finalize();
        let mine = u64::from_le_bytes(d[..8].try_into().unwrap_or_default());
        let all = self.comm.all_gather_u64(mine)?;
        if all.iter().any(|&x| x != mine) {
            let differ: Vec<usize> = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
            return Err(Error::Distributed(format!(
                "rank(s) {differ:?} hold a model with other parameters, shapes or dtypes than rank 0"
            )));
        }
        Ok(())
    }

    /// Broadcast rank 0's parameters (with `params`) and buffers in one message.
    fn broadcast_state(&self, model: &mut dyn Module, params: bool) -> Result<()> {
        if self.comm.size() < 2 {
            return Ok(());
        }
        let mut slots = model.slots();
        let chosen: Vec<usize> = (0..slots.len()).filter(|&i| params || !slots[i].trainable).collect();
        if chosen.is_empty() {
            return Ok(());
        }
        let width = |d: DType| match d {
            DType::F16 => 2,
            DType::Bool => 1,
            _ => 4,
        };
        let sizes: Vec<usize> =
            chosen.iter().map(|&i| slots[i].tensor.numel() * width(slots[i].tensor.dtype())).collect();
        let mut bytes = Vec::with_capacity(sizes.iter().sum());
        if self.comm.rank() == 0 {
            for &i in &chosen {
                bytes.extend(host_bytes(slots[i].tensor)?);
            }
        } else {
            bytes.resize(sizes.iter().sum(), 0);
        }
        self.comm.broadcast(&mut bytes, 0)?;
        if self.comm.rank() != 0 {
            let mut off = 0;
            for (&i, &n) in chosen.iter().zip(&sizes) {
                let s = &mut slots[i];
                let t = from_host_bytes(&bytes[off..off + n], s.tensor.dims(), s.tensor.dtype(), s.tensor.device())?;
                *s.tensor = if s.trainable { t.requires_grad() } else { t };
                off += n;
            }
        }
        Ok(())
    }

    /// Each trainable slot's gradient from `loss` (zeros where the loss does not depend
    /// on it), plus what `backward_no_sync` accumulated, as flat f32.
    fn local_grads(&mut self, model: &mut dyn Module, loss: &Tensor) -> Result<Vec<Tensor>> {
        let grads = loss.backward()?;
        let slots = model.slots();
        let trainable: Vec<&Tensor> = slots.iter().filter(|s| s.trainable).map(|s| &*s.tensor).collect();
        if trainable.len() != self.params.len() {
            return Err(Error::Distributed(format!(
                "the model has {} trainable tensors, {} when DistributedDataParallel was made",
                trainable.len(),
                self.params.len()
            )));
        }
        let pending = self.pending.take();
        let mut out = Vec::with_capacity(trainable.len());
        for (j, t) in trainable.iter().enumerate() {
            let g = match grads.get(t) {
                Some(g) => g.cast(DType::F32).reshape([t.numel()]),
                None => Tensor::zeros([t.numel()], DType::F32, t.device()),
            };
            out.push(match &pending {
                Some(p) => g.add(&p[j]),
                None => g,
            });
        }
        Ok(out)
    }

    /// PyTorch's `no_sync()`: backward without communication; the gradients add up
    /// locally until the next [`step`](Self::step), which reduces their sum (scale the
    /// loss by the number of micro-batches, as in PyTorch). Returns this rank's loss.
    pub fn backward_no_sync(&mut self, model: &mut dyn Module, loss: &Tensor) -> Result<f64> {
        loss.check()?;
        let grads = self.local_grads(model, loss)?;
        let vals = pollster::block_on(loss.device().read_and_realize(std::slice::from_ref(loss), &grads))?;
        self.pending = Some(grads.iter().map(Tensor::detach).collect());
        Ok(vals.first().and_then(|v| v.first().copied()).unwrap_or(f64::NAN))
    }

    /// Sum `flat` (all gradients as one f32 vector, parameters in order) across ranks
    /// into `out` through the bucket layout, without copies (a bucket is a contiguous
    /// run of parameters): DDP's reduction without the device, for benchmarks.
    pub fn reduce_flat(&self, flat: &mut [f32], out: &mut [f32]) -> Result<()> {
        let total: usize = self.params.iter().map(|p| p.1).sum();
        if flat.len() != total || out.len() != total {
            return Err(Error::Distributed(format!(
                "reduce_flat: {total} values expected, got {} and {}",
                flat.len(),
                out.len()
            )));
        }
        // Buckets hold parameters in reverse order, so bucket k is the k-th run from the end.
        let (mut send, mut recv): (Vec<&mut [f32]>, Vec<&mut [f32]>) = (Vec::new(), Vec::new());
        let (mut rest_s, mut rest_r) = (flat, out);
        for &n in &self.bucket_sizes {
            let (a, b) = rest_s.split_at_mut(rest_s.len() - n);
            let (c, d) = rest_r.split_at_mut(rest_r.len() - n);
            send.push(b);
            recv.push(d);
            rest_s = a;
            rest_r = c;
        }
        self.comm.all_reduce_sum(&mut send, &mut recv, &mut |_, _| Ok(()))
    }

    /// One data-parallel training step (PyTorch's `loss.backward()` under DDP, then
    /// clipping, `scaler.step(opt)` and `opt.step()`): two realisations, one for the
    /// loss and gradients, one for the update.
    pub fn step(
        &mut self,
        model: &mut dyn Module,
        opt: &mut dyn Optimizer,
        loss: &Tensor,
        o: DdpStep<'_>,
    ) -> Result<DdpResult> {
        loss.check()?;
        let DdpStep { clip_norm, scaler, read } = o;
        let scale = scaler.as_ref().map(|s| s.scale);
        if scale.is_some() && self.pending.is_some() {
            return Err(Error::Unsupported(
                "backward_no_sync accumulation with a GradScaler: step every micro-batch or drop the scaler".into(),
            ));
        }
        let scaled = match scale {
            Some(s) => loss.mul_scalar(s),
            None => loss.clone(),
        };
        let grads = self.local_grads(model, &scaled)?;
        let dev = loss.device().clone();
        // On a GPU, one flat tensor per bucket, computed in the same realisation as the
        // loss, so each bucket is one readback. On the host backends the gradients are
        // read tensor by tensor (a copy each), which beats a concatenation there.
        let host = dev.is_cpu();
        let realised: Vec<Tensor> = if host {
            grads.clone()
        } else {
            self.buckets
                .iter()
                .map(|b| {
                    let parts: Vec<Tensor> = b.iter().map(|&j| grads[j].clone()).collect();
                    if parts.len() == 1 {
                        parts[0].clone()
                    } else {
                        Tensor::concat(&parts, 0)
                    }
                })
                .collect()
        };
        let mut to_read = vec![loss.clone()];
        to_read.extend_from_slice(read);
        let mut values = pollster::block_on(dev.read_and_realize(&to_read, &realised))?;
        let loss_value = values.remove(0).first().copied().unwrap_or(f64::NAN);

        let t0 = Instant::now();
        if self.send.len() != self.bucket_sizes.len() {
            self.send = self.bucket_sizes.iter().map(|&n| vec![0.0f32; n]).collect();
            self.recv = self.bucket_sizes.iter().map(|&n| vec![0.0f32; n]).collect();
        }
        let buckets = &self.buckets;
        let params = &self.params;
        let mut send: Vec<&mut [f32]> = self.send.iter_mut().map(|v| v.as_mut_slice()).collect();
        let mut recv: Vec<&mut [f32]> = self.recv.iter_mut().map(|v| v.as_mut_slice()).collect();
        self.comm.all_reduce_sum(&mut send, &mut recv, &mut |k, buf| {
            if host {
                let mut at = 0;
                for &j in &buckets[k] {
                    let n = params[j].1;
                    buf[at..at + n].copy_from_slice(&realised[j].to_vec_blocking::<f32>()?);
                    at += n;
                }
            } else {
                buf.copy_from_slice(&realised[k].to_vec_blocking::<f32>()?);
            }
            Ok(())
        })?;
        drop((send, recv));
        let reduced = &self.recv;
        let comm_seconds = t0.elapsed().as_secs_f64();
        drop(realised);
        drop(grads);

        // Every rank holds the same sums, so these decisions agree without messages.
        let inv = 1.0 / (self.comm.size() as f64 * scale.unwrap_or(1.0));
        let finite = reduced.iter().all(|b| b.iter().all(|x| x.is_finite()));
        let applied = scale.is_none() || finite;
        if let Some(s) = scaler {
            s.update(finite);
        }
        let mut grad_norm = None;
        let mut factor = inv;
        if let Some(max) = clip_norm {
            let sq: f64 = reduced.iter().flat_map(|b| b.iter()).map(|&x| (x as f64 * inv).powi(2)).sum();
            let norm = sq.sqrt();
            grad_norm = Some(norm);
            factor *= (max / (norm + 1e-6)).min(1.0);
        }
        if applied {
            let offsets_in_bucket: Vec<Vec<(usize, usize)>> = self
                .buckets
                .iter()
                .map(|b| {
                    let mut at = 0;
                    b.iter()
                        .map(|&j| {
                            let r = (j, at);
                            at += self.params[j].1;
                            r
                        })
                        .collect()
                })
                .collect();
            let mut slots = model.slots();
            let trainable: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].trainable).collect();
            let mut avg = Gradients::default();
            for (k, b) in reduced.iter().enumerate() {
                // One upload per parameter, in its own shape: views into one flat
                // upload cost more to evaluate than the copies they save.
                for &(j, at) in &offsets_in_bucket[k] {
                    let t = &*slots[trainable[j]].tensor;
                    let g =
                        Tensor::from_slice(&b[at..at + self.params[j].1], t.dims().to_vec(), &dev).mul_scalar(factor);
                    avg.insert(t, g.cast(t.dtype()));
                }
            }
            opt.update(&mut slots, &avg, None)?;
            drop(avg);
            let mut keep: Vec<Tensor> = slots.iter().map(|s| s.tensor.clone()).collect();
            keep.extend(opt.state().into_iter().map(|(_, t)| t.clone()));
            pollster::block_on(dev.realize(&keep))?;
            for s in slots.iter_mut() {
                *s.tensor = if s.trainable { s.tensor.detach().requires_grad() } else { s.tensor.detach() };
            }
            for (_, t) in opt.state() {
                *t = t.detach();
            }
        }
        if self.options.broadcast_buffers {
            self.broadcast_state(model, false)?;
        }
        self.steps += 1;
        if self.options.check_every > 0 && self.steps.is_multiple_of(self.options.check_every) {
            self.check_weights(model)?;
        }
        Ok(DdpResult { loss: loss_value, values, applied, grad_norm, comm_seconds })
    }

    /// Compare a hash of the weights across ranks; a difference is an error naming the
    /// step.
    pub fn check_weights(&self, model: &mut dyn Module) -> Result<()> {
        let mine = weights_hash(model)?;
        let all = self.comm.all_gather_u64(mine)?;
        if all.iter().any(|&h| h != all[0]) {
            let differ: Vec<usize> = (0..all.len()).filter(|&r| all[r] != all[0]).collect();
            return Err(Error::Distributed(format!(
                "the replicas' weights diverged by step {}: rank(s) {differ:?} differ from rank 0 \
                 (hashes {all:016x?})",
                self.steps
            )));
        }
        Ok(())
    }

    /// Rank 0 writes the checkpoint (atomically, with its SHA-256); every rank waits for
    /// it. The DDP step count goes into the metadata as `ddp_steps`.
    pub fn save_checkpoint(
        &self,
        path: impl AsRef<std::path::Path>,
        model: &mut dyn Module,
        opt: &mut dyn Optimizer,
        metadata: &BTreeMap<String, String>,
    ) -> Result<()> {
        let mut md = metadata.clone();
        md.insert("ddp_steps".into(), self.steps.to_string());
        md.insert("ddp_world_size".into(), self.comm.size().to_string());
        let saved = if self.comm.rank() == 0 { crate::io::checkpoint::save(path, model, opt, &md) } else { Ok(()) };
        if let Err(e) = &saved {
            self.comm.abort(&format!("rank 0 could not save the checkpoint: {e}"));
        }
        self.comm.barrier()?;
        saved
    }

    /// Every rank loads the same checkpoint (rank 0's file), restores the step count,
    /// and checks that the replicas now agree.
    pub fn load_checkpoint(
        &mut self,
        path: impl AsRef<std::path::Path>,
        model: &mut dyn Module,
        opt: &mut dyn Optimizer,
        device: &crate::Device,
    ) -> Result<BTreeMap<String, String>> {
        let md = crate::io::checkpoint::load(path, model, opt, device);
        // Agree on success before comparing weights, so a rank that failed does not
        // leave the others waiting.
        let ok = self.comm.all_gather_u64(u64::from(md.is_ok()))?;
        let md = md?;
        if ok.contains(&0) {
            let failed: Vec<usize> = (0..ok.len()).filter(|&r| ok[r] == 0).collect();
            return Err(Error::Distributed(format!("rank(s) {failed:?} could not load the checkpoint")));
        }
        self.steps = md.get("ddp_steps").and_then(|s| s.parse().ok()).unwrap_or(0);
        self.pending = None;
        self.check_weights(model)?;
        Ok(md)
    }
}
