//! tessera::explain on the CPU backend and every GPU adapter: saliency against finite
//! differences in f64, SmoothGrad against its definition, integrated gradients'
//! completeness, Grad-CAM against a hand computation, and bad arguments.

mod common;

use tessera::explain::{completeness_gap, grad_cam, integrated_gradients, saliency, smoothgrad};
use tessera::nn::{Activation, Conv2d, Flatten, Layer, Linear, Module, Sequential};
use tessera::ops::nn::Conv2dOptions;
use tessera::{Device, Tensor};

fn smooth(dev: &Device) -> Sequential {
    Sequential::new().add(Linear::new(5, 4, true, 11, dev)).add(Activation::Tanh).add(Linear::new(4, 3, true, 12, dev))
}

/// conv(1 -> 2, 3x3, pad 1), relu, conv(2 -> 3, 3x3), relu, flatten, linear(48 -> 4),
/// over 6x6 inputs.
fn two_layer_cnn(dev: &Device) -> Sequential {
    let mut m = Sequential::new()
        .add(Conv2d::new(1, 2, 3, Conv2dOptions::new(1, 1), 21, dev))
        .add(Activation::Relu)
        .add(Conv2d::new(2, 3, 3, Conv2dOptions::new(1, 0), 22, dev))
        .add(Activation::Relu)
        .add(Flatten)
        .add(Linear::new(48, 4, true, 23, dev));
    m.set_training(false);
    m
}

fn read(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec_blocking().unwrap()
}

#[test]
fn saliency_equals_finite_differences() {
    let x = common::data(2 * 5, 3, -1.0, 1.0);
    let targets = [2, 0];
    // Central differences of the target scores on the unrounded f64 reference.
    let exact = Device::reference_exact();
    let m = smooth(&exact);
    let score = |v: &[f32]| -> Vec<f64> {
        let y = read(&m.forward(&Tensor::from_slice(v, [2, 5], &exact)));
        vec![y[targets[0]], y[3 + targets[1]]]
    };
    let h = 1e-3f32;
    let mut fd = vec![0f64; 10];
    for (i, g) in fd.iter_mut().enumerate() {
        let (mut up, mut down) = (x.clone(), x.clone());
        up[i] += h;
        down[i] -= h;
        let row = i / 5;
        *g = (score(&up)[row] - score(&down)[row]) / (up[i] as f64 - down[i] as f64);
    }
    for dev in common::devices() {
        let m = smooth(&dev);
        let g = read(&saliency(&m, &Tensor::from_slice(&x, [2, 5], &dev), &targets).unwrap());
        common::assert_close(
            &format!("saliency on {}", common::label(&dev)),
            &g,
            &fd,
            common::Tol { atol: 2e-4, rtol: 1e-3 },
        );
        common::record(&dev);
    }
}

#[test]
fn smoothgrad_averages_the_saliency_of_noisy_copies() {
    for dev in common::devices() {
        let m = smooth(&dev);
        let x = Tensor::from_slice(&common::data(3 * 5, 4, -1.0, 1.0), [3, 5], &dev);
        let t = [0, 1, 2];
        // No noise: the saliency itself.
        let plain = read(&saliency(&m, &x, &t).unwrap());
        let zero = read(&smoothgrad(&m, &x, &t, 4, 0.0, 1).unwrap());
        common::assert_close("smoothgrad sigma 0", &zero, &plain, common::Tol { atol: 1e-6, rtol: 1e-5 });
        // With noise: the mean of the saliencies at the same noisy points, one by one.
        let sg = read(&smoothgrad(&m, &x, &t, 5, 0.3, 9).unwrap());
        let mut want = vec![0f64; 15];
        for k in 0..5u64 {
            let xk = x.add(&Tensor::randn([3, 5], 9 + k, &dev).mul_scalar(0.3));
            for (w, g) in want.iter_mut().zip(read(&saliency(&m, &xk, &t).unwrap())) {
                *w += g / 5.0;
            }
        }
        common::assert_close(
            &format!("smoothgrad on {}", common::label(&dev)),
            &sg,
            &want,
            common::Tol { atol: 1e-5, rtol: 1e-4 },
        );
        common::record(&dev);
    }
}

#[test]
fn integrated_gradients_are_complete() {
    for dev in common::devices() {
        for (kind, shape) in [("mlp", vec![2, 784]), ("cnn", vec![2, 1, 28, 28])] {
            let mut m = tessera::models::mnist::build(kind, 5, &dev).unwrap();
            m.set_training(false);
            let n: usize = shape.iter().product();
            let x = Tensor::from_slice(&common::data(n, 6, -0.5, 2.5), shape.clone(), &dev);
            let base = Tensor::zeros(shape.clone(), tessera::DType::F32, &dev);
            let t = [3, 7];
            let ig = integrated_gradients(&m, &x, &base, &t, 128).unwrap();
            assert_eq!(ig.dims(), x.dims());
            let gaps = pollster::block_on(completeness_gap(&m, &x, &base, &t, &ig)).unwrap();
            for (row, (sum, diff)) in gaps.iter().enumerate() {
                assert!(
                    (sum - diff).abs() <= 0.01 * diff.abs(),
                    "{kind} row {row} on {}: attributions sum to {sum}, f(x) - f(baseline) = {diff}",
                    common::label(&dev)
                );
            }
            common::record(&dev);
        }
    }
}

/// 3x3 cross-correlation of `[C, H, W]` with `[O, C, 3, 3]` weights, zero padding `p`.
fn conv_host(x: &[f64], c: usize, hw: usize, w: &[f64], b: &[f64], o: usize, p: usize) -> (Vec<f64>, usize) {
    let out = hw + 2 * p - 2;
    let mut y = vec![0f64; o * out * out];
    for oc in 0..o {
        for i in 0..out {
            for j in 0..out {
                let mut s = b[oc];
                for ic in 0..c {
                    for ki in 0..3 {
                        for kj in 0..3 {
                            let (r, q) = ((i + ki) as isize - p as isize, (j + kj) as isize - p as isize);
                            if r < 0 || q < 0 || r >= hw as isize || q >= hw as isize {
                                continue;
                            }
                            s += w[((oc * c + ic) * 3 + ki) * 3 + kj] * x[(ic * hw + r as usize) * hw + q as usize];
                        }
                    }
                }
                y[(oc * out + i) * out + j] = s;
            }
        }
    }
    (y, out)
}

#[test]
fn grad_cam_equals_a_hand_computation() {
    let xs = common::data(2 * 36, 8, -1.0, 1.0);
    let targets = [1, 3];
    for dev in common::devices() {
        let mut m = two_layer_cnn(&dev);
        let p: Vec<Vec<f64>> = m.slots().iter().map(|s| read(s.tensor)).collect();
        let (w1, b1, w2, b2, wl) = (&p[0], &p[1], &p[2], &p[3], &p[4]);
        let mut want = Vec::new();
        for (n, &t) in targets.iter().enumerate() {
            let x = &xs[n * 36..(n + 1) * 36].iter().map(|&v| v as f64).collect::<Vec<_>>();
            let (h1, s1) = conv_host(x, 1, 6, w1, b1, 2, 1);
            let h1: Vec<f64> = h1.into_iter().map(|v| v.max(0.0)).collect();
            let (a, s2) = conv_host(&h1, 2, s1, w2, b2, 3, 0);
            let a: Vec<f64> = a.into_iter().map(|v| v.max(0.0)).collect();
            // The score is linear in A: its gradient is the Linear row of the target.
            let hw = s2 * s2;
            let grad = &wl[t * 48..(t + 1) * 48];
            let alpha: Vec<f64> = (0..3).map(|c| grad[c * hw..(c + 1) * hw].iter().sum::<f64>() / hw as f64).collect();
            for k in 0..hw {
                want.push((0..3).map(|c| alpha[c] * a[c * hw + k]).sum::<f64>().max(0.0));
            }
        }
        let cam = grad_cam(&m, 3, &Tensor::from_slice(&xs, [2, 1, 6, 6], &dev), &targets).unwrap();
        assert_eq!(cam.dims(), &[2, 4, 4]);
        assert!(want.iter().any(|&v| v > 0.0), "the hand computation should not be all zero");
        common::assert_close(
            &format!("grad_cam on {}", common::label(&dev)),
            &read(&cam),
            &want,
            common::Tol { atol: 1e-5, rtol: 1e-4 },
        );
        common::record(&dev);
    }
}

#[test]
fn bad_arguments_are_errors() {
    let dev = Device::cpu();
    let m = two_layer_cnn(&dev);
    let x = Tensor::randn([2, 1, 6, 6], 1, &dev);
    let e = saliency(&m, &x, &[1]).unwrap_err().to_string();
    assert!(e.contains("1 targets for a batch of 2"), "{e}");
    let e = saliency(&m, &x, &[1, 4]).unwrap_err().to_string();
    assert!(e.contains("target class 4 of row 1: the model has 4 outputs"), "{e}");
    let e = grad_cam(&m, 9, &x, &[0, 0]).unwrap_err().to_string();
    assert!(e.contains("layer 9 of a model with 6 layers"), "{e}");
    let e = grad_cam(&m, 4, &x, &[0, 0]).unwrap_err().to_string();
    assert!(e.contains("must be [N, C, H, W]"), "{e}");
    let e = integrated_gradients(&m, &x, &Tensor::zeros([1, 1, 6, 6], tessera::DType::F32, &dev), &[0, 0], 8);
    assert!(e.unwrap_err().to_string().contains("baseline must have the input's shape"));
    let flat = Tensor::randn([2, 5], 1, &dev);
    let e = saliency(&m, &flat, &[0, 0]).unwrap_err().to_string();
    assert!(e.contains("conv2d"), "a bad input reports the op that refused it: {e}");
}
