//! Dynamic batching: one worker thread per loaded version owns its model. Requests wait
//! in a bounded queue; the worker takes the first, then gathers more until the batch
//! holds `max_batch_size` items, `max_delay` has passed since the first, no request has
//! arrived for `quiet` (a burst is over), or the padded token count would pass
//! `max_batch_tokens`; runs the batch as one realisation; and routes each row back. The
//! async runtime only awaits a oneshot: GPU work never blocks its threads. A lost device
//! fails the batch with 503, then the worker recovers the device and reloads its model.

use crate::model::{Input, Output, Prepared, Runner};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera::{Device, Error};

/// Batching limits.
#[derive(Clone, Copy, Debug)]
pub struct BatchConfig {
    pub max_batch_size: usize,
    /// The longest a batch's first item waits for others.
    pub max_delay: Duration,
    /// A batch closes sooner once no item has arrived for this long: a lone request
    /// waits `quiet`, a burst that takes longer to arrive (clients answered together
    /// send again together, over several milliseconds on a busy host) is one batch
    /// instead of a full one and a remainder.
    pub quiet: Duration,
    /// Padded tokens per batch (batch size times its longest sequence).
    pub max_batch_tokens: usize,
    /// Requests waiting at most; past it, submissions are refused (429).
    pub queue_capacity: usize,
    /// Whether a version's warm-up compiles the kernels of every batch size
    /// ([`crate::model::Runner::warm_up`]), or runs one input.
    pub warm_batches: bool,
    /// With `warm_batches`, the warm-up also runs a text model on every sequence length
    /// up to this, alone and in a padded pair (0: none).
    pub warm_lengths: usize,
}

/// Why an item failed.
#[derive(Clone, Debug)]
pub enum Failure {
    /// The input does not fit the model (400).
    BadInput(String),
    /// The device was lost while running (503); the worker is recovering.
    DeviceLost(String),
    /// The deadline passed before the item ran (504).
    Expired,
    /// Anything else the model reported (500).
    Internal(String),
}

/// An item's result and where its time went.
#[derive(Clone, Debug)]
pub struct Done {
    pub output: Output,
    pub queue: Duration,
    pub compute: Duration,
    pub batch_size: usize,
}

struct Job {
    input: Input,
    enqueued: Instant,
    deadline: Instant,
    reply: tokio::sync::oneshot::Sender<Result<Done, Failure>>,
}

/// The shared device: replaced once when it is lost, then every worker reloads onto the
/// replacement.
pub struct DeviceCell {
    inner: Mutex<(Device, u64)>,
}

impl DeviceCell {
    pub fn new(dev: Device) -> Arc<DeviceCell> {
        Arc::new(DeviceCell { inner: Mutex::new((dev, 0)) })
    }

    /// The current device and its generation.
    pub fn current(&self) -> (Device, u64) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        (g.0.clone(), g.1)
    }

    /// Replace the device of generation `seen` (once, whoever asks first).
    pub fn recover(&self, seen: u64) -> tessera::Result<(Device, u64)> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.1 == seen {
            let fresh = g.0.recover()?;
            *g = (fresh, seen + 1);
        }
        Ok((g.0.clone(), g.1))
    }
}

/// Loads (or reloads) a runner on a device.
pub type Loader = Box<dyn Fn(&Device) -> tessera::Result<Runner> + Send>;

/// A version's batcher.
pub struct Batcher {
    tx: Mutex<Option<SyncSender<Job>>>,
    depth: Arc<AtomicUsize>,
    closed: Arc<AtomicBool>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub labels: (String, String),
}

impl Batcher {
    /// Start a worker for `runner` (already loaded and warm).
    pub fn start(
        runner: Runner,
        loader: Loader,
        devices: Arc<DeviceCell>,
        generation: u64,
        cfg: BatchConfig,
        labels: (String, String),
    ) -> Arc<Batcher> {
        let (tx, rx) = sync_channel(cfg.queue_capacity.max(1));
        let depth = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let w = Worker { runner, loader, devices, generation, cfg, rx, depth: depth.clone(), labels: labels.clone() };
        let handle =
            std::thread::Builder::new().name(format!("batcher {}/{}", labels.0, labels.1)).spawn(move || w.run()).ok();
        Arc::new(Batcher { tx: Mutex::new(Some(tx)), depth, closed, worker: Mutex::new(handle), labels })
    }

    /// Queue one item; `Err(true)` when the queue is full, `Err(false)` when closed.
    pub fn submit(
        &self,
        input: Input,
        deadline: Instant,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<Done, Failure>>, bool> {
        if self.closed.load(Ordering::Acquire) {
            return Err(false);
        }
        let (reply, rx) = tokio::sync::oneshot::channel();
        let job = Job { input, enqueued: Instant::now(), deadline, reply };
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(tx) = tx else { return Err(false) };
        // Counted before the send, so the worker's decrement never runs first.
        let d = self.depth.fetch_add(1, Ordering::AcqRel) + 1;
        match tx.try_send(job) {
            Ok(()) => {
                metrics::gauge!("tessera_queue_depth", "model" => self.labels.0.clone(), "version" => self.labels.1.clone()).set(d as f64);
                Ok(rx)
            }
            Err(e) => {
                self.depth.fetch_sub(1, Ordering::AcqRel);
                Err(matches!(e, TrySendError::Full(_)))
            }
        }
    }

    /// Items waiting.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Acquire)
    }

    /// Stop taking work; the worker finishes what is queued, then exits.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Close and wait for the worker to drain.
    pub fn shutdown(&self) {
        self.close();
        if let Some(h) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

struct Worker {
    runner: Runner,
    loader: Loader,
    devices: Arc<DeviceCell>,
    generation: u64,
    cfg: BatchConfig,
    rx: Receiver<Job>,
    depth: Arc<AtomicUsize>,
    labels: (String, String),
}

impl Worker {
    fn take(&self, job: Job) -> Option<(Job, Prepared)> {
        let d = self.depth.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        // (Every job was counted before it was sent, so this never wraps.)
        metrics::gauge!("tessera_queue_depth", "model" => self.labels.0.clone(), "version" => self.labels.1.clone())
            .set(d as f64);
        if job.reply.is_closed() {
            return None;
        }
        if Instant::now() > job.deadline {
            let _ = job.reply.send(Err(Failure::Expired));
            return None;
        }
        match self.runner.prepare(job.input.clone()) {
            Ok(p) => Some((job, p)),
            Err(e) => {
                let _ = job.reply.send(Err(Failure::BadInput(e.to_string())));
                None
            }
        }
    }

    fn run(mut self) {
        let mut carry: Option<(Job, Prepared)> = None;
        loop {
            let first = match carry.take() {
                Some(x) => x,
                None => match self.rx.recv() {
                    Ok(job) => match self.take(job) {
                        Some(x) => x,
                        None => continue,
                    },
                    Err(_) => return, // closed and drained
                },
            };
            // The window opens when the first item arrived and closes `quiet` after the
            // latest arrival, `max_delay` after the first at the latest: a first item
            // that already waited (the worker was busy) takes only what is queued now.
            let cap = first.0.enqueued + self.cfg.max_delay;
            let mut latest = first.0.enqueued;
            let mut longest = first.1.cost;
            let mut batch = vec![first];
            while batch.len() < self.cfg.max_batch_size {
                let until = cap.min(latest + self.cfg.quiet);
                let wait = until.saturating_duration_since(Instant::now());
                let job = if wait.is_zero() {
                    match self.rx.try_recv() {
                        Ok(j) => j,
                        Err(_) => break,
                    }
                } else {
                    match self.rx.recv_timeout(wait) {
                        Ok(j) => j,
                        Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => break,
                    }
                };
                latest = latest.max(job.enqueued);
                let Some(item) = self.take(job) else { continue };
                let l = longest.max(item.1.cost);
                if (batch.len() + 1) * l > self.cfg.max_batch_tokens && !batch.is_empty() {
                    carry = Some(item);
                    break;
                }
                longest = l;
                batch.push(item);
            }
            self.execute(batch);
        }
    }

    fn execute(&mut self, batch: Vec<(Job, Prepared)>) {
        let n = batch.len();
        let start = Instant::now();
        let (jobs, items): (Vec<Job>, Vec<Prepared>) = batch.into_iter().unzip();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.runner.run(&items)))
            .unwrap_or_else(|_| Err(Error::Unsupported("the model panicked".into())));
        let compute = start.elapsed();
        metrics::histogram!("tessera_batch_size", "model" => self.labels.0.clone(), "version" => self.labels.1.clone())
            .record(n as f64);
        match result {
            Ok(outputs) if outputs.len() == n => {
                for (job, output) in jobs.into_iter().zip(outputs) {
                    let queue = start.saturating_duration_since(job.enqueued);
                    let _ = job.reply.send(Ok(Done { output, queue, compute, batch_size: n }));
                }
            }
            Ok(outputs) => {
                for job in jobs {
                    let _ = job.reply.send(Err(Failure::Internal(format!("{} outputs for {n} inputs", outputs.len()))));
                }
            }
            Err(e @ Error::DeviceLost(_)) => {
                for job in jobs {
                    let _ = job.reply.send(Err(Failure::DeviceLost(e.to_string())));
                }
                self.recover();
            }
            Err(e) => {
                for job in jobs {
                    let _ = job.reply.send(Err(Failure::Internal(e.to_string())));
                }
            }
        }
    }

    /// Replace the lost device (once for every worker) and reload the model on it.
    fn recover(&mut self) {
        for attempt in 0..5 {
            let reloaded = self.devices.recover(self.generation).and_then(|(dev, g)| {
                let r = (self.loader)(&dev)?;
                Ok((r, g))
            });
            match reloaded {
                Ok((r, g)) => {
                    eprintln!(
                        "[serve] {}/{}: device lost; recovered and reloaded (generation {g})",
                        self.labels.0, self.labels.1
                    );
                    self.runner = r;
                    self.generation = g;
                    metrics::counter!("tessera_device_recoveries_total").increment(1);
                    return;
                }
                Err(e) => {
                    eprintln!("[serve] {}/{}: recovery attempt {attempt} failed: {e}", self.labels.0, self.labels.1);
                    std::thread::sleep(Duration::from_millis(200 << attempt));
                }
            }
        }
    }
}
