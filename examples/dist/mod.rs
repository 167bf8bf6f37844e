//! The data-parallel side of the training demos: `--distributed` (one rank per MPI
//! process, `mpirun -np N`) and `--devices all` (one replica per adapter in this
//! process, `LocalComm`). A demo supplies the model, the optimiser and a loss per
//! (rank, step); this runs the loop and reports per-rank and aggregate steps/s and the
//! scaling efficiency against one rank training alone.

use std::time::Instant;
use tessera::dist::{Communicator, DdpOptions, DdpStep, DistributedDataParallel, LocalComm};
use tessera::nn::Module;
use tessera::optim::{LrSchedule, LrScheduler, Optimizer};
use tessera::{Device, Result, Tensor};

/// What one replica trains.
pub trait Replica {
    type Model: Module;
    fn model(&self, dev: &Device) -> Result<Self::Model>;
    fn optimizer(&self) -> Box<dyn Optimizer>;
    fn schedule(&self, total_steps: u64) -> LrSchedule;
    /// Rank `rank` of `size`'s loss at global step `step` (its shard of the data).
    fn loss(&self, model: &mut Self::Model, rank: usize, size: usize, step: u64, dev: &Device) -> Result<Tensor>;
    /// Examples per step per rank.
    fn batch(&self) -> usize;
    /// Called on rank 0 at the end: a line for the summary (accuracy, a sample, ...).
    fn report(&self, model: &mut Self::Model, dev: &Device) -> Result<String>;
}

/// How long and where.
pub struct Plan {
    /// Stop after this many steps; else `epochs` passes over `examples`.
    pub max_steps: Option<u64>,
    pub epochs: u64,
    pub examples: usize,
    pub checkpoint: std::path::PathBuf,
    pub resume: bool,
    pub checkpoint_every: u64,
    pub name: String,
}

/// Which transport the command line asked for.
pub enum Transport {
    Mpi,
    AllDevices,
}

pub fn run<R: Replica + Sync>(replica: &R, plan: &Plan, transport: Transport) -> Result<()> {
    match transport {
        Transport::Mpi => run_mpi(replica, plan),
        Transport::AllDevices => {
            let adapters = Device::list();
            if adapters.is_empty() {
                return Err(tessera::Error::NoAdapter(
                    "--devices all needs at least one wgpu adapter (scripts/setup.sh installs lavapipe)".into(),
                ));
            }
            let mut devices = Vec::new();
            for a in &adapters {
                let d = Device::with_options(tessera::DeviceOptions {
                    adapter_index: Some(a.index),
                    ..Default::default()
                })?;
                devices.push(d);
            }
            println!("--devices all: {} replicas in this process:", devices.len());
            for (r, d) in devices.iter().enumerate() {
                println!("  rank {r}: {} ({})", d.info().name, d.info().backend);
            }
            let comms = LocalComm::group(devices.len());
            let results: Vec<Result<()>> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .into_iter()
                    .zip(&devices)
                    .map(|(c, d)| s.spawn(move || train(replica, plan, Box::new(c), d)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err(tessera::Error::Distributed("a replica panicked".into()))))
                    .collect()
            });
            results.into_iter().collect()
        }
    }
}

#[cfg(feature = "mpi")]
fn run_mpi<R: Replica>(replica: &R, plan: &Plan) -> Result<()> {
    let comm = tessera::dist::MpiComm::init()?;
    let dev = Device::new()?;
    train(replica, plan, Box::new(comm), &dev)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi<R: Replica>(_: &R, _: &Plan) -> Result<()> {
    Err(tessera::Error::Unsupported(
        "--distributed needs MPI: build with `--features mpi` (scripts/setup.sh installs Open MPI) and launch with \
         `mpirun -np 2 target/release/examples/<demo> --distributed`"
            .into(),
    ))
}

fn train<R: Replica>(replica: &R, plan: &Plan, comm: Box<dyn Communicator>, dev: &Device) -> Result<()> {
    let (rank, size) = (comm.rank(), comm.size());
    let say = |s: String| {
        if rank == 0 {
            println!("{s}");
        }
    };
    // One rank alone first: the baseline for the scaling efficiency (the others wait).
    let solo = if rank == 0 {
        let mut m = replica.model(dev)?;
        let mut o = replica.optimizer();
        let n = 20u64;
        for s in 0..3 {
            let l = replica.loss(&mut m, 0, size, s, dev)?;
            o.step(&mut m, &l)?;
        }
        let t = Instant::now();
        for s in 0..n {
            let l = replica.loss(&mut m, 0, size, s, dev)?;
            o.step(&mut m, &l)?;
        }
        n as f64 / t.elapsed().as_secs_f64()
    } else {
        0.0
    };
    comm.barrier()?;

    let steps = plan.max_steps.unwrap_or(plan.epochs * (plan.examples / (replica.batch() * size)).max(1) as u64);
    let mut model = replica.model(dev)?;
    let mut opt = replica.optimizer();
    let mut ddp = DistributedDataParallel::new(comm, &mut model, DdpOptions::default())?;
    if plan.resume {
        let md = ddp.load_checkpoint(&plan.checkpoint, &mut model, opt.as_mut(), dev)?;
        say(format!(
            "resumed from {} at step {} ({} ranks wrote it)",
            plan.checkpoint.display(),
            ddp.steps(),
            md.get("ddp_world_size").map(String::as_str).unwrap_or("?")
        ));
    }
    let mut sched = LrScheduler::new(replica.schedule(steps), opt.as_mut());
    say(format!(
        "{}: {size} ranks, batch {} per rank ({} per step), {} steps, {} all-reduce buckets",
        plan.name,
        replica.batch(),
        replica.batch() * size,
        steps,
        ddp.bucket_sizes().len()
    ));
    let t0 = Instant::now();
    let first = ddp.steps();
    let mut comm_s = 0.0;
    let mut loss_sum = 0.0;
    let mut n = 0u64;
    while ddp.steps() < steps {
        let step = ddp.steps();
        let l = replica.loss(&mut model, rank, size, step, dev)?;
        let r = ddp.step(&mut model, opt.as_mut(), &l, DdpStep { clip_norm: Some(5.0), ..Default::default() })?;
        sched.step(opt.as_mut());
        comm_s += r.comm_seconds;
        loss_sum += r.loss;
        n += 1;
        let done = ddp.steps();
        if done.is_multiple_of(plan.checkpoint_every) || done == steps {
            ddp.save_checkpoint(&plan.checkpoint, &mut model, opt.as_mut(), &Default::default())?;
            say(format!(
                "step {done}/{}: loss {:.4} (rank 0, mean since last), checkpoint saved",
                steps,
                loss_sum / n.max(1) as f64
            ));
            loss_sum = 0.0;
            n = 0;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let steps_done = ddp.steps() - first;
    let mine = steps_done as f64 / secs.max(1e-9);
    let all = ddp.comm().all_gather_u64(mine.to_bits())?;
    let comm_all = ddp.comm().all_gather_u64((comm_s / secs.max(1e-9)).to_bits())?;
    if rank == 0 {
        println!("\nper rank:");
        for (r, (b, c)) in all.iter().zip(&comm_all).enumerate() {
            println!(
                "  rank {r}: {:.1} steps/s ({:.0}% of the time in the all-reduce)",
                f64::from_bits(*b),
                100.0 * f64::from_bits(*c)
            );
        }
        let slowest = all.iter().map(|b| f64::from_bits(*b)).fold(f64::INFINITY, f64::min);
        let aggregate = slowest * size as f64;
        let eff = aggregate / (size as f64 * solo).max(1e-9);
        println!(
            "aggregate: {aggregate:.1} rank-steps/s = {:.0} examples/s; one rank alone: {solo:.1} steps/s; \
             scaling efficiency {:.0}% ({size} ranks)",
            aggregate * replica.batch() as f64,
            100.0 * eff
        );
        println!("{}", replica.report(&mut model, dev)?);
        println!(
            "RESULT {}",
            serde_json::json!({ "ranks": size, "steps": ddp.steps(), "steps_per_s_per_rank": slowest,
                "solo_steps_per_s": solo, "scaling_efficiency": eff })
        );
    }
    Ok(())
}
