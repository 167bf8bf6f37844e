//! Model compression: pruning that keeps its masks through fine-tuning ([`prune`]) and
//! compressed storage for sparse weights ([`sparse`]).

pub mod prune;
pub mod sparse;
