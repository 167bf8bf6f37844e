//! Criterion benches of the engine core on the default adapter: a fused element-wise
//! chain, a reduction, softmax and the tiled f32 matmul. Each iteration realises the
//! graph (one submit) and waits for the GPU.
//!
//! `cargo bench --bench core_ops` (set `TESSERA_ADAPTER` to pick an adapter).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tessera::{Device, Tensor};

fn run(d: &Device, t: &Tensor) {
    t.realize_blocking().expect("realise");
    d.synchronize().expect("synchronize");
}

fn benches(c: &mut Criterion) {
    let d = match Device::new() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("no device: {e}");
            return;
        }
    };
    eprintln!("benchmarking on {d}");
    let mut g = c.benchmark_group("elementwise");
    for n in [1usize << 16, 1 << 20] {
        let x = Tensor::rand([n], 1, &d);
        x.realize_blocking().unwrap();
        g.throughput(Throughput::Bytes((n * 8) as u64));
        g.bench_with_input(BenchmarkId::new("fused_gelu_chain", n), &n, |b, _| {
            b.iter(|| run(&d, &((&x * 2.0 + 1.0).gelu() * &x)))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("reduce");
    for (rows, cols) in [(1024usize, 1024usize), (64, 16384)] {
        let x = Tensor::rand([rows, cols], 2, &d);
        x.realize_blocking().unwrap();
        g.throughput(Throughput::Bytes((rows * cols * 4) as u64));
        g.bench_function(format!("sum_rows_{rows}x{cols}"), |b| b.iter(|| run(&d, &x.sum(&[1], false))));
        g.bench_function(format!("softmax_{rows}x{cols}"), |b| b.iter(|| run(&d, &x.softmax(-1))));
    }
    g.finish();

    let mut g = c.benchmark_group("matmul_f32");
    g.sample_size(10);
    for n in [128usize, 256, 512] {
        let a = Tensor::rand([n, n], 3, &d);
        let b_ = Tensor::rand([n, n], 4, &d);
        a.realize_blocking().unwrap();
        b_.realize_blocking().unwrap();
        g.throughput(Throughput::Elements((2 * n * n * n) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| b.iter(|| run(&d, &a.matmul(&b_))));
    }
    g.finish();
}

criterion_group!(core, benches);
criterion_main!(core);
