//! burn's side of issue #21's comparison: the cases of Tessera's `bench --peer-cases`,
//! by its method, on burn's wgpu backend (fusion and autotune on) and the default
//! adapter (lavapipe where `scripts/env.sh` points Vulkan at it).
//!
//! Method, as Tessera's: inputs on the device before timing; 3 warm-up iterations; at
//! least 5 timed ones, until `--seconds` (2 by default); each iteration forced to finish
//! by a device sync while its output is alive (else fusion computes only the element
//! read), then one element of the output read back; two passes over all cases, interleaved;
//! per pass, the median. One JSON line per case (`--json`) or a table. Other arguments
//! keep the cases whose names contain one of them (`burn-peer tiny matmul`).

use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamConfig, GradientsParams};
use burn::prelude::*;
use burn::tensor::activation::{relu, softmax};
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Distribution, FloatDType};
use std::time::Instant;

/// Wait for the device to finish every queued operation while `t` is alive (so fusion
/// cannot drop or narrow its computation), then read one element of it back.
#[allow(clippy::single_range_in_vec_init)] // burn's slice takes one range per axis
fn force<const D: usize>(t: Tensor<D>) {
    t.device().sync().expect("the device failed");
    let one = t.flatten::<1>(0, D - 1).slice([0..1]).into_data();
    std::hint::black_box(one);
}

/// Values in [-0.5, 0.5), already on the device.
fn input<const D: usize>(shape: [usize; D], device: &Device) -> Tensor<D> {
    let t = Tensor::<D>::random(shape, Distribution::Uniform(-0.5, 0.5), device);
    force(t.clone());
    t
}

#[derive(Module, Debug)]
struct Mlp {
    hidden: Linear,
    act: Relu,
    out: Linear,
}

impl Mlp {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.out.forward(self.act.forward(self.hidden.forward(x)))
    }
}

struct Case<'a> {
    name: &'static str,
    work: f64,
    unit: &'static str,
    run: Box<dyn FnMut() + 'a>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let seconds: f64 = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let device = Device::wgpu(Default::default());
    let mut cases: Vec<Case> = Vec::new();
    for (name, f16, n) in
        [("matmul f32 1024", false, 1024), ("matmul f32 512", false, 512), ("matmul f16 512", true, 512)]
    {
        let (mut a, mut b) = (input([n, n], &device), input([n, n], &device));
        if f16 {
            a = a.cast(FloatDType::F16);
            b = b.cast(FloatDType::F16);
            force(a.clone());
            force(b.clone());
        }
        let work = 2.0 * (n * n * n) as f64 / 1e9;
        cases.push(Case { name, work, unit: "GFLOP/s", run: Box::new(move || force(a.clone().matmul(b.clone()))) });
    }
    let (a, b) = (input([8, 128, 64], &device), input([8, 64, 128], &device));
    cases.push(Case {
        name: "matmul-batched f32 8x128x64x128",
        work: 2.0 * (8 * 128 * 128 * 64) as f64 / 1e9,
        unit: "GFLOP/s",
        run: Box::new(move || force(a.clone().matmul(b.clone()))),
    });
    let n = 4 << 20;
    let x = input([n], &device);
    cases.push(Case {
        name: "elementwise f32 4M",
        work: (n * 8) as f64 / 1e9,
        unit: "GB/s",
        run: Box::new(move || force(relu((x.clone() * 2.0 + 1.0).exp().tanh() * x.clone()))),
    });
    let (x, w) = (input([8, 64, 56, 56], &device), input([64, 64, 3, 3], &device));
    cases.push(Case {
        name: "conv2d f32 8x64x56x56 k3",
        work: 2.0 * (8 * 64 * 56 * 56 * 64 * 9) as f64 / 1e9,
        unit: "GFLOP/s",
        run: Box::new(move || force(conv2d(x.clone(), w.clone(), None, ConvOptions::new([1, 1], [1, 1], [1, 1], 1)))),
    });
    let (q, k, v) =
        (input([1, 12, 128, 64], &device), input([1, 12, 128, 64], &device), input([1, 12, 128, 64], &device));
    cases.push(Case {
        name: "attention-composed f32 1x12x128x64",
        work: 4.0 * (12 * 128 * 128 * 64) as f64 / 1e9,
        unit: "GFLOP/s",
        run: Box::new(move || force(softmax(q.clone().matmul(k.clone().swap_dims(2, 3)) / 8.0, 3).matmul(v.clone()))),
    });
    let train = device.clone().autodiff();
    let mut mlp = Some(Mlp {
        hidden: LinearConfig::new(784, 256).init(&train),
        act: Relu::new(),
        out: LinearConfig::new(256, 10).init(&train),
    });
    let mut adam = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&train);
    let xb = Tensor::<2>::random([64, 784], Distribution::Uniform(0.0, 1.0), &train);
    let yb = Tensor::<1, Int>::from_ints((0..64).map(|i| i * 7 % 10).collect::<Vec<_>>().as_slice(), &train);
    cases.push(Case {
        name: "mlp-train adam b64",
        work: 1.0,
        unit: "steps/s",
        run: Box::new(move || {
            let m = mlp.take().expect("the model is put back after every step");
            let loss = loss_fn.forward(m.forward(xb.clone()), yb.clone());
            let grads = GradientsParams::from_grads(loss.backward(), &m);
            let m = adam.step(1e-3, m, grads);
            force(loss);
            mlp = Some(m);
        }),
    });
    // A one-element op whose input changes every time: burn answers the same expression
    // on the same tensor (`one + 1` again) in about 0.05 ms without running it again, so
    // that form (kept below) measures no work; Tessera's case computes every time.
    let mut acc = input([1], &device);
    let read = |t: &Tensor<1>| t.to_data().try_to_vec::<f32>().expect("an f32 tensor")[0];
    let mut expect = read(&acc);
    cases.push(Case {
        name: "tiny-op readback",
        work: 1e-3,
        unit: "ops/ms",
        run: Box::new(move || {
            acc = acc.clone() + 1.0;
            let got = read(&acc);
            expect += 1.0;
            assert!((got - expect).abs() <= 1e-3 * expect.abs().max(1.0), "burn read {got}, expected {expect}");
        }),
    });
    let one = input([1], &device);
    cases.push(Case {
        name: "tiny-op readback, same expression",
        work: 1e-3,
        unit: "ops/ms",
        run: Box::new(move || {
            std::hint::black_box((one.clone() + 1.0).into_data());
        }),
    });
    // Other arguments keep only the cases whose names contain one of them.
    let filters: Vec<&String> =
        args[1..].iter().filter(|a| !a.starts_with("--") && a.parse::<f64>().is_err()).collect();
    cases.retain(|c| filters.is_empty() || filters.iter().any(|f| c.name.contains(f.as_str())));
    let mut medians: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut first = vec![0.0; cases.len()];
    for pass in 0..2 {
        for (c, case) in cases.iter_mut().enumerate() {
            let mut iteration = || {
                let t = Instant::now();
                (case.run)();
                t.elapsed().as_secs_f64() * 1e3
            };
            if pass == 0 {
                first[c] = iteration();
            }
            for _ in 0..3 {
                iteration();
            }
            let (start, mut v) = (Instant::now(), Vec::new());
            while v.len() < 5 || (start.elapsed().as_secs_f64() < seconds && v.len() < 200) {
                v.push(iteration());
            }
            v.sort_by(f64::total_cmp);
            medians[c].push(v[v.len() / 2]);
        }
    }
    if !json {
        println!("burn 0.22.1 (wgpu, fusion, autotune), issue #21's cases; rates of pass 1, pass 2\n");
    }
    for (c, case) in cases.iter().enumerate() {
        let rate: Vec<f64> = medians[c].iter().map(|ms| case.work / (ms / 1e3)).collect();
        if json {
            println!(
                "{}",
                serde_json::json!({ "case": case.name, "engine": "burn", "rate": rate, "unit": case.unit, "median_ms": medians[c], "first_ms": first[c] })
            );
        } else {
            println!(
                "{:<36} {:>9.2} {:>9.2} {:<8} ({:.2}, {:.2} ms)  first call {:.0} ms",
                case.name, rate[0], rate[1], case.unit, medians[c][0], medians[c][1], first[c]
            );
        }
    }
}
