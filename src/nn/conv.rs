//! Convolution, pooling and batch normalisation layers.

use super::{init, Layer, Module, Role, Visitor, VisitorMut};
use crate::ops::nn::Conv2dOptions;
use crate::{no_grad, DType, Device, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// 2-D convolution over `[N, C, H, W]` with weight `[O, C/groups, KH, KW]`, or, once
/// quantised ([`crate::quant::quantize_conv`]), a Q8_0/Q4_0 weight matrix `[O, Kp]`
/// read by the im2col product ([`Tensor::conv2d_quantized`]).
#[derive(Clone, Debug, Module)]
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub options: Conv2dOptions,
    /// The window `(KH, KW)` (the weight matrix of a quantised layer no longer shows it).
    pub kernel: (usize, usize),
}

impl Conv2d {
    /// A trainable `k x k` convolution with PyTorch's default initialisation.
    pub fn new(in_ch: usize, out_ch: usize, k: usize, options: Conv2dOptions, seed: u64, dev: &Device) -> Conv2d {
        let g = options.groups.max(1);
        let fan_in = in_ch / g * k * k;
        let weight = init::torch_default(&[out_ch, in_ch / g, k, k], fan_in, seed, dev).requires_grad();
        let bias = Some(init::torch_default(&[out_ch], fan_in, seed ^ 0xb1a5, dev).requires_grad());
        Conv2d { weight, bias, options, kernel: (k, k) }
    }
}

impl Layer for Conv2d {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        if self.weight.rank() == 2 {
            return x.conv2d_quantized(&self.weight, self.kernel, self.bias.as_ref(), self.options);
        }
        x.conv2d(&self.weight, self.bias.as_ref(), self.options)
    }
}

/// 2-D transposed convolution over `[N, C, H, W]` with weight `[C, O/groups, KH, KW]`
/// (PyTorch's `ConvTranspose2d`): the upsampling adjoint of [`Conv2d`].
#[derive(Clone, Debug, Module)]
pub struct ConvTranspose2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub options: Conv2dOptions,
    /// Extra rows and columns on one side of the output (each below the stride).
    pub output_padding: (usize, usize),
}

impl ConvTranspose2d {
    /// A trainable `k x k` transposed convolution with PyTorch's default initialisation
    /// (fan-in taken over the weight's second axis and window, as PyTorch does).
    pub fn new(in_ch: usize, out_ch: usize, k: usize, options: Conv2dOptions, seed: u64, dev: &Device) -> Self {
        let g = options.groups.max(1);
        let fan_in = out_ch / g * k * k;
        let weight = init::torch_default(&[in_ch, out_ch / g, k, k], fan_in, seed, dev).requires_grad();
        let bias = Some(init::torch_default(&[out_ch], fan_in, seed ^ 0xb1a5, dev).requires_grad());
        ConvTranspose2d { weight, bias, options, output_padding: (0, 0) }
    }
}

impl Layer for ConvTranspose2d {
    fn forward(&self, x: &Tensor) -> Tensor {
        x.conv_transpose2d(&self.weight, self.bias.as_ref(), self.options, self.output_padding)
    }
}

/// Max pooling with a square window.
#[derive(Clone, Copy, Debug, Module)]
pub struct MaxPool2d {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

impl MaxPool2d {
    /// Window `k`, stride `k`, no padding.
    pub fn new(k: usize) -> MaxPool2d {
        MaxPool2d { kernel: k, stride: k, padding: 0 }
    }
}

impl Layer for MaxPool2d {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.max_pool2d(self.kernel, self.stride, self.padding)
    }
}

/// Average pooling with a square window.
#[derive(Clone, Copy, Debug, Module)]
pub struct AvgPool2d {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

impl AvgPool2d {
    /// Window `k`, stride `k`, no padding.
    pub fn new(k: usize) -> AvgPool2d {
        AvgPool2d { kernel: k, stride: k, padding: 0 }
    }
}

impl Layer for AvgPool2d {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.avg_pool2d(self.kernel, self.stride, self.padding)
    }
}

/// Batch normalisation over `[N, C, H, W]` per channel. In training it normalises with
/// the batch statistics and updates the running ones (buffers); in evaluation it uses
/// the running ones.
#[derive(Debug)]
pub struct BatchNorm2d {
    pub weight: Tensor,
    pub bias: Tensor,
    pub running_mean: Mutex<Tensor>,
    pub running_var: Mutex<Tensor>,
    pub momentum: f64,
    pub eps: f64,
    training: AtomicBool,
}

impl BatchNorm2d {
    /// Over `channels`, momentum 0.1 and eps 1e-5 as PyTorch.
    pub fn new(channels: usize, dev: &Device) -> BatchNorm2d {
        BatchNorm2d {
            weight: Tensor::ones([channels], DType::F32, dev).requires_grad(),
            bias: Tensor::zeros([channels], DType::F32, dev).requires_grad(),
            running_mean: Mutex::new(Tensor::zeros([channels], DType::F32, dev)),
            running_var: Mutex::new(Tensor::ones([channels], DType::F32, dev)),
            momentum: 0.1,
            eps: 1e-5,
            training: AtomicBool::new(true),
        }
    }
}

impl Module for BatchNorm2d {
    fn visit(&self, v: &mut dyn Visitor) {
        v.tensor("weight", &self.weight, Role::Parameter);
        v.tensor("bias", &self.bias, Role::Parameter);
        v.tensor("running_mean", &self.running_mean.lock().unwrap_or_else(|e| e.into_inner()), Role::Buffer);
        v.tensor("running_var", &self.running_var.lock().unwrap_or_else(|e| e.into_inner()), Role::Buffer);
    }

    fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>) {
        v.tensor("weight", &mut self.weight, Role::Parameter);
        v.tensor("bias", &mut self.bias, Role::Parameter);
        v.tensor("running_mean", self.running_mean.get_mut().unwrap_or_else(|e| e.into_inner()), Role::Buffer);
        v.tensor("running_var", self.running_var.get_mut().unwrap_or_else(|e| e.into_inner()), Role::Buffer);
    }

    fn set_training(&mut self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
    }
}

impl Layer for BatchNorm2d {
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let c = self.weight.numel();
        let shape = vec![1, c, 1, 1];
        let (mean, var) = if self.training.load(Ordering::Relaxed) {
            let mean = x.mean(&[0, 2, 3], true);
            let var = x.sub(&mean).square().mean(&[0, 2, 3], true);
            let n = (x.numel() / c.max(1)) as f64;
            let _g = no_grad();
            let m = self.momentum;
            let mut rm = self.running_mean.lock().unwrap_or_else(|e| e.into_inner());
            *rm = rm.mul_scalar(1.0 - m).add(&mean.detach().reshape(vec![c]).mul_scalar(m));
            let mut rv = self.running_var.lock().unwrap_or_else(|e| e.into_inner());
            let unbiased = var.detach().reshape(vec![c]).mul_scalar(n / (n - 1.0).max(1.0));
            *rv = rv.mul_scalar(1.0 - m).add(&unbiased.mul_scalar(m));
            (mean, var)
        } else {
            let rm = self.running_mean.lock().unwrap_or_else(|e| e.into_inner()).reshape(shape.clone());
            let rv = self.running_var.lock().unwrap_or_else(|e| e.into_inner()).reshape(shape.clone());
            (rm, rv)
        };
        x.sub(&mean)
            .mul(&var.add_scalar(self.eps).rsqrt())
            .mul(&self.weight.reshape(shape.clone()))
            .add(&self.bias.reshape(shape))
    }
}
