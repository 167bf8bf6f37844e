//! Every op on the CPU backend and every adapter (and fallback path) against the reference, on random
//! inputs and odd shapes (1, 3, 17, 65, 257).

mod common;
use common::{check, check_with, data, rand_t, Tol};
use tessera::ops::nn::Conv2dOptions;
use tessera::{f16, DType, Device, Tensor};

const SHAPES: [&[usize]; 5] = [&[1], &[3, 1], &[17, 3], &[2, 65], &[257]];

#[test]
fn creation_ops() {
    check("creation", |d| {
        vec![
            Tensor::from_slice(&[1.5f32, -2.0, 3.25], [3], d),
            Tensor::from_slice(&[1i32, -7, 9, 2], [2, 2], d),
            Tensor::from_slice(&[1u32, 7, 4_000_000_000], [3], d),
            Tensor::from_slice(&[true, false, true], [3, 1], d),
            Tensor::from_slice(&[f16::from_f32(0.5), f16::from_f32(-3.0), f16::from_f32(65504.0)], [3], d),
            Tensor::zeros([2, 3], DType::F32, d),
            Tensor::ones([17], DType::I32, d),
            Tensor::full(2.5, [3, 1, 2], DType::F16, d),
            Tensor::arange(0.0, 17.0, 1.0, DType::F32, d),
            Tensor::arange(-3.0, 10.0, 4.0, DType::I32, d),
            Tensor::arange(1.0, 0.0, -0.25, DType::F32, d),
            Tensor::eye(5, DType::F32, d),
            Tensor::eye(3, DType::Bool, d),
            Tensor::scalar(7.0, DType::U32, d),
        ]
    });
}

#[test]
fn seeded_random_matches_everywhere() {
    check_with("rand", Some(Tol { atol: 1e-6, rtol: 1e-6 }), |d| {
        vec![Tensor::rand([65, 3], 7, d), Tensor::rand([5], u64::MAX - 3, d)]
    });
    check_with("randn", Some(Tol { atol: 2e-5, rtol: 2e-5 }), |d| vec![Tensor::randn([257], 11, d)]);
    // Statistics: mean near 0, variance near 1.
    let cpu = Device::reference();
    let v = Tensor::randn([4096], 3, &cpu).to_vec_blocking::<f32>().unwrap();
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
    assert!(mean.abs() < 0.06 && (var - 1.0).abs() < 0.08, "mean {mean} var {var}");
    let u = Tensor::rand([4096], 3, &cpu).to_vec_blocking::<f32>().unwrap();
    assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
}

#[test]
fn unary_ops_f32() {
    let loose = Tol { atol: 2e-5, rtol: 2e-5 };
    for (k, shape) in SHAPES.iter().enumerate() {
        check_with(&format!("unary {shape:?}"), Some(loose), |d| {
            let x = rand_t(shape, k as u64, -4.0, 4.0, d);
            let p = rand_t(shape, 100 + k as u64, 0.05, 6.0, d);
            vec![
                x.neg(),
                x.abs(),
                x.exp(),
                p.log(),
                p.sqrt(),
                p.rsqrt(),
                x.sin(),
                x.cos(),
                x.tanh(),
                x.sigmoid(),
                x.relu(),
                x.gelu(),
                x.gelu_tanh(),
                x.silu(),
                x.erf(),
                x.floor(),
                x.ceil(),
                p.recip(),
                x.square(),
                x.clamp(-1.0, 0.5),
                p.pow_scalar(1.7),
                x.pow_scalar(3.0),
                x.pow_scalar(2.0),
            ]
        });
    }
}

#[test]
fn unary_edge_values() {
    check("edges", |d| {
        let x = Tensor::from_slice(&[0.0f32, -0.0, 1e-30, -1.0, 50.0, -50.0, 100.0, -100.0], [8], d);
        vec![x.tanh(), x.sigmoid(), x.exp(), x.relu(), x.silu(), x.gelu(), x.abs().sqrt(), x.sqrt(), x.log()]
    });
    // erf and GELU past the fit's clamp at ±4, near 0, and NaN kept.
    check("erf edges", |d| {
        let x = Tensor::from_slice(&[0.0f32, -0.0, 1e-7, -3.9, 4.5, -20.0, f32::NAN, f32::INFINITY], [8], d);
        vec![x.erf(), x.gelu()]
    });
}

#[test]
fn unary_ops_f16_and_int() {
    check("unary f16", |d| {
        let x = rand_t(&[17, 3], 5, -3.0, 3.0, d).cast(DType::F16);
        vec![x.exp(), x.tanh(), x.relu(), x.neg(), x.gelu(), (x.sigmoid() * 2.0).cast(DType::F32)]
    });
    check("unary int", |d| {
        let i = Tensor::from_slice(&[-5i32, 0, 7, i32::MIN, i32::MAX], [5], d);
        let u = Tensor::from_slice(&[0u32, 3, u32::MAX], [3], d);
        let m = Tensor::from_slice(&[true, false], [2], d);
        vec![i.neg(), i.abs(), i.relu(), u.abs(), u.relu(), m.logical_not()]
    });
}

#[test]
fn binary_ops_with_broadcasting() {
    let pairs: [(&[usize], &[usize]); 6] = [
        (&[1], &[1]),
        (&[17, 1], &[1, 65]),
        (&[3, 1, 5], &[5]),
        (&[257], &[]),
        (&[2, 3, 4], &[2, 1, 4]),
        (&[1, 3], &[4, 1]),
    ];
    for (k, (a, b)) in pairs.iter().enumerate() {
        check(&format!("binary {a:?} {b:?}"), |d| {
            let x = rand_t(a, k as u64, -3.0, 3.0, d);
            let y = rand_t(b, 50 + k as u64, 0.5, 3.0, d);
            vec![
                x.add(&y),
                x.sub(&y),
                x.mul(&y),
                x.div(&y),
                x.maximum(&y),
                x.minimum(&y),
                y.pow(&x),
                x.lt(&y),
                x.le(&y),
                x.gt(&y),
                x.ge(&y),
                x.eq(&x),
                x.ne(&y),
                &x + &y * 2.0 - 1.0,
                2.0 - &x / &y,
                -(&x * &y),
            ]
        });
    }
}

#[test]
fn binary_ops_integer_and_mask() {
    check("binary int", |d| {
        let a = Tensor::from_slice(&[7i32, -7, 7, -7, 0, i32::MIN, i32::MAX, 5], [8], d);
        let b = Tensor::from_slice(&[2i32, 2, -2, -2, 3, -1, 2, 0], [8], d);
        let u = Tensor::from_slice(&[7u32, 1, 0, u32::MAX], [4], d);
        let v = Tensor::from_slice(&[2u32, 3, 5, 2], [4], d);
        let m = a.gt_scalar(0.0);
        let n = b.lt_scalar(0.0);
        vec![
            a.add(&b),
            a.sub(&b),
            a.mul(&b),
            a.div(&b),
            a.maximum(&b),
            a.minimum(&b),
            u.add(&v),
            u.sub(&v),
            u.mul(&v),
            u.div(&v),
            a.add_scalar(10.0),
            m.logical_and(&n),
            m.logical_or(&n),
            m.eq(&n),
            a.clamp(-3.0, 3.0),
        ]
    });
}

#[test]
fn where_and_cast() {
    check("where", |d| {
        let x = rand_t(&[17, 3], 1, -1.0, 1.0, d);
        let y = rand_t(&[3], 2, -1.0, 1.0, d);
        let c = x.gt_scalar(0.0);
        vec![Tensor::where_(&c, &x, &y), Tensor::where_(&y.lt_scalar(0.0), &Tensor::zeros([17, 1], DType::F32, d), &x)]
    });
    check("cast", |d| {
        let f = Tensor::from_slice(&[0.0f32, 1.5, -1.5, 2.7, -2.7, 1e10, -1e10, 65519.0, 1e-8], [9], d);
        let i = Tensor::from_slice(&[0i32, 1, -1, 1000, -70000, i32::MAX], [6], d);
        let u = Tensor::from_slice(&[0u32, 1, 3_000_000_000], [3], d);
        let mut out = Vec::new();
        for dt in DType::ALL {
            out.push(f.cast(dt));
            out.push(i.cast(dt));
            out.push(u.cast(dt));
            out.push(f.gt_scalar(0.0).cast(dt));
        }
        out.push(f.cast(DType::F16).cast(DType::F32));
        out
    });
}

#[test]
fn reductions_over_axis_sets() {
    let cases: [(&[usize], &[isize]); 16] = [
        (&[1], &[0]),
        (&[3, 1, 4], &[1]), // an axis of size one: no reduction at all
        // Many outputs, long rows: the narrow-workgroup tree on GPUs, an invocation per
        // output on CPU adapters (`reduce::serial_on_cpu`), which take the tree for a few
        // outputs of a long reduction ([3, 2, 2100] over 0 and 2) and loop past 4,096.
        (&[65, 70], &[1]),
        (&[9, 5000], &[1]),
        (&[17, 3], &[0]),
        (&[17, 3], &[1]),
        (&[2, 65], &[-1]),
        (&[3, 5, 7], &[0, 2]),
        (&[4, 257], &[1]),
        (&[1023], &[0]),
        (&[2, 3, 4, 5], &[1, 3]),
        // The CPU backend's in-order walk with reduced axes outside its blocks (partial
        // results combined), and blocks of one long axis, reduced or kept.
        (&[20, 3, 12, 10], &[0, 2]),
        (&[3, 2, 2100], &[0, 2]),
        (&[2, 3, 2100], &[1]),
        // Kept axes on both sides of the reduced block, a row of outputs folded a step
        // (several rows of input at once where a row is short), with an axis of size one
        // among the reduced.
        (&[2, 9, 4, 300], &[1, 2]),
        (&[2, 5, 1, 3, 700], &[1, 3]),
    ];
    for (k, (shape, axes)) in cases.iter().enumerate() {
        let len: usize = axes.iter().map(|&a| shape[a.rem_euclid(shape.len() as isize) as usize]).product();
        let tol = Tol::for_dtype(DType::F32).scaled(len);
        check_with(&format!("reduce {shape:?} {axes:?}"), Some(tol), |d| {
            let x = rand_t(shape, k as u64, -2.0, 2.0, d);
            vec![
                x.sum(axes, false),
                x.sum(axes, true),
                x.mean(axes, false),
                x.max(axes, true),
                x.min(axes, false),
                x.var(axes, false),
                x.argmax(axes, false),
                x.argmin(axes, true),
                (&x * 2.0).exp().sum(axes, false), // fused prologue
            ]
        });
    }
    // Every element at once: the `_all` forms (a scalar), on a rank-3 and a rank-0 input.
    check_with("reduce all", Some(Tol::for_dtype(DType::F32).scaled(105)), |d| {
        let x = rand_t(&[3, 5, 7], 9, -2.0, 2.0, d);
        let s = Tensor::scalar(2.5, DType::F32, d);
        vec![
            x.sum_all(),
            x.mean_all(),
            x.max_all(),
            x.min_all(),
            x.var_all(),
            x.argmax_all(),
            x.argmin_all(),
            s.sum_all(),
        ]
    });
    check("reduce int and bool", |d| {
        let i = Tensor::from_slice(&[3i32, -1, 4, -1, 5, 9, -2, 6], [2, 4], d);
        let u = Tensor::from_slice(&[3u32, 1, 4, 1, 5, 9], [3, 2], d);
        vec![
            i.sum(&[1], false),
            i.max(&[0], false),
            i.min_all(),
            i.argmax(&[1], false),
            u.sum(&[0], false),
            u.max(&[1], false),
            i.gt_scalar(0.0).sum_all(),
            i.gt_scalar(0.0).reshape([2, 1, 4]).sum(&[1], false),
            i.reshape([2, 2, 2]).sum(&[0, 2], false),
            i.reshape([2, 2, 2]).argmin(&[0, 2], false),
        ]
    });
    // Over axes of size one the values are the input's, and no kernel runs for them.
    // (A device of its own: other tests count on the shared one at the same time.)
    let d = &Device::cpu();
    let x = rand_t(&[3, 1, 4], 5, -2.0, 2.0, d);
    x.realize_blocking().unwrap();
    let before = d.stats().kernels_dispatched;
    let y = x.sum(&[1], true).max(&[1], true).min(&[1], true);
    assert_eq!(y.to_vec_blocking::<f32>().unwrap(), x.to_vec_blocking::<f32>().unwrap());
    assert_eq!(d.stats().kernels_dispatched, before, "a reduction over an axis of size one ran a kernel");
    // NaN wins a maximum or minimum wherever it lies, there too.
    check("reduce NaN between kept axes", |d| {
        let mut v = data(2 * 9 * 4 * 300, 21, -2.0, 2.0);
        v[300 * 5 + 17] = f32::NAN;
        v[300 * 40 + 299] = f32::NAN;
        let x = Tensor::from_slice(&v, [2, 9, 4, 300], d);
        vec![x.max(&[1, 2], false), x.min(&[1], false), x.argmax(&[1, 2], false), x.sum(&[1, 2], false)]
    });
    check("reduce ties take the first index", |d| {
        let x = Tensor::from_slice(&[1.0f32, 3.0, 3.0, 0.0, -1.0, -1.0], [2, 3], d);
        vec![x.argmax(&[1], false), x.argmin(&[1], false), x.argmax_all()]
    });
}

#[test]
fn reductions_f16() {
    check_with("reduce f16", Some(Tol { atol: 2e-2, rtol: 2e-3 }), |d| {
        let x = rand_t(&[5, 129], 3, -1.0, 1.0, d).cast(DType::F16);
        vec![
            x.sum(&[1], false),
            x.mean(&[0], true),
            x.max(&[1], false),
            x.argmax(&[1], false),
            x.softmax(-1),
            x.reshape([5, 1, 129]).min(&[1], false),
        ]
    });
}

#[test]
fn softmax_family() {
    check("softmax", |d| {
        let x = rand_t(&[3, 17], 9, -5.0, 5.0, d);
        let big = Tensor::from_slice(&[1000.0f32, 1001.0, 999.0, -1000.0], [2, 2], d);
        // Rows longer than a workgroup, a middle axis, NaN and -inf rows, a fused producer,
        // f16 (the composition), an empty axis.
        let long = rand_t(&[2, 3, 301], 10, -5.0, 5.0, d);
        let odd = Tensor::from_slice(&[f32::NAN, 1.0, 2.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY], [2, 3], d);
        // Enough rows of 64 or more for the invocation-per-row kernel on CPU adapters,
        // along the last and a middle axis, with a NaN row and an all -inf row.
        let many = rand_t(&[2, 130, 129], 17, -5.0, 5.0, d);
        let mut special = data(260 * 64, 18, -5.0, 5.0);
        special[5 * 64 + 3] = f32::NAN;
        special[7 * 64..8 * 64].fill(f32::NEG_INFINITY);
        let special = Tensor::from_slice(&special, [260, 64], d);
        vec![
            many.softmax(-1),
            many.softmax(1),
            many.log_softmax(-1),
            special.softmax(1),
            special.log_softmax(1),
            x.softmax(-1),
            x.softmax(0),
            x.log_softmax(1),
            big.softmax(1),
            big.log_softmax(0),
            long.softmax(-1),
            long.log_softmax(1),
            odd.softmax(1),
            odd.log_softmax(1),
            (x.exp() * 0.5).softmax(0),
            x.cast(DType::F16).softmax(-1),
            // Rows of a multiple of 4 (quads on CPU adapters): f16 in, and fewer rows
            // than a workgroup.
            many.narrow(2, 0, 128).cast(DType::F16).softmax(-1),
            // ... and with a NaN row and an all -inf row.
            special.cast(DType::F16).softmax(1),
            special.cast(DType::F16).log_softmax(1),
            rand_t(&[5, 8], 19, -5.0, 5.0, d).log_softmax(-1),
            Tensor::zeros([3, 0], DType::F32, d).softmax(1),
        ]
    });
}

#[test]
fn norms_match_the_reference() {
    check_with("norms", Some(Tol { atol: 2e-5, rtol: 1e-4 }), |d| {
        let x = rand_t(&[2, 3, 300], 11, -3.0, 3.0, d);
        let w = rand_t(&[300], 12, 0.5, 1.5, d);
        let b = rand_t(&[300], 13, -0.5, 0.5, d);
        let short = rand_t(&[5, 7], 14, -1.0, 1.0, d);
        vec![
            x.layer_norm(Some(&w), Some(&b), 1e-5),
            x.rms_norm(Some(&w), 1e-6),
            (x.exp() * 0.1).layer_norm(None, Some(&b), 1e-3),
            // A mean far from zero against the spread: no variance lost to cancellation.
            (&x + 100.0).layer_norm(Some(&w), Some(&b), 1e-5),
            short.layer_norm(None, None, 1e-5),
            short.rms_norm(None, 1e-5),
            // Weight shaped [1, D]: the composition.
            short.layer_norm(Some(&rand_t(&[1, 7], 15, 0.5, 1.5, d)), None, 1e-5),
            rand_t(&[4, 1], 16, -1.0, 1.0, d).layer_norm(None, None, 1e-5),
        ]
    });
    // f16 rows of a multiple of 4 (quads on CPU adapters), fewer than a workgroup.
    check("norms in f16", |d| {
        let x = rand_t(&[3, 2, 24], 17, -3.0, 3.0, d).cast(DType::F16);
        let w = rand_t(&[24], 18, 0.5, 1.5, d).cast(DType::F16);
        let b = rand_t(&[24], 19, -0.5, 0.5, d).cast(DType::F16);
        vec![x.layer_norm(Some(&w), Some(&b), 1e-5), x.rms_norm(None, 1e-6), x.layer_norm(None, Some(&b), 1e-5)]
    });
}

#[test]
fn movement_ops() {
    check("movement", |d| {
        let x = rand_t(&[3, 5, 7], 4, -1.0, 1.0, d);
        vec![
            x.reshape([15, 7]),
            x.reshape([7, 15]).reshape([105]),
            x.permute(&[2, 0, 1]),
            x.transpose(0, 2),
            x.t(),
            x.slice(2, 1, 7, 2),
            x.slice(1, -3, 100, 1),
            x.slice(0, 2, 1, 1),
            x.narrow(1, 1, 3),
            x.unsqueeze(0).unsqueeze(-1),
            x.narrow(0, 0, 1).squeeze(0),
            Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3, 1], d).broadcast_to([2, 3, 4]),
            x.pad(&[(1, 0), (0, 2), (3, 1)], -9.0),
            x.flatten(),
        ]
    });
}

#[test]
fn concat_stack_and_indexing() {
    check("concat", |d| {
        let a = rand_t(&[2, 3], 1, -1.0, 1.0, d);
        let b = rand_t(&[2, 5], 2, -1.0, 1.0, d);
        let c = rand_t(&[2, 1], 3, -1.0, 1.0, d);
        let e = rand_t(&[2, 0], 3, -1.0, 1.0, d);
        vec![
            Tensor::concat(&[a.clone(), b.clone(), c.clone()], 1),
            Tensor::concat(&[a.clone(), e.clone(), a.exp()], -1),
            Tensor::concat(&[a.t(), b.t()], 0),
            Tensor::stack(&[a.clone(), a.neg(), a.exp()], 0),
            Tensor::stack(&[a.clone(), a.neg()], 2),
        ]
    });
    // Outermost-axis concatenations large enough to span several chunks of the CPU
    // backend (its contiguous fast path), with odd sizes and a fused input.
    check("concat outer", |d| {
        let a = rand_t(&[70_001], 4, -1.0, 1.0, d);
        let b = rand_t(&[3, 33_333], 5, -1.0, 1.0, d);
        let c = rand_t(&[1, 2, 50_000], 6, -1.0, 1.0, d);
        let e = rand_t(&[1, 3, 50_000], 7, -1.0, 1.0, d);
        vec![
            Tensor::concat(&[a.clone(), b.reshape([99_999]), a.exp()], 0),
            Tensor::concat(&[c.clone(), e.clone(), c.neg()], 1),
            Tensor::concat(&[b.clone(), b.t().reshape([3, 33_333])], 0),
        ]
    });
    check("index", |d| {
        let x = rand_t(&[4, 6], 5, -1.0, 1.0, d);
        let idx = Tensor::from_slice(&[3i32, 0, 0, 2, 1], [5], d);
        let uidx = Tensor::from_slice(&[5u32, 1], [2], d);
        let g = Tensor::from_slice(&[0i32, 3, 1, 2, 2, 0, 3, 1], [2, 4], d);
        let g1 = Tensor::from_slice(&[5i32, 0, 1, 4, 4, 4], [3, 2], d);
        vec![
            x.index_select(0, &idx),
            x.index_select(1, &uidx),
            x.gather(0, &g),
            x.gather(1, &g1),
            x.index_select(0, &idx).relu().sum(&[1], false),
        ]
    });
}

/// Whole quads read at their own index run the vec4 element-wise kernel (one vector load
/// per input, one vector store): every dtype in and out, scalars, `arange` and `rand`
/// lanes, and lengths of 4, 12 and 4,100 beside 4,099 (the scalar kernel). On CPU
/// adapters, 32-bit values move eight at a time (wide loads) at lengths of 16 and 4,104.
#[test]
fn whole_quads_every_dtype() {
    for n in [4usize, 12, 16, 4100, 4104, 4099] {
        check(&format!("quads n={n}"), |d| {
            let x = rand_t(&[n], 21, -3.0, 3.0, d);
            let y = rand_t(&[n], 22, -3.0, 3.0, d);
            let h = y.cast(DType::F16);
            let i = (&x * 10.0).cast(DType::I32);
            let u = (x.abs() * 10.0).cast(DType::U32);
            let m = x.gt(&y);
            vec![
                ((&x * 2.0 + 1.0).exp().tanh() * &x).relu(),
                (h.exp() * 0.5 + &h).cast(DType::F16),
                h.cast(DType::F32) * &x,
                &i * &i - 3.0,
                &u + &u,
                m.logical_not(),
                Tensor::where_(&m, &x, &h.cast(DType::F32)),
                x.lt(&h.cast(DType::F32)),
                Tensor::arange(0.0, n as f64, 1.0, DType::F32, d) * &x,
                x.cast(DType::F16),
                i.cast(DType::F32),
                m.cast(DType::F32) + &x,
            ]
        });
    }
}

/// Rows repeated over leading axes (a bias) are read a quad at a time too (eight at a time
/// with wide loads, where the row is a multiple of 8 long).
#[test]
fn whole_quads_with_broadcast_rows() {
    check("quads with rows", |d| {
        let x = rand_t(&[33, 12], 23, -3.0, 3.0, d);
        let b = rand_t(&[12], 24, -1.0, 1.0, d);
        let y = rand_t(&[5, 3, 8], 25, -3.0, 3.0, d);
        let c = rand_t(&[3, 8], 26, -1.0, 1.0, d);
        let odd = rand_t(&[4, 6], 27, -1.0, 1.0, d);
        let col = rand_t(&[33, 1], 28, -1.0, 1.0, d);
        let z = rand_t(&[9, 16], 30, -3.0, 3.0, d);
        let r16 = rand_t(&[16], 31, -1.0, 1.0, d);
        vec![
            (&z * &r16).tanh() - &r16,
            (&z.cast(DType::I32) + &r16.cast(DType::I32)).cast(DType::F32),
            z.gt(&r16),
            (&x + &b).relu(),
            (&x * &b.reshape([1, 12])).gelu() + &b,
            &y * &c - &c.exp(),
            (&y.cast(DType::F16) + &c.cast(DType::F16)).cast(DType::F32),
            (&y.cast(DType::I32) + &c.cast(DType::I32)) * 2.0,
            &odd + &rand_t(&[6], 29, -1.0, 1.0, d),
            &x + &col,
            &x + &b + &col,
        ]
    });
}

/// Expressions whose index arithmetic the vector kernels cannot avoid, over an innermost
/// axis a multiple of 4 long, evaluate four lanes per invocation (the run kernel): the
/// windows of a convolution at every stride, padding and dilation, as they are and
/// reshaped to columns (whose innermost axis splits by a width that is, and one that is
/// not, a multiple of 4), of a stored image and of an expression, with a padding value;
/// permutes that move the innermost axis; slices; broadcast columns; gathers along the
/// innermost axis; every 32-bit dtype, and f16 beside them.
#[test]
fn runs_of_four_lanes_match_the_reference() {
    use tessera::graph::Window;
    let win = |k: usize, s: usize, p: usize, dil: usize| Window {
        kernel: (k, k),
        stride: (s, s),
        padding: (p, p),
        dilation: (dil, dil),
    };
    check("runs", |d| {
        let img = rand_t(&[2, 3, 12, 16], 41, -2.0, 2.0, d);
        let narrow = rand_t(&[2, 3, 10, 8], 42, -2.0, 2.0, d);
        let x = rand_t(&[6, 8, 12], 43, -2.0, 2.0, d);
        let idx = ((rand_t(&[8], 44, 0.0, 1.0, d) * 11.99).floor()).cast(DType::I32);
        let i = (&x * 10.0).cast(DType::I32);
        let xt = x.permute(&[0, 2, 1]);
        vec![
            img.im2col(win(3, 1, 1, 1), 0.0),
            img.im2col(win(3, 1, 1, 1), 0.0).reshape([2, 27, 192]),
            img.im2col(win(3, 2, 1, 1), -1.5),
            img.im2col(win(3, 2, 1, 1), -1.5).reshape([2, 3, 9, 48]),
            img.im2col(win(2, 1, 2, 2), 0.5).reshape([2, 12, 252]),
            narrow.im2col(win(3, 1, 0, 1), 0.0).reshape([2, 27, 48]),
            (&img * 2.0 + 1.0).relu().im2col(win(3, 1, 1, 1), 0.0).reshape([2, 27, 192]),
            xt.exp(),
            x.reshape([6, 8, 3, 4]).permute(&[2, 1, 0, 3]) * 3.0,
            x.narrow(2, 1, 8) - &x.narrow(2, 0, 8),
            &x + &x.narrow(2, 5, 1),
            x.index_select(2, &idx) * 2.0,
            i.permute(&[0, 2, 1]) + 1.0,
            (x.abs() * 10.0).cast(DType::U32).permute(&[0, 2, 1]),
            x.reshape([6, 12, 8]).gt(&xt),
            xt.cast(DType::F16),
        ]
    });
    // Ragged runs: rows whose length is not a multiple of 4 (14, 7, 11, 13), the last
    // run of each row partly past its end.
    check("ragged runs", |d| {
        let img = rand_t(&[2, 3, 12, 14], 47, -2.0, 2.0, d);
        let x = rand_t(&[6, 8, 13], 48, -2.0, 2.0, d);
        let b = rand_t(&[6, 1, 1], 49, -1.0, 1.0, d);
        vec![
            img.im2col(win(3, 1, 1, 1), 0.0),
            img.im2col(win(3, 2, 1, 1), -1.5).reshape([2, 27, 42]),
            img.im2col(win(2, 1, 2, 2), 0.5) * 2.0,
            x.narrow(2, 1, 11).exp(),
            x.permute(&[1, 0, 2]) + &x.narrow(0, 0, 1).permute(&[1, 0, 2]),
            (&x + &b).relu(),
            x.narrow(1, 0, 7).permute(&[0, 2, 1]).cast(DType::I32),
        ]
    });
    check("ragged runs of siblings", |d| {
        let x = rand_t(&[6, 8, 13], 50, -2.0, 2.0, d);
        let b = rand_t(&[6, 1, 1], 51, -1.0, 1.0, d);
        vec![(&x + &b).exp(), &x * &b, x.gt(&b)]
    });
    // Siblings (outputs of one shape reading one input) share the runs.
    check("runs of siblings", |d| {
        let img = rand_t(&[2, 3, 12, 16], 45, -2.0, 2.0, d);
        let x = rand_t(&[6, 8, 12], 46, -2.0, 2.0, d);
        let xt = x.permute(&[0, 2, 1]);
        vec![
            img.im2col(win(3, 1, 1, 1), 0.0).reshape([2, 27, 192]),
            img.im2col(win(3, 1, 1, 1), 0.5).reshape([2, 27, 192]) * 2.0,
            xt.exp(),
            &xt * 2.0,
            xt.lt(&(&xt * 2.0)),
            (&xt * 10.0).cast(DType::I32),
        ]
    });
}

/// i32, u32 and bool tensors of `n` values from one seed (ints in [-50, 50], their
/// absolute values, and whether each is positive).
fn int_inputs(n: usize, seed: u64, d: &Device) -> (Tensor, Tensor, Tensor) {
    let ints: Vec<i32> = data(n, seed, -50.0, 50.0).iter().map(|v| *v as i32).collect();
    let i = Tensor::from_slice(&ints, [n], d);
    let u = Tensor::from_slice(&ints.iter().map(|v| v.unsigned_abs()).collect::<Vec<u32>>(), [n], d);
    let m = Tensor::from_slice(&ints.iter().map(|v| u32::from(*v > 0)).collect::<Vec<u32>>(), [n], d).cast(DType::Bool);
    (i, u, m)
}

/// `outputs(d, n)` checked as one kernel and each output alone, at lengths that are a
/// multiple of 8, of 4 only, and neither.
fn check_lengths(what: &str, outputs: impl Fn(&Device, usize) -> Vec<Tensor>) {
    for n in [8usize, 16, 4104, 4100, 4099] {
        check(&format!("{what} n={n}, one kernel"), |d| outputs(d, n));
        for k in 0..outputs(&Device::reference(), n).len() {
            check(&format!("{what} n={n}, output {k} alone"), |d| vec![outputs(d, n).swap_remove(k)]);
        }
    }
}

/// On CPU adapters with 64-bit integers, 32-bit values move eight per storage access
/// (`vec4<u64>`, wide loads): each 32-bit dtype in and out, a bias row of 16 and a row
/// of 12 (quads), several outputs in one kernel, and lengths that are a multiple of 8,
/// of 4 only, and neither. Each output also runs alone, as a single-output kernel.
#[test]
fn wide_loads_every_32_bit_dtype() {
    let outputs = |d: &Device, n: usize| {
        let x = rand_t(&[n], 41, -3.0, 3.0, d);
        let y = rand_t(&[n], 42, -3.0, 3.0, d);
        let (i, u, m) = int_inputs(n, 43, d);
        vec![
            ((&x * 2.0 + 1.0).exp().tanh() * &x).relu(),
            &i * &i - 3.0,
            (&u + &u) * 3.0,
            m.logical_not(),
            Tensor::where_(&m, &x, &y),
            x.lt(&y),
            i.cast(DType::F32) + &x,
            m.cast(DType::F32) - &y,
            Tensor::arange(0.0, n as f64, 1.0, DType::F32, d) * &x,
            (&x * 4.0).cast(DType::I32) + &i,
        ]
    };
    check_lengths("wide loads", outputs);
    check("wide loads, repeated rows", |d| {
        let z = rand_t(&[9, 16], 44, -3.0, 3.0, d);
        let r16 = rand_t(&[16], 45, -1.0, 1.0, d);
        let w = rand_t(&[6, 12], 46, -3.0, 3.0, d);
        let r12 = rand_t(&[12], 47, -1.0, 1.0, d);
        let ri = Tensor::from_slice(&(0..16).map(|v| v - 8).collect::<Vec<i32>>(), [16], d);
        vec![(&z * &r16).tanh() - &r16, (&z * 4.0).cast(DType::I32) + &ri, z.gt(&r16), &w * &r12]
    });
}

/// On the same adapters, expressions with a transcendental (and no relu or log) load
/// quads and store eight 32-bit values as one `vec4<u64>` (wide stores): inputs of every
/// dtype (f16 as packed pairs), 32-bit outputs of each kind, repeated rows of 4 and 12
/// (whole quads, not whole eights), several outputs in one kernel, and lengths that are
/// a multiple of 8, of 4 only, and neither. On hosts without AVX-512
/// (`ShaderCaps::no_avx512`) the expressions with only 32-bit inputs in whole eights
/// load wide instead, and the f16 inputs and rows of 4 and 12 keep wide stores.
#[test]
fn wide_stores_every_input_dtype() {
    let outputs = |d: &Device, n: usize| {
        let x = rand_t(&[n], 51, -3.0, 3.0, d);
        let y = rand_t(&[n], 52, -3.0, 3.0, d);
        let h = rand_t(&[n], 53, -3.0, 3.0, d).cast(DType::F16);
        let (i, u, m) = int_inputs(n, 54, d);
        vec![
            x.exp() * &y,
            (h.cast(DType::F32) * 2.0).tanh(),
            (i.cast(DType::F32) * 0.1).sigmoid() + u.cast(DType::F32),
            Tensor::where_(&m, &x.exp(), &y),
            (x.tanh() * 40.0).cast(DType::I32),
            (x.tanh() * 40.0).cast(DType::U32),
            x.exp().gt(&y),
            x.silu() - &h.cast(DType::F32),
        ]
    };
    check_lengths("wide stores", outputs);
    check("wide stores, repeated rows", |d| {
        let z = rand_t(&[10, 4], 55, -3.0, 3.0, d);
        let r4 = rand_t(&[4], 56, -1.0, 1.0, d);
        let w = rand_t(&[6, 12], 57, -3.0, 3.0, d);
        let r12 = rand_t(&[12], 58, -1.0, 1.0, d);
        let h12 = rand_t(&[12], 59, -1.0, 1.0, d).cast(DType::F16);
        vec![(&z * &r4).exp(), (&w * &r12).tanh() - &r12, (&w + &h12.cast(DType::F32)).sigmoid(), &z + &r4]
    });
}

#[test]
fn fused_chains_of_movement_and_elementwise() {
    check("chains", |d| {
        let x = rand_t(&[4, 6], 6, -1.0, 1.0, d);
        let y = rand_t(&[6], 7, -1.0, 1.0, d);
        let p = x.permute(&[1, 0]).slice(0, 1, 6, 2).pad(&[(1, 1), (0, 0)], 0.5);
        let q = Tensor::concat(&[x.exp(), x.t().reshape([4, 6])], 0);
        vec![
            (&p * 3.0).tanh(),
            (&q + &y).relu().sum(&[0], false),
            x.add(&y).mul(&x).sub(&y.exp()).gelu().sigmoid(),
            x.index_select(1, &Tensor::from_slice(&[5i32, 0], [2], d)).pad(&[(0, 0), (1, 1)], 0.0) * 2.0,
        ]
    });
    // Larger than one CPU chunk: an expression broadcast along the innermost axis and
    // along a middle one, read in order (each value computed once for its copies) and
    // through a gather of rows out of order (once per stretch that repeats it).
    check("broadcast expressions", |d| {
        let x = rand_t(&[1500, 5, 3], 8, -1.0, 1.0, d);
        let col = x.narrow(2, 1, 1).exp() * 0.5; // [1500, 5, 1], an expression
        let row = x.narrow(1, 2, 1).tanh(); // [1500, 1, 3]
        let e = &x * &col.broadcast_to([1500, 5, 3]) + &row.broadcast_to([1500, 5, 3]);
        let rev: Vec<i32> = (0..1500).map(|i| (i * 7919) % 1500).collect();
        let g = e.index_select(0, &Tensor::from_slice(&rev, [1500], d));
        // A broadcast innermost axis of 3 read from ranges that start inside it: a sum
        // over the leading axis takes outputs in blocks of 2048.
        let y = rand_t(&[4, 1000, 3], 9, -1.0, 1.0, d);
        let ycol = y.narrow(2, 0, 1).exp();
        let cols = (&y * &ycol.broadcast_to([4, 1000, 3])).sum(&[0], false);
        vec![(&e * 2.0).sum(&[2], false), g.sum(&[1], false), g.pad(&[(0, 0), (1, 0), (0, 2)], -1.0), cols]
    });
    // Over several CPU chunks: a nearest-neighbour resize of an expression (each value
    // read twice along both axes; the CPU computes the span once and picks from it), a
    // gather of it, and strided convolution and pooling windows over a buffer and over
    // an expression (stretches stepping by the stride; spans picked from up to a stride
    // of 4, a list past it), and pooling windows up to 7x7.
    check("resized expressions and strided windows", |d| {
        let x = rand_t(&[2, 3, 37, 45], 10, -1.0, 1.0, d);
        let e = (&x * 2.0 + 1.0).relu() * &x;
        let rows: Vec<i32> = (0..74).map(|i| i / 2).collect();
        let cols: Vec<i32> = (0..90).map(|i| i / 2).collect();
        let up =
            e.index_select(2, &Tensor::from_slice(&rows, [74], d)).index_select(3, &Tensor::from_slice(&cols, [90], d));
        let gi: Vec<i32> = (0..2 * 3 * 37 * 45).map(|i: i32| (i * 7) % 45 / 3).collect();
        let g = e.gather(3, &Tensor::from_slice(&gi, [2, 3, 37, 45], d));
        let w = rand_t(&[3, 1, 3, 3], 11, -1.0, 1.0, d);
        let o = Conv2dOptions { stride: (2, 3), padding: (1, 2), dilation: (1, 1), groups: 3 };
        let wd = rand_t(&[4, 3, 3, 3], 12, -1.0, 1.0, d);
        let od = Conv2dOptions { stride: (2, 2), padding: (1, 1), dilation: (2, 1), groups: 1 };
        vec![
            up * 1.5,
            g,
            x.conv2d(&w, None, o),
            e.conv2d(&w, None, o),
            x.conv2d(&wd, None, od),
            e.conv2d(&wd, None, od),
            e.max_pool2d(3, 2, 1),
            e.avg_pool2d(3, 2, 1),
            e.max_pool2d(3, 5, 1),
            // Windows of 25 and 49 taps (unrolled reductions on wgpu).
            e.max_pool2d(5, 1, 2),
            e.avg_pool2d(7, 3, 3),
        ]
    });
}

#[test]
fn head_splits_read_by_quads() {
    // A permute that keeps the innermost axis (a multiple of 4) under whole quads: the
    // vec4 kernel loads each quad of the permute's input (BERT's head split and merge,
    // with its bias and an f16 cast); odd heads and a moved innermost axis for contrast.
    check("head splits", |d| {
        let (b, s, h, hd) = (3, 5, 4, 8);
        let x = rand_t(&[b, s, h * hd], 11, -1.0, 1.0, d);
        let bias = rand_t(&[h * hd], 12, -1.0, 1.0, d);
        let split = |t: &Tensor| t.reshape([b, s, h, hd]).permute(&[0, 2, 1, 3]);
        let heads = split(&(&x + &bias));
        vec![
            heads.clone(),
            (split(&x) * 2.0).exp().cast(DType::F16),
            heads.permute(&[0, 2, 1, 3]).reshape([b, s, h * hd]) + 1.0,
            (split(&(&x * &bias)) - split(&x.exp())).tanh(),
            x.reshape([b, s, 16, 2]).permute(&[0, 2, 1, 3]).relu(),
            x.reshape([b, s, h, hd]).permute(&[0, 3, 1, 2]).neg(),
            x.reshape([b * s, h * hd]).permute(&[1, 0]).reshape([h * hd, b, s]).permute(&[1, 2, 0]) * 3.0,
            // Five axes, one of size 1, three reordered (quads unravelled axis by axis).
            x.reshape([1, b, s, h, hd]).permute(&[0, 3, 2, 1, 4]) * 0.5,
        ]
    });
}

#[test]
fn gathered_rows_read_by_quads() {
    // Rows gathered along an outer axis, innermost axis a multiple of 4: the quad kernel
    // reads one table quad per output quad (BERT's embeddings: three lookups, one
    // broadcast over the batch; a lookup times a tensor at its own index; the middle
    // axis of a 3-D table; ids computed in the kernel). For contrast, rows of 6 and a
    // gather along the innermost axis (the scalar kernel).
    check("gathered quads", |d| {
        let (b, s, h) = (3, 5, 12);
        let word = rand_t(&[50, h], 31, -1.0, 1.0, d);
        let pos = rand_t(&[8, h], 32, -1.0, 1.0, d);
        let tt = rand_t(&[2, h], 33, -1.0, 1.0, d);
        let ids: Vec<i32> = (0..b * s).map(|k| ((k * 17 + 3) % 49) as i32).collect();
        let ids = Tensor::from_slice(&ids, [b, s], d);
        let types = Tensor::zeros([b, s], DType::I32, d);
        let p = Tensor::arange(0.0, s as f64, 1.0, DType::I32, d);
        let emb = |t: &Tensor, i: &Tensor| {
            let mut shape = i.dims().to_vec();
            shape.push(t.dims()[1]);
            t.index_select(0, &i.flatten()).reshape(shape)
        };
        let x = rand_t(&[b, s, h], 34, -1.0, 1.0, d);
        let cube = rand_t(&[4, 7, 8], 35, -1.0, 1.0, d);
        let narrow = rand_t(&[50, 6], 36, -1.0, 1.0, d);
        vec![
            emb(&word, &ids) + emb(&pos, &p) + emb(&tt, &types),
            emb(&word, &ids) * &x - emb(&tt, &types),
            cube.index_select(1, &Tensor::from_slice(&[6i32, 0, 0, 3], [4], d)),
            emb(&word, &(&ids + &Tensor::ones([b, s], DType::I32, d))),
            emb(&narrow, &ids),
            word.index_select(1, &Tensor::from_slice(&[3i32, 1], [2], d)),
        ]
    });
}

#[test]
fn sibling_outputs_in_one_kernel() {
    // Element-wise results of one shape realised together share a kernel on a GPU
    // (over whole quads or element by element): every dtype in and out, a result read
    // by another, repeated rows, odd lengths.
    check("siblings", |d| {
        let mut out = Vec::new();
        for n in [12usize, 16, 4100, 4104, 4099] {
            let x = rand_t(&[n], n as u64, -1.0, 1.0, d);
            let y = rand_t(&[n], n as u64 + 1, -1.0, 1.0, d);
            let a = (&x * 2.0 + &y).tanh();
            let b = &a * &y - 1.0;
            out.extend([a.clone(), b.clone(), (&b * &x).exp(), x.gt(&y), (&x * 8.0).cast(DType::I32)]);
            out.extend([(&x + &y).cast(DType::F16), (&x - &y).cast(DType::F16)]);
        }
        let m = rand_t(&[6, 8], 7, -1.0, 1.0, d);
        let row = rand_t(&[8], 8, -1.0, 1.0, d);
        out.extend([&m + &row, (&m * &row).relu(), (&m - &row).abs()]);
        out
    });
}

/// On CPU adapters with subgroups and 64-bit integers, f32 products whose A is [M, K]
/// with K % 8 == 0 load 8 values at a time (`matmul_direct_wide.wgsl`): B as [K, N] with
/// N % 8 == 0 or as [N, K]; rows past whole tiles, column blocks with idle lanes,
/// batches, one k-step and many, and epilogues. With operand textures, products past 24
/// rows whose columns suit take 16 columns per lane (`matmul::wide_cols`): the batches
/// of 130 and 33 rows (72 columns: the second block of 8 past N), the 256 and 129 rows
/// against B^T, the broadcast B^T of 96 columns, and the epilogues over 1,000 rows (one
/// stored by quads, one parked by rows for a bias that varies over rows).
#[test]
fn wide_matmul_shapes() {
    let cases: [(&[usize], &[usize], bool); 12] = [
        (&[2, 130, 16], &[16, 72], false),
        (&[1000, 8], &[8, 64], false),
        (&[256, 24], &[80, 24], true),
        (&[24, 16], &[16, 40], false),
        (&[2, 33, 64], &[64, 72], false),
        (&[70, 8], &[8, 264], false),
        (&[100, 256], &[256, 136], false),
        (&[20, 24], &[100, 24], true),
        (&[129, 32], &[200, 32], true),
        (&[3, 17, 16], &[3, 40, 16], true),
        (&[9, 8], &[30, 8], true),
        (&[2, 45, 40], &[1, 96, 40], true),
    ];
    for (k, (a, b, trans_b)) in cases.iter().enumerate() {
        let kd = a[a.len() - 1];
        check_with(
            &format!("wide matmul {a:?} @ {b:?}{}", if *trans_b { "^T" } else { "" }),
            Some(Tol::for_dtype(DType::F32).scaled(kd)),
            |d| {
                let x = rand_t(a, 60 + k as u64, -1.0, 1.0, d);
                let y = rand_t(b, 80 + k as u64, -1.0, 1.0, d);
                let y = if *trans_b { y.transpose(-1, -2) } else { y };
                vec![x.matmul(&y)]
            },
        );
    }
    check_with("wide matmul epilogues", Some(Tol { atol: 1e-4, rtol: 1e-5 }), |d| {
        let x = rand_t(&[24, 16], 90, -1.0, 1.0, d);
        let w = rand_t(&[48, 16], 91, -1.0, 1.0, d);
        let bias = rand_t(&[48], 92, -1.0, 1.0, d);
        let res = rand_t(&[24, 48], 93, -1.0, 1.0, d);
        let tall = rand_t(&[1000, 16], 95, -1.0, 1.0, d);
        let (w2, bias2) = (rand_t(&[72, 16], 96, -1.0, 1.0, d), rand_t(&[72], 97, -1.0, 1.0, d));
        let per_row = rand_t(&[1000, 1], 98, -1.0, 1.0, d);
        vec![
            (x.matmul(&w.t()) + &bias).gelu() + &res,
            x.matmul(&rand_t(&[16, 48], 94, -1.0, 1.0, d)).relu() * 2.0,
            (tall.matmul(&w2.t()) + &bias2).gelu(),
            (tall.matmul(&w2.t()) + &per_row).relu(),
        ]
    });
}

/// On CPU adapters the wide matmul reads its operands from textures
/// (`ShaderCaps::texture_rows`), or from storage buffers with
/// `DeviceOptions::texture_operands` off: both against the reference, each with the kernel
/// the profiler names. Operands within one texture row, over whole rows and a partial
/// one (1,024 texels a row: A of 1,000 x 8 holds one row and 976 texels, of 100 x 256
/// six rows and 256), a batched A, a batched B^T read at per-batch offsets, and an
/// epilogue.
/// `build` on the reference and on `dev`, every output compared at `tol`; returns the
/// labels of the kernels the profiler heard while `dev` ran (it hears every test running
/// at once, so callers pick out their own).
fn check_profiled(name: &str, dev: &Device, tol: Tol, build: impl Fn(&Device) -> Vec<Tensor>) -> Vec<String> {
    let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
    tessera::profile::start();
    let got = tessera::read_all_blocking(&build(dev));
    let labels: Vec<String> = tessera::profile::stop().into_iter().map(|k| k.label).collect();
    let got = got.unwrap_or_else(|e| panic!("{name}: {e}"));
    for (o, (g, w)) in got.iter().zip(&want).enumerate() {
        common::assert_close(&format!("{name}, output {o}"), g, w, tol);
    }
    labels
}

/// The copies of operands realised before a submit are kept for later submits (the pool's
/// texture cache): copied once, dropped when their tensor's buffer is written in place
/// (`scatter_rows`) or dropped.
fn texture_cache_keeps_copies_until_written_or_dropped(dev: &Device) {
    let tol = Tol::for_dtype(DType::F32).scaled(32);
    let in_use = dev.stats().bytes_in_use;
    let x = rand_t(&[64, 32], 11, -1.0, 1.0, dev);
    let w = rand_t(&[48, 32], 12, -1.0, 1.0, dev);
    tessera::read_all_blocking(&[x.clone(), w.clone()]).unwrap();
    let product = |x: &Tensor, w: &Tensor| {
        let before = dev.stats().operand_copies;
        let got = x.matmul(&w.t()).to_f64_vec_blocking().unwrap();
        (got, dev.stats().operand_copies - before)
    };
    let (xs, ws) = (x.to_vec_blocking::<f32>().unwrap(), w.to_vec_blocking::<f32>().unwrap());
    let want = |ws: &[f32]| {
        let r = Device::reference();
        let (x, w) = (Tensor::from_slice(&xs, [64, 32], &r), Tensor::from_slice(ws, [48, 32], &r));
        x.matmul(&w.t()).to_f64_vec_blocking().unwrap()
    };
    let (first, copies) = product(&x, &w);
    assert_eq!(copies, 2, "the first product copies x and w");
    let (again, copies) = product(&x, &w);
    assert_eq!(copies, 0, "a second product reads the kept copies");
    assert_eq!(first, again);
    common::assert_close("product from kept copies", &again, &want(&ws), tol);
    // Rows 3 and 40 of w rewritten in place: w's kept copy is stale and must go.
    let rows = Tensor::from_slice(&[3i32, 40], [2], dev);
    let src = rand_t(&[2, 32], 13, -1.0, 1.0, dev);
    let w2 = w.scatter_rows(&rows, &src);
    w2.realize_blocking().unwrap();
    let ws2 = w2.to_vec_blocking::<f32>().unwrap();
    assert_ne!(ws, ws2);
    let (after, copies) = product(&x, &w2);
    assert_eq!(copies, 1, "after an in-place write, w is copied again (x is kept)");
    common::assert_close("product after an in-place write", &after, &want(&ws2), tol);
    // Dropping the tensors releases their kept copies.
    drop((x, w2, rows, src));
    assert_eq!(dev.stats().bytes_in_use, in_use, "bytes in use once the tensors are dropped");
}

#[test]
fn wide_matmul_from_textures_and_buffers() {
    // Operands and epilogue leaves (a bias and a residual) from textures or buffers, and
    // one tensor as both operands (two copies of it in one kernel).
    use common::private_gpu;
    let cases: [(&[usize], &[usize], bool); 5] = [
        (&[1000, 8], &[8, 64], false),
        (&[100, 256], &[256, 136], false),
        (&[2, 130, 16], &[16, 72], false),
        (&[3, 17, 16], &[3, 40, 16], true),
        (&[129, 32], &[200, 32], true),
    ];
    for textures in [true, false] {
        let opts = tessera::DeviceOptions { texture_operands: Some(textures), ..Default::default() };
        let Some(dev) = private_gpu(opts) else { return };
        let cpu_adapter = dev.info().device_type == "Cpu" && dev.capabilities().subgroups;
        let expect = match (cpu_adapter, textures) {
            (false, _) => None,
            (true, true) => Some("matmul_direct8tex_f32"),
            (true, false) => Some("matmul_direct8sg_f32"),
        };
        // From textures, the batch of 130 rows and the 129 rows against B^T take 16
        // columns per lane (`matmul::wide_cols`, label `_c16`).
        let two_blocks = cpu_adapter && textures;
        if cpu_adapter && textures {
            // One realisation copies each operand into a texture once: x for x @ w1^T,
            // x @ w2^T and as A of x @ x^T, a second x as its B, w1 and w2 (6 unshared).
            let operands = |d: &Device| {
                [(&[64, 32], 1), (&[48, 32], 2), (&[40, 32], 3)].map(|(s, seed)| rand_t(s, seed, -1.0, 1.0, d))
            };
            let products = |[x, w1, w2]: [Tensor; 3]| [x.matmul(&w1.t()), x.matmul(&w2.t()), x.matmul(&x.t())];
            let ops = operands(&dev);
            tessera::read_all_blocking(&ops).unwrap();
            let before = dev.stats().operand_copies;
            let got = tessera::read_all_blocking(&products(ops)).unwrap();
            assert_eq!(dev.stats().operand_copies - before, 4, "operand copies for three products of x");
            let want = tessera::read_all_blocking(&products(operands(&Device::reference()))).unwrap();
            for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                let tol = Tol::for_dtype(DType::F32).scaled(32);
                common::assert_close(&format!("shared operand copies, output {o}"), g, w, tol);
            }
            texture_cache_keeps_copies_until_written_or_dropped(&dev);
        }
        for (k, (a, b, trans_b)) in cases.iter().enumerate() {
            let build = |d: &Device| {
                let x = rand_t(a, 160 + k as u64, -1.0, 1.0, d);
                let y = rand_t(b, 180 + k as u64, -1.0, 1.0, d);
                let y = if *trans_b { y.transpose(-1, -2) } else { y };
                let n = b[if *trans_b { b.len() - 2 } else { b.len() - 1 }];
                let bias = rand_t(&[n], 200 + k as u64, -1.0, 1.0, d);
                let res = rand_t(x.matmul(&y).dims(), 220 + k as u64, -1.0, 1.0, d);
                // (x @ x^T binds one tensor as A, sampled, and as B, read as storage.)
                vec![x.matmul(&y), (x.matmul(&y) + &bias).gelu() + &res, x.matmul(&x.transpose(-1, -2))]
            };
            let name = format!("wide matmul {a:?} @ {b:?}, textures {textures}");
            let labels = check_profiled(&name, &dev, Tol::for_dtype(DType::F32).scaled(a[a.len() - 1]), build);
            if let Some(l) = expect {
                let ran = labels.iter().filter(|x| x.starts_with(l)).count();
                assert!(ran >= 1, "{name}: expected a kernel named {l}: {labels:?}");
                // The epilogue's bias and residual come from textures too.
                let epilogue =
                    labels.iter().any(|x| x.starts_with(l) && x.contains("_epi(") && x.contains(")_tex") == textures);
                assert!(
                    epilogue,
                    "{name}: expected an epilogue {} textures: {labels:?}",
                    ["without", "reading"][textures as usize]
                );
                if two_blocks && [2, 4].contains(&k) {
                    assert!(labels.iter().any(|x| x.starts_with(l) && x.contains("_c16")), "{name}: {labels:?}");
                }
            }
        }
    }
}

#[test]
fn products_after_the_warm_rows_compile_no_kernel() {
    // `matmul::warm_rows` gives the row counts whose products reach every slowly compiled
    // tile (128: the wide kernel's 16 columns per lane at 32 rows): a product run at each
    // has compiled every kernel a larger product takes, so a server that runs them at
    // load never makes a large batch wait for a compile. Counts past them, against the
    // engine's compile counter, for products whose columns take 16 per lane and 8. A
    // private device: another test's products would not change the count, but its own
    // pipelines would.
    use common::private_gpu;
    let Some(dev) = private_gpu(tessera::DeviceOptions::default()) else { return };
    let (k, most) = (64, 1100);
    // 136 columns take 8 per lane, 120 take 16.
    let ws = [136, 120].map(|n| rand_t(&[n, k], 240 + n as u64, -1.0, 1.0, &dev));
    let run = |m: usize| {
        let x = rand_t(&[m, k], m as u64, -1.0, 1.0, &dev);
        for w in &ws {
            (x.matmul(&w.transpose(0, 1)) + 1.0).realize_blocking().unwrap_or_else(|e| panic!("{m} rows: {e}"));
        }
    };
    let warm = tessera::kernels::matmul::warm_rows(most);
    assert_eq!(warm, [128]);
    for m in warm {
        run(m);
    }
    let before = dev.stats().pipelines_compiled;
    for m in [129, 130, 150, 177, 200, 257, 333, 500, 640, 704, 768, 1000, most] {
        run(m);
        let compiled = dev.stats().pipelines_compiled - before;
        assert_eq!(compiled, 0, "{m} rows compiled {compiled} kernels after the warm rows");
    }
}

#[test]
fn elementwise_from_textures_and_buffers() {
    // On CPU adapters with wide loads on a host without AVX-512, fused element-wise
    // kernels read their f32 inputs as texels (`Form::TexelsIn`, labels ending `_tex`)
    // unless told not to; other dtypes still load from buffers. Both paths against the
    // reference: one texture row and several ending in a partial one, a repeated row, an
    // i32 input beside texels, and two outputs from one kernel.
    use common::private_gpu;
    let host_avx512 = common::host_has_avx512();
    for textures in [true, false] {
        let opts = tessera::DeviceOptions { texture_operands: Some(textures), ..Default::default() };
        let Some(dev) = private_gpu(opts) else { return };
        let cpu_adapter = dev.info().device_type == "Cpu" && dev.capabilities().subgroups;
        // The chain alone (a one-output kernel), then three outputs in one kernel.
        for (k, (dims, set)) in
            [([8usize, 72], 0), ([9, 1000], 0), ([8, 72], 1), ([9, 1000], 1)].into_iter().enumerate()
        {
            let build = |d: &Device| {
                let x = rand_t(&dims, 300 + k as u64, -2.0, 2.0, d);
                let y = rand_t(&dims, 310 + k as u64, -2.0, 2.0, d);
                let row = rand_t(&dims[1..], 320 + k as u64, -1.0, 1.0, d);
                let ints: Vec<i32> = (0..dims[0] * dims[1]).map(|i| (i % 7) as i32 - 3).collect();
                let i = Tensor::from_slice(&ints, dims, d);
                let chain = (((&x * 2.0) + 1.0).exp().tanh() * &x).relu();
                let (a, b) = ((&x * &row) + &y, (x.exp() - &y) * i.cast(DType::F32));
                match set {
                    0 => vec![chain],
                    _ => vec![chain, a, b],
                }
            };
            let name = format!("element-wise over {dims:?}, outputs of set {set}, textures {textures}");
            let labels = check_profiled(&name, &dev, Tol::for_dtype(DType::F32), build);
            // (The scheduler fuses the three outputs into one kernel. The profiler hears
            // every test running at once: only this test's shapes count.)
            let shape = format!(" {dims:?}");
            let fused: Vec<&String> = labels
                .iter()
                .filter(|l| (l.starts_with("fused") || l.starts_with("multi")) && l.ends_with(&shape))
                .collect();
            let tex = fused.iter().filter(|l| l.contains("_tex")).count();
            if !textures || !cpu_adapter {
                assert_eq!(tex, 0, "{name}: no kernel reads textures: {labels:?}");
            } else if !host_avx512 {
                assert!(
                    !fused.is_empty() && tex == fused.len(),
                    "{name}: every element-wise kernel reads texels: {labels:?}"
                );
            }
        }
    }
}

#[test]
fn reductions_from_textures_and_buffers() {
    // On CPU adapters with operand textures, reductions read f32 inputs as texels
    // (`Gen::texel_leaves`, labels ending `_tex`) unless told not to. Both paths against
    // the reference: over the last, a middle and every axis, a fused product, short
    // (unrolled) and long reductions, max and argmax.
    use common::private_gpu;
    for textures in [true, false] {
        let opts = tessera::DeviceOptions { texture_operands: Some(textures), ..Default::default() };
        let Some(dev) = private_gpu(opts) else { return };
        let cpu_adapter = dev.info().device_type == "Cpu" && dev.capabilities().subgroups;
        for (k, dims) in [[3usize, 7, 12], [6, 31, 1000]].into_iter().enumerate() {
            let build = |d: &Device| {
                let x = rand_t(&dims, 330 + k as u64, -2.0, 2.0, d);
                let y = rand_t(&dims, 340 + k as u64, -2.0, 2.0, d);
                vec![
                    x.sum(&[-1], false),
                    (&x * &y).sum(&[1], true),
                    x.sum(&[0, 1, 2], false),
                    x.max(&[1], false),
                    x.argmax(&[-1], false).cast(DType::F32),
                ]
            };
            let name = format!("reductions over {dims:?}, textures {textures}");
            let labels = check_profiled(&name, &dev, Tol::for_dtype(DType::F32).scaled(dims.iter().product()), build);
            // (The profiler hears every test running at once: only this test's shapes
            // count, those of the sums over the last and the middle axis.)
            let shapes = [format!(" [{}, {}, 1]", dims[0], dims[1]), format!(" [{}, 1, {}]", dims[0], dims[2])];
            let reduces: Vec<&String> =
                labels.iter().filter(|l| l.starts_with("reduce") && shapes.iter().any(|s| l.ends_with(s))).collect();
            let tex = reduces.iter().filter(|l| l.contains("_tex")).count();
            if !textures || !cpu_adapter {
                assert_eq!(tex, 0, "{name}: no reduction reads textures: {labels:?}");
            } else {
                assert!(tex == 4 && reduces.len() == 4, "{name}: the reductions read texels: {labels:?}");
            }
        }
    }
}

#[test]
fn row_kernels_attention_and_products_from_textures_and_buffers() {
    // On CPU adapters the norms, softmax, attention and the f16 and quantised products
    // read operand textures (`ShaderCaps::texture_rows`) unless told not to. Both paths against the
    // reference: inputs within one texture row, and over several rows ending in a
    // partial one (4,096 floats a row); attention by the per-query kernel (up to 24
    // keys) and the wide one, with a mask and stored with its heads merged.
    use common::private_gpu;
    // (The profiler is shared with tests running beside this one, so each case looks for
    // the kernel it expects, by name.)
    type Build = fn(&Device) -> Vec<Tensor>;
    fn quantized(dt: DType, d: &Device) -> Tensor {
        let w = tessera::quant::quantize(dt, &common::data(72 * 64, 23, -1.0, 1.0));
        rand_t(&[20, 64], 24, -1.0, 1.0, d).matmul(&Tensor::from_quantized(dt, [72, 64], &w, d).t())
    }
    let cases: [(&str, &str, Build); 9] = [
        // f16 pairs and quantised blocks as words (`rgba32uint`), 8 values a texel in the
        // wide kernel.
        ("f16 product", "matmul_direct4sg_f16", |d| {
            let (x, w) = (rand_t(&[20, 64], 21, -1.0, 1.0, d), rand_t(&[64, 40], 22, -1.0, 1.0, d));
            vec![x.cast(DType::F16).matmul(&w.cast(DType::F16)).cast(DType::F32)]
        }),
        ("Q8_0 product", "matmul_direct4sg_f32_q8_0", |d| vec![quantized(DType::Q8_0, d)]),
        ("Q4_0 product", "matmul_direct4sg_f32_q4_0", |d| vec![quantized(DType::Q4_0, d)]),
        ("layer norm", "layer_norm_rows4", |d| {
            let x = rand_t(&[3, 37, 12], 1, -2.0, 2.0, d);
            let (w, b) = (rand_t(&[12], 2, -1.0, 1.0, d), rand_t(&[12], 3, -1.0, 1.0, d));
            vec![
                x.layer_norm(Some(&w), Some(&b), 1e-5),
                rand_t(&[301, 64], 4, -2.0, 2.0, d).layer_norm(None, None, 1e-5),
            ]
        }),
        ("rms norm", "rms_norm_rows4", |d| {
            let w = rand_t(&[96], 5, -1.0, 1.0, d);
            vec![rand_t(&[70, 96], 6, -2.0, 2.0, d).rms_norm(Some(&w), 1e-6)]
        }),
        ("softmax", "log_softmax_rows4", |d| {
            let x = rand_t(&[5, 20], 7, -4.0, 4.0, d);
            vec![x.softmax(-1), rand_t(&[130, 36], 8, -4.0, 4.0, d).log_softmax(-1)]
        }),
        ("attention, per query", "attention_f32_d16_mask_rows", |d| {
            let q = rand_t(&[2, 3, 9, 16], 9, -1.0, 1.0, d);
            let kv = rand_t(&[2, 3, 22, 16], 10, -1.0, 1.0, d);
            let keep = rand_t(&[2, 1, 1, 22], 11, 0.0, 1.0, d).gt_scalar(0.3);
            let a = Tensor::scaled_dot_product_attention_fused(&q, &kv, &kv, Some(&keep), false);
            vec![a.permute(&[0, 2, 1, 3]).reshape([2, 9, 48])]
        }),
        ("attention, wide", "attention_f32_d64_causal_wide", |d| {
            let q = rand_t(&[1, 4, 40, 64], 12, -1.0, 1.0, d);
            let kv = rand_t(&[1, 4, 70, 64], 13, -1.0, 1.0, d);
            vec![Tensor::scaled_dot_product_attention_fused(&q, &kv, &kv, None, true)]
        }),
        ("attention, wide, masked", "attention_f32_d8_mask_wide", |d| {
            let q = rand_t(&[2, 2, 5, 8], 14, -1.0, 1.0, d);
            let kv = rand_t(&[2, 2, 30, 8], 15, -1.0, 1.0, d);
            let keep = rand_t(&[2, 1, 1, 30], 16, 0.0, 1.0, d).gt_scalar(0.3);
            vec![Tensor::scaled_dot_product_attention_fused(&q, &kv, &kv, Some(&keep), false)]
        }),
    ];
    for textures in [true, false] {
        let opts = tessera::DeviceOptions { texture_operands: Some(textures), ..Default::default() };
        let Some(dev) = private_gpu(opts) else { return };
        let cpu_adapter = dev.info().device_type == "Cpu" && dev.capabilities().subgroups;
        for (name, kernel, build) in cases {
            let name = format!("{name}, textures {textures}");
            let tol = Tol::for_dtype(if name.starts_with("f16") { DType::F16 } else { DType::F32 }).scaled(64);
            let labels = check_profiled(&name, &dev, tol, build);
            if cpu_adapter {
                // The f16 and quantised products take the wide kernel where it reads
                // textures (`matmul_direct8tex_*`), the quad one otherwise.
                let wide = kernel.strip_prefix("matmul_direct4sg").filter(|_| textures);
                let ran = labels.iter().any(|l| match wide {
                    Some(rest) => l.starts_with(&format!("matmul_direct8tex{rest}")),
                    None => l.starts_with(kernel) && l.contains("_tex") == textures,
                });
                assert!(
                    ran,
                    "{name}: expected {kernel}* {} textures: {labels:?}",
                    if textures { "reading" } else { "without" }
                );
            }
        }
    }
}

#[test]
fn matmul_shapes() {
    // Thin outputs (N < 64 < M) take the direct kernel's transposed-output path; wide
    // ones several column blocks; M = 1 the GEMV shape.
    // K, M, N multiples of 4 take the vec4 direct kernel on CPU adapters.
    // The last two: the CPU backend's products in blocks of rows (C narrow) and of
    // columns, each over three calls of at most 384 of depth.
    let cases: [(&[usize], &[usize]); 17] = [
        (&[1, 1], &[1, 1]),
        (&[3, 17], &[17, 5]),
        (&[65, 33], &[33, 17]),
        (&[2, 3, 17, 65], &[65, 5]),
        (&[4, 1, 1, 9], &[3, 9, 2]),
        (&[17], &[17, 3]),
        (&[3, 17], &[17]),
        (&[17], &[17]),
        (&[2, 70, 3], &[2, 3, 66]),
        (&[70, 9], &[3, 9, 10]),
        (&[1, 301], &[301, 517]),
        (&[9, 31], &[31, 290]),
        (&[12, 8], &[8, 20]),
        (&[2, 3, 36, 44], &[44, 68]),
        (&[1, 16], &[2, 16, 300]),
        (&[130, 800], &[800, 20]),
        (&[5, 900], &[900, 70]),
    ];
    for (k, (a, b)) in cases.iter().enumerate() {
        let kd = a[a.len() - 1];
        check_with(&format!("matmul {a:?} @ {b:?}"), Some(Tol::for_dtype(DType::F32).scaled(kd)), |d| {
            let x = rand_t(a, k as u64, -1.0, 1.0, d);
            let y = rand_t(b, 40 + k as u64, -1.0, 1.0, d);
            vec![x.matmul(&y)]
        });
    }
    check_with("matmul epilogue and transposed operand", Some(Tol { atol: 1e-4, rtol: 1e-5 }), |d| {
        let x = rand_t(&[5, 7], 1, -1.0, 1.0, d);
        let w = rand_t(&[3, 7], 2, -1.0, 1.0, d);
        let b = rand_t(&[2, 7, 5], 3, -1.0, 1.0, d);
        let (y4, w4) = (rand_t(&[16, 12], 11, -1.0, 1.0, d), rand_t(&[20, 12], 12, -1.0, 1.0, d));
        vec![
            (x.matmul(&w.t()) + 1.0).relu(),
            x.exp().matmul(&w.t().exp()).sum_all(),
            x.t().matmul(&x),
            b.transpose(-1, -2).matmul(&b),
            b.matmul(&b.transpose(1, 2)),
            x.matmul(&rand_t(&[2, 5, 7], 4, -1.0, 1.0, d).transpose(1, 2)),
            rand_t(&[2, 9, 70], 5, -1.0, 1.0, d)
                .transpose(1, 2)
                .matmul(&rand_t(&[2, 5, 9], 6, -1.0, 1.0, d).transpose(1, 2)),
            // 4-aligned: every operand layout of the vec4 kernel, thin and wide.
            y4.matmul(&w4.t()),
            y4.t().matmul(&rand_t(&[16, 8], 7, -1.0, 1.0, d)),
            y4.t().matmul(&rand_t(&[100, 16], 8, -1.0, 1.0, d).t()),
            rand_t(&[3, 16, 68], 9, -1.0, 1.0, d).transpose(1, 2).matmul(&rand_t(&[3, 16, 72], 10, -1.0, 1.0, d)),
            rand_t(&[70, 8], 13, -1.0, 1.0, d).matmul(&w4.narrow(1, 0, 8).t()),
            // Decode-shaped, weight [N, K] with K % 32 == 0: the GEMV kernel on GPUs.
            rand_t(&[3, 64], 14, -1.0, 1.0, d).matmul(&rand_t(&[70, 64], 15, -1.0, 1.0, d).t()),
        ]
    });
    // The subgroup direct kernel (CPU adapters with subgroups; the fallback twin runs
    // the kernel without): 1, 2, 4 rows and every multiple of 8 up to 64 per workgroup,
    // row counts that leave partial tiles, each layout of A and B, batches, f16.
    check_with("matmul subgroup row tiles", Some(Tol { atol: 1e-4, rtol: 1e-5 }), |d| {
        let mut out = Vec::new();
        for (i, m) in [1usize, 2, 3, 8, 12, 20, 28, 36, 44, 52, 60, 100].into_iter().enumerate() {
            let s = 60 + 4 * i as u64;
            let a = rand_t(&[m, 36], s, -1.0, 1.0, d);
            let b = rand_t(&[36, 72], s + 1, -1.0, 1.0, d);
            let bt = rand_t(&[300, 36], s + 2, -1.0, 1.0, d);
            out.push(a.matmul(&b));
            out.push(a.matmul(&bt.t()));
            if m % 4 == 0 {
                let at = rand_t(&[36, m], s + 3, -1.0, 1.0, d);
                out.push(at.t().matmul(&b));
                out.push(at.t().matmul(&bt.t()));
            }
        }
        // Batched with a broadcast operand, and a thin output computed as C^T.
        out.push(rand_t(&[3, 44, 16], 90, -1.0, 1.0, d).matmul(&rand_t(&[16, 132], 91, -1.0, 1.0, d)));
        out.push(rand_t(&[100, 16], 92, -1.0, 1.0, d).matmul(&rand_t(&[16, 12], 93, -1.0, 1.0, d)));
        out
    });
    // Element-wise epilogues fused into each matmul kernel's store: bias, activations, a
    // residual, a cast; GEMV (few rows against a weight read transposed), the direct
    // kernels (vec4, subgroup, scalar, a thin output stored as C^T), batches, an implicit
    // GEMM convolution (the tiled twin), and a product also read elsewhere (not fused).
    check_with("matmul epilogues", Some(Tol { atol: 1e-4, rtol: 1e-4 }), |d| {
        let x = rand_t(&[5, 64], 21, -1.0, 1.0, d);
        let w = rand_t(&[70, 64], 22, -1.0, 1.0, d);
        let b = rand_t(&[70], 23, -1.0, 1.0, d);
        let r = rand_t(&[5, 70], 24, -1.0, 1.0, d);
        let lin = x.matmul(&w.t()) + &b;
        let x2 = rand_t(&[37, 48], 25, -1.0, 1.0, d);
        let w2 = rand_t(&[48, 52], 26, -1.0, 1.0, d);
        let b2 = rand_t(&[52], 27, -1.0, 1.0, d);
        let thin = rand_t(&[19, 13], 28, -1.0, 1.0, d).matmul(&rand_t(&[13, 11], 29, -1.0, 1.0, d));
        let batched = rand_t(&[3, 20, 16], 30, -1.0, 1.0, d).matmul(&rand_t(&[16, 24], 31, -1.0, 1.0, d));
        let img = rand_t(&[2, 3, 9, 9], 32, -1.0, 1.0, d);
        let kern = rand_t(&[4, 3, 3, 3], 33, -1.0, 1.0, d);
        let kb = rand_t(&[4], 34, -1.0, 1.0, d);
        let shared = x2.matmul(&w2);
        // Head splits under the epilogue: a projection's bias add, reshaped and permuted
        // ([b, s, h] -> [b, heads, s, d]), stored where the permute sends each element.
        let xs = rand_t(&[2, 7, 24], 37, -1.0, 1.0, d);
        let wq = rand_t(&[24, 24], 38, -1.0, 1.0, d);
        let bq = rand_t(&[24], 39, -1.0, 1.0, d);
        let heads = (xs.matmul(&wq.t()) + &bq).reshape([2, 7, 4, 6]).permute(&[0, 2, 1, 3]);
        // Heads of 8 (each quad lands whole: one vector store per quad on CPU adapters),
        // with tail rows, through the wide kernel (K and N multiples of 8) and the quad
        // one, and under a permute of five axes that keeps the last.
        let x8 = rand_t(&[2, 13, 32], 40, -1.0, 1.0, d);
        let w8 = rand_t(&[32, 32], 41, -1.0, 1.0, d);
        let b8 = rand_t(&[32], 42, -1.0, 1.0, d);
        let p8 = x8.matmul(&w8.t()) + &b8;
        let x12 = rand_t(&[3, 11, 12], 43, -1.0, 1.0, d);
        let w12 = rand_t(&[36, 12], 44, -1.0, 1.0, d);
        let b12 = rand_t(&[36], 45, -1.0, 1.0, d);
        vec![
            heads,
            p8.reshape([2, 13, 4, 8]).permute(&[0, 2, 1, 3]),
            (x8.matmul(&w8.t()) + &b8).gelu().reshape([2, 13, 2, 2, 8]).permute(&[2, 0, 3, 1, 4]),
            (x12.matmul(&w12.t()) + &b12).reshape([3, 11, 9, 4]).permute(&[2, 0, 1, 3]),
            lin.reshape([5, 7, 10]).permute(&[1, 0, 2]),
            (x2.matmul(&w2) + &b2).gelu().t(),
            (&thin * 2.0).reshape([19, 11, 1]).permute(&[2, 1, 0]),
            img.conv2d(&kern, Some(&kb), tessera::ops::nn::Conv2dOptions::new(1, 1)).permute(&[0, 2, 3, 1]),
            lin.gelu(),
            (&lin + &r).relu(),
            (x2.matmul(&w2) + &b2).silu(),
            x2.matmul(&w2).tanh() * 2.0 - 1.0,
            (&thin * 2.0).tanh(),
            (&batched + &rand_t(&[24], 35, -1.0, 1.0, d)).relu(),
            img.conv2d(&kern, Some(&kb), tessera::ops::nn::Conv2dOptions::new(1, 1)).relu(),
            shared.exp(),
            shared.sum(&[1], false),
        ]
    });
    // Epilogues that find each element in their leaves (a mask broadcast over heads and
    // rows, a per-batch bias) on tiles of 8 rows or more: the direct kernels park the
    // rows and store them in one loop that stops at the last row in range.
    check_with("matmul epilogues stored in a loop", Some(Tol { atol: 1e-4, rtol: 1e-4 }), |d| {
        let masked = |(b, h, s, k): (usize, usize, usize, usize), seed: u64| {
            let q = rand_t(&[b, h, s, k], seed, -1.0, 1.0, d);
            let kt = rand_t(&[b, h, s, k], seed + 1, -1.0, 1.0, d);
            let mask = rand_t(&[b, 1, 1, s], seed + 2, 0.0, 1.0, d);
            q.matmul(&kt.transpose(-1, -2)) * 0.25 + (mask - 1.0) * 100.0
        };
        let per_batch_bias = rand_t(&[3, 1, 40], 54, -1.0, 1.0, d);
        let column = rand_t(&[100, 1], 55, -1.0, 1.0, d);
        vec![
            // K % 8 == 0: the wide kernel (24 rows for 20, 32 for 45); K % 8 == 4: the
            // subgroup kernel (or the vec4 one without subgroups).
            masked((2, 3, 20, 16), 50),
            masked((1, 2, 45, 8), 51),
            masked((2, 2, 37, 12), 52),
            rand_t(&[3, 29, 20], 53, -1.0, 1.0, d).matmul(&rand_t(&[20, 40], 56, -1.0, 1.0, d)) + &per_batch_bias,
            // A thin output stored as C^T.
            rand_t(&[100, 16], 57, -1.0, 1.0, d).matmul(&rand_t(&[16, 12], 58, -1.0, 1.0, d)) * &column,
        ]
    });
    check_with("matmul epilogue cast to f16", Some(Tol { atol: 1e-3, rtol: 2e-3 }), |d| {
        let x = rand_t(&[5, 64], 21, -1.0, 1.0, d);
        let w = rand_t(&[70, 64], 22, -1.0, 1.0, d);
        vec![
            (x.matmul(&w.t()) + 0.5).cast(DType::F16),
            rand_t(&[12, 16], 36, -1.0, 1.0, d).matmul(&w.narrow(1, 0, 16).t()).cast(DType::F16),
        ]
    });
    check_with("matmul f16", Some(Tol { atol: 1e-2, rtol: 5e-3 }), |d| {
        let x = rand_t(&[9, 33], 3, -1.0, 1.0, d).cast(DType::F16);
        let y = rand_t(&[33, 7], 4, -1.0, 1.0, d).cast(DType::F16);
        // 4-aligned f16 operands: the vec4 direct kernel (u32 pairs) in each layout.
        let p = rand_t(&[12, 16], 5, -1.0, 1.0, d).cast(DType::F16);
        let w = rand_t(&[20, 16], 6, -1.0, 1.0, d).cast(DType::F16);
        let q = rand_t(&[20, 12], 7, -1.0, 1.0, d).cast(DType::F16);
        vec![x.matmul(&y), p.matmul(&w.t()), p.t().matmul(&p), w.matmul(&p.t()).t().matmul(&w), p.t().matmul(&q.t())]
    });
}

#[test]
fn empty_tensors_work() {
    check("empty", |d| {
        let e = Tensor::zeros([0, 3], DType::F32, d);
        let x = rand_t(&[2, 3], 1, -1.0, 1.0, d);
        vec![
            &e + 1.0,
            e.sum(&[0], false),
            e.sum_all(),
            e.mean(&[1], false),
            Tensor::concat(&[e.clone(), x.clone()], 0),
            e.matmul(&Tensor::ones([3, 4], DType::F32, d)),
            Tensor::zeros([2, 0], DType::F32, d).matmul(&Tensor::zeros([0, 3], DType::F32, d)),
            Tensor::arange(0.0, 0.0, 1.0, DType::I32, d),
            e.reshape([3, 0]).t(),
        ]
    });
}

#[test]
fn nan_propagates() {
    check("nan", |d| {
        let x = Tensor::from_slice(&[1.0f32, f32::NAN, -2.0, 3.0], [2, 2], d);
        let y = Tensor::from_slice(&[0.0f32, 1.0, f32::NAN, 1.0], [2, 2], d);
        // Around a kept middle axis: the CPU backend's in-order walk, NaN early and late.
        let z = Tensor::from_slice(&[1.0f32, f32::NAN, -2.0, 3.0, 5.0, 0.0, f32::NAN, 4.0], [2, 2, 2], d);
        // Both signs of NaN and of infinity, and -0, eight of them (so CPU adapters
        // store them eight at a time): relu keeps every NaN and zeroes the rest below 0.
        let neg_nan = f32::from_bits(0xffc0_0000);
        let w =
            Tensor::from_slice(&[neg_nan, f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -0.0, -1e-40, 2.0, -3.0], [8], d);
        // log: NaN below 0 (and for a NaN), -inf at -0, 8 values so they too take wide stores.
        let l =
            Tensor::from_slice(&[neg_nan, f32::NAN, f32::NEG_INFINITY, f32::INFINITY, -0.0, 0.5, 2.0, -3.0], [8], d);
        // sqrt and rsqrt: NaN below 0 (no -0, whose root's sign backends may differ on).
        let r =
            Tensor::from_slice(&[neg_nan, f32::NAN, f32::NEG_INFINITY, f32::INFINITY, 0.25, 0.5, 2.0, -3.0], [8], d);
        vec![
            w.relu(),
            (&w * 2.0).relu(),
            (&w + &w.exp()).relu(),
            l.log(),
            (&l * 2.0).log() + 1.0,
            r.sqrt(),
            r.rsqrt(),
            z.max(&[0, 2], false),
            z.min(&[0, 2], false),
            z.sum(&[0, 2], false),
            &x + 1.0,
            x.relu(),
            x.exp().tanh(),
            x.maximum(&y),
            x.minimum(&y),
            x.clamp(0.0, 1.0),
            x.sum(&[1], false),
            x.max(&[1], false),
            x.min(&[0], false),
            x.argmax(&[1], false),
            x.matmul(&y),
            x.softmax(1),
            x.gt(&y),
            // f16: a NaN survives the casts, element-wise ops, reductions and a softmax.
            // (An f16 store rounds through `round_f16`; on llvmpipe's GL backend the
            // negative NaN a softmax makes came out as -0.)
            x.cast(DType::F16),
            x.cast(DType::F16).cast(DType::F32),
            x.cast(DType::F16).relu(),
            x.cast(DType::F16) * 2.0,
            x.cast(DType::F16).sum(&[1], false),
            x.cast(DType::F16).max(&[1], false),
            x.cast(DType::F16).softmax(1),
            x.cast(DType::F16).log_softmax(1),
        ]
    });
}

#[test]
fn data_helper_is_deterministic() {
    assert_eq!(data(5, 3, 0.0, 1.0), data(5, 3, 0.0, 1.0));
    assert_ne!(data(5, 3, 0.0, 1.0), data(5, 4, 0.0, 1.0));
}

#[test]
fn adapters_under_test() {
    // gpu_devices() itself fails without an adapter unless TESSERA_ALLOW_NO_GPU=1.
    for d in common::devices() {
        eprintln!("testing on {}", common::label(&d));
    }
    assert!(common::devices()[0].is_cpu() && !common::devices()[0].is_reference(), "the CPU backend is under test");
}
