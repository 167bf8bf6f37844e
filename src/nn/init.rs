//! Parameter initialisers, seeded so a model starts the same on every device.

use crate::{Device, Tensor};

/// Uniform in `[-bound, bound)`.
pub fn uniform(shape: &[usize], bound: f64, seed: u64, dev: &Device) -> Tensor {
    Tensor::rand(shape.to_vec(), seed, dev).mul_scalar(2.0 * bound).sub_scalar(bound)
}

/// Normal with mean 0 and standard deviation `std`.
pub fn normal(shape: &[usize], std: f64, seed: u64, dev: &Device) -> Tensor {
    Tensor::randn(shape.to_vec(), seed, dev).mul_scalar(std)
}

/// `(fan_in, fan_out)` of a weight `[out, in, ...]` (receptive field included).
pub fn fans(shape: &[usize]) -> (usize, usize) {
    let field: usize = shape.iter().skip(2).product();
    let fan_in = shape.get(1).copied().unwrap_or(1) * field;
    let fan_out = shape.first().copied().unwrap_or(1) * field;
    (fan_in.max(1), fan_out.max(1))
}

/// Kaiming (He) uniform for ReLU networks: bound `sqrt(6 / fan_in)`.
pub fn kaiming_uniform(shape: &[usize], seed: u64, dev: &Device) -> Tensor {
    let (fan_in, _) = fans(shape);
    uniform(shape, (6.0 / fan_in as f64).sqrt(), seed, dev)
}

/// Kaiming (He) normal: std `sqrt(2 / fan_in)`.
pub fn kaiming_normal(shape: &[usize], seed: u64, dev: &Device) -> Tensor {
    let (fan_in, _) = fans(shape);
    normal(shape, (2.0 / fan_in as f64).sqrt(), seed, dev)
}

/// Xavier (Glorot) uniform: bound `sqrt(6 / (fan_in + fan_out))`.
pub fn xavier_uniform(shape: &[usize], seed: u64, dev: &Device) -> Tensor {
    let (fan_in, fan_out) = fans(shape);
    uniform(shape, (6.0 / (fan_in + fan_out) as f64).sqrt(), seed, dev)
}

/// PyTorch's default for Linear and Conv2d weights and biases: uniform with bound
/// `1 / sqrt(fan_in)`.
pub fn torch_default(shape: &[usize], fan_in: usize, seed: u64, dev: &Device) -> Tensor {
    uniform(shape, 1.0 / (fan_in.max(1) as f64).sqrt(), seed, dev)
}
