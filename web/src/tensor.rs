//! The JavaScript `Tensor` class: a lazy handle on an engine tensor.
//!
//! Handles live in a registry keyed by id, so arrays of tensors (`Tensor.concat`) can be
//! read without taking them from their JavaScript owners. `dispose()` (or the garbage
//! collector) drops the handle; the GPU buffer is freed once no graph needs it.

use crate::{device, js, js_err};
use js_sys::{Array, Float32Array, Int32Array, Uint32Array, Uint8Array};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use tessera::{DType, Tensor};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

thread_local! {
    static TENSORS: RefCell<HashMap<u32, Tensor>> = RefCell::new(HashMap::new());
    static NEXT_ID: Cell<u32> = const { Cell::new(1) };
}

/// A tensor: lazy, on the current device. Ops record a graph and are checked at once
/// (shape, dtype and axis errors throw); `await t.toArray()` runs it on the GPU.
#[wasm_bindgen(js_name = Tensor)]
pub struct JsTensor {
    id: u32,
}

impl Drop for JsTensor {
    fn drop(&mut self) {
        TENSORS.with(|m| {
            if let Ok(mut m) = m.try_borrow_mut() {
                m.remove(&self.id);
            }
        });
    }
}

/// Parse a dtype name (`f32`, `f16`, `i32`, `u32`, `bool`, `q8_0`, `q4_0`).
pub(crate) fn parse_dtype(name: &str) -> Result<DType, JsError> {
    DType::ALL
        .into_iter()
        .chain(DType::QUANTIZED)
        .find(|d| d.name() == name.to_ascii_lowercase())
        .ok_or_else(|| JsError::new(&format!("unknown dtype {name:?}: use f32, f16, i32, u32, bool, q8_0 or q4_0")))
}

impl JsTensor {
    /// Hand a checked engine tensor to JavaScript.
    pub(crate) fn wrap(t: Tensor) -> Result<JsTensor, JsError> {
        t.check().map_err(js_err)?;
        let id = NEXT_ID.with(|n| {
            let id = n.get();
            n.set(id.wrapping_add(1).max(1));
            id
        });
        TENSORS.with(|m| m.borrow_mut().insert(id, t));
        Ok(JsTensor { id })
    }

    /// The engine tensor, or an error if it was disposed.
    pub(crate) fn tensor(&self) -> Result<Tensor, JsError> {
        Self::by_id(self.id)
    }

    fn by_id(id: u32) -> Result<Tensor, JsError> {
        TENSORS.with(|m| m.borrow().get(&id).cloned()).ok_or_else(|| JsError::new("this Tensor was disposed"))
    }

    /// An optional `Tensor` argument (borrowed, not taken): `undefined` or `null` is `None`.
    pub(crate) fn optional(value: &JsValue, what: &str) -> Result<Option<Tensor>, JsError> {
        if value.is_undefined() || value.is_null() {
            return Ok(None);
        }
        Ok(Self::list(&Array::of1(value).into(), what)?.pop())
    }

    /// Tensors from a JavaScript array of `Tensor` objects (borrowed, not taken).
    pub(crate) fn list(value: &JsValue, what: &str) -> Result<Vec<Tensor>, JsError> {
        if !Array::is_array(value) {
            return Err(JsError::new(&format!("{what} must be an array of Tensors")));
        }
        let arr = Array::from(value);
        (0..arr.length())
            .map(|i| {
                let id = js::get(&arr.get(i), "__tesseraId")
                    .as_f64()
                    .ok_or_else(|| JsError::new(&format!("{what}[{i}] is not a Tensor")))?;
                Self::by_id(id as u32)
            })
            .collect()
    }

    fn map(&self, f: impl FnOnce(&Tensor) -> Tensor) -> Result<JsTensor, JsError> {
        JsTensor::wrap(f(&self.tensor()?))
    }
}

/// `options[key]` as `(rows, cols)`: a number for both, or a two-number array.
fn pair(options: &JsValue, key: &str, default: usize) -> Result<(usize, usize), JsError> {
    let v = js::get(options, key);
    if v.is_undefined() || v.is_null() {
        return Ok((default, default));
    }
    if let Some(n) = v.as_f64() {
        let n = js::integer(n, key)?;
        return usize::try_from(n).map(|n| (n, n)).map_err(|_| JsError::new(&format!("{key} must not be negative")));
    }
    match js::usizes(&v, key)?.as_slice() {
        [a, b] => Ok((*a, *b)),
        other => Err(JsError::new(&format!("{key} must be a number or [rows, cols], not {other:?}"))),
    }
}

/// Convolution options: `{ stride, padding, dilation, groups }`.
fn conv_options(options: &JsValue) -> Result<tessera::ops::nn::Conv2dOptions, JsError> {
    let groups = match js::get_f64(options, "groups") {
        Some(g) => usize::try_from(js::integer(g, "groups")?).map_err(|_| JsError::new("groups must be positive"))?,
        None => 1,
    };
    Ok(tessera::ops::nn::Conv2dOptions {
        stride: pair(options, "stride", 1)?,
        padding: pair(options, "padding", 0)?,
        dilation: pair(options, "dilation", 1)?,
        groups,
    })
}

fn dtype_or(dtype: Option<String>, default: DType) -> Result<DType, JsError> {
    dtype.map(|d| parse_dtype(&d)).transpose().map(|d| d.unwrap_or(default))
}

#[wasm_bindgen(js_class = Tensor)]
impl JsTensor {
    /// A tensor from data and a shape (default: one axis). `Int32Array` gives i32,
    /// `Uint32Array` u32, anything else (typed arrays, plain arrays of numbers) f32,
    /// unless `dtype` says otherwise; bool takes non-zero as true.
    #[wasm_bindgen(js_name = fromArray)]
    pub fn from_array(
        #[wasm_bindgen(unchecked_param_type = "ArrayLike<number>")] data: JsValue,
        #[wasm_bindgen(unchecked_param_type = "number[] | undefined")] shape: JsValue,
        #[wasm_bindgen(unchecked_param_type = "DType | undefined")] dtype: Option<String>,
    ) -> Result<JsTensor, JsError> {
        let dev = device()?;
        let natural = if data.is_instance_of::<Int32Array>() {
            DType::I32
        } else if data.is_instance_of::<Uint32Array>() {
            DType::U32
        } else {
            DType::F32
        };
        let dtype = dtype_or(dtype, natural)?;
        if dtype.is_quantized() {
            return Err(JsError::new("fromArray makes float tensors: create f32 and call quantize(\"q8_0\")"));
        }
        let len = js::get_f64(&data, "length").unwrap_or(0.0) as usize;
        let shape = if shape.is_undefined() || shape.is_null() { vec![len] } else { js::usizes(&shape, "shape")? };
        let t = match (
            dtype,
            data.dyn_ref::<Float32Array>(),
            data.dyn_ref::<Int32Array>(),
            data.dyn_ref::<Uint32Array>(),
        ) {
            (DType::F32, Some(a), _, _) => Tensor::from_slice(&a.to_vec(), shape, &dev),
            (DType::I32, _, Some(a), _) => Tensor::from_slice(&a.to_vec(), shape, &dev),
            (DType::U32, _, _, Some(a)) => Tensor::from_slice(&a.to_vec(), shape, &dev),
            _ => Tensor::from_f64(&js::numbers(&data, "data")?, shape, dtype, &dev),
        };
        JsTensor::wrap(t)
    }

    /// Zeros of a shape.
    pub fn zeros(
        #[wasm_bindgen(unchecked_param_type = "number[]")] shape: JsValue,
        #[wasm_bindgen(unchecked_param_type = "DType | undefined")] dtype: Option<String>,
    ) -> Result<JsTensor, JsError> {
        JsTensor::wrap(Tensor::zeros(js::usizes(&shape, "shape")?, dtype_or(dtype, DType::F32)?, &device()?))
    }

    /// Ones of a shape.
    pub fn ones(
        #[wasm_bindgen(unchecked_param_type = "number[]")] shape: JsValue,
        #[wasm_bindgen(unchecked_param_type = "DType | undefined")] dtype: Option<String>,
    ) -> Result<JsTensor, JsError> {
        JsTensor::wrap(Tensor::ones(js::usizes(&shape, "shape")?, dtype_or(dtype, DType::F32)?, &device()?))
    }

    /// A shape filled with one value.
    pub fn full(
        #[wasm_bindgen(unchecked_param_type = "number[]")] shape: JsValue,
        value: f64,
        #[wasm_bindgen(unchecked_param_type = "DType | undefined")] dtype: Option<String>,
    ) -> Result<JsTensor, JsError> {
        JsTensor::wrap(Tensor::full(value, js::usizes(&shape, "shape")?, dtype_or(dtype, DType::F32)?, &device()?))
    }

    /// `start, start + step, ...` below `end`.
    pub fn arange(
        start: f64,
        end: f64,
        step: Option<f64>,
        #[wasm_bindgen(unchecked_param_type = "DType | undefined")] dtype: Option<String>,
    ) -> Result<JsTensor, JsError> {
        JsTensor::wrap(Tensor::arange(start, end, step.unwrap_or(1.0), dtype_or(dtype, DType::F32)?, &device()?))
    }

    /// The `n x n` identity.
    pub fn eye(n: u32) -> Result<JsTensor, JsError> {
        JsTensor::wrap(Tensor::eye(n as usize, DType::F32, &device()?))
    }

    /// Uniform values in [0, 1) from a seed (the same values on every device).
    pub fn rand(
        #[wasm_bindgen(unchecked_param_type = "number[]")] shape: JsValue,
        seed: Option<f64>,
    ) -> Result<JsTensor, JsError> {
        JsTensor::wrap(Tensor::rand(js::usizes(&shape, "shape")?, seed.unwrap_or(0.0) as u64, &device()?))
    }

    /// Standard normal values from a seed (the same values on every device).
    pub fn randn(
        #[wasm_bindgen(unchecked_param_type = "number[]")] shape: JsValue,
        seed: Option<f64>,
    ) -> Result<JsTensor, JsError> {
        JsTensor::wrap(Tensor::randn(js::usizes(&shape, "shape")?, seed.unwrap_or(0.0) as u64, &device()?))
    }

    /// Where `cond` is true take `a`, else `b` (broadcasting).
    #[wasm_bindgen(js_name = where)]
    pub fn where_(cond: &JsTensor, a: &JsTensor, b: &JsTensor) -> Result<JsTensor, JsError> {
        JsTensor::wrap(Tensor::where_(&cond.tensor()?, &a.tensor()?, &b.tensor()?))
    }

    /// Join tensors along an existing axis.
    pub fn concat(
        #[wasm_bindgen(unchecked_param_type = "Tensor[]")] tensors: JsValue,
        axis: i32,
    ) -> Result<JsTensor, JsError> {
        JsTensor::wrap(Tensor::concat(&JsTensor::list(&tensors, "tensors")?, axis as isize))
    }

    /// Join tensors along a new axis.
    pub fn stack(
        #[wasm_bindgen(unchecked_param_type = "Tensor[]")] tensors: JsValue,
        axis: i32,
    ) -> Result<JsTensor, JsError> {
        JsTensor::wrap(Tensor::stack(&JsTensor::list(&tensors, "tensors")?, axis as isize))
    }

    /// The dimensions.
    #[wasm_bindgen(getter, unchecked_return_type = "number[]")]
    pub fn shape(&self) -> Result<JsValue, JsError> {
        let t = self.tensor()?;
        Ok(t.dims().iter().map(|&d| JsValue::from_f64(d as f64)).collect::<Array>().into())
    }

    /// The element type's name.
    #[wasm_bindgen(getter, unchecked_return_type = "DType")]
    pub fn dtype(&self) -> Result<String, JsError> {
        Ok(self.tensor()?.dtype().name().to_string())
    }

    /// The number of elements.
    #[wasm_bindgen(getter)]
    pub fn size(&self) -> Result<f64, JsError> {
        Ok(self.tensor()?.numel() as f64)
    }

    /// Registry id (internal: lets arrays of tensors be read without taking them).
    #[wasm_bindgen(getter, js_name = __tesseraId)]
    pub fn registry_id(&self) -> u32 {
        self.id
    }

    /// Whether `dispose()` was called.
    #[wasm_bindgen(getter)]
    pub fn disposed(&self) -> bool {
        TENSORS.with(|m| !m.borrow().contains_key(&self.id))
    }

    /// Drop this handle now instead of waiting for the garbage collector. Using it
    /// afterwards throws.
    pub fn dispose(&self) {
        TENSORS.with(|m| m.borrow_mut().remove(&self.id));
    }

    /// Run the graph and read the values: `Float32Array` for f32, f16 (widened) and
    /// quantised tensors (dequantised), `Int32Array`, `Uint32Array`, and `Uint8Array` (0
    /// or 1) for bool. Rejects with the error of any op in the graph, or a GPU error.
    #[wasm_bindgen(js_name = toArray, unchecked_return_type = "Promise<Float32Array | Int32Array | Uint32Array | Uint8Array>")]
    pub fn to_array(&self) -> Result<js_sys::Promise, JsError> {
        let t = self.tensor()?;
        Ok(wasm_bindgen_futures::future_to_promise(async move { read(t).await.map_err(|e| js_err(e).into()) }))
    }

    /// Compute the tensor and keep it where it lives, reading nothing back (one submit
    /// on WebGPU): inputs prepared before a timed loop, say. Rejects as `toArray` does.
    #[wasm_bindgen(unchecked_return_type = "Promise<void>")]
    pub fn realize(&self) -> Result<js_sys::Promise, JsError> {
        let t = self.tensor()?;
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            t.realize().await.map_err(js_err)?;
            Ok(JsValue::UNDEFINED)
        }))
    }

    /// The single value of a one-element tensor.
    #[wasm_bindgen(unchecked_return_type = "Promise<number>")]
    pub fn item(&self) -> Result<js_sys::Promise, JsError> {
        let t = self.tensor()?;
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let v = t.to_f64_vec().await.map_err(js_err)?;
            if v.len() != 1 {
                return Err(JsError::new(&format!("item() needs one element, the tensor has {}", v.len())).into());
            }
            Ok(JsValue::from_f64(v[0]))
        }))
    }

    /// Quantise to `q8_0` or `q4_0` on the GPU (GGUF's blocks; the last axis a multiple
    /// of 32), by the same algorithm as the native host quantiser.
    #[wasm_bindgen(unchecked_return_type = "Promise<Tensor>")]
    pub fn quantize(
        &self,
        #[wasm_bindgen(unchecked_param_type = "DType")] dtype: String,
    ) -> Result<js_sys::Promise, JsError> {
        let t = self.tensor()?;
        let dtype = parse_dtype(&dtype)?;
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let q = t.quantize(dtype);
            q.realize().await.map_err(js_err)?;
            Ok(JsTensor::wrap(q)?.into())
        }))
    }

    /// Convert to another dtype.
    pub fn cast(&self, #[wasm_bindgen(unchecked_param_type = "DType")] dtype: String) -> Result<JsTensor, JsError> {
        let d = parse_dtype(&dtype)?;
        self.map(|t| t.cast(d))
    }

    /// Clamp into `[min, max]`.
    pub fn clamp(&self, min: f64, max: f64) -> Result<JsTensor, JsError> {
        self.map(|t| t.clamp(min, max))
    }

    /// Matrix product with numpy broadcasting of batch axes.
    pub fn matmul(&self, other: &JsTensor) -> Result<JsTensor, JsError> {
        let o = other.tensor()?;
        self.map(|t| t.matmul(&o))
    }

    /// The same elements in a new shape (one axis may be -1).
    pub fn reshape(
        &self,
        #[wasm_bindgen(unchecked_param_type = "number[]")] shape: JsValue,
    ) -> Result<JsTensor, JsError> {
        let t = self.tensor()?;
        let dims = js::isizes(&shape, "shape")?;
        let known: usize = dims.iter().filter(|&&d| d >= 0).map(|&d| d as usize).product();
        let inferred = dims.iter().filter(|&&d| d == -1).count();
        if dims.iter().any(|&d| d < -1) || inferred > 1 {
            return Err(JsError::new(&format!("reshape: bad shape {dims:?} (one -1 at most, others >= 0)")));
        }
        let fill = t.numel().checked_div(known).unwrap_or(0);
        let shape: Vec<usize> = dims.iter().map(|&d| if d == -1 { fill } else { d as usize }).collect();
        JsTensor::wrap(t.reshape(shape))
    }

    /// Reorder the axes.
    pub fn permute(
        &self,
        #[wasm_bindgen(unchecked_param_type = "number[]")] perm: JsValue,
    ) -> Result<JsTensor, JsError> {
        let p = js::usizes(&perm, "perm")?;
        self.map(|t| t.permute(&p))
    }

    /// Swap two axes.
    pub fn transpose(&self, a: i32, b: i32) -> Result<JsTensor, JsError> {
        self.map(|t| t.transpose(a as isize, b as isize))
    }

    /// Swap the last two axes.
    pub fn t(&self) -> Result<JsTensor, JsError> {
        self.map(|t| t.t())
    }

    /// Broadcast to a shape.
    #[wasm_bindgen(js_name = broadcastTo)]
    pub fn broadcast_to(
        &self,
        #[wasm_bindgen(unchecked_param_type = "number[]")] shape: JsValue,
    ) -> Result<JsTensor, JsError> {
        let s = js::usizes(&shape, "shape")?;
        self.map(|t| t.broadcast_to(s))
    }

    /// All elements in one axis.
    pub fn flatten(&self) -> Result<JsTensor, JsError> {
        self.map(|t| t.flatten())
    }

    /// Insert an axis of size 1.
    pub fn unsqueeze(&self, axis: i32) -> Result<JsTensor, JsError> {
        self.map(|t| t.unsqueeze(axis as isize))
    }

    /// Remove an axis of size 1.
    pub fn squeeze(&self, axis: i32) -> Result<JsTensor, JsError> {
        self.map(|t| t.squeeze(axis as isize))
    }

    /// Python-style `start:end:step` on one axis (negative indices count from the end).
    pub fn slice(&self, axis: i32, start: i32, end: i32, step: Option<u32>) -> Result<JsTensor, JsError> {
        self.map(|t| t.slice(axis as isize, start as isize, end as isize, step.unwrap_or(1) as usize))
    }

    /// `len` elements of one axis from `start`.
    pub fn narrow(&self, axis: i32, start: u32, len: u32) -> Result<JsTensor, JsError> {
        self.map(|t| t.narrow(axis as isize, start as usize, len as usize))
    }

    /// Rows (or entries of `axis`) picked by an integer index tensor.
    #[wasm_bindgen(js_name = indexSelect)]
    pub fn index_select(&self, axis: i32, index: &JsTensor) -> Result<JsTensor, JsError> {
        let i = index.tensor()?;
        self.map(|t| t.index_select(axis as isize, &i))
    }

    /// `out[..., j, ...] = x[..., index[..., j, ...], ...]` along `axis`.
    pub fn gather(&self, axis: i32, index: &JsTensor) -> Result<JsTensor, JsError> {
        let i = index.tensor()?;
        self.map(|t| t.gather(axis as isize, &i))
    }

    /// Softmax along an axis.
    pub fn softmax(&self, axis: i32) -> Result<JsTensor, JsError> {
        self.map(|t| t.softmax(axis as isize))
    }

    /// Log-softmax along an axis.
    #[wasm_bindgen(js_name = logSoftmax)]
    pub fn log_softmax(&self, axis: i32) -> Result<JsTensor, JsError> {
        self.map(|t| t.log_softmax(axis as isize))
    }

    /// Layer norm over the last axis (no affine; multiply and add for one).
    #[wasm_bindgen(js_name = layerNorm)]
    pub fn layer_norm(&self, eps: Option<f64>) -> Result<JsTensor, JsError> {
        self.map(|t| t.layer_norm(None, None, eps.unwrap_or(1e-5)))
    }

    /// RMS norm over the last axis.
    #[wasm_bindgen(js_name = rmsNorm)]
    pub fn rms_norm(&self, eps: Option<f64>) -> Result<JsTensor, JsError> {
        self.map(|t| t.rms_norm(None, eps.unwrap_or(1e-6)))
    }

    /// 2-D convolution (PyTorch's `conv2d`): this `[N, C, H, W]`, `weight`
    /// `[O, C/groups, KH, KW]`, optional `bias` `[O]`. Options: `stride`, `padding`,
    /// `dilation` (a number or `[rows, cols]`) and `groups`.
    pub fn conv2d(
        &self,
        weight: &JsTensor,
        #[wasm_bindgen(unchecked_param_type = "Tensor | undefined")] bias: JsValue,
        #[wasm_bindgen(unchecked_param_type = "ConvOptions | undefined")] options: JsValue,
    ) -> Result<JsTensor, JsError> {
        let (w, b) = (weight.tensor()?, JsTensor::optional(&bias, "bias")?);
        let o = conv_options(&options)?;
        self.map(|x| x.conv2d(&w, b.as_ref(), o))
    }

    /// 2-D transposed convolution (PyTorch's `conv_transpose2d`): `weight`
    /// `[C, O/groups, KH, KW]`; options as `conv2d` plus `outputPadding`.
    #[wasm_bindgen(js_name = convTranspose2d)]
    pub fn conv_transpose2d(
        &self,
        weight: &JsTensor,
        #[wasm_bindgen(unchecked_param_type = "Tensor | undefined")] bias: JsValue,
        #[wasm_bindgen(unchecked_param_type = "ConvOptions | undefined")] options: JsValue,
    ) -> Result<JsTensor, JsError> {
        let (w, b) = (weight.tensor()?, JsTensor::optional(&bias, "bias")?);
        let o = conv_options(&options)?;
        let op = pair(&options, "outputPadding", 0)?;
        self.map(|x| x.conv_transpose2d(&w, b.as_ref(), o, op))
    }

    /// Max pooling over `k x k` windows of `[N, C, H, W]` (stride defaults to `k`,
    /// padding, with -inf, to 0).
    #[wasm_bindgen(js_name = maxPool2d)]
    pub fn max_pool2d(&self, k: u32, stride: Option<u32>, padding: Option<u32>) -> Result<JsTensor, JsError> {
        self.map(|x| x.max_pool2d(k as usize, stride.unwrap_or(k) as usize, padding.unwrap_or(0) as usize))
    }

    /// Average pooling over `k x k` windows (stride defaults to `k`; zero padding counts).
    #[wasm_bindgen(js_name = avgPool2d)]
    pub fn avg_pool2d(&self, k: u32, stride: Option<u32>, padding: Option<u32>) -> Result<JsTensor, JsError> {
        self.map(|x| x.avg_pool2d(k as usize, stride.unwrap_or(k) as usize, padding.unwrap_or(0) as usize))
    }

    /// Attention `softmax(q k^T / sqrt(d)) v` over `[..., seq, dim]` tensors, with this
    /// tensor as `q`; `fused` runs the flash-style kernel where the inputs allow.
    #[wasm_bindgen(js_name = scaledDotProductAttention)]
    pub fn scaled_dot_product_attention(
        &self,
        k: &JsTensor,
        v: &JsTensor,
        causal: Option<bool>,
        fused: Option<bool>,
    ) -> Result<JsTensor, JsError> {
        let (k, v, causal) = (k.tensor()?, v.tensor()?, causal.unwrap_or(false));
        if fused.unwrap_or(false) {
            self.map(|q| Tensor::scaled_dot_product_attention_fused(q, &k, &v, None, causal))
        } else {
            self.map(|q| Tensor::scaled_dot_product_attention(q, &k, &v, None, causal))
        }
    }
}

// The docs of the macro-made methods are written as #[doc = "..."]: inside a macro
// invocation `///` becomes a raw string, which wasm-bindgen would copy into the .d.ts
// with its `r"` prefix.
macro_rules! reductions {
    ($($(#[doc = $doc:literal])* $name:ident, $all:ident;)*) => {
        #[wasm_bindgen(js_class = Tensor)]
        impl JsTensor {
            $(
                $(#[doc = $doc])*
                #[doc = "`axes`: a number, a non-empty array, or undefined for every element (a scalar)."]
                pub fn $name(
                    &self,
                    #[wasm_bindgen(unchecked_param_type = "number | number[] | undefined")] axes: JsValue,
                    keepdim: Option<bool>,
                ) -> Result<JsTensor, JsError> {
                    if axes.is_undefined() || axes.is_null() {
                        return self.map(|t| t.$all());
                    }
                    let axes = js::isizes(&axes, "axes")?;
                    self.map(|t| t.$name(&axes, keepdim.unwrap_or(false)))
                }
            )*
        }
    };
}

reductions! {
    #[doc = "Sum over axes."]
    sum, sum_all;
    #[doc = "Mean over axes."]
    mean, mean_all;
    #[doc = "Maximum over axes."]
    max, max_all;
    #[doc = "Minimum over axes."]
    min, min_all;
    #[doc = "Index of the maximum over axes (i32; over every element, counted row-major)."]
    argmax, argmax_all;
    #[doc = "Index of the minimum over axes (i32)."]
    argmin, argmin_all;
    #[doc = "Unbiased variance over axes (PyTorch's default correction of 1)."]
    var, var_all;
}

macro_rules! unary {
    ($($(#[doc = $doc:literal])* $js:ident => $name:ident;)*) => {
        #[wasm_bindgen(js_class = Tensor)]
        impl JsTensor {
            $(
                $(#[doc = $doc])*
                #[wasm_bindgen(js_name = $js)]
                pub fn $name(&self) -> Result<JsTensor, JsError> {
                    self.map(|t| t.$name())
                }
            )*
        }
    };
}

unary! {
    #[doc = "`-x`."]
    neg => neg;
    #[doc = "`|x|`."]
    abs => abs;
    #[doc = "`e^x`."]
    exp => exp;
    #[doc = "Natural log."]
    log => log;
    #[doc = "Square root."]
    sqrt => sqrt;
    #[doc = "`1 / sqrt(x)`."]
    rsqrt => rsqrt;
    #[doc = "Sine."]
    sin => sin;
    #[doc = "Cosine."]
    cos => cos;
    #[doc = "Hyperbolic tangent."]
    tanh => tanh;
    #[doc = "Logistic sigmoid."]
    sigmoid => sigmoid;
    #[doc = "`max(x, 0)`."]
    relu => relu;
    #[doc = "GELU (erf form)."]
    gelu => gelu;
    #[doc = "GELU (tanh approximation)."]
    geluTanh => gelu_tanh;
    #[doc = "`x * sigmoid(x)`."]
    silu => silu;
    #[doc = "`x * x`."]
    square => square;
    #[doc = "Round down."]
    floor => floor;
    #[doc = "Round up."]
    ceil => ceil;
}

macro_rules! binary {
    ($($(#[doc = $doc:literal])* $js:ident, $js_scalar:ident => $name:ident, $scalar:ident;)*) => {
        #[wasm_bindgen(js_class = Tensor)]
        impl JsTensor {
            $(
                $(#[doc = $doc])*
                #[doc = "Broadcasts like numpy."]
                #[wasm_bindgen(js_name = $js)]
                pub fn $name(&self, other: &JsTensor) -> Result<JsTensor, JsError> {
                    let o = other.tensor()?;
                    self.map(|t| t.$name(&o))
                }

                $(#[doc = $doc])*
                #[doc = "With a number."]
                #[wasm_bindgen(js_name = $js_scalar)]
                pub fn $scalar(&self, value: f64) -> Result<JsTensor, JsError> {
                    self.map(|t| t.$scalar(value))
                }
            )*
        }
    };
}

binary! {
    #[doc = "Element-wise sum."]
    add, addScalar => add, add_scalar;
    #[doc = "Element-wise difference."]
    sub, subScalar => sub, sub_scalar;
    #[doc = "Element-wise product."]
    mul, mulScalar => mul, mul_scalar;
    #[doc = "Element-wise quotient."]
    div, divScalar => div, div_scalar;
    #[doc = "Element-wise maximum."]
    maximum, maximumScalar => maximum, maximum_scalar;
    #[doc = "Element-wise minimum."]
    minimum, minimumScalar => minimum, minimum_scalar;
    #[doc = "Element-wise power."]
    pow, powScalar => pow, pow_scalar;
    #[doc = "Equality mask (bool)."]
    eq, eqScalar => eq, eq_scalar;
    #[doc = "Inequality mask (bool)."]
    ne, neScalar => ne, ne_scalar;
    #[doc = "`x < y` mask (bool)."]
    lt, ltScalar => lt, lt_scalar;
    #[doc = "`x <= y` mask (bool)."]
    le, leScalar => le, le_scalar;
    #[doc = "`x > y` mask (bool)."]
    gt, gtScalar => gt, gt_scalar;
    #[doc = "`x >= y` mask (bool)."]
    ge, geScalar => ge, ge_scalar;
}

/// Read a tensor as the typed array for its dtype.
pub(crate) async fn read(t: Tensor) -> tessera::Result<JsValue> {
    Ok(match t.dtype() {
        // The mapped bytes copied once, in JavaScript, then viewed as the typed array.
        DType::F32 | DType::I32 | DType::U32 => {
            let n = t.numel() as u32;
            let bytes = t.to_js_bytes().await?.buffer();
            match t.dtype() {
                DType::F32 => Float32Array::new_with_byte_offset_and_length(&bytes, 0, n).into(),
                DType::I32 => Int32Array::new_with_byte_offset_and_length(&bytes, 0, n).into(),
                _ => Uint32Array::new_with_byte_offset_and_length(&bytes, 0, n).into(),
            }
        }
        DType::Bool => Uint8Array::from(&t.to_le_bytes().await?[..]).into(),
        _ => {
            let v: Vec<f32> = t.to_f64_vec().await?.into_iter().map(|x| x as f32).collect();
            Float32Array::from(&v[..]).into()
        }
    })
}
