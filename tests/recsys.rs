//! Recommendation building blocks against the reference on every device: segment
//! reductions, in-place row writes, top-k, embedding bags (forward, gradients by finite
//! differences, heavy index collisions, hostile bags), sparse gradients and the sparse
//! optimisers (lazy SparseAdam, Adagrad equal to its dense form, clipping, one submit
//! and no copy of the table per step).

mod common;

use common::{assert_close, check, data, devices, label, Tol};
use tessera::graph::ReduceOp;
use tessera::nn::{BagMode, Bags, Embedding, EmbeddingBag, Module};
use tessera::ops::segment::GatherPlan;
use tessera::optim::{Adagrad, Adam, Optimizer, SparseAdam, StepOptions};
use tessera::{DType, Device, Tensor};

fn i32s(v: &[i32], dev: &Device) -> Tensor {
    Tensor::from_slice(v, [v.len()], dev)
}

/// Offsets with empty segments at the start, middle and end, over `n` rows.
fn offsets_for(n: usize) -> (Vec<i32>, Vec<i32>) {
    let cuts = [0, 0, 3, 3, 4, n as i32 / 2, n as i32 - 1, n as i32, n as i32];
    let mut ids = Vec::new();
    for s in 0..cuts.len() - 1 {
        for _ in cuts[s]..cuts[s + 1] {
            ids.push(s as i32);
        }
    }
    (cuts.to_vec(), ids)
}

#[test]
fn segment_reductions_match_the_reference() {
    for (n, d) in [(37usize, 5usize), (9, 1), (130, 16)] {
        let (off, seg) = offsets_for(n);
        check(&format!("segment sum/max/argmax {n}x{d}"), |dev| {
            let v = common::rand_t(&[n, d], 3, -2.0, 2.0, dev);
            let (o, s) = (i32s(&off, dev), i32s(&seg, dev));
            vec![
                v.segment_reduce(&o, &s, ReduceOp::Sum),
                v.segment_reduce(&o, &s, ReduceOp::Max),
                v.segment_reduce(&o, &s, ReduceOp::ArgMax),
            ]
        });
    }
    // The values fused: a gather of table rows with heavy collisions, times weights.
    check("segment sum over a fused gather", |dev| {
        let table = common::rand_t(&[11, 7], 5, -1.0, 1.0, dev);
        let ids: Vec<i32> = (0..64).map(|k| if k % 3 == 0 { 4 } else { k * 7 % 11 }).collect();
        let w = common::rand_t(&[64, 1], 6, 0.0, 2.0, dev);
        let (off, seg) = offsets_for(64);
        let v = table.index_select(0, &i32s(&ids, dev)).mul(&w);
        vec![v.segment_reduce(&i32s(&off, dev), &i32s(&seg, dev), ReduceOp::Sum)]
    });
    // Rows of 8 (a quad at a time on the GPU) gathered once and twice (an EmbeddingBag's
    // distinct rows, then each id's row among them), with heavy collisions.
    check("segment sum over gathered rows of 8", |dev| {
        let table = common::rand_t(&[11, 8], 7, -1.0, 1.0, dev);
        let ids: Vec<i32> = (0..64).map(|k| if k % 3 == 0 { 4 } else { k * 7 % 11 }).collect();
        let distinct = i32s(&[10, 4, 0, 7], dev);
        let local: Vec<i32> = (0..64).map(|k| if k % 2 == 0 { 1 } else { k % 4 }).collect();
        let (off, seg) = offsets_for(64);
        let (o, s) = (i32s(&off, dev), i32s(&seg, dev));
        vec![
            table.index_select(0, &i32s(&ids, dev)).segment_reduce(&o, &s, ReduceOp::Sum),
            table.index_select(0, &distinct).index_select(0, &i32s(&local, dev)).segment_reduce(&o, &s, ReduceOp::Sum),
            // Through a reshape that keeps the rows (as the bag's gradient reaches it).
            table.index_select(0, &i32s(&ids, dev)).reshape([64, 8]).segment_reduce(&o, &s, ReduceOp::Sum),
        ]
    });
    // An id out of range through the quad path is an error, as in the scalar one.
    for dev in devices() {
        let table = common::rand_t(&[11, 8], 7, -1.0, 1.0, &dev);
        let bad = table.index_select(0, &i32s(&[1, 2, 11, 3], &dev));
        let sums = bad.segment_reduce(&i32s(&[0, 2, 4], &dev), &i32s(&[0, 0, 1, 1], &dev), ReduceOp::Sum);
        let e = sums.to_vec_blocking::<f32>().expect_err("id 11 of 11 rows");
        assert!(
            matches!(&e, tessera::Error::IndexOutOfRange { op: "index_select", index: 11, size: 11, .. }),
            "{}: {e}",
            label(&dev)
        );
        common::record(&dev);
    }
}

#[test]
fn scatter_rows_writes_the_rows_in_place() {
    check("scatter_rows into a realised and a lazy table", |dev| {
        let table = common::rand_t(&[23, 6], 9, -1.0, 1.0, dev);
        let rows = i32s(&[22, 0, 7, 30, 5], dev); // 30 is out of range: skipped
        let src = common::rand_t(&[5, 6], 10, 5.0, 6.0, dev);
        let fresh = Tensor::zeros([23, 6], DType::F32, dev).add_scalar(0.5);
        // Rows of 8 from a buffer (not fused): a quad at a time on the GPU.
        let wide = common::rand_t(&[23, 8], 13, -1.0, 1.0, dev);
        let src8 = common::rand_t(&[5, 8], 14, 5.0, 6.0, dev);
        vec![
            table.scatter_rows(&rows, &src.mul_scalar(2.0)),
            fresh.scatter_rows(&rows, &src),
            wide.scatter_rows(&rows, &src8),
        ]
    });
    // Many distinct rows in increasing order (what sparse optimisers write): the CPU
    // backend splits them across threads and prefetches each destination; the table
    // (8.4 MB) is large enough to ask for huge pages. Negative and out-of-range rows
    // at both ends, and rows at the very start and end of the table, are kept in.
    check("scatter_rows, 2,503 increasing rows into 262,147 x 8", |dev| {
        let num = 262_147;
        let mut rows: Vec<i32> = vec![-3, -1, 0];
        rows.extend((1..2500).map(|k| k * 104 + k % 7));
        rows.extend([num as i32 - 1, num as i32, num as i32 + 9]);
        // Computed, so the backend allocates the table itself.
        let table = common::rand_t(&[num, 8], 11, -1.0, 1.0, dev).add_scalar(0.25);
        let src = common::rand_t(&[rows.len(), 8], 12, 5.0, 6.0, dev);
        vec![table.scatter_rows(&i32s(&rows, dev), &src.add_scalar(1.0))]
    });
    for dev in private_devices() {
        // The same buffer: the table shows the rows too, and nothing was allocated for it.
        let table = common::rand_t(&[1000, 8], 1, -1.0, 1.0, &dev);
        table.realize_blocking().unwrap();
        dev.reset_peak_bytes();
        let before = dev.stats();
        let out = table.clone().scatter_rows(&i32s(&[3], &dev), &Tensor::ones([1, 8], DType::F32, &dev));
        out.realize_blocking().unwrap();
        let after = dev.stats();
        assert!(
            after.peak_bytes.saturating_sub(before.bytes_in_use) < 1000 * 8 * 4,
            "{}: scatter_rows copied the table ({before} -> {after})",
            label(&dev)
        );
        assert_eq!(out.to_vec_blocking::<f32>().unwrap()[3 * 8..4 * 8], [1.0; 8], "{}", label(&dev));
        common::record(&dev);
    }
}

#[test]
fn row_rules_match_the_reference() {
    // Adam's three passes in one realisation: both moments accumulate, then the step
    // reads the new moments' rows (the scheduler must keep that order). Rows out of
    // range at both ends are skipped; the tables are realised and lazy.
    // Rows of 6, and of 12 (a quad at a time on the GPU).
    check("accumulate_rows and step_rows: one sparse Adam step", |dev| {
        let rows = i32s(&[22, 0, 7, 30, 5, -2], dev);
        let mut out = Vec::new();
        for d in [6, 12] {
            let g = common::rand_t(&[6, d], 20, -3.0, 3.0, dev);
            let p = common::rand_t(&[23, d], 21, -1.0, 1.0, dev);
            let m = common::rand_t(&[23, d], 22, -0.5, 0.5, dev);
            let v = common::rand_t(&[23, d], 23, 0.0, 2.0, dev).add_scalar(0.0);
            let m = m.accumulate_rows(&rows, &g, false, [0.9, 0.1], None);
            let v = v.accumulate_rows(&rows, &g, true, [0.999, 0.001], None);
            let p = p.step_rows(&rows, &m, true, &v, [0.05, 1e-3], None);
            out.extend([m, v, p]);
        }
        out
    });
    // Adagrad's form (the numerator per touched row), and both gates: an open gate
    // updates, a closed one leaves every row as it was even with NaN gradients.
    // Rows of 5, and of 8 (quads; the NaN gradients are realised, so read as quads too).
    check("accumulate_rows and step_rows: Adagrad, gated", |dev| {
        let rows = i32s(&[4, 1, 9], dev);
        let mut out = Vec::new();
        for d in [5, 8] {
            let g = common::rand_t(&[3, d], 24, -2.0, 2.0, dev);
            let bad = g.add_scalar(f64::NAN);
            bad.realize_blocking().unwrap();
            let open = g.sum_all().gt_scalar(-1e9);
            let shut = bad.sum_all().eq(&bad.sum_all());
            let s = common::rand_t(&[10, d], 25, 0.0, 1.0, dev);
            let s = s.accumulate_rows(&rows, &g, true, [1.0, 1.0], Some(&open));
            let p = common::rand_t(&[10, d], 26, -1.0, 1.0, dev);
            let p = p.step_rows(&rows, &g, false, &s, [0.1, 1e-10], Some(&open));
            let q = common::rand_t(&[10, d], 27, -1.0, 1.0, dev);
            let q = q.accumulate_rows(&rows, &bad, false, [0.5, 0.5], Some(&shut));
            let r = common::rand_t(&[10, d], 28, -1.0, 1.0, dev);
            let r = r.step_rows(&rows, &bad, false, &s, [0.1, 1e-10], Some(&shut));
            out.extend([s, p, q, r]);
        }
        out
    });
    // Many increasing rows: the CPU backend splits them across threads, so each half
    // must index the per-row operands from its own first row.
    check("accumulate_rows and step_rows, 2,503 increasing rows into 262,147 x 8", |dev| {
        let num = 262_147;
        let mut rows: Vec<i32> = vec![-3, 0];
        rows.extend((1..2500).map(|k| k * 104 + k % 7));
        rows.extend([num as i32 - 1, num as i32 + 9]);
        let rows = i32s(&rows, dev);
        let u = rows.dims()[0];
        let g = common::rand_t(&[u, 8], 29, -1.0, 1.0, dev);
        let table = common::rand_t(&[num, 8], 30, -1.0, 1.0, dev).add_scalar(0.25);
        let den = common::rand_t(&[num, 8], 31, 0.0, 1.0, dev).accumulate_rows(&rows, &g, true, [0.5, 1.0], None);
        vec![den.clone(), table.step_rows(&rows, &g, false, &den, [0.01, 1e-6], None)]
    });
    // Writes over the same increasing rows, which the CPU backend runs as one pass, row
    // by row: Adam's three, then Adagrad's with its gate shut over NaN gradients, then
    // a table whose rows are as many as the rows written, so that a write can read an
    // earlier one's result at the touched row's position (that one must not join the
    // pass: it reads other rows than the one being written).
    check("row writes over the same rows in one pass", |dev| {
        let rows = i32s(&[0, 3, 4, 8, 12], dev);
        let g = common::rand_t(&[5, 7], 33, -2.0, 2.0, dev);
        let bad = g.add_scalar(f64::NAN);
        let shut = bad.sum_all().eq(&bad.sum_all());
        let table = |seed, lo, hi| common::rand_t(&[13, 7], seed, lo, hi, dev);
        let m = table(34, -0.5, 0.5).accumulate_rows(&rows, &g, false, [0.9, 0.1], None);
        let v = table(35, 0.0, 2.0).accumulate_rows(&rows, &g, true, [0.999, 0.001], None);
        let p = table(36, -1.0, 1.0).step_rows(&rows, &m, true, &v, [0.05, 1e-3], None);
        let s = table(37, 0.0, 1.0).accumulate_rows(&rows, &bad, true, [1.0, 1.0], Some(&shut));
        let q = table(38, -1.0, 1.0).step_rows(&rows, &bad, false, &s, [0.1, 1e-10], Some(&shut));
        let all = i32s(&[0, 2, 3, 4, 9], dev);
        let w = common::rand_t(&[5, 7], 39, -1.0, 1.0, dev).accumulate_rows(&all, &g, false, [0.5, 1.0], None);
        let x = common::rand_t(&[5, 7], 40, -1.0, 1.0, dev).accumulate_rows(&all, &w, true, [1.0, 0.5], None);
        vec![m, v, p, s, q, w, x]
    });
    // Exactly Adam's three writes over increasing rows, out-of-range rows at both ends:
    // one fused loop per row on the CPU backend (split across threads for the larger).
    check("sparse Adam's three writes over increasing rows", |dev| {
        let mut out = Vec::new();
        for (num, d, rows) in [
            (13usize, 7usize, vec![-1, 0, 3, 4, 8, 12, 13]),
            (262_147, 8, (-1..2500).map(|k| k * 104 + k % 7).chain([262_146, 262_150]).collect()),
        ] {
            let u = rows.len();
            let rows = i32s(&rows, dev);
            let g = common::rand_t(&[u, d], 41, -2.0, 2.0, dev);
            let table = |seed, lo, hi| common::rand_t(&[num, d], seed, lo, hi, dev);
            let m = table(42, -0.5, 0.5).accumulate_rows(&rows, &g, false, [0.9, 0.1], None);
            let v = table(43, 0.0, 2.0).accumulate_rows(&rows, &g, true, [0.999, 0.001], None);
            let p = table(44, -1.0, 1.0).step_rows(&rows, &m, true, &v, [0.05, 1e-3], None);
            out.extend([m, v, p]);
        }
        out
    });
    for dev in devices() {
        let t = Tensor::zeros([4, 3], DType::F32, &dev);
        let rows = i32s(&[1, 2], &dev);
        let g = Tensor::ones([2, 3], DType::F32, &dev);
        // Shapes, dtypes and gates that do not fit are errors at the call.
        let wrong = [
            t.clone().accumulate_rows(&rows, &Tensor::ones([3, 3], DType::F32, &dev), false, [1.0, 1.0], None),
            t.clone().accumulate_rows(&rows, &g.cast(DType::F16), false, [1.0, 1.0], None),
            t.clone().step_rows(&rows, &g, true, &t, [1.0, 1.0], None),
            t.clone().step_rows(&rows, &g, false, &g, [1.0, 1.0], None),
            t.clone().accumulate_rows(&rows, &g, false, [1.0, 1.0], Some(&g)),
            t.clone().accumulate_rows(&rows.cast(DType::F32), &g, false, [1.0, 1.0], None),
        ];
        for (k, w) in wrong.iter().enumerate() {
            assert!(w.check().is_err(), "{}: bad row write {k} was accepted", label(&dev));
        }
        // An operand that is the table itself: its old rows (the CPU backend writes a
        // copy) or a clear error (a GPU cannot bind one buffer twice), never a crash.
        let table = common::rand_t(&[4, 3], 32, 0.5, 1.0, &dev);
        table.realize_blocking().unwrap();
        let want: Vec<f32> = table.to_vec_blocking().unwrap();
        let out =
            table.clone().step_rows(&rows, &table, true, &Tensor::ones([4, 3], DType::F32, &dev), [1.0, 0.0], None);
        match out.to_vec_blocking::<f32>() {
            Ok(got) => {
                for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let expect = if (3..9).contains(&k) { 0.0 } else { w };
                    assert!((g - expect).abs() < 1e-6, "{}: element {k} is {g}, expected {expect}", label(&dev));
                }
            }
            Err(e) => assert!(e.to_string().contains("shares the table's buffer"), "{}: {e}", label(&dev)),
        }
        common::record(&dev);
    }
}

#[test]
fn topk_matches_the_reference() {
    for (rows, n, k) in [(5usize, 37usize, 10usize), (3, 10, 10), (70, 1682, 10), (2, 200, 64), (4, 9, 1)] {
        check(&format!("topk {rows}x{n} k={k}"), |dev| {
            // Few distinct values, so ties are common; the input fused (scores minus a mask).
            let v: Vec<f32> = data(rows * n, 4, 0.0, 8.0).iter().map(|x| x.floor()).collect();
            let x = Tensor::from_slice(&v, [rows, n], dev);
            let mask = Tensor::from_slice(&data(rows * n, 8, 0.0, 1.0), [rows, n], dev).gt_scalar(0.9);
            let scored = Tensor::where_(&mask, &x.full_like(-1e30), &x);
            let (values, idx) = scored.topk(k);
            vec![values, idx]
        });
    }
    let dev = Device::cpu();
    let x = Tensor::from_slice(&[1.0f32, 3.0, 2.0], [3], &dev);
    assert!(x.topk(0).1.check().is_err() && x.topk(4).1.check().is_err() && x.topk(65).1.check().is_err());
}

/// Bags with duplicates inside and across bags, an empty bag, and one id everywhere.
fn bags(weights: bool) -> Bags {
    let ids = [3i64, 3, 0, 9, 3, 12, 12, 12, 5, 3, 0, 1];
    let offsets = [0i64, 3, 3, 6, 7, 11];
    let w: Vec<f32> = data(ids.len(), 2, 0.5, 1.5);
    Bags::from_offsets(&ids, &offsets, weights.then_some(w.as_slice())).unwrap()
}

/// A host computation of a bag's rows, for comparison.
fn host_bag(table: &[f32], d: usize, bags: &[(Vec<usize>, Vec<f32>)], mode: BagMode) -> Vec<f64> {
    let mut out = Vec::new();
    for (ids, w) in bags {
        for c in 0..d {
            let vals: Vec<f64> = ids.iter().zip(w).map(|(&i, &w)| (table[i * d + c] * w) as f64).collect();
            out.push(match mode {
                _ if vals.is_empty() => 0.0,
                BagMode::Sum => vals.iter().sum(),
                BagMode::Mean => vals.iter().sum::<f64>() / vals.len() as f64,
                BagMode::Max => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
            });
        }
    }
    out
}

#[test]
fn embedding_bag_modes_match_a_host_computation_on_every_device() {
    let ids = [3usize, 3, 0, 9, 3, 12, 12, 12, 5, 3, 0, 1];
    let cuts = [0usize, 3, 3, 6, 7, 11, 12];
    let w = data(ids.len(), 2, 0.5, 1.5);
    for dev in devices() {
        for (mode, weighted) in
            [(BagMode::Sum, false), (BagMode::Sum, true), (BagMode::Mean, false), (BagMode::Max, false)]
        {
            let bag = EmbeddingBag::new(13, 5, mode, false, 7, &dev);
            let table = bag.weight.to_vec_blocking::<f32>().unwrap();
            let host: Vec<(Vec<usize>, Vec<f32>)> = (0..6)
                .map(|b| {
                    let r = cuts[b]..cuts[b + 1];
                    (ids[r.clone()].to_vec(), if weighted { w[r].to_vec() } else { vec![1.0; cuts[b + 1] - cuts[b]] })
                })
                .collect();
            let got = bag.forward(&bags(weighted)).to_f64_vec_blocking().unwrap();
            assert_close(
                &format!("{mode:?} on {}", label(&dev)),
                &got,
                &host_bag(&table, 5, &host, mode),
                Tol { atol: 1e-5, rtol: 1e-5 },
            );
            common::record(&dev);
        }
    }
}

/// Central differences on the exact reference, then every device against the
/// reference's gradient: the table's gradient through a bag (sum with weights, mean,
/// max) is a sorted segment sum, duplicates included.
#[test]
fn embedding_bag_forward_is_one_kernel() {
    let Some(dev) = common::private_gpu(Default::default()) else { return };
    for mode in [BagMode::Sum, BagMode::Mean, BagMode::Max] {
        for sparse in [false, true] {
            let bag = EmbeddingBag::new(13, 5, mode, sparse, 7, &dev);
            bag.weight.realize_blocking().unwrap();
            let out = bag.forward(&bags(false));
            let before = dev.stats().kernels_dispatched;
            out.realize_blocking().unwrap();
            assert_eq!(dev.stats().kernels_dispatched - before, 1, "{mode:?} sparse {sparse}: one kernel");
        }
    }
}

#[test]
fn embedding_bag_gradients_match_finite_differences() {
    for (mode, weighted) in [(BagMode::Sum, true), (BagMode::Mean, false), (BagMode::Max, false)] {
        let grad_on = |dev: &Device, table: &[f64]| -> (f64, Vec<f64>) {
            let mut bag = EmbeddingBag::new(13, 4, mode, false, 1, dev);
            bag.weight = Tensor::from_f64(table, [13, 4], DType::F32, dev).requires_grad();
            let out = bag.forward(&bags(weighted));
            let w = Tensor::from_slice(&data(out.numel(), 99, -1.0, 1.0), out.dims().to_vec(), dev);
            let loss = out.mul(&w).sum_all();
            let g = loss.backward().unwrap().get(&bag.weight).cloned().unwrap();
            let v = tessera::read_all_blocking(&[loss, g]).unwrap();
            (v[0][0], v[1].clone())
        };
        let exact = Device::reference_exact();
        let table: Vec<f64> = data(52, 3, -1.0, 1.0).into_iter().map(f64::from).collect();
        let (_, analytic) = grad_on(&exact, &table);
        for j in 0..table.len() {
            let at = |delta: f64| {
                let mut t = table.clone();
                t[j] += delta;
                grad_on(&exact, &t).0
            };
            let fd = (at(1e-6) - at(-1e-6)) / 2e-6;
            assert!((analytic[j] - fd).abs() <= 1e-6 + 1e-5 * fd.abs(), "{mode:?} d/dw[{j}]: {} vs {fd}", analytic[j]);
        }
        let want = grad_on(&Device::reference(), &table).1;
        for dev in devices() {
            let got = grad_on(&dev, &table).1;
            assert_close(&format!("{mode:?} gradient on {}", label(&dev)), &got, &want, Tol { atol: 1e-5, rtol: 1e-5 });
            common::record(&dev);
        }
    }
}

#[test]
fn hostile_bags_give_clear_errors() {
    let dev = Device::cpu();
    let err = |r: tessera::Result<Bags>| r.unwrap_err().to_string();
    assert!(err(Bags::from_offsets(&[1, 2], &[0, -1], None)).contains("negative"));
    assert!(err(Bags::from_offsets(&[1, 2], &[1], None)).contains("first offset"));
    assert!(err(Bags::from_offsets(&[1, 2], &[0, 2, 1], None)).contains("non-decreasing"));
    assert!(err(Bags::from_offsets(&[1, 2], &[0, 3], None)).contains("non-decreasing"));
    assert!(err(Bags::from_offsets(&[1, -2], &[0], None)).contains("negative"));
    assert!(err(Bags::from_offsets(&[1, 2], &[0], Some(&[1.0]))).contains("per-sample weights"));
    assert!(err(Bags::from_offsets(&[1, 2], &[0], Some(&[1.0, f32::NAN]))).contains("not finite"));
    assert!(err(Bags::padded(&[1, 2, 3], 2, &[true; 3], None)).contains("width"));
    assert!(err(Bags::padded(&[1, 2], 2, &[true], None)).contains("mask"));
    for sparse in [false, true] {
        let bag = EmbeddingBag::new(10, 3, BagMode::Sum, sparse, 1, &dev);
        let e = bag.forward(&Bags::from_offsets(&[1, 10], &[0], None).unwrap()).check().unwrap_err().to_string();
        assert!(e.contains("out of range") && e.contains("10"), "{e}");
        let mean = EmbeddingBag::new(10, 3, BagMode::Mean, sparse, 1, &dev);
        let e = mean.forward(&bags_small(true)).check().unwrap_err().to_string();
        assert!(e.contains("mode Sum"), "{e}");
    }
    // Empty bags are zeros, in every mode.
    for mode in [BagMode::Sum, BagMode::Mean, BagMode::Max] {
        let bag = EmbeddingBag::new(10, 3, mode, false, 1, &dev);
        let out = bag.forward(&Bags::from_offsets(&[], &[0, 0], None).unwrap()).to_vec_blocking::<f32>().unwrap();
        assert_eq!(out, vec![0.0; 6]);
    }
    assert!(GatherPlan::new(&[0, 5], 5, &dev).unwrap_err().to_string().contains("out of range"));
}

fn bags_small(weights: bool) -> Bags {
    Bags::from_offsets(&[1, 2, 3], &[0, 1], weights.then_some(&[1.0f32, 2.0, 3.0][..])).unwrap()
}

/// A model with one sparse table and one dense layer.
#[derive(tessera::nn::Module)]
struct TinyRec {
    emb: Embedding,
    bag: EmbeddingBag,
    out: tessera::nn::Linear,
}

impl TinyRec {
    fn new(rows: usize, sparse: bool, dev: &Device) -> TinyRec {
        let emb = Embedding::new(rows, 4, 3, dev);
        TinyRec {
            emb: if sparse { emb.sparse() } else { emb },
            bag: EmbeddingBag::new(rows, 4, BagMode::Sum, sparse, 4, dev),
            out: tessera::nn::Linear::new(4, 1, true, 5, dev),
        }
    }

    /// The table is read twice (two lookups of `emb` and one bag), so the gradients of
    /// its lookups are merged.
    fn loss(&self, users: &[u32], items: &[u32], bags: &Bags) -> Tensor {
        let u = self.emb.lookup(users, &[users.len()]);
        let i = self.emb.lookup(items, &[items.len()]);
        let b = self.bag.forward(bags);
        self.out.forward(&u.mul(&i).add(&b)).square().mean_all()
    }
}

fn batch(k: u64, rows: usize) -> (Vec<u32>, Vec<u32>, Bags) {
    let r = |s: u64| data(6, s, 0.0, rows as f64 - 0.01).iter().map(|&x| x as u32).collect::<Vec<u32>>();
    let users = r(k);
    let mut items = r(k + 100);
    items[0] = users[0]; // a row both lookups touch
    let ids: Vec<i64> = r(k + 200).iter().chain(&r(k + 300)).map(|&x| i64::from(x)).collect();
    (users, items, Bags::from_offsets(&ids, &[0, 2, 2, 5, 7, 9], None).unwrap())
}

fn table_values(m: &mut TinyRec) -> Vec<Vec<f64>> {
    let ts: Vec<Tensor> = m.parameters();
    tessera::read_all_blocking(&ts).unwrap()
}

#[test]
fn sparse_adagrad_equals_dense_adagrad_with_clipping() {
    // Adagrad leaves rows with a zero gradient as they are, so sparse and dense agree.
    for dev in private_devices() {
        let mut dense = TinyRec::new(40, false, &dev);
        let mut sparse = TinyRec::new(40, true, &dev);
        let (mut od, mut os) = (Adagrad::new(0.1), Adagrad::new(0.1));
        for k in 0..4 {
            let (u, i, b) = batch(k, 40);
            let opts = || StepOptions { clip_norm: Some(0.5), ..Default::default() };
            let loss = dense.loss(&u, &i, &b);
            let ld = od.step_with(&mut dense, &loss, opts()).unwrap().loss.unwrap();
            let before = dev.stats().submits;
            let loss = sparse.loss(&u, &i, &b);
            let ls = os.step_with(&mut sparse, &loss, opts()).unwrap().loss.unwrap();
            assert_eq!(dev.stats().submits - before, u64::from(!dev.is_cpu()), "one submit per sparse step");
            assert!((ld - ls).abs() <= 1e-5 * ld.abs().max(1.0), "{}: step {k} loss {ld} vs {ls}", label(&dev));
        }
        for (d, s) in table_values(&mut dense).iter().zip(table_values(&mut sparse)) {
            assert_close(&format!("sparse Adagrad on {}", label(&dev)), &s, d, Tol { atol: 1e-5, rtol: 1e-5 });
        }
        common::record(&dev);
    }
}

#[test]
fn sparse_adam_is_lazy_and_dense_adam_refuses_sparse_gradients() {
    for dev in devices() {
        let mut m = TinyRec::new(30, true, &dev);
        let w0 = m.emb.weight.to_vec_blocking::<f32>().unwrap();
        let mut opt = SparseAdam::new(0.05);
        let (u, i, b) = batch(1, 30);
        let loss = m.loss(&u, &i, &b);
        opt.step(&mut m, &loss).unwrap();
        let w1 = m.emb.weight.to_vec_blocking::<f32>().unwrap();
        let touched: std::collections::BTreeSet<u32> = u.iter().chain(&i).copied().collect();
        for r in 0..30u32 {
            let (a, b) = (&w0[r as usize * 4..][..4], &w1[r as usize * 4..][..4]);
            if touched.contains(&r) {
                // The first Adam step moves every coordinate with a gradient by about lr.
                assert!(a.iter().zip(b).any(|(x, y)| (x - y).abs() > 0.04), "{}: row {r} did not move", label(&dev));
            } else {
                assert_eq!(a, b, "{}: untouched row {r} moved", label(&dev));
            }
        }
        // Moments of untouched rows stay zero (lazy), of touched rows not.
        let state: Vec<(String, Tensor)> = opt.state().into_iter().map(|(n, t)| (n, t.clone())).collect();
        let m1 = state.iter().find(|(n, _)| n == "emb.weight.exp_avg").unwrap().1.to_vec_blocking::<f32>().unwrap();
        for r in 0..30u32 {
            let nonzero = m1[r as usize * 4..][..4].iter().any(|&x| x != 0.0);
            assert_eq!(nonzero, touched.contains(&r), "{}: moment of row {r}", label(&dev));
        }
        let mut adam = Adam::new(0.05);
        let loss = m.loss(&u, &i, &b);
        let e = adam.step(&mut m, &loss).unwrap_err().to_string();
        assert!(e.contains("emb.weight") && e.contains("SparseAdam"), "{e}");
        common::record(&dev);
    }
}

/// A sparse Adam step's row writes over the same rows (both moments, then the weights
/// reading them) run as one kernel: on the CPU backend always, on a GPU when rows are a
/// multiple of 4 long (a quad at a time), else as one kernel per write. A gated write
/// with its gate shut, in the same group, leaves its rows alone.
#[test]
fn row_writes_over_the_same_rows_are_one_kernel() {
    for dev in private_devices() {
        for d in [8usize, 6] {
            let rows = i32s(&[3, 0, 9, 4], &dev);
            let g = common::rand_t(&[4, d], 50, -1.0, 1.0, &dev);
            let bad = g.add_scalar(f64::NAN);
            // Shut (NaN != NaN), already f32: no cast kernel joins the count.
            let shut = bad.sum_all().eq(&bad.sum_all()).cast(DType::F32);
            let tables: Vec<Tensor> = (0..4).map(|k| common::rand_t(&[10, d], 51 + k, 0.0, 1.0, &dev)).collect();
            tessera::read_all_blocking(&[g.clone(), bad.clone(), shut.clone()]).unwrap();
            tessera::read_all_blocking(&tables).unwrap();
            let kept: Vec<f32> = tables[3].to_vec_blocking().unwrap();
            let m = tables[0].clone().accumulate_rows(&rows, &g, false, [0.9, 0.1], None);
            let v = tables[1].clone().accumulate_rows(&rows, &g, true, [0.999, 0.001], None);
            let p = tables[2].clone().step_rows(&rows, &m, true, &v, [0.01, 1e-8], None);
            let q = tables[3].clone().accumulate_rows(&rows, &bad, false, [0.5, 0.5], Some(&shut));
            let before = dev.stats().kernels_dispatched;
            let got = tessera::read_all_blocking(&[m, v, p, q]).unwrap();
            let kernels = dev.stats().kernels_dispatched - before;
            let want = if dev.is_cpu() || d % 4 == 0 { 1 } else { 4 };
            assert_eq!(kernels, want, "{} rows of {d}: kernels for four row writes", label(&dev));
            assert!(got[0..3].iter().flatten().all(|x| x.is_finite()), "{}: rows of {d}", label(&dev));
            let q: Vec<f32> = got[3].iter().map(|&x| x as f32).collect();
            assert_eq!(q, kept, "{} rows of {d}: a shut gate in the group wrote", label(&dev));
        }
        common::record(&dev);
    }
}

/// Devices of their own (the CPU backend and the first GPU adapter), so their counters
/// see only the calling test.
fn private_devices() -> Vec<Device> {
    std::iter::once(Device::cpu()).chain(common::private_gpu(Default::default())).collect()
}

#[test]
fn sparse_steps_never_copy_the_table() {
    for dev in private_devices() {
        let rows = 200_000;
        let mut m = TinyRec::new(rows, true, &dev);
        let mut opt = SparseAdam::new(0.01);
        for k in 0..3 {
            let (u, i, b) = batch(k, rows);
            dev.reset_peak_bytes();
            let before = dev.stats();
            let table_bytes = (rows * 4 * 4) as u64;
            let loss = m.loss(&u, &i, &b);
            opt.step(&mut m, &loss).unwrap();
            let after = dev.stats();
            // The first step creates the two moment tables of each sparse table.
            if k > 0 {
                let extra = after.peak_bytes.saturating_sub(before.bytes_in_use);
                assert!(
                    extra < table_bytes,
                    "{}: step {k} held {extra} more bytes (a table is {table_bytes})",
                    label(&dev)
                );
            }
        }
        common::record(&dev);
    }
}

/// A SparseAdam run saved after 2 steps and resumed in a new model and optimiser ends
/// bit for bit where the uninterrupted run ends (tables, dense layer, moments).
#[test]
fn sparse_training_resumes_bit_exactly_from_a_checkpoint() {
    let dev = Device::cpu();
    let run = |m: &mut TinyRec, opt: &mut SparseAdam, steps: std::ops::Range<u64>| {
        for k in steps {
            let (u, i, b) = batch(k, 25);
            let loss = m.loss(&u, &i, &b);
            opt.step(m, &loss).unwrap();
        }
    };
    let mut whole = TinyRec::new(25, true, &dev);
    let mut opt = SparseAdam::new(0.02);
    run(&mut whole, &mut opt, 0..4);

    let mut first = TinyRec::new(25, true, &dev);
    let mut opt1 = SparseAdam::new(0.02);
    run(&mut first, &mut opt1, 0..2);
    let bytes =
        pollster::block_on(tessera::io::checkpoint::to_bytes(&mut first, &mut opt1, &Default::default())).unwrap();
    let mut resumed = TinyRec::new(25, true, &dev);
    let mut opt2 = SparseAdam::new(0.02);
    tessera::io::checkpoint::from_bytes(&bytes, &mut resumed, &mut opt2, &dev).unwrap();
    run(&mut resumed, &mut opt2, 2..4);

    assert_eq!(table_values(&mut whole), table_values(&mut resumed), "parameters");
    let state = |o: &mut SparseAdam| -> Vec<Vec<f64>> {
        let ts: Vec<Tensor> = o.state().into_iter().map(|(_, t)| t.clone()).collect();
        tessera::read_all_blocking(&ts).unwrap()
    };
    assert_eq!(state(&mut opt), state(&mut opt2), "moments");
}

/// Recall@K and NDCG@K by hand, with seen items excluded and a user without held-out
/// items skipped.
#[test]
fn ranking_metrics_match_a_hand_computation() {
    let dev = Device::cpu();
    // 3 users x 6 items; higher score = better.
    let scores = Tensor::from_slice(
        &[
            0.9f32, 0.8, 0.7, 0.6, 0.5, 0.4, // user 0: item 0 seen, so the top 2 are 1, 2
            0.1, 0.2, 0.3, 0.4, 0.5, 0.6, // user 1: top 2 are 5, 4
            0.5, 0.5, 0.5, 0.5, 0.5, 0.5, // user 2: no held-out items
        ],
        [3, 6],
        &dev,
    );
    let seen = vec![vec![0], vec![], vec![]];
    let held = vec![vec![2, 3], vec![4], vec![]];
    let (recall, ndcg) = tessera::models::recsys::rank_metrics(&scores, &seen, &held, 2).unwrap();
    // User 0: hits at rank 2 only: recall 1/2, DCG 1/log2(3), IDCG 1 + 1/log2(3).
    // User 1: hit at rank 2: recall 1, DCG 1/log2(3), IDCG 1.
    let l3 = 3f64.log2();
    let want_ndcg = ((1.0 / l3) / (1.0 + 1.0 / l3) + 1.0 / l3) / 2.0;
    assert!((recall - 0.75).abs() < 1e-12, "{recall}");
    assert!((ndcg - want_ndcg).abs() < 1e-12, "{ndcg} vs {want_ndcg}");
}

/// Loss scaling unscales sparse gradients with the dense ones: a power-of-two scale
/// gives bit-identical steps, and an overflowing step leaves the tables and moments as
/// they were.
#[test]
fn loss_scaling_covers_sparse_gradients() {
    let dev = Device::cpu();
    let mut plain = TinyRec::new(20, true, &dev);
    let mut scaled = TinyRec::new(20, true, &dev);
    let (mut o1, mut o2) = (SparseAdam::new(0.05), SparseAdam::new(0.05));
    let mut scaler = tessera::optim::GradScaler::new(1024.0);
    for k in 0..3 {
        let (u, i, b) = batch(k, 20);
        let loss = plain.loss(&u, &i, &b);
        o1.step(&mut plain, &loss).unwrap();
        let loss = scaled.loss(&u, &i, &b);
        let r =
            o2.step_with(&mut scaled, &loss, StepOptions { scaler: Some(&mut scaler), ..Default::default() }).unwrap();
        assert!(r.applied);
    }
    assert_eq!(table_values(&mut plain), table_values(&mut scaled));
    // An overflow: the step is skipped, sparse tables included.
    let before = table_values(&mut scaled);
    let (u, i, b) = batch(9, 20);
    let loss = scaled.loss(&u, &i, &b).mul_scalar(1e38);
    let r = o2.step_with(&mut scaled, &loss, StepOptions { scaler: Some(&mut scaler), ..Default::default() }).unwrap();
    assert!(!r.applied);
    assert_eq!(table_values(&mut scaled), before);
}
