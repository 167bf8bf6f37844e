// Helpers shared by generated kernels. Appended to a kernel's source when it uses them.

fn is_nan_f(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// NaN and infinity come from a variable, not a constant: WGSL compilers that evaluate
// constant expressions (Chrome's Tint) reject a NaN or infinite f32 constant.
fn nan_f() -> f32 {
    var bits = 0x7fc00000u;
    return bitcast<f32>(bits);
}

fn inf_f() -> f32 {
    var bits = 0x7f800000u;
    return bitcast<f32>(bits);
}

// max/min that propagate NaN, as PyTorch's maximum/minimum do.
fn max_f(a: f32, b: f32) -> f32 {
    if (is_nan_f(a) || is_nan_f(b)) {
        return a + b;
    }
    return max(a, b);
}

fn min_f(a: f32, b: f32) -> f32 {
    if (is_nan_f(a) || is_nan_f(b)) {
        return a + b;
    }
    return min(a, b);
}

// pow with the sign and zero rules of C's pow for integral exponents.
fn pow_f(a: f32, b: f32) -> f32 {
    if (b == 0.0) {
        return 1.0;
    }
    if (is_nan_f(a) || is_nan_f(b)) {
        return a + b;
    }
    let r = exp2(b * log2(abs(a)));
    if (a < 0.0) {
        if (fract(b) != 0.0) {
            return nan_f();
        }
        if (fract(b * 0.5) != 0.0) {
            return -r;
        }
    }
    return r;
}

// erf as x P(x^2) / Q(x^2) over x held to [-4, 4] (past 4 it rounds to +-1 in f32): the
// rational fit Eigen and XLA use for f32, as the CPU backend's `math::erf` (relative
// error below 4e-7). One division and twelve multiply-adds, no exp; NaN stays NaN.
fn erf_f(x: f32) -> f32 {
    let c = clamp(x, -4.0, 4.0);
    let s = c * c;
    let p = (((((-2.7261423e-10 * s + 2.7706814e-8) * s - 2.101024e-6) * s - 5.6925064e-5) * s - 7.3499063e-4) * s
        - 2.9546e-3) * s - 1.6096033e-2;
    let q = ((((-1.45660715e-5 * s - 2.1337405e-4) * s - 1.682827e-3) * s - 7.3733292e-3) * s - 1.4264739e-2);
    return select(c * p / q, x, is_nan_f(x));
}

// tanh as 1 - 2 / (e^2x + 1): one exp and no branch or clamp. It saturates to +-1 (e^2x
// overflows to inf, or underflows to 0) and keeps NaN; near 0 its error is absolute
// (about 1e-7), like the builtin's. Lavapipe lowers the builtin to more work (the 4M
// relu(tanh(exp(x*2+1))*x) chain: 10.6% fewer instructions, by callgrind).
fn tanh_f(x: f32) -> f32 {
    return 1.0 - 2.0 / (exp(2.0 * x) + 1.0);
}

// Counter-based RNG: a PCG output permutation of (index, seed, stream).
fn pcg_hash(v: u32) -> u32 {
    let s = v * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

fn rand_uniform(i: u32, lo: u32, hi: u32, stream: u32) -> f32 {
    let bits = pcg_hash(pcg_hash(i ^ lo) ^ hi ^ (stream * 0x9e3779b9u));
    return f32(bits >> 8u) * (1.0 / 16777216.0);
}

fn rand_normal(i: u32, lo: u32, hi: u32) -> f32 {
    let u1 = rand_uniform(i, lo, hi, 1u);
    let u2 = rand_uniform(i, lo, hi, 2u);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

// Integer division with WGSL's defined results on every backend: x / 0 = x and
// MIN / -1 = MIN (GLSL and HLSL leave both undefined).
fn div_i(a: i32, b: i32) -> i32 {
    if (b == 0i || (a == (-2147483647i - 1i) && b == -1i)) {
        return a;
    }
    return a / b;
}

fn div_u(a: u32, b: u32) -> u32 {
    if (b == 0u) {
        return a;
    }
    return a / b;
}

// relu by the bits: a negative number (-0 and -inf too) gives +0, and a NaN of either
// sign stays. No float comparison, so it holds where a backend's comparisons are not
// IEEE (Mesa's GL path folds `select(x, 0.0, x < 0.0)` into a `max` that drops NaN),
// and lavapipe packs it into a wide store without 512-bit registers (a float select
// against 0 became a masked 64-bit widening: issue #21's chain ran 1.5x slower).
fn relu_f(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    return bitcast<f32>(select(0u, b, b < 0x80000000u || b > 0xff800000u));
}

// Float-to-integer conversions that saturate (NaN gives 0) on every backend, matching
// WGSL's defined results where GLSL and HLSL leave them undefined.
fn f2i(x: f32) -> i32 {
    if (is_nan_f(x)) {
        return 0i;
    }
    return i32(clamp(x, -2147483648.0, 2147483520.0));
}

fn f2u(x: f32) -> u32 {
    if (is_nan_f(x)) {
        return 0u;
    }
    return u32(clamp(x, 0.0, 4294967040.0));
}

// Comparisons that are false for NaN (true for !=) even where the backend's are not IEEE.
fn lt_f(a: f32, b: f32) -> bool {
    return a < b && !is_nan_f(a) && !is_nan_f(b);
}

fn le_f(a: f32, b: f32) -> bool {
    return a <= b && !is_nan_f(a) && !is_nan_f(b);
}

fn eq_f(a: f32, b: f32) -> bool {
    return a == b && !is_nan_f(a) && !is_nan_f(b);
}

// f32 -> f16 -> f32 rounding: to nearest, ties to even (as the host's `half` crate), past
// 65520 to inf, by integer arithmetic on the bits. Not `quantizeToF16`: WGSL lets a
// conversion to f16 pick either neighbour (SwiftShader does not round to nearest, so
// its quantisation scales differed from the host's), some drivers flush f16
// subnormals, and NVIDIA's driver folds f32(f16(x)) and unpack2x16float(pack2x16float(x))
// away. Below the smallest normal f16 (2^-14) values round to multiples of 2^-24
// (exact in f32; WGSL's round() is to even). NaN is tested first, by its bits: llvmpipe's
// GL backend compares a NaN as below 2^-14 (a negative NaN then came out as -0), and
// rounding a NaN's mantissa could carry it to inf.
fn round_f16(x: f32) -> f32 {
    if (is_nan_f(x)) {
        return x;
    }
    let a = abs(x);
    if (a >= 65520.0) {
        return bitcast<f32>((bitcast<u32>(x) & 0x80000000u) | 0x7f800000u);
    }
    if (a < 6.103515625e-5) {
        return round(x * 16777216.0) * 5.9604644775390625e-8;
    }
    // Keep 10 of the 23 mantissa bits, rounding on bit 13 (half to even); a carry
    // moves into the exponent as it should.
    let b = bitcast<u32>(x);
    let r = b + 0xfffu + ((b >> 13u) & 1u);
    return bitcast<f32>(r & 0xffffe000u);
}
