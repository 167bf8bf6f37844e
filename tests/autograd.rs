//! Gradients: every rule of the table checked against central finite differences in f64
//! on the exact reference, and GPU gradients compared with reference gradients on odd
//! shapes, on every adapter and fallback path.

mod common;

use common::{assert_close, data, devices, label, Tol};
use tessera::{DType, Device, Tensor};

/// One input of a gradient check: shape and value range.
struct In(&'static [usize], f64, f64);

type Build = dyn Fn(&[Tensor]) -> Tensor;

/// `sum(build(inputs) * w)` with a fixed random weight, so every output element matters.
fn loss_of(build: &Build, xs: &[Tensor]) -> Tensor {
    let y = build(xs);
    let dev = y.device().clone();
    let w = Tensor::from_slice(&data(y.numel(), 99, -1.0, 1.0), y.dims().to_vec(), &dev).cast(y.dtype());
    y.mul(&w).sum_all()
}

fn make_inputs(ins: &[In], dev: &Device, grad: bool) -> Vec<Tensor> {
    ins.iter()
        .enumerate()
        .map(|(k, In(shape, lo, hi))| {
            let n = shape.iter().product();
            let v: Vec<f64> = data(n, 7 + k as u64, *lo, *hi).into_iter().map(f64::from).collect();
            let t = Tensor::from_f64(&v, shape.to_vec(), DType::F32, dev);
            if grad {
                t.requires_grad()
            } else {
                t
            }
        })
        .collect()
}

/// Analytic gradients on `dev`, one vector per input.
fn analytic(build: &Build, ins: &[In], dev: &Device) -> Vec<Vec<f64>> {
    let xs = make_inputs(ins, dev, true);
    let loss = loss_of(build, &xs);
    let grads = loss.backward().unwrap_or_else(|e| panic!("backward on {}: {e}", label(dev)));
    let gs: Vec<Tensor> = xs.iter().map(|x| grads.get(x).cloned().unwrap_or_else(|| x.zeros_like())).collect();
    tessera::read_all_blocking(&gs).unwrap_or_else(|e| panic!("gradients on {}: {e}", label(dev)))
}

/// Check the gradients of `build` by finite differences (exact reference) and on every GPU.
fn gradcheck(name: &str, ins: &[In], build: &Build) {
    let exact = Device::reference_exact();
    let got = analytic(build, ins, &exact);
    let base: Vec<Vec<f64>> = {
        let xs = make_inputs(ins, &exact, false);
        tessera::read_all_blocking(&xs).unwrap()
    };
    let eps = 1e-6;
    for (i, In(shape, _, _)) in ins.iter().enumerate() {
        for j in 0..base[i].len() {
            let eval = |delta: f64| {
                let xs: Vec<Tensor> = base
                    .iter()
                    .zip(ins)
                    .enumerate()
                    .map(|(k, (v, In(s, _, _)))| {
                        let mut v = v.clone();
                        if k == i {
                            v[j] += delta;
                        }
                        Tensor::from_f64(&v, s.to_vec(), DType::F32, &exact)
                    })
                    .collect();
                loss_of(build, &xs).to_f64_vec_blocking().unwrap()[0]
            };
            let fd = (eval(eps) - eval(-eps)) / (2.0 * eps);
            let a = got[i][j];
            assert!(
                (a - fd).abs() <= 1e-6 + 1e-5 * fd.abs(),
                "{name}: d/dx{i}[{j}] (shape {shape:?}) analytic {a}, finite difference {fd}"
            );
        }
    }
    let cpu = analytic(build, ins, &Device::reference());
    for dev in &devices() {
        common::record(dev);
        let gpu = analytic(build, ins, dev);
        for (i, (g, w)) in gpu.iter().zip(&cpu).enumerate() {
            assert_close(&format!("{name} d/dx{i} on {}", label(dev)), g, w, Tol { atol: 1e-4, rtol: 1e-4 });
        }
    }
}

#[test]
fn unary_gradients() {
    type F = fn(&Tensor) -> Tensor;
    let cases: [(&str, F, f64, f64); 17] = [
        ("neg", |x| x.neg(), -2.0, 2.0),
        ("abs", |x| x.abs(), 0.1, 2.0),
        ("exp", |x| x.exp(), -2.0, 2.0),
        ("log", |x| x.log(), 0.2, 3.0),
        ("sqrt", |x| x.sqrt(), 0.2, 3.0),
        ("rsqrt", |x| x.rsqrt(), 0.2, 3.0),
        ("sin", |x| x.sin(), -2.0, 2.0),
        ("cos", |x| x.cos(), -2.0, 2.0),
        ("tanh", |x| x.tanh(), -2.0, 2.0),
        ("sigmoid", |x| x.sigmoid(), -3.0, 3.0),
        ("relu", |x| x.relu(), 0.05, 1.0),
        ("erf", |x| x.erf(), -2.0, 2.0),
        ("gelu", |x| x.gelu(), -3.0, 3.0),
        ("gelu_tanh", |x| x.gelu_tanh(), -3.0, 3.0),
        ("silu", |x| x.silu(), -3.0, 3.0),
        ("recip", |x| x.recip(), 0.5, 2.0),
        ("square", |x| x.square(), -2.0, 2.0),
    ];
    // One graph with every function, so each adapter compiles few kernels.
    gradcheck("unary", &[In(&[3, 5], 0.0, 1.0)], &move |xs: &[Tensor]| {
        let outs: Vec<Tensor> = cases
            .iter()
            .map(|(_, f, lo, hi)| f(&xs[0].mul_scalar(hi - lo).add_scalar(*lo)).reshape(vec![15]))
            .collect();
        Tensor::stack(&outs, 0)
    });
}

#[test]
fn binary_gradients_with_broadcasting() {
    let ins = [In(&[2, 3, 4], 0.5, 2.0), In(&[3, 1], 0.5, 2.0)];
    gradcheck("binary", &ins, &|xs: &[Tensor]| {
        let (a, b) = (&xs[0], &xs[1]);
        Tensor::stack(
            &[a.add(b), a.sub(b), a.mul(b), a.div(b), a.pow(b), a.maximum(&b.mul_scalar(1.3)), a.minimum(b)],
            0,
        )
    });
    gradcheck("where_clamp", &[In(&[17], -2.0, 2.0)], &|xs: &[Tensor]| {
        let x = &xs[0];
        Tensor::where_(&x.gt_scalar(0.3), &x.square(), &x.mul_scalar(3.0)).add(&x.clamp(-1.0, 1.0))
    });
}

#[test]
fn movement_gradients() {
    gradcheck("reshape_permute_expand", &[In(&[2, 3, 4], -1.0, 1.0), In(&[4], -1.0, 1.0)], &|xs: &[Tensor]| {
        let p = xs[0].permute(&[2, 0, 1]).reshape(vec![4, 6]);
        p.add(&xs[1].reshape(vec![4, 1]).broadcast_to(vec![4, 6])).mul(&xs[1].reshape(vec![4, 1]))
    });
    gradcheck("slice_step_pad_concat", &[In(&[5, 7], -1.0, 1.0)], &|xs: &[Tensor]| {
        let x = &xs[0];
        let a = x.slice(1, 1, 7, 2).slice(0, 0, 5, 3); // [2, 3]
        let b = x.narrow(0, 1, 2).pad(&[(1, 0), (0, 2)], 0.5); // [3, 9]
        let c = Tensor::concat(&[a.reshape(vec![6]), b.reshape(vec![27]), x.reshape(vec![35])], 0);
        c.square()
    });
    let idx = |dev: &Device| Tensor::from_slice(&[2i32, 0, 2, 1], [4], dev);
    gradcheck("index_select_gather", &[In(&[3, 5], -1.0, 1.0)], &move |xs: &[Tensor]| {
        let x = &xs[0];
        let dev = x.device().clone();
        let sel = x.index_select(0, &idx(&dev)); // [4, 5]
        let gi = Tensor::from_slice(&[4i32, 0, 0, 3, 1, 1], [3, 2], &dev);
        let g = x.gather(1, &gi); // [3, 2]
        Tensor::concat(&[sel.reshape(vec![20]), g.reshape(vec![6])], 0).square()
    });
}

#[test]
fn reduction_and_matmul_gradients() {
    gradcheck("reductions", &[In(&[3, 4, 5], -2.0, 2.0)], &|xs: &[Tensor]| {
        let x = &xs[0];
        Tensor::concat(
            &[
                x.sum(&[1], false).reshape(vec![15]),
                x.mean(&[0, 2], false),
                x.max(&[2], false).reshape(vec![12]),
                x.min(&[0], false).reshape(vec![20]),
                x.var(&[1], false).reshape(vec![15]),
                x.softmax(-1).reshape(vec![60]),
                x.log_softmax(1).reshape(vec![60]),
            ],
            0,
        )
    });
    gradcheck("matmul_batched", &[In(&[2, 3, 5], -1.0, 1.0), In(&[5, 4], -1.0, 1.0)], &|xs: &[Tensor]| {
        xs[0].matmul(&xs[1]).add(&xs[0].matmul(&xs[1]).relu())
    });
    gradcheck("matmul_transposed", &[In(&[3, 4], -1.0, 1.0), In(&[5, 4], -1.0, 1.0)], &|xs: &[Tensor]| {
        xs[0].matmul(&xs[1].t())
    });
}

#[test]
fn backward_api() {
    let dev = Device::reference();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3], &dev).requires_grad();
    let y = Tensor::from_slice(&[4.0f32, 5.0, 6.0], [3], &dev).requires_grad();
    // A detached branch and a no_grad branch contribute nothing.
    let frozen = {
        let _g = tessera::no_grad();
        x.mul(&y)
    };
    let loss = x.mul(&y).sum_all().add(&x.detach().square().sum_all()).add(&frozen.sum_all());
    let g = loss.backward().unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec_blocking::<f32>().unwrap(), vec![4.0, 5.0, 6.0]);
    assert_eq!(g.get(&y).unwrap().to_vec_blocking::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    // A tensor used twice accumulates both paths.
    let g2 = x.mul(&x).add(&x).sum_all().backward().unwrap();
    assert_eq!(g2.get(&x).unwrap().to_vec_blocking::<f32>().unwrap(), vec![3.0, 5.0, 7.0]);
    // Gradients of two backward passes accumulate.
    let mut acc = x.mul(&y).sum_all().backward().unwrap();
    acc.accumulate(&x.square().sum_all().backward().unwrap());
    assert_eq!(acc.get(&x).unwrap().to_vec_blocking::<f32>().unwrap(), vec![6.0, 9.0, 12.0]);
    assert_eq!(acc.get(&y).unwrap().to_vec_blocking::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    // Errors, not panics.
    assert!(x.mul(&y).backward().is_err(), "a non-scalar loss needs a seed");
    let unrelated = Tensor::ones([1], DType::F32, &dev);
    assert!(unrelated.backward().unwrap().is_empty());
    let bad = x.reshape(vec![7]);
    assert!(bad.sum_all().backward().is_err(), "a failed graph returns its error");
}

#[test]
fn nn_op_gradients() {
    use tessera::ops::nn::Conv2dOptions;
    let o = Conv2dOptions { stride: (2, 1), padding: (1, 1), dilation: (1, 2), groups: 2 };
    gradcheck(
        "conv2d_grouped_strided_dilated",
        &[In(&[1, 4, 4, 5], -1.0, 1.0), In(&[4, 2, 3, 2], -1.0, 1.0), In(&[4], -1.0, 1.0)],
        &move |xs: &[Tensor]| xs[0].conv2d(&xs[1], Some(&xs[2]), o),
    );
    // A horizontal stride of 3 with dilation: the input gradient adds each tap's column
    // row to every third pixel (the CPU backend's col2im).
    let s3 = Conv2dOptions { stride: (2, 3), padding: (1, 2), dilation: (1, 2), groups: 1 };
    gradcheck(
        "conv2d_horizontal_stride_3",
        &[In(&[1, 2, 5, 11], -1.0, 1.0), In(&[3, 2, 2, 3], -1.0, 1.0)],
        &move |xs: &[Tensor]| xs[0].conv2d(&xs[1], None, s3),
    );
    // Depthwise (a sum over the window's taps on GPU devices).
    let dw = Conv2dOptions { stride: (1, 2), padding: (1, 2), dilation: (2, 1), groups: 3 };
    gradcheck(
        "conv2d_depthwise",
        &[In(&[2, 3, 5, 6], -1.0, 1.0), In(&[3, 1, 3, 2], -1.0, 1.0), In(&[3], -1.0, 1.0)],
        &move |xs: &[Tensor]| xs[0].conv2d(&xs[1], Some(&xs[2]), dw),
    );
    // With a channel multiplier: two filters per input channel.
    gradcheck(
        "conv2d_depthwise_multiplier",
        &[In(&[1, 3, 5, 4], -1.0, 1.0), In(&[6, 1, 2, 3], -1.0, 1.0), In(&[6], -1.0, 1.0)],
        &move |xs: &[Tensor]| xs[0].conv2d(&xs[1], Some(&xs[2]), dw),
    );
    gradcheck(
        "conv_transpose2d_grouped_strided_dilated",
        &[In(&[1, 4, 3, 3], -1.0, 1.0), In(&[4, 3, 3, 2], -1.0, 1.0), In(&[6], -1.0, 1.0)],
        &move |xs: &[Tensor]| xs[0].conv_transpose2d(&xs[1], Some(&xs[2]), o, (1, 0)),
    );
    gradcheck("pools", &[In(&[1, 2, 5, 4], -2.0, 2.0)], &|xs: &[Tensor]| {
        let x = &xs[0];
        Tensor::concat(
            &[
                x.max_pool2d(3, 2, 1).reshape(vec![12]),
                x.avg_pool2d(2, 1, 0).reshape(vec![24]),
                x.narrow(2, 0, 4).max_pool2d(2, 2, 0).reshape(vec![8]),
            ],
            0,
        )
    });
    gradcheck("norms", &[In(&[3, 7], -2.0, 2.0), In(&[7], 0.5, 1.5), In(&[7], -0.5, 0.5)], &|xs: &[Tensor]| {
        Tensor::concat(&[xs[0].layer_norm(Some(&xs[1]), Some(&xs[2]), 1e-5), xs[0].rms_norm(Some(&xs[1]), 1e-6)], 1)
    });
    gradcheck(
        "attention_causal_masked",
        &[In(&[1, 2, 5, 4], -1.0, 1.0), In(&[1, 2, 6, 4], -1.0, 1.0), In(&[1, 2, 6, 3], -1.0, 1.0)],
        &|xs: &[Tensor]| {
            let dev = xs[0].device().clone();
            let keep = Tensor::from_slice(&[true, true, false, true, true, true], [1, 1, 1, 6], &dev);
            Tensor::concat(
                &[
                    Tensor::scaled_dot_product_attention(&xs[0], &xs[1], &xs[2], Some(&keep), false),
                    Tensor::scaled_dot_product_attention(&xs[0], &xs[1], &xs[2], None, true),
                ],
                -1,
            )
        },
    );
    // The fused kernel's rule (Op::Attention): q, k, v and a float bias.
    gradcheck(
        "attention_fused",
        &[
            In(&[1, 2, 5, 4], -1.0, 1.0),
            In(&[1, 2, 6, 4], -1.0, 1.0),
            In(&[1, 2, 6, 4], -1.0, 1.0),
            In(&[5, 6], -1.0, 1.0),
        ],
        &|xs: &[Tensor]| {
            let dev = xs[0].device().clone();
            let keep = Tensor::from_slice(&[true, true, false, true, true, true], [1, 1, 1, 6], &dev);
            Tensor::concat(
                &[
                    Tensor::scaled_dot_product_attention_fused(&xs[0], &xs[1], &xs[2], Some(&xs[3]), true),
                    Tensor::scaled_dot_product_attention_fused(&xs[0], &xs[1], &xs[2], Some(&keep), false),
                ],
                -1,
            )
        },
    );
}

#[test]
fn loss_gradients() {
    use tessera::nn::loss;
    let labels = |dev: &Device| Tensor::from_slice(&[2i32, 0, -100, 1], [4], dev);
    gradcheck("cross_entropy_smoothing_ignore", &[In(&[4, 3], -2.0, 2.0)], &move |xs: &[Tensor]| {
        let o = loss::CrossEntropy { label_smoothing: 0.1, ignore_index: Some(-100) };
        loss::cross_entropy_with(&xs[0], &labels(xs[0].device()), o)
    });
    gradcheck("mse_bce_kl", &[In(&[4, 3], -2.0, 2.0), In(&[4, 3], 0.0, 1.0)], &|xs: &[Tensor]| {
        Tensor::stack(
            &[
                loss::mse(&xs[0], &xs[1]),
                loss::bce_with_logits(&xs[0], &xs[1]),
                loss::kl_div_distill(&xs[0], &xs[1].mul_scalar(3.0), 2.0),
            ],
            0,
        )
    });
}

/// conv2d against a direct loop (not the im2col path it is built from).
#[test]
fn conv2d_matches_direct_convolution() {
    use tessera::ops::nn::Conv2dOptions;
    let (n, c, h, w, oc, k) = (2usize, 4usize, 7usize, 6usize, 6usize, 3usize);
    let o = Conv2dOptions { stride: (2, 1), padding: (1, 2), dilation: (1, 2), groups: 2 };
    let xv = data(n * c * h * w, 1, -1.0, 1.0);
    let wv = data(oc * (c / 2) * k * k, 2, -1.0, 1.0);
    let bv = data(oc, 3, -1.0, 1.0);
    let oh = (h + 2 - 2 - 1) / 2 + 1; // padding 1 each side, span 3 (no dilation), stride 2
    let ow = (w + 4 - 2 * 2 - 1) + 1;
    let mut want = vec![0.0f64; n * oc * oh * ow];
    let cg = c / 2;
    for b in 0..n {
        for o_ in 0..oc {
            let g = o_ / (oc / 2);
            for y in 0..oh {
                for x in 0..ow {
                    let mut s = bv[o_] as f64;
                    for ci in 0..cg {
                        for i in 0..k {
                            for j in 0..k {
                                let iy = (y * 2 + i) as isize - 1;
                                let ix = (x + j * 2) as isize - 2;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                                    let xc = g * cg + ci;
                                    s += xv[((b * c + xc) * h + iy as usize) * w + ix as usize] as f64
                                        * wv[((o_ * cg + ci) * k + i) * k + j] as f64;
                                }
                            }
                        }
                    }
                    want[((b * oc + o_) * oh + y) * ow + x] = s;
                }
            }
        }
    }
    for dev in &[vec![Device::reference()], devices()].concat() {
        common::record(dev);
        let x = Tensor::from_slice(&xv, [n, c, h, w], dev);
        let wt = Tensor::from_slice(&wv, [oc, cg, k, k], dev);
        let bt = Tensor::from_slice(&bv, [oc], dev);
        let y = x.conv2d(&wt, Some(&bt), o);
        assert_eq!(y.dims(), &[n, oc, oh, ow]);
        let got = y.to_f64_vec_blocking().unwrap();
        assert_close(
            &format!("conv2d on {}", label(dev)),
            &got,
            &want,
            Tol { atol: 1e-5, rtol: 1e-5 }.scaled(cg * k * k),
        );
    }
}

/// conv_transpose2d against a direct scatter loop, and as the adjoint of conv2d: for
/// y = conv2d(z, w), the gradient of <y, g> with respect to z is conv_transpose2d(g, w).
#[test]
fn conv_transpose2d_matches_direct_scatter() {
    use tessera::ops::nn::Conv2dOptions;
    let (n, c, h, w, og, g, k) = (2usize, 4usize, 5usize, 4usize, 3usize, 2usize, 3usize);
    let o = Conv2dOptions { stride: (2, 3), padding: (1, 2), dilation: (1, 2), groups: g };
    let op = (1usize, 2usize);
    let ho = (h - 1) * 2 - 2 + (k - 1) + op.0 + 1;
    let wo = (w - 1) * 3 - 4 + 2 * (k - 1) + op.1 + 1;
    let oc = og * g;
    let xv = data(n * c * h * w, 4, -1.0, 1.0);
    let wv = data(c * og * k * k, 5, -1.0, 1.0);
    let bv = data(oc, 6, -1.0, 1.0);
    let mut want = vec![0.0f64; n * oc * ho * wo];
    for b in 0..n {
        for o_ in 0..oc {
            for y in 0..ho {
                for x in 0..wo {
                    want[((b * oc + o_) * ho + y) * wo + x] = bv[o_] as f64;
                }
            }
        }
        for ci in 0..c {
            let grp = ci / (c / g);
            for iy in 0..h {
                for ix in 0..w {
                    for oo in 0..og {
                        for i in 0..k {
                            for j in 0..k {
                                let y = (iy * 2 + i) as isize - 1;
                                let x = (ix * 3 + j * 2) as isize - 2;
                                if y >= 0 && x >= 0 && (y as usize) < ho && (x as usize) < wo {
                                    let o_ = grp * og + oo;
                                    want[((b * oc + o_) * ho + y as usize) * wo + x as usize] +=
                                        xv[((b * c + ci) * h + iy) * w + ix] as f64
                                            * wv[((ci * og + oo) * k + i) * k + j] as f64;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    for dev in &[vec![Device::reference()], devices()].concat() {
        common::record(dev);
        let x = Tensor::from_slice(&xv, [n, c, h, w], dev);
        let wt = Tensor::from_slice(&wv, [c, og, k, k], dev);
        let bt = Tensor::from_slice(&bv, [oc], dev);
        let y = x.conv_transpose2d(&wt, Some(&bt), o, op);
        assert_eq!(y.dims(), &[n, oc, ho, wo]);
        let tol = Tol { atol: 1e-5, rtol: 1e-5 }.scaled(c * k * k);
        assert_close(&format!("conv_transpose2d on {}", label(dev)), &y.to_f64_vec_blocking().unwrap(), &want, tol);
        // The adjoint of conv2d: z is [n, oc, ho, wo] and conv2d(z, w) is [n, c, h, w].
        let z = Tensor::zeros([n, oc, ho, wo], DType::F32, dev).requires_grad();
        let gy = Tensor::from_slice(&xv, [n, c, h, w], dev);
        let grads = z.conv2d(&wt, None, o).mul(&gy).sum_all().backward().unwrap();
        let adj = x.conv_transpose2d(&wt, None, o, op);
        assert_close(
            &format!("adjoint on {}", label(dev)),
            &grads.get(&z).unwrap().to_f64_vec_blocking().unwrap(),
            &adj.to_f64_vec_blocking().unwrap(),
            tol,
        );
    }
    // The layer: a stride-2 2x2 kernel doubles the resolution; named PyTorch slots.
    use tessera::nn::{ConvTranspose2d, Layer, Module};
    let d = Device::reference();
    let up = ConvTranspose2d::new(4, 2, 2, Conv2dOptions::new(2, 0), 7, &d);
    let y = up.forward(&Tensor::ones([1, 4, 5, 5], DType::F32, &d));
    assert_eq!(y.dims(), &[1, 2, 10, 10]);
    assert_eq!(up.weight.dims(), &[4, 2, 2, 2]);
    let names: Vec<String> = up.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight", "bias"]);
    // Bad arguments are errors, not panics.
    let x = Tensor::zeros([1, 4, 3, 3], DType::F32, &d);
    let wt = Tensor::zeros([4, 1, 3, 3], DType::F32, &d);
    assert!(x.conv_transpose2d(&Tensor::zeros([3, 1, 3, 3], DType::F32, &d), None, o, (0, 0)).check().is_err());
    assert!(x.conv_transpose2d(&wt, None, Conv2dOptions::new(1, 0), (1, 0)).check().is_err());
    assert!(x.conv_transpose2d(&wt, None, Conv2dOptions::new(1, 5), (0, 0)).check().is_err());
}

/// Long-K products with few output tiles take the split-K path; same numbers.
#[test]
fn split_k_matmul_matches_reference() {
    let ab = |d: &Device| (common::rand_t(&[3, 2500], 1, -1.0, 1.0, d), common::rand_t(&[2500, 5], 2, -1.0, 1.0, d));
    common::check_with("split_k", Some(Tol { atol: 1e-4, rtol: 1e-4 }), |d| {
        let (a, b) = ab(d);
        vec![a.matmul(&b), b.t().matmul(&a.t())]
    });
    // f16 results: the partial sums round once more than the reference's single sum.
    common::check_with("split_k_f16", Some(Tol { atol: 2e-3, rtol: 2e-3 }), |d| {
        let (a, b) = ab(d);
        vec![a.cast(DType::F16).matmul(&b.cast(DType::F16))]
    });
}

/// A permute that undoes an unrealised permute is that permute's input; so a Linear
/// weight's gradient (the transpose of a transposed product) is the product itself, in
/// the weight's layout, which the optimiser's kernel loads vectorised.
#[test]
fn permutes_of_permutes_fold_and_a_weight_gradient_is_the_product_itself() {
    use tessera::graph::Op;
    let d = Device::reference();
    let x = common::rand_t(&[3, 4, 5], 1, -1.0, 1.0, &d);
    assert_eq!(x.t().t().id(), x.id());
    assert_eq!(x.permute(&[1, 2, 0]).permute(&[2, 0, 1]).id(), x.id());
    // A cancelled pair under a third permute leaves the third alone.
    let q = x.permute(&[0, 2, 1]).permute(&[0, 2, 1]).permute(&[1, 0, 2]);
    assert!(matches!(q.op(), Op::Permute { perm } if perm == &[1, 0, 2]), "{:?}", q.op());
    assert_eq!(q.to_vec_blocking::<f32>().unwrap(), x.permute(&[1, 0, 2]).to_vec_blocking::<f32>().unwrap());
    // A pair that does not cancel stays a pair: a product reads the swap of a head
    // split in place.
    let kt = x.permute(&[1, 0, 2]).transpose(-2, -1);
    assert!(matches!(kt.op(), Op::Permute { perm } if perm == &[0, 2, 1]), "{:?}", kt.op());
    assert_eq!(kt.to_vec_blocking::<f32>().unwrap(), x.permute(&[1, 2, 0]).to_vec_blocking::<f32>().unwrap());
    // A realised permute keeps its own storage: its input is not recomputed.
    let r = x.t();
    r.realize_blocking().unwrap();
    let back = r.t();
    assert_ne!(back.id(), x.id());
    assert_eq!(back.to_vec_blocking::<f32>().unwrap(), x.to_vec_blocking::<f32>().unwrap());
    // A permute marked as a gradient target stays in the graph, so its gradient flows.
    let wt = x.t().requires_grad();
    let grads = wt.t().sum_all().backward().unwrap();
    assert_eq!(grads.get(&wt).unwrap().to_vec_blocking::<f32>().unwrap(), vec![1.0; 60]);
    // x @ w^T: w's gradient is g^T x, computed in w's layout.
    let w = common::rand_t(&[6, 5], 2, -1.0, 1.0, &d).requires_grad();
    let a = common::rand_t(&[4, 5], 3, -1.0, 1.0, &d);
    let grads = a.matmul(&w.t()).sum_all().backward().unwrap();
    let gw = grads.get(&w).unwrap();
    assert!(matches!(gw.op(), Op::Matmul), "{:?}", gw.op());
    assert_eq!(gw.dims(), &[6, 5]);
}
