//! [`MpiComm`]: ranks as MPI processes (rsmpi over Open MPI), on one machine or many.

use super::Communicator;
use crate::{Error, Result};
use mpi::collective::SystemOperation;
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};
use std::time::{Duration, Instant};

/// The MPI world as a [`Communicator`]. Collectives are non-blocking requests polled
/// against a timeout; past it the rank prints which collective stalled and calls
/// `MPI_Abort`, which ends every rank of the job. When a rank dies, `mpirun` ends the
/// others too, so nothing waits forever.
pub struct MpiComm {
    world: SimpleCommunicator,
    timeout: Duration,
    // Finalises MPI when dropped; declared last so the communicator goes first.
    _universe: mpi::environment::Universe,
}

impl MpiComm {
    /// Initialise MPI (once per process) with the default timeout
    /// ([`super::default_timeout`]).
    pub fn init() -> Result<MpiComm> {
        MpiComm::init_with_timeout(super::default_timeout())
    }

    /// Initialise MPI; each collective gives up after `timeout`.
    pub fn init_with_timeout(timeout: Duration) -> Result<MpiComm> {
        let universe = mpi::initialize().ok_or_else(|| {
            Error::Distributed("MPI is already initialised in this process (make one MpiComm)".into())
        })?;
        Ok(MpiComm { world: universe.world(), timeout, _universe: universe })
    }

    /// The bare rsmpi all-reduce (`MPI_Allreduce` into a separate buffer), for the
    /// benchmark that compares DDP's path with it.
    pub fn raw_all_reduce_into(&self, send: &[f32], recv: &mut [f32]) {
        self.world.all_reduce_into(send, recv, SystemOperation::sum());
    }

    /// Poll `req` until it completes; past the timeout, abort the job.
    fn wait<'a, D: ?Sized, S: Scope<'a>>(&self, mut req: Request<'a, D, S>, what: &str) {
        let t0 = Instant::now();
        let mut polls = 0u32;
        loop {
            match req.test() {
                Ok(_) => return,
                Err(r) => req = r,
            }
            if t0.elapsed() > self.timeout {
                let why =
                    format!("{what} timed out after {:.1} s: another rank died or stalled", self.timeout.as_secs_f64());
                self.abort(&why);
            }
            polls += 1;
            if polls < 2000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn all_reduce_sum(
        &self,
        sizes: &[usize],
        fill: &mut dyn FnMut(usize, &mut [f32]) -> Result<()>,
    ) -> Result<Vec<Vec<f32>>> {
        let mut send: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0f32; n]).collect();
        let mut recv: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0f32; n]).collect();
        mpi::request::scope(|scope| {
            let mut started = Vec::with_capacity(sizes.len());
            for (k, (s, r)) in send.iter_mut().zip(recv.iter_mut()).enumerate() {
                // Bucket k-1 is in flight while bucket k is read back.
                if let Err(e) = fill(k, s) {
                    // The other ranks are already reducing: the group cannot go on.
                    self.abort(&format!("could not read bucket {k} of the gradients: {e}"));
                }
                let s: &Vec<f32> = s;
                started.push(self.world.immediate_all_reduce_into(scope, &s[..], &mut r[..], SystemOperation::sum()));
            }
            for (k, req) in started.into_iter().enumerate() {
                self.wait(req, &format!("all-reduce of gradient bucket {k}"));
            }
        });
        Ok(recv)
    }

    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()> {
        // Sizes first, so a mismatch is an error rather than a truncated message.
        let mut n = [bytes.len() as u64];
        mpi::request::scope(|scope| {
            let req = self.world.process_at_rank(root as i32).immediate_broadcast_into(scope, &mut n[..]);
            self.wait(req, "broadcast (size)");
        });
        if n[0] != bytes.len() as u64 {
            return Err(Error::Distributed(format!(
                "broadcast: rank {root} sends {} bytes, rank {} expects {}: the replicas differ",
                n[0],
                self.rank(),
                bytes.len()
            )));
        }
        mpi::request::scope(|scope| {
            let req = self.world.process_at_rank(root as i32).immediate_broadcast_into(scope, bytes);
            self.wait(req, "broadcast");
        });
        Ok(())
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        let mut out = vec![0u64; self.size()];
        let mine = [value];
        mpi::request::scope(|scope| {
            let req = self.world.immediate_all_gather_into(scope, &mine[..], &mut out[..]);
            self.wait(req, "all-gather");
        });
        Ok(out)
    }

    fn barrier(&self) -> Result<()> {
        let req = self.world.immediate_barrier();
        self.wait(req, "barrier");
        Ok(())
    }

    fn abort(&self, reason: &str) {
        eprintln!("tessera::dist: rank {} of {}: {reason}; aborting the MPI job", self.rank(), self.size());
        self.world.abort(70)
    }
}
