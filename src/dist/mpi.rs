//! [`MpiComm`]: ranks as MPI processes (rsmpi over Open MPI), on one machine or many.

use super::Communicator;
use crate::{Error, Result};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The MPI world as a [`Communicator`].
///
/// Collectives are MPI's blocking ones (`MPI_Allreduce` and friends, Open MPI's tuned
/// algorithms), each watched by a thread: past the timeout it prints which collective
/// stalled on which rank and calls `MPI_Abort`, which ends every rank of the job. When a
/// rank dies, `mpirun` ends the others too, so nothing waits forever. While bucket `k`
/// is reduced, a helper thread reads bucket `k + 1` back from the device.
pub struct MpiComm {
    world: SimpleCommunicator,
    watchdog: Arc<Watchdog>,
    // Finalises MPI when dropped; declared last so the communicator goes first.
    _universe: mpi::environment::Universe,
}

/// What is running and by when it must end.
struct Watchdog {
    armed: Mutex<Armed>,
    changed: Condvar,
    timeout: Duration,
    rank: usize,
    size: usize,
}

#[derive(Default)]
struct Armed {
    what: Option<(String, Instant)>,
    generation: u64,
    closed: bool,
}

/// Disarms the watchdog when the collective returns.
struct Watch<'a>(&'a Watchdog);

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut a = self.0.armed.lock().unwrap_or_else(|e| e.into_inner());
        a.what = None;
        a.generation += 1;
    }
}

impl Watchdog {
    fn watch(&self, what: &str) -> Watch<'_> {
        let mut a = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        a.what = Some((what.to_string(), Instant::now() + self.timeout));
        a.generation += 1;
        self.changed.notify_all();
        Watch(self)
    }

    fn run(&self) {
        let mut a = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if a.closed {
                return;
            }
            match a.what.clone() {
                None => a = self.changed.wait(a).unwrap_or_else(|e| e.into_inner()),
                Some((what, deadline)) => {
                    let now = Instant::now();
                    if now >= deadline {
                        eprintln!(
                            "tessera::dist: rank {} of {}: {what} timed out after {:.1} s: another rank died or \
                             stalled; aborting the MPI job",
                            self.rank,
                            self.size,
                            self.timeout.as_secs_f64()
                        );
                        // SAFETY: MPI was initialised with MPI_THREAD_MULTIPLE (checked in
                        // init), so any thread may call MPI_Abort; it does not return.
                        unsafe {
                            mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, 70);
                        }
                        std::process::abort();
                    }
                    a = self.changed.wait_timeout(a, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
        }
    }
}

impl MpiComm {
    /// Initialise MPI (once per process) with the default timeout
    /// ([`super::default_timeout`]).
    pub fn init() -> Result<MpiComm> {
        MpiComm::init_with_timeout(super::default_timeout())
    }

    /// Initialise MPI; each collective gives up after `timeout`.
    pub fn init_with_timeout(timeout: Duration) -> Result<MpiComm> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Multiple).ok_or_else(|| {
            Error::Distributed("MPI is already initialised in this process (make one MpiComm)".into())
        })?;
        if threading != mpi::Threading::Multiple {
            return Err(Error::Distributed(format!(
                "this MPI library offers {threading:?} threading; the collectives' watchdog needs Multiple \
                 (Open MPI built with thread support)"
            )));
        }
        let world = universe.world();
        let watchdog = Arc::new(Watchdog {
            armed: Mutex::new(Armed::default()),
            changed: Condvar::new(),
            timeout,
            rank: world.rank() as usize,
            size: world.size() as usize,
        });
        let w = watchdog.clone();
        std::thread::Builder::new()
            .name("tessera-mpi-watchdog".into())
            .spawn(move || w.run())
            .map_err(|e| Error::Distributed(format!("could not start the collectives' watchdog: {e}")))?;
        Ok(MpiComm { world, watchdog, _universe: universe })
    }

    /// The bare rsmpi all-reduce (`MPI_Allreduce` into a separate buffer), for the
    /// benchmark that compares DDP's path with it.
    pub fn raw_all_reduce_into(&self, send: &[f32], recv: &mut [f32]) {
        self.world.all_reduce_into(send, recv, SystemOperation::sum());
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        let mut a = self.watchdog.armed.lock().unwrap_or_else(|e| e.into_inner());
        a.closed = true;
        self.watchdog.changed.notify_all();
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
        send: &mut [&mut [f32]],
        recv: &mut [&mut [f32]],
        fill: &mut (dyn FnMut(usize, &mut [f32]) -> Result<()> + Send),
    ) -> Result<()> {
        if send.len() != recv.len() || send.iter().zip(recv.iter()).any(|(s, r)| s.len() != r.len()) {
            return Err(Error::Distributed("all-reduce: send and receive buckets differ in size".into()));
        }
        let n = send.len();
        if n == 1 {
            // Nothing to overlap: fill, then reduce, on this thread.
            if let Err(e) = fill(0, send[0]) {
                self.abort(&format!("could not read the gradients: {e}"));
                return Err(e);
            }
            let _w = self.watchdog.watch("all-reduce of the gradients");
            self.world.all_reduce_into(&*send[0], &mut *recv[0], SystemOperation::sum());
            return Ok(());
        }
        // A helper fills the buckets in order and hands each over when it is ready;
        // this thread reduces bucket k while the helper reads bucket k + 1.
        let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, Result<&mut [f32]>)>(n.max(1));
        std::thread::scope(|s| {
            s.spawn(move || {
                for (k, b) in send.iter_mut().enumerate() {
                    let r = fill(k, b).map(|()| &mut **b);
                    let failed = r.is_err();
                    if tx.send((k, r)).is_err() || failed {
                        return;
                    }
                }
            });
            for (k, r) in recv.iter_mut().enumerate() {
                let (_, filled) = rx.recv().map_err(|_| Error::Distributed("the gradient reader stopped".into()))?;
                let s = match filled {
                    Ok(s) => s,
                    Err(e) => {
                        // The other ranks are already reducing: the group cannot go on.
                        self.abort(&format!("could not read bucket {k} of the gradients: {e}"));
                        return Err(e);
                    }
                };
                let _w = self.watchdog.watch(&format!("all-reduce of gradient bucket {k}"));
                self.world.all_reduce_into(&*s, &mut **r, SystemOperation::sum());
            }
            Ok(())
        })
    }

    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()> {
        // Sizes first, so a mismatch is an error rather than a truncated message.
        let mut n = bytes.len() as u64;
        {
            let _w = self.watchdog.watch("broadcast (size)");
            self.world.process_at_rank(root as i32).broadcast_into(&mut n);
        }
        if n != bytes.len() as u64 {
            let why = format!(
                "broadcast: rank {root} sends {n} bytes, rank {} expects {}: the replicas differ",
                self.rank(),
                bytes.len()
            );
            self.abort(&why);
            return Err(Error::Distributed(why));
        }
        let _w = self.watchdog.watch("broadcast");
        self.world.process_at_rank(root as i32).broadcast_into(bytes);
        Ok(())
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        let mut out = vec![0u64; self.size()];
        let _w = self.watchdog.watch("all-gather");
        self.world.all_gather_into(&value, &mut out[..]);
        Ok(out)
    }

    fn barrier(&self) -> Result<()> {
        let _w = self.watchdog.watch("barrier");
        self.world.barrier();
        Ok(())
    }

    fn abort(&self, reason: &str) {
        eprintln!("tessera::dist: rank {} of {}: {reason}; aborting the MPI job", self.rank(), self.size());
        self.world.abort(70)
    }
}
