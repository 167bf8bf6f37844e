//! [`LocalComm`]: ranks as threads of one process (one per adapter), meeting in host
//! memory.

use super::Communicator;
use crate::{Error, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One rank's contribution to a collective.
enum Payload {
    F32(Vec<Vec<f32>>),
    Bytes(Vec<u8>),
    U64(u64),
    Empty,
}

struct State {
    /// Collectives completed so far.
    generation: u64,
    slots: Vec<Option<Payload>>,
    /// Every rank's contribution to the last completed collective, in rank order.
    last: Arc<Vec<Payload>>,
    /// Why the group can no longer be used.
    poisoned: Option<String>,
}

struct Shared {
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
    ready: Condvar,
}

/// A rank of a group of threads in one process. Make the group with
/// [`LocalComm::group`] and move one member into each replica's thread.
///
/// Every collective waits at most the group's timeout for the other ranks; past it, or
/// after any rank's [`Communicator::abort`], the group is poisoned and every collective
/// fails with the reason. Sums are taken in rank order on every rank, so all ranks get
/// the same bits.
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
}

impl LocalComm {
    /// `size` members with the default timeout ([`super::default_timeout`]).
    pub fn group(size: usize) -> Vec<LocalComm> {
        LocalComm::group_with_timeout(size, super::default_timeout())
    }

    /// `size` members whose collectives give up after `timeout`.
    pub fn group_with_timeout(size: usize, timeout: Duration) -> Vec<LocalComm> {
        let shared = Arc::new(Shared {
            size,
            timeout,
            state: Mutex::new(State {
                generation: 0,
                slots: (0..size).map(|_| None).collect(),
                last: Arc::new(Vec::new()),
                poisoned: None,
            }),
            ready: Condvar::new(),
        });
        (0..size).map(|rank| LocalComm { rank, shared: shared.clone() }).collect()
    }

    /// Deposit `mine`, wait for every rank's, and return them all in rank order.
    fn exchange(&self, mine: Payload, what: &str) -> Result<Arc<Vec<Payload>>> {
        let sh = &self.shared;
        let mut st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &st.poisoned {
            return Err(Error::Distributed(format!("rank {}: {what}: the group failed earlier: {why}", self.rank)));
        }
        let generation = st.generation;
        st.slots[self.rank] = Some(mine);
        if st.slots.iter().all(Option::is_some) {
            let all: Vec<Payload> = st.slots.iter_mut().map(|s| s.take().unwrap_or(Payload::Empty)).collect();
            st.last = Arc::new(all);
            st.generation += 1;
            sh.ready.notify_all();
            return Ok(st.last.clone());
        }
        let deadline = Instant::now() + sh.timeout;
        while st.generation == generation {
            if let Some(why) = &st.poisoned {
                return Err(Error::Distributed(format!("rank {}: {what}: {why}", self.rank)));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..sh.size).filter(|&r| st.slots[r].is_none()).collect();
                let why = format!(
                    "{what} timed out after {:.1} s: rank(s) {missing:?} never arrived (dead or stalled)",
                    sh.timeout.as_secs_f64()
                );
                st.poisoned = Some(why.clone());
                sh.ready.notify_all();
                return Err(Error::Distributed(format!("rank {}: {why}", self.rank)));
            }
            st = sh.ready.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(st.last.clone())
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(
        &self,
        send: &mut [&mut [f32]],
        recv: &mut [&mut [f32]],
        fill: &mut (dyn FnMut(usize, &mut [f32]) -> Result<()> + Send),
    ) -> Result<()> {
        let mut mine = Vec::with_capacity(send.len());
        for (k, b) in send.iter_mut().enumerate() {
            if let Err(e) = fill(k, b) {
                self.abort(&format!("rank {} could not read its gradients: {e}", self.rank));
                return Err(e);
            }
            mine.push(b.to_vec());
        }
        let all = self.exchange(Payload::F32(mine), "all-reduce")?;
        for o in recv.iter_mut() {
            o.fill(0.0);
        }
        for (r, p) in all.iter().enumerate() {
            let Payload::F32(bufs) = p else {
                return Err(Error::Distributed(format!("rank {r} entered a different collective than all-reduce")));
            };
            if bufs.len() != recv.len() || bufs.iter().zip(recv.iter()).any(|(b, o)| b.len() != o.len()) {
                return Err(Error::Distributed(format!(
                    "rank {r} all-reduced buckets of other sizes than rank {}: the replicas differ",
                    self.rank
                )));
            }
            for (o, b) in recv.iter_mut().zip(bufs) {
                for (x, y) in o.iter_mut().zip(b) {
                    *x += y;
                }
            }
        }
        Ok(())
    }

    fn broadcast(&self, bytes: &mut [u8], root: usize) -> Result<()> {
        let mine = if self.rank == root { Payload::Bytes(bytes.to_vec()) } else { Payload::Empty };
        let all = self.exchange(mine, "broadcast")?;
        match all.get(root) {
            Some(Payload::Bytes(b)) if b.len() == bytes.len() => {
                bytes.copy_from_slice(b);
                Ok(())
            }
            Some(Payload::Bytes(b)) => Err(Error::Distributed(format!(
                "broadcast: rank {root} sent {} bytes, rank {} expected {}",
                b.len(),
                self.rank,
                bytes.len()
            ))),
            _ => Err(Error::Distributed(format!("broadcast: rank {root} entered a different collective"))),
        }
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        let all = self.exchange(Payload::U64(value), "all-gather")?;
        all.iter()
            .enumerate()
            .map(|(r, p)| match p {
                Payload::U64(v) => Ok(*v),
                _ => Err(Error::Distributed(format!("all-gather: rank {r} entered a different collective"))),
            })
            .collect()
    }

    fn barrier(&self) -> Result<()> {
        self.exchange(Payload::Empty, "barrier").map(|_| ())
    }

    fn abort(&self, reason: &str) {
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        st.poisoned.get_or_insert_with(|| format!("rank {} aborted: {reason}", self.rank));
        self.shared.ready.notify_all();
    }
}
