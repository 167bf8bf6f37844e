//! `Tensor`, the user's handle: a cheap-to-clone reference to a node of the lazy graph.
//! The ops are its methods, one file per family under `src/ops/`.

use crate::device::{Device, Storage};
use crate::graph::Op;
use crate::{DType, Element, Error, Result, Shape};
use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One node of the lazy graph.
pub struct Node {
    /// Unique id (process-wide).
    pub id: u64,
    /// What this node computes.
    pub op: Op,
    /// Its inputs, in the op's order.
    pub inputs: Vec<Tensor>,
    /// Checked output shape.
    pub shape: Shape,
    /// Checked output dtype.
    pub dtype: DType,
    /// Where the user called the op.
    pub location: &'static Location<'static>,
    pub(crate) device: Device,
    /// The first error found while building this node or any node under it.
    pub(crate) error: Option<Error>,
    /// The realised value, once computed.
    pub(crate) storage: Mutex<Option<Storage>>,
    /// Marked as a gradient target ([`Tensor::requires_grad`]).
    pub(crate) requires_grad: AtomicBool,
    /// Built inside a [`crate::no_grad`] scope (or by `detach`): backward stops here.
    pub(crate) no_grad: bool,
}

impl Drop for Node {
    // Drop long chains iteratively so a deep graph cannot overflow the stack.
    fn drop(&mut self) {
        let mut stack = std::mem::take(&mut self.inputs);
        while let Some(t) = stack.pop() {
            if let Ok(mut node) = Arc::try_unwrap(t.0) {
                stack.append(&mut node.inputs);
            }
        }
    }
}

/// A lazy, reference-counted n-dimensional array on a [`Device`].
///
/// Ops record nodes and check shapes and dtypes at once; errors are carried by the
/// result and returned when values are requested. Cloning is cheap.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Node>);

impl Tensor {
    /// Build a node; the first error carried by an input propagates.
    pub(crate) fn make_at(
        op: Op,
        inputs: Vec<Tensor>,
        shape: Shape,
        dtype: DType,
        device: &Device,
        location: &'static Location<'static>,
    ) -> Tensor {
        let error = inputs.iter().find_map(|t| t.0.error.clone());
        Tensor(Arc::new(Node {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            op,
            inputs,
            shape,
            dtype,
            location,
            device: device.clone(),
            error,
            storage: Mutex::new(None),
            requires_grad: AtomicBool::new(false),
            no_grad: !crate::autograd::grad_enabled(),
        }))
    }

    /// A tensor that carries `err` (shape and dtype of `like`, no inputs).
    pub(crate) fn failed(err: Error, like_dtype: DType, device: &Device) -> Tensor {
        let location = err.location().unwrap_or(Location::caller());
        Tensor(Arc::new(Node {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            op: Op::Full { value: 0.0 },
            inputs: Vec::new(),
            shape: Shape::default(),
            dtype: like_dtype,
            location,
            device: device.clone(),
            error: Some(err),
            storage: Mutex::new(None),
            requires_grad: AtomicBool::new(false),
            no_grad: true,
        }))
    }

    /// A realised tensor holding `storage`.
    pub(crate) fn from_storage(storage: Storage, shape: Shape, dtype: DType, device: &Device) -> Tensor {
        let t = Tensor::make_at(Op::Input, Vec::new(), shape, dtype, device, Location::caller());
        *t.0.storage.lock().unwrap_or_else(|e| e.into_inner()) = Some(storage);
        t
    }

    /// `Ok(t)` becomes `t`; `Err(e)` becomes a tensor carrying `e`.
    pub(crate) fn lift(&self, r: Result<Tensor>) -> Tensor {
        r.unwrap_or_else(|e| Tensor::failed(e, self.dtype(), self.device()))
    }

    pub(crate) fn node(&self) -> &Node {
        &self.0
    }

    /// Process-wide unique id of this node.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0.shape.0
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.0.shape
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.shape.rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.shape.numel()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// Bytes this tensor's buffer occupies on a device (whole 4-byte words, at least one).
    pub fn storage_bytes(&self) -> u64 {
        self.0.dtype.buffer_bytes(self.numel())
    }

    /// The device this tensor lives on.
    pub fn device(&self) -> &Device {
        &self.0.device
    }

    /// The op that produces this tensor.
    pub fn op(&self) -> &Op {
        &self.0.op
    }

    /// Where the op producing this tensor was called.
    pub fn location(&self) -> &'static Location<'static> {
        self.0.location
    }

    /// The first error recorded while building this tensor, if any. Realising returns it.
    pub fn error(&self) -> Option<&Error> {
        self.0.error.as_ref()
    }

    /// `Err` with the recorded error, or `Ok(())`.
    #[inline(never)]
    pub fn check(&self) -> Result<()> {
        match &self.0.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Whether the value has been computed and is held.
    pub fn is_realized(&self) -> bool {
        self.0.storage.lock().map(|s| s.is_some()).unwrap_or(false)
    }

    pub(crate) fn storage(&self) -> Option<Storage> {
        self.0.storage.lock().ok().and_then(|s| s.clone())
    }

    /// Take the storage out (the tensor is unrealised until it is set again).
    pub(crate) fn take_storage(&self) -> Option<Storage> {
        self.0.storage.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub(crate) fn set_storage(&self, s: Storage) {
        *self.0.storage.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }

    /// Compute this tensor's value and keep it on the device, without reading it back.
    pub async fn realize(&self) -> Result<()> {
        self.device().realize(std::slice::from_ref(self)).await
    }

    /// Read the values back, in row-major order. `T` must match the dtype.
    pub async fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_element::<T>()?;
        let bytes = self.device().read_bytes_of(self).await?;
        Ok(crate::dtype::decode_as(&bytes, self.numel()))
    }

    /// Read the values back as little-endian bytes of the tensor's element type, in
    /// row-major order (numpy's `tobytes`): 4 per f32, i32 or u32, 2 per f16, 1 per bool
    /// (0 or 1). A page wraps them in a typed array without a per-element loop.
    /// Quantised tensors have no element bytes: dequantise them first (`cast`).
    pub async fn to_le_bytes(&self) -> Result<Vec<u8>> {
        self.check()?;
        let dtype = self.dtype();
        if dtype.is_quantized() {
            return Err(Error::DType {
                op: "to_le_bytes",
                dtypes: vec![dtype],
                detail: "a quantised tensor has blocks, not element bytes: cast it to f32 first".into(),
                location: self.location(),
            });
        }
        let n = self.numel();
        let mut b = self.device().read_bytes_of(self).await?;
        if dtype == DType::Bool {
            // Device storage holds a bool as a u32.
            return Ok(b.chunks_exact(4).take(n).map(|w| u8::from(w != [0, 0, 0, 0])).collect());
        }
        b.truncate(n * dtype.size_in_bytes());
        Ok(b)
    }

    /// `to_le_bytes` for a page: the bytes of an f32, i32 or u32 tensor as a JavaScript
    /// array, read from WebGPU without passing through wasm memory (a typed array views
    /// its buffer without a copy).
    #[cfg(target_arch = "wasm32")]
    pub async fn to_js_bytes(&self) -> Result<js_sys::Uint8Array> {
        self.check()?;
        let dtype = self.dtype();
        if !matches!(dtype, DType::F32 | DType::I32 | DType::U32) {
            return Err(Error::DType {
                op: "to_js_bytes",
                dtypes: vec![dtype],
                detail: "JavaScript bytes are read for 32-bit element types; use to_le_bytes".into(),
                location: self.location(),
            });
        }
        let a = self.device().read_js_bytes_of(self).await?;
        Ok(a.subarray(0, (self.numel() * 4) as u32))
    }

    /// Read the values back as f64, whatever the dtype (bool as 0/1).
    pub async fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let mut v = self.device().read(std::slice::from_ref(self)).await?;
        Ok(v.pop().unwrap_or_default())
    }

    /// The single value of a one-element tensor.
    pub async fn item<T: Element>(&self) -> Result<T> {
        let v = self.to_vec::<T>().await?;
        if v.len() != 1 {
            return Err(Error::Shape {
                op: "item",
                shapes: vec![self.dims().to_vec()],
                detail: "item() needs exactly one element".into(),
                location: Location::caller(),
            });
        }
        Ok(v[0])
    }

    fn check_element<T: Element>(&self) -> Result<()> {
        self.check()?;
        if T::DTYPE != self.dtype() {
            return Err(Error::DType {
                op: "to_vec",
                dtypes: vec![self.dtype(), T::DTYPE],
                detail: format!("a {} tensor read as {}", self.dtype(), T::DTYPE),
                location: Location::caller(),
            });
        }
        Ok(())
    }

    /// Blocking `realize` (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn realize_blocking(&self) -> Result<()> {
        pollster::block_on(self.realize())
    }

    /// Blocking `to_vec` (native only; browsers cannot block).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn to_vec_blocking<T: Element>(&self) -> Result<Vec<T>> {
        pollster::block_on(self.to_vec())
    }

    /// Blocking `to_f64_vec` (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn to_f64_vec_blocking(&self) -> Result<Vec<f64>> {
        pollster::block_on(self.to_f64_vec())
    }

    /// Blocking `item` (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn item_blocking<T: Element>(&self) -> Result<T> {
        pollster::block_on(self.item())
    }

    /// The graph under this tensor as Graphviz DOT, one node per op (before fusion).
    pub fn to_dot(&self) -> String {
        crate::graph::dot::graph_dot(std::slice::from_ref(self))
    }

    /// The graph under this tensor as Graphviz DOT after fusion: one cluster per kernel.
    pub fn to_dot_fused(&self) -> String {
        let max = self.device().max_kernel_inputs();
        let d = self.device();
        let f16_out = d.is_cpu() || d.capabilities().shader_f16;
        crate::graph::dot::schedule_dot(std::slice::from_ref(self), max, d.implicit_gemm(), f16_out, !d.is_cpu())
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor(id={}, op={}, shape={:?}, dtype={}{})",
            self.id(),
            self.op().name(),
            self.dims(),
            self.dtype(),
            if self.is_realized() { ", realized" } else { "" }
        )
    }
}

/// Read several tensors with one realisation (one submit), blocking (native only).
#[cfg(not(target_arch = "wasm32"))]
pub fn read_all_blocking(tensors: &[Tensor]) -> Result<Vec<Vec<f64>>> {
    pollster::block_on(read_all(tensors))
}

/// Read several tensors with one realisation (one submit).
pub async fn read_all(tensors: &[Tensor]) -> Result<Vec<Vec<f64>>> {
    let Some(first) = tensors.first() else {
        return Ok(Vec::new());
    };
    first.device().read(tensors).await
}
