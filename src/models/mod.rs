//! Published models built from Tessera's nn modules.

pub mod bert;
pub mod mnist;
// Training loops and evaluation block on readback: native only.
#[cfg(not(target_arch = "wasm32"))]
pub mod recsys;
