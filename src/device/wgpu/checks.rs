//! Bounds checks that a realisation still owes: the status words of gather and
//! index_select kernels, copied to a mappable buffer in the submit that ran them and read
//! once, by whichever realisation first needs a value that depends on them.
//!
//! Several realisations (threads, or futures in a page) can inherit the same check. Only
//! one maps its buffer, since a buffer mapped twice at once is a wgpu error; the others
//! wait for its outcome.

use super::pool::PooledBuffer;
use super::GpuContext;
use crate::kernels::IndexCheck;
use crate::Result;
use futures_channel::oneshot;
use std::sync::{Arc, Mutex, MutexGuard};

/// One submit's bounds checks and what reading them found.
pub(crate) struct PendingCheck {
    staging: PooledBuffer,
    checks: Vec<IndexCheck>,
    state: Mutex<State>,
}

enum State {
    /// Nobody has read the status words yet.
    Unread,
    /// A realisation is mapping them; the senders wake those waiting for it.
    Reading(Vec<oneshot::Sender<()>>),
    Read(Result<()>),
}

impl PendingCheck {
    /// `checks` reported into `staging`, two words each: a flag, then the bad index.
    pub fn new(staging: PooledBuffer, checks: Vec<IndexCheck>) -> Self {
        PendingCheck { staging, checks, state: Mutex::new(State::Unread) }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What reading the status words found; `None` until they are read.
    pub fn outcome(&self) -> Option<Result<()>> {
        match &*self.state() {
            State::Read(r) => Some(r.clone()),
            _ => None,
        }
    }

    /// Whether the checks were read and all passed.
    pub fn passed(&self) -> bool {
        matches!(&*self.state(), State::Read(Ok(())))
    }

    /// The first failed check's error, from the status words.
    fn judge(&self, bytes: &[u8]) -> Result<()> {
        let word = |i: usize| bytes.get(4 * i..4 * i + 4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        match self.checks.iter().enumerate().find(|(k, _)| word(2 * k) != 0) {
            Some((k, chk)) => Err(chk.error(word(2 * k + 1) as i32 as i64)),
            None => Ok(()),
        }
    }

    /// Record the outcome and wake the waiters.
    fn finish(&self, outcome: Result<()>) {
        if let State::Reading(waiters) = std::mem::replace(&mut *self.state(), State::Read(outcome)) {
            for w in waiters {
                let _ = w.send(());
            }
        }
    }
}

/// Puts the checks a call took for reading back to unread if it stops before finishing
/// (an error, or its future dropped), waking the waiters so that one of them takes over.
struct Claimed<'a>(Vec<&'a Arc<PendingCheck>>);

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        for c in &self.0 {
            let mut s = c.state();
            if matches!(*s, State::Reading(_)) {
                *s = State::Unread;
            }
        }
    }
}

/// Read every unread check in `checks` (waiting for any that another realisation is
/// reading) and return the first failure among them.
pub(crate) async fn resolve(ctx: &GpuContext, checks: &[Arc<PendingCheck>]) -> Result<()> {
    loop {
        let mut mine = Claimed(Vec::new());
        let mut waits = Vec::new();
        for c in checks {
            let mut s = c.state();
            match &mut *s {
                State::Unread => {
                    *s = State::Reading(Vec::new());
                    mine.0.push(c);
                }
                State::Reading(waiters) => {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    waits.push(rx);
                }
                State::Read(_) => {}
            }
        }
        if !mine.0.is_empty() {
            let words = {
                let bufs: Vec<(&wgpu::Buffer, u64)> =
                    mine.0.iter().map(|c| (c.staging.buffer(), 8 * c.checks.len() as u64)).collect();
                ctx.map_read(&bufs).await?
            };
            for (c, bytes) in mine.0.drain(..).zip(words) {
                c.finish(c.judge(&bytes));
            }
        }
        if waits.is_empty() {
            break;
        }
        // Woken by an outcome, or by a reader that gave up: look again.
        for rx in waits {
            let _ = rx.await;
        }
    }
    checks.iter().filter_map(|c| c.outcome()).find(|r| r.is_err()).unwrap_or(Ok(()))
}
