//! Creating tensors: from host data, constants, ranges, identity, seeded random.

use super::{arg_err, check_numel, shape_err, Loc};
use crate::graph::{BinaryOp, Op};
use crate::{DType, Device, Element, Result, Shape, Tensor};
use std::panic::Location;

impl Tensor {
    /// A tensor holding `data` (row-major) with `shape`. The dtype comes from `T`.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>, device: &Device) -> Tensor {
        let loc = Location::caller();
        let shape = shape.into();
        let r = (|| {
            check_numel("from_slice", shape.dims(), loc)?;
            if shape.numel() != data.len() {
                return Err(shape_err(
                    "from_slice",
                    &[shape.dims(), &[data.len()]],
                    format!("{} values given for a shape of {} elements", data.len(), shape.numel()),
                    loc,
                ));
            }
            // Natively, values stored as they are in memory go up with no f64 in
            // between (the npm package's size budget keeps its build on the f64 path).
            if !cfg!(target_arch = "wasm32") {
                if let Some(bytes) = T::device_bytes(data) {
                    return Ok(device.upload_le_bytes(bytes, shape.clone(), T::DTYPE));
                }
            }
            Ok(device.upload(data.iter().map(|v| v.to_f64()).collect(), shape.clone(), T::DTYPE))
        })();
        r.unwrap_or_else(|e| Tensor::failed(e, T::DTYPE, device))
    }

    /// A tensor from f64 values converted to `dtype` (rounding floats, truncating ints).
    #[track_caller]
    pub fn from_f64(values: &[f64], shape: impl Into<Shape>, dtype: DType, device: &Device) -> Tensor {
        let loc = Location::caller();
        let shape = shape.into();
        if shape.checked_numel() != Some(values.len()) {
            let e = shape_err(
                "from_f64",
                &[shape.dims(), &[values.len()]],
                format!("{} values given for a shape of {} elements", values.len(), shape.numel()),
                loc,
            );
            return Tensor::failed(e, dtype, device);
        }
        let v = if device.is_exact() && dtype.is_float() {
            values.to_vec()
        } else {
            values.iter().map(|&x| crate::reference::elementwise::cast(x, DType::F32, dtype)).collect()
        };
        device.upload(v, shape, dtype)
    }

    /// A scalar (rank 0) tensor.
    #[track_caller]
    pub fn scalar(value: f64, dtype: DType, device: &Device) -> Tensor {
        Tensor::full(value, (), dtype, device)
    }

    /// Every element equal to `value` (lazy: nothing is uploaded).
    #[track_caller]
    pub fn full(value: f64, shape: impl Into<Shape>, dtype: DType, device: &Device) -> Tensor {
        let loc = Location::caller();
        let shape = shape.into();
        match check_numel("full", shape.dims(), loc) {
            Ok(()) => Tensor::make_at(Op::Full { value: dtype.round(value) }, vec![], shape, dtype, device, loc),
            Err(e) => Tensor::failed(e, dtype, device),
        }
    }

    /// All zeros.
    #[track_caller]
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Tensor {
        Tensor::full(0.0, shape, dtype, device)
    }

    /// All ones.
    #[track_caller]
    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: &Device) -> Tensor {
        Tensor::full(1.0, shape, dtype, device)
    }

    /// Zeros with this tensor's shape and dtype.
    #[track_caller]
    pub fn zeros_like(&self) -> Tensor {
        Tensor::full(0.0, self.shape().clone(), self.dtype(), self.device())
    }

    /// Ones with this tensor's shape and dtype.
    #[track_caller]
    pub fn ones_like(&self) -> Tensor {
        Tensor::full(1.0, self.shape().clone(), self.dtype(), self.device())
    }

    /// `start, start + step, ...` up to but excluding `end`, as in `torch.arange`.
    #[track_caller]
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: &Device) -> Tensor {
        let loc = Location::caller();
        let r = (|| -> Result<Tensor> {
            if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
                return Err(arg_err(
                    "arange",
                    format!("start {start}, end {end}, step {step}: step must be finite and non-zero"),
                    loc,
                ));
            }
            if dtype == DType::Bool {
                return Err(super::dtype_err("arange", &[dtype], "arange needs a numeric dtype", loc));
            }
            let n = ((end - start) / step).ceil().max(0.0);
            if n > (u32::MAX / 2) as f64 {
                return Err(arg_err("arange", format!("{n} elements is too many"), loc));
            }
            Ok(Tensor::make_at(Op::Arange { start, step }, vec![], Shape(vec![n as usize]), dtype, device, loc))
        })();
        r.unwrap_or_else(|e| Tensor::failed(e, dtype, device))
    }

    /// The `n × n` identity matrix.
    #[track_caller]
    pub fn eye(n: usize, dtype: DType, device: &Device) -> Tensor {
        let loc = Location::caller();
        let i = Tensor::arange(0.0, n as f64, 1.0, DType::I32, device);
        let rows = i.reshape_at(&[n, 1], loc);
        let cols = i.reshape_at(&[1, n], loc);
        rows.binary_at(BinaryOp::Eq, &cols, loc).cast_at(dtype, loc)
    }

    /// Seeded uniform values in [0, 1) (f32). The same seed gives the same values on
    /// every device, the CPU reference included.
    #[track_caller]
    pub fn rand(shape: impl Into<Shape>, seed: u64, device: &Device) -> Tensor {
        random(shape.into(), seed, false, device, Location::caller())
    }

    /// Seeded standard-normal values (f32, Box–Muller over the same counter RNG).
    #[track_caller]
    pub fn randn(shape: impl Into<Shape>, seed: u64, device: &Device) -> Tensor {
        random(shape.into(), seed, true, device, Location::caller())
    }
}

fn random(shape: Shape, seed: u64, normal: bool, device: &Device, loc: Loc) -> Tensor {
    match check_numel(if normal { "randn" } else { "rand" }, shape.dims(), loc) {
        Ok(()) => Tensor::make_at(Op::Rand { seed, normal }, vec![], shape, DType::F32, device, loc),
        Err(e) => Tensor::failed(e, DType::F32, device),
    }
}
