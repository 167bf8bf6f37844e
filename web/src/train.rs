//! Training in the page: a model, an optimiser, and one training step per call (forward,
//! backward, update and one GPU submit).

use crate::tensor::JsTensor;
use crate::{device, js, js_err};
use std::cell::RefCell;
use std::rc::Rc;
use tessera::nn::{loss, Activation, Flatten, Layer, Linear, Module, Sequential};
use tessera::optim::{Adam, Sgd, StepOptions};
use wasm_bindgen::prelude::*;

const BUSY: &str = "the model is in the middle of a training step: await the previous trainStep first";

/// A trainable model.
///
/// ```js
/// const model = Model.mlp([784, 128, 10], { seed: 1 });
/// const opt = Optimizer.adam(1e-3);
/// const loss = await model.trainStep(opt, x, labels);   // cross-entropy
/// const probs = model.forward(x).softmax(-1);
/// ```
#[wasm_bindgen]
pub struct Model {
    inner: Rc<RefCell<Sequential>>,
    sizes: Vec<usize>,
}

/// An optimiser: `Optimizer.adam(lr)`, `Optimizer.adamw(lr, weightDecay)`,
/// `Optimizer.sgd(lr, { momentum, nesterov, weightDecay })`.
#[wasm_bindgen]
pub struct Optimizer {
    inner: Rc<RefCell<Box<dyn tessera::optim::Optimizer>>>,
}

fn activation(name: &str) -> Result<Activation, JsError> {
    Ok(match name {
        "relu" => Activation::Relu,
        "gelu" => Activation::Gelu,
        "tanh" => Activation::Tanh,
        "silu" => Activation::Silu,
        "sigmoid" => Activation::Sigmoid,
        _ => return Err(JsError::new(&format!("activation {name:?}: use relu, gelu, tanh, silu or sigmoid"))),
    })
}

#[wasm_bindgen]
impl Model {
    /// A multi-layer perceptron: Linear layers of the given sizes (`[784, 128, 10]` is
    /// two) with an activation between them. Inputs of any shape `[n, ...]` are
    /// flattened. Options: `seed` (initial weights), `activation` (`relu` by default).
    pub fn mlp(
        #[wasm_bindgen(unchecked_param_type = "number[]")] sizes: JsValue,
        #[wasm_bindgen(unchecked_param_type = "{ seed?: number, activation?: string } | undefined")] options: JsValue,
    ) -> Result<Model, JsError> {
        let sizes = js::usizes(&sizes, "sizes")?;
        if sizes.len() < 2 || sizes.contains(&0) {
            return Err(JsError::new("sizes needs at least two positive layer widths, such as [784, 128, 10]"));
        }
        let seed = js::get_f64(&options, "seed").unwrap_or(0.0) as u64;
        let act = activation(&js::get_str(&options, "activation").unwrap_or_else(|| "relu".into()))?;
        let dev = device()?;
        let mut seq = Sequential::new().add(Flatten);
        for (i, w) in sizes.windows(2).enumerate() {
            if i > 0 {
                seq = seq.add(act);
            }
            seq = seq.add(Linear::new(w[0], w[1], true, seed * 1000 + i as u64, &dev));
        }
        Ok(Model { inner: Rc::new(RefCell::new(seq)), sizes })
    }

    /// Layer widths.
    #[wasm_bindgen(getter)]
    pub fn sizes(&self) -> Vec<u32> {
        self.sizes.iter().map(|&s| s as u32).collect()
    }

    /// The number of trainable values.
    #[wasm_bindgen(getter, js_name = parameterCount)]
    pub fn parameter_count(&self) -> Result<f64, JsError> {
        let m = self.inner.try_borrow().map_err(|_| JsError::new(BUSY))?;
        Ok(m.num_parameters() as f64)
    }

    /// The model's output for `x` (no gradient is recorded).
    pub fn forward(&self, x: &JsTensor) -> Result<JsTensor, JsError> {
        let m = self.inner.try_borrow().map_err(|_| JsError::new(BUSY))?;
        let _no_grad = tessera::no_grad();
        JsTensor::wrap(m.forward(&x.tensor()?))
    }

    /// One training step on a batch: cross-entropy of `forward(x)` against the i32 class
    /// `labels`, backward, the optimiser's update, all in one GPU submit. Resolves to the
    /// loss before the update.
    #[wasm_bindgen(js_name = trainStep, unchecked_return_type = "Promise<number>")]
    pub fn train_step(
        &self,
        optimizer: &Optimizer,
        x: &JsTensor,
        labels: &JsTensor,
    ) -> Result<js_sys::Promise, JsError> {
        let (model, opt) = (self.inner.clone(), optimizer.inner.clone());
        let (x, y) = (x.tensor()?, labels.tensor()?);
        // The model and optimiser stay borrowed across the step's await, on purpose:
        // every other use takes them with try_borrow and reports "busy" instead.
        #[allow(clippy::await_holding_refcell_ref)]
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let mut m = model.try_borrow_mut().map_err(|_| JsError::new(BUSY))?;
            let mut o = opt.try_borrow_mut().map_err(|_| JsError::new("the optimiser is in use by another step"))?;
            let logits = m.forward(&x);
            let loss = loss::cross_entropy(&logits, &y);
            let r =
                tessera::optim::step_async(&mut *m, &mut **o, &loss, StepOptions::default()).await.map_err(js_err)?;
            Ok(JsValue::from_f64(r.loss.unwrap_or(f64::NAN)))
        }))
    }

    /// The parameters as a safetensors file.
    #[wasm_bindgen(unchecked_return_type = "Promise<Uint8Array>")]
    pub fn save(&self) -> Result<js_sys::Promise, JsError> {
        let params: Vec<_> =
            self.inner.try_borrow().map_err(|_| JsError::new(BUSY))?.state_dict().into_iter().collect();
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let bytes = tessera::io::safetensors::to_bytes(&params, &Default::default()).await.map_err(js_err)?;
            Ok(js_sys::Uint8Array::from(&bytes[..]).into())
        }))
    }

    /// Load parameters saved by `save()` (names and shapes must match).
    pub fn load(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ArrayBuffer | Uint8Array")] bytes: JsValue,
    ) -> Result<(), JsError> {
        let data = js::bytes(&bytes, "bytes")?;
        let file = tessera::io::safetensors::load_bytes(&data, &device()?).map_err(js_err)?;
        let state: tessera::nn::StateDict = file.tensors.into_iter().collect();
        let mut model = self.inner.try_borrow_mut().map_err(|_| JsError::new(BUSY))?;
        model.load_state_dict(&state, true).map_err(js_err)?;
        Ok(())
    }
}

#[wasm_bindgen]
impl Optimizer {
    /// Adam (betas 0.9, 0.999).
    pub fn adam(lr: f64) -> Optimizer {
        Optimizer { inner: Rc::new(RefCell::new(Box::new(Adam::new(lr)))) }
    }

    /// AdamW: Adam with decoupled weight decay.
    pub fn adamw(lr: f64, weight_decay: f64) -> Optimizer {
        Optimizer { inner: Rc::new(RefCell::new(Box::new(Adam::adamw(lr, weight_decay)))) }
    }

    /// SGD. Options: `momentum`, `nesterov`, `weightDecay`.
    pub fn sgd(
        lr: f64,
        #[wasm_bindgen(
            unchecked_param_type = "{ momentum?: number, nesterov?: boolean, weightDecay?: number } | undefined"
        )]
        options: JsValue,
    ) -> Optimizer {
        let mut s = Sgd::new(lr);
        if let Some(m) = js::get_f64(&options, "momentum") {
            s = s.with_momentum(m, js::get_bool(&options, "nesterov").unwrap_or(false));
        }
        if let Some(wd) = js::get_f64(&options, "weightDecay") {
            s = s.with_weight_decay(wd);
        }
        Optimizer { inner: Rc::new(RefCell::new(Box::new(s))) }
    }

    /// The learning rate (settable, for schedules).
    #[wasm_bindgen(getter)]
    pub fn lr(&self) -> Result<f64, JsError> {
        Ok(self.inner.try_borrow().map_err(|_| JsError::new("the optimiser is in use by a step"))?.lr())
    }

    /// Set the learning rate.
    #[wasm_bindgen(setter)]
    pub fn set_lr(&self, lr: f64) -> Result<(), JsError> {
        self.inner.try_borrow_mut().map_err(|_| JsError::new("the optimiser is in use by a step"))?.set_lr(lr);
        Ok(())
    }

    /// Updates applied so far.
    #[wasm_bindgen(getter)]
    pub fn steps(&self) -> Result<f64, JsError> {
        Ok(self.inner.try_borrow().map_err(|_| JsError::new("the optimiser is in use by a step"))?.steps() as f64)
    }
}
