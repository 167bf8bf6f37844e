//! Data-parallel training with PyTorch DDP's semantics.
//!
//! Each rank holds a replica of the model, trains on its own shard of the data
//! ([`DistributedSampler`]) and averages gradients with the other ranks after every
//! backward pass ([`DistributedDataParallel`]). Ranks talk through a [`Communicator`]:
//!
//! - `MpiComm` (cargo feature `mpi`): processes on one or many machines, over MPI
//!   (rsmpi on Open MPI), launched by `mpirun` or Slurm;
//! - [`LocalComm`]: one thread per adapter in one process, reduced through the host.
//!
//! The training code is the same for both. Every collective has a timeout: a rank that
//! dies or stalls makes the others fail with a clear error (MPI aborts the job) instead
//! of hanging.

mod ddp;
mod local;
#[cfg(feature = "mpi")]
mod mpi;
mod sampler;

#[cfg(feature = "mpi")]
pub use self::mpi::MpiComm;
pub use ddp::{DdpOptions, DdpResult, DdpStep, DistributedDataParallel};
pub use local::LocalComm;
pub use sampler::DistributedSampler;

use crate::{DType, Device, Error, Result, Tensor};
use std::time::Duration;

/// What data-parallel training needs from a transport. Every method is a collective:
/// each rank of the group calls it, in the same order.
pub trait Communicator {
    /// This rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// Sum f32 buckets across ranks into `recv`: `fill(k, send[k])` writes bucket `k`,
    /// then its reduction starts, so bucket `k + 1` is filled (read back from the
    /// device) while bucket `k` is reduced where the transport allows. Every rank gets
    /// the same sums, bit for bit.
    fn all_reduce_sum(
        &self,
        send: &mut [&mut [f32]],
        recv: &mut [&mut [f32]],
        fill: &mut (dyn FnMut(usize, &mut [f32]) -> Result<()> + Send),
    ) -> Result<()>;
    /// Overwrite `bytes` on every rank with `root`'s.
    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()>;
    /// Every rank's `value`, in rank order.
    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>>;
    /// Wait for every rank.
    fn barrier(&self) -> Result<()>;
    /// Give up on the group after a fault that leaves it unusable: MPI aborts the whole
    /// job (`MPI_Abort`); a local group is poisoned, so the other ranks' collectives
    /// fail at once with `reason`.
    fn abort(&self, reason: &str);
}

/// A shared communicator (one `MpiComm` per process, used by several runs in turn).
impl<C: Communicator + ?Sized> Communicator for std::rc::Rc<C> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn all_reduce_sum(
        &self,
        send: &mut [&mut [f32]],
        recv: &mut [&mut [f32]],
        fill: &mut (dyn FnMut(usize, &mut [f32]) -> Result<()> + Send),
    ) -> Result<()> {
        (**self).all_reduce_sum(send, recv, fill)
    }
    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()> {
        (**self).broadcast(bytes, root)
    }
    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        (**self).all_gather_u64(value)
    }
    fn barrier(&self) -> Result<()> {
        (**self).barrier()
    }
    fn abort(&self, reason: &str) {
        (**self).abort(reason)
    }
}

/// The timeout for one collective: `TESSERA_DIST_TIMEOUT` seconds, else 120 s.
pub fn default_timeout() -> Duration {
    std::env::var("TESSERA_DIST_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(120))
}

/// A tensor's elements as little-endian bytes (f32, f16, i32, u32, bool).
pub(crate) fn host_bytes(t: &Tensor) -> Result<Vec<u8>> {
    Ok(match t.dtype() {
        DType::F32 => bytemuck::cast_slice(&t.to_vec_blocking::<f32>()?).to_vec(),
        DType::F16 => bytemuck::cast_slice(&t.to_vec_blocking::<half::f16>()?).to_vec(),
        DType::I32 => bytemuck::cast_slice(&t.to_vec_blocking::<i32>()?).to_vec(),
        DType::U32 => bytemuck::cast_slice(&t.to_vec_blocking::<u32>()?).to_vec(),
        DType::Bool => t.to_vec_blocking::<bool>()?.into_iter().map(u8::from).collect(),
        d => return Err(Error::Unsupported(format!("distributed: a {d:?} tensor cannot be sent between ranks"))),
    })
}

/// The inverse of [`host_bytes`]: a tensor of `dims` and `dtype` on `dev`.
pub(crate) fn from_host_bytes(bytes: &[u8], dims: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    let dims = dims.to_vec();
    Ok(match dtype {
        DType::F32 => Tensor::from_slice(&bytemuck::pod_collect_to_vec::<u8, f32>(bytes), dims, dev),
        DType::F16 => Tensor::from_slice(&bytemuck::pod_collect_to_vec::<u8, half::f16>(bytes), dims, dev),
        DType::I32 => Tensor::from_slice(&bytemuck::pod_collect_to_vec::<u8, i32>(bytes), dims, dev),
        DType::U32 => Tensor::from_slice(&bytemuck::pod_collect_to_vec::<u8, u32>(bytes), dims, dev),
        DType::Bool => Tensor::from_slice(&bytes.iter().map(|&b| b != 0).collect::<Vec<bool>>(), dims, dev),
        d => return Err(Error::Unsupported(format!("distributed: a {d:?} tensor cannot be sent between ranks"))),
    })
}

/// A 64-bit digest of a module's state (every parameter and buffer, names included):
/// equal on every rank while the replicas agree.
pub fn weights_hash(model: &mut dyn crate::nn::Module) -> Result<u64> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for s in model.slots() {
        h.update(s.name.as_bytes());
        h.update(host_bytes(s.tensor)?);
    }
    let d = h.finalize();
    Ok(u64::from_le_bytes(d[..8].try_into().unwrap_or_default()))
}
