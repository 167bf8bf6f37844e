//! The one error type. Every variant names what failed and, for op errors, where the
//! caller built the failing op (`#[track_caller]`).

use crate::DType;
use std::panic::Location;

/// Result with Tessera's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong, as a value. No public API panics on bad input.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit the op (broadcast, matmul, reshape, concat, ...).
    #[error("{op}: shape mismatch: {detail} (shapes {shapes:?}) at {location}")]
    Shape { op: &'static str, shapes: Vec<Vec<usize>>, detail: String, location: &'static Location<'static> },
    /// Dtypes that do not fit the op.
    #[error("{op}: dtype mismatch: {detail} (dtypes {dtypes:?}) at {location}")]
    DType { op: &'static str, dtypes: Vec<DType>, detail: String, location: &'static Location<'static> },
    /// An axis outside `-rank..rank`.
    #[error("{op}: axis {axis} out of range for a tensor of rank {rank} (shape {shape:?}) at {location}")]
    Axis { op: &'static str, axis: isize, rank: usize, shape: Vec<usize>, location: &'static Location<'static> },
    /// An index outside its axis, found on the host or by the kernel's bounds check.
    #[error("{op}: index {index} out of range for axis {axis} of size {size} at {location}")]
    IndexOutOfRange { op: &'static str, index: i64, axis: usize, size: usize, location: &'static Location<'static> },
    /// Any other invalid argument (a negative step, a bad pad, ...).
    #[error("{op}: invalid argument: {detail} at {location}")]
    InvalidArgument { op: &'static str, detail: String, location: &'static Location<'static> },
    /// Tensors from two different devices met in one op.
    #[error("{op}: tensors live on different devices ({a} and {b}) at {location}")]
    DeviceMismatch { op: &'static str, a: String, b: String, location: &'static Location<'static> },
    /// No adapter could be found or opened.
    #[error("no usable GPU adapter: {0}")]
    NoAdapter(String),
    /// A wgpu validation or internal error, with the kernel or step it came from.
    #[error("GPU error in {context}: {message}")]
    Gpu { context: String, message: String },
    /// The device was lost; tensors on it can no longer be read.
    #[error("device lost: {0}")]
    DeviceLost(String),
    /// An allocation failed: the bytes asked for and, where known (a memory budget is
    /// set), the bytes still available. Tensors already on the device are untouched.
    #[error("out of memory: {context} requested {requested} bytes{}", match available {
        Some(a) => format!(", {a} bytes available"),
        None => String::new(),
    })]
    OutOfMemory { context: String, requested: u64, available: Option<u64> },
    /// A tensor or dispatch exceeds a device limit.
    #[error("{what} needs {needed}, over the device limit of {limit}")]
    Limit { what: String, needed: u64, limit: u64 },
    /// A file that does not follow its format, naming the field or tensor.
    #[error("{format}: {detail}")]
    Format { format: &'static str, detail: String },
    /// A file could not be read or written.
    #[error("i/o error on {path}: {message}")]
    Io { path: String, message: String },
    /// The operation is not available on this target (for example blocking on wasm).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A collective failed: a rank died, stalled past the timeout, or the ranks disagree
    /// (different weights, different bucket layouts).
    #[error("distributed: {0}")]
    Distributed(String),
}

impl Error {
    /// The caller location recorded for op errors, if any.
    pub fn location(&self) -> Option<&'static Location<'static>> {
        match self {
            Error::Shape { location, .. }
            | Error::DType { location, .. }
            | Error::Axis { location, .. }
            | Error::IndexOutOfRange { location, .. }
            | Error::InvalidArgument { location, .. }
            | Error::DeviceMismatch { location, .. } => Some(location),
            _ => None,
        }
    }
}
