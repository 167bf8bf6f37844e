//! All-reduce on this machine: the latency and bandwidth of a bare rsmpi
//! `all_reduce_into`, and of DDP's path (buckets filled and scattered back) on the same
//! bytes, interleaved in one run.
//!
//! ```text
//! cargo build --release --features mpi --example dist_bench
//! mpirun -np 2 target/release/examples/dist_bench [--sizes-mb 1,4,16,64] [--json]
//! ```

use std::time::Instant;
use tessera::dist::{Communicator, DdpOptions, DistributedDataParallel, MpiComm};
use tessera::nn::{Linear, Sequential};
use tessera::Device;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let sizes: Vec<usize> = args
        .iter()
        .position(|a| a == "--sizes-mb")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4, 16, 64]);
    let comm = std::rc::Rc::new(MpiComm::init().unwrap_or_else(|e| panic!("{e}")));
    let (rank, size) = (comm.rank(), comm.size());
    let dev = Device::cpu();
    if rank == 0 && !json {
        println!("all-reduce of f32 sums over {size} ranks (median of the timed iterations, interleaved)\n");
        println!(
            "{:>8} {:>12} {:>12} {:>10} {:>12} {:>9}",
            "MB", "bare ms", "DDP ms", "DDP/bare", "bare GB/s", "buckets"
        );
    }
    for mb in sizes {
        let n = mb * (1 << 20) / 4;
        // A model with that many parameters in 1024-wide Linear layers (4 MB each).
        let rows = (n / 1024).max(1);
        let mut model = Sequential::new();
        let mut left = rows;
        let mut seed = 1;
        while left > 0 {
            let r = left.min(1024);
            model = model.add(Linear::new(1024, r, false, seed, &dev));
            left -= r;
            seed += 1;
        }
        let ddp = DistributedDataParallel::new(Box::new(comm.clone()), &mut model, DdpOptions::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let total: usize = ddp.bucket_sizes().iter().sum();
        let mut send: Vec<f32> = (0..total).map(|i| (i % 97) as f32 * 0.01 + rank as f32).collect();
        let mut recv = vec![0.0f32; total];
        let mut out = vec![0.0f32; total];
        let iters = (256 / mb).clamp(5, 50);
        let (mut bare, mut via_ddp) = (Vec::new(), Vec::new());
        for it in 0..iters + 2 {
            comm.barrier().unwrap();
            let t = Instant::now();
            comm.raw_all_reduce_into(&send, &mut recv);
            let b = t.elapsed().as_secs_f64();
            comm.barrier().unwrap();
            let t = Instant::now();
            ddp.reduce_flat(&mut send, &mut out).unwrap_or_else(|e| panic!("{e}"));
            let d = t.elapsed().as_secs_f64();
            assert_eq!(out[total / 2], recv[total / 2]);
            if it >= 2 {
                bare.push(b);
                via_ddp.push(d);
            }
        }
        // Every rank's medians; the slowest rank's are what a step waits for.
        let gather =
            |x: f64| comm.all_gather_u64(x.to_bits()).unwrap().into_iter().map(f64::from_bits).fold(0.0, f64::max);
        let (b, d) = (gather(median(bare)), gather(median(via_ddp)));
        let bytes = total as f64 * 4.0;
        if rank == 0 {
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "mb": mb, "ranks": size, "bare_ms": b * 1e3, "ddp_ms": d * 1e3,
                        "ddp_over_bare": d / b, "bare_gb_s": bytes / b / 1e9, "buckets": ddp.bucket_sizes().len() })
                );
            } else {
                println!(
                    "{:>8} {:>12.3} {:>12.3} {:>10.3} {:>12.2} {:>9}",
                    mb,
                    b * 1e3,
                    d * 1e3,
                    d / b,
                    bytes / b / 1e9,
                    ddp.bucket_sizes().len()
                );
            }
        }
    }
}
