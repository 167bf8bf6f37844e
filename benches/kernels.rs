//! Criterion benches of the fast kernels on the default adapter, on the issue's
//! realistic shapes: matmul (square 256 to 2048 in f32, 512 and 1024 in f16, BERT-like
//! 128x384x1536 with f32, f16, Q8_0 and Q4_0 weights, batched 8 x 128x64 @ 64x128),
//! GEMV 1x4096x4096 per weight dtype, conv2d (8x64x56x56, 3x3, 64 out) and attention
//! (12 heads x 64, sequence 128 and 512, f32 and f16). Each iteration realises the graph
//! and waits for the GPU.
//!
//! `cargo bench --bench kernels [-- FILTER]`; on lavapipe, filter (e.g. `-- gemv`): the
//! large cases take minutes there. `examples/bench` prints the same cases as one table.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tessera::ops::nn::Conv2dOptions;
use tessera::{quant, DType, Device, Tensor};

fn run(d: &Device, t: &Tensor) {
    t.realize_blocking().expect("realise");
    d.synchronize().expect("synchronize");
}

fn ready(ts: &[&Tensor]) {
    let all: Vec<Tensor> = ts.iter().map(|t| (*t).clone()).collect();
    tessera::read_all_blocking(&all).expect("upload");
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

    let mut g = c.benchmark_group("matmul");
    g.sample_size(10);
    let square =
        [256usize, 512, 1024, 2048].map(|n| (DType::F32, n)).into_iter().chain([(DType::F16, 512), (DType::F16, 1024)]);
    for (dt, n) in square {
        let a = Tensor::rand([n, n], 1, &d).cast(dt);
        let b_ = Tensor::rand([n, n], 2, &d).cast(dt);
        ready(&[&a, &b_]);
        g.throughput(Throughput::Elements((2 * n * n * n) as u64));
        g.bench_with_input(BenchmarkId::new(format!("square_{dt}"), n), &n, |b, _| b.iter(|| run(&d, &a.matmul(&b_))));
    }
    let w32 = Tensor::rand([1536, 384], 3, &d) - 0.5;
    for dt in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0] {
        let x = Tensor::rand([128, 384], 4, &d);
        let x = if dt == DType::F16 { x.cast(dt) } else { x };
        let w = quant::convert_blocking(&w32, dt).expect("convert");
        ready(&[&x, &w]);
        g.throughput(Throughput::Elements(2 * 128 * 384 * 1536));
        g.bench_function(format!("bert_128x384x1536_{dt}"), |b| b.iter(|| run(&d, &x.matmul(&w.t()))));
    }
    let (a, b_) = (Tensor::rand([8, 128, 64], 5, &d), Tensor::rand([8, 64, 128], 6, &d));
    ready(&[&a, &b_]);
    g.throughput(Throughput::Elements(2 * 8 * 128 * 128 * 64));
    g.bench_function("batched_8x128x128x64", |b| b.iter(|| run(&d, &a.matmul(&b_))));
    g.finish();

    let mut g = c.benchmark_group("gemv");
    g.sample_size(10);
    let (x, w32) = (Tensor::rand([1, 4096], 7, &d) - 0.5, Tensor::rand([4096, 4096], 8, &d) - 0.5);
    for dt in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0] {
        let x = if dt == DType::F16 { x.cast(dt) } else { x.clone() };
        let w = quant::convert_blocking(&w32, dt).expect("convert");
        ready(&[&x, &w]);
        g.throughput(Throughput::Bytes(if dt.is_quantized() {
            quant::gguf_bytes(dt, 4096 * 4096)
        } else {
            dt.size_in_bytes() * 4096 * 4096
        } as u64));
        g.bench_function(format!("1x4096x4096_{dt}"), |b| b.iter(|| run(&d, &x.matmul(&w.t()))));
    }
    g.finish();

    let mut g = c.benchmark_group("quantize");
    g.sample_size(10);
    let x = Tensor::rand([1024, 1024], 11, &d) - 0.5;
    ready(&[&x]);
    g.throughput(Throughput::Bytes(4 * 1024 * 1024));
    for dt in [DType::Q8_0, DType::Q4_0] {
        g.bench_function(format!("1024x1024_{dt}"), |b| b.iter(|| run(&d, &x.quantize(dt))));
    }
    g.finish();

    let mut g = c.benchmark_group("conv2d");
    g.sample_size(10);
    let x = Tensor::rand([8, 64, 56, 56], 9, &d);
    let w = Tensor::rand([64, 64, 3, 3], 10, &d) * 0.1;
    ready(&[&x, &w]);
    g.throughput(Throughput::Elements(2 * 8 * 64 * 56 * 56 * 64 * 9));
    g.bench_function("8x64x56x56_k3_64", |b| b.iter(|| run(&d, &x.conv2d(&w, None, Conv2dOptions::new(1, 1)))));
    g.finish();

    let mut g = c.benchmark_group("attention");
    g.sample_size(10);
    for dt in [DType::F32, DType::F16] {
        for seq in [128usize, 512] {
            let qkv: Vec<Tensor> = (0..3).map(|i| Tensor::rand([1, 12, seq, 64], 11 + i, &d).cast(dt)).collect();
            ready(&qkv.iter().collect::<Vec<_>>());
            g.throughput(Throughput::Elements((4 * 12 * seq * seq * 64) as u64));
            g.bench_function(format!("12x{seq}x64_{dt}"), |b| {
                b.iter(|| run(&d, &Tensor::scaled_dot_product_attention(&qkv[0], &qkv[1], &qkv[2], None, false)))
            });
        }
    }
    g.finish();
}

criterion_group!(kernels, benches);
criterion_main!(kernels);
