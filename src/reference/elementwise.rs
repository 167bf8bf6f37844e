//! Element-wise reference ops. Integer ops wrap like 32-bit hardware; integer division
//! truncates, and dividing by zero returns the dividend (WGSL's rule).

use crate::graph::{BinaryOp, UnaryOp};
use crate::DType;

fn b(v: bool) -> f64 {
    if v {
        1.0
    } else {
        0.0
    }
}

/// One unary op on an exact value.
pub fn unary(u: UnaryOp, x: f64, dt: DType) -> f64 {
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    match u {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sig(x),
        UnaryOp::Relu if dt.is_float() => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Erf => libm::erf(x),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
        UnaryOp::Silu => x * sig(x),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Not => b(x == 0.0),
    }
}

fn int_div(x: i64, y: i64) -> i64 {
    if y == 0 {
        x
    } else {
        x.wrapping_div(y)
    }
}

/// One binary op; `dt` is the inputs' dtype.
pub fn binary(op: BinaryOp, x: f64, y: f64, dt: DType) -> f64 {
    let nan_either = x.is_nan() || y.is_nan();
    match op {
        BinaryOp::Add if dt.is_int() => (x as i64).wrapping_add(y as i64) as f64,
        BinaryOp::Sub if dt.is_int() => (x as i64).wrapping_sub(y as i64) as f64,
        BinaryOp::Mul if dt.is_int() => {
            let p = (x as i64).wrapping_mul(y as i64);
            if dt == DType::I32 {
                p as i32 as f64
            } else {
                p as u32 as f64
            }
        }
        BinaryOp::Div if dt == DType::I32 => int_div(x as i64, y as i64) as i32 as f64,
        BinaryOp::Div if dt == DType::U32 => int_div(x as i64, y as i64) as u32 as f64,
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Maximum if nan_either => f64::NAN,
        BinaryOp::Minimum if nan_either => f64::NAN,
        BinaryOp::Maximum => x.max(y),
        BinaryOp::Minimum => x.min(y),
        BinaryOp::Pow => x.powf(y),
        BinaryOp::Eq => b(x == y),
        BinaryOp::Ne => b(x != y),
        BinaryOp::Lt => b(x < y),
        BinaryOp::Le => b(x <= y),
        BinaryOp::Gt => b(x > y),
        BinaryOp::Ge => b(x >= y),
        BinaryOp::And => b(x != 0.0 && y != 0.0),
        BinaryOp::Or => b(x != 0.0 || y != 0.0),
    }
}

/// Conversion between dtypes: floats to integers truncate and saturate (NaN to 0);
/// integers to integers wrap (two's complement reinterpretation); anything to bool is
/// `!= 0`.
///
/// Float-to-integer conversion saturates at the largest *f32* value inside the integer
/// range (2^31 - 128 and 2^32 - 256), as WGSL specifies.
pub fn cast(x: f64, from: DType, to: DType) -> f64 {
    match to {
        DType::I32 if from.is_float() => (x as i32 as f64).min(2_147_483_520.0),
        DType::U32 if from.is_float() => (x as u32 as f64).min(4_294_967_040.0),
        _ => to.round(x),
    }
}

/// The PCG output permutation used by the counter-based RNG (same as `shaders/common.wgsl`).
// (Inlined into the CPU backend's vectorised loop; the npm package keeps its size.)
#[cfg_attr(not(target_arch = "wasm32"), inline(always))]
pub fn pcg_hash(v: u32) -> u32 {
    let s = v.wrapping_mul(747796405).wrapping_add(2891336453);
    let w = ((s >> ((s >> 28) + 4)) ^ s).wrapping_mul(277803737);
    (w >> 22) ^ w
}

fn uniform(i: u32, lo: u32, hi: u32, stream: u32) -> f64 {
    uniform_bits(i, lo, hi, stream) as f64 / 16_777_216.0
}

/// The 24 random bits of value `i` of stream `stream` under the seed `(lo, hi)`: the
/// uniform value is them over 2^24. (Inlined into the CPU backend's vectorised loop.)
#[cfg_attr(not(target_arch = "wasm32"), inline(always))]
pub fn uniform_bits(i: u32, lo: u32, hi: u32, stream: u32) -> u32 {
    pcg_hash(pcg_hash(i ^ lo) ^ hi ^ stream.wrapping_mul(0x9e37_79b9)) >> 8
}

/// `n` seeded uniform [0, 1) or standard normal values.
pub fn rand(seed: u64, normal: bool, n: usize) -> Vec<f64> {
    (0..n).map(|i| rand_at(seed, normal, i)).collect()
}

/// Element `i` of [`rand`]: the generator is counter-based, so any element can be
/// computed on its own.
pub fn rand_at(seed: u64, normal: bool, i: usize) -> f64 {
    let (lo, hi) = (seed as u32, (seed >> 32) as u32);
    let i = i as u32;
    if normal {
        let u1 = uniform(i, lo, hi, 1) as f32 as f64;
        let u2 = uniform(i, lo, hi, 2) as f32 as f64;
        (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    } else {
        uniform(i, lo, hi, 0)
    }
}
