//! Odd but legal inputs give the right numbers, and odd illegal ones give errors: none
//! of them may panic, on any device.

mod common;
use tessera::{DType, Device, Tensor};

/// The reference, the CPU backend and every GPU device under test.
fn devices() -> Vec<Device> {
    let mut v = vec![Device::reference()];
    v.extend(common::devices());
    v
}

#[test]
fn edge_cases_never_panic() {
    for d in devices() {
        common::record(&d);
        let s = Tensor::scalar(3.0, DType::F32, &d);
        let v = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3], &d);
        let e = Tensor::from_slice::<f32>(&[], [0], &d);
        let ok: Vec<(Tensor, Vec<f64>)> = vec![
            (s.sum_all(), vec![3.0]),
            (s.argmax_all().cast(DType::F32), vec![0.0]),
            (&s * &v, vec![3.0, 6.0, 9.0]),
            (v.matmul(&v), vec![14.0]),
            (e.sum_all(), vec![0.0]),
            (e.reshape([0, 5]).sum(&[1], false), vec![]),
            (Tensor::eye(0, DType::F32, &d).flatten(), vec![]),
            (Tensor::arange(5.0, 0.0, -2.0, DType::F32, &d), vec![5.0, 3.0, 1.0]),
            (Tensor::rand([0], 1, &d), vec![]),
            (v.narrow(0, 3, 0), vec![]),
            (v.slice(0, 10, 20, 1), vec![]),
            (v.slice(0, -1, -4, 1), vec![]),
            (v.slice(0, -2, 3, 1), vec![2.0, 3.0]),
            (v.index_select(0, &Tensor::from_slice::<i32>(&[], [0], &d)), vec![]),
            (s.reshape([1, 1]).pad(&[(1, 0), (0, 1)], 7.0).flatten(), vec![7.0, 7.0, 3.0, 7.0]),
            (v.broadcast_to([2, 3]).sum(&[0], false), vec![2.0, 4.0, 6.0]),
            (Tensor::concat(&[e.clone(), v.clone(), e.clone()], 0), vec![1.0, 2.0, 3.0]),
            (v.softmax(0).sum_all().sub_scalar(1.0).abs().lt_scalar(1e-6).cast(DType::F32), vec![1.0]),
            (v.max(&[0], true).squeeze(0), vec![3.0]),
        ];
        for (k, (t, want)) in ok.iter().enumerate() {
            let got = t.to_f64_vec_blocking().unwrap_or_else(|e| panic!("case {k} on {d}: {e}"));
            assert_eq!(&got, want, "case {k} on {d}");
        }
        let bad = vec![
            s.softmax(0),
            s.transpose(0, 1),
            Tensor::concat(&[s.clone(), s.clone()], 0),
            s.pad(&[(1, 1)], 0.0),
            v.broadcast_to([2]),
            v.matmul(&s),
            e.max_all(),
            v.argmin(&[0, 0], false),
            v.reshape([2, 2]),
            v.permute(&[1]),
            v.gather(0, &Tensor::from_slice(&[0i32], [1, 1], &d)),
            Tensor::stack(&[], 0),
            Tensor::concat(&[], 0),
            Tensor::arange(0.0, f64::INFINITY, 1.0, DType::F32, &d),
            Tensor::arange(0.0, 1e12, 1.0, DType::F32, &d),
            v.unsqueeze(3),
        ];
        for (k, t) in bad.iter().enumerate() {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.to_f64_vec_blocking()));
            match r {
                Ok(Err(_)) => {}
                Ok(Ok(v)) => panic!("bad case {k} on {d} gave values {v:?}"),
                Err(_) => panic!("bad case {k} on {d} panicked"),
            }
        }
    }
}
