//! Every kernel family the engine renders, enumerated: one variant per element-wise op
//! and dtype, per movement op, per reduction kind, dtype and length class, and per matmul
//! operand dtype, each for native and packed f16 storage. `cargo test` validates all of
//! them with naga and translates them to SPIR-V, MSL and HLSL, with no GPU.

use super::{KernelSpec, ShaderCaps};
use crate::{DType, Device, Result, Tensor};

/// The two storage conventions for f16, both matmul families, (with a zero binding
/// limit) the windowed forms of element-wise kernels and reductions, and wide loads
/// with and without operand textures.
pub fn all_caps() -> [ShaderCaps; 13] {
    let caps = |native_f16, direct_matmul, matmul_tile, max_binding| ShaderCaps {
        native_f16,
        max_workgroups: 65535,
        direct_matmul,
        matmul_tile,
        tiled_vec4: false,
        implicit_gemm: !direct_matmul,
        max_binding,
        subgroup_min: 0,
        wide_loads: false,
        no_avx512: false,
        texture_rows: 0,
    };
    [
        caps(true, false, (4, 4), 1 << 30),
        caps(false, false, (4, 4), 1 << 30),
        caps(true, true, (8, 4), 1 << 30),
        caps(false, true, (8, 4), 1 << 30),
        caps(true, false, (4, 4), 0),
        caps(false, true, (8, 4), 0),
        ShaderCaps { tiled_vec4: true, ..caps(true, false, (4, 4), 1 << 30) },
        ShaderCaps { tiled_vec4: true, ..caps(false, false, (4, 4), 1 << 30) },
        ShaderCaps { tiled_vec4: true, ..caps(true, false, (8, 8), 1 << 30) },
        ShaderCaps { tiled_vec4: true, ..caps(false, false, (8, 8), 1 << 30) },
        ShaderCaps { subgroup_min: 8, wide_loads: true, ..caps(true, true, (8, 4), 1 << 30) },
        ShaderCaps { subgroup_min: 8, wide_loads: true, no_avx512: true, ..caps(false, true, (8, 2), 1 << 30) },
        ShaderCaps {
            subgroup_min: 8,
            wide_loads: true,
            no_avx512: true,
            texture_rows: 16384,
            ..caps(true, true, (8, 4), 1 << 30)
        },
    ]
}

/// Graphs whose kernels cover every op, dtype and kernel variant (built on the CPU
/// device: rendering needs no GPU).
pub fn covering_graphs() -> Vec<Tensor> {
    let d = Device::cpu();
    let mut out = Vec::new();
    let f = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 3.0, -4.0, 5.0], [2, 3], &d);
    let h = f.cast(DType::F16);
    let i = Tensor::from_slice(&[1i32, -2, 3, 4, 5, -6], [2, 3], &d);
    let u = Tensor::from_slice(&[1u32, 2, 3, 4, 5, 6], [2, 3], &d);
    for x in [&f, &h] {
        out.extend([
            x.neg(),
            x.abs(),
            x.exp(),
            x.log(),
            x.sqrt(),
            x.rsqrt(),
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
            x.recip(),
            x.pow(x),
            x.maximum(x),
            x.minimum(x),
            x.clamp(-1.0, 1.0),
            x / &x.exp(),
            x.lt(x),
            x.ge(x),
            x.eq(x),
            x.ne(x),
        ]);
    }
    for x in [&i, &u] {
        out.extend([
            x.abs(),
            x.relu(),
            x + x,
            x - &x.abs(),
            x * x,
            x / &x.abs(),
            x.maximum(x),
            x.minimum(x),
            x.lt(x),
            x.eq(x),
        ]);
    }
    out.push(i.neg());
    let m = f.gt_scalar(0.0);
    out.extend([m.logical_not(), m.logical_and(&m), m.logical_or(&m), Tensor::where_(&m, &f, &f)]);
    for src in [&f, &h, &i, &u, &m] {
        for dt in DType::ALL {
            out.push(src.cast(dt));
        }
    }
    for dt in DType::ALL {
        out.push(Tensor::full(1.0, [3], dt, &d) + Tensor::zeros([3], dt, &d).cast(dt));
    }
    out.extend([
        Tensor::arange(0.0, 4.0, 1.0, DType::F32, &d),
        Tensor::arange(0.0, 4.0, 1.0, DType::I32, &d).cast(DType::F16),
        Tensor::arange(0.0, 4.0, 1.0, DType::U32, &d),
        Tensor::rand([4], 1, &d),
        Tensor::randn([4], 1, &d),
        Tensor::eye(3, DType::F32, &d),
    ]);
    // Whole quads (the vec4 element-wise kernel): every dtype as input and output.
    let fq = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 3.0, -4.0, 5.0, 0.25, -0.75], [2, 4], &d);
    let hq = fq.cast(DType::F16);
    let iq = fq.cast(DType::I32);
    let uq = fq.abs().cast(DType::U32);
    let mq = fq.gt_scalar(0.0);
    out.extend([
        // A head split read by quads (a permute keeping the innermost axis).
        (&fq + &fq.narrow(0, 0, 1)).reshape([2, 1, 1, 4]).permute(&[1, 2, 0, 3]).cast(DType::F16),
        fq.tanh().relu() * &fq,
        (&hq * 2.0 + 1.0).exp(),
        hq.cast(DType::F32) + &fq,
        &iq * &iq + 1.0,
        &uq + &uq,
        mq.logical_not(),
        Tensor::where_(&mq, &fq, &hq.cast(DType::F32)),
        fq.lt(&hq.cast(DType::F32)),
        Tensor::arange(0.0, 8.0, 1.0, DType::F32, &d) * &fq,
        Tensor::rand([8], 2, &d),
        (&fq + &Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], [4], &d)).relu(),
        // Wide matmuls (f32, K % 8 == 0, more than 8 rows): B [K, N] and [N, K].
        Tensor::from_slice(&[0.5f32; 128], [16, 8], &d).matmul(&Tensor::from_slice(&[0.25f32; 128], [8, 16], &d)),
        // 16 columns per lane where the host lacks AVX-512 and operands are textures
        // (`matmul::wide_cols`), B [K, N] and [N, K], with an epilogue stored by row.
        Tensor::from_slice(&[0.5f32; 1024], [128, 8], &d).matmul(&Tensor::from_slice(&[0.25f32; 1024], [8, 128], &d)),
        (Tensor::from_slice(&[0.5f32; 1024], [128, 8], &d)
            .matmul(&Tensor::from_slice(&[0.25f32; 1024], [128, 8], &d).t())
            + &Tensor::from_slice(&[0.5f32; 128], [128, 1], &d))
            .relu(),
        (Tensor::from_slice(&[0.5f32; 128], [16, 8], &d).matmul(&Tensor::from_slice(&[0.25f32; 160], [20, 8], &d).t())
            + 1.0)
            .relu(),
        // A row of 8 repeated: wide loads (`ShaderCaps::wide_loads`) read it 8 at a time.
        (&Tensor::from_slice(&[0.5f32; 16], [2, 8], &d) + &fq.reshape([8])).abs(),
        // Rows gathered a quad at a time (`render_gathered_quads`): a lookup plus a
        // tensor at its own index, bounds-checked.
        fq.index_select(0, &Tensor::from_slice(&[1i32, 0, 1], [3], &d))
            - &Tensor::from_slice(&[0.5f32; 12], [3, 4], &d),
    ]);
    for src in [&fq, &hq, &iq, &uq, &mq] {
        for dt in [DType::F32, DType::F16, DType::I32, DType::U32, DType::Bool] {
            out.push(src.cast(dt));
        }
    }
    // Movement, fused.
    let idx = Tensor::from_slice(&[1i32, 0], [2], &d);
    let uidx = Tensor::from_slice(&[1u32, 0, 2], [3], &d);
    let gidx = Tensor::from_slice(&[0i32, 1, 1, 0, 1, 0], [2, 3], &d);
    for x in [&f, &h, &i] {
        out.extend([
            x.reshape([3, 2]).t().exp_if_float(),
            x.permute(&[1, 0]),
            x.slice(1, 0, 3, 2),
            x.pad(&[(1, 0), (0, 2)], 0.0),
            Tensor::concat(&[x.clone(), x.clone(), x.clone()], 1),
            Tensor::stack(&[x.clone(), x.clone()], 0),
            x.index_select(0, &idx),
            x.index_select(1, &uidx),
            x.gather(0, &gidx),
            x.unsqueeze(1).broadcast_to([2, 4, 3]),
        ]);
    }
    // Reductions: every kind, dtype and both length classes.
    let long = Tensor::rand([2, 100], 3, &d);
    let many = Tensor::rand([70, 100], 4, &d); // many outputs: the narrow tree variant
    for x in [&f, &h, &i, &u, &long, &long.cast(DType::F16), &many] {
        for axes in [&[1isize][..], &[][..]] {
            out.extend([
                x.sum(axes, false),
                x.max(axes, false),
                x.min(axes, true),
                x.argmax(axes, false),
                x.argmin(axes, false),
            ]);
        }
    }
    out.push(m.sum_all());
    out.extend([f.softmax(-1), long.log_softmax(-1), f.var(&[0], false), (f.exp() * 2.0).sum(&[1], false)]);
    // Softmax and norms over rows of a multiple of 4 (quads on CPU adapters), f32 and
    // f16, and over odd rows.
    let (w, b) = (Tensor::rand([100], 11, &d), Tensor::rand([100], 12, &d));
    out.extend([
        long.cast(DType::F16).softmax(-1),
        long.layer_norm(Some(&w), Some(&b), 1e-5),
        long.cast(DType::F16).rms_norm(Some(&w.cast(DType::F16)), 1e-6),
        f.layer_norm(None, None, 1e-5),
    ]);
    // Matmul per operand dtype, batched with broadcasting.
    let a = Tensor::rand([2, 3, 4], 5, &d);
    let b = Tensor::rand([4, 5], 6, &d);
    out.extend([a.matmul(&b), a.cast(DType::F16).matmul(&b.cast(DType::F16)), a.t().matmul(&a)]);
    // Row tiles of 16, 32 and 64 (chosen by M).
    let tall = Tensor::rand([70, 4], 8, &d);
    out.extend([
        Tensor::rand([20, 4], 7, &d).matmul(&b),
        tall.matmul(&b),
        tall.t().matmul(&Tensor::rand([70, 40], 8, &d)),
    ]);
    // 128x128 tiles (the tiled vec4 8x8 configuration), in every layout, f32 and f16.
    let (big, bigt) = (Tensor::rand([128, 8], 23, &d), Tensor::rand([8, 128], 24, &d));
    out.extend([big.matmul(&bigt), bigt.t().matmul(&big.t()), big.cast(DType::F16).matmul(&bigt.cast(DType::F16))]);
    // 4-aligned f32 operands (the vec4 direct kernel), in every layout.
    let (p, q) = (Tensor::rand([8, 12], 10, &d), Tensor::rand([16, 12], 11, &d));
    out.extend([p.matmul(&q.t()), p.t().matmul(&p), p.matmul(&q.t()).t().matmul(&q), q.t().matmul(&p.t())]);
    out.push(p.cast(DType::F16).matmul(&q.cast(DType::F16).t()));
    // Wide enough for the tiled vec4 kernel's 64x64 tiles, in every layout.
    let (p, q) = (Tensor::rand([36, 12], 19, &d), Tensor::rand([40, 12], 20, &d));
    out.extend([p.matmul(&q.t()), p.t().matmul(&p), p.t().matmul(&q.t()).t(), q.t().matmul(&p.t())]);
    out.push(p.cast(DType::F16).matmul(&q.cast(DType::F16).t()));
    // Epilogues fused into each family's store: a bias and an activation, a residual,
    // a cast to f16 (fused where f16 is stored natively).
    let (p8, q16) = (Tensor::rand([8, 12], 10, &d), Tensor::rand([16, 12], 11, &d));
    out.extend([
        (a.matmul(&b) + &Tensor::rand([5], 21, &d)).gelu(),
        (tall.matmul(&b) + &tall.matmul(&b).relu()).relu(),
        (p8.matmul(&q16.t()) + &Tensor::rand([16], 22, &d)).silu(),
        p8.matmul(&q16.t()).cast(DType::F16),
        (p.matmul(&q.t()) * 2.0).tanh(),
        (Tensor::rand([2, 64], 12, &d).matmul(&Tensor::rand([5, 64], 13, &d).t()) + 1.0).relu(),
        // A head split under the epilogue: stored where the permute sends each element.
        (p8.matmul(&q16.t()) + &Tensor::rand([16], 23, &d)).reshape([2, 4, 4, 4]).permute(&[0, 2, 1, 3]),
    ]);
    // Convolution windows and their adjoint.
    let img = Tensor::rand([2, 3, 7, 6], 9, &d);
    let win = crate::graph::Window { kernel: (3, 2), stride: (2, 1), padding: (1, 0), dilation: (1, 2) };
    let cols = img.im2col(win, f64::NEG_INFINITY);
    out.extend([cols.clone(), cols.col2im(win, 7, 6), img.cast(DType::F16).im2col(win, 0.0)]);
    // Convolutions: an implicit GEMM over the windows on the tiled kernel, grouped, in f16.
    let opts = crate::ops::nn::Conv2dOptions { stride: (1, 2), padding: (1, 1), dilation: (1, 1), groups: 2 };
    let cw = Tensor::rand([4, 8, 3, 3], 17, &d);
    let x16 = Tensor::rand([2, 16, 6, 5], 18, &d);
    out.extend([x16.conv2d(&cw, None, opts), x16.cast(DType::F16).conv2d(&cw.cast(DType::F16), None, opts)]);
    // Quantised weights: dequantised in loads, fused casts, lookups and matmul (as
    // either operand, stored transposed or not).
    let vals: Vec<f32> = (0..64 * 4).map(|i| (i % 13) as f32 - 6.0).collect();
    for q in DType::QUANTIZED {
        let w = Tensor::from_quantized(q, [4, 64], &crate::quant::quantize(q, &vals), &d);
        let x = Tensor::rand([3, 64], 9, &d);
        out.extend([
            w.cast(DType::F32),
            w.cast(DType::F16) * 2.0,
            w.index_select(0, &idx),
            x.matmul(&w.t()),
            x.cast(DType::F16).matmul(&w.t()),
            w.matmul(&x.t()),
            w.t().matmul(&w.cast(DType::F32)),
            (x.matmul(&w.t()) + 0.5).gelu(),
        ]);
        // Past 8 rows on CPU adapters with subgroups: the subgroup kernel's dequantising loads.
        let wide: Vec<f32> = (0..64 * 72).map(|i| (i % 11) as f32 - 5.0).collect();
        let w2 = Tensor::from_quantized(q, [72, 64], &crate::quant::quantize(q, &wide), &d);
        out.push((Tensor::rand([12, 64], 10, &d).matmul(&w2.t()) + 0.5).gelu());
    }
    // Fused attention: f32 (vec4 rows) and f16, causal, with a padding mask, odd head dim,
    // and (CPU adapters) two queries per lane past 32 queries, rows over 8 vec4s, and
    // three per lane in one subgroup (20 queries).
    let (q, kv) = (Tensor::rand([1, 2, 5, 8], 14, &d), Tensor::rand([1, 2, 7, 8], 15, &d));
    let (ql, kvl) = (Tensor::rand([1, 40, 36], 17, &d), Tensor::rand([1, 9, 36], 18, &d));
    out.push(Tensor::scaled_dot_product_attention_fused(&ql, &kvl, &kvl, None, true));
    let q20 = Tensor::rand([1, 2, 20, 8], 23, &d);
    out.push(Tensor::scaled_dot_product_attention_fused(&q20, &kv, &kv, None, true));
    let keep = Tensor::rand([1, 1, 1, 7], 16, &d).gt_scalar(0.3);
    out.extend([
        Tensor::scaled_dot_product_attention_fused(&q, &kv, &kv, Some(&keep), true),
        // (CPU adapters with wide loads: a bias that varies over queries.)
        Tensor::scaled_dot_product_attention_fused(&q, &kv, &kv, Some(&Tensor::rand([5, 7], 19, &d)), false),
        Tensor::scaled_dot_product_attention_fused(
            &q.cast(DType::F16),
            &kv.cast(DType::F16),
            &kv.cast(DType::F16),
            None,
            false,
        ),
        Tensor::scaled_dot_product_attention_fused(
            &q.narrow(3, 0, 5),
            &kv.narrow(3, 0, 5),
            &kv.narrow(3, 0, 5),
            None,
            false,
        ),
    ]);
    // (CPU adapters with subgroups: past 24 keys the wide kernel, with a padding mask, a
    // bias that varies over queries, and in f16; up to 24 the per-query kernel above.)
    let kv30 = Tensor::rand([1, 2, 30, 8], 20, &d);
    let keep30 = Tensor::rand([1, 1, 1, 30], 21, &d).gt_scalar(0.3);
    out.extend([
        Tensor::scaled_dot_product_attention_fused(&q, &kv30, &kv30, Some(&keep30), true),
        Tensor::scaled_dot_product_attention_fused(&q, &kv30, &kv30, Some(&Tensor::rand([5, 30], 22, &d)), false),
        Tensor::scaled_dot_product_attention_fused(
            &q.cast(DType::F16),
            &kv30.cast(DType::F16),
            &kv30.cast(DType::F16),
            None,
            false,
        ),
        // Stored with its heads merged (`fuse_attention_stores`), by both CPU-adapter kernels.
        Tensor::scaled_dot_product_attention_fused(&q, &kv, &kv, Some(&keep), false)
            .permute(&[0, 2, 1, 3])
            .reshape([1, 5, 16]),
        Tensor::scaled_dot_product_attention_fused(&q, &kv30, &kv30, None, false)
            .permute(&[0, 2, 1, 3])
            .reshape([1, 5, 16]),
    ]);
    // Quantisation on the device, from f32 and f16 with a fused expression.
    for q in DType::QUANTIZED {
        let x = Tensor::rand([3, 64], 14, &d);
        out.extend([x.quantize(q), (x.cast(DType::F16) * 2.0).quantize(q)]);
    }
    // The GEMV kernel with an f32 weight (GPU adapters; quantised ones above).
    out.push(Tensor::rand([2, 64], 12, &d).matmul(&Tensor::rand([5, 64], 13, &d).t()));
    // Segment reductions over a fused gather, an in-place row write, top-k.
    let ids = Tensor::from_slice(&[0i32, 2, 2, 1], [4], &d);
    let offsets = Tensor::from_slice(&[0i32, 1, 4], [3], &d);
    let seg = Tensor::from_slice(&[0i32, 1, 1, 1], [4], &d);
    let values = Tensor::rand([3, 5], 15, &d).index_select(0, &ids) * 2.0;
    for op in [crate::graph::ReduceOp::Sum, crate::graph::ReduceOp::Max, crate::graph::ReduceOp::ArgMax] {
        out.push(values.segment_reduce(&offsets, &seg, op));
    }
    // ... and a quad at a time: rows of 8 of a buffer, gathered twice.
    let rows8 = Tensor::from_slice(&[0.5f32; 24], [3, 8], &d);
    out.push(rows8.index_select(0, &ids.narrow(0, 0, 2)).index_select(0, &seg).segment_reduce(
        &offsets,
        &seg,
        crate::graph::ReduceOp::Sum,
    ));
    out.push(Tensor::rand([6, 5], 16, &d).scatter_rows(&ids.narrow(0, 0, 2), &Tensor::rand([2, 5], 17, &d)));
    // The optimisers' row rules, ungated and gated.
    let (rows, g) = (ids.narrow(0, 0, 2), Tensor::rand([2, 5], 19, &d));
    let gate = g.sum_all().gt_scalar(0.0);
    for (square, gate) in [(false, None), (true, Some(&gate))] {
        let m = Tensor::rand([6, 5], 20, &d).accumulate_rows(&rows, &g, square, [0.9, 0.1], gate);
        out.push(Tensor::rand([6, 5], 21, &d).step_rows(&rows, &m, true, &m.sqrt(), [0.1, 1e-8], gate));
        out.push(Tensor::rand([6, 5], 22, &d).step_rows(&rows, &g, false, &m, [0.1, 1e-8], gate));
    }
    // The same a quad at a time: rows of 8 with buffers for values.
    let g8 = Tensor::from_slice(&[0.5f32; 16], [2, 8], &d);
    out.push(Tensor::rand([6, 8], 23, &d).scatter_rows(&rows, &g8));
    for (square, gate) in [(false, None), (true, Some(&gate))] {
        // Alone, then a step reading its result: one kernel of two writes.
        let m = Tensor::rand([6, 8], 24, &d).accumulate_rows(&rows, &g8, square, [0.9, 0.1], gate);
        out.push(m.clone());
        out.push(Tensor::rand([6, 8], 25, &d).step_rows(&rows, &m, true, &m, [0.1, 1e-8], gate));
        out.push(Tensor::rand([6, 8], 26, &d).step_rows(&rows, &g8, false, &m, [0.1, 1e-8], gate));
        let den = Tensor::rand([6, 8], 28, &d).exp();
        out.push(Tensor::rand([6, 8], 27, &d).step_rows(&rows, &g8, false, &den, [0.1, 1e-8], gate));
    }
    out.push(Tensor::rand([3, 40], 18, &d).exp().topk(10).1);
    out
}

impl Tensor {
    fn exp_if_float(&self) -> Tensor {
        if self.dtype().is_float() {
            self.exp()
        } else {
            self.clone()
        }
    }
}

/// Target sets realised together whose kernels have several outputs (see
/// `graph::schedule::group_siblings`): an optimiser-like update over whole quads and
/// over an odd length, and outputs of every dtype.
pub fn covering_groups() -> Vec<Vec<Tensor>> {
    let d = Device::cpu();
    let mut out = Vec::new();
    for n in [8usize, 7] {
        let x = Tensor::from_slice(&vec![0.5f32; n], [n], &d);
        let g = Tensor::from_slice(&vec![-0.25f32; n], [n], &d);
        let m = &x * 0.9 + &g * 0.1;
        let v = &x * 0.99 + &g.square() * 0.01;
        let p = &x - &(&m / &(v.sqrt() + 1e-8));
        out.push(vec![p, m, v]);
        out.push(vec![x.exp(), x.gt(&g), (&x * 4.0).cast(DType::I32), (&x + &g).cast(DType::F16), x.cast(DType::U32)]);
    }
    // A sparse Adam step's row writes (both moments, then the weights): one kernel.
    let rows = Tensor::from_slice(&[2i32, 0, 5], [3], &d);
    let g = Tensor::rand([3, 8], 40, &d);
    let m = Tensor::rand([6, 8], 41, &d).accumulate_rows(&rows, &g, false, [0.9, 0.1], None);
    let v = Tensor::rand([6, 8], 42, &d).accumulate_rows(&rows, &g, true, [0.999, 0.001], None);
    let p = Tensor::rand([6, 8], 43, &d).step_rows(&rows, &m, true, &v, [0.01, 1e-8], None);
    out.push(vec![m, v, p]);
    out
}

/// Render every covering kernel for `caps`, deduplicated by source.
pub fn render_all(caps: &ShaderCaps) -> Result<Vec<KernelSpec>> {
    let mut seen = std::collections::HashSet::new();
    let mut specs = Vec::new();
    let singles = covering_graphs().into_iter().map(|t| vec![t]);
    for targets in singles.chain(covering_groups()) {
        for s in super::plan_kernels(caps, 14, &targets)? {
            if seen.insert(s.source.to_string()) {
                specs.push(s);
            }
        }
    }
    Ok(specs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translate(spec: &KernelSpec, native_f16: bool) -> std::result::Result<(), String> {
        let module = naga::front::wgsl::parse_str(&spec.source).map_err(|e| e.emit_to_string(&spec.source))?;
        // pack2x16float/unpack2x16float: granted by wgpu on every adapter we target.
        let mut caps = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
        if spec.source.contains("subgroup") {
            caps |= naga::valid::Capabilities::SUBGROUP;
        }
        if native_f16 {
            caps |= naga::valid::Capabilities::SHADER_FLOAT16;
        }
        if spec.source.contains("u64") {
            caps |= naga::valid::Capabilities::SHADER_INT64;
        }
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all())
            .validate(&module)
            .map_err(|e| e.emit_to_string(&spec.source))?;
        let spv_opts = naga::back::spv::Options::default();
        let pipe =
            naga::back::spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: "main".into() };
        naga::back::spv::write_vec(&module, &info, &spv_opts, Some(&pipe)).map_err(|e| format!("spir-v: {e}"))?;
        let msl_opts = naga::back::msl::Options { lang_version: (2, 4), ..Default::default() };
        naga::back::msl::write_string(&module, &info, &msl_opts, &naga::back::msl::PipelineOptions::default())
            .map_err(|e| format!("msl: {e}"))?;
        let hlsl_opts =
            naga::back::hlsl::Options { shader_model: naga::back::hlsl::ShaderModel::V6_2, ..Default::default() };
        let mut hlsl = String::new();
        naga::back::hlsl::Writer::new(&mut hlsl, &hlsl_opts, &naga::back::hlsl::PipelineOptions::default())
            .write(&module, &info, None)
            .map_err(|e| format!("hlsl: {e}"))?;
        Ok(())
    }

    #[test]
    fn shader_variants_validate_and_translate() {
        let mut total = 0;
        let mut failures = Vec::new();
        for caps in all_caps() {
            let specs = render_all(&caps).expect("rendering");
            assert!(specs.len() > 100, "only {} variants", specs.len());
            for s in &specs {
                if let Err(e) = translate(s, caps.native_f16) {
                    failures.push(format!("{} (native_f16={}): {e}\n{}", s.label, caps.native_f16, s.source));
                }
            }
            // (Multi-output kernels never take windows: none where every tensor is "large".)
            let multi = specs.iter().any(|s| !s.extra_outputs.is_empty());
            assert!(multi || caps.max_binding == 0, "multi-output kernels are covered");
            let epi = specs.iter().any(|s| s.label.contains("_epi("));
            assert!(epi || caps.max_binding == 0, "matmul epilogues are covered");
            let split = specs.iter().any(|s| s.label.contains("_epi(") && s.source.contains("fn dst("));
            assert!(split || caps.max_binding == 0, "epilogues under a head split are covered");
            let quad_rows = ["scatter_rows_vec4", "accumulate_rows_vec4", "step_rows_vec4", "segment_sum_vec4"]
                .iter()
                .all(|l| specs.iter().any(|s| s.label == *l));
            assert!(quad_rows || caps.max_binding == 0, "row writes a quad at a time are covered");
            let gathered = specs.iter().any(|s| s.label.contains("index_select") && s.source.contains("fn store_quad"));
            assert!(gathered || caps.max_binding == 0, "rows gathered a quad at a time are covered");
            let grouped = [
                "row_writes(accumulate_rows,step_rows)_vec4",
                "row_writes(accumulate_rows,accumulate_rows,step_rows)_vec4",
            ]
            .iter()
            .all(|l| specs.iter().any(|s| s.label == *l && s.extra_aliases.len() == s.extra_outputs.len()));
            assert!(grouped || caps.max_binding == 0, "row writes over the same rows in one kernel are covered");
            // Wide loads: every 32-bit dtype in and out, a repeated row, several outputs;
            // with operand textures, f32 inputs (a repeated row too) read as texels.
            let wide: Vec<&KernelSpec> = specs.iter().filter(|s| s.source.contains("array<vec4<u64>>")).collect();
            let needles: &[&str] = match caps.texture_rows > 0 {
                true => &["bitcast<i32>", "!= 0u)", "fetch_in0(2u * q)", "fetch_in1((2u * q) % m("],
                false => &["bitcast<f32>", "bitcast<i32>", "!= 0u)", "in1[q % m("],
            };
            let covered = needles.iter().all(|w| wide.iter().any(|s| s.source.contains(w)))
                && wide.iter().any(|s| !s.extra_outputs.is_empty());
            assert_eq!(covered, caps.wide_loads, "wide element-wise kernels are covered where the caps allow them");
            let wide_mm = |kind: &str| {
                ["nn", "nt"]
                    .iter()
                    .all(|l| specs.iter().any(|s| s.label.starts_with(&format!("matmul_{kind}_f32_8x64_{l}"))))
            };
            let textured = caps.texture_rows > 0;
            assert_eq!(wide_mm("direct8sg"), caps.wide_loads && !textured, "wide matmuls are covered");
            assert_eq!(wide_mm("direct8tex"), textured, "wide matmuls reading textures are covered");
            let two_blocks = ["nn", "nt"]
                .iter()
                .all(|l| specs.iter().any(|s| s.label.starts_with(&format!("matmul_direct8tex_f32_32x128_{l}_c16"))));
            assert_eq!(two_blocks, textured, "wide matmuls of 16 columns per lane are covered");
            let per_query =
                |l: &str| specs.iter().any(|s| s.label.starts_with("attention_f32_d8") && s.label.contains(l));
            assert!(!caps.direct_matmul || per_query("_rows"), "the per-query attention is covered");
            let one_subgroup = caps.direct_matmul && caps.subgroup_min >= 8;
            assert_eq!(per_query("_rows_sg8_q3"), one_subgroup, "three queries per lane in one subgroup are covered");
            assert!(
                specs.iter().all(|s| (s.textured != 0) == (s.label.contains("direct8tex") || s.label.contains("_tex"))),
                "textured kernels are named"
            );
            // Bit k of `textured` exactly where binding 2 + k is declared a texture, of
            // floats for an f32 input and of words otherwise (the executor's choice).
            for s in &specs {
                for (k, t) in s.inputs.iter().enumerate() {
                    let decl = format!("@binding({}) var ", 2 + k);
                    let line = s.source.lines().find(|l| l.contains(&decl)).unwrap_or_default();
                    let texels = match t.dtype() {
                        DType::F32 => ["texture_2d<f32>", "texture_storage_2d<rgba32float, read>"],
                        _ => ["texture_2d<u32>", "texture_storage_2d<rgba32uint, read>"],
                    };
                    let bit = s.textured >> k & 1 == 1;
                    assert_eq!(line.contains("texture_"), bit, "{}: binding {} and its textured bit", s.label, 2 + k);
                    assert!(
                        !bit || texels.iter().any(|x| line.contains(x)),
                        "{}: binding {} is {texels:?}",
                        s.label,
                        2 + k
                    );
                }
            }
            // Row kernels, attention and the f16 and quantised products read textures too.
            let tex_rows =
                ["layer_norm_rows4_sg_tex", "log_softmax_rows4_tex", "attention_f32_d8_mask_rows_sg8_q1_tex"]
                    .iter()
                    .all(|l| specs.iter().any(|s| s.label.starts_with(l)))
                    && specs.iter().any(|s| s.label.contains("_wide") && s.label.contains("_tex"))
                    && ["f16_", "q8_0_", "q4_0_"].iter().all(|d| {
                        // f16 and quantised weights go through the wide kernel where it
                        // exists.
                        specs.iter().any(|s| match caps.wide_loads {
                            true => s.label.starts_with("matmul_direct8tex_") && s.label.contains(d),
                            false => {
                                s.label.starts_with("matmul_direct4") && s.label.contains(d) && s.label.contains("_tex")
                            }
                        })
                    });
            assert_eq!(
                tex_rows,
                textured,
                "row kernels and attention reading textures are covered: {:?}",
                specs.iter().filter(|s| s.label.contains("_tex")).map(|s| &s.label).collect::<Vec<_>>()
            );
            let packed_uses_f16 = specs.iter().any(|s| s.source.contains("enable f16"));
            assert_eq!(packed_uses_f16, caps.native_f16, "f16 storage convention");
            total += specs.len();
        }
        assert!(failures.is_empty(), "{} of {total} variants failed:\n{}", failures.len(), failures.join("\n\n"));
    }
}
