//! Magnitude pruning (per tensor, global, N:M), masks held through fine-tuning, the
//! gradual schedule, and sparse storage, on the CPU backend and the first GPU adapter.

mod common;

use tessera::compress::prune::{cubic_sparsity, prunable, Pruning};
use tessera::compress::sparse;
use tessera::nn::{loss, Layer, Module, Sequential};
use tessera::optim::{Adam, Optimizer, Sgd};
use tessera::{DType, Device, Tensor};

fn devices() -> Vec<Device> {
    vec![Device::cpu(), common::first_device()]
}

fn mlp(dev: &Device) -> Sequential {
    tessera::models::mnist::build("mlp", 3, dev).unwrap()
}

fn values(m: &mut Sequential) -> Vec<(String, Vec<f32>)> {
    m.slots().iter().map(|s| (s.name.clone(), s.tensor.cast(DType::F32).to_vec_blocking::<f32>().unwrap())).collect()
}

fn zeros(v: &[f32]) -> usize {
    v.iter().filter(|x| **x == 0.0).count()
}

#[test]
fn per_tensor_pruning_removes_exactly_the_smallest_magnitudes() {
    for dev in devices() {
        common::record(&dev);
        let mut m = mlp(&dev);
        let before = values(&mut m);
        let mut p = Pruning::default();
        p.l1_unstructured(&mut m, 0.5, &prunable).unwrap();
        for ((name, w), (_, w0)) in values(&mut m).iter().zip(&before) {
            if !name.ends_with("weight") {
                assert_eq!(w, w0, "{name}: not selected, unchanged");
                continue;
            }
            assert_eq!(zeros(w), w.len() / 2, "{name}");
            let cut = w0.iter().zip(w).filter(|(_, a)| **a == 0.0).map(|(b, _)| b.abs()).fold(0.0f32, f32::max);
            let kept = w.iter().filter(|a| **a != 0.0).map(|a| a.abs()).fold(f32::INFINITY, f32::min);
            assert!(cut <= kept, "{name}: pruned {cut} > kept {kept}");
        }
        // Pruning again by 50% prunes half of what is left.
        p.l1_unstructured(&mut m, 0.75, &prunable).unwrap();
        let (per, all) = p.sparsity().unwrap();
        assert!((all - 0.75).abs() < 1e-3 && per.values().all(|s| (s - 0.75).abs() < 1e-3), "{per:?}");
    }
}

#[test]
fn global_pruning_uses_one_threshold_across_layers() {
    let dev = Device::cpu();
    let mut m = mlp(&dev);
    let before = values(&mut m);
    let mut p = Pruning::default();
    p.global_unstructured(&mut m, 0.6, &prunable).unwrap();
    let (per, all) = p.sparsity().unwrap();
    assert!((all - 0.6).abs() < 1e-4, "{all}");
    let fractions: Vec<f64> = per.values().copied().collect();
    assert!((fractions[0] - fractions[1]).abs() > 0.01, "layers lose different fractions: {per:?}");
    let after = values(&mut m);
    let (mut cut, mut kept) = (0.0f32, f32::INFINITY);
    for ((name, w), (_, w0)) in after.iter().zip(&before) {
        if name.ends_with("weight") {
            for (a, b) in w.iter().zip(w0) {
                if *a == 0.0 {
                    cut = cut.max(b.abs());
                } else {
                    kept = kept.min(a.abs());
                }
            }
        }
    }
    assert!(cut <= kept, "one threshold: pruned {cut} > kept {kept}");
}

#[test]
fn masks_hold_through_fine_tuning_with_the_optimiser_state_masked() {
    let data = tessera::io::mnist::Mnist::load(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist.bin").as_path(),
    )
    .expect("data/mnist.bin (scripts/fetch_mnist.sh)");
    for dev in devices() {
        for adam in [false, true] {
            let mut m = mlp(&dev);
            let mut opt: Box<dyn Optimizer> =
                if adam { Box::new(Adam::new(1e-3)) } else { Box::new(Sgd::new(0.05).with_momentum(0.9, false)) };
            let mut p = Pruning::default();
            p.l1_unstructured(&mut m, 0.7, &prunable).unwrap();
            let pruned = values(&mut m);
            for k in 0..5 {
                let idx: Vec<usize> = (k * 32..k * 32 + 32).collect();
                let x =
                    Tensor::from_slice(&tessera::models::mnist::standardize(&data.images_f32(&idx)), [32, 784], &dev);
                let y = Tensor::from_slice(&data.labels_i32(&idx), [32], &dev);
                let l = loss::cross_entropy(&m.forward(&x), &y);
                opt.step(&mut m, &l).unwrap();
                p.after_step(&mut m, opt.as_mut()).unwrap();
            }
            let tuned = values(&mut m);
            for ((name, w), (_, w0)) in tuned.iter().zip(&pruned) {
                if name.ends_with("weight") {
                    for (a, b) in w.iter().zip(w0) {
                        assert!(*b != 0.0 || *a == 0.0, "{name}: a pruned weight came back ({a})");
                    }
                    assert!(w.iter().zip(w0).any(|(a, b)| a != b), "{name}: fine-tuning changed nothing");
                }
            }
            for (name, t) in opt.state() {
                let param = name.rsplit_once('.').unwrap().0;
                if let Some((_, w0)) = pruned.iter().find(|(n, _)| n == param && n.ends_with("weight")) {
                    let s = t.to_vec_blocking::<f32>().unwrap();
                    for (x, b) in s.iter().zip(w0) {
                        assert!(*b != 0.0 || *x == 0.0, "{name}: optimiser state of a pruned weight is {x}");
                    }
                }
            }
            p.remove(&mut m).unwrap();
            assert!(p.masks.is_empty());
            assert_eq!(values(&mut m), tuned, "remove bakes the masks in");
        }
    }
}

#[test]
fn two_four_masks_keep_the_two_largest_of_every_four() {
    let dev = Device::cpu();
    let mut m = mlp(&dev);
    let before = values(&mut m);
    let mut p = Pruning::default();
    p.n_m(&mut m, 2, 4, &prunable).unwrap();
    for ((name, w), (_, w0)) in values(&mut m).iter().zip(&before) {
        if !name.ends_with("weight") {
            continue;
        }
        for (g, (a, b)) in w.chunks(4).zip(w0.chunks(4)).enumerate() {
            assert_eq!(zeros(a), 2, "{name} group {g}: {a:?}");
            let cut = b.iter().zip(a).filter(|(_, x)| **x == 0.0).map(|(y, _)| y.abs()).fold(0.0f32, f32::max);
            let kept = a.iter().filter(|x| **x != 0.0).map(|x| x.abs()).fold(f32::INFINITY, f32::min);
            assert!(cut <= kept, "{name} group {g}");
        }
    }
    assert!(p.n_m(&mut m, 3, 2, &prunable).is_err());
    let mut lin = Sequential::new().add(tessera::nn::Linear::new(6, 2, true, 1, &dev));
    let e = Pruning::default().n_m(&mut lin, 2, 4, &prunable).unwrap_err().to_string();
    assert!(e.contains("not a multiple of 4"), "{e}");
}

#[test]
fn the_cubic_schedule_rises_fast_then_levels() {
    assert_eq!(cubic_sparsity(0.0, 0.9, 100, 1000, 50), 0.0);
    assert_eq!(cubic_sparsity(0.0, 0.9, 100, 1000, 100), 0.0);
    assert!((cubic_sparsity(0.0, 0.9, 100, 1000, 600) - (0.9 - 0.9 / 8.0)).abs() < 1e-12);
    assert!((cubic_sparsity(0.0, 0.9, 100, 1000, 1100) - 0.9).abs() < 1e-12);
    assert!((cubic_sparsity(0.0, 0.9, 100, 1000, 5000) - 0.9).abs() < 1e-12);
    let s: Vec<f64> = (0..=10).map(|k| cubic_sparsity(0.1, 0.8, 0, 10, k)).collect();
    assert!(s.windows(2).all(|w| w[1] >= w[0]) && s[1] - s[0] > s[10] - s[9], "{s:?}");
}

#[test]
fn sparse_storage_round_trips_exactly_and_is_small() {
    let dev = Device::cpu();
    let mut m = mlp(&dev);
    let mut p = Pruning::default();
    p.l1_unstructured(&mut m, 0.9, &prunable).unwrap();
    // A negative zero survives as itself.
    {
        let mut slots = m.slots();
        let b = slots.iter_mut().find(|s| s.name.ends_with("bias")).unwrap();
        let mut v = b.tensor.to_vec_blocking::<f32>().unwrap();
        v[0] = -0.0;
        *b.tensor = Tensor::from_slice(&v, b.tensor.dims().to_vec(), &dev).requires_grad();
    }
    let dir = std::env::temp_dir().join(format!("tessera-sparse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.sparse.safetensors");
    let r = sparse::save(&path, &mut m).unwrap();
    assert_eq!(r.sparse_tensors, 2, "{r:?}");
    assert!(r.file_bytes * 4 <= r.dense_bytes, "90% sparse: {} bytes of {} dense", r.file_bytes, r.dense_bytes);
    let mut fresh = tessera::models::mnist::build("mlp", 77, &dev).unwrap();
    sparse::load(&path, &mut fresh, &dev).unwrap();
    let (a, b) = (values(&mut m), values(&mut fresh));
    for ((n, x), (_, y)) in a.iter().zip(&b) {
        let xb: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
        let yb: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
        assert_eq!(xb, yb, "{n}: not bit-exact");
    }
    // A truncated or inconsistent file is an error, not a panic.
    let bytes = std::fs::read(&path).unwrap();
    for cut in [10, bytes.len() / 2, bytes.len() - 3] {
        assert!(sparse::from_bytes(&bytes[..cut], &dev).is_err(), "cut at {cut}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_amounts_and_empty_selections_are_errors() {
    let dev = Device::cpu();
    let mut m = mlp(&dev);
    let mut p = Pruning::default();
    assert!(p.l1_unstructured(&mut m, 1.5, &prunable).unwrap_err().to_string().contains("[0, 1]"));
    assert!(p.global_unstructured(&mut m, -0.1, &prunable).is_err());
    let none = |_: &str, _: &Tensor| false;
    assert!(p.l1_unstructured(&mut m, 0.5, &none).unwrap_err().to_string().contains("no parameter"));
}

#[test]
fn distillation_matches_its_formula_and_takes_one_submit_per_step() {
    use tessera::compress::distill::{distill_loss, distill_step, DistillOptions};
    // A GPU device of its own: its submit counter sees only this test.
    for dev in [Some(Device::cpu()), common::private_gpu(Default::default())].into_iter().flatten() {
        common::record(&dev);
        // The loss against a hand computation in f64.
        let zs = [[1.0f64, -0.5, 0.25], [0.0, 2.0, -1.0]];
        let zt = [[0.5f64, 0.5, -2.0], [1.5, 0.0, 0.0]];
        let y = [2i32, 1];
        let o = DistillOptions { temperature: 3.0, alpha: 0.6 };
        let lsm = |z: &[f64; 3], t: f64| {
            let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = z.iter().map(|v| ((v - m) / t).exp()).sum();
            z.map(|v| (v - m) / t - s.ln())
        };
        let mut want = 0.0;
        for i in 0..2 {
            let (ls, lt) = (lsm(&zs[i], 3.0), lsm(&zt[i], 3.0));
            let kl: f64 = (0..3).map(|j| lt[j].exp() * (lt[j] - ls[j])).sum();
            let ce = -lsm(&zs[i], 1.0)[y[i] as usize];
            want += (0.6 * 9.0 * kl + 0.4 * ce) / 2.0;
        }
        let flat = |z: [[f64; 3]; 2]| z.iter().flatten().map(|&v| v as f32).collect::<Vec<f32>>();
        let s = Tensor::from_slice(&flat(zs), [2, 3], &dev);
        let t = Tensor::from_slice(&flat(zt), [2, 3], &dev);
        let got = distill_loss(&s, &t, &Tensor::from_slice(&y, [2], &dev), o).item_blocking::<f32>().unwrap() as f64;
        assert!((got - want).abs() < 1e-5, "{got} vs {want}");

        // A step: the teacher gets no gradient and does not change; one submit.
        let teacher = tessera::models::mnist::build("mlp", 5, &dev).unwrap();
        let mut student = Sequential::new()
            .add(tessera::nn::Flatten)
            .add(tessera::nn::Linear::new(784, 32, true, 9, &dev))
            .add(tessera::nn::Activation::Relu)
            .add(tessera::nn::Linear::new(32, 10, true, 10, &dev));
        let mut opt = Adam::new(1e-3);
        let x = tessera::Tensor::randn([16, 784], 3, &dev);
        let y = Tensor::from_slice(&[3i32; 16], [16], &dev);
        let t0: Vec<f32> = teacher.layers[1].forward(&x.clone()).to_vec_blocking().unwrap_or_default();
        distill_step(&teacher, &mut student, &mut opt, &x, &y, DistillOptions::default()).unwrap();
        let before = dev.stats();
        let l = distill_step(&teacher, &mut student, &mut opt, &x, &y, DistillOptions::default()).unwrap();
        let after = dev.stats();
        assert!(l.is_finite());
        if !dev.is_cpu() {
            assert_eq!(after.submits - before.submits, 1, "one submit per distillation step");
        }
        let t1: Vec<f32> = teacher.layers[1].forward(&x).to_vec_blocking().unwrap_or_default();
        assert_eq!(t0, t1, "the teacher is unchanged");
    }
}

/// Zero the output channels `dead` of every Linear/Conv2d except the last, so removing
/// them cannot change what the model computes.
fn kill_channels(m: &mut Sequential, dead: &dyn Fn(usize) -> bool) {
    let mut slots = m.slots();
    let n = slots.len();
    // Weights and biases come in (weight, bias) pairs; the last pair is the output layer.
    for s in slots.iter_mut().take(n - 2) {
        let dims = s.tensor.dims().to_vec();
        let per: usize = dims[1..].iter().product();
        let mut v = s.tensor.to_vec_blocking::<f32>().unwrap();
        for (i, x) in v.iter_mut().enumerate() {
            if dead(i / per.max(1)) {
                *x = 0.0;
            }
        }
        *s.tensor = Tensor::from_slice(&v, dims, s.tensor.device()).requires_grad();
    }
}

#[test]
fn channel_pruning_removes_dead_channels_without_changing_the_outputs() {
    use tessera::compress::prune::{prune_channels, ChannelNorm};
    for dev in devices() {
        common::record(&dev);
        for kind in ["mlp", "cnn"] {
            let mut m = tessera::models::mnist::build(kind, 4, &dev).unwrap();
            kill_channels(&mut m, &|c| c % 2 == 1);
            let x = Tensor::randn(tessera::models::mnist::input_shape(kind, 5), 8, &dev);
            let want = m.forward(&x).to_vec_blocking::<f32>().unwrap();
            let before = m.num_parameters();
            let r = prune_channels(&mut m, 0.5, ChannelNorm::L1).unwrap();
            let got = m.forward(&x).to_vec_blocking::<f32>().unwrap();
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{kind}: {a} vs {b}");
            }
            assert_eq!(r.params_before, before);
            let expect = if kind == "cnn" { (52_138, 13_242) } else { (203_530, 101_770) };
            assert_eq!((r.params_before, r.params_after), expect, "{kind}: {r:?}");
            assert!(r.layers.iter().all(|&(_, o, k)| k * 2 == o), "{r:?}");
            // Still trains: parameters require gradients.
            let l = loss::cross_entropy(&m.forward(&x), &Tensor::from_slice(&[1i32; 5], [5], &dev));
            Adam::new(1e-3).step(&mut m, &l).unwrap();
        }
    }
}

#[test]
fn channel_pruning_ranks_by_the_chosen_norm_and_carries_batch_norm() {
    use tessera::compress::prune::{prune_channels, ChannelNorm};
    use tessera::nn::conv::{BatchNorm2d, Conv2d};
    use tessera::nn::Linear;
    let dev = Device::cpu();
    // Row 0 = [3, 0, 0, 0] (L1 3, L2 3); row 1 = [1, 1, 1, 1] (L1 4, L2 2).
    let make = || {
        let mut a = Linear::new(4, 2, false, 1, &dev);
        a.weight = Tensor::from_slice(&[3.0f32, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0], [2, 4], &dev).requires_grad();
        let mut b = Linear::new(2, 1, false, 2, &dev);
        b.weight = Tensor::from_slice(&[10.0f32, 20.0], [1, 2], &dev).requires_grad();
        Sequential::new().add(a).add(tessera::nn::Activation::Relu).add(b)
    };
    let kept = |m: &mut Sequential| values(m)[1].1.clone();
    let mut l1 = make();
    prune_channels(&mut l1, 0.5, ChannelNorm::L1).unwrap();
    assert_eq!(kept(&mut l1), vec![20.0], "L1 keeps row 1");
    let mut l2 = make();
    prune_channels(&mut l2, 0.5, ChannelNorm::L2).unwrap();
    assert_eq!(kept(&mut l2), vec![10.0], "L2 keeps row 0");
    // Conv -> BatchNorm -> Conv: the norm's entries follow the kept channels.
    let mut m = Sequential::new()
        .add(Conv2d::new(1, 4, 3, tessera::ops::nn::Conv2dOptions::new(1, 1), 3, &dev))
        .add(BatchNorm2d::new(4, &dev))
        .add(tessera::nn::Activation::Relu)
        .add(Conv2d::new(4, 2, 3, tessera::ops::nn::Conv2dOptions::new(1, 1), 4, &dev));
    {
        let mut slots = m.slots();
        let bn_w = slots.iter_mut().find(|s| s.name == "1.weight").unwrap();
        *bn_w.tensor = Tensor::from_slice(&[0.1f32, 0.2, 0.3, 0.4], [4], &dev).requires_grad();
    }
    kill_channels(&mut m, &|c| c == 0 || c == 2);
    let r = prune_channels(&mut m, 0.5, ChannelNorm::L2).unwrap();
    assert_eq!(r.layers, vec![(0, 4, 2)]);
    let v = values(&mut m);
    let bn = v.iter().find(|(n, _)| n == "1.weight").unwrap();
    assert_eq!(bn.1, vec![0.2, 0.4], "the BatchNorm keeps channels 1 and 3");
    let mean = v.iter().find(|(n, _)| n == "1.running_mean").unwrap();
    assert_eq!(mean.1.len(), 2);
    let out = m.forward(&Tensor::randn([1, 1, 6, 6], 1, &dev));
    assert_eq!(out.dims(), &[1, 2, 6, 6]);
    assert!(prune_channels(&mut m, 2.0, ChannelNorm::L1).is_err());
}

#[test]
fn block_quantised_linears_pad_inputs_that_are_not_whole_blocks() {
    use tessera::nn::Linear;
    for dev in devices() {
        common::record(&dev);
        let m = mlp(&dev);
        let x = Tensor::randn([3, 784], 2, &dev);
        let want = m.forward(&x).to_vec_blocking::<f32>().unwrap();
        for dt in [DType::Q8_0, DType::Q4_0] {
            let mut q = mlp(&dev);
            let ls: Vec<&mut Linear> =
                q.layers.iter_mut().filter_map(|l| l.as_any_mut().and_then(|a| a.downcast_mut::<Linear>())).collect();
            pollster::block_on(tessera::quant::quantize_linears(ls, dt)).unwrap();
            assert_eq!(q.slots()[0].tensor.dims(), &[256, 800], "784 inputs padded to 25 blocks");
            let got = q.forward(&x).to_vec_blocking::<f32>().unwrap();
            let dot: f64 = got.iter().zip(&want).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
            let na: f64 = got.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
            let nb: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt();
            let floor = if dt == DType::Q8_0 { 0.9999 } else { 0.99 };
            assert!(dot / (na * nb) > floor, "{dt}: cosine {} to f32", dot / (na * nb));
        }
    }
}

/// `[O, C/g, k, k]` weights as the `[O, Kp]` matrix a quantised convolution reads.
fn weight_matrix(w: &[f32], o: usize, ck: usize) -> (Vec<f32>, usize) {
    let kp = ck.next_multiple_of(32);
    let mut m = vec![0f32; o * kp];
    for (d, s) in m.chunks_exact_mut(kp).zip(w.chunks_exact(ck)) {
        d[..ck].copy_from_slice(s);
    }
    (m, kp)
}

#[test]
fn quantised_convolutions_match_the_reference_and_the_dequantised_float_convolution() {
    use tessera::ops::nn::Conv2dOptions;
    // (n, c, hw, o, k, stride, padding, groups): per-image products (>= 256 output
    // pixels), batch products, window lengths that are not whole blocks, groups.
    let cases =
        [(2, 3, 20, 5, 3, 1, 1, 1), (3, 5, 9, 7, 5, 2, 2, 1), (2, 4, 11, 6, 3, 1, 0, 2), (1, 1, 28, 8, 3, 1, 1, 1)];
    for (i, &(n, c, hw, o, k, stride, padding, groups)) in cases.iter().enumerate() {
        let ck = c / groups * k * k;
        let w = common::data(o * ck, 40 + i as u64, -0.5, 0.5);
        let x = common::data(n * c * hw * hw, 50 + i as u64, -1.0, 1.0);
        let b = common::data(o, 60 + i as u64, -0.2, 0.2);
        let opts = Conv2dOptions { groups, ..Conv2dOptions::new(stride, padding) };
        for dt in [DType::Q8_0, DType::Q4_0] {
            let (m, kp) = weight_matrix(&w, o, ck);
            let blocks = tessera::quant::quantize(dt, &m);
            let build = |dev: &Device| {
                let xt = Tensor::from_slice(&x, [n, c, hw, hw], dev);
                let wq = Tensor::from_quantized(dt, [o, kp], &blocks, dev);
                let bt = Tensor::from_slice(&b, [o], dev);
                vec![xt.conv2d_quantized(&wq, (k, k), Some(&bt), opts)]
            };
            let tol = common::Tol { atol: 1e-4, rtol: 1e-4 };
            common::check_with(&format!("conv2d_quantized case {i} {dt}"), Some(tol), build);
            // The same as a float convolution with the dequantised weights.
            let deq = tessera::quant::dequantize(dt, &blocks);
            let wf: Vec<f32> = deq.chunks_exact(kp).flat_map(|r| r[..ck].to_vec()).collect();
            let r = Device::reference();
            let xt = Tensor::from_slice(&x, [n, c, hw, hw], &r);
            let bt = Tensor::from_slice(&b, [o], &r);
            let want = xt.conv2d(&Tensor::from_slice(&wf, [o, c / groups, k, k], &r), Some(&bt), opts);
            let got = &build(&r)[0];
            let (g, wv) = (got.to_f64_vec_blocking().unwrap(), want.to_f64_vec_blocking().unwrap());
            common::assert_close(&format!("case {i} {dt} against float"), &g, &wv, tol);
        }
    }
}

#[test]
fn bad_quantised_convolutions_are_errors() {
    use tessera::ops::nn::Conv2dOptions;
    let dev = Device::cpu();
    let x = Tensor::randn([1, 3, 8, 8], 1, &dev);
    let w = Tensor::from_quantized(DType::Q8_0, [4, 64], &tessera::quant::quantize(DType::Q8_0, &[0.5; 256]), &dev);
    // 3 channels x 3x3 = 27 values pad to 32 columns, not 64.
    let e = x.conv2d_quantized(&w, (3, 3), None, Conv2dOptions::new(1, 1)).to_vec_blocking::<f32>().unwrap_err();
    assert!(e.to_string().contains("27 weight columns"), "{e}");
    let xi = Tensor::zeros([1, 3, 8, 8], DType::I32, &dev);
    let w32 = Tensor::from_quantized(DType::Q8_0, [4, 32], &tessera::quant::quantize(DType::Q8_0, &[0.5; 128]), &dev);
    let e = xi.conv2d_quantized(&w32, (3, 3), None, Conv2dOptions::new(1, 1)).to_vec_blocking::<f32>().unwrap_err();
    assert!(e.to_string().contains("f32 or f16"), "{e}");
    // A float weight of the wrong rank through quantize_conv.
    let mut conv = tessera::nn::Conv2d::new(3, 4, 3, Conv2dOptions::new(1, 1), 1, &dev);
    let e = pollster::block_on(tessera::quant::quantize_conv(&mut conv, DType::F16, None)).unwrap_err();
    assert!(e.to_string().contains("cannot be stored in f16"), "{e}");
}

fn cnn(dev: &Device) -> Sequential {
    tessera::models::mnist::build("cnn", 3, dev).unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64) * (*y as f64)).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn the_cnn_quantises_convolutions_and_linears_and_gptq_beats_rounding() {
    for dev in devices() {
        common::record(&dev);
        let x = Tensor::randn([64, 1, 28, 28], 7, &dev);
        let mut f = cnn(&dev);
        f.set_training(false);
        let want = f.forward(&x).to_vec_blocking::<f32>().unwrap();
        let err = |got: &[f32]| got.iter().zip(&want).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>();
        let mut out = Vec::new();
        for (dt, calib) in [(DType::Q8_0, None), (DType::Q4_0, None), (DType::Q4_0, Some(&x))] {
            let mut q = cnn(&dev);
            q.set_training(false);
            let changed = pollster::block_on(tessera::quant::quantize_model(&mut q, dt, calib)).unwrap();
            assert_eq!(changed, 4, "two convolutions and two Linear layers");
            let dims: Vec<Vec<usize>> = q.slots().iter().map(|s| s.tensor.dims().to_vec()).collect();
            assert_eq!(dims[0], [8, 32], "conv1: 1x3x3 = 9 values in one block");
            assert_eq!(dims[2], [16, 96], "conv2: 8x3x3 = 72 values in three blocks");
            let got = q.forward(&x).to_vec_blocking::<f32>().unwrap();
            let floor = if dt == DType::Q8_0 { 0.9999 } else { 0.99 };
            assert!(
                cosine(&got, &want) > floor,
                "{dt}: cosine {} to f32 on {}",
                cosine(&got, &want),
                common::label(&dev)
            );
            out.push(err(&got));
        }
        assert!(out[2] < out[1], "GPTQ {} against round to nearest {} on {}", out[2], out[1], common::label(&dev));
    }
}

#[test]
fn saved_variants_load_from_their_files_alone() {
    use tessera::compress::prune::{prune_channels, ChannelNorm};
    use tessera::models::mnist::from_state_dict;
    let dev = Device::cpu();
    let x = Tensor::randn([5, 1, 28, 28], 9, &dev);
    let mut slim = cnn(&dev);
    prune_channels(&mut slim, 0.5, ChannelNorm::L1).unwrap();
    let mut small = mlp(&dev);
    let mut q = cnn(&dev);
    pollster::block_on(tessera::quant::quantize_model(&mut q, DType::Q4_0, None)).unwrap();
    pollster::block_on(tessera::quant::quantize_model(&mut small, DType::Q8_0, None)).unwrap();
    for (kind, m) in [("cnn", &mut slim), ("cnn", &mut q), ("mlp", &mut small)] {
        m.set_training(false);
        let want = m.forward(&x).to_vec_blocking::<f32>().unwrap();
        let dict: Vec<(String, Tensor)> = m.slots().iter().map(|s| (s.name.clone(), s.tensor.clone())).collect();
        let bytes = pollster::block_on(tessera::io::safetensors::to_bytes(&dict, &Default::default())).unwrap();
        let file = tessera::io::safetensors::load_bytes(&bytes, &dev).unwrap();
        let mut back = from_state_dict(kind, &file.tensors.into_iter().collect()).unwrap();
        back.set_training(false);
        assert_eq!(back.forward(&x).to_vec_blocking::<f32>().unwrap(), want, "{kind}");
    }
    // Files that fit no architecture are errors that say why.
    let mut sd = cnn(&dev).state_dict();
    sd.insert("3.weight", Tensor::zeros([16, 5, 3, 3], DType::F32, &dev));
    let e = from_state_dict("cnn", &sd).err().unwrap();
    assert!(e.to_string().contains("not a 3x3 convolution of 8 channels"), "{e}");
    let mut sd = mlp(&dev).state_dict();
    sd.insert("7.weight", Tensor::zeros([1], DType::F32, &dev));
    assert!(from_state_dict("mlp", &sd).err().unwrap().to_string().contains("unexpected tensor 7.weight"));
    assert!(from_state_dict("rnn", &sd).is_err());
}
