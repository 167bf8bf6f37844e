//! Fused attention (`Op::Attention`): the GPU kernel (staged K/V tiles on the tiled
//! path, direct reads on the direct path) against the reference, and the reference
//! against the unfused composition, over head dims, masks, causal and f16.

mod common;
use common::{assert_close, devices, label, rand_t, Tol};
use tessera::{DType, Device, Tensor};

/// Cases: (q dims, key length, causal, mask kind: 0 none, 1 bool padding, 2 float [T, S]).
/// The per-query kernel of CPU adapters takes two queries per lane past 32 (partial
/// groups, rows of 5 and 10 vec4s, masks), and with subgroups up to 24 queries in one
/// subgroup of 8 lanes, up to three per lane (cases 0, 3, 5 and the last).
const CASES: [(&[usize], usize, bool, u8); 14] = [
    (&[1, 2, 7, 32], 19, false, 0),
    (&[2, 3, 70, 64], 40, true, 0),
    (&[2, 1, 5, 128], 21, false, 1),
    (&[1, 4, 9, 64], 9, true, 2),
    (&[3, 6, 5], 11, false, 2),
    (&[2, 2, 12, 16], 7, true, 1),
    (&[1, 1, 3, 8], 70, false, 0),
    (&[1, 2, 45, 20], 33, false, 2),
    (&[2, 2, 100, 40], 90, true, 1),
    // Lavapipe's wide kernel: three blocks of 64 keys, the last partial, a bias that
    // varies over queries, and tiles of 32 queries, the second partial.
    (&[1, 2, 33, 24], 130, false, 2),
    // ... and past 64 columns, two blocks of 8 per lane, the second partly used.
    (&[1, 3, 20, 96], 70, true, 2),
    // f16 with an even head dim that is not a multiple of 4: scalar loads.
    (&[1, 2, 9, 6], 13, false, 1),
    // Up to 24 keys on CPU adapters: the per-query kernel, two queries per lane, with a
    // padding mask shared by the queries (each lane loads one key's bias of 8).
    (&[2, 2, 40, 16], 20, false, 1),
    // Up to 24 queries: one subgroup of 8 lanes, three queries per lane (the last lane
    // partly used), causal under a padding mask.
    (&[2, 3, 19, 64], 23, true, 1),
];

fn build(d: &Device, (qd, s, causal, mask): (&[usize], usize, bool, u8), dt: DType, seed: u64) -> Vec<Tensor> {
    let r = qd.len();
    let mut kd = qd.to_vec();
    kd[r - 2] = s;
    let q = rand_t(qd, seed, -1.0, 1.0, d).cast(dt);
    let k = rand_t(&kd, seed + 1, -1.0, 1.0, d).cast(dt);
    let v = rand_t(&kd, seed + 2, -1.0, 1.0, d).cast(dt);
    let m = match mask {
        1 => {
            // Key padding per batch row: the last keys of batch 0 dropped, one row masked whole.
            let b = qd[0];
            let keep: Vec<u8> = (0..b * s).map(|i| u8::from(i % s < s - 1 - (i / s) * 2 && i != s)).collect();
            let keep: Vec<bool> = keep.iter().map(|&x| x == 1).collect();
            let mut md = vec![1; r];
            md[0] = b;
            md[r - 1] = s;
            Some(Tensor::from_slice(&keep, md, d))
        }
        2 => Some(rand_t(&[qd[r - 2], s], seed + 3, -2.0, 2.0, d)),
        _ => None,
    };
    vec![Tensor::scaled_dot_product_attention_fused(&q, &k, &v, m.as_ref(), causal).cast(DType::F32)]
}

/// The devices under test, plus on each CPU adapter the per-query kernel without
/// subgroups (the direct matmul path with every other fallback), which neither the
/// adapter (subgroups) nor its fallback twin (the tiled kernel) runs.
fn attention_devices() -> Vec<Device> {
    static EXTRA: std::sync::OnceLock<Vec<Device>> = std::sync::OnceLock::new();
    let extra = EXTRA.get_or_init(|| {
        let tested: Vec<String> = common::gpu_devices().iter().map(|d| d.info().name.clone()).collect();
        Device::list()
            .into_iter()
            .filter(|a| a.device_type == "Cpu" && a.capabilities.subgroups && tested.contains(&a.name))
            .map(|a| {
                Device::with_options(tessera::DeviceOptions {
                    adapter_index: Some(a.index),
                    force_fallback: true,
                    tiled_matmul: Some(false),
                    ..Default::default()
                })
                .unwrap_or_else(|e| panic!("{} without subgroups: {e}", a.name))
            })
            .collect()
    });
    devices().into_iter().chain(extra.iter().cloned()).collect()
}

/// Every case on each Vulkan adapter (tiled and fallback paths); on GL (llvmpipe's GLSL
/// compiler takes ~4 s per attention variant) the first two cases in f32.
#[test]
fn fused_attention_matches_the_reference() {
    let cpu = Device::reference();
    for (n, case) in CASES.into_iter().enumerate() {
        let even = case.0[case.0.len() - 1] % 2 == 0;
        for (dt, tol) in [(DType::F32, Tol { atol: 2e-5, rtol: 1e-4 }), (DType::F16, Tol { atol: 2e-3, rtol: 1e-2 })] {
            if dt == DType::F16 && !even {
                continue;
            }
            let want = tessera::read_all_blocking(&build(&cpu, case, dt, 10 * n as u64)).unwrap();
            for dev in &attention_devices() {
                common::record(dev);
                if dev.info().backend == "Gl" && (n >= 2 || dt == DType::F16) {
                    continue;
                }
                let what = format!("attention {dt} case {n} on {}", label(dev));
                let got = tessera::read_all_blocking(&build(dev, case, dt, 10 * n as u64))
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_close(&what, &got[0], &want[0], tol);
            }
        }
    }
}

/// A float mask that is -inf over a whole row: that row is NaN (every weight is 0 over a
/// sum of 0), as in PyTorch and the composition, on every kernel; the other rows are not
/// disturbed. (A bool mask's masked scores are finite: its fully masked rows average.)
#[test]
fn a_row_masked_to_minus_infinity_is_nan_in_every_kernel() {
    let cpu = Device::reference();
    let (t, s) = (9usize, 70usize);
    let mask: Vec<f32> =
        (0..t * s).map(|i| if i / s == 4 { f32::NEG_INFINITY } else { ((i % 7) as f32) * -0.5 }).collect();
    let build = |d: &Device, dt: DType| {
        let q = rand_t(&[1, 2, t, 32], 1, -1.0, 1.0, d).cast(dt);
        let k = rand_t(&[1, 2, s, 32], 2, -1.0, 1.0, d).cast(dt);
        let v = rand_t(&[1, 2, s, 32], 3, -1.0, 1.0, d).cast(dt);
        let m = Tensor::from_slice(&mask, [t, s], d);
        vec![Tensor::scaled_dot_product_attention_fused(&q, &k, &v, Some(&m), false).cast(DType::F32)]
    };
    for (dt, tol) in [(DType::F32, Tol { atol: 2e-5, rtol: 1e-4 }), (DType::F16, Tol { atol: 2e-3, rtol: 1e-2 })] {
        let want = tessera::read_all_blocking(&build(&cpu, dt)).unwrap();
        assert!(want[0][4 * 32..5 * 32].iter().all(|x| x.is_nan()) && !want[0][..4 * 32].iter().any(|x| x.is_nan()));
        for dev in &attention_devices() {
            common::record(dev);
            // (On GL, f32 only: llvmpipe's GLSL compiler takes seconds per variant.)
            if dev.info().backend == "Gl" && dt == DType::F16 {
                continue;
            }
            let what = format!("attention {dt}, a row masked to -inf, on {}", label(dev));
            let got = tessera::read_all_blocking(&build(dev, dt)).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_close(&what, &got[0], &want[0], tol);
        }
    }
}

#[test]
fn the_reference_matches_the_unfused_composition() {
    let d = Device::reference();
    let q = rand_t(&[2, 3, 6, 8], 1, -1.0, 1.0, &d);
    let k = rand_t(&[2, 3, 10, 8], 2, -1.0, 1.0, &d);
    let v = rand_t(&[2, 3, 10, 8], 3, -1.0, 1.0, &d);
    let bias = rand_t(&[6, 10], 4, -1.0, 1.0, &d);
    let got = Tensor::scaled_dot_product_attention_fused(&q, &k, &v, Some(&bias), true);
    let scores = q.matmul(&k.transpose(-2, -1)).mul_scalar(1.0 / 8f64.sqrt()).add(&bias);
    let rows = Tensor::arange(0.0, 6.0, 1.0, DType::I32, &d).reshape(vec![6, 1]);
    let cols = Tensor::arange(0.0, 10.0, 1.0, DType::I32, &d).reshape(vec![1, 10]);
    let keep = cols.le(&rows.add_scalar(4.0)).broadcast_to(vec![2, 3, 6, 10]);
    let scores = Tensor::where_(&keep, &scores, &scores.full_like(-1e30));
    let want = scores.softmax(-1).matmul(&v);
    // No keys: the composition's empty softmax and zero-length product (zeros), not 0/0.
    let none = Tensor::zeros([2, 3, 0, 8], DType::F32, &d);
    let empty = Tensor::scaled_dot_product_attention_fused(&q, &none, &none, None, false);
    assert_eq!(empty.to_vec_blocking::<f32>().unwrap(), vec![0.0; 2 * 3 * 6 * 8]);
    let all = tessera::read_all_blocking(&[got, want]).unwrap();
    let (g, w) = (&all[0], &all[1]);
    assert_close("reference vs composite", g, w, Tol { atol: 1e-6, rtol: 1e-5 });
}

/// The heads merged back after attention (`[b, h, s, d] -> [b, s, h * d]`), as a
/// transformer does before its output projection: on wgpu the attention stores each
/// quad where the permute sends it and the copy kernel is gone, one dispatch fewer.
/// Against the reference on every device, over both CPU-adapter kernels (20 and 40
/// keys), with a padding mask and causal; and where the attention's output is also read
/// as it is, the copy stays.
#[test]
fn attention_stored_with_its_heads_merged_matches_the_reference() {
    let cpu = Device::reference();
    let build = |d: &Device, s: usize, causal: bool, also_raw: bool| {
        let (b, h, hd) = (2, 3, 8);
        let q = rand_t(&[b, h, s, hd], 1, -1.0, 1.0, d);
        let k = rand_t(&[b, h, s, hd], 2, -1.0, 1.0, d);
        let v = rand_t(&[b, h, s, hd], 3, -1.0, 1.0, d);
        let keep: Vec<bool> = (0..b * s).map(|i| i % s < s - 1 - i / s).collect();
        let m = Tensor::from_slice(&keep, [b, 1, 1, s], d);
        let ctx = Tensor::scaled_dot_product_attention_fused(&q, &k, &v, Some(&m), causal);
        let merged = ctx.permute(&[0, 2, 1, 3]).reshape([b, s, h * hd]);
        let w = rand_t(&[5, h * hd], 4, -1.0, 1.0, d);
        let mut out = vec![merged.clone(), merged.matmul(&w.t())];
        if also_raw {
            out.push(ctx * 2.0);
        }
        out
    };
    // On wgpu the attention and its heads' merge are one kernel; the CPU backend keeps
    // the copy (its attention writes whole heads). Devices of this test's own, so that
    // their counters see no other test's kernels.
    for dev in
        &common::private_gpu(tessera::DeviceOptions::default()).into_iter().chain([Device::cpu()]).collect::<Vec<_>>()
    {
        let (q, kv) = (rand_t(&[2, 3, 20, 8], 5, -1.0, 1.0, dev), rand_t(&[2, 3, 20, 8], 6, -1.0, 1.0, dev));
        q.realize_blocking().unwrap();
        kv.realize_blocking().unwrap();
        let merged = Tensor::scaled_dot_product_attention_fused(&q, &kv, &kv, None, false).permute(&[0, 2, 1, 3]);
        let before = dev.stats().kernels_dispatched;
        merged.reshape([2, 20, 24]).realize_blocking().unwrap();
        let kernels = dev.stats().kernels_dispatched - before;
        assert_eq!(kernels, if dev.is_cpu() { 2 } else { 1 }, "attention then merged heads on {}", label(dev));
    }
    for (s, causal, also_raw) in [(20, false, false), (40, true, false), (20, false, true)] {
        let want = tessera::read_all_blocking(&build(&cpu, s, causal, also_raw)).unwrap();
        for dev in &attention_devices() {
            common::record(dev);
            let what = format!(
                "attention with merged heads, {s} keys, causal {causal}, raw too {also_raw}, on {}",
                label(dev)
            );
            let got =
                tessera::read_all_blocking(&build(dev, s, causal, also_raw)).unwrap_or_else(|e| panic!("{what}: {e}"));
            for (g, w) in got.iter().zip(&want) {
                assert_close(&what, g, w, Tol { atol: 2e-5, rtol: 1e-4 });
            }
        }
    }
}
