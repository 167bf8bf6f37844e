//! Data-parallel training with `LocalComm` (one thread per device in this process):
//! equivalence with one process, gradient accumulation, agreed overflow skips, weight
//! divergence, a dead rank, checkpoints. `tests/dist_mpi.rs` runs the same training over
//! real `mpirun` (feature `mpi`).

mod common;
mod dist_common;

use dist_common::*;
use std::time::{Duration, Instant};
use tessera::dist::{Communicator, DdpOptions, DdpStep, DistributedDataParallel, DistributedSampler, LocalComm};
use tessera::nn::{loss, Layer, Module};
use tessera::optim::GradScaler;
use tessera::Device;

/// Run `f(rank, comm, device)` on one thread per device; results in rank order.
fn on_ranks<T: Send>(
    devices: &[Device],
    comms: Vec<LocalComm>,
    f: impl Fn(usize, LocalComm, &Device) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(r, (c, d))| {
                let f = &f;
                s.spawn(move || f(r, c, d))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

/// Two devices of the same kind: two CPU backends, and two devices on the first GPU
/// adapter.
fn device_pairs() -> Vec<(String, [Device; 2])> {
    let mut out = vec![("cpu+cpu".to_string(), [Device::cpu(), Device::cpu()])];
    if let (Some(a), Some(b)) = (common::private_gpu(Default::default()), common::private_gpu(Default::default())) {
        out.push((format!("{0}+{0}", common::label(&a)), [a, b]));
    }
    out
}

#[test]
fn two_replicas_end_like_one_process_with_twice_the_batch() {
    let data = mnist();
    for (label, devs) in device_pairs() {
        common::record(&devs[0]);
        for opt in [Opt::SgdMomentum, Opt::AdamWClip] {
            let want = reference(&data, opt, 20, 64, &devs[0]);
            let got = on_ranks(&devs, LocalComm::group(2), |_, c, d| {
                ddp_run(Box::new(c), &data, opt, 20, 32, d, DdpOptions { check_every: 5, ..Default::default() })
                    .expect("ddp")
            });
            let what = format!("{label} {opt:?}");
            assert_rel_close(&format!("{what}: rank 0 vs rank 1"), &got[0].0, &got[1].0, 0.0);
            assert_rel_close(&format!("{what}: 2 x 32 vs 1 x 64"), &got[0].0, &want, 1e-5);
            if opt == Opt::AdamWClip {
                assert!(got[0].1 > 0.5, "{what}: clipping never engaged (largest norm {})", got[0].1);
            }
            // The check can fail: the start differs from the end by far more.
            let start = weights(&mut model(&devs[0]));
            assert!(rel_diff(&start, &want) > 1e-3, "{what}: training did not move the weights");
        }
    }
}

#[test]
fn small_buckets_give_the_same_result_as_one_bucket() {
    let data = mnist();
    let devs = [Device::cpu(), Device::cpu()];
    let run = |bucket_bytes| {
        on_ranks(&devs, LocalComm::group(2), |_, c, d| {
            ddp_run(Box::new(c), &data, Opt::SgdMomentum, 4, 32, d, DdpOptions { bucket_bytes, ..Default::default() })
                .expect("ddp")
                .0
        })
    };
    let one = run(25 << 20);
    let many = run(4096);
    assert_rel_close("4 KiB buckets vs one bucket", &many[0], &one[0], 0.0);
}

#[test]
fn no_sync_accumulation_equals_the_large_batch() {
    let data = mnist();
    let devs = [Device::cpu(), Device::cpu()];
    let want = reference(&data, Opt::SgdMomentum, 6, 64, &devs[0]);
    let got = on_ranks(&devs, LocalComm::group(2), |rank, c, dev| {
        let mut m = model(dev);
        let mut o = Opt::SgdMomentum.make();
        let mut ddp = DistributedDataParallel::new(Box::new(c), &mut m, DdpOptions::default()).unwrap();
        let order = DistributedSampler::new(tessera::models::mnist::TRAIN, rank, 2, SEED).indices(0);
        for k in 0..6 {
            // Two micro-batches of 16: the first without communication.
            let (x, y) = batch(&data, &order[k * 32..k * 32 + 16], dev);
            let l = loss::cross_entropy(&m.forward(&x), &y).mul_scalar(0.5);
            ddp.backward_no_sync(&mut m, &l).unwrap();
            let (x, y) = batch(&data, &order[k * 32 + 16..k * 32 + 32], dev);
            let l = loss::cross_entropy(&m.forward(&x), &y).mul_scalar(0.5);
            ddp.step(&mut m, o.as_mut(), &l, DdpStep::default()).unwrap();
        }
        weights(&mut m)
    });
    assert_rel_close("no_sync 2 x 2 x 16 vs 1 x 64", &got[0], &want, 1e-5);
}

#[test]
fn an_overflow_on_one_rank_skips_the_step_on_every_rank() {
    let data = mnist();
    let devs = [Device::cpu(), Device::cpu()];
    let out = on_ranks(&devs, LocalComm::group(2), |rank, c, dev| {
        let mut m = model(dev);
        let mut o = Opt::SgdMomentum.make();
        let mut scaler = GradScaler::new(1024.0);
        let mut ddp = DistributedDataParallel::new(Box::new(c), &mut m, DdpOptions::default()).unwrap();
        let order = DistributedSampler::new(tessera::models::mnist::TRAIN, rank, 2, SEED).indices(0);
        let mut log = Vec::new();
        for k in 0..3 {
            let before = weights(&mut m);
            let (x, y) = batch(&data, &order[k * 32..(k + 1) * 32], dev);
            let mut l = loss::cross_entropy(&m.forward(&x), &y);
            if rank == 1 && k == 1 {
                l = l.mul_scalar(f64::INFINITY);
            }
            let r = ddp.step(&mut m, o.as_mut(), &l, DdpStep { scaler: Some(&mut scaler), ..Default::default() });
            let r = r.unwrap();
            let unchanged = weights(&mut m) == before;
            log.push((r.applied, unchanged, scaler.scale));
        }
        (log, tessera::dist::weights_hash(&mut m).unwrap())
    });
    for (rank, (log, _)) in out.iter().enumerate() {
        assert_eq!(log[0], (true, false, 1024.0), "rank {rank} step 0");
        assert_eq!(log[1], (false, true, 512.0), "rank {rank}: the overflow on rank 1 skips step 1 everywhere");
        assert_eq!(log[2], (true, false, 512.0), "rank {rank} step 2");
    }
    assert_eq!(out[0].1, out[1].1, "the replicas agree after the skip");
}

#[test]
fn diverged_weights_are_an_error_naming_the_step() {
    let data = mnist();
    let devs = [Device::cpu(), Device::cpu()];
    let out = on_ranks(&devs, LocalComm::group(2), |rank, c, dev| {
        let mut m = model(dev);
        let mut o = Opt::SgdMomentum.make();
        let mut ddp =
            DistributedDataParallel::new(Box::new(c), &mut m, DdpOptions { check_every: 2, ..Default::default() })
                .unwrap();
        let order = DistributedSampler::new(tessera::models::mnist::TRAIN, rank, 2, SEED).indices(0);
        for k in 0..6 {
            if rank == 1 && k == 3 {
                // A replica that drifts (a bug, a bad device): one weight nudged.
                let mut slots = m.slots();
                *slots[0].tensor = slots[0].tensor.add_scalar(1e-3).detach().requires_grad();
            }
            let (x, y) = batch(&data, &order[k * 32..(k + 1) * 32], dev);
            let l = loss::cross_entropy(&m.forward(&x), &y);
            if let Err(e) = ddp.step(&mut m, o.as_mut(), &l, DdpStep::default()) {
                return e.to_string();
            }
        }
        "no error".to_string()
    });
    for (rank, msg) in out.iter().enumerate() {
        assert!(msg.contains("diverged by step 4") && msg.contains("[1]"), "rank {rank}: {msg}");
    }
}

#[test]
fn a_dead_rank_fails_the_others_within_the_timeout() {
    let data = mnist();
    let devs = [Device::cpu(), Device::cpu()];
    let t0 = Instant::now();
    let out = on_ranks(&devs, LocalComm::group_with_timeout(2, Duration::from_secs(2)), |rank, c, dev| {
        let mut m = model(dev);
        let mut o = Opt::SgdMomentum.make();
        let mut ddp = DistributedDataParallel::new(Box::new(c), &mut m, DdpOptions::default()).unwrap();
        let order = DistributedSampler::new(tessera::models::mnist::TRAIN, rank, 2, SEED).indices(0);
        for k in 0..100 {
            if rank == 1 && k == 2 {
                return Ok::<usize, tessera::Error>(k); // this rank dies
            }
            let (x, y) = batch(&data, &order[k * 32..(k + 1) * 32], dev);
            let l = loss::cross_entropy(&m.forward(&x), &y);
            ddp.step(&mut m, o.as_mut(), &l, DdpStep::default())?;
        }
        Ok(100)
    });
    let waited = t0.elapsed();
    let err = out[0].as_ref().expect_err("rank 0 must fail when rank 1 is gone").to_string();
    assert!(err.contains("never arrived") && err.contains("[1]"), "{err}");
    assert!(waited < Duration::from_secs(20), "rank 0 took {waited:?} to give up");
    // A poisoned group fails at once afterwards.
    let (a, b) = {
        let mut g = LocalComm::group_with_timeout(2, Duration::from_secs(60));
        let b = g.pop().unwrap();
        (g.pop().unwrap(), b)
    };
    b.abort("test");
    let t = Instant::now();
    assert!(a.barrier().unwrap_err().to_string().contains("aborted: test"));
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_checkpoint_resumes_every_rank_identically() {
    let data = mnist();
    let devs = [Device::cpu(), Device::cpu()];
    let dir = std::env::temp_dir().join(format!("tessera-dist-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ddp.ckpt");
    let train = |rank: usize,
                 ddp: &mut DistributedDataParallel,
                 m: &mut tessera::nn::Sequential,
                 o: &mut dyn tessera::optim::Optimizer,
                 from: usize,
                 to: usize,
                 dev: &Device| {
        let order = DistributedSampler::new(tessera::models::mnist::TRAIN, rank, 2, SEED).indices(0);
        for k in from..to {
            let (x, y) = batch(&data, &order[k * 32..(k + 1) * 32], dev);
            let l = loss::cross_entropy(&m.forward(&x), &y);
            ddp.step(m, o, &l, DdpStep::default()).unwrap();
        }
    };
    // Uninterrupted: 8 steps. Interrupted: 5 steps, save; fresh replicas load, 3 more.
    let straight = on_ranks(&devs, LocalComm::group(2), |rank, c, dev| {
        let mut m = model(dev);
        let mut o = Opt::AdamWClip.make();
        let mut ddp = DistributedDataParallel::new(Box::new(c), &mut m, DdpOptions::default()).unwrap();
        train(rank, &mut ddp, &mut m, o.as_mut(), 0, 8, dev);
        weights(&mut m)
    });
    on_ranks(&devs, LocalComm::group(2), |rank, c, dev| {
        let mut m = model(dev);
        let mut o = Opt::AdamWClip.make();
        let mut ddp = DistributedDataParallel::new(Box::new(c), &mut m, DdpOptions::default()).unwrap();
        train(rank, &mut ddp, &mut m, o.as_mut(), 0, 5, dev);
        ddp.save_checkpoint(&path, &mut m, o.as_mut(), &Default::default()).unwrap();
    });
    let resumed = on_ranks(&devs, LocalComm::group(2), |rank, c, dev| {
        let mut m = tessera::models::mnist::build("mlp", 99 + rank as u64, dev).unwrap();
        let mut o = Opt::AdamWClip.make();
        let mut ddp = DistributedDataParallel::new(Box::new(c), &mut m, DdpOptions::default()).unwrap();
        let md = ddp.load_checkpoint(&path, &mut m, o.as_mut(), dev).unwrap();
        assert_eq!(md["ddp_steps"], "5");
        assert_eq!(ddp.steps(), 5);
        train(rank, &mut ddp, &mut m, o.as_mut(), 5, 8, dev);
        weights(&mut m)
    });
    std::fs::remove_dir_all(&dir).ok();
    assert_rel_close("resumed rank 0 vs uninterrupted", &resumed[0], &straight[0], 0.0);
    assert_rel_close("resumed rank 1 vs uninterrupted", &resumed[1], &straight[1], 0.0);
}

#[test]
fn replicas_of_different_models_are_refused() {
    let devs = [Device::cpu(), Device::cpu()];
    let out = on_ranks(&devs, LocalComm::group(2), |rank, c, dev| {
        let mut m = tessera::models::mnist::build(if rank == 0 { "mlp" } else { "cnn" }, 1, dev).unwrap();
        DistributedDataParallel::new(Box::new(c), &mut m, DdpOptions::default()).err().map(|e| e.to_string())
    });
    for (rank, e) in out.iter().enumerate() {
        let e = e.as_deref().unwrap_or("no error");
        assert!(e.contains("rank(s) [1] hold a model with other parameters"), "rank {rank}: {e}");
    }
}
