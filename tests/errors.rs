//! Bad input gives an `Err` naming the op, the shapes or dtypes and the caller's
//! `file:line`, on every device, and never a panic.

mod common;
use tessera::{DType, Device, Error, Tensor};

/// The reference, the CPU backend and every GPU device under test.
fn devices() -> Vec<Device> {
    let mut v = vec![Device::reference()];
    v.extend(common::devices());
    v
}

fn expect_err(t: &Tensor) -> Error {
    match t.to_f64_vec_blocking() {
        Ok(v) => panic!("expected an error, got values {v:?}"),
        Err(e) => e,
    }
}

fn assert_here(e: &Error, line: u32) {
    let loc = e.location().unwrap_or_else(|| panic!("no location in {e}"));
    assert!(loc.file().ends_with("errors.rs"), "location {loc} should be in this file: {e}");
    assert_eq!(loc.line(), line, "wrong line in {e}");
    assert!(e.to_string().contains(&format!("errors.rs:{line}")), "message lacks file:line: {e}");
}

#[test]
fn matmul_shape_mismatch() {
    for d in devices() {
        common::record(&d);
        let a = Tensor::ones([2, 3], DType::F32, &d);
        let b = Tensor::ones([4, 5], DType::F32, &d);
        let line = line!() + 1;
        let c = a.matmul(&b);
        let e = expect_err(&c);
        assert!(
            matches!(&e, Error::Shape { op: "matmul", shapes, .. } if shapes == &vec![vec![2, 3], vec![4, 5]]),
            "{e}"
        );
        assert_here(&e, line);
        // The error rides through later ops and keeps its origin.
        let later = (c.relu() + 1.0).sum_all();
        let e2 = expect_err(&later);
        assert_here(&e2, line);
    }
}

#[test]
fn broadcast_shape_mismatch() {
    for d in devices() {
        common::record(&d);
        let a = Tensor::ones([2, 3], DType::F32, &d);
        let b = Tensor::ones([4], DType::F32, &d);
        let line = line!() + 1;
        let c = &a + &b;
        let e = expect_err(&c);
        assert!(matches!(&e, Error::Shape { op: "add", .. }), "{e}");
        assert!(e.to_string().contains("[2, 3]") && e.to_string().contains("[4]"), "{e}");
        assert_here(&e, line);
        let line = line!() + 1;
        let w = Tensor::where_(&a.gt_scalar(0.0), &a, &b);
        assert_here(&expect_err(&w), line);
    }
}

#[test]
fn reshape_wrong_element_count() {
    for d in devices() {
        common::record(&d);
        let a = Tensor::ones([2, 3], DType::F32, &d);
        let line = line!() + 1;
        let r = a.reshape([4, 2]);
        let e = expect_err(&r);
        assert!(matches!(&e, Error::Shape { op: "reshape", .. }), "{e}");
        assert!(e.to_string().contains("6 elements"), "{e}");
        assert_here(&e, line);
    }
}

#[test]
fn axis_out_of_range() {
    for d in devices() {
        common::record(&d);
        let a = Tensor::ones([2, 3], DType::F32, &d);
        let line = line!() + 1;
        let s = a.sum(&[2], false);
        let e = expect_err(&s);
        assert!(matches!(&e, Error::Axis { op: "sum", axis: 2, rank: 2, .. }), "{e}");
        assert_here(&e, line);
        for (line, t) in [
            (line!(), a.softmax(-3)),
            (line!(), a.transpose(0, 5)),
            (line!(), Tensor::concat(&[a.clone(), a.clone()], 2)),
            (line!(), a.narrow(7, 0, 1)),
            (line!(), a.argmax(&[-3], false)),
        ] {
            let e = expect_err(&t);
            assert!(matches!(e, Error::Axis { .. }), "{e}");
            assert_here(&e, line);
        }
    }
}

#[test]
fn dtype_mismatch() {
    for d in devices() {
        common::record(&d);
        let a = Tensor::ones([3], DType::F32, &d);
        let b = Tensor::ones([3], DType::I32, &d);
        let line = line!() + 1;
        let c = a.add(&b);
        let e = expect_err(&c);
        assert!(matches!(&e, Error::DType { op: "add", dtypes, .. } if dtypes == &vec![DType::F32, DType::I32]), "{e}");
        assert_here(&e, line);
        for (line, t) in [
            (line!(), b.exp()),
            (line!(), a.matmul(&b)),
            (line!(), Tensor::where_(&a, &a, &a)),
            (line!(), a.index_select(0, &a)),
            (line!(), a.logical_not()),
            (line!(), b.mean_all()),
        ] {
            let e = expect_err(&t);
            assert!(matches!(e, Error::DType { .. }), "{e}");
            assert_here(&e, line);
        }
        // Reading with the wrong element type is a dtype error too.
        assert!(matches!(a.to_vec_blocking::<i32>(), Err(Error::DType { .. })));
    }
}

#[test]
fn gather_index_out_of_range() {
    for d in devices() {
        common::record(&d);
        let x = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &d).reshape([3, 4]);
        let idx = Tensor::from_slice(&[0i32, 1, 3, 2, 0, 1, 2, 0], [2, 4], &d);
        let line = line!() + 1;
        let g = x.gather(0, &idx);
        let e = expect_err(&g);
        assert!(matches!(&e, Error::IndexOutOfRange { op: "gather", index: 3, axis: 0, size: 3, .. }), "{} {e}", d);
        assert_here(&e, line);
        // Negative indices and index_select are checked the same way, also when fused.
        let neg = Tensor::from_slice(&[1i32, -1], [2], &d);
        let line = line!() + 1;
        let s = x.index_select(1, &neg).exp();
        let e = expect_err(&s);
        assert!(matches!(&e, Error::IndexOutOfRange { op: "index_select", index: -1, size: 4, .. }), "{e}");
        assert_here(&e, line);
        // Rows gathered a quad at a time (a lookup plus a tensor): the same check.
        let table = Tensor::from_slice(&(0..12).map(|v| v as f32).collect::<Vec<_>>(), [3, 4], &d);
        let rows = Tensor::from_slice(&[2i32, 7, 0], [3], &d);
        let line = line!() + 1;
        let s = table.index_select(0, &rows) + &table;
        let e = expect_err(&s);
        assert!(matches!(&e, Error::IndexOutOfRange { op: "index_select", index: 7, size: 3, .. }), "{d} {e}");
        assert_here(&e, line);
        // A good gather on the same device still works afterwards.
        let ok = Tensor::from_slice(&[2i32, 0], [2], &d);
        assert_eq!(x.index_select(0, &ok).to_vec_blocking::<f32>().unwrap(), vec![8., 9., 10., 11., 0., 1., 2., 3.]);
    }
}

/// A gather realised without a read leaves its bounds check unread; threads that each
/// read something computed from it inherit that check. One of them reads it and the
/// others wait: mapping its buffer twice at once had failed 3 of 4 reads.
#[test]
fn concurrent_reads_share_an_unread_bounds_check() {
    for d in common::devices() {
        common::record(&d);
        for bad in [false, true] {
            for round in 0..12 {
                let table: Vec<f32> = (0..4096).map(|v| (v % 17) as f32).collect();
                let mut rows: Vec<f32> = (0..1024).map(|v| (v * 7 % 1024) as f32).collect();
                // The sum of squared row sums of the gathered table, which each read scales.
                let sq: f64 =
                    rows.iter().map(|&r| table[4 * r as usize..][..4].iter().sum::<f32>() as f64).map(|s| s * s).sum();
                if bad {
                    rows[round * 37] = 1024.0 + round as f32;
                }
                // Indices computed on the device, so only the kernel can check them.
                let rows = (Tensor::from_slice(&rows, [1024], &d) * 1.0).cast(DType::I32);
                let g = Tensor::from_slice(&table, [1024, 4], &d).index_select(0, &rows);
                // A GPU reports the bad index at the first read; the CPU backend already here.
                match g.realize_blocking() {
                    Err(Error::IndexOutOfRange { .. }) if bad => {}
                    r => r.unwrap_or_else(|e| panic!("{d}: realising the gather: {e}")),
                }
                let start = std::sync::Arc::new(std::sync::Barrier::new(4));
                let reads: Vec<_> = (0..4)
                    .map(|k| {
                        let (g, d, start) = (g.clone(), d.clone(), start.clone());
                        std::thread::spawn(move || {
                            let w = Tensor::ones([4, 512], DType::F32, &d);
                            // Enough work per read that the reads' mappings overlap.
                            let y = g.matmul(&w) * (k as f32 + 1.0);
                            let total = y.transpose(0, 1).matmul(&y).sum_all();
                            start.wait();
                            (k, total.to_vec_blocking::<f32>())
                        })
                    })
                    .collect();
                for r in reads {
                    match r.join().expect("a reading thread panicked") {
                        (k, Ok(v)) if !bad => {
                            let want = sq * 512.0 * 512.0 * (k as f64 + 1.0).powi(2);
                            assert!(
                                v.len() == 1 && (v[0] as f64 - want).abs() <= want * 1e-4,
                                "{d} {round}: {v:?} {want}"
                            )
                        }
                        (_, Err(Error::IndexOutOfRange { op: "index_select", size: 1024, index, .. })) if bad => {
                            assert_eq!(index, 1024 + round as i64, "{d} round {round}")
                        }
                        (_, other) => panic!("{d} round {round}, bad index {bad}: {other:?}"),
                    }
                }
            }
        }
    }
}

#[test]
fn other_bad_arguments_are_errors() {
    for d in devices() {
        common::record(&d);
        let a = Tensor::ones([2, 3], DType::F32, &d);
        let cases = [
            Tensor::from_slice(&[1.0f32, 2.0], [3], &d),
            a.permute(&[0, 0]),
            a.slice(0, 0, 2, 0),
            a.narrow(1, 2, 5),
            a.pad(&[(1, 1)], 0.0),
            a.squeeze(0),
            a.clamp(1.0, 0.0),
            Tensor::arange(0.0, 1.0, 0.0, DType::F32, &d),
            a.max_all().reshape([0]),
            Tensor::zeros([0], DType::F32, &d).max(&[0], false),
            Tensor::concat(&[a.clone(), Tensor::ones([2, 3], DType::I32, &d)], 0),
            Tensor::stack(&[a.clone(), Tensor::ones([3, 2], DType::F32, &d)], 0),
            Tensor::full(0.0, [usize::MAX, 4], DType::F32, &d),
        ];
        for t in cases {
            let e = expect_err(&t);
            assert!(e.location().is_some_and(|l| l.file().ends_with("errors.rs")), "{e}");
        }
    }
}

#[test]
fn mixing_devices_is_an_error() {
    let devs = devices();
    for (i, a) in devs.iter().enumerate() {
        let b = &devs[(i + 1) % devs.len()];
        let e = expect_err(&(&Tensor::ones([2], DType::F32, a) + &Tensor::ones([2], DType::F32, b)));
        assert!(matches!(e, Error::DeviceMismatch { op: "add", .. }), "{} + {}: {e}", a.info().name, b.info().name);
    }
}

#[test]
fn errors_leave_the_device_usable() {
    for d in devices() {
        common::record(&d);
        let a = Tensor::ones([2, 3], DType::F32, &d);
        let _ = expect_err(&a.matmul(&a));
        let b = (&a * 3.0).sum_all();
        assert_eq!(b.to_vec_blocking::<f32>().unwrap(), vec![18.0]);
    }
}
