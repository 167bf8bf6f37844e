//! Vectorised loops for the CPU backend: [`vectorised`] (a loop compiled for the
//! baseline, AVX2 and AVX-512, and dispatched once per loop), [`map1`] and [`map2`] over it, and branch-free f32
//! `exp`, `tanh` and `erf` that inline into them. The C library's `expf` and `erff` are calls
//! with branches, one element at a time; these vectorise (on SSE2 as on AVX2 and wasm's
//! simd128) and stay within a few ulp of the exact value, which the tests check
//! against the f64 reference.

/// The widest vector instructions this CPU has that the loops are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub enum Simd {
    /// The target's baseline (SSE2 on x86-64, simd128 in wasm).
    Base,
    /// AVX2 and FMA: 8 f32 lanes.
    Avx2,
    /// AVX-512F besides: 16 lanes (on this project's AMD Zen 4 hosts, the 4M
    /// element-wise chain ran about 1.6x faster than with AVX2).
    Avx512,
}

/// This CPU's [`Simd`] level (checked once).
pub fn simd() -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            match (avx2, is_x86_feature_detected!("avx512f")) {
                (true, true) => Simd::Avx512,
                (true, false) => Simd::Avx2,
                _ => Simd::Base,
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    Simd::Base
}

/// `f()` compiled for this CPU's [`simd`] level: a loop in `f` (inlined into the
/// level's twin below) vectorises at that width. Every lane does the same operations
/// at every width, so the same bits.
#[inline(always)]
pub fn vectorised<R>(f: impl FnOnce() -> R) -> R {
    at_level(simd(), f)
}

/// [`vectorised`] at `level`, which must be at most [`simd`]'s.
#[inline(always)]
fn at_level<R>(level: Simd, f: impl FnOnce() -> R) -> R {
    debug_assert!(level <= simd());
    // SAFETY: the CPU has the level's features ([`simd`] found them; callers pass no
    // higher level).
    #[cfg(target_arch = "x86_64")]
    match level {
        Simd::Avx512 => return unsafe { run_avx512(f) },
        Simd::Avx2 => return unsafe { run_avx2(f) },
        Simd::Base => {}
    }
    let _ = level;
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn run_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `f(x)` for every element, in place, [`vectorised`].
#[inline(always)]
pub fn map1<T: Copy>(v: &mut [T], f: impl Fn(T) -> T) {
    map1_at(simd(), v, f)
}

#[inline(always)]
fn map1_at<T: Copy>(level: Simd, v: &mut [T], f: impl Fn(T) -> T) {
    at_level(level, || v.iter_mut().for_each(|x| *x = f(*x)))
}

/// [`map1`] as a plain loop inlined into the level's `run_*`. For `tanh`, `erf` and
/// GELU, whose bodies are long (`erf`'s was until its rational fit), `for_each` stayed
/// out of line and ran at the baseline's width: `bench elementwise-ops --devices cpu`
/// (AVX-512 host), GELU over 4M f32 10.5 against 4.3 ms, and the chain
/// `relu(tanh(exp(x*2+1))*x)` 11.5 against 4.6 once `exp` grew its subnormal path. Shorter bodies vectorise better through
/// `for_each` (`x*2+1` 1.05 against 2.08 ms), so only those take this. Pass `f` as an
/// `#[inline(always)]` closure (see [`gelu_erf`]).
#[inline(always)]
pub fn map1_inlined<T: Copy>(v: &mut [T], f: impl Fn(T) -> T) {
    map1_inlined_at(simd(), v, f)
}

#[inline(always)]
fn map1_inlined_at<T: Copy>(level: Simd, v: &mut [T], f: impl Fn(T) -> T) {
    at_level(
        level,
        #[inline(always)]
        || {
            for x in v.iter_mut() {
                *x = f(*x);
            }
        },
    )
}

/// `a[i] = f(a[i], b[i])`, in place, [`vectorised`].
#[inline(always)]
pub fn map2<T: Copy>(a: &mut [T], b: &[T], f: impl Fn(T, T) -> T) {
    map2_at(simd(), a, b, f)
}

#[inline(always)]
fn map2_at<T: Copy>(level: Simd, a: &mut [T], b: &[T], f: impl Fn(T, T) -> T) {
    at_level(level, || a.iter_mut().zip(b).for_each(|(x, &y)| *x = f(*x, y)))
}

/// 1.5 · 2^23: adding and subtracting it rounds an f32 to the nearest integer.
const ROUND: f32 = 12_582_912.0;

/// 2^23: the subnormals' count of 2^-149 steps; added to a value below it, the sum's low
/// mantissa bits are the value rounded to an integer.
const SUBNORMAL_ULPS: f32 = 8_388_608.0;

/// `v`, an integer from 0 to 2^22, as one: read out of the mantissa of `v + ROUND`
/// rather than by an integer conversion, which saturates and keeps loops scalar.
#[inline(always)]
fn integral_bits(v: f32) -> u32 {
    (v + ROUND).to_bits().wrapping_sub(ROUND.to_bits())
}

/// `2^e` for an integral `e` from -126 to 127, built from its exponent bits.
#[inline(always)]
fn pow2(e: f32) -> f32 {
    f32::from_bits(integral_bits(e + 127.0) << 23)
}

/// `(y, n)` with `e^x = y · 2^n`: Cody–Waite reduction `x = n·ln 2 + r` and Cephes'
/// degree-6 polynomial on `r`, for `x` within [`exp`]'s clamp.
#[inline(always)]
fn exp_parts(x: f32) -> (f32, f32) {
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p =
        ((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 0.166_666_65) * r + 0.5;
    (p * (r * r) + r + 1.0, n)
}

/// `e^x`: Cody–Waite reduction `x = n·ln 2 + r` and Cephes' degree-6 polynomial on `r`,
/// scaled by `2^n` in two halves so that results above `2^127` come out infinite, and
/// results below `2^-126` (subnormal) come out right without a multiply that makes a
/// subnormal: x86 cores run those through a microcode assist, and exp over values below
/// -87.3 (a masked softmax's entries, say) took 4x as long as over -20 to -10. NaN stays
/// NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // Beyond these the result is 0 or infinity whatever the rounding.
    let (y, n) = exp_parts(x.clamp(-104.0, 89.0));
    if cfg!(target_arch = "wasm32") {
        // The same bits by two multiplies (2^h · 2^(n-h)), subnormal ones included: the
        // npm package's size budget leaves no room for the path below, inlined in every
        // loop that calls exp.
        let h = (n * 0.5 + ROUND) - ROUND;
        let v = y * pow2(h) * pow2(n - h);
        return if x.is_nan() { x } else { v };
    }
    // One exponent field holds n from -125 to 127: past the top (n = 128) a factor 2
    // follows, and n = -126 with y >= 1 (a normal result) takes 2^-125 then a half, so
    // no lane's product is subnormal.
    let (low, high) = (n < -125.0, n > 127.0);
    let nv = if low {
        -125.0
    } else if high {
        127.0
    } else {
        n
    };
    let scale = if high {
        2.0
    } else if low & (y >= 1.0) {
        0.5
    } else {
        1.0
    };
    let normal = y * pow2(nv) * scale;
    // A subnormal result (n <= -126) is q · 2^-149 with q = y · 2^(n+149) below 2^23: q
    // rounded to an integer (ties to even, as the multiply would round) is its bit
    // pattern.
    let q = y * pow2(if low { n } else { -126.0 } + 149.0);
    let sub = f32::from_bits((q + SUBNORMAL_ULPS).to_bits().wrapping_sub(SUBNORMAL_ULPS.to_bits()));
    let v = if low & (q < SUBNORMAL_ULPS) { sub } else { normal };
    // NaN in, NaN out (the clamp above turned it into a number).
    if x.is_nan() {
        x
    } else {
        v
    }
}

/// `tanh(x)`: Cephes' odd polynomial for `|x| < 0.625` and `1 - 2 / (e^(2|x|) + 1)`
/// beyond (with [`exp`], which saturates, so large |x| gives exactly ±1), both computed
/// and one selected so the loop vectorises. NaN stays NaN.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let s = x * x;
    // x · (1 + s·P(s)) rather than x + x·s·P(s): the same rounding, and -0 stays -0.
    let p = (((-5.704_988_7e-3 * s + 2.063_909e-2) * s - 5.373_971_6e-2) * s + 0.133_314_42) * s - 0.333_332_8;
    let small = x * (1.0 + s * p);
    // Past 9.02 tanh rounds to 1, so e^(2|x|) is taken over [0, 19] only, where
    // [`exp`]'s steps give its bits without its overflow and subnormal cases (4M f32:
    // tanh 2.7 -> 2.2 ms, the chain `relu(tanh(exp(x*2+1))*x)` 4.8 -> 4.3). NaN stays.
    let (y, n) = exp_parts(2.0 * if a > 9.5 { 9.5 } else { a });
    let large = (1.0 - 2.0 / (y * pow2(n) + 1.0)).copysign(x);
    if a < 0.625 {
        small
    } else {
        large
    }
}

/// `ln(x)`: `x = m · 2^e` with `m` in [√½, √2) read from the bits (subnormals scaled
/// by 2^23 first), Cephes' degree-9 polynomial on `m - 1`, and `e · ln 2` added in two
/// parts; every case computed and selected, so the loop vectorises where the C
/// library's `logf` is a call per element (`log(|x|+1)` over 4M f32: 8.7 -> 2.7 ms).
/// 0 gives -inf, a negative number NaN, +inf +inf, NaN NaN.
#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    let tiny = x < f32::MIN_POSITIVE;
    let bits = (if tiny { x * 8_388_608.0 } else { x }).to_bits();
    // The exponent for a mantissa in [0.5, 1), and the mantissa.
    let e = ((bits >> 23) & 0xff) as i32 - 126 - if tiny { 23 } else { 0 };
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let low = m < std::f32::consts::FRAC_1_SQRT_2;
    let f = if low { m + m - 1.0 } else { m - 1.0 };
    let e = (e - i32::from(low)) as f32;
    let z = f * f;
    let p = ((((((((7.037_683_6e-2 * f - 1.151_461e-1) * f + 1.167_699_9e-1) * f - 1.242_014_1e-1) * f
        + 1.424_932_3e-1)
        * f
        - 1.666_805_8e-1)
        * f
        + 2.000_071_4e-1)
        * f
        - 2.499_999_4e-1)
        * f
        + 3.333_333e-1)
        * f
        * z;
    let y = f + (p + e * -2.121_944_4e-4 - 0.5 * z) + e * 0.693_359_4;
    if x == 0.0 {
        f32::NEG_INFINITY
    } else if x < 0.0 || x.is_nan() {
        f32::NAN
    } else if x == f32::INFINITY {
        x
    } else {
        y
    }
}

/// `sin(x)` (`cos` false) or `cos(x)` for |x| up to [`SIN_COS_MAX`]: Cephes' `sinf` and
/// `cosf`, x reduced by multiples of π/4 in three parts and one of two polynomials
/// selected by the octant, every case computed so the loop vectorises where the C
/// library's is a call per element (4M f32: 7.5 -> 2.2 ms). Within 1.2e-7 of the exact
/// value (relative, or absolute below 1/16). Past the bound, and for inf and NaN,
/// callers take the library's ([`sin_cos_in_place`]).
#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
pub fn sin_cos(x: f32, cos: bool) -> f32 {
    let a = x.abs();
    // The octant, floor(|x| · 4/π), by rounding through ROUND and then from the bits.
    let t = a * 1.273_239_5;
    let n = (t + ROUND) - ROUND;
    let mut j = integral_bits(if n > t { n - 1.0 } else { n }) as i32;
    // Odd octants move to the next one, so that the reduced argument is within ±π/4.
    j = j.wrapping_add(j & 1);
    let y = j as f32;
    let r = ((a - y * 0.785_156_25) - y * 2.418_756_5e-4) - y * 3.774_895e-8;
    let z = r * r;
    let q = j & 7;
    let (flip, poly_cos) =
        if cos { (q == 2 || q == 4, q == 0 || q == 4) } else { ((q >= 4) != x.is_sign_negative(), q == 2 || q == 6) };
    let pc = ((2.443_315_7e-5 * z - 1.388_731_6e-3) * z + 4.166_664_6e-2) * z * z - 0.5 * z + 1.0;
    let ps = ((-1.951_529_6e-4 * z + 8.332_161e-3) * z - 1.666_665_5e-1) * z * r + r;
    let v = if poly_cos { pc } else { ps };
    if flip {
        -v
    } else {
        v
    }
}

/// Arguments past which [`sin_cos`] loses accuracy (its reduction keeps about 24 + 8
/// bits of π/4).
#[cfg(not(target_arch = "wasm32"))]
pub const SIN_COS_MAX: f32 = 8192.0;

/// `v[i] = sin(v[i])` (or cos) for every element, vectorised, with the C library's for
/// the rare arguments past [`SIN_COS_MAX`], inf and NaN.
#[cfg(not(target_arch = "wasm32"))]
pub fn sin_cos_in_place(v: &mut [f32], cos: bool) {
    // Past the bound, inf or NaN: one comparison, which NaN fails, in a loop with no
    // early exit (both keep the scan vectorised).
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    let far = |x: f32| !(x.abs() <= SIN_COS_MAX);
    let far: Vec<(usize, f32)> = if v.iter().fold(false, |f, &x| f | far(x)) {
        v.iter().enumerate().filter(|(_, &x)| far(x)).map(|(i, &x)| (i, x)).collect()
    } else {
        Vec::new()
    };
    // One loop per function: a flag read inside the loop kept it scalar.
    if cos {
        map1_inlined(
            v,
            #[inline(always)]
            |x| sin_cos(x, true),
        );
    } else {
        map1_inlined(
            v,
            #[inline(always)]
            |x| sin_cos(x, false),
        );
    }
    for (i, x) in far {
        v[i] = if cos { x.cos() } else { x.sin() };
    }
}

/// Values `start .. start + out.len()` of `Tensor::rand` (`normal` false: uniform in
/// [0, 1), the reference's bits) or `Tensor::randn` (Box–Muller in f32 as the WGSL
/// kernel computes it, through [`ln`] and [`sin_cos`]), [`vectorised`], where the
/// reference takes each value through f64 and the C library's `log` and `cos`.
#[cfg(not(target_arch = "wasm32"))]
pub fn rand_into(out: &mut [f32], seed: u64, normal: bool, start: usize) {
    rand_into_at(simd(), out, seed, normal, start)
}

#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
fn rand_into_at(level: Simd, out: &mut [f32], seed: u64, normal: bool, start: usize) {
    #[inline(always)]
    fn uniform(i: u32, (lo, hi): (u32, u32), stream: u32) -> f32 {
        crate::reference::elementwise::uniform_bits(i, lo, hi, stream) as f32 * (1.0 / 16_777_216.0)
    }
    let key = (seed as u32, (seed >> 32) as u32);
    // One loop per form: a flag read inside the loop kept `sin_cos` scalar.
    if normal {
        at_level(
            level,
            #[inline(always)]
            || {
                for (k, x) in out.iter_mut().enumerate() {
                    let i = start.wrapping_add(k) as u32;
                    let (u1, u2) = (uniform(i, key, 1), uniform(i, key, 2));
                    *x = (-2.0 * ln(1.0 - u1)).sqrt() * sin_cos(std::f32::consts::TAU * u2, true);
                }
            },
        )
    } else {
        at_level(
            level,
            #[inline(always)]
            || {
                for (k, x) in out.iter_mut().enumerate() {
                    *x = uniform(start.wrapping_add(k) as u32, key, 0);
                }
            },
        )
    }
}

/// `erf(x)`: x · P(x²) / Q(x²) over x held to [-4, 4] (past 4, erf rounds to ±1 in
/// f32), the rational fit Eigen and XLA use for f32 (relative error below 4e-7): one
/// division and twelve multiply-adds, no branch and no `exp`. GELU over a product's
/// outputs runs it on every element.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    // NaN stays NaN through the clamp.
    let x = x.clamp(-4.0, 4.0);
    let s = x * x;
    let p = (((((-2.726_142_3e-10 * s + 2.770_681_4e-8) * s - 2.101_024e-6) * s - 5.692_506_4e-5) * s
        - 7.349_906_3e-4)
        * s
        - 2.954_6e-3)
        * s
        - 1.609_603_3e-2;
    let q = (((-1.456_607_15e-5 * s - 2.133_740_5e-4) * s - 1.682_827e-3) * s - 7.373_329_2e-3) * s - 1.426_473_9e-2;
    x * p / q
}

/// GELU by `erf`: `x/2 · (1 + erf(x/√2))`. Callers pass it to [`map1_inlined`] in an
/// `#[inline(always)]` closure: a function item goes through its `Fn::call` shim, which
/// LLVM left out of line (scalar, 10x slower) once `erf` and `exp` grew.
#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_and_erf_are_within_a_few_ulp() {
        let mut worst = (0.0f64, 0.0f64);
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-3;
            // Relative error where the result is a normal f32.
            let e =
                if x.abs() < 87.0 { (super::exp(x) as f64 - (x as f64).exp()).abs() / (x as f64).exp() } else { 0.0 };
            let want = libm::erf(x as f64);
            let r = (super::erf(x) as f64 - want).abs() / want.abs().max(1e-30);
            worst = (worst.0.max(e), worst.1.max(r));
        }
        assert!(worst.0 < 4e-7 && worst.1 < 4e-7, "relative errors: exp {:e}, erf {:e}", worst.0, worst.1);
        assert_eq!(super::exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(super::exp(100.0), f32::INFINITY);
        assert_eq!(super::exp(f32::NEG_INFINITY), 0.0);
        assert!(super::exp(-100.0) > 0.0 && super::exp(-100.0) < 1e-43, "subnormal results stay");
        assert!(super::exp(f32::NAN).is_nan() && super::erf(f32::NAN).is_nan());
        assert_eq!((super::erf(10.0), super::erf(-10.0), super::erf(0.0)), (1.0, -1.0, 0.0));
        assert!((super::erf(1e-6) - 1.128_379_2e-6).abs() < 1e-12);
    }

    #[test]
    fn subnormal_exp_results_are_the_multiplys() {
        // Every f32 from -104 to -86: the subnormal results built from their bits equal
        // `y · 2^h · 2^(n-h)` rounded by the multiply, as exp computed them before.
        let by_multiplies = |x: f32| {
            let n = (x * std::f32::consts::LOG2_E + super::ROUND) - super::ROUND;
            let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
            let p = ((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 0.166_666_65)
                * r
                + 0.5;
            let y = p * (r * r) + r + 1.0;
            let h = (n * 0.5 + super::ROUND) - super::ROUND;
            let pow = |e: f32| f32::from_bits(((e + 127.0) as u32) << 23);
            y * pow(h) * pow(n - h)
        };
        let (lo, hi) = ((-104.0f32).to_bits(), (-86.0f32).to_bits());
        let mut subnormals = 0;
        for b in (hi..=lo).step_by(3) {
            let x = f32::from_bits(b);
            let (got, want) = (super::exp(x), by_multiplies(x));
            assert_eq!(got.to_bits(), want.to_bits(), "exp({x:e}): {got:e} against {want:e}");
            subnormals += usize::from(got != 0.0 && !got.is_normal());
        }
        assert!(subnormals > 100_000, "{subnormals} subnormal results checked");
    }

    #[test]
    #[cfg(not(target_arch = "wasm32"))]
    fn ln_is_within_a_few_ulp() {
        // Every 97th f32 from the smallest subnormal to the largest finite one.
        let mut worst = 0.0f64;
        for b in (1u32..0x7f80_0000).step_by(97) {
            let x = f32::from_bits(b);
            let want = (x as f64).ln();
            worst = worst.max((super::ln(x) as f64 - want).abs() / want.abs().max(1e-30));
        }
        assert!(worst < 4e-7, "relative error of ln {worst:e}");
        assert_eq!((super::ln(0.0), super::ln(-0.0), super::ln(1.0)), (f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0));
        assert_eq!(super::ln(f32::INFINITY), f32::INFINITY);
        assert!(super::ln(-1.0).is_nan() && super::ln(f32::NEG_INFINITY).is_nan() && super::ln(f32::NAN).is_nan());
        assert!((super::ln(f32::from_bits(1)) - (-103.278_93)).abs() < 1e-4, "the smallest subnormal");
    }

    #[test]
    #[cfg(not(target_arch = "wasm32"))]
    fn sin_and_cos_are_within_a_few_ulp() {
        let mut worst = 0.0f64;
        for i in -400_000..=400_000 {
            // Up to about ±8000, the bound's order.
            let x = i as f32 * 2e-5 * (1.0 + (i as f32 * 2.5e-3).abs());
            if x.abs() > super::SIN_COS_MAX {
                continue;
            }
            for (cos, want) in [(false, (x as f64).sin()), (true, (x as f64).cos())] {
                let got = super::sin_cos(x, cos) as f64;
                // Relative to the result, or to 1 where it is small (near a root).
                worst = worst.max((got - want).abs() / want.abs().max(1.0 / 16.0));
            }
        }
        assert!(worst < 4e-7, "error of sin/cos {worst:e}");
        let mut v = vec![0.0f32, -0.0, 1e-30, -1e-30, 1e6, -3e7, f32::INFINITY, f32::NAN, 8192.0, -8193.0];
        let x = v.clone();
        super::sin_cos_in_place(&mut v, false);
        for (got, x) in v.iter().zip(&x) {
            let want = x.sin();
            assert!(got.to_bits() == want.to_bits() || (got - want).abs() < 1e-6, "sin({x}): {got} against {want}");
        }
        assert!(v[1].is_sign_negative() && v[3] == -1e-30 && v[6].is_nan() && v[7].is_nan());
    }

    #[test]
    #[cfg(not(target_arch = "wasm32"))]
    fn rand_and_randn_follow_the_reference() {
        use crate::reference::elementwise::rand_at;
        // Seeds with both halves set, and ranges that start past 0 (a chunk's).
        for (seed, start) in [(7u64, 0usize), (0x0123_4567_89ab_cdef, 1_000_003)] {
            let mut u = vec![0f32; 200_000];
            super::rand_into(&mut u, seed, false, start);
            for (k, &x) in u.iter().enumerate() {
                assert_eq!(x as f64, rand_at(seed, false, start + k), "uniform {k}: the reference's bits");
            }
            let mut v = vec![0f32; 200_000];
            super::rand_into(&mut v, seed, true, start);
            let worst = v
                .iter()
                .enumerate()
                .map(|(k, &x)| (x as f64 - rand_at(seed, true, start + k)).abs())
                .fold(0.0, f64::max);
            // f32's 2π·u2 is off by up to half an ulp of 2π (2.4e-7), times a radius up to
            // sqrt(-2 ln 2^-24) = 5.8: what the WGSL kernel's f32 gives too.
            assert!(worst < 2e-6, "normal values {worst:e} from the f64 reference");
        }
    }

    #[test]
    fn tanh_is_within_a_few_ulp() {
        let mut worst = 0.0f64;
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-4 * (1.0 + (i as f32 * 1e-5).abs());
            let want = (x as f64).tanh();
            let r = (super::tanh(x) as f64 - want).abs() / want.abs().max(1e-30);
            worst = worst.max(r);
        }
        assert!(worst < 4e-7, "relative error of tanh {worst:e}");
        // From 0.625 on, the bits of `1 - 2 / (exp(2|x|) + 1)` with the general exp.
        for i in 0..200_000 {
            let x = 0.625 + i as f32 * 1e-4;
            for x in [x, -x] {
                let want = (1.0 - 2.0 / (super::exp(2.0 * x.abs()) + 1.0)).copysign(x);
                assert_eq!(super::tanh(x).to_bits(), want.to_bits(), "tanh({x})");
            }
        }
        assert_eq!((super::tanh(f32::INFINITY), super::tanh(-100.0), super::tanh(0.0)), (1.0, -1.0, 0.0));
        assert!(super::tanh(f32::NAN).is_nan());
        assert_eq!(super::tanh(1e-30), 1e-30);
        assert!(super::tanh(-0.0).is_sign_negative());
    }
}

#[cfg(test)]
mod levels {
    use super::*;

    #[test]
    #[allow(clippy::redundant_closure)]
    fn every_simd_level_gives_the_same_bits() {
        // Inputs across the functions' ranges, with the special values.
        let mut x: Vec<f32> = (-40_000..40_000).map(|i| i as f32 * 2.5e-3 * (1.0 + (i as f32 * 1e-4).abs())).collect();
        x.extend([0.0, -0.0, 1e-30, -1e-30, 88.7, -103.9, 1e6, -1e6, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        let y: Vec<f32> = x.iter().rev().copied().collect();
        let levels: Vec<Simd> = [Simd::Base, Simd::Avx2, Simd::Avx512].into_iter().filter(|&l| l <= simd()).collect();
        println!("SIMD levels compared on this CPU: {levels:?}");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
        let run = |level: Simd| {
            let mut outs = Vec::new();
            for f in [exp as fn(f32) -> f32, tanh, erf, |x: f32| x * 2.0 + 1.0] {
                let mut v = x.clone();
                map1_at(level, &mut v, f);
                outs.push(bits(&v));
            }
            // The long functions as `unary` passes them: `#[inline(always)]` closures,
            // inlined at the level's width.
            macro_rules! inlined {
                ($f:expr) => {{
                    let mut v = x.clone();
                    map1_inlined_at(
                        level,
                        &mut v,
                        #[inline(always)]
                        |x| $f(x),
                    );
                    outs.push(bits(&v));
                }};
            }
            inlined!(tanh);
            inlined!(erf);
            inlined!(gelu_erf);
            #[cfg(not(target_arch = "wasm32"))]
            inlined!(ln);
            #[cfg(not(target_arch = "wasm32"))]
            inlined!(|x| sin_cos(x, false));
            #[cfg(not(target_arch = "wasm32"))]
            inlined!(|x| sin_cos(x, true));
            let mut v = x.clone();
            map2_at(level, &mut v, &y, |a, b| a * exp(b) - tanh(a) / b);
            outs.push(bits(&v));
            #[cfg(not(target_arch = "wasm32"))]
            for normal in [false, true] {
                rand_into_at(level, &mut v, 0x1234_5678_9abc_def0, normal, 77);
                outs.push(bits(&v));
            }
            outs
        };
        let base = run(Simd::Base);
        for &l in &levels[1..] {
            assert!(run(l) == base, "{l:?} differs from the baseline loop");
        }
    }
}
