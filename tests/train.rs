//! Training: one-submit steps, optimiser arithmetic, schedules, clipping, loss scaling,
//! modules' state and modes, and checkpoints (bit-exact resume, corruption refused).

mod common;

use common::{assert_close, data, devices, label, Tol};
use std::collections::BTreeMap;
use tessera::nn::{loss, Activation, BatchNorm2d, Dropout, Layer, Linear, Module, Sequential};
use tessera::optim::{self, Adam, GradScaler, LrSchedule, Optimizer, Schedule, Sgd, StepOptions};
use tessera::{DType, Device, Tensor};

/// Tests here count submits on shared devices: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn mlp(dev: &Device) -> Sequential {
    Sequential::new().add(Linear::new(8, 16, true, 1, dev)).add(Activation::Relu).add(Linear::new(16, 3, true, 2, dev))
}

fn batch(dev: &Device, k: u64) -> (Tensor, Tensor) {
    let x = data(32 * 8, 100 + k, -1.0, 1.0);
    // A learnable rule: the class is which third of [-1, 1] the first feature is in.
    let y: Vec<i32> = (0..32).map(|i| ((x[i * 8] + 1.0) * 1.5).floor().clamp(0.0, 2.0) as i32).collect();
    (Tensor::from_slice(&x, [32, 8], dev), Tensor::from_slice(&y, [32], dev))
}

fn train(dev: &Device, model: &mut Sequential, opt: &mut dyn Optimizer, steps: std::ops::Range<u64>) -> Vec<f64> {
    let mut losses = Vec::new();
    for k in steps {
        let (x, y) = batch(dev, k % 4);
        let l = loss::cross_entropy(&model.forward(&x), &y);
        let loss = opt.step(model, &l).unwrap_or_else(|e| panic!("step on {}: {e}", label(dev)));
        losses.push(loss);
    }
    losses
}

/// One step of `model` on `(x, y)` with dynamic loss scaling (the forward pass in the
/// caller's autocast scope, if any).
fn scaled_step(
    model: &mut Sequential,
    opt: &mut Adam,
    scaler: &mut GradScaler,
    x: &Tensor,
    y: &Tensor,
) -> tessera::Result<optim::StepResult> {
    let l = loss::cross_entropy(&model.forward(x), y);
    opt.step_with(model, &l, StepOptions { scaler: Some(scaler), ..Default::default() })
}

fn params(model: &mut Sequential) -> Vec<Vec<f64>> {
    let ts: Vec<Tensor> = model.state_dict().into_iter().map(|(_, t)| t).collect();
    tessera::read_all_blocking(&ts).unwrap()
}

#[test]
fn a_training_step_is_one_submit_and_the_loss_falls() {
    let _s = serial();
    let cpu = Device::reference();
    let mut want_model = mlp(&cpu);
    let mut want_opt = Adam::new(0.05);
    let want_losses = train(&cpu, &mut want_model, &mut want_opt, 0..3);
    let want = params(&mut want_model);
    // devices() always holds the CPU backend, so the loss is checked on every machine.
    for dev in &devices() {
        common::record(dev);
        let mut model = mlp(dev);
        let mut opt = Adam::new(0.05);
        let before = dev.stats();
        let losses = train(dev, &mut model, &mut opt, 0..3);
        let after = dev.stats();
        // One realisation per step: one submit on a GPU, none on the CPU backend.
        assert_eq!(after.realizations - before.realizations, 3, "one realisation per step on {}", label(dev));
        let submits = if dev.is_cpu() { 0 } else { 3 };
        assert_eq!(after.submits - before.submits, submits, "one submit per step on {}", label(dev));
        assert_close(&format!("losses on {}", label(dev)), &losses, &want_losses, Tol { atol: 1e-4, rtol: 1e-4 });
        let got = params(&mut model);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("param {i} after 3 steps on {}", label(dev)), g, w, Tol { atol: 1e-4, rtol: 1e-3 });
        }
        let more = train(dev, &mut model, &mut opt, 3..40);
        let last = more[more.len() - 4..].iter().sum::<f64>() / 4.0;
        assert!(last < 0.5 * losses[0], "loss {} -> {last} on {}", losses[0], label(dev));
    }
}

/// One parameter `p`, loss `sum(p * c)` so the gradient is `c` every step.
fn run_opt(opt: &mut dyn Optimizer, steps: usize) -> Vec<f64> {
    let dev = Device::reference_exact();
    let mut model = Linear {
        name: String::new(),
        weight: Tensor::from_f64(&[1.0, -2.0], [1, 2], DType::F32, &dev).requires_grad(),
        bias: None,
    };
    let c = Tensor::from_f64(&[0.5, -3.0], [1, 2], DType::F32, &dev);
    for _ in 0..steps {
        let l = model.weight.mul(&c).sum_all();
        opt.step(&mut model, &l).unwrap();
    }
    model.weight.to_f64_vec_blocking().unwrap()
}

#[test]
fn optimisers_match_their_formulas() {
    let (p0, c) = ([1.0f64, -2.0], [0.5f64, -3.0]);
    // Scalars such as the learning rate travel as f32 kernel parameters.
    let close = |what: &str, got: &[f64], want: &[f64]| assert_close(what, got, want, Tol { atol: 1e-7, rtol: 1e-6 });
    // SGD with momentum 0.9 and weight decay 0.1, 3 steps.
    for nesterov in [false, true] {
        let mut want = p0.to_vec();
        let mut buf = [0.0f64; 2];
        for s in 0..3 {
            for i in 0..2 {
                let g = c[i] + 0.1 * want[i];
                buf[i] = if s == 0 { g } else { 0.9 * buf[i] + g };
                let d = if nesterov { g + 0.9 * buf[i] } else { buf[i] };
                want[i] -= 0.1 * d;
            }
        }
        let got = run_opt(&mut Sgd::new(0.1).with_momentum(0.9, nesterov).with_weight_decay(0.1), 3);
        close(&format!("sgd nesterov={nesterov}"), &got, &want);
    }
    // Adam and AdamW, 3 steps.
    for decoupled in [false, true] {
        let (lr, wd, b1, b2, eps) = (0.01, 0.1, 0.9f64, 0.999f64, 1e-8);
        let mut want = p0.to_vec();
        let (mut m, mut v) = ([0.0f64; 2], [0.0f64; 2]);
        for t in 1..=3 {
            for i in 0..2 {
                let g = if decoupled { c[i] } else { c[i] + wd * want[i] };
                m[i] = b1 * m[i] + (1.0 - b1) * g;
                v[i] = b2 * v[i] + (1.0 - b2) * g * g;
                let mh = m[i] / (1.0 - b1.powi(t));
                let vh = v[i] / (1.0 - b2.powi(t));
                let old = want[i];
                want[i] -= lr * mh / (vh.sqrt() + eps);
                if decoupled {
                    want[i] -= lr * wd * old;
                }
            }
        }
        let mut opt = if decoupled {
            Adam::adamw(lr, wd)
        } else {
            let mut a = Adam::new(lr);
            a.weight_decay = wd;
            a
        };
        close(&format!("adam decoupled={decoupled}"), &run_opt(&mut opt, 3), &want);
    }
}

#[test]
fn schedules_clipping_and_loss_scaling() {
    let _s = serial();
    let s = LrSchedule { base: 1.0, warmup: 4, kind: Schedule::Cosine { total: 14, min_lr: 0.0 } };
    assert_eq!(s.lr_at(0), 0.25);
    assert_eq!(s.lr_at(3), 1.0);
    assert!((s.lr_at(9) - 0.5).abs() < 1e-12, "half way through the cosine");
    assert!(s.lr_at(14).abs() < 1e-12);
    let st = LrSchedule { base: 1.0, warmup: 0, kind: Schedule::Step { every: 10, gamma: 0.5 } };
    assert_eq!((st.lr_at(9), st.lr_at(10), st.lr_at(25)), (1.0, 0.5, 0.25));

    let dev = Device::reference_exact();
    let x = Tensor::from_f64(&[3.0, 4.0], [2], DType::F32, &dev).requires_grad();
    let mut g = x.mul(&x).mul_scalar(0.5).sum_all().backward().unwrap(); // gradient (3, 4), norm 5
    let norm = optim::clip_grad_norm(&mut g, 1.0).unwrap();
    assert_eq!(norm.to_f64_vec_blocking().unwrap(), vec![5.0]);
    let clipped = g.get(&x).unwrap().to_f64_vec_blocking().unwrap();
    assert_close("clip_grad_norm", &clipped, &[0.6, 0.8], Tol { atol: 1e-6, rtol: 1e-6 });
    let mut g2 = x.mul(&x).sum_all().backward().unwrap(); // (6, 8)
    optim::clip_grad_value(&mut g2, 7.0);
    assert_eq!(g2.get(&x).unwrap().to_f64_vec_blocking().unwrap(), vec![6.0, 7.0]);

    // Inputs so large that the scaled gradients overflow f32: the step is skipped,
    // nothing changes, and the scale halves.
    for dev in std::iter::once(Device::reference()).chain(devices()) {
        common::record(&dev);
        let mut model = mlp(&dev);
        let mut opt = Adam::new(0.1);
        let before = params(&mut model);
        let mut scaler = GradScaler::new(1e4);
        let (xb, yb) = batch(&dev, 0);
        let r = scaled_step(&mut model, &mut opt, &mut scaler, &xb.mul_scalar(1e36), &yb).unwrap();
        assert!(!r.applied, "an overflowing step must be skipped on {}", label(&dev));
        assert_eq!((scaler.scale, scaler.skipped), (5e3, 1));
        assert_eq!(params(&mut model), before, "parameters unchanged by a skipped step on {}", label(&dev));
        let mut ok = GradScaler::new(1024.0);
        let r = scaled_step(&mut model, &mut opt, &mut ok, &xb, &yb).unwrap();
        assert!(r.applied);
        assert_ne!(params(&mut model), before);
    }
}

#[test]
fn module_state_names_and_modes() {
    let dev = Device::reference();
    let m = mlp(&dev);
    let names: Vec<String> = m.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
    assert_eq!(m.num_parameters(), 8 * 16 + 16 + 16 * 3 + 3);

    // BatchNorm: batch statistics in training (and running ones updated), running ones in eval.
    let mut bn = BatchNorm2d::new(2, &dev);
    let x = Tensor::from_slice(&data(2 * 2 * 3 * 3, 5, 0.0, 4.0), [2, 2, 3, 3], &dev);
    let y = bn.forward(&x);
    let per_channel = y.mean(&[0, 2, 3], false).to_vec_blocking::<f32>().unwrap();
    assert!(per_channel.iter().all(|v| v.abs() < 1e-5), "normalised in training: {per_channel:?}");
    let st = bn.state_dict();
    let rm = st.get("running_mean").unwrap().to_vec_blocking::<f32>().unwrap();
    let mean = x.mean(&[0, 2, 3], false).to_vec_blocking::<f32>().unwrap();
    assert_close(
        "running mean",
        &rm.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        &mean.iter().map(|&v| 0.1 * v as f64).collect::<Vec<_>>(),
        Tol { atol: 1e-6, rtol: 1e-5 },
    );
    bn.set_training(false);
    let ye = bn.forward(&x).to_vec_blocking::<f32>().unwrap();
    let y2 = bn.forward(&x).to_vec_blocking::<f32>().unwrap();
    assert_eq!(ye, y2, "eval mode is deterministic and does not update");

    // Dropout: seeded, scaled, identity in eval.
    let mut d = Dropout::new(0.5, 9);
    let ones = Tensor::ones([1000], DType::F32, &dev);
    let a = d.forward(&ones).to_vec_blocking::<f32>().unwrap();
    assert!(a.iter().all(|&v| v == 0.0 || v == 2.0));
    let kept = a.iter().filter(|&&v| v == 2.0).count();
    assert!((400..600).contains(&kept), "{kept} of 1000 kept");
    let b = d.forward(&ones).to_vec_blocking::<f32>().unwrap();
    assert_ne!(a, b, "each call draws a new mask");
    d.set_counter(0);
    assert_eq!(d.forward(&ones).to_vec_blocking::<f32>().unwrap(), a, "the counter is the RNG state");
    d.set_training(false);
    assert_eq!(d.forward(&ones).to_vec_blocking::<f32>().unwrap(), vec![1.0; 1000]);
}

fn device() -> Device {
    common::first_device()
}

#[test]
fn resume_from_a_checkpoint_is_bit_exact() {
    let _s = serial();
    let dev = device();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.safetensors");
    let mut a = mlp(&dev);
    let mut oa = Adam::adamw(0.02, 0.01);
    train(&dev, &mut a, &mut oa, 0..6);
    let straight = params(&mut a);

    let mut b = mlp(&dev);
    let mut ob = Adam::adamw(0.02, 0.01);
    train(&dev, &mut b, &mut ob, 0..3);
    let md = BTreeMap::from([("step".to_string(), "3".to_string())]);
    tessera::io::checkpoint::save(&path, &mut b, &mut ob, &md).unwrap();
    drop((b, ob));
    let mut c = Sequential::new()
        .add(Linear::new(8, 16, true, 77, &dev))
        .add(Activation::Relu)
        .add(Linear::new(16, 3, true, 78, &dev));
    let mut oc = Adam::adamw(0.5, 0.01);
    let meta = tessera::io::checkpoint::load(&path, &mut c, &mut oc, &dev).unwrap();
    assert_eq!(meta.get("step").map(String::as_str), Some("3"));
    assert_eq!(oc.steps(), 3);
    assert_eq!(oc.lr(), 0.02);
    train(&dev, &mut c, &mut oc, 3..6);
    let resumed = params(&mut c);
    for (i, (x, y)) in straight.iter().zip(&resumed).enumerate() {
        let bits = |v: &[f64]| v.iter().map(|f| (*f as f32).to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(x), bits(y), "tensor {i}: 6 steps vs 3 + save + load + 3");
    }
}

#[test]
fn a_corrupted_checkpoint_is_refused_and_nothing_changes() {
    let _s = serial();
    let dev = device();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.safetensors");
    let mut m = mlp(&dev);
    let mut o = Adam::new(0.01);
    train(&dev, &mut m, &mut o, 0..1);
    tessera::io::checkpoint::save(&path, &mut m, &mut o, &BTreeMap::new()).unwrap();
    let good = std::fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let mut fresh = mlp(&dev);
    let before = params(&mut fresh);
    // One flipped byte in the payload, in the header's metadata, and a truncation.
    let mut payload = good.clone();
    let last = payload.len() - 3;
    payload[last] ^= 0x01;
    let mut meta = good.clone();
    let pos = String::from_utf8_lossy(&good[8..8 + header_len]).find("tessera.optim.lr").unwrap() + 8 + 20;
    meta[pos] ^= 0x01;
    for (what, bytes) in [("payload", payload), ("metadata", meta), ("truncated", good[..good.len() / 2].to_vec())] {
        let p = dir.path().join(format!("bad-{what}.safetensors"));
        std::fs::write(&p, &bytes).unwrap();
        let mut o2 = Adam::new(0.01);
        let err = tessera::io::checkpoint::load(&p, &mut fresh, &mut o2, &dev).unwrap_err().to_string();
        assert!(err.contains("checkpoint") && err.contains("bad-"), "{what}: {err}");
        if what == "payload" {
            assert!(err.contains("SHA-256"), "{what}: {err}");
        }
        assert_eq!(params(&mut fresh), before, "{what}: the model is untouched");
    }
    // The good file still loads.
    let mut o3 = Adam::new(0.01);
    tessera::io::checkpoint::load(&path, &mut fresh, &mut o3, &dev).unwrap();
    assert_eq!(params(&mut fresh), params(&mut m));
}

#[test]
fn mixed_precision_trains_with_f32_master_weights() {
    let _s = serial();
    for dev in &devices() {
        common::record(dev);
        let mut model = mlp(dev);
        let mut opt = Adam::new(0.05);
        let mut scaler = GradScaler::new(1024.0);
        let mut losses = Vec::new();
        for k in 0..30 {
            let (x, y) = batch(dev, k % 4);
            // Mixed precision is a scope around the step, not a field of the layers.
            let _half = tessera::autocast(DType::F16);
            let r = scaled_step(&mut model, &mut opt, &mut scaler, &x, &y)
                .unwrap_or_else(|e| panic!("f16 step on {}: {e}", label(dev)));
            losses.push(r.loss.unwrap());
        }
        assert!(model.state_dict().iter().all(|(_, t)| t.dtype() == DType::F32), "master weights stay f32");
        let last = losses[26..].iter().sum::<f64>() / 4.0;
        assert!(last < 0.5 * losses[0], "f16 loss {} -> {last} on {}", losses[0], label(dev));
    }
}

#[test]
fn adam_updates_each_parameter_in_one_kernel() {
    // The weight and both moments of a parameter are one multi-output kernel: an Adam
    // step dispatches at most one kernel per parameter beyond those that compute the
    // loss and the gradients (three per parameter would be the weight's and each
    // moment's).
    let _s = serial();
    let gpu = common::private_gpu(Default::default()).expect("a GPU device");
    for dev in [gpu, Device::cpu()] {
        adam_kernels_on(&dev);
    }
}

fn adam_kernels_on(dev: &Device) {
    let dev = dev.clone();
    let submits = u64::from(!dev.is_cpu());
    let counted = |run: &mut dyn FnMut(&mut Sequential, Tensor)| -> Vec<u64> {
        let mut model = mlp(&dev);
        (0..3)
            .map(|k| {
                let (x, y) = batch(&dev, k);
                tessera::read_all_blocking(&[x.clone(), y.clone()]).unwrap();
                let before = dev.stats();
                let l = loss::cross_entropy(&model.forward(&x), &y);
                run(&mut model, l);
                let s = dev.stats();
                assert_eq!(s.submits - before.submits, submits, "one submit per step (none on the CPU backend)");
                s.kernels_dispatched - before.kernels_dispatched
            })
            .collect()
    };
    // The loss and every gradient, realised together.
    let gradients = counted(&mut |model, l| {
        let g = l.backward().unwrap();
        let mut targets = vec![l];
        targets.extend(model.state_dict().iter().map(|(_, p)| g.get(p).expect("a gradient per parameter").clone()));
        pollster::block_on(dev.realize(&targets)).unwrap();
    });
    let params = mlp(&dev).state_dict().len() as u64;
    for (name, mut opt) in [("Adam", Adam::new(1e-3)), ("AdamW", Adam::adamw(1e-3, 0.01))] {
        let steps = counted(&mut |model, l| {
            opt.step(model, &l).unwrap();
        });
        for (s, g) in steps.iter().zip(&gradients) {
            assert!(
                *s <= g + params,
                "{name}: {steps:?} kernels per step, gradients {gradients:?}, {params} parameters, on {dev}"
            );
        }
    }
}

/// SGD's update of each weight goes out in its gradient product's store (the profiler's
/// labels, from timestamp queries, name the epilogue): a weight's gradient is the product
/// itself, in the weight's layout.
#[test]
fn sgd_weight_updates_go_out_in_their_gradient_products() {
    let _s = serial();
    let dev = common::private_gpu(Default::default()).expect("a GPU device");
    let mut model = mlp(&dev);
    let mut sgd = Sgd::new(0.1);
    for k in 0..2 {
        let (x, y) = batch(&dev, k);
        tessera::profile::start();
        let l = loss::cross_entropy(&model.forward(&x), &y);
        sgd.step(&mut model, &l).unwrap();
        let labels: Vec<String> = tessera::profile::stop().into_iter().map(|e| e.label).collect();
        // (The first step also initialises the weights, whose draws join the epilogues.)
        let fused = labels.iter().filter(|l| l.starts_with("matmul") && l.contains("_epi(sub,")).count();
        assert!(
            k == 0 || fused == 2,
            "both weights' updates in their products' stores on {dev} (the profiler needs timestamp queries): {labels:?}"
        );
    }
}
