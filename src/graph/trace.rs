//! What an exporter needs that the graph's core ops do not say: which subgraphs came
//! from a convolution or a pooling call. While [`capture`] runs a forward pass, those
//! calls record their output's id, their inputs and their geometry here, so the ONNX
//! exporter writes one `Conv` or `MaxPool` node instead of the im2col and products they
//! are built from. Outside a capture, recording does nothing.

use crate::Tensor;
use std::cell::RefCell;
use std::collections::HashMap;

/// A 2-D window geometry: `(rows, cols)` pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub kernel: (usize, usize),
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
}

/// A composite call.
#[derive(Clone, Debug, PartialEq)]
pub enum Composite {
    /// `conv2d(x, w, b?)`.
    Conv { geometry: Geometry, groups: usize },
    /// `conv_transpose2d(x, w, b?)`.
    ConvTranspose { geometry: Geometry, groups: usize, output_padding: (usize, usize) },
    /// `max_pool2d(x)` (padding with -inf).
    MaxPool { geometry: Geometry },
    /// `avg_pool2d(x)` (zero padding counted).
    AvgPool { geometry: Geometry },
}

/// A recorded call: what it was and the tensors it was given.
#[derive(Clone, Debug)]
pub struct Call {
    pub op: Composite,
    pub inputs: Vec<Tensor>,
}

thread_local! {
    static CALLS: RefCell<Option<HashMap<u64, Call>>> = const { RefCell::new(None) };
}

/// Record that `out` is `op` applied to `inputs` (only inside [`capture`]).
pub fn record(out: &Tensor, op: Composite, inputs: &[&Tensor]) {
    CALLS.with(|c| {
        if let Some(map) = c.borrow_mut().as_mut() {
            if out.error().is_none() {
                map.insert(out.id(), Call { op, inputs: inputs.iter().map(|t| (*t).clone()).collect() });
            }
        }
    });
}

/// Run `f` and return its result with the composite calls it made, by output id.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, HashMap<u64, Call>) {
    let previous = CALLS.with(|c| c.borrow_mut().replace(HashMap::new()));
    let r = f();
    let calls = CALLS.with(|c| std::mem::replace(&mut *c.borrow_mut(), previous)).unwrap_or_default();
    (r, calls)
}
