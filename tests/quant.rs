//! Q8_0 and Q4_0 weights on every device: exact block round trips, dequantising loads,
//! and matmul with quantised operands against the reference.

mod common;
use common::{check_with, data, devices, rand_t, Tol};
use tessera::quant::{dequantize, quantize, quantize_tensor_blocking};
use tessera::{DType, Device, Error, Tensor};

fn weights(dt: DType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    quantize(dt, &data(rows * cols, seed, -1.0, 1.0))
}

#[test]
fn blocks_round_trip_exactly_on_every_device() {
    for dt in DType::QUANTIZED {
        let blocks = weights(dt, 5, 96, 1);
        for d in devices().into_iter().chain([Device::reference()]) {
            common::record(&d);
            let w = Tensor::from_quantized(dt, [5, 96], &blocks, &d);
            assert_eq!(w.dtype(), dt);
            assert_eq!(w.quantized_blocks_blocking().unwrap(), blocks, "{dt} on {d}");
            let host: Vec<f64> = dequantize(dt, &blocks).into_iter().map(f64::from).collect();
            assert_eq!(w.to_f64_vec_blocking().unwrap(), host, "{dt} values on {d}");
        }
    }
}

#[test]
fn dequantising_ops_match_the_reference() {
    for dt in DType::QUANTIZED {
        let blocks = weights(dt, 7, 64, 2);
        let kblocks = weights(dt, 64, 32, 3);
        let wide = weights(dt, 72, 64, 5); // 144 blocks: the GEMV kernel's aligned layout
        let wide96 = weights(dt, 72, 96, 14);
        check_with(&format!("{dt} ops"), Some(Tol { atol: 2e-4, rtol: 1e-5 }), |d| {
            let w = Tensor::from_quantized(dt, [7, 64], &blocks, d);
            let k = Tensor::from_quantized(dt, [64, 32], &kblocks, d);
            let x = rand_t(&[3, 64], 4, -1.0, 1.0, d);
            let w2 = Tensor::from_quantized(dt, [72, 64], &wide, d);
            let ids = Tensor::from_slice(&[6i32, 0, 3, 3], [4], d);
            vec![
                w.cast(DType::F32),
                (w.cast(DType::F32) * 2.0).exp(),
                w.index_select(0, &ids),
                x.matmul(&w.t()), // a Linear layer: x @ W^T, W stored [out, in]
                x.matmul(&k),     // quantised B, not transposed
                w.matmul(&x.t()), // quantised A
                x.cast(DType::F16).matmul(&w.t()).cast(DType::F32),
                // Decode-shaped products (the GEMV kernel): 1, 3 and 2x2 rows.
                x.narrow(0, 1, 1).matmul(&w2.t()),
                x.matmul(&w2.t()),
                rand_t(&[2, 2, 64], 6, -1.0, 1.0, d).matmul(&w2.t()),
                // More rows: the subgroup kernel dequantising its loads on CPU adapters
                // with subgroups (GEMV in row groups of 8 on their fallback twin): row
                // counts leaving partial tiles, A stored transposed, a batch, an
                // epilogue, three blocks per row.
                rand_t(&[21, 64], 7, -1.0, 1.0, d).matmul(&w2.t()),
                rand_t(&[70, 64], 8, -1.0, 1.0, d).matmul(&w2.t()),
                rand_t(&[64, 44], 9, -1.0, 1.0, d).t().matmul(&w2.t()),
                rand_t(&[3, 12, 64], 10, -1.0, 1.0, d).matmul(&w2.t()),
                (rand_t(&[40, 64], 11, -1.0, 1.0, d).matmul(&w2.t()) + rand_t(&[72], 12, -1.0, 1.0, d)).gelu(),
                rand_t(&[33, 96], 13, -1.0, 1.0, d).matmul(&Tensor::from_quantized(dt, [72, 96], &wide96, d).t()),
            ]
        });
    }
}

#[test]
fn quantising_a_tensor_bounds_the_error() {
    for d in devices().into_iter().take(2).chain([Device::reference()]) {
        common::record(&d);
        let x = rand_t(&[4, 64], 5, -2.0, 2.0, &d);
        let xv = x.to_vec_blocking::<f32>().unwrap();
        for (dt, bound) in [(DType::Q8_0, 2.0 / 127.0), (DType::Q4_0, 2.0 / 7.0)] {
            let q = quantize_tensor_blocking(&x, dt).unwrap();
            let back = q.cast(DType::F32).to_vec_blocking::<f32>().unwrap();
            for (a, b) in xv.iter().zip(&back) {
                assert!((a - b).abs() <= bound as f32, "{dt}: {a} vs {b}");
            }
        }
    }
}

/// Per-block squared error of GGUF `blocks` against `x`.
fn block_sse(dt: DType, blocks: &[u8], x: &[f32]) -> Vec<f64> {
    let back = dequantize(dt, blocks);
    x.chunks(32)
        .zip(back.chunks(32))
        .map(|(a, b)| a.iter().zip(b).map(|(&u, &v)| ((u - v) as f64).powi(2)).sum())
        .collect()
}

#[test]
fn quantising_on_the_device_matches_the_host() {
    // 9 blocks per tensor (an odd count: the last scale word is half used), values with
    // an outlier, a block of zeros, a constant block and a tiny block.
    let mut vals = data(3 * 96, 11, -1.5, 1.5);
    vals[40] = 9.0;
    vals[96..128].fill(0.0);
    vals[128..160].fill(-0.25);
    for v in &mut vals[160..192] {
        *v *= 1e-3;
    }
    for d in devices().into_iter().chain([Device::reference()]) {
        common::record(&d);
        for dt in DType::QUANTIZED {
            for src in [DType::F32, DType::F16] {
                let x = Tensor::from_slice(&vals, [3, 96], &d).cast(src);
                // A fused expression in front of the quantisation.
                let y = (&x * 1.5).neg();
                let want_x: Vec<f32> = y.to_f64_vec_blocking().unwrap().into_iter().map(|v| v as f32).collect();
                let want = quantize(dt, &want_x);
                let q = y.quantize(dt);
                assert_eq!(q.dtype(), dt);
                let got = q.quantized_blocks_blocking().unwrap();
                assert_eq!(got.len(), want.len());
                let (gs, ws) = (block_sse(dt, &got, &want_x), block_sse(dt, &want, &want_x));
                let bb = tessera::quant::block_bytes(dt);
                let mut same = 0;
                for (b, (g, w)) in got.chunks(bb).zip(want.chunks(bb)).enumerate() {
                    same += usize::from(g == w);
                    // Where WGSL's division rounds differently the block may differ, but
                    // not in quality.
                    assert!(
                        gs[b] <= ws[b] * 1.001 + 1e-12,
                        "{dt} from {src} on {d}, block {b}: {} vs {}",
                        gs[b],
                        ws[b]
                    );
                }
                // Bit for bit on the host backends and on Mesa's llvmpipe (what README
                // claims); elsewhere a block may differ where WGSL's division rounds
                // differently, never in quality (checked above).
                if d.is_cpu() || d.info().name.contains("llvmpipe") {
                    assert_eq!(got, want, "{dt} from {src} on {d}: {same} of 9 blocks equal the host's");
                }
                // The values read back are the dequantised blocks, and a product with the
                // quantised tensor in the same graph reads the new blocks.
                let back: Vec<f64> = dequantize(dt, &got).into_iter().map(f64::from).collect();
                assert_eq!(q.to_f64_vec_blocking().unwrap(), back, "{dt} on {d}");
                let a = Tensor::from_slice(&data(2 * 96, 12, -1.0, 1.0), [2, 96], &d);
                let p = a.matmul(&y.cast(DType::F32).quantize(dt).t()).to_vec_blocking::<f32>().unwrap();
                let wq = Tensor::from_quantized(dt, [3, 96], &got, &d);
                let p2 = a.matmul(&wq.t()).to_vec_blocking::<f32>().unwrap();
                for (u, v) in p.iter().zip(&p2) {
                    assert!((u - v).abs() <= 1e-4 * (1.0 + v.abs()), "{dt} product on {d}: {u} vs {v}");
                }
                // `cast` to a block format is the same quantisation.
                assert_eq!(y.cast(dt).quantized_blocks_blocking().unwrap(), got);
            }
        }
    }
}

#[test]
fn quantised_tensors_refuse_what_they_cannot_do() {
    for d in devices().into_iter().take(2).chain([Device::reference()]) {
        common::record(&d);
        let w = Tensor::from_quantized(DType::Q8_0, [2, 32], &weights(DType::Q8_0, 2, 32, 6), &d);
        let line = line!() + 1;
        let e = w.exp().to_f64_vec_blocking().unwrap_err();
        assert!(matches!(&e, Error::DType { op: "unary", .. }), "{e}");
        assert_eq!(e.location().unwrap().line(), line);
        // A transposed view is fine inside a matmul, but cannot itself be materialised.
        let e = w.t().to_f64_vec_blocking().unwrap_err();
        assert!(e.to_string().contains("cast it to f32"), "{e}");
        let ints = Tensor::from_slice(&[1i32; 32], [1, 32], &d);
        assert!(matches!(ints.cast(DType::Q4_0).check(), Err(Error::DType { op: "quantize", .. })));
        let short = Tensor::rand([2, 20], 1, &d).quantize(DType::Q8_0);
        assert!(matches!(short.check(), Err(Error::InvalidArgument { op: "quantize", .. })), "{:?}", short.check());
        assert!(matches!(w.cast(DType::F32).quantize(DType::F16).check(), Err(Error::DType { op: "quantize", .. })));
        let bad = Tensor::from_quantized(DType::Q8_0, [2, 32], &[0u8; 10], &d);
        assert!(matches!(bad.check(), Err(Error::InvalidArgument { op: "from_quantized", .. })));
        let odd = Tensor::from_quantized(DType::Q4_0, [3, 20], &[0u8; 36], &d);
        assert!(odd.check().is_err());
        // The device is still fine.
        assert_eq!(w.cast(DType::F32).sum_all().to_vec_blocking::<f32>().unwrap().len(), 1);
    }
}
