//! Property tests: broadcasting and reshape rules on the reference, random shapes (1,
//! odd sizes, sizes just past a tile) through fused kernels on every GPU device,
//! random products, head-split epilogues and convolutions on every matmul kernel family,
//! and random groups of row writes over the same rows on every device.

mod common;
use common::{assert_close, devices, rand_t, Tol};
use proptest::prelude::*;
use tessera::shape::broadcast_shapes;
use tessera::{DType, Device, Tensor};

/// The case count of a property test: `TESSERA_PROP_CASES` for a longer search, or
/// `default`.
fn cases(default: u32) -> u32 {
    std::env::var("TESSERA_PROP_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Whether a window of `k` taps dilated by `dil` fits an axis of `len` padded by `pad`
/// on each side.
fn window_fits(len: usize, k: usize, pad: usize, dil: usize) -> bool {
    len + 2 * pad > dil * (k - 1)
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(2), Just(3), Just(5), Just(17), Just(65)]
}

fn shape(max_rank: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(dim(), 0..=max_rank)
}

/// A shape `b` that broadcasts with `a`: a suffix of `a` with some axes set to 1.
fn compatible(a: Vec<usize>) -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    let n = a.len();
    (0..=n, prop::collection::vec(any::<bool>(), n)).prop_map(move |(keep, ones)| {
        let b: Vec<usize> = a[n - keep..].iter().zip(&ones[n - keep..]).map(|(&d, &o)| if o { 1 } else { d }).collect();
        (a.clone(), b)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn broadcast_is_symmetric_and_covers_both(a in shape(4), b in shape(4)) {
        let ab = broadcast_shapes(&a, &b);
        prop_assert_eq!(&ab, &broadcast_shapes(&b, &a));
        // numpy's rule, spelled out: aligned from the right, equal or one of them 1.
        let r = a.len().max(b.len());
        let get = |s: &[usize], i: usize| if i + s.len() >= r { s[i + s.len() - r] } else { 1 };
        let ok = (0..r).all(|i| get(&a, i) == get(&b, i) || get(&a, i) == 1 || get(&b, i) == 1);
        prop_assert_eq!(ab.is_some(), ok);
        if let Some(s) = ab {
            prop_assert!(tessera::shape::can_broadcast_to(&a, &s));
            prop_assert!(tessera::shape::can_broadcast_to(&b, &s));
        }
    }

    #[test]
    fn broadcast_add_matches_elementwise_definition((a, b) in shape(3).prop_flat_map(compatible)) {
        let d = Device::reference();
        let x = rand_t(&a, 1, -1.0, 1.0, &d);
        let y = rand_t(&b, 2, -1.0, 1.0, &d);
        let z = (&x + &y).to_vec_blocking::<f32>().unwrap();
        let xs = x.to_vec_blocking::<f32>().unwrap();
        let ys = y.to_vec_blocking::<f32>().unwrap();
        // Index each operand by hand with broadcast strides.
        let r = a.len();
        let mut c = vec![0usize; r];
        for (i, &zv) in z.iter().enumerate() {
            let mut rem = i;
            for k in (0..r).rev() { c[k] = rem % a[k]; rem /= a[k]; }
            let off = r - b.len();
            let mut j = 0;
            for k in 0..b.len() { j = j * b[k] + if b[k] == 1 { 0 } else { c[off + k] }; }
            prop_assert_eq!(zv, xs[i] + ys[j]);
        }
    }

    #[test]
    fn reshape_keeps_row_major_order(s in shape(4), split in 0usize..4) {
        let d = Device::reference();
        let n: usize = s.iter().product();
        let x = Tensor::arange(0.0, n as f64, 1.0, DType::I32, &d).reshape(s.clone());
        let k = split.min(s.len());
        let folded = vec![s[..k].iter().product::<usize>(), s[k..].iter().product()];
        let y = x.reshape(folded).reshape([n]);
        prop_assert_eq!(y.to_vec_blocking::<i32>().unwrap(), (0..n as i32).collect::<Vec<_>>());
        let bad = x.reshape([n + 1]);
        prop_assert!(bad.error().is_some());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn random_fused_graphs_match_on_every_device(
        (a, b) in shape(3).prop_flat_map(compatible),
        axis_pick in 0usize..4,
        seed in 0u64..1000,
    ) {
        let build = |d: &Device| {
            let x = rand_t(&a, seed, -2.0, 2.0, d);
            let y = rand_t(&b, seed + 1, -2.0, 2.0, d);
            let z = ((&x * &y).tanh() + &y).relu();
            // A rank-0 input reduces over every element (its one value).
            let axes: Vec<isize> = if a.is_empty() { vec![] } else { vec![(axis_pick % a.len()) as isize] };
            let len: usize = axes.iter().map(|&ax| a[ax as usize]).product();
            let rev: Vec<usize> = (0..a.len()).rev().collect();
            let (sum, max) = if axes.is_empty() { (z.sum_all(), z.max_all()) } else { (z.sum(&axes, false), z.max(&axes, true)) };
            (vec![z.clone(), sum, z.permute(&rev).exp(), max], len)
        };
        let (want_t, len) = build(&Device::reference());
        let want = tessera::read_all_blocking(&want_t).unwrap();
        for d in &devices() {
            common::record(d);
            let got = tessera::read_all_blocking(&build(d).0).unwrap();
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_close(&format!("output {k} on {}", common::label(d)), g, w, Tol::for_dtype(DType::F32).scaled(len));
            }
        }
    }
}

/// The CPU backend, then one device per matmul kernel family on the first adapter:
/// direct, tiled, tiled-vec4. A kernel configuration that fails to open fails the test.
fn matmul_devices() -> &'static [Device] {
    use tessera::device::autotune::MatmulConfig;
    static DEVICES: std::sync::OnceLock<Vec<Device>> = std::sync::OnceLock::new();
    DEVICES.get_or_init(|| {
        let mut out = vec![Device::cpu()];
        // Fails without an adapter unless TESSERA_ALLOW_NO_GPU=1 (then only the CPU).
        let Some(first) = common::private_gpu(Default::default()) else { return out };
        let index = Device::list().into_iter().position(|a| a.name == first.info().name);
        for (direct, tm, tn, vec4) in [(true, 8, 4, false), (false, 4, 4, false), (false, 4, 4, true)] {
            let matmul = Some(MatmulConfig { direct, tm, tn, vec4 });
            let opts = tessera::DeviceOptions { adapter_index: index, matmul, ..Default::default() };
            out.push(Device::with_options(opts).unwrap_or_else(|e| panic!("matmul {matmul:?} does not open: {e}")));
        }
        out
    })
}

fn mm_dim() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), Just(4), Just(7), Just(32), Just(36), Just(64), Just(68), Just(97)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Random products (sizes around the tiles, aligned and not, stored transposed or
    /// not, batched with broadcasting, f32 and f16) on every matmul kernel family.
    #[test]
    fn random_matmuls_match_on_every_kernel(
        (m, n, k) in (mm_dim(), mm_dim(), mm_dim()),
        (ta, tb) in (any::<bool>(), any::<bool>()),
        batch in prop_oneof![Just((1usize, 1usize)), Just((3, 3)), Just((3, 1)), Just((1, 2))],
        f16 in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let build = |d: &Device| {
            let a = rand_t(&if ta { [batch.0, k, m] } else { [batch.0, m, k] }, seed, -1.0, 1.0, d);
            let b = rand_t(&if tb { [batch.1, n, k] } else { [batch.1, k, n] }, seed + 1, -1.0, 1.0, d);
            let (a, b) = if f16 { (a.cast(DType::F16), b.cast(DType::F16)) } else { (a, b) };
            let a = if ta { a.transpose(-2, -1) } else { a };
            let b = if tb { b.transpose(-2, -1) } else { b };
            vec![a.matmul(&b).cast(DType::F32)]
        };
        let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
        let tol = if f16 { Tol { atol: 2e-2, rtol: 1e-2 } } else { Tol::for_dtype(DType::F32).scaled(k) };
        for d in matmul_devices() {
            common::record(d);
            let got = tessera::read_all_blocking(&build(d)).unwrap();
            let what = format!("{m}x{n}x{k} ta={ta} tb={tb} batch={batch:?} f16={f16} on {:?}", d.matmul_config());
            assert_close(&what, &got[0], &want[0], tol);
        }
    }
}

/// The 24 orders of four axes.
fn perms4() -> Vec<[usize; 4]> {
    let mut out = Vec::new();
    for a in 0..4 {
        for b in (0..4).filter(|&b| b != a) {
            for c in (0..4).filter(|&c| c != a && c != b) {
                out.push([a, b, c, 6 - a - b - c]);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// A projection's epilogue under a head split (`[b, s, heads * d]` reshaped to
    /// `[b, s, heads, d]`, then any order of the four axes), on every matmul kernel
    /// family: the kernel stores each element where the permute sends it.
    #[test]
    fn random_head_split_epilogues_match_on_every_kernel(
        (b, s, k) in (1usize..=3, mm_dim(), mm_dim()),
        (heads, hd) in (prop_oneof![Just(1usize), Just(2), Just(3), Just(4)], prop_oneof![Just(1usize), Just(4), Just(5), Just(8)]),
        perm in 0usize..24,
        gelu in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let perm = perms4()[perm];
        let build = |d: &Device| {
            let x = rand_t(&[b, s, k], seed, -1.0, 1.0, d);
            let w = rand_t(&[heads * hd, k], seed + 1, -1.0, 1.0, d);
            let bias = rand_t(&[heads * hd], seed + 2, -1.0, 1.0, d);
            let y = x.matmul(&w.t()) + &bias;
            let y = if gelu { y.gelu() } else { y };
            vec![y.reshape([b, s, heads, hd]).permute(&perm)]
        };
        let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
        for d in matmul_devices() {
            common::record(d);
            let got = tessera::read_all_blocking(&build(d)).unwrap();
            let what = format!("[{b}, {s}, {heads}x{hd}] k={k} perm={perm:?} gelu={gelu} on {:?}", d.matmul_config());
            assert_close(&what, &got[0], &want[0], Tol::for_dtype(DType::F32).scaled(k));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Random convolutions (strides, padding, dilation, groups, odd sizes; transposed
    /// too) on every matmul kernel family: implicit GEMMs on the tiled kernels,
    /// materialised columns on the direct one.
    #[test]
    fn random_convolutions_match_on_every_kernel(
        (n, g, cg, og) in (1usize..3, 1usize..3, prop_oneof![Just(1usize), Just(3), Just(8)], 1usize..5),
        (h, w) in prop_oneof![(3usize..12, 3usize..12), Just((18usize, 17usize))],
        (kh, kw) in (1usize..4, 1usize..4),
        (s, p, dl) in ((1usize..3, 1usize..3), (0usize..2, 0usize..2), (1usize..3, 1usize..3)),
        seed in 0u64..1000,
    ) {
        use tessera::ops::nn::Conv2dOptions;
        let o = Conv2dOptions { stride: s, padding: p, dilation: dl, groups: g };
        prop_assume!(window_fits(h, kh, p.0, dl.0) && window_fits(w, kw, p.1, dl.1));
        let build = |d: &Device| {
            let x = rand_t(&[n, g * cg, h, w], seed, -1.0, 1.0, d);
            let wt = rand_t(&[g * og, cg, kh, kw], seed + 1, -1.0, 1.0, d);
            let y = x.conv2d(&wt, None, o);
            let back = y.conv_transpose2d(&wt, None, o, (0, 0));
            vec![y, back]
        };
        let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
        let tol = Tol::for_dtype(DType::F32).scaled(cg * kh * kw * og * 4);
        for d in matmul_devices() {
            common::record(d);
            let got = tessera::read_all_blocking(&build(d)).unwrap();
            for (k, (g_, w_)) in got.iter().zip(&want).enumerate() {
                let what = format!("output {k}: {o:?} k {kh}x{kw} on {:?}", d.matmul_config());
                assert_close(&what, g_, w_, tol);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Chains of movement ops over fused expressions and over buffers (permutes,
    /// broadcasts, slices with steps, pads, reshapes, concatenations), on odd shapes,
    /// as element-wise kernels and under a reduction: the index arithmetic the CPU
    /// backend folds (strided maps, stretches along the innermost axis, an expression
    /// evaluated once under a broadcast, concatenations and reductions over a middle
    /// axis) and the GPU codegen renders.
    #[test]
    fn random_movement_chains_match(
        s in prop::collection::vec(prop_oneof![Just(1usize), Just(2), Just(3), Just(7), Just(33)], 3),
        perm in Just(vec![0usize, 1, 2]).prop_shuffle(),
        (start, step) in (0usize..2, 1usize..3),
        pad in (0usize..3, 0usize..2),
        through_buffer in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let build = |d: &Device| {
            let x = rand_t(&s, seed, -2.0, 2.0, d);
            let y = rand_t(&[s[2]], seed + 1, -1.0, 1.0, d);
            // An expression, or a realised buffer, under the views.
            let e = (&x * 1.5 + &y).tanh();
            let e = if through_buffer { Tensor::from_slice(&e.to_vec_blocking::<f32>().unwrap(), s.clone(), d) } else { e };
            let p = e.permute(&perm);
            let pd = p.dims().to_vec();
            let len = pd[1].saturating_sub(start).div_ceil(step).max(1);
            let sl = p.slice(1, start.min(pd[1] - 1) as isize, pd[1] as isize, step);
            let padded = sl.pad(&[(0, 0), (pad.0, pad.1), (1, 0)], 0.5);
            let flat = padded.reshape([pd[0], (len + pad.0 + pad.1) * (pd[2] + 1)]);
            let bc = p.sum(&[2], true).broadcast_to(pd.clone()) * &p;
            let cat = Tensor::concat(&[bc.clone(), p.neg()], 2);
            // Along a middle axis, then reduced over it.
            let mid = Tensor::concat(&[p.exp(), sl.clone(), bc.clone()], 1);
            vec![
                padded,
                flat.exp(),
                bc.sum(&[0, 2], false),
                cat.max(&[1], false),
                cat.permute(&[2, 0, 1]) + 1.0,
                mid.sum(&[1], false),
                mid * 0.5,
            ]
        };
        let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
        for d in &devices() {
            common::record(d);
            let got = tessera::read_all_blocking(&build(d)).unwrap();
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let tol = Tol { atol: 1e-4, rtol: 1e-4 }.scaled(s.iter().product());
                assert_close(&format!("output {k} {s:?} perm {perm:?} on {}", common::label(d)), g, w, tol);
            }
        }
    }
}

/// One write of a random group over the same rows: its rule, what its operands are,
/// and its gate.
#[derive(Clone, Debug)]
struct RandomWrite {
    /// 0 replace, 1 accumulate, 2 accumulate squares, 3 step with a per-row
    /// numerator, 4 step with a table numerator.
    kind: u8,
    /// For a step: read an earlier write's result (when there is a fitting one) rather
    /// than a buffer of its own, for the numerator and the denominator.
    earlier: (bool, bool),
    /// 0 none, 1 open, 2 shut.
    gate: u8,
}

fn random_write() -> impl Strategy<Value = RandomWrite> {
    // Steps that read earlier writes most of the time: what a group holds in variables.
    let earlier = (prop::bool::weighted(0.8), prop::bool::weighted(0.8));
    (0u8..5, earlier, 0u8..3).prop_map(|(kind, earlier, gate)| RandomWrite { kind, earlier, gate })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random row writes over the same distinct rows (some out of range), realised
    /// together: the scheduler groups them into one kernel (on wgpu, one quad kernel
    /// when rows are a multiple of 4 long), where a step reads earlier writes' new rows.
    /// Every device matches the reference.
    #[test]
    fn random_row_write_groups_match_on_every_device(
        d in prop_oneof![Just(1usize), Just(3), Just(4), Just(8), Just(8), Just(12), Just(13)],
        r in 2usize..40,
        picks in prop::collection::vec(0usize..48, 1..12),
        writes in prop::collection::vec(random_write(), 2..6),
        seed in 0u64..1000,
    ) {
        // Distinct rows, some past either end of the table.
        let mut rows: Vec<i32> = Vec::new();
        for p in picks {
            let row = p as i32 - 2;
            if row <= r as i32 + 3 && !rows.contains(&row) {
                rows.push(row);
            }
        }
        let u = rows.len();
        let build = |dev: &Device| -> Vec<Tensor> {
            let ids = Tensor::from_slice(&rows, [u], dev);
            let open = Tensor::from_slice(&[1.0f32], [1], dev);
            let shut = Tensor::from_slice(&[0.0f32], [1], dev);
            let mut out: Vec<Tensor> = Vec::new();
            // Results whose rows are all positive (sums of squares): denominators.
            let mut positive: Vec<usize> = Vec::new();
            for (j, w) in writes.iter().enumerate() {
                let s = seed + 10 * j as u64;
                let gate = match w.gate { 1 => Some(&open), 2 => Some(&shut), _ => None };
                let per_row = rand_t(&[u, d], s + 1, -2.0, 2.0, dev);
                let (h0, h1) = (0.5 + (s % 5) as f64 * 0.1, 0.3);
                let t = match w.kind {
                    0 => rand_t(&[r, d], s, -1.0, 1.0, dev).scatter_rows(&ids, &per_row),
                    1 | 2 => {
                        let square = w.kind == 2;
                        let t = rand_t(&[r, d], s, 0.1, 1.0, dev).accumulate_rows(&ids, &per_row, square, [h0, h1], gate);
                        if square {
                            positive.push(j);
                        }
                        t
                    }
                    _ => {
                        let num_rows = w.kind == 4;
                        let num = match (w.earlier.0 && num_rows, out.last()) {
                            (true, Some(prev)) => prev.clone(),
                            _ if num_rows => rand_t(&[r, d], s + 2, -1.0, 1.0, dev),
                            _ => per_row,
                        };
                        let den = match (w.earlier.1, positive.last()) {
                            (true, Some(&p)) => out[p].clone(),
                            _ => rand_t(&[r, d], s + 3, 0.1, 2.0, dev),
                        };
                        rand_t(&[r, d], s, -1.0, 1.0, dev).step_rows(&ids, &num, num_rows, &den, [0.05, 1e-3], gate)
                    }
                };
                out.push(t);
            }
            out
        };
        let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
        for dev in &devices() {
            common::record(dev);
            let got = tessera::read_all_blocking(&build(dev)).unwrap();
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("write {k} of {writes:?}, rows {rows:?}, d {d}, on {}", common::label(dev));
                assert_close(&what, g, w, Tol::for_dtype(DType::F32).scaled(4));
            }
        }
    }
}

/// One random window for `random_index_arithmetic_matches`: kernel, stride, padding,
/// dilation (square).
fn window() -> impl Strategy<Value = tessera::graph::Window> {
    (1usize..4, 1usize..4, 0usize..3, 1usize..3).prop_map(|(k, s, p, d)| tessera::graph::Window {
        kernel: (k, k),
        stride: (s, s),
        padding: (p, p),
        dilation: (d, d),
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        cases(24)
    ))]

    /// Kernels whose element-by-element form divides (windows, permutes that move the
    /// innermost axis, slices and gathers along it, pads, concatenations, reshapes that
    /// split a coordinate), on innermost lengths that are and are not a multiple of 4:
    /// the run kernels (four lanes along the innermost axis), the vector forms and the
    /// scalar kernel, alone and as siblings of one shape, over buffers and expressions,
    /// in f32, i32, bool and f16.
    #[test]
    fn random_index_arithmetic_matches(
        img in (1usize..3, 1usize..4, 3usize..10, prop_oneof![Just(4usize), Just(5), Just(8), Just(11), Just(12), Just(14), Just(19)]),
        win in window(),
        s in (1usize..4, prop_oneof![Just(3usize), Just(4), Just(7), Just(8), Just(9), Just(14)], prop_oneof![Just(4usize), Just(7), Just(8), Just(10), Just(12), Just(5)]),
        perm in Just(vec![0usize, 1, 2]).prop_shuffle(),
        (start, step) in (0usize..3, 1usize..4),
        pad in (0usize..5, 0usize..5),
        picks in prop::collection::vec(0usize..15, 1..5),
        through_buffer in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let (n, c, h, w) = img;
        prop_assume!(window_fits(h, win.kernel.0, win.padding.0, win.dilation.0) && window_fits(w, win.kernel.1, win.padding.1, win.dilation.1));
        let oh = (h + 2 * win.padding.0 - (win.kernel.0 - 1) * win.dilation.0 - 1) / win.stride.0 + 1;
        let ow = (w + 2 * win.padding.1 - (win.kernel.1 - 1) * win.dilation.1 - 1) / win.stride.1 + 1;
        let kk = win.kernel.0 * win.kernel.1;
        let build = |d: &Device| {
            let im = rand_t(&[n, c, h, w], seed, -2.0, 2.0, d);
            let im = if through_buffer { im } else { (&im * 1.5 - 0.25).tanh() };
            let x = rand_t(&[s.0, s.1, s.2], seed + 1, -2.0, 2.0, d);
            let x = if through_buffer { x } else { &x * 2.0 + 1.0 };
            let p = x.permute(&perm);
            let pd = p.dims().to_vec();
            let last = pd[2];
            let st = start.min(last - 1);
            let idx_len = 4 * (1 + seed as usize % 3);
            let idx = Tensor::from_slice(
                &(0..idx_len).map(|i| ((i * 7 + seed as usize) % last) as i32).collect::<Vec<_>>(), [idx_len], d);
            let gidx = Tensor::from_slice(
                &(0..pd.iter().product::<usize>()).map(|i| ((i * 5 + seed as usize) % last) as i32).collect::<Vec<_>>(),
                pd.clone(), d);
            let cols = im.im2col(win, -0.5);
            let out = |k: usize| -> Tensor {
                match k {
                    0 => cols.clone(),
                    1 => cols.reshape([n, c * kk, oh * ow]) * 2.0,
                    2 => cols.reshape([n, c, kk * oh, ow]).exp(),
                    3 => p.exp(),
                    4 => p.slice(2, st as isize, last as isize, step) + 1.0,
                    5 => p.pad(&[(0, 0), (0, 0), (pad.0, pad.1)], 0.75),
                    6 => p.index_select(2, &idx) * 3.0,
                    7 => p.gather(2, &gidx),
                    8 => Tensor::concat(&[p.clone(), p.neg()], 2),
                    9 => (&p * 10.0).cast(DType::I32),
                    10 => p.gt(&(&p * 0.5)),
                    11 => p.cast(DType::F16) * 2.0,
                    // A value per row (a per-channel scale), a row and a column beside
                    // the input read along its innermost axis.
                    12 => &p * &rand_t(&[pd[0], pd[1], 1], seed + 5, -1.0, 1.0, d) + 0.5,
                    13 => (&p + &rand_t(&[1, pd[1], 1], seed + 6, -1.0, 1.0, d)).relu() + &rand_t(&[pd[2]], seed + 7, -1.0, 1.0, d),
                    // An f16 buffer beside a per-row value.
                    _ => {
                        let h = rand_t(&pd, seed + 8, -2.0, 2.0, d).cast(DType::F16);
                        h.realize_blocking().unwrap();
                        (&h - &rand_t(&[pd[0], pd[1], 1], seed + 9, -1.0, 1.0, d).cast(DType::F16)).exp()
                    }
                }
            };
            picks.iter().map(|&k| out(k)).collect::<Vec<_>>()
        };
        let want_t = build(&Device::reference());
        let want = tessera::read_all_blocking(&want_t).unwrap();
        for d in &devices() {
            common::record(d);
            let got_t = build(d);
            let got = tessera::read_all_blocking(&got_t).unwrap();
            for (k, ((g, w), wt)) in got.iter().zip(&want).zip(&want_t).enumerate() {
                prop_assert_eq!(got_t[k].dims(), wt.dims());
                let what = format!("pick {} ({:?}) on {}", k, picks, common::label(d));
                assert_close(&what, g, w, Tol::for_dtype(wt.dtype()).scaled(4));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        cases(12)
    ))]

    /// Attention, fused and composed, on random shapes (rank 3 and 4, query and key
    /// lengths from 1 to past a tile, head dims that are and are not a multiple of 4),
    /// without a mask, with a random bool mask (rows masked whole included) over batch
    /// and keys, with a float mask over queries and keys, causal or not, in f32 and f16.
    #[test]
    fn random_attention_matches(
        (b, h, t, s) in (1usize..3, 1usize..4, prop_oneof![1usize..10, 30usize..70], prop_oneof![1usize..10, 20usize..140]),
        dim in prop_oneof![Just(4usize), Just(6), Just(8), Just(12), Just(16), Just(20), Just(32), Just(40), Just(64), Just(72), Just(128)],
        rank4 in any::<bool>(),
        causal in any::<bool>(),
        mask in 0u8..3,
        f16 in any::<bool>(),
        fused in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let dt = if f16 { DType::F16 } else { DType::F32 };
        let (qd, kd) = if rank4 { (vec![b, h, t, dim], vec![b, h, s, dim]) } else { (vec![b * h, t, dim], vec![b * h, s, dim]) };
        let r = qd.len();
        let build = |d: &Device| {
            let q = rand_t(&qd, seed, -1.0, 1.0, d).cast(dt);
            let k = rand_t(&kd, seed + 1, -1.0, 1.0, d).cast(dt);
            let v = rand_t(&kd, seed + 2, -1.0, 1.0, d).cast(dt);
            let m = match mask {
                1 => {
                    let mut md = vec![1; r];
                    md[0] = qd[0];
                    md[r - 1] = s;
                    let keep: Vec<bool> = common::data(qd[0] * s, seed + 3, 0.0, 1.0).iter().map(|&u| u > 0.3).collect();
                    Some(Tensor::from_slice(&keep, md, d))
                }
                2 => Some(rand_t(&[t, s], seed + 3, -2.0, 2.0, d)),
                _ => None,
            };
            let a = if fused {
                Tensor::scaled_dot_product_attention_fused(&q, &k, &v, m.as_ref(), causal)
            } else {
                Tensor::scaled_dot_product_attention(&q, &k, &v, m.as_ref(), causal)
            };
            vec![a.cast(DType::F32)]
        };
        let tol = if f16 { Tol { atol: 3e-3, rtol: 1e-2 } } else { Tol { atol: 3e-5, rtol: 1e-4 } };
        let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
        for d in &devices() {
            common::record(d);
            let got = tessera::read_all_blocking(&build(d)).unwrap_or_else(|e| panic!("on {}: {e}", common::label(d)));
            assert_close(&format!("{qd:?} keys {s} causal {causal} mask {mask} {dt} on {}", common::label(d)), &got[0], &want[0], tol);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        cases(16)
    ))]

    /// A Linear layer's product and what follows it (a bias, an activation, a residual
    /// and a cast, each or none: the epilogues fused into the product's store) over f32,
    /// f16, Q8_0 and Q4_0 weights stored `[out, in]`, at row counts from one (GEMV) to
    /// past a tile, batched or not, on every matmul kernel family.
    #[test]
    fn random_linear_epilogues_match_on_every_kernel(
        m in prop_oneof![Just(1usize), Just(2), Just(5), Just(33), Just(70)],
        n in prop_oneof![Just(1usize), Just(3), Just(8), Just(24), Just(72), Just(130)],
        k in prop_oneof![Just(32usize), Just(64), Just(96), Just(160)],
        batch in any::<bool>(),
        wdt in 0usize..4,
        bias in any::<bool>(),
        act in 0usize..7,
        residual in any::<bool>(),
        to_f16 in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let wdt = [DType::F32, DType::F16, DType::Q8_0, DType::Q4_0][wdt];
        let blocks = wdt.is_quantized().then(|| tessera::quant::quantize(wdt, &common::data(n * k, seed, -1.0, 1.0)));
        let build = |d: &Device| {
            let xd = if batch { vec![2, m, k] } else { vec![m, k] };
            let x = rand_t(&xd, seed + 1, -1.0, 1.0, d);
            let w = match &blocks {
                Some(b) => Tensor::from_quantized(wdt, [n, k], b, d),
                None => rand_t(&[n, k], seed, -1.0, 1.0, d).cast(wdt),
            };
            let x = if wdt == DType::F16 { x.cast(DType::F16) } else { x };
            let mut y = x.matmul(&w.t());
            if bias {
                y = &y + &rand_t(&[n], seed + 2, -1.0, 1.0, d).cast(y.dtype());
            }
            y = match act {
                1 => y.relu(),
                2 => y.gelu(),
                3 => y.gelu_tanh(),
                4 => y.silu(),
                5 => y.sigmoid(),
                6 => y.tanh(),
                _ => y,
            };
            if residual {
                let mut rd = xd.clone();
                *rd.last_mut().unwrap() = n;
                y = &y + &rand_t(&rd, seed + 3, -1.0, 1.0, d).cast(y.dtype());
            }
            if to_f16 {
                y = y.cast(DType::F16);
            }
            vec![y.cast(DType::F32)]
        };
        let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
        let tol = if wdt == DType::F16 || to_f16 { Tol { atol: 2e-2, rtol: 1e-2 } } else { Tol { atol: 2e-4, rtol: 1e-4 }.scaled(k) };
        // The kernel families, and each adapter as tuned.
        for d in matmul_devices().iter().chain(common::gpu_devices()) {
            common::record(d);
            let got = tessera::read_all_blocking(&build(d)).unwrap();
            let what = format!("{m}x{n}x{k} batch={batch} {wdt} bias={bias} act={act} residual={residual} f16 out={to_f16} on {:?}", d.matmul_config());
            assert_close(&what, &got[0], &want[0], tol);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        cases(12)
    ))]

    /// Depthwise convolutions (a sum over the window's taps on GPU devices, up to
    /// `DEPTHWISE_MAX_TAPS`; one product per channel past it): windows up to 8x8,
    /// strides, padding, dilation, a bias or none, channel multipliers of 1 to 3, f32 and
    /// f16, on every device.
    #[test]
    fn random_depthwise_convolutions_match(
        (n, c, m) in (1usize..3, 1usize..20, prop_oneof![3 => Just(1usize), 1 => 2usize..4]),
        (h, w) in (1usize..24, 1usize..24),
        (kh, kw) in (1usize..9, 1usize..9),
        (s, p, dl) in ((1usize..3, 1usize..3), (0usize..3, 0usize..3), (1usize..3, 1usize..3)),
        bias in any::<bool>(),
        f16 in any::<bool>(),
        seed in 0u64..1000,
    ) {
        use tessera::ops::nn::Conv2dOptions;
        let o = Conv2dOptions { stride: s, padding: p, dilation: dl, groups: c };
        prop_assume!(window_fits(h, kh, p.0, dl.0) && window_fits(w, kw, p.1, dl.1));
        let dt = if f16 { DType::F16 } else { DType::F32 };
        let build = |d: &Device| {
            let x = rand_t(&[n, c, h, w], seed, -1.0, 1.0, d).cast(dt);
            let wt = rand_t(&[c * m, 1, kh, kw], seed + 1, -1.0, 1.0, d).cast(dt);
            let b = rand_t(&[c * m], seed + 2, -1.0, 1.0, d).cast(dt);
            vec![x.conv2d(&wt, bias.then_some(&b), o).relu().cast(DType::F32)]
        };
        let want = tessera::read_all_blocking(&build(&Device::reference())).unwrap();
        let tol = if f16 { Tol { atol: 1e-2, rtol: 1e-2 } } else { Tol::for_dtype(DType::F32).scaled(kh * kw) };
        for d in &devices() {
            common::record(d);
            let got = tessera::read_all_blocking(&build(d)).unwrap();
            assert_close(&format!("{n}x{c}x{h}x{w} x{m} {o:?} k {kh}x{kw} bias {bias} {dt} on {}", common::label(d)), &got[0], &want[0], tol);
        }
    }
}
