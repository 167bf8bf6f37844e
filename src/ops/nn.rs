//! Neural-network ops composed from the core ops: conv2d (as im2col + batched matmul),
//! pooling, normalisation and scaled-dot-product attention. Being compositions, they
//! fuse like any other chain and their gradients come from the core rules.

use super::{arg_err, precheck, shape_err, Loc};
use crate::graph::trace::{self, Composite, Geometry};
use crate::graph::{Op, Window};
use crate::{DType, Result, Tensor};
use std::panic::Location;

/// Geometry of a 2-D convolution or pooling window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions { stride: (1, 1), padding: (0, 0), dilation: (1, 1), groups: 1 }
    }
}

impl Conv2dOptions {
    /// Stride `s` and padding `p` on both axes.
    pub fn new(stride: usize, padding: usize) -> Self {
        Conv2dOptions { stride: (stride, stride), padding: (padding, padding), ..Default::default() }
    }
}

impl Tensor {
    /// The `kh x kw` windows of `[N, C, H, W]` as `[N, C, kh*kw, OH, OW]` (im2col).
    fn windows(&self, kh: usize, kw: usize, o: &Conv2dOptions, pad_value: f64, loc: Loc) -> Result<Tensor> {
        let w = Window { kernel: (kh, kw), stride: o.stride, padding: o.padding, dilation: o.dilation };
        let d = self.dims();
        let Some((oh, ow)) = w.output_size(d[2], d[3]) else {
            return Err(shape_err(
                "conv2d",
                &[d],
                format!("a {kh}x{kw} window with {o:?} does not fit a {}x{} input", d[2], d[3]),
                loc,
            ));
        };
        super::check_numel("im2col", &[d[0], d[1], kh * kw, oh, ow], loc)?;
        Ok(self.derive(Op::Im2col { window: w, pad_value }, vec![d[0], d[1], kh * kw, oh, ow], loc))
    }

    /// Sliding windows `[N, C, H, W]` -> `[N, C, kh*kw, OH, OW]` (see [`Op::Im2col`]).
    #[track_caller]
    pub fn im2col(&self, window: Window, pad_value: f64) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            precheck("im2col", &[self], loc)?;
            if self.rank() != 4 {
                return Err(shape_err("im2col", &[self.dims()], "input must be [N, C, H, W]", loc));
            }
            let o =
                Conv2dOptions { stride: window.stride, padding: window.padding, dilation: window.dilation, groups: 1 };
            self.windows(window.kernel.0, window.kernel.1, &o, pad_value, loc)
        })();
        self.lift(r)
    }

    /// The adjoint of [`Tensor::im2col`]: `[N, C, kh*kw, OH, OW]` summed onto `[N, C, h, w]`.
    #[track_caller]
    pub fn col2im(&self, window: Window, h: usize, w: usize) -> Tensor {
        let loc = Location::caller();
        let r = (|| {
            precheck("col2im", &[self], loc)?;
            let d = self.dims();
            let fits = window.output_size(h, w).map(|(oh, ow)| d.len() == 5 && d[3] == oh && d[4] == ow);
            if fits != Some(true) || d[2] != window.kernel.0 * window.kernel.1 {
                return Err(shape_err("col2im", &[d], format!("columns do not match {window:?} over {h}x{w}"), loc));
            }
            Ok(self.derive(Op::Col2im { window }, vec![d[0], d[1], h, w], loc))
        })();
        self.lift(r)
    }

    /// 2-D convolution (cross-correlation, as PyTorch): `self` is `[N, C, H, W]`,
    /// `weight` `[O, C/groups, KH, KW]`, `bias` `[O]`. Depthwise is `groups == C`.
    #[track_caller]
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, opts: Conv2dOptions) -> Tensor {
        let loc = Location::caller();
        let y = self.lift(conv2d_impl(self, weight, bias, opts, loc));
        let mut ins = vec![self, weight];
        ins.extend(bias);
        trace::record(&y, Composite::Conv { geometry: geometry(weight, &opts), groups: opts.groups }, &ins);
        y
    }

    /// [`Tensor::conv2d`] with the weight as the im2col product's matrix: `weight` is
    /// `[O, Kp]`, each row a filter's `C/groups * KH * KW` values (PyTorch's order)
    /// followed by zeros up to `Kp`, a whole number of 32-value blocks. This is how a
    /// Q8_0/Q4_0 convolution weight is stored ([`crate::quant::quantize_conv`]); the
    /// product dequantises it as its tiles load.
    #[track_caller]
    pub fn conv2d_quantized(
        &self,
        weight: &Tensor,
        kernel: (usize, usize),
        bias: Option<&Tensor>,
        opts: Conv2dOptions,
    ) -> Tensor {
        let loc = Location::caller();
        self.lift(conv2d_quantized_impl(self, weight, kernel, bias, opts, loc))
    }

    /// 2-D transposed convolution (PyTorch's `conv_transpose2d`, the adjoint of
    /// [`Tensor::conv2d`] with the same options): `self` is `[N, C, H, W]`, `weight`
    /// `[C, O/groups, KH, KW]`, `bias` `[O]`; the output is `[N, O, H', W']` with
    /// `H' = (H - 1) * stride - 2 * padding + dilation * (KH - 1) + output_padding + 1`.
    /// One batched product per group, then `Col2im` sums the window elements into place.
    #[track_caller]
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv2dOptions,
        output_padding: (usize, usize),
    ) -> Tensor {
        let loc = Location::caller();
        let y = self.lift(conv_transpose2d_impl(self, weight, bias, opts, output_padding, loc));
        let mut ins = vec![self, weight];
        ins.extend(bias);
        let op = Composite::ConvTranspose { geometry: geometry(weight, &opts), groups: opts.groups, output_padding };
        trace::record(&y, op, &ins);
        y
    }

    /// Max pooling over `k x k` windows with `stride` (padding pads with -inf).
    #[track_caller]
    pub fn max_pool2d(&self, k: usize, stride: usize, padding: usize) -> Tensor {
        let loc = Location::caller();
        let y = self.lift(pool_impl(self, k, stride, padding, true, loc));
        trace::record(&y, Composite::MaxPool { geometry: square(k, stride, padding) }, &[self]);
        y
    }

    /// Average pooling over `k x k` windows with `stride` (zero padding counts).
    #[track_caller]
    pub fn avg_pool2d(&self, k: usize, stride: usize, padding: usize) -> Tensor {
        let loc = Location::caller();
        let y = self.lift(pool_impl(self, k, stride, padding, false, loc));
        trace::record(&y, Composite::AvgPool { geometry: square(k, stride, padding) }, &[self]);
        y
    }

    /// Layer normalisation over the last axis, with optional affine `weight` and `bias`.
    /// f32 with `[D]` weight and bias runs as one kernel (`Op::Norm`).
    #[track_caller]
    pub fn layer_norm(&self, weight: Option<&Tensor>, bias: Option<&Tensor>, eps: f64) -> Tensor {
        let loc = Location::caller();
        if let Some(t) = fused_norm(self, false, eps, weight, bias, loc) {
            return t;
        }
        let mut y = normalise(self, false, eps).0;
        if let Some(w) = weight {
            y = y.mul(w);
        }
        if let Some(b) = bias {
            y = y.add(b);
        }
        y
    }

    /// RMS normalisation over the last axis: `x / sqrt(mean(x^2) + eps) * weight`
    /// (one kernel for f32 with a `[D]` weight).
    #[track_caller]
    pub fn rms_norm(&self, weight: Option<&Tensor>, eps: f64) -> Tensor {
        let loc = Location::caller();
        if let Some(t) = fused_norm(self, true, eps, weight, None, loc) {
            return t;
        }
        let y = normalise(self, true, eps).0;
        match weight {
            Some(w) => y.mul(w),
            None => y,
        }
    }

    /// `softmax(q k^T / sqrt(d) + mask) v` over the last two axes. `q` is `[.., T, d]`,
    /// `k` `[.., S, d]`, `v` `[.., S, dv]`. `mask` is a Bool keep-mask or a float bias
    /// broadcastable to `[.., T, S]`; `causal` hides keys after each query. Runs as
    /// matmul, softmax and matmul kernels, or as the fused kernel where the device
    /// prefers it ([`Device::fused_attention`](crate::Device::fused_attention): the
    /// autotuner's measurement, or `TESSERA_FUSED_ATTENTION=1`).
    #[track_caller]
    pub fn scaled_dot_product_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
    ) -> Tensor {
        let loc = Location::caller();
        q.lift(sdpa_impl(q, k, v, mask, causal, q.device().fused_attention(), loc))
    }

    /// [`Tensor::scaled_dot_product_attention`] as one fused flash-style kernel
    /// (`shaders/attention.wgsl`) where its inputs allow (same dtype f32/f16, head dim up
    /// to 128 and even for f16, equal batch axes); otherwise the composition.
    #[track_caller]
    pub fn scaled_dot_product_attention_fused(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
    ) -> Tensor {
        let loc = Location::caller();
        q.lift(sdpa_impl(q, k, v, mask, causal, true, loc))
    }
}

/// A convolution's geometry, for [`trace`].
fn geometry(w: &Tensor, o: &Conv2dOptions) -> Geometry {
    let k = if w.rank() == 4 { (w.dims()[2], w.dims()[3]) } else { (0, 0) };
    Geometry { kernel: k, stride: o.stride, padding: o.padding, dilation: o.dilation }
}

/// A pooling window's geometry, for [`trace`].
fn square(k: usize, stride: usize, padding: usize) -> Geometry {
    Geometry { kernel: (k, k), stride: (stride, stride), padding: (padding, padding), dilation: (1, 1) }
}

/// Largest window (input channels x kernel area) convolved directly rather than by matmul
/// (not on CPU adapters, whose padded products are faster).
pub const DIRECT_MAX_CK: usize = 16;

/// Largest window (kernel area) of a depthwise convolution computed as a sum of its taps
/// rather than by one product per channel.
pub const DEPTHWISE_MAX_TAPS: usize = 49;

/// Output pixels per image from which a convolution multiplies image by image (the
/// result is NCHW as it stands) rather than over the whole batch at once.
pub const PER_IMAGE_MIN_PIXELS: usize = 256;

fn conv2d_impl(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, o: Conv2dOptions, loc: Loc) -> Result<Tensor> {
    let mut ts = vec![x, w];
    ts.extend(bias);
    precheck("conv2d", &ts, loc)?;
    if x.rank() != 4 || w.rank() != 4 {
        return Err(shape_err("conv2d", &[x.dims(), w.dims()], "input [N, C, H, W] and weight [O, C/g, KH, KW]", loc));
    }
    let (oc, cg, kh, kw) = (w.dims()[0], w.dims()[1], w.dims()[2], w.dims()[3]);
    conv_product(x, w, (oc, cg, kh, kw), bias, o, loc)
}

fn conv2d_quantized_impl(
    x: &Tensor,
    w: &Tensor,
    kernel: (usize, usize),
    bias: Option<&Tensor>,
    o: Conv2dOptions,
    loc: Loc,
) -> Result<Tensor> {
    let op = "conv2d_quantized";
    let mut ts = vec![x, w];
    ts.extend(bias);
    // The weight may be quantised (the product dequantises it); the input and bias not.
    precheck("matmul", &ts, loc)?;
    if let Some(t) = [Some(x), bias].into_iter().flatten().find(|t| !t.dtype().is_float()) {
        return Err(super::dtype_err(op, &[t.dtype()], "the input and bias must be f32 or f16", loc));
    }
    if x.rank() != 4 || w.rank() != 2 {
        return Err(shape_err(op, &[x.dims(), w.dims()], "input [N, C, H, W] and weight [O, K]", loc));
    }
    let (c, g) = (x.dims()[1], o.groups.max(1));
    let ck = c / g * kernel.0 * kernel.1;
    let kp = w.dims()[1];
    if c % g != 0 || kp < ck || kp - ck >= crate::quant::BLOCK {
        return Err(shape_err(
            op,
            &[x.dims(), w.dims()],
            format!("{c} input channels in {g} group(s) over a {}x{} window need {ck} weight columns, padded to whole blocks of 32", kernel.0, kernel.1),
            loc,
        ));
    }
    conv_product(x, w, (w.dims()[0], c / g, kernel.0, kernel.1), bias, o, loc)
}

/// The convolution of `x` with `w`: a float `[O, C/g, KH, KW]` weight, or a weight
/// matrix `[O, Kp]` whose rows are the flattened windows padded with zero columns to
/// `Kp` (block-quantised weights: the im2col product reads them as they are stored).
fn conv_product(
    x: &Tensor,
    w: &Tensor,
    (oc, cg, kh, kw): (usize, usize, usize, usize),
    bias: Option<&Tensor>,
    o: Conv2dOptions,
    loc: Loc,
) -> Result<Tensor> {
    let (n, c) = (x.dims()[0], x.dims()[1]);
    let g = o.groups;
    if g == 0 || c % g != 0 || oc % g != 0 || cg != c / g {
        return Err(shape_err(
            "conv2d",
            &[x.dims(), w.dims()],
            format!("{c} input channels, {oc} output channels and weight channels {cg} do not fit groups={g}"),
            loc,
        ));
    }
    if o.stride.0 == 0 || o.stride.1 == 0 || o.dilation.0 == 0 || o.dilation.1 == 0 {
        return Err(arg_err("conv2d", "stride and dilation must be positive", loc));
    }
    if let Some(b) = bias {
        if b.dims() != [oc] {
            return Err(shape_err("conv2d", &[b.dims()], format!("bias must be [{oc}]"), loc));
        }
    }
    let cols = x.windows(kh, kw, &o, 0.0, loc)?; // [N, C, K, OH, OW]
    let (oh, ow) = (cols.dims()[3], cols.dims()[4]);
    let ck = cg * kh * kw;
    // (One input channel with several outputs is an ordinary convolution: its
    // few-channel paths below keep the weight gradient one kernel, not one per tap.)
    let depthwise = g == c && (oc == c || c > 1);
    if depthwise && kh * kw <= DEPTHWISE_MAX_TAPS && !x.device().is_cpu() && w.rank() == 4 && w.dtype().is_float() {
        // Depthwise (each output channel reads one input channel; `m` outputs per input
        // with a channel multiplier): each output is a sum over the window's taps, one
        // element-wise kernel that reads the taps where they lie, instead of columns
        // padded to whole vectors and a one-row product per channel (lavapipe, 3x3 over
        // 16 channels of 320x320: 268 -> 76 ms). f16 sums in f32.
        let (m, k) = (oc / c, kh * kw);
        let f32_of = |t: Tensor| if t.dtype() == DType::F32 { t } else { t.cast(DType::F32) };
        // Taps [N, C, K, 1, OH, OW] against weights [1, C, K, M, 1, 1]: output channel
        // c * m + j is input channel c's taps times filter j.
        let taps = f32_of(cols.reshape(vec![n, c, k, 1, oh, ow]));
        let wk = f32_of(w.reshape(vec![1, c, m, k, 1, 1]).permute(&[0, 1, 3, 2, 4, 5]));
        let mut y = taps.narrow(2, 0, 1).mul(&wk.narrow(2, 0, 1));
        for t in 1..k {
            y = y.add(&taps.narrow(2, t, 1).mul(&wk.narrow(2, t, 1)));
        }
        let mut y = y.reshape(vec![n, oc, oh, ow]);
        if let Some(b) = bias {
            y = y.add(&f32_of(b.reshape(vec![1, oc, 1, 1])));
        }
        return Ok(if x.dtype() == DType::F32 { y } else { y.cast(x.dtype()) });
    }
    // CPU adapters' product kernels load K 4 or 8 values at a time, and took the scalar
    // kernel for other windows; padded with zero taps to a multiple of 8, every float
    // convolution there is a product on the vector kernels, few-channel ones included
    // (as a reduction over the window they ran 3-8x slower: lavapipe, 3x3 from one
    // channel, 64x28x28 to 32 channels 201-243 -> 31-33 ms, 1x901x161 to 128 3.2-4.0 ->
    // 0.45-0.49 s).
    let aligned = x.device().direct_matmul() && w.rank() == 4 && w.dtype().is_float();
    // A weight matrix with padded rows (a given `[O, Kp]`, or padded here): the columns
    // gain as many zero rows.
    let kp = match w.rank() {
        2 => w.dims()[1],
        _ if aligned => ck.next_multiple_of(8),
        _ => ck,
    };
    let wm = match w.rank() {
        4 if kp > ck => w.reshape(vec![g, oc / g, ck]).pad(&[(0, 0), (0, 0), (0, kp - ck)], 0.0),
        _ => w.reshape(vec![g, oc / g, kp]),
    };
    // On the host (the CPU backend and the reference) products are cheap and gathers
    // are not: every convolution is im2col plus one product per image.
    let host = x.device().is_cpu();
    if g == 1 && ck <= DIRECT_MAX_CK && !host && !aligned && w.dtype().is_float() {
        // Few input channels: each output is a short dot product, computed directly as a
        // reduction over the window (no thin matmul).
        let cols = cols.reshape(vec![n, 1, ck, oh * ow]);
        let y = cols.mul(&w.reshape(vec![1, oc, ck, 1])).sum(&[2], false).reshape(vec![n, oc, oh, ow]);
        return Ok(match bias {
            Some(b) => y.add(&b.reshape(vec![1, oc, 1, 1])),
            None => y,
        });
    }
    let y = if oh * ow >= PER_IMAGE_MIN_PIXELS || host {
        // Large images: one product per image and group, [O/g, C/g*K] @ [C/g*K, OH*OW],
        // whose result is already NCHW (no transposes on either side).
        let mut cols = cols.reshape(vec![n, g, ck, oh * ow]);
        if kp > ck {
            cols = cols.pad(&[(0, 0), (0, 0), (0, kp - ck), (0, 0)], 0.0);
        }
        wm.reshape(vec![1, g, oc / g, kp]).matmul(&cols).reshape(vec![n, oc, oh, ow])
    } else {
        // Small images: one product per group over the whole batch, [g, O/g, C/g*K] @
        // [g, C/g*K, N*OH*OW], so the columns fill the tiles.
        let mut cols = cols.reshape(vec![n, g, ck, oh * ow]).permute(&[1, 2, 0, 3]).reshape(vec![g, ck, n * oh * ow]);
        if kp > ck {
            cols = cols.pad(&[(0, 0), (0, kp - ck), (0, 0)], 0.0);
        }
        wm.matmul(&cols).reshape(vec![oc, n, oh, ow]).permute(&[1, 0, 2, 3])
    };
    Ok(match bias {
        Some(b) => y.add(&b.reshape(vec![1, oc, 1, 1])),
        None => y,
    })
}

fn conv_transpose2d_impl(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    o: Conv2dOptions,
    out_pad: (usize, usize),
    loc: Loc,
) -> Result<Tensor> {
    let op = "conv_transpose2d";
    let mut ts = vec![x, w];
    ts.extend(bias);
    precheck(op, &ts, loc)?;
    if x.rank() != 4 || w.rank() != 4 {
        return Err(shape_err(op, &[x.dims(), w.dims()], "input [N, C, H, W] and weight [C, O/g, KH, KW]", loc));
    }
    let (n, c, h, wd) = (x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]);
    let (wc, og, kh, kw) = (w.dims()[0], w.dims()[1], w.dims()[2], w.dims()[3]);
    let g = o.groups;
    if g == 0 || wc != c || c % g != 0 || kh == 0 || kw == 0 {
        return Err(shape_err(
            op,
            &[x.dims(), w.dims()],
            format!("{c} input channels do not fit weight channels {wc}, groups={g} and a {kh}x{kw} kernel"),
            loc,
        ));
    }
    if o.stride.0 == 0 || o.stride.1 == 0 || o.dilation.0 == 0 || o.dilation.1 == 0 {
        return Err(arg_err(op, "stride and dilation must be positive", loc));
    }
    if out_pad.0 >= o.stride.0.max(o.dilation.0) || out_pad.1 >= o.stride.1.max(o.dilation.1) {
        return Err(arg_err(op, "output_padding must be smaller than stride or dilation", loc));
    }
    let oc = og * g;
    if let Some(b) = bias {
        if b.dims() != [oc] {
            return Err(shape_err(op, &[b.dims()], format!("bias must be [{oc}]"), loc));
        }
    }
    // Output size: the input size of the convolution this is the adjoint of.
    let side = |n: usize, s: usize, p: usize, d: usize, k: usize, op_: usize| -> Option<usize> {
        let full = n.checked_sub(1)?.checked_mul(s)?.checked_add(d.checked_mul(k - 1)?)?;
        full.checked_add(op_ + 1)?.checked_sub(p.checked_mul(2)?)
    };
    let (Some(ho), Some(wo)) = (
        side(h, o.stride.0, o.padding.0, o.dilation.0, kh, out_pad.0),
        side(wd, o.stride.1, o.padding.1, o.dilation.1, kw, out_pad.1),
    ) else {
        return Err(shape_err(op, &[x.dims(), w.dims()], format!("no output size fits padding {:?}", o.padding), loc));
    };
    let window = Window { kernel: (kh, kw), stride: o.stride, padding: o.padding, dilation: o.dilation };
    if window.output_size(ho, wo) != Some((h, wd)) {
        return Err(shape_err(op, &[x.dims(), w.dims()], format!("no {ho}x{wo} output maps back to {h}x{wd}"), loc));
    }
    super::check_numel(op, &[n, oc, ho, wo], loc)?;
    // Per group: [O/g * K, C/g] @ [C/g, H*W], batched over N; then Col2im.
    let (cg, k) = (c / g, kh * kw);
    let wt = w.reshape(vec![1, g, cg, og * k]).transpose(-2, -1);
    let cols = wt.matmul(&x.reshape(vec![n, g, cg, h * wd])).reshape(vec![n, oc, k, h, wd]);
    let y = cols.col2im(window, ho, wo);
    Ok(match bias {
        Some(b) => y.add(&b.reshape(vec![1, oc, 1, 1])),
        None => y,
    })
}

fn pool_impl(x: &Tensor, k: usize, stride: usize, padding: usize, max: bool, loc: Loc) -> Result<Tensor> {
    let op = if max { "max_pool2d" } else { "avg_pool2d" };
    precheck(op, &[x], loc)?;
    if x.rank() != 4 || k == 0 || stride == 0 || padding * 2 > k {
        return Err(shape_err(
            op,
            &[x.dims()],
            format!("input [N, C, H, W], window {k}, stride {stride}, padding {padding}"),
            loc,
        ));
    }
    let d = x.dims().to_vec();
    // Non-overlapping windows that tile the input: a reshape and one reduction.
    if stride == k && padding == 0 && d[2].is_multiple_of(k) && d[3].is_multiple_of(k) {
        let r = x.reshape(vec![d[0], d[1], d[2] / k, k, d[3] / k, k]);
        return Ok(if max { r.max(&[3, 5], false) } else { r.mean(&[3, 5], false) });
    }
    let o = Conv2dOptions::new(stride, padding);
    let fill = if max { f64::NEG_INFINITY } else { 0.0 };
    let cols = x.windows(k, k, &o, fill, loc)?;
    Ok(if max { cols.max(&[2], false) } else { cols.mean(&[2], false) })
}

pub(crate) fn sdpa_impl(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    fused: bool,
    loc: Loc,
) -> Result<Tensor> {
    let mut ts = vec![q, k, v];
    ts.extend(mask);
    precheck("scaled_dot_product_attention", &ts, loc)?;
    if q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank() {
        return Err(shape_err(
            "scaled_dot_product_attention",
            &[q.dims(), k.dims(), v.dims()],
            "q, k, v must share a rank >= 2",
            loc,
        ));
    }
    let r = q.rank();
    let (t, d) = (q.dims()[r - 2], q.dims()[r - 1]);
    let s = k.dims()[r - 2];
    if k.dims()[r - 1] != d || v.dims()[r - 2] != s {
        return Err(shape_err(
            "scaled_dot_product_attention",
            &[q.dims(), k.dims(), v.dims()],
            "q and k need one head dim; k and v one sequence length",
            loc,
        ));
    }
    // Masks as an additive f32 bias: a bool mask keeps `true` (0) and drops `false`.
    let bias = mask.map(|m| {
        if m.dtype() == DType::Bool {
            let zero = Tensor::full(0.0, m.dims().to_vec(), DType::F32, m.device());
            Tensor::where_(m, &zero, &zero.full_like(MASKED))
        } else {
            m.cast(DType::F32)
        }
    });
    let lead = &q.dims()[..r - 2];
    let fusable = fused
        && s > 0
        && matches!(q.dtype(), DType::F32 | DType::F16)
        && k.dtype() == q.dtype()
        && v.dtype() == q.dtype()
        && (1..=crate::kernels::attention::MAX_HEAD_DIM).contains(&d)
        && (q.dtype() == DType::F32 || d % 2 == 0)
        && &k.dims()[..r - 2] == lead
        && &v.dims()[..r - 2] == lead
        && v.dims()[r - 1] == d;
    // The bias, rank-aligned, if every axis matches the scores' or broadcasts.
    let target: Vec<usize> = lead.iter().copied().chain([t, s]).collect();
    let aligned = match &bias {
        None => Some(None),
        Some(b) if b.rank() <= r => {
            let dims: Vec<usize> = std::iter::repeat_n(1, r - b.rank()).chain(b.dims().iter().copied()).collect();
            dims.iter().zip(&target).all(|(&x, &y)| x == y || x == 1).then(|| Some(b.reshape(dims)))
        }
        Some(_) => None,
    };
    if let (true, Some(bias)) = (fusable, aligned) {
        let mut ins = vec![q.clone(), k.clone(), v.clone()];
        ins.extend(bias);
        let mut out = target;
        out[r - 1] = v.dims()[r - 1];
        return Ok(Tensor::make_at(Op::Attention { causal }, ins, out.into(), v.dtype(), q.device(), loc));
    }
    let p = attention_probs(q, k, bias.as_ref(), causal).cast(v.dtype());
    Ok(p.matmul(v))
}

/// Layer (or RMS) normalisation of `x` over its last axis, composed of reductions and
/// element-wise ops: the normalised values and `1 / sqrt(var + eps)` (kept dims).
pub(crate) fn normalise(x: &Tensor, rms: bool, eps: f64) -> (Tensor, Tensor) {
    let xc = if rms { x.clone() } else { x.sub(&x.mean(&[-1], true)) };
    let rstd = xc.square().mean(&[-1], true).add_scalar(eps).rsqrt();
    (xc.mul(&rstd), rstd)
}

/// The one-kernel normalisation (`Op::Norm`) where it applies: f32 or f16 `x` of rank
/// one or more with a non-empty last axis, weight and bias (if any) of its dtype and
/// shape `[D]` (f16 is computed in f32 and rounded once, by a cast after the kernel);
/// otherwise `None` (the composition runs and reports any error).
fn fused_norm(x: &Tensor, rms: bool, eps: f64, w: Option<&Tensor>, b: Option<&Tensor>, loc: Loc) -> Option<Tensor> {
    let d = *x.dims().last()?;
    let fits =
        |t: Option<&Tensor>| t.is_none_or(|t| t.dtype() == x.dtype() && t.dims() == [d] && t.device().same(x.device()));
    if !matches!(x.dtype(), DType::F32 | DType::F16)
        || d == 0
        || !fits(w)
        || !fits(b)
        || std::env::var("TESSERA_FUSED_NORM").as_deref() == Ok("0")
        || x.exceeds_binding()
    {
        return None;
    }
    let mut ins = vec![x.clone()];
    ins.extend(w.cloned());
    ins.extend(b.cloned());
    let op = Op::Norm { rms, eps, weight: w.is_some(), bias: b.is_some() };
    Some(Tensor::make_at(op, ins, x.shape().clone(), DType::F32, x.device(), loc).cast_at(x.dtype(), loc))
}

/// The score every masked key gets (a fully masked row then averages its values).
pub(crate) const MASKED: f64 = -1.0e30;

/// Attention weights `softmax(q k^T / sqrt(D) + bias, causal)` in f32, composed of
/// matmul, reductions and element-wise ops: the unfused path and the fused kernel's
/// backward pass.
pub(crate) fn attention_probs(q: &Tensor, k: &Tensor, bias: Option<&Tensor>, causal: bool) -> Tensor {
    let r = q.rank();
    let (t, d) = (q.dims()[r - 2], q.dims()[r - 1]);
    let s = k.dims()[r - 2];
    let mut scores = q.matmul(&k.transpose(-2, -1)).mul_scalar(1.0 / (d as f64).sqrt());
    if scores.dtype() == DType::F16 {
        scores = scores.cast(DType::F32);
    }
    if let Some(b) = bias {
        scores = scores.add(b);
    }
    if causal {
        let dev = q.device();
        let rows = Tensor::arange(0.0, t as f64, 1.0, DType::I32, dev).reshape(vec![t, 1]);
        let cols = Tensor::arange(0.0, s as f64, 1.0, DType::I32, dev).reshape(vec![1, s]);
        // Queries align with the end of the keys (as PyTorch when t == s).
        let keep = cols.le(&rows.add_scalar((s as f64) - (t as f64))).broadcast_to(scores.dims().to_vec());
        scores = Tensor::where_(&keep, &scores, &scores.full_like(MASKED));
    }
    scores.softmax(-1)
}

impl Tensor {
    /// A tensor of this shape and dtype filled with `value`.
    #[track_caller]
    pub fn full_like(&self, value: f64) -> Tensor {
        Tensor::full(value, self.shape().clone(), self.dtype(), self.device())
    }
}
