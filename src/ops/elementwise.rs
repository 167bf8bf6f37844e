//! Element-wise ops: unary functions, binary arithmetic and comparisons with numpy
//! broadcasting, `where`, `cast`, and the `+ - * /` operators.

use super::{dtype_err, precheck, shape_err, Loc};
use crate::graph::{BinaryOp, Op, UnaryOp};
use crate::shape::broadcast_shapes;
use crate::{DType, Result, Shape, Tensor};
use std::ops::{Add, Div, Mul, Neg, Sub};
use std::panic::Location;

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self) -> Tensor {
                    self.unary_at(UnaryOp::$op, Location::caller())
                }
            )*
        }
    };
}

unary_methods! {
    /// `-x`.
    neg => Neg;
    /// `|x|`.
    abs => Abs;
    /// `e^x`.
    exp => Exp;
    /// Natural logarithm.
    log => Log;
    /// Square root.
    sqrt => Sqrt;
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt;
    /// Sine.
    sin => Sin;
    /// Cosine.
    cos => Cos;
    /// Hyperbolic tangent.
    tanh => Tanh;
    /// `1 / (1 + e^-x)`.
    sigmoid => Sigmoid;
    /// `max(x, 0)` (NaN stays NaN).
    relu => Relu;
    /// The error function.
    erf => Erf;
    /// gelu with the exact erf: `x/2 · (1 + erf(x/√2))`.
    gelu => GeluErf;
    /// gelu with the tanh approximation.
    gelu_tanh => GeluTanh;
    /// `x · sigmoid(x)`.
    silu => Silu;
    /// Round down.
    floor => Floor;
    /// Round up.
    ceil => Ceil;
    /// Round to the nearest integer, halves to even (as `numpy.round`).
    round => Round;
    /// `1 / x`.
    recip => Recip;
    /// Logical not of a mask.
    logical_not => Not;
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $scalar:ident => $op:ident;)*) => {
        impl Tensor {
            $(
                $(#[$doc])*
                #[track_caller]
                pub fn $name(&self, other: &Tensor) -> Tensor {
                    self.binary_at(BinaryOp::$op, other, Location::caller())
                }

                /// The same op against a scalar (taking this tensor's dtype).
                #[track_caller]
                pub fn $scalar(&self, value: f64) -> Tensor {
                    let loc = Location::caller();
                    let s = self.scalar_like(value, loc);
                    self.binary_at(BinaryOp::$op, &s, loc)
                }
            )*
        }
    };
}

binary_methods! {
    /// Element-wise sum, with broadcasting.
    add, add_scalar => Add;
    /// Element-wise difference, with broadcasting.
    sub, sub_scalar => Sub;
    /// Element-wise product, with broadcasting.
    mul, mul_scalar => Mul;
    /// Element-wise quotient, with broadcasting (integers truncate; `x / 0 = x`).
    div, div_scalar => Div;
    /// Element-wise maximum (NaN propagates).
    maximum, maximum_scalar => Maximum;
    /// Element-wise minimum (NaN propagates).
    minimum, minimum_scalar => Minimum;
    /// `x^y` (floats).
    pow, pow_scalar => Pow;
    /// Mask of `x == y`.
    eq, eq_scalar => Eq;
    /// Mask of `x != y`.
    ne, ne_scalar => Ne;
    /// Mask of `x < y`.
    lt, lt_scalar => Lt;
    /// Mask of `x <= y`.
    le, le_scalar => Le;
    /// Mask of `x > y`.
    gt, gt_scalar => Gt;
    /// Mask of `x >= y`.
    ge, ge_scalar => Ge;
    /// Logical and of masks.
    logical_and, logical_and_scalar => And;
    /// Logical or of masks.
    logical_or, logical_or_scalar => Or;
}

impl Tensor {
    /// `x * x`.
    #[track_caller]
    pub fn square(&self) -> Tensor {
        let loc = Location::caller();
        self.binary_at(BinaryOp::Mul, self, loc)
    }

    /// Clamp into `[min, max]` (NaN stays NaN).
    #[track_caller]
    pub fn clamp(&self, min: f64, max: f64) -> Tensor {
        let loc = Location::caller();
        if min > max {
            let e = super::arg_err("clamp", format!("min {min} is greater than max {max}"), loc);
            return Tensor::failed(e, self.dtype(), self.device());
        }
        let lo = self.scalar_like(min, loc);
        let hi = self.scalar_like(max, loc);
        self.binary_at(BinaryOp::Maximum, &lo, loc).binary_at(BinaryOp::Minimum, &hi, loc)
    }

    /// `cond ? a : b` element-wise, broadcasting all three; `cond` must be a mask.
    #[track_caller]
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
        let loc = Location::caller();
        a.lift(where_impl(cond, a, b, loc))
    }

    /// Convert to `dtype` (floats to integers truncate and saturate).
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> Tensor {
        self.cast_at(dtype, Location::caller())
    }

    pub(crate) fn cast_at(&self, dtype: DType, loc: Loc) -> Tensor {
        if self.error().is_some() || self.dtype() == dtype {
            return self.clone();
        }
        if dtype.is_quantized() {
            return self.quantize_at(dtype, loc);
        }
        Tensor::make_at(Op::Cast, vec![self.clone()], self.shape().clone(), dtype, self.device(), loc)
    }

    /// A constant of this tensor's shape and dtype.
    pub(crate) fn scalar_like(&self, value: f64, loc: Loc) -> Tensor {
        let v = crate::reference::elementwise::cast(value, DType::F32, self.dtype());
        Tensor::make_at(Op::Full { value: v }, vec![], self.shape().clone(), self.dtype(), self.device(), loc)
    }

    pub(crate) fn unary_at(&self, u: UnaryOp, loc: Loc) -> Tensor {
        self.lift(unary_impl(self, u, loc))
    }

    pub(crate) fn binary_at(&self, b: BinaryOp, other: &Tensor, loc: Loc) -> Tensor {
        self.lift(binary_impl(self, b, other, loc))
    }

    /// Broadcast both to their common shape (numpy rules).
    pub(crate) fn broadcast_pair(&self, other: &Tensor, op: &'static str, loc: Loc) -> Result<(Tensor, Tensor)> {
        let shape = broadcast_shapes(self.dims(), other.dims())
            .ok_or_else(|| shape_err(op, &[self.dims(), other.dims()], "shapes cannot be broadcast together", loc))?;
        Ok((self.expand_at(&shape, loc)?, other.expand_at(&shape, loc)?))
    }
}

fn unary_impl(x: &Tensor, u: UnaryOp, loc: Loc) -> Result<Tensor> {
    let name = Op::Unary(u).name();
    let op: &'static str = match u {
        UnaryOp::Neg => "neg",
        UnaryOp::Abs => "abs",
        UnaryOp::Relu => "relu",
        UnaryOp::Not => "logical_not",
        _ => "unary",
    };
    precheck(op, &[x], loc)?;
    let dt = x.dtype();
    let ok = match u {
        UnaryOp::Neg => dt.is_float() || dt == DType::I32,
        UnaryOp::Abs | UnaryOp::Relu => dt != DType::Bool,
        UnaryOp::Not => dt == DType::Bool,
        _ => dt.is_float(),
    };
    if !ok {
        return Err(dtype_err(op, &[dt], format!("{name} is not defined for {dt}"), loc));
    }
    Ok(x.derive(Op::Unary(u), x.dims().to_vec(), loc))
}

fn binary_impl(x: &Tensor, b: BinaryOp, y: &Tensor, loc: Loc) -> Result<Tensor> {
    let op: &'static str = match b {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Maximum => "maximum",
        BinaryOp::Minimum => "minimum",
        BinaryOp::Pow => "pow",
        BinaryOp::And => "logical_and",
        BinaryOp::Or => "logical_or",
        _ => "compare",
    };
    precheck(op, &[x, y], loc)?;
    if x.dtype() != y.dtype() {
        return Err(dtype_err(op, &[x.dtype(), y.dtype()], "operands must have the same dtype (cast one)", loc));
    }
    let dt = x.dtype();
    let ok = match b {
        BinaryOp::Pow => dt.is_float(),
        BinaryOp::And | BinaryOp::Or => dt == DType::Bool,
        BinaryOp::Eq | BinaryOp::Ne => true,
        _ => dt != DType::Bool,
    };
    if !ok {
        return Err(dtype_err(op, &[dt], format!("{op} is not defined for {dt}"), loc));
    }
    let (a, c) = x.broadcast_pair(y, op, loc)?;
    let out_dt = if b.is_comparison() { DType::Bool } else { dt };
    Ok(Tensor::make_at(Op::Binary(b), vec![a.clone(), c], a.shape().clone(), out_dt, x.device(), loc))
}

fn where_impl(cond: &Tensor, a: &Tensor, b: &Tensor, loc: Loc) -> Result<Tensor> {
    precheck("where", &[cond, a, b], loc)?;
    if cond.dtype() != DType::Bool {
        return Err(dtype_err("where", &[cond.dtype()], "the condition must be a bool mask", loc));
    }
    if a.dtype() != b.dtype() {
        return Err(dtype_err("where", &[a.dtype(), b.dtype()], "both branches must have the same dtype", loc));
    }
    let s1 = broadcast_shapes(cond.dims(), a.dims());
    let shape = s1.and_then(|s| broadcast_shapes(&s, b.dims())).ok_or_else(|| {
        shape_err("where", &[cond.dims(), a.dims(), b.dims()], "shapes cannot be broadcast together", loc)
    })?;
    let (c, x, y) = (cond.expand_at(&shape, loc)?, a.expand_at(&shape, loc)?, b.expand_at(&shape, loc)?);
    Ok(Tensor::make_at(Op::Where, vec![c, x, y], Shape(shape), a.dtype(), a.device(), loc))
}

macro_rules! operator {
    ($trait:ident, $method:ident, $op:ident) => {
        impl $trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary_at(BinaryOp::$op, rhs, Location::caller())
            }
        }
        impl $trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary_at(BinaryOp::$op, &rhs, Location::caller())
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary_at(BinaryOp::$op, rhs, Location::caller())
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary_at(BinaryOp::$op, &rhs, Location::caller())
            }
        }
        impl $trait<f32> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: f32) -> Tensor {
                let loc = Location::caller();
                self.binary_at(BinaryOp::$op, &self.scalar_like(rhs as f64, loc), loc)
            }
        }
        impl $trait<f32> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: f32) -> Tensor {
                let loc = Location::caller();
                self.binary_at(BinaryOp::$op, &self.scalar_like(rhs as f64, loc), loc)
            }
        }
        impl $trait<&Tensor> for f32 {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                let loc = Location::caller();
                rhs.scalar_like(self as f64, loc).binary_at(BinaryOp::$op, rhs, loc)
            }
        }
        impl $trait<Tensor> for f32 {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                let loc = Location::caller();
                rhs.scalar_like(self as f64, loc).binary_at(BinaryOp::$op, &rhs, loc)
            }
        }
    };
}

operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.unary_at(UnaryOp::Neg, Location::caller())
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        self.unary_at(UnaryOp::Neg, Location::caller())
    }
}
