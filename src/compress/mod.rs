//! Model compression: pruning that keeps its masks through fine-tuning ([`prune`]),
//! knowledge distillation ([`distill`]) and
//! compressed storage for sparse weights ([`sparse`]).

pub mod distill;
pub mod prune;
pub mod sparse;
