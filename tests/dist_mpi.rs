//! Data-parallel training over real `mpirun` (feature `mpi`; Open MPI from
//! `scripts/setup.sh`). This binary is both sides: run by `cargo test` it is the driver,
//! which launches itself under `mpirun -np 2` for each case and checks the outcome;
//! launched by `mpirun` (with `TESSERA_DIST_CASE` set) it is a rank.
//!
//! Cases: 2 ranks x batch 32 for 20 steps end with the weights of 1 process x batch 64
//! (SGD with momentum; AdamW with clipping) to 1e-5; a rank killed with SIGKILL ends
//! the job within a bounded time, and the run resumes from its last checkpoint;
//! replicas whose weights drift apart fail naming the step.

mod dist_common;

use dist_common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};
use tessera::dist::{Communicator, DdpOptions, DdpStep, DistributedDataParallel, DistributedSampler, MpiComm};
use tessera::nn::{loss, Layer, Module};
use tessera::Device;

fn main() {
    if let Ok(case) = std::env::var("TESSERA_DIST_CASE") {
        let code = match rank_main(&case) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("rank error: {e}");
                1
            }
        };
        std::process::exit(code);
    }
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let tests: [(&str, fn()); 4] = [
        ("a_stalled_rank_times_out_and_aborts_the_job", a_stalled_rank_times_out_and_aborts_the_job),
        ("two_mpi_ranks_end_like_one_process", two_mpi_ranks_end_like_one_process),
        ("a_killed_rank_ends_the_job_and_the_run_resumes", a_killed_rank_ends_the_job_and_the_run_resumes),
        ("diverged_replicas_fail_naming_the_step", diverged_replicas_fail_naming_the_step),
    ];
    let mut ran = 0;
    for (name, f) in tests {
        if !filter.is_empty() && !filter.iter().any(|p| name.contains(p.as_str())) {
            continue;
        }
        println!("test {name} ...");
        f();
        println!("test {name} ... ok");
        ran += 1;
    }
    println!("\ntest result: ok. {ran} passed (mpirun -np 2)");
}

fn out_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-dist-mpi-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `mpirun -np 2` on this binary with `case`, on loopback shared memory.
fn mpirun(case: &str, dir: &Path, env: &[(&str, String)]) -> Command {
    let found = Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(
        found,
        "mpirun is missing: install Open MPI (apt-get install openmpi-bin libopenmpi-dev; scripts/setup.sh does it)"
    );
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-np", "2", "--mca", "btl", "self,vader"]);
    // One rayon thread per rank: the ranks share this machine's cores.
    c.env("RAYON_NUM_THREADS", "1").env("TESSERA_DIST_CASE", case).env("TESSERA_DIST_OUT", dir);
    for (k, v) in env {
        c.env(k, v);
    }
    c.arg(std::env::current_exe().unwrap());
    c
}

fn write_weights(path: &Path, w: &Weights) {
    let mut bytes = Vec::new();
    for (_, v) in w {
        bytes.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    }
    std::fs::write(path, bytes).unwrap();
}

fn read_weights(path: &Path, like: &Weights) -> Weights {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut at = 0;
    like.iter()
        .map(|(n, v)| {
            let out = b[at..at + v.len() * 4].chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            at += v.len() * 4;
            (n.clone(), out)
        })
        .collect()
}

// ---- the driver's checks ----

fn two_mpi_ranks_end_like_one_process() {
    let dir = out_dir("equivalence");
    let st = mpirun("equivalence", &dir, &[]).status().expect("mpirun");
    assert!(st.success(), "mpirun -np 2 equivalence: {st}");
    let data = mnist();
    let dev = Device::cpu();
    for opt in [Opt::SgdMomentum, Opt::AdamWClip] {
        let want = reference(&data, opt, 20, 64, &dev);
        for rank in 0..2 {
            let got = read_weights(&dir.join(format!("{opt:?}.{rank}.bin")), &want);
            assert_rel_close(&format!("mpirun rank {rank} {opt:?}: 2 x 32 vs 1 x 64"), &got, &want, 1e-5);
        }
        let start = weights(&mut model(&dev));
        assert!(rel_diff(&start, &want) > 1e-3);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn a_killed_rank_ends_the_job_and_the_run_resumes() {
    let dir = out_dir("kill");
    let mut child = mpirun("train", &dir, &[("TESSERA_DIST_STEPS", "100000".into())])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun");
    // Wait for a checkpoint past step 10, then SIGKILL rank 1.
    let ckpt = dir.join("ddp.ckpt");
    let t0 = Instant::now();
    loop {
        if let Some(s) = std::fs::read_to_string(dir.join("saved")).ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            if s >= 10 {
                break;
            }
        }
        assert!(child.try_wait().unwrap().is_none(), "the job ended before a checkpoint");
        assert!(t0.elapsed() < Duration::from_secs(120), "no checkpoint within 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = std::fs::read_to_string(dir.join("pid.1")).expect("rank 1's pid");
    let killed = Instant::now();
    assert!(Command::new("kill").args(["-KILL", pid.trim()]).status().unwrap().success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if killed.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the job was still running 60 s after rank 1 was killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = killed.elapsed();
    let mut err = String::new();
    use std::io::Read;
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    println!("  rank 1 SIGKILLed: mpirun exited {status} after {:.2} s", took.as_secs_f64());
    assert!(!status.success(), "mpirun must fail when a rank dies");
    assert!(took < Duration::from_secs(30), "the others took {took:?} to exit");
    assert!(err.contains("signal 9") || err.contains("Killed") || err.contains("killed"), "stderr:\n{err}");
    assert!(ckpt.exists());
    // Resume: both ranks load the last checkpoint and run 10 more steps.
    let saved: u64 = std::fs::read_to_string(dir.join("saved")).unwrap().trim().parse().unwrap();
    let target = saved + 10;
    let out = mpirun("train", &dir, &[("TESSERA_DIST_STEPS", target.to_string()), ("TESSERA_DIST_RESUME", "1".into())])
        .output()
        .expect("mpirun");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "resume: {}\n{text}{}", out.status, String::from_utf8_lossy(&out.stderr));
    let from: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("resumed at step "))
        .unwrap_or_else(|| panic!("{text}"))
        .trim()
        .parse()
        .unwrap();
    assert!(from >= 10 && from <= target, "{text}");
    assert!(text.contains(&format!("finished at step {target}")), "{text}");
    println!("  resumed at step {from}, finished at step {target}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn a_stalled_rank_times_out_and_aborts_the_job() {
    let dir = out_dir("stall");
    let t = Instant::now();
    let out = mpirun("stall", &dir, &[("TESSERA_DIST_TIMEOUT", "2".into())]).output().expect("mpirun");
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    println!("  rank 1 stalled: the job ended after {:.1} s", took.as_secs_f64());
    assert!(!out.status.success(), "a stalled job must fail");
    assert!(err.contains("barrier timed out after 2.0 s"), "stderr:\n{err}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn diverged_replicas_fail_naming_the_step() {
    let dir = out_dir("diverge");
    let out = mpirun("diverge", &dir, &[]).output().expect("mpirun");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a diverged run must fail");
    assert!(err.contains("diverged by step 4"), "stderr:\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- a rank ----

fn rank_main(case: &str) -> tessera::Result<()> {
    let timeout = std::env::var("TESSERA_DIST_TIMEOUT").ok().and_then(|s| s.parse().ok()).unwrap_or(30.0);
    let comm = Rc::new(MpiComm::init_with_timeout(Duration::from_secs_f64(timeout))?);
    let rank = comm.rank();
    let out = PathBuf::from(std::env::var_os("TESSERA_DIST_OUT").expect("TESSERA_DIST_OUT"));
    std::fs::write(out.join(format!("pid.{rank}")), std::process::id().to_string()).ok();
    let data = mnist();
    let dev = Device::cpu();
    match case {
        "equivalence" => {
            for opt in [Opt::SgdMomentum, Opt::AdamWClip] {
                let options = DdpOptions { check_every: 5, ..Default::default() };
                let (w, _) = ddp_run(Box::new(comm.clone()), &data, opt, 20, 32, &dev, options)?;
                write_weights(&out.join(format!("{opt:?}.{rank}.bin")), &w);
            }
            Ok(())
        }
        "train" => {
            let steps: u64 = std::env::var("TESSERA_DIST_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(100);
            let mut m = model(&dev);
            let mut o = Opt::AdamWClip.make();
            let mut ddp = DistributedDataParallel::new(Box::new(comm.clone()), &mut m, DdpOptions::default())?;
            let ckpt = out.join("ddp.ckpt");
            if std::env::var("TESSERA_DIST_RESUME").is_ok() {
                ddp.load_checkpoint(&ckpt, &mut m, o.as_mut(), &dev)?;
                if rank == 0 {
                    println!("resumed at step {}", ddp.steps());
                }
            }
            let per_epoch = tessera::models::mnist::TRAIN / 64;
            while ddp.steps() < steps {
                let k = ddp.steps() as usize;
                let order = DistributedSampler::new(tessera::models::mnist::TRAIN, rank, 2, SEED)
                    .indices((k / per_epoch) as u64);
                let at = (k % per_epoch) * 32;
                let (x, y) = batch(&data, &order[at..at + 32], &dev);
                let l = loss::cross_entropy(&m.forward(&x), &y);
                ddp.step(&mut m, o.as_mut(), &l, DdpStep { clip_norm: Some(0.5), ..Default::default() })?;
                if ddp.steps().is_multiple_of(5) {
                    ddp.save_checkpoint(&ckpt, &mut m, o.as_mut(), &Default::default())?;
                    if rank == 0 {
                        std::fs::write(out.join("saved"), ddp.steps().to_string()).ok();
                    }
                }
            }
            ddp.check_weights(&mut m)?;
            if rank == 0 {
                println!("finished at step {}", ddp.steps());
            }
            Ok(())
        }
        "diverge" => {
            let mut m = model(&dev);
            let mut o = Opt::SgdMomentum.make();
            let mut ddp = DistributedDataParallel::new(
                Box::new(comm.clone()),
                &mut m,
                DdpOptions { check_every: 2, ..Default::default() },
            )?;
            let order = DistributedSampler::new(tessera::models::mnist::TRAIN, rank, 2, SEED).indices(0);
            for k in 0..6 {
                if rank == 1 && k == 3 {
                    let mut slots = m.slots();
                    *slots[0].tensor = slots[0].tensor.add_scalar(1e-3).detach().requires_grad();
                }
                let (x, y) = batch(&data, &order[k * 32..(k + 1) * 32], &dev);
                let l = loss::cross_entropy(&m.forward(&x), &y);
                ddp.step(&mut m, o.as_mut(), &l, DdpStep::default())?;
            }
            Ok(())
        }
        "stall" => {
            if rank == 1 {
                // Alive but stuck: no collective from this rank for a long time.
                std::thread::sleep(Duration::from_secs(300));
            }
            comm.barrier()
        }
        other => panic!("unknown case {other}"),
    }
}
