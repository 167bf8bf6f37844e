//! Published models built from Tessera's nn modules.

pub mod bert;
pub mod mnist;
pub mod recsys;
