//! Mixed precision as a scope, like `torch.autocast`: inside [`autocast`], layers with
//! f32 weights compute their products in the scope's dtype (f16), keeping f32 master
//! weights; gradients flow back to them in f32. Pair it with a
//! [`GradScaler`](crate::optim::GradScaler) in the step options.
//!
//! ```
//! use tessera::nn::{Layer, Linear};
//! use tessera::{autocast, DType, Device, Tensor};
//!
//! let d = Device::cpu();
//! let fc = Linear::new(4, 2, true, 1, &d);
//! let x = Tensor::ones([3, 4], DType::F32, &d);
//! let y = {
//!     let _half = autocast(DType::F16);
//!     fc.forward(&x) // the product runs in f16
//! };
//! assert_eq!(y.dtype(), DType::F32);
//! # Ok::<(), tessera::Error>(())
//! ```

use crate::DType;
use std::cell::RefCell;

thread_local! {
    static STACK: RefCell<Vec<DType>> = const { RefCell::new(Vec::new()) };
}

/// While alive, products of f32 layers built on this thread run in its dtype.
pub struct AutocastGuard(());

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        STACK.with(|s| s.borrow_mut().pop());
    }
}

/// Enter a mixed-precision scope computing in `dtype` (f16; f32 turns it off inside an
/// outer scope); it ends when the guard drops.
pub fn autocast(dtype: DType) -> AutocastGuard {
    STACK.with(|s| s.borrow_mut().push(dtype));
    AutocastGuard(())
}

/// The dtype products compute in here, if a scope other than f32 is active.
pub fn dtype() -> Option<DType> {
    STACK.with(|s| s.borrow().last().copied()).filter(|d| *d != DType::F32)
}
