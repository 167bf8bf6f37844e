//! The nn and optim API as a PyTorch user meets it: modules written with
//! `#[derive(Module)]` or a hand-written visitor, state dicts read through `&self`,
//! strict and non-strict loading, PyTorch's own `TransformerEncoderLayer` state dict,
//! attention's argument errors, one-axis reductions, optimiser steps that return the
//! loss, schedulers that own their schedule, and mixed precision as a scope.

mod common;
use common::{assert_close, devices, label, Tol};
use tessera::nn::{
    Activation, Layer, Linear, LoadReport, Module, MultiHeadAttention, Role, Sequential, StateDict,
    TransformerEncoderLayer, Visitor, VisitorMut,
};
use tessera::optim::{Adam, LrSchedule, LrScheduler, Optimizer, Sgd};
use tessera::{DType, Device, Error, Tensor};

#[derive(Module)]
struct Block {
    fc: Linear,
    #[module(rename = "gamma")]
    scale: Tensor,
    #[module(buffer)]
    steps_seen: Tensor,
    #[module(skip)]
    _cache: Option<Tensor>,
    extra: Vec<Linear>,
    act: Activation,
    width: usize,
}

#[derive(Module)]
struct Net {
    blocks: Vec<Block>,
    head: Option<Linear>,
}

fn block(d: &Device, seed: u64) -> Block {
    Block {
        fc: Linear::new(3, 4, true, seed, d),
        scale: Tensor::ones([4], DType::F32, d).requires_grad(),
        steps_seen: Tensor::zeros([1], DType::F32, d),
        _cache: Some(Tensor::zeros([2], DType::F32, d)),
        extra: vec![Linear::new(4, 4, false, seed + 1, d)],
        act: Activation::Relu,
        width: 4,
    }
}

/// Reading a module's state takes `&self`.
fn names_of(m: &impl Module) -> Vec<String> {
    m.state_dict().keys().map(String::from).collect()
}

#[test]
fn derived_modules_name_their_state_like_pytorch() {
    let d = Device::cpu();
    let net = Net { blocks: vec![block(&d, 1), block(&d, 3)], head: Some(Linear::new(4, 2, true, 5, &d)) };
    let want = [
        "blocks.0.fc.weight",
        "blocks.0.fc.bias",
        "blocks.0.gamma",
        "blocks.0.steps_seen",
        "blocks.0.extra.0.weight",
        "blocks.1.fc.weight",
        "blocks.1.fc.bias",
        "blocks.1.gamma",
        "blocks.1.steps_seen",
        "blocks.1.extra.0.weight",
        "head.weight",
        "head.bias",
    ];
    assert_eq!(names_of(&net), want);
    let params: Vec<String> = net.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert!(!params.iter().any(|n| n.ends_with("steps_seen")), "buffers are not parameters: {params:?}");
    let buffers: Vec<String> = net.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(buffers, ["blocks.0.steps_seen", "blocks.1.steps_seen"]);
    assert_eq!(net.num_parameters(), 2 * (3 * 4 + 4 + 4 + 16) + 4 * 2 + 2);
    assert_eq!(net.blocks[0].width, 4);
}

/// A module written by hand: each tensor and child named once per visit.
struct Scaled {
    inner: Linear,
    gain: Tensor,
}

impl Module for Scaled {
    fn visit(&self, v: &mut dyn Visitor) {
        v.module("inner", &self.inner);
        v.tensor("gain", &self.gain, Role::Parameter);
    }
    fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>) {
        v.module("inner", &mut self.inner);
        v.tensor("gain", &mut self.gain, Role::Parameter);
    }
}

impl Layer for Scaled {
    fn forward(&self, x: &Tensor) -> Tensor {
        self.inner.forward(x).mul(&self.gain)
    }
}

#[test]
fn hand_written_modules_train_like_derived_ones() {
    let d = Device::cpu();
    let mut m =
        Scaled { inner: Linear::new(2, 1, true, 1, &d), gain: Tensor::ones([1], DType::F32, &d).requires_grad() };
    assert_eq!(names_of(&m), ["inner.weight", "inner.bias", "gain"]);
    let x = Tensor::from_slice(&[1.0f32, 2.0, -1.0, 0.5], [2, 2], &d);
    let y = Tensor::from_slice(&[1.0f32, -1.0], [2, 1], &d);
    let mut opt = Sgd::new(0.1);
    let mut losses = Vec::new();
    for _ in 0..30 {
        let loss = m.forward(&x).sub(&y).square().mean_all();
        losses.push(opt.step(&mut m, &loss).unwrap());
    }
    let (first, last) = (losses[0], losses[29]);
    assert!(last < first * 0.5, "loss {first} -> {last}");
    assert_ne!(m.gain.to_vec_blocking::<f32>().unwrap(), [1.0], "the hand-named parameter trains");
}

#[test]
fn state_dicts_load_strictly_or_report_what_did_not_match() {
    let d = Device::cpu();
    let mut a =
        Sequential::new().add(Linear::new(3, 4, true, 1, &d)).add(Activation::Relu).add(Linear::new(4, 2, true, 2, &d));
    let b =
        Sequential::new().add(Linear::new(3, 4, true, 7, &d)).add(Activation::Relu).add(Linear::new(4, 2, true, 8, &d));
    // A full dict loads strictly and the values follow.
    assert_eq!(a.load_state_dict(&b.state_dict(), true).unwrap(), LoadReport::default());
    let bias = |m: &Sequential| m.state_dict().get("2.bias").unwrap().to_vec_blocking::<f32>().unwrap();
    assert_eq!(bias(&a), bias(&b));
    // Non-strict: missing keys keep their values, unexpected ones are reported.
    let before = a.state_dict().get("0.weight").unwrap().to_vec_blocking::<f32>().unwrap();
    let mut partial: StateDict = b.state_dict().into_iter().filter(|(n, _)| n.starts_with("2.")).collect();
    partial.insert("decoder.weight", Tensor::zeros([1], DType::F32, &d));
    let report = a.load_state_dict(&partial, false).unwrap();
    assert_eq!(report.missing, ["0.weight", "0.bias"]);
    assert_eq!(report.unexpected, ["decoder.weight"]);
    assert_eq!(a.state_dict().get("0.weight").unwrap().to_vec_blocking::<f32>().unwrap(), before);
    // Strict: the same dict is an error naming the keys, and nothing changes.
    let e = a.load_state_dict(&partial, true).unwrap_err().to_string();
    assert!(e.contains("missing keys [\"0.weight\", \"0.bias\"]") && e.contains("decoder.weight"), "{e}");
    // A shape mismatch is an error naming the key, strict or not.
    let mut bad = b.state_dict();
    bad.insert("2.weight", Tensor::zeros([2, 5], DType::F32, &d));
    for strict in [true, false] {
        let e = a.load_state_dict(&bad, strict).unwrap_err().to_string();
        assert!(e.contains("2.weight") && e.contains("[2, 5]") && e.contains("[2, 4]"), "{e}");
    }
    assert_eq!(a.state_dict().get("0.weight").unwrap().to_vec_blocking::<f32>().unwrap(), before);
}

fn fixture() -> serde_json::Value {
    serde_json::from_str(include_str!("fixtures/torch_encoder_layer.json")).unwrap()
}

fn tensor_of(v: &serde_json::Value, d: &Device) -> Tensor {
    let shape: Vec<usize> = v["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let data: Vec<f64> = v["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    Tensor::from_f64(&data, shape, DType::F32, d)
}

/// A state dict in PyTorch's `nn.TransformerEncoderLayer` layout (`self_attn.in_proj_weight`,
/// `self_attn.out_proj.weight`, `linear1`, `norm2`, ...) loads strictly, and the layer's
/// output matches PyTorch's algorithm (tests/fixtures/make_torch_encoder.py).
#[test]
fn pytorch_encoder_layer_state_dicts_load_and_match() {
    let fx = fixture();
    let want: Vec<f64> = fx["output"]["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
    for d in devices() {
        common::record(&d);
        let mut layer = TransformerEncoderLayer::new(8, 2, 16, 0.1, 1, &d);
        let state: StateDict =
            fx["state_dict"].as_object().unwrap().iter().map(|(name, v)| (name.clone(), tensor_of(v, &d))).collect();
        let report = layer.load_state_dict(&state, true).unwrap_or_else(|e| panic!("on {}: {e}", label(&d)));
        assert_eq!(report, LoadReport::default());
        layer.set_training(false);
        let y = layer.forward(&tensor_of(&fx["input"], &d));
        assert_eq!(y.dims(), [2, 5, 8]);
        let got = y.to_f64_vec_blocking().unwrap();
        assert_close(&format!("encoder layer on {}", label(&d)), &got, &want, Tol { atol: 2e-5, rtol: 1e-4 });
    }
}

#[test]
fn attention_says_what_is_wrong_with_its_arguments() {
    let d = Device::cpu();
    let line = line!() + 1;
    let zero = MultiHeadAttention::new(8, 0, 1, &d);
    let x = Tensor::ones([1, 3, 8], DType::F32, &d);
    let e = zero.forward(&x).check().unwrap_err();
    assert!(e.to_string().contains("heads (0) must be at least 1 and divide dim (8)"), "{e}");
    assert_eq!(e.location().unwrap().line(), line, "the error points at the constructor's caller");
    let uneven = MultiHeadAttention::new(8, 3, 1, &d);
    assert!(uneven.forward(&x).check().unwrap_err().to_string().contains("heads (3)"));
    let mha = MultiHeadAttention::new(8, 2, 1, &d);
    let e = mha.forward(&Tensor::ones([3, 8], DType::F32, &d)).check().unwrap_err();
    assert!(
        matches!(e, Error::Shape { .. }) && e.to_string().contains("[batch, seq, dim] (rank 3), got rank 2"),
        "{e}"
    );
    // Cross-attention takes its keys and values from the context.
    let ctx = Tensor::randn([1, 5, 8], 3, &d);
    assert_eq!(mha.attend(&x, &ctx, None, false).to_vec_blocking::<f32>().unwrap().len(), 24);
    let names: Vec<String> = mha.state_dict().keys().map(String::from).collect();
    assert_eq!(names, ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]);
}

#[test]
fn reductions_over_one_axis_and_no_silent_all_axes() {
    let d = Device::cpu();
    let x = Tensor::from_slice(&[1.0f32, 5.0, 3.0, 4.0, 2.0, 6.0], [2, 3], &d);
    assert_eq!(x.sum_dim(-1).to_vec_blocking::<f32>().unwrap(), [9.0, 12.0]);
    assert_eq!(x.mean_dim(0).to_vec_blocking::<f32>().unwrap(), [2.5, 3.5, 4.5]);
    assert_eq!(x.max_dim(1).to_vec_blocking::<f32>().unwrap(), [5.0, 6.0]);
    assert_eq!(x.argmax_dim(-1).to_vec_blocking::<i32>().unwrap(), [1, 2]);
    assert_eq!(x.argmin_dim(0).to_vec_blocking::<i32>().unwrap(), [0, 1, 0]);
    assert_eq!(x.sum_all().to_vec_blocking::<f32>().unwrap(), [21.0]);
    assert_eq!(x.argmax_all().item_blocking::<i32>().unwrap(), 5);
    let e = x.sum(&[], false).check().unwrap_err().to_string();
    assert!(e.contains("no axes given") && e.contains("sum_all()"), "{e}");
    assert!(x.mean(&[], true).check().unwrap_err().to_string().contains("mean_all()"));
}

#[test]
fn optimisers_step_like_pytorch_and_schedulers_own_their_schedule() {
    let d = Device::cpu();
    let mut model = Sequential::new().add(Linear::new(2, 1, true, 3, &d));
    let mut opt = Adam::new(0.1);
    let mut sched = LrScheduler::new(LrSchedule::step_decay(0.1, 2, 0.5), &mut opt);
    let x = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0], [2, 2], &d);
    let y = Tensor::from_slice(&[2.0f32, -1.0], [2, 1], &d);
    let mut rates = Vec::new();
    let mut losses = Vec::new();
    for _ in 0..5 {
        rates.push(opt.lr());
        let loss = model.forward(&x).sub(&y).square().mean_all();
        losses.push(opt.step(&mut model, &loss).unwrap()); // the loss, as a number
        sched.step(&mut opt);
    }
    assert_eq!(rates, [0.1, 0.1, 0.05, 0.05, 0.025]);
    assert!(losses[4] < losses[0], "{losses:?}");
    assert_eq!(opt.steps(), 5);
    // A scheduler made for a resumed optimiser starts from its step count.
    let resumed = LrScheduler::new(LrSchedule::step_decay(0.1, 2, 0.5), &mut opt);
    assert_eq!((resumed.last_lr(), opt.lr()), (0.025, 0.025));
}

#[test]
fn autocast_runs_products_in_f16_with_f32_weights() {
    for d in devices() {
        common::record(&d);
        let fc = Linear::new(16, 4, true, 1, &d);
        let x = Tensor::randn([3, 16], 2, &d);
        let full = fc.forward(&x);
        let half = {
            let _f16 = tessera::autocast(DType::F16);
            fc.forward(&x)
        };
        let (f, h) = (full.to_f64_vec_blocking().unwrap(), half.to_f64_vec_blocking().unwrap());
        assert_eq!(half.dtype(), DType::F32, "the result keeps the input's dtype");
        assert_close(&format!("autocast on {}", label(&d)), &h, &f, Tol { atol: 2e-2, rtol: 2e-2 });
        assert!(f.iter().zip(&h).any(|(a, b)| a != b), "the f16 product should round differently on {}", label(&d));
        assert!(tessera::autocast::dtype().is_none(), "the scope ended with its guard");
    }
}
