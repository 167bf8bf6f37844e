//! The engine's promises: laziness, fusion, one submit per realisation, pipeline and
//! buffer reuse, DOT output, printing, dispatch folding, and threads sharing a device.

mod common;
use common::{assert_close, devices, first_device, private_gpu as private_device, rand_t, Tol};
use tessera::{DType, Device, DeviceOptions, Tensor};

#[test]
fn ops_are_lazy_and_fuse_into_one_submit() {
    // The CPU backend runs the same schedule: the same kernels, no submits.
    for d in private_device(DeviceOptions::default()).into_iter().chain([Device::cpu()]) {
        lazy_and_fused_on(&d);
    }
}

fn lazy_and_fused_on(d: &Device) {
    let gpu = !d.is_cpu();
    // One realisation is one submit on a GPU, none on the CPU backend.
    let submits = usize::from(gpu) as u64;
    let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], [2, 3], d);
    let b = Tensor::from_slice(&[0.5f32, 1.0, 1.5], [3], d);
    let before = d.stats();
    let y = ((&x + &b) * 2.0).relu().exp().neg().sigmoid();
    assert_eq!(d.stats(), before, "building ops must not run anything");
    assert!(!y.is_realized());
    let v = y.to_vec_blocking::<f32>().unwrap();
    let s = d.stats();
    assert_eq!(s.submits - before.submits, submits, "one realisation, one submit");
    assert_eq!(s.realizations - before.realizations, 1);
    assert_eq!(
        s.kernels_dispatched - before.kernels_dispatched,
        1,
        "an element-wise chain with a broadcast is one kernel"
    );
    let want: Vec<f64> = [1.0f64, -2.0, 3.0, -4.0, 5.0, -6.0]
        .iter()
        .zip([0.5, 1.0, 1.5].iter().cycle())
        .map(|(x, b)| 1.0 / (1.0 + (((x + b) * 2.0f64).max(0.0).exp()).exp()))
        .collect();
    assert_close("chain", &v.iter().map(|&x| x as f64).collect::<Vec<_>>(), &want, Tol { atol: 1e-6, rtol: 1e-5 });

    // Softmax: one kernel (row max, sum and outputs in one workgroup per row).
    let before = d.stats();
    let p = x.softmax(-1);
    let _ = p.to_vec_blocking::<f32>().unwrap();
    let s = d.stats();
    assert_eq!(s.submits - before.submits, submits);
    assert_eq!(s.kernels_dispatched - before.kernels_dispatched, 1);

    // The same structure at another shape reuses every pipeline.
    if gpu {
        let before = d.stats();
        let z = rand_t(&[5, 7], 1, -1.0, 1.0, d).softmax(-1);
        let _ = z.to_vec_blocking::<f32>().unwrap();
        let s = d.stats();
        assert_eq!(s.pipelines_compiled, before.pipelines_compiled, "pipelines are keyed by structure, not shape");
        assert!(s.pipeline_cache_hits > before.pipeline_cache_hits);
    }

    // A transposed matmul operand is read in place, not copied.
    let w = rand_t(&[4, 3], 2, -1.0, 1.0, d);
    let before = d.stats();
    let _ = x.matmul(&w.t()).to_vec_blocking::<f32>().unwrap();
    assert_eq!(d.stats().kernels_dispatched - before.kernels_dispatched, 1, "x @ w.t() is one kernel");

    // Realising several tensors at once is still one submit, and a realised tensor is
    // read back without recomputation.
    let before = d.stats();
    let a = x.exp();
    let c = x.sum_all();
    let vals = tessera::read_all_blocking(&[a.clone(), c.clone()]).unwrap();
    assert_eq!(vals.len(), 2);
    assert_eq!(d.stats().submits - before.submits, submits);
    assert_eq!(d.stats().realizations - before.realizations, 1);
    let k = d.stats().kernels_dispatched;
    assert!(a.is_realized());
    let _ = a.to_vec_blocking::<f32>().unwrap();
    assert_eq!(d.stats().kernels_dispatched, k, "reading a realised tensor runs no kernel");
    let before = d.stats();
    a.realize_blocking().unwrap();
    assert_eq!(d.stats().submits, before.submits, "realising a realised tensor submits nothing");
    assert_eq!(d.stats().kernels_dispatched, before.kernels_dispatched);
}

#[test]
fn buffers_are_pooled_and_accounted() {
    let Some(d) = private_device(DeviceOptions::default()) else {
        return;
    };
    let x = rand_t(&[64, 64], 1, -1.0, 1.0, &d);
    let run = || {
        let y = x.matmul(&x).relu().sum(&[1], false);
        y.to_vec_blocking::<f32>().unwrap()
    };
    let _ = run();
    let after_first = d.stats();
    for _ in 0..5 {
        let _ = run();
    }
    let s = d.stats();
    assert_eq!(s.buffers_allocated, after_first.buffers_allocated, "steady state allocates nothing new");
    assert_eq!(s.bytes_in_use, after_first.bytes_in_use, "no buffer leaks between realisations");
    assert!(s.peak_bytes >= s.bytes_in_use && s.peak_bytes > 0);
    drop(x);
    assert!(d.stats().bytes_in_use < s.bytes_in_use, "dropping a tensor returns its buffer");
    assert!(d.trim_pool() > 0);
}

#[test]
fn graphs_print_as_dot_before_and_after_fusion() {
    let d = Device::reference();
    let x = Tensor::ones([2, 3], DType::F32, &d);
    let y = (x.exp() + 1.0).sum(&[1], false).relu();
    let dot = y.to_dot();
    assert!(dot.starts_with("digraph"));
    for op in ["exp", "add", "reduce_sum", "relu", "reshape"] {
        assert!(dot.contains(op), "{op} missing from {dot}");
    }
    let fused = y.to_dot_fused();
    assert_eq!(fused.matches("subgraph cluster_").count(), 2, "{fused}");
    assert!(fused.contains("Reduce") && fused.contains("Elementwise"), "{fused}");
}

#[test]
fn tensors_print_like_pytorch() {
    let d = first_device();
    let x = Tensor::from_slice(&[1.0f32, 2.5, -3.0, 4.0], [2, 2], &d);
    assert_eq!(format!("{x}"), "tensor([[ 1.0000,  2.5000],\n        [-3.0000,  4.0000]], shape=[2, 2], dtype=f32)");
    let m = x.gt_scalar(2.0);
    assert_eq!(format!("{m}"), "tensor([[False,  True],\n        [False,  True]], shape=[2, 2], dtype=bool)");
    let big = Tensor::arange(0.0, 5000.0, 1.0, DType::I32, &d);
    let s = format!("{big}");
    assert!(s.contains("...") && s.ends_with("shape=[5000], dtype=i32)"), "{s}");
    let bad = x.reshape([3]);
    assert!(format!("{bad}").contains("reshape"));
}

#[test]
fn wide_dispatches_fold_into_two_dimensions() {
    let Some(d) = private_device(DeviceOptions { max_workgroups_per_dimension: Some(4), ..Default::default() }) else {
        return;
    };
    let cpu = Device::reference();
    let build = |dev: &Device| {
        let x = rand_t(&[9000], 2, -1.0, 1.0, dev);
        let r = rand_t(&[20, 9], 3, -1.0, 1.0, dev);
        vec![(&x * 2.0).exp(), r.sum(&[1], false), x.reshape([10, 900]).max(&[1], false), x.cast(DType::F16) + 1.0]
    };
    let want = tessera::read_all_blocking(&build(&cpu)).unwrap();
    let got = tessera::read_all_blocking(&build(&d)).unwrap();
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let tol = if k == 3 { Tol::for_dtype(DType::F16) } else { Tol { atol: 1e-5, rtol: 1e-5 } };
        assert_close(&format!("folded output {k}"), g, w, tol);
    }
    // Over the folded limit (4 x 4 workgroups of 256 invocations, each writing
    // kernels::elementwise::EPT outputs) the error is clear.
    let too_big = Tensor::zeros([256 * 4 * 16 + 1], DType::F32, &d) + 1.0;
    let e = too_big.to_vec_blocking::<f32>().unwrap_err();
    assert!(e.to_string().contains("workgroup"), "{e}");
}

#[test]
fn tensors_and_devices_cross_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tensor>();
    assert_send_sync::<Device>();
    for d in devices().into_iter().chain([Device::reference()]) {
        common::record(&d);
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for i in 0..3 {
                        let x = Tensor::arange(0.0, 64.0, 1.0, DType::F32, &d).reshape([8, 8]);
                        let y = (&x * (t + i) as f32).sum(&[1], false).sum_all();
                        out.push(y.item_blocking::<f32>().unwrap());
                    }
                    (t, out)
                })
            })
            .collect();
        for h in handles {
            let (t, out) = h.join().expect("thread panicked");
            for (i, v) in out.iter().enumerate() {
                assert_eq!(*v, (2016 * (t + i)) as f32);
            }
        }
    }
}

#[test]
fn async_readback_works_through_any_executor() {
    for d in devices() {
        common::record(&d);
        let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3], &d);
        let v = futures_lite_block_on(async { (&x * &x).to_vec::<f32>().await }).unwrap();
        assert_eq!(v, vec![1.0, 4.0, 9.0]);
    }
}

/// A minimal executor of our own, to show `to_vec()` needs nothing from pollster.
fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
    fn noop(_: *const ()) {}
    fn clone(p: *const ()) -> RawWaker {
        RawWaker::new(p, &VTABLE)
    }
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    let waker = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) };
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

#[test]
fn an_application_can_share_its_wgpu_device() {
    let Some(d) = private_device(DeviceOptions::default()) else {
        return;
    };
    let (device, queue) = d.wgpu().unwrap();
    let shared = Device::from_wgpu(device.clone(), queue.clone());
    let x = Tensor::from_slice(&[1.0f32, 4.0, 9.0], [3], &shared);
    assert_eq!(x.sqrt().to_vec_blocking::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
    assert_eq!(shared.stats().submits, 1);
}

#[test]
fn long_and_diamond_chains_do_not_overflow() {
    for d in devices().into_iter().chain([Device::reference()]) {
        common::record(&d);
        let mut x = Tensor::zeros([4], DType::F32, &d);
        for _ in 0..5000 {
            x = &x + 1.0;
        }
        assert_eq!(x.to_vec_blocking::<f32>().unwrap(), vec![5000.0; 4]);
        let mut y = Tensor::ones([3], DType::F32, &d);
        for _ in 0..60 {
            y = (&y + &y) * 0.5; // a diamond: each level reads the previous one twice
        }
        assert_eq!(y.to_vec_blocking::<f32>().unwrap(), vec![1.0; 3]);
    }
}

#[test]
fn adapters_are_picked_by_name_or_backend() {
    let list = Device::list();
    let Some(first) = list.first() else {
        assert!(common::no_gpu_allowed(), "no GPU adapter: install Mesa's lavapipe (scripts/setup.sh)");
        return;
    };
    // Best first: no adapter later in the list has a better device type.
    let rank =
        |t: &str| ["DiscreteGpu", "IntegratedGpu", "VirtualGpu", "Cpu"].iter().position(|x| *x == t).unwrap_or(4);
    assert!(list.iter().all(|a| rank(&a.device_type) >= rank(&first.device_type)));
    for a in &list {
        let by_backend = DeviceOptions { adapter: Some(a.backend.to_lowercase()), ..Default::default() };
        let d = Device::with_options(by_backend).unwrap();
        assert_eq!(d.info().backend, a.backend);
    }
    let by_name = DeviceOptions {
        adapter: Some(first.name.chars().take(4).collect::<String>().to_uppercase()),
        ..Default::default()
    };
    assert_eq!(Device::with_options(by_name).unwrap().info().name, first.name);
    let none = DeviceOptions { adapter: Some("no-such-adapter".into()), ..Default::default() };
    let e = Device::with_options(none).unwrap_err();
    assert!(matches!(e, tessera::Error::NoAdapter(_)) && e.to_string().contains("no adapter matches"), "{e}");
}

/// A graph of the same structure with new leaves and new scalars replays its cached
/// plan, and the new scalars take effect.
#[test]
fn plans_replay_with_new_scalars() {
    for dev in common::gpu_devices() {
        common::record(dev);
        let run = |scale: f64, seed: u64, shift: f64| {
            let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [4], dev);
            let noise = Tensor::rand([4], seed, dev);
            let y = x.mul_scalar(scale).add(&noise).sub(&noise).pad(&[(1, 0)], shift).sum_all();
            (y.item_blocking::<f32>().unwrap(), noise.to_vec_blocking::<f32>().unwrap())
        };
        let before = dev.stats();
        let (a, na) = run(2.0, 1, 0.5);
        let mid = dev.stats();
        let (b, nb) = run(3.0, 2, -1.0);
        let after = dev.stats();
        assert!((a - 20.5).abs() < 1e-4, "{a} on {}", common::label(dev));
        assert!((b - 29.0).abs() < 1e-4, "{b}: the new scalars must be used on {}", common::label(dev));
        assert_ne!(na, nb, "a new seed gives new numbers");
        assert!(after.plans_replayed > mid.plans_replayed, "the second graph replays on {}", common::label(dev));
        assert!(mid.plans_built > before.plans_built);
    }
}

/// More graph shapes than the plan cache holds (256) pass through, with one graph used
/// all along: the cache drops the least recently used plans, so that graph's plan is
/// built once and replayed every time after (a cache that started over when full would
/// build it again).
#[test]
fn a_plan_in_use_outlives_a_stream_of_new_shapes() {
    let Some(dev) = private_device(DeviceOptions::default()) else { return };
    let run = |n: usize| {
        let x = Tensor::arange(0.0, n as f64, 1.0, DType::F32, &dev);
        x.mul_scalar(2.0).add_scalar(1.0).sum_all().item_blocking::<f32>().unwrap()
    };
    let before = dev.stats();
    assert_eq!(run(4), 16.0);
    for n in 5..305 {
        assert_eq!(run(n), (n * n) as f32, "n = {n}");
        if n % 10 == 0 {
            assert_eq!(run(4), 16.0);
        }
    }
    let after = dev.stats();
    assert_eq!(after.plans_built - before.plans_built, 301, "one plan per shape, the busy one built once");
    assert_eq!(after.plans_replayed - before.plans_replayed, 30);
}

/// A device keeps at most `max_pipelines` compiled kernels: past it the least recently
/// used goes and is compiled again when it is needed again, while a kernel in use all
/// along stays; the results stay right throughout.
#[test]
fn the_pipeline_cache_drops_its_least_recently_used_kernels() {
    let Some(dev) = private_device(DeviceOptions { max_pipelines: Some(3), ..Default::default() }) else { return };
    let x = Tensor::from_slice(&[0.25f32, 0.5, 1.0, 2.0], [4], &dev);
    x.realize_blocking().unwrap();
    let ops: [fn(&Tensor) -> Tensor; 5] = [|t| t.exp(), |t| t.sqrt(), |t| t.sin(), |t| t.cos(), |t| t.tanh()];
    let want: [fn(f32) -> f32; 5] = [f32::exp, f32::sqrt, f32::sin, f32::cos, f32::tanh];
    let check = |k: usize| {
        let got = ops[k](&x).to_vec_blocking::<f32>().unwrap();
        for (g, v) in got.iter().zip([0.25f32, 0.5, 1.0, 2.0]) {
            assert!((g - want[k](v)).abs() < 1e-5, "op {k}: {g} for {v}");
        }
    };
    let compiled = || dev.stats().pipelines_compiled;
    let start = compiled();
    // The busy kernel (exp) is used before each new one, so it is never the oldest.
    for k in 1..5 {
        check(0);
        check(k);
    }
    assert_eq!(compiled() - start, 5, "each kernel compiled once, exp kept all along");
    check(0);
    check(4);
    assert_eq!(compiled() - start, 5, "exp and tanh are among the 3 kept");
    check(1);
    assert_eq!(compiled() - start, 6, "sqrt was dropped, so it is compiled again");
    // Without a limit nothing is compiled twice.
    let free = private_device(DeviceOptions::default()).expect("the adapter just opened");
    let before = free.stats().pipelines_compiled;
    for k in (0..5).chain(0..5) {
        let _ = ops[k](&Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [4], &free)).to_vec_blocking::<f32>().unwrap();
    }
    assert_eq!(free.stats().pipelines_compiled - before, 5);
}

#[test]
fn matmul_autotune_is_cached_per_adapter_and_every_candidate_is_correct() {
    use tessera::device::autotune::{ensure, lookup, CANDIDATES};
    let Some(probe) = private_device(DeviceOptions::default()) else { return };
    let first = Device::list().into_iter().find(|a| a.name == probe.info().name).expect("the probed adapter");
    let opts = DeviceOptions { adapter_index: Some(first.index), ..Default::default() };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("autotune.json");
    // First call measures every candidate and writes the cache; the second reads it.
    let tuned = ensure(&opts, Some(&path)).unwrap();
    assert!(!tuned.cached && tuned.timings.len() == CANDIDATES.len(), "{tuned:?}");
    assert!(path.exists());
    let again = ensure(&opts, Some(&path)).unwrap();
    assert!(again.cached && again.best == tuned.best && again.key == tuned.key, "{again:?}");
    let d = Device::with_options(DeviceOptions { autotune_cache: Some(path.clone()), ..opts.clone() }).unwrap();
    assert_eq!(d.matmul_config(), Some(tuned.best));

    // A cache naming another candidate is applied; a corrupt or hand-edited one is not.
    let other = CANDIDATES.into_iter().find(|c| *c != tuned.best).unwrap();
    let entry = |kernel: &str, tm: u32| {
        format!(r#"{{"{}": {{"kernel": "{kernel}", "tm": {tm}, "tn": {}}}}}"#, tuned.key, other.tn)
    };
    std::fs::write(&path, entry(other.kernel(), other.tm as u32)).unwrap();
    assert_eq!(lookup(&path, &tuned.key), Some(other));
    let d = Device::with_options(DeviceOptions { autotune_cache: Some(path.clone()), ..opts.clone() }).unwrap();
    assert_eq!(d.matmul_config(), Some(other));
    assert_eq!(
        d.fused_attention(),
        d.info().device_type == "Cpu",
        "no attention entry: fused on CPU adapters, else composed"
    );
    // A cache entry for `other` with these switches, and the device that applies it.
    let with_switches = |switches: &str| {
        let entry = format!(
            r#"{{"{}": {{"kernel": "{}", "tm": {}, "tn": {}, {switches}}}}}"#,
            tuned.key,
            other.kernel(),
            other.tm,
            other.tn
        );
        std::fs::write(&path, entry).unwrap();
        Device::with_options(DeviceOptions { autotune_cache: Some(path.clone()), ..opts.clone() }).unwrap()
    };
    let d = with_switches(r#""attention": "composed""#);
    assert!(!d.fused_attention(), "the measured attention choice applies");
    // The measured attention choice is applied: sdpa becomes one fused kernel.
    let d = with_switches(r#""attention": "fused", "conv": "materialised""#);
    assert!(d.fused_attention());
    assert!(!d.implicit_gemm(), "the measured conv choice applies");
    let forced = DeviceOptions { autotune_cache: Some(path.clone()), implicit_gemm: Some(true), ..opts.clone() };
    assert!(Device::with_options(forced).unwrap().implicit_gemm(), "an explicit option wins");
    let (q, k) = (rand_t(&[1, 2, 5, 8], 1, -1.0, 1.0, &d), rand_t(&[1, 2, 7, 8], 2, -1.0, 1.0, &d));
    tessera::read_all_blocking(&[q.clone(), k.clone()]).unwrap();
    let before = d.stats();
    let got = Tensor::scaled_dot_product_attention(&q, &k, &k, None, true).to_f64_vec_blocking().unwrap();
    assert_eq!(d.stats().kernels_dispatched - before.kernels_dispatched, 1);
    let cpu = Device::reference();
    let (qc, kc) = (rand_t(&[1, 2, 5, 8], 1, -1.0, 1.0, &cpu), rand_t(&[1, 2, 7, 8], 2, -1.0, 1.0, &cpu));
    let want = Tensor::scaled_dot_product_attention(&qc, &kc, &kc, None, true).to_f64_vec_blocking().unwrap();
    assert_close("tuned fused attention", &got, &want, Tol { atol: 1e-5, rtol: 1e-4 });
    for bad in [entry("direct", 99), "{not json".to_string(), String::new()] {
        std::fs::write(&path, bad).unwrap();
        assert_eq!(lookup(&path, &tuned.key), None);
        assert!(Device::with_options(DeviceOptions { autotune_cache: Some(path.clone()), ..opts.clone() }).is_ok());
    }

    // Every candidate computes the same products as the reference, on odd shapes.
    let cpu = Device::reference();
    let build = |dev: &Device| {
        let a = rand_t(&[37, 20], 1, -1.0, 1.0, dev);
        let b = rand_t(&[20, 70], 2, -1.0, 1.0, dev);
        let w = rand_t(&[66, 20], 3, -1.0, 1.0, dev);
        // 4-aligned operands in every layout too (the vec4 kernels).
        let (p, q) = (rand_t(&[20, 36], 5, -1.0, 1.0, dev), rand_t(&[20, 68], 6, -1.0, 1.0, dev));
        let h = rand_t(&[40, 20], 9, -1.0, 1.0, dev).cast(DType::F16);
        vec![
            a.matmul(&b),
            a.matmul(&w.t()),
            b.t().matmul(&a.t()),
            rand_t(&[3, 5, 20], 4, -1.0, 1.0, dev).matmul(&b),
            p.t().matmul(&q),
            q.t().matmul(&rand_t(&[37, 20], 7, -1.0, 1.0, dev).t()),
            rand_t(&[3, 37, 20], 8, -1.0, 1.0, dev).matmul(&q),
            h.matmul(&q.cast(DType::F16)).cast(DType::F32),
        ]
    };
    let want = tessera::read_all_blocking(&build(&cpu)).unwrap();
    for c in CANDIDATES {
        let d = Device::with_options(DeviceOptions { matmul: Some(c), ..opts.clone() }).unwrap();
        let got = tessera::read_all_blocking(&build(&d)).unwrap();
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("{} output {k}", c.name()), g, w, Tol { atol: 1e-5, rtol: 1e-5 });
        }
    }
}

/// With the tiled matmul kernel a convolution is an implicit GEMM: the product gathers
/// the windows as its tiles load, so no column matrix is written (two kernels: the
/// product, then bias and layout); the direct kernel materialises the columns first.
/// Forward and both gradients match the reference either way.
#[test]
fn convolutions_are_implicit_gemms_on_the_tiled_kernel() {
    use tessera::ops::nn::Conv2dOptions;
    let opts = Conv2dOptions { stride: (2, 1), padding: (1, 1), dilation: (1, 2), groups: 1 };
    // Small images (one product over the batch) and large ones (a product per image).
    for size in [[2usize, 5, 9, 8], [2, 5, 34, 17]] {
        convolution_case(opts, size);
    }
}

fn convolution_case(opts: tessera::ops::nn::Conv2dOptions, size: [usize; 4]) {
    let build = |d: &Device| {
        let x = rand_t(&size, 1, -1.0, 1.0, d).requires_grad();
        let w = rand_t(&[6, 5, 3, 2], 2, -1.0, 1.0, d).requires_grad();
        let b = rand_t(&[6], 3, -1.0, 1.0, d);
        (x, w, b)
    };
    let cpu = Device::reference();
    let (x, w, b) = build(&cpu);
    let y = x.conv2d(&w, Some(&b), opts);
    let want = y.to_f64_vec_blocking().unwrap();
    let grads = y.square().sum_all().backward().unwrap();
    let (want_gx, want_gw) =
        (grads.get(&x).unwrap().to_f64_vec_blocking().unwrap(), grads.get(&w).unwrap().to_f64_vec_blocking().unwrap());
    for tiled in [true, false] {
        let Some(d) = private_device(DeviceOptions { tiled_matmul: Some(tiled), ..Default::default() }) else {
            continue;
        };
        let (x, w, b) = build(&d);
        tessera::read_all_blocking(&[x.clone(), w.clone(), b.clone()]).unwrap();
        let y = x.conv2d(&w, Some(&b), opts);
        // The fused DOT draws the same kernels, the windows inside the product. A
        // product per image is already NCHW: the bias is its epilogue. The direct
        // kernels also pad the weight's 30 taps to 32 (one more kernel).
        let per_image = size[2] > 16;
        let n_kernels: u64 = match (tiled, per_image) {
            (true, true) => 1,
            (true, false) => 2,
            (false, true) => 3,
            (false, false) => 4,
        };
        let dot = y.to_dot_fused();
        assert_eq!(dot.matches("subgraph cluster").count() as u64, n_kernels, "{dot}");
        let before = d.stats();
        let got = y.to_f64_vec_blocking().unwrap();
        let kernels = d.stats().kernels_dispatched - before.kernels_dispatched;
        assert_eq!(kernels, n_kernels, "conv2d kernels with tiled={tiled}, {size:?}");
        let tol = Tol { atol: 1e-5, rtol: 1e-5 }.scaled(30);
        assert_close(&format!("conv2d tiled={tiled}"), &got, &want, tol);
        let grads = y.square().sum_all().backward().unwrap();
        let gx = grads.get(&x).unwrap().to_f64_vec_blocking().unwrap();
        let gw = grads.get(&w).unwrap().to_f64_vec_blocking().unwrap();
        assert_close(&format!("conv2d dx tiled={tiled}"), &gx, &want_gx, tol.scaled(20));
        assert_close(&format!("conv2d dw tiled={tiled}"), &gw, &want_gw, tol.scaled(40));
    }
}

/// f16 softmax and layer norm take the one-kernel paths too (computed in f32, rounded
/// once by a cast), and their gradients come back in f16.
#[test]
fn f16_softmax_and_norms_are_one_kernel_each() {
    let Some(d) = private_device(DeviceOptions::default()) else {
        return;
    };
    let build = |dev: &Device| {
        let x = rand_t(&[6, 40], 1, -3.0, 3.0, dev).cast(DType::F16).requires_grad();
        let w = rand_t(&[40], 2, 0.5, 1.5, dev).cast(DType::F16).requires_grad();
        let b = rand_t(&[40], 3, -0.5, 0.5, dev).cast(DType::F16);
        (x, w, b)
    };
    let (x, w, b) = build(&d);
    tessera::read_all_blocking(&[x.clone(), w.clone(), b.clone()]).unwrap();
    for (name, y) in [("softmax", x.softmax(-1)), ("layer_norm", x.layer_norm(Some(&w), Some(&b), 1e-5))] {
        let before = d.stats();
        y.realize_blocking().unwrap();
        // The kernel (f32 out) and the cast to f16.
        assert_eq!(d.stats().kernels_dispatched - before.kernels_dispatched, 2, "{name}");
        assert_eq!(y.dtype(), DType::F16);
    }
    let cpu = Device::reference();
    let (xc, wc, bc) = build(&cpu);
    let loss = |x: &Tensor, w: &Tensor, b: &Tensor| {
        (x.softmax(-1).cast(DType::F32).square().sum_all()
            + x.layer_norm(Some(w), Some(b), 1e-5).cast(DType::F32).square().sum_all())
        .reshape(vec![1])
    };
    let (l, lc) = (loss(&x, &w, &b), loss(&xc, &wc, &bc));
    let (g, gc) = (l.backward().unwrap(), lc.backward().unwrap());
    for (t, tc) in [(&x, &xc), (&w, &wc)] {
        let (gt, gtc) = (g.get(t).unwrap(), gc.get(tc).unwrap());
        assert_eq!(gt.dtype(), DType::F16);
        let got = gt.to_f64_vec_blocking().unwrap();
        assert_close("f16 gradient", &got, &gtc.to_f64_vec_blocking().unwrap(), Tol { atol: 2e-2, rtol: 2e-2 });
    }
}

/// `Device::new()` takes a hardware GPU when there is one and the CPU backend
/// otherwise (a software adapter such as lavapipe is slower than the CPU backend on
/// the same cores), and says why; `cpu`, `gpu` and `reference` pick explicitly.
#[test]
fn placement_prefers_a_hardware_gpu_then_the_cpu_backend() {
    let list = Device::list();
    let auto = Device::with_options(DeviceOptions::default()).unwrap();
    let hardware =
        list.iter().find(|a| ["DiscreteGpu", "IntegratedGpu", "VirtualGpu"].contains(&a.device_type.as_str()));
    match (hardware, list.first()) {
        (Some(h), _) => {
            assert_eq!(auto.info().name, h.name);
            assert!(auto.info().placement.contains("hardware GPU"), "{}", auto.info().placement);
        }
        (None, Some(soft)) => {
            assert!(auto.is_cpu() && !auto.is_reference(), "{:?}", auto.info());
            let why = &auto.info().placement;
            assert!(why.contains(&soft.name) && why.contains("software adapter"), "{why}");
        }
        (None, None) => assert!(auto.is_cpu() && auto.info().placement.contains("no GPU adapter")),
    }
    let pick = |name: &str| Device::with_options(DeviceOptions { adapter: Some(name.into()), ..Default::default() });
    let cpu = pick("cpu").unwrap();
    assert!(cpu.is_cpu() && !cpu.is_reference() && cpu.info().backend == "Cpu");
    assert!(pick("reference").unwrap().is_reference());
    if let Some(first) = list.first() {
        let gpu = pick("GPU").unwrap();
        assert_eq!(gpu.info().name, first.name, "\"gpu\" is the best wgpu adapter of any kind");
        assert!(!gpu.is_cpu());
    }
}

#[test]
fn sibling_outputs_of_one_shape_are_one_kernel() {
    // An optimiser's new weight and both moments, realised together: one kernel that
    // computes the moments once and stores all three, on a GPU and on the CPU backend.
    let gpu = private_device(DeviceOptions::default()).expect("a GPU device");
    for d in [gpu, Device::cpu()] {
        siblings_in_one_kernel_on(&d);
    }
}

fn siblings_in_one_kernel_on(d: &Device) {
    let d = d.clone();
    let submits = u64::from(!d.is_cpu());
    for n in [4096usize, 1001] {
        let (p, g, m0, v0) = (
            rand_t(&[n], 1, -1.0, 1.0, &d),
            rand_t(&[n], 2, -1.0, 1.0, &d),
            rand_t(&[n], 3, -1.0, 1.0, &d),
            rand_t(&[n], 4, 0.0, 1.0, &d),
        );
        tessera::read_all_blocking(&[p.clone(), g.clone(), m0.clone(), v0.clone()]).unwrap();
        let m = &m0 * 0.9 + &g * 0.1;
        let v = &v0 * 0.999 + &g.square() * 0.001;
        let np = &p - &(&m / &(v.sqrt() + 1e-8)) * 0.01;
        let before = d.stats();
        let got = tessera::read_all_blocking(&[np, m, v]).unwrap();
        let s = d.stats();
        assert_eq!(
            s.kernels_dispatched - before.kernels_dispatched,
            1,
            "n = {n}: weight and moments in one kernel on {d}"
        );
        assert_eq!(s.submits - before.submits, submits);
        let host = |t: &Tensor| t.to_f64_vec_blocking().unwrap();
        let (p, g, m0, v0) = (host(&p), host(&g), host(&m0), host(&v0));
        let wm: Vec<f64> = (0..n).map(|i| m0[i] * 0.9 + g[i] * 0.1).collect();
        let wv: Vec<f64> = (0..n).map(|i| v0[i] * 0.999 + g[i] * g[i] * 0.001).collect();
        let wp: Vec<f64> = (0..n).map(|i| p[i] - wm[i] / (wv[i].sqrt() + 1e-8) * 0.01).collect();
        let tol = Tol { atol: 1e-5, rtol: 1e-5 };
        assert_close("weight", &got[0], &wp, tol);
        assert_close("first moment", &got[1], &wm, tol);
        assert_close("second moment", &got[2], &wv, tol);
    }
    // Outputs of another shape, or that share nothing, stay separate kernels.
    let x = rand_t(&[64], 5, -1.0, 1.0, &d);
    let y = rand_t(&[32], 6, -1.0, 1.0, &d);
    tessera::read_all_blocking(&[x.clone(), y.clone()]).unwrap();
    let before = d.stats();
    tessera::read_all_blocking(&[x.exp(), x.narrow(0, 0, 32) + &y, y.relu()]).unwrap();
    assert_eq!(d.stats().kernels_dispatched - before.kernels_dispatched, 2, "[64] alone, the two [32] together on {d}");
}

#[test]
fn matmul_epilogues_are_fused_into_the_product() {
    // Linear then GELU, a residual add, a cast: one kernel with the product, on the
    // GPU and on the CPU backend. A product that is also read elsewhere (or asked for)
    // keeps its own kernel.
    let gpu = private_device(DeviceOptions::default()).expect("a GPU device");
    for d in [gpu, Device::cpu()] {
        let x = rand_t(&[24, 32], 1, -1.0, 1.0, &d);
        let w = rand_t(&[40, 32], 2, -1.0, 1.0, &d);
        let b = rand_t(&[40], 3, -1.0, 1.0, &d);
        let r = rand_t(&[24, 40], 4, -1.0, 1.0, &d);
        tessera::read_all_blocking(&[x.clone(), w.clone(), b.clone(), r.clone()]).unwrap();
        let kernels = |ts: &[Tensor]| {
            let before = d.stats();
            tessera::read_all_blocking(ts).unwrap();
            d.stats().kernels_dispatched - before.kernels_dispatched
        };
        let lin = x.matmul(&w.t()) + &b;
        assert_eq!(kernels(&[lin.gelu()]), 1, "Linear + GELU on {d}");
        assert_eq!(kernels(&[(x.matmul(&w.t()) + &b + &r).relu()]), 1, "bias + residual + ReLU on {d}");
        let heads = (x.matmul(&w.t()) + &b).reshape([2, 12, 5, 8]).permute(&[0, 2, 1, 3]);
        assert_eq!(kernels(&[heads]), 1, "bias + head split on {d}");
        let p = x.matmul(&w.t());
        assert_eq!(kernels(&[p.clone(), p.relu()]), 2, "a requested product keeps its kernel on {d}");
        // Two readers of one product: the product, then both readers in one kernel.
        let q = x.matmul(&w.t());
        assert_eq!(kernels(&[q.relu(), q.exp()]), 2, "a product read twice keeps its kernel on {d}");
    }
}

/// `to_le_bytes` gives each dtype's element bytes (numpy's `tobytes`) on every device and
/// the reference, computed or uploaded, and refuses quantised tensors.
#[test]
fn to_le_bytes_per_dtype() {
    let f = [1.5f32, -2.0, 0.0, 3.25, 1e6];
    let want_f32: Vec<u8> = f.iter().flat_map(|x| x.to_le_bytes()).collect();
    let want_i32: Vec<u8> = [1i32, -2, 0, 3, 1_000_000].iter().flat_map(|x| x.to_le_bytes()).collect();
    let want_u32: Vec<u8> = [2u32, 0, 4_000_000_000, 3, 7].iter().flat_map(|x| x.to_le_bytes()).collect();
    let want_f16: Vec<u8> = f.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
    for dev in devices().into_iter().chain([Device::reference()]) {
        let x = Tensor::from_slice(&f, [5], &dev);
        let computed = x.mul_scalar(1.0);
        let read = |t: &Tensor| pollster::block_on(t.to_le_bytes()).unwrap();
        assert_eq!(read(&x), want_f32, "f32 on {dev}");
        assert_eq!(read(&computed), want_f32, "computed f32 on {dev}");
        assert_eq!(read(&Tensor::from_slice(&[1i32, -2, 0, 3, 1_000_000], [5], &dev)), want_i32, "i32 on {dev}");
        assert_eq!(read(&Tensor::from_slice(&[2u32, 0, 4_000_000_000, 3, 7], [5], &dev)), want_u32, "u32 on {dev}");
        assert_eq!(read(&x.cast(DType::F16)), want_f16, "f16 on {dev}");
        assert_eq!(read(&x.gt_scalar(0.5)), vec![1, 0, 0, 1, 1], "bool on {dev}");
        let q = Tensor::ones([1, 32], DType::F32, &dev).cast(DType::Q8_0);
        assert!(pollster::block_on(q.to_le_bytes()).is_err(), "q8_0 on {dev}");
    }
}

#[test]
fn zeros_come_back_zero_from_reused_memory_and_negative_zero_keeps_its_sign() {
    // The CPU backend makes a zero constant a zeroed buffer, without evaluating it: a
    // buffer it reuses must still come back all zero, and -0.0 is not that constant.
    for d in devices() {
        let n = 100_003;
        for dt in [DType::F32, DType::F16, DType::I32, DType::U32, DType::Bool] {
            // Leave freed buffers of this size full of sevens (or true) behind.
            let sevens = (Tensor::zeros([n], DType::F32, &d) + 7.0).cast(dt);
            tessera::read_all_blocking(std::slice::from_ref(&sevens)).unwrap();
            drop(sevens);
            let z = Tensor::zeros([n], dt, &d).cast(DType::F32).to_vec_blocking::<f32>().unwrap();
            assert!(z.iter().all(|&x| x.to_bits() == 0), "{dt:?} zeros on {}", common::label(&d));
        }
        let neg = Tensor::full(-0.0, [n], DType::F32, &d).to_vec_blocking::<f32>().unwrap();
        assert!(neg.iter().all(|&x| x.to_bits() == 0x8000_0000), "-0.0 keeps its sign on {}", common::label(&d));
    }
}

#[test]
fn a_random_expression_broadcast_over_millions_is_drawn_once() {
    // A fresh weight is still a random expression. Broadcast over a few elements it
    // fuses into its consumer; over millions, where each element would draw it again,
    // it gets its own kernel first. The values are the same either way.
    let gpu = private_device(DeviceOptions::default()).expect("a GPU device");
    for d in [gpu, Device::cpu()] {
        for (cols, kernels) in [(100usize, 1u64), (600_000, 2)] {
            let x = rand_t(&[8, cols], 1, -1.0, 1.0, &d);
            x.realize_blocking().unwrap();
            let w = Tensor::rand([8, 1], 7, &d) * 0.5 - 0.25;
            let y = &x * &w;
            let before = d.stats();
            let got = y.to_vec_blocking::<f32>().unwrap();
            assert_eq!(d.stats().kernels_dispatched - before.kernels_dispatched, kernels, "{cols} columns on {d}");
            let (xv, wv) = (x.to_vec_blocking::<f32>().unwrap(), w.to_vec_blocking::<f32>().unwrap());
            let want: Vec<f64> = xv.iter().enumerate().map(|(i, &v)| (v * wv[i / cols]) as f64).collect();
            let got: Vec<f64> = got.iter().map(|&v| v as f64).collect();
            assert_close(&format!("x * w, {cols} columns on {d}"), &got, &want, Tol::for_dtype(DType::F32));
        }
    }
}

/// The shape of every kernel's output in the schedule that realises `targets`.
fn kernel_outputs(targets: &[Tensor]) -> Vec<Vec<usize>> {
    let s = tessera::graph::schedule::schedule(targets, 8);
    s.kernels.iter().map(|k| k.root.dims().to_vec()).collect()
}

/// A costly expression read by two kernels through a broadcast gets its own buffer
/// before the broadcast, not after: a few-channel convolution's windows, repeated over
/// its output channels, are stored once per window element, and the forward product and
/// the weight gradient both read them broadcast. The values match the reference. (On
/// the tiled kernels: CPU adapters' direct kernels convolve through a product instead.)
#[test]
fn a_shared_expression_under_a_broadcast_is_stored_unrepeated() {
    let gpu = private_device(DeviceOptions { tiled_matmul: Some(true), ..Default::default() }).expect("a GPU device");
    let (n, oc, side) = (3usize, 6usize, 10usize);
    let build = |d: &Device| {
        let x = rand_t(&[n, 1, side, side], 1, -1.0, 1.0, d).requires_grad();
        let w = rand_t(&[oc, 1, 3, 3], 2, -1.0, 1.0, d).requires_grad();
        tessera::read_all_blocking(&[x.clone(), w.clone()]).unwrap();
        let y = x.conv2d(&w, None, tessera::ops::nn::Conv2dOptions::new(1, 1));
        let gw = y.square().sum_all().backward().unwrap().get(&w).unwrap().clone();
        (y, gw)
    };
    let (y, gw) = build(&gpu);
    let roots = kernel_outputs(&[y.clone(), gw.clone()]);
    // The windows: one value per (image, window element, position), nothing per channel.
    let windows = n * 9 * side * side;
    assert!(roots.iter().any(|d| d.iter().product::<usize>() == windows), "kernel outputs {roots:?}");
    assert!(!roots.iter().any(|d| d.iter().product::<usize>() == windows * oc), "kernel outputs {roots:?}");
    let got = tessera::read_all_blocking(&[y, gw]).unwrap();
    let (ry, rgw) = build(&Device::reference());
    let want = tessera::read_all_blocking(&[ry, rgw]).unwrap();
    let tol = Tol { atol: 1e-5, rtol: 1e-5 }.scaled(30);
    assert_close("conv2d", &got[0], &want[0], tol);
    assert_close("conv2d dw", &got[1], &want[1], tol.scaled(40));
}

/// A first convolution's weight gradient multiplies its output gradient (here through
/// a bias, a ReLU and a max-pool: a dozen loads and ops) by the windows, broadcast over
/// the window: the output gradient is stored once, not recomputed for each of the 9
/// window elements, and the bias gradient reads the same buffer. The values match the
/// reference.
#[test]
fn a_costly_gradient_under_a_large_broadcast_is_stored_once() {
    let gpu = private_device(DeviceOptions::default()).expect("a GPU device");
    let (n, oc, side) = (4usize, 8usize, 40usize);
    let build = |d: &Device| {
        let x = rand_t(&[n, 1, side, side], 3, -1.0, 1.0, d).requires_grad();
        let w = rand_t(&[oc, 1, 3, 3], 4, -1.0, 1.0, d).requires_grad();
        let b = rand_t(&[oc], 5, -0.5, 0.5, d).requires_grad();
        tessera::read_all_blocking(&[x.clone(), w.clone(), b.clone()]).unwrap();
        let y = x.conv2d(&w, Some(&b), tessera::ops::nn::Conv2dOptions::new(1, 1)).relu().max_pool2d(2, 2, 0);
        let grads = y.square().sum_all().backward().unwrap();
        (grads.get(&w).unwrap().clone(), grads.get(&b).unwrap().clone())
    };
    let (gw, gb) = build(&gpu);
    let roots = kernel_outputs(&[gw.clone(), gb.clone()]);
    // Two kernels write one value per (image, channel, pixel): the convolution and the
    // gradient at its output.
    let per_pixel = roots.iter().filter(|d| d.iter().product::<usize>() == n * oc * side * side).count();
    assert_eq!(per_pixel, 2, "kernel outputs {roots:?}");
    let got = tessera::read_all_blocking(&[gw, gb]).unwrap();
    let (rgw, rgb) = build(&Device::reference());
    let want = tessera::read_all_blocking(&[rgw, rgb]).unwrap();
    let tol = Tol { atol: 1e-5, rtol: 1e-5 }.scaled(30);
    assert_close("conv2d dw", &got[0], &want[0], tol.scaled(40));
    assert_close("conv2d db", &got[1], &want[1], tol.scaled(40));
}

/// Read `targets`, asserting that at least `least` of the kernels run have `label` in
/// their name (from the profiler, which needs timestamp queries).
fn read_counting_kernels(targets: &[Tensor], label: &str, least: usize) -> Vec<Vec<f64>> {
    tessera::profile::start();
    let got = tessera::read_all_blocking(targets);
    let labels: Vec<String> = tessera::profile::stop().into_iter().map(|k| k.label).collect();
    let ran = labels.iter().filter(|l| l.contains(label)).count();
    assert!(
        ran >= least,
        "expected {least} kernels named {label}, ran {ran} (the adapter needs timestamp queries); kernels: {labels:?}"
    );
    got.unwrap()
}

/// On CPU adapters a product whose B is read in its own layout with rows that are not
/// 4-aligned pads B to a multiple of 8 columns and drops the extra ones
/// (`ops::matmul::aligned_product`), so it runs the subgroup kernels, never the scalar
/// one (about 10x slower on lavapipe): a stored B, an expression with an epilogue after
/// the narrow, a batch with a broadcast B, and a weight gradient whose own product has
/// 70 columns, against the reference.
#[test]
fn products_with_unaligned_columns_take_the_vector_kernels() {
    use tessera::device::autotune::MatmulConfig;
    let matmul = Some(MatmulConfig { direct: true, tm: 8, tn: 2, vec4: true });
    let gpu = private_device(DeviceOptions { matmul, ..Default::default() }).expect("a GPU device");
    let build = |d: &Device| {
        let a = rand_t(&[40, 64], 1, -1.0, 1.0, d);
        let stored = rand_t(&[64, 67], 2, -1.0, 1.0, d);
        let x = rand_t(&[2, 20, 32], 3, -1.0, 1.0, d);
        let w = rand_t(&[32, 70], 4, -1.0, 1.0, d).requires_grad();
        tessera::read_all_blocking(&[a.clone(), stored.clone(), x.clone(), w.clone()]).unwrap();
        let bias = rand_t(&[101], 5, -1.0, 1.0, d);
        let y = x.matmul(&w);
        let gw = y.square().sum_all().backward().unwrap().get(&w).unwrap().clone();
        vec![
            a.matmul(&stored),
            (a.matmul(&(rand_t(&[64, 101], 6, -1.0, 1.0, d) * 2.0)) + &bias).relu(),
            rand_t(&[3, 12, 16], 7, -1.0, 1.0, d).matmul(&rand_t(&[16, 66], 8, -1.0, 1.0, d)),
            y,
            gw,
        ]
    };
    let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
    tessera::profile::start();
    let got = tessera::read_all_blocking(&build(&gpu)).unwrap();
    // (The profiler also sees the kernels of tests running beside this one.)
    let labels: Vec<String> = tessera::profile::stop().into_iter().map(|k| k.label).collect();
    for padded in ["[40, 72]", "[40, 104]", "[3, 12, 72]", "[2, 20, 72]", "[2, 32, 72]"] {
        assert!(
            labels.iter().any(|l| l.starts_with("matmul")
                && (l.contains("sg_f32") || l.contains("tex_f32"))
                && l.ends_with(padded)),
            "a product of {padded} on the subgroup kernels (the adapter needs timestamp queries and subgroups): {labels:?}"
        );
    }
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(&format!("output {k}"), g, w, Tol { atol: 1e-4, rtol: 1e-4 }.scaled(8));
    }
}

/// The tuner's "tiled-vec4 8x8" configuration computes products of at least 128 rows and
/// columns in 128x128 tiles (`matmul_vec4_128.wgsl`): every layout, batched with
/// broadcasting, f16, K not a multiple of the tile depth, edges on both axes, and an
/// epilogue, against the reference. The profiler's labels show the kernel ran. The
/// other K steps (8, and 8 in doubled tiles: chosen by environment variables) run in a
/// child process of this test.
#[test]
fn large_products_in_128_tiles_match_the_reference() {
    let vars = ["TESSERA_MATMUL_BK", "TESSERA_MATMUL_DOUBLE"];
    if vars.iter().all(|v| std::env::var_os(v).is_none()) {
        for (var, value) in vars.into_iter().zip(["8", "1"]) {
            let name = "large_products_in_128_tiles_match_the_reference";
            let exe = std::env::current_exe().unwrap();
            let out = std::process::Command::new(exe).args(["--exact", name]).env(var, value).output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && text.contains("1 passed"), "with {var}={value}:\n{text}");
        }
    }
    use tessera::device::autotune::MatmulConfig;
    let matmul = Some(MatmulConfig { direct: false, tm: 8, tn: 8, vec4: true });
    let gpu = private_device(DeviceOptions { matmul, ..Default::default() }).expect("a GPU device");
    let build = |d: &Device| {
        let a = rand_t(&[130, 36], 1, -1.0, 1.0, d);
        let b = rand_t(&[36, 132], 2, -1.0, 1.0, d);
        let at = rand_t(&[20, 132], 3, -1.0, 1.0, d);
        let bt = rand_t(&[2, 136, 20], 4, -1.0, 1.0, d);
        let x = rand_t(&[2, 200, 20], 5, -1.0, 1.0, d);
        let bias = rand_t(&[136], 6, -1.0, 1.0, d);
        let h = rand_t(&[128, 64], 7, -1.0, 1.0, d).cast(DType::F16);
        let g = rand_t(&[64, 140], 8, -1.0, 1.0, d).cast(DType::F16);
        vec![
            a.matmul(&b),
            at.t().matmul(&rand_t(&[20, 256], 9, -1.0, 1.0, d)),
            (x.matmul(&bt.transpose(-1, -2)) + &bias).gelu(),
            at.t().matmul(&bt.transpose(-1, -2)),
            h.matmul(&g).cast(DType::F32),
        ]
    };
    let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
    let got = read_counting_kernels(&build(&gpu), "matmul_vec4x128", 5);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let tol = if k == 4 { Tol { atol: 2e-2, rtol: 1e-2 } } else { Tol { atol: 1e-4, rtol: 1e-4 } };
        assert_close(&format!("output {k}"), g, w, tol);
    }
}

/// One row of X against W stored [N, K] on a GPU configuration (not a CPU adapter's
/// direct kernels) takes the row GEMV (`gemv_rows.wgsl`) for f32, Q8_0 and Q4_0 weights:
/// 1, 2 and 4 rows of W per lane group (by N), partial workgroups, a batch, K of 2, 3
/// and 4 blocks per lane group's stride, and an epilogue, against the reference.
#[test]
fn one_row_products_on_gpus_take_the_row_gemv() {
    use tessera::device::autotune::MatmulConfig;
    let matmul = Some(MatmulConfig { direct: false, tm: 4, tn: 4, vec4: true });
    let gpu = private_device(DeviceOptions { matmul, ..Default::default() }).expect("a GPU device");
    for dt in [DType::F32, DType::Q8_0, DType::Q4_0] {
        let weight = |n: usize, k: usize, seed: u64, d: &Device| {
            let values = common::data(n * k, seed, -1.0, 1.0);
            match dt {
                DType::F32 => Tensor::from_slice(&values, [n, k], d),
                q => Tensor::from_quantized(q, [n, k], &tessera::quant::quantize(q, &values), d),
            }
        };
        let build = |d: &Device| {
            let (w8, w600, w2100) = (weight(8, 64, 1, d), weight(600, 96, 2, d), weight(2100, 128, 3, d));
            let x = rand_t(&[1, 128], 4, -1.0, 1.0, d);
            let bias = rand_t(&[2100], 5, -1.0, 1.0, d);
            vec![
                x.narrow(1, 0, 64).matmul(&w8.t()),
                x.narrow(1, 0, 96).matmul(&w600.t()),
                (x.matmul(&w2100.t()) + &bias).gelu(),
                rand_t(&[3, 1, 128], 6, -1.0, 1.0, d).matmul(&w2100.t()),
            ]
        };
        let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
        let got = read_counting_kernels(&build(&gpu), "gemv_rows", 4);
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("{dt} output {k}"), g, w, Tol { atol: 2e-4, rtol: 1e-4 });
        }
    }
}
