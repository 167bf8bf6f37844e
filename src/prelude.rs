//! What most programs need, in one import: `use tessera::prelude::*;`.
//!
//! ```
//! use tessera::prelude::*;
//!
//! let d = Device::cpu();
//! let mut model = Sequential::new().add(Linear::new(4, 8, true, 1, &d)).add(Activation::Relu).add(Linear::new(8, 2, true, 2, &d));
//! let mut opt = Adam::new(1e-2);
//! let x = Tensor::randn([16, 4], 3, &d);
//! let y = Tensor::from_slice(&[0i32, 1].repeat(8), [16], &d);
//! let loss = loss::cross_entropy(&model.forward(&x), &y);
//! let value: f64 = opt.step(&mut model, &loss)?; // backward, update and one realisation
//! assert!(value.is_finite());
//! # Ok::<(), tessera::Error>(())
//! ```

pub use crate::nn::{
    loss, Activation, Conv2d, Dropout, Embedding, Flatten, Layer, LayerNorm, Linear, MaxPool2d, Module, Sequential,
    StateDict,
};
pub use crate::optim::{Adam, LrSchedule, LrScheduler, Optimizer, Sgd, StepOptions};
pub use crate::{autocast, no_grad, DType, Device, Error, Result, Tensor};
