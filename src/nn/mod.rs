//! Neural-network modules, losses and initialisers built from Tensor ops.
//!
//! A [`Module`] shows its state to visitors: trainable parameters, buffers (running
//! statistics) and child modules, each by name. `#[derive(Module)]` writes that from
//! the fields. Names follow PyTorch's state-dict convention (`0.weight`,
//! `encoder.layers.1.linear1.bias`), so a module saves to and loads from safetensors and
//! PyTorch's own state dicts. [`Layer`] adds `forward` for modules that map one tensor to
//! one tensor.

pub mod attention;
pub mod conv;
pub mod init;
pub mod layers;
pub mod loss;
pub mod sparse;

pub use attention::{MultiHeadAttention, TransformerEncoderLayer};
pub use conv::{AvgPool2d, BatchNorm2d, Conv2d, ConvTranspose2d, MaxPool2d};
pub use layers::{Activation, Dropout, Embedding, Flatten, LayerNorm, Linear, RMSNorm, Sequential};
pub use sparse::{BagMode, Bags, EmbeddingBag, SparseGrad};

use crate::{Error, Result, Tensor};
use std::collections::HashMap;

/// `#[derive(Module)]`: a module's parameters, buffers and children from its fields
/// (`#[module(buffer)]`, `#[module(skip)]`, `#[module(rename = "...")]`).
pub use tessera_derive::Module;

/// What a named tensor of a module is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Trained by the optimiser.
    Parameter,
    /// State that is not trained (BatchNorm's running statistics).
    Buffer,
}

/// Sees a module's tensors and children, read-only: what `state_dict`, `named_parameters`
/// and `num_parameters` are built on.
pub trait Visitor {
    /// A tensor of the module being visited, under its own name (no prefix).
    fn tensor(&mut self, name: &str, t: &Tensor, role: Role);
    /// A child module under `name`; the visitor decides whether to descend (call
    /// `m.visit(self)`).
    fn module(&mut self, name: &str, m: &dyn Module);
}

/// Sees a module's tensors and children mutably: what loading state and optimiser
/// updates are built on. `'a` is the borrow of the module being visited.
pub trait VisitorMut<'a> {
    /// A tensor of the module being visited, under its own name.
    fn tensor(&mut self, name: &str, t: &'a mut Tensor, role: Role);
    /// A child module under `name`.
    fn module(&mut self, name: &str, m: &'a mut dyn Module);
}

/// One named tensor of a module's state, borrowed mutably (optimisers replace it).
pub struct Slot<'a> {
    /// Full state-dict name.
    pub name: String,
    /// The tensor; an optimiser replaces it with the updated value.
    pub tensor: &'a mut Tensor,
    /// Trainable parameter (`true`) or buffer such as a running mean (`false`).
    pub trainable: bool,
}

/// `prefix.name`, or `name` when the prefix is empty.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// A module's state by full name, in the order the module holds it (PyTorch's
/// `OrderedDict`): what `state_dict` returns and `load_state_dict` takes. Build one from
/// any `(name, tensor)` pairs (a loaded safetensors or GGUF file's tensors, say).
#[derive(Clone, Default)]
pub struct StateDict {
    entries: Vec<(String, Tensor)>,
    index: HashMap<String, usize>,
}

impl StateDict {
    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.index.get(name).map(|&i| &self.entries[i].1)
    }

    /// Add or replace `name`.
    pub fn insert(&mut self, name: impl Into<String>, t: Tensor) {
        let name = name.into();
        match self.index.get(&name) {
            Some(&i) => self.entries[i].1 = t,
            None => {
                self.index.insert(name.clone(), self.entries.len());
                self.entries.push((name, t));
            }
        }
    }

    /// The names, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    /// `(name, tensor)` pairs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.entries.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl FromIterator<(String, Tensor)> for StateDict {
    fn from_iter<I: IntoIterator<Item = (String, Tensor)>>(iter: I) -> Self {
        let mut d = StateDict::default();
        for (n, t) in iter {
            d.insert(n, t);
        }
        d
    }
}

impl From<HashMap<String, Tensor>> for StateDict {
    /// Entries sorted by name (a map has no order of its own).
    fn from(map: HashMap<String, Tensor>) -> Self {
        let mut v: Vec<_> = map.into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.into_iter().collect()
    }
}

impl IntoIterator for StateDict {
    type Item = (String, Tensor);
    type IntoIter = std::vec::IntoIter<(String, Tensor)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl std::fmt::Debug for StateDict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.entries.iter().map(|(n, t)| (n, (t.dtype(), t.dims())))).finish()
    }
}

/// What a non-strict [`Module::load_state_dict`] did not match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// The module's tensors the dict had no entry for (they keep their values).
    pub missing: Vec<String>,
    /// The dict's entries the module has no tensor for.
    pub unexpected: Vec<String>,
}

/// `Send + Sync` on native targets; nothing in the browser, where GPU handles are not
/// thread-safe (wasm is single-threaded).
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSync: Send + Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + Sync> MaybeSync for T {}
/// `Send + Sync` on native targets; nothing in the browser.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSync {}
#[cfg(target_arch = "wasm32")]
impl<T> MaybeSync for T {}

/// Something with named state: parameters, buffers and child modules, as PyTorch's
/// `nn.Module`. Implement it with `#[derive(Module)]`:
///
/// ```
/// use tessera::nn::{Layer, Linear, Module};
/// use tessera::{Device, Tensor};
///
/// #[derive(Module)]
/// struct Mlp {
///     fc1: Linear,
///     fc2: Linear,
///     #[module(buffer)]
///     scale: Tensor,
///     hidden: usize, // neither a tensor nor a module: not state
/// }
///
/// let d = Device::cpu();
/// let m = Mlp {
///     fc1: Linear::new(4, 8, true, 1, &d),
///     fc2: Linear::new(8, 2, true, 2, &d),
///     scale: Tensor::ones([2], tessera::DType::F32, &d),
///     hidden: 8,
/// };
/// let names: Vec<String> = m.state_dict().keys().map(String::from).collect();
/// assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "scale"]);
/// assert_eq!(m.num_parameters(), 4 * 8 + 8 + 8 * 2 + 2);
/// ```
///
/// or by hand, naming each tensor and child once:
///
/// ```
/// use tessera::nn::{Linear, Module, Role, Visitor, VisitorMut};
/// use tessera::Tensor;
///
/// struct Scaled {
///     inner: Linear,
///     gain: Tensor,
/// }
///
/// impl Module for Scaled {
///     fn visit(&self, v: &mut dyn Visitor) {
///         v.module("inner", &self.inner);
///         v.tensor("gain", &self.gain, Role::Parameter);
///     }
///     fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>) {
///         v.module("inner", &mut self.inner);
///         v.tensor("gain", &mut self.gain, Role::Parameter);
///     }
/// }
/// ```
pub trait Module: MaybeSync {
    /// Show every tensor and child to `v`, each under its own name.
    fn visit(&self, v: &mut dyn Visitor);

    /// The same, mutably.
    fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>);

    /// Switch between training and evaluation behaviour (dropout, batch norm). The
    /// default passes the switch to every child; modules with a mode of their own
    /// override it.
    fn set_training(&mut self, training: bool) {
        struct Mode(bool);
        impl<'a> VisitorMut<'a> for Mode {
            fn tensor(&mut self, _: &str, _: &'a mut Tensor, _: Role) {}
            fn module(&mut self, _: &str, m: &'a mut dyn Module) {
                m.set_training(self.0);
            }
        }
        self.visit_mut(&mut Mode(training));
    }

    /// Sparse lookups this module itself (not its children) recorded since the last
    /// optimiser step; see [`sparse::take_sparse_lookups`].
    fn own_sparse_lookups(&self) -> Vec<sparse::SparseLookup> {
        Vec::new()
    }

    /// Trainable parameters with their full names.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        tensors(self).into_iter().filter(|(_, _, r)| *r == Role::Parameter).map(|(n, t, _)| (n, t)).collect()
    }

    /// Buffers (untrained state) with their full names.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        tensors(self).into_iter().filter(|(_, _, r)| *r == Role::Buffer).map(|(n, t, _)| (n, t)).collect()
    }

    /// The trainable parameters.
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }

    /// Every parameter and buffer by full name (`fc1.weight`, `0.bias`), in order.
    fn state_dict(&self) -> StateDict {
        tensors(self).into_iter().map(|(n, t, _)| (n, t)).collect()
    }

    /// Number of trainable scalars.
    fn num_parameters(&self) -> usize {
        self.named_parameters().iter().map(|(_, t)| t.numel()).sum()
    }

    /// Every tensor as a mutable [`Slot`] with its full name (what optimisers update).
    fn slots(&mut self) -> Vec<Slot<'_>> {
        struct Collect<'a> {
            prefix: Vec<String>,
            out: Vec<Slot<'a>>,
        }
        impl<'a> VisitorMut<'a> for Collect<'a> {
            fn tensor(&mut self, name: &str, t: &'a mut Tensor, role: Role) {
                let name = join(&self.prefix.join("."), name);
                self.out.push(Slot { name, tensor: t, trainable: role == Role::Parameter });
            }
            fn module(&mut self, name: &str, m: &'a mut dyn Module) {
                if !name.is_empty() {
                    self.prefix.push(name.to_string());
                }
                m.visit_mut(self);
                if !name.is_empty() {
                    self.prefix.pop();
                }
            }
        }
        let mut c = Collect { prefix: Vec::new(), out: Vec::new() };
        self.visit_mut(&mut c);
        c.out
    }

    /// Replace the module's tensors with the dict's entries of the same name, as
    /// PyTorch's `load_state_dict`. Every matched entry must have the tensor's shape
    /// and dtype (a mismatch is an error naming the key). With `strict`, a missing or
    /// unexpected key is an error too; without, they are returned and the missing
    /// tensors keep their values. Nothing changes unless the whole load succeeds.
    fn load_state_dict(&mut self, state: &StateDict, strict: bool) -> Result<LoadReport> {
        let mut slots = self.slots();
        let mut report = LoadReport::default();
        for s in &slots {
            match state.get(&s.name) {
                None => report.missing.push(s.name.clone()),
                Some(t) if t.dims() != s.tensor.dims() || t.dtype() != s.tensor.dtype() => {
                    return Err(Error::Format {
                        format: "state dict",
                        detail: format!(
                            "{}: the dict holds {} {:?}, the module {} {:?}",
                            s.name,
                            t.dtype(),
                            t.dims(),
                            s.tensor.dtype(),
                            s.tensor.dims()
                        ),
                    });
                }
                Some(_) => {}
            }
        }
        report.unexpected = state.keys().filter(|k| !slots.iter().any(|s| s.name == *k)).map(String::from).collect();
        if strict && (!report.missing.is_empty() || !report.unexpected.is_empty()) {
            return Err(Error::Format {
                format: "state dict",
                detail: format!("missing keys {:?}, unexpected keys {:?}", report.missing, report.unexpected),
            });
        }
        for s in slots.iter_mut() {
            if let Some(t) = state.get(&s.name) {
                *s.tensor = if s.trainable { t.detach().requires_grad() } else { t.detach() };
            }
        }
        Ok(report)
    }
}

/// Every tensor of `m` with its full name and role, in visiting order.
fn tensors<M: Module + ?Sized>(m: &M) -> Vec<(String, Tensor, Role)> {
    struct Collect {
        prefix: Vec<String>,
        out: Vec<(String, Tensor, Role)>,
    }
    impl Visitor for Collect {
        fn tensor(&mut self, name: &str, t: &Tensor, role: Role) {
            self.out.push((join(&self.prefix.join("."), name), t.clone(), role));
        }
        fn module(&mut self, name: &str, m: &dyn Module) {
            if !name.is_empty() {
                self.prefix.push(name.to_string());
            }
            m.visit(self);
            if !name.is_empty() {
                self.prefix.pop();
            }
        }
    }
    let mut c = Collect { prefix: Vec::new(), out: Vec::new() };
    m.visit(&mut c);
    c.out
}

impl<M: Module + ?Sized> Module for Box<M> {
    fn visit(&self, v: &mut dyn Visitor) {
        (**self).visit(v)
    }
    fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>) {
        (**self).visit_mut(v)
    }
    fn set_training(&mut self, training: bool) {
        (**self).set_training(training)
    }
}

/// A list of modules (PyTorch's `ModuleList`): children named `0`, `1`, ...
impl<M: Module> Module for Vec<M> {
    fn visit(&self, v: &mut dyn Visitor) {
        for (i, m) in self.iter().enumerate() {
            v.module(&i.to_string(), m);
        }
    }
    fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>) {
        for (i, m) in self.iter_mut().enumerate() {
            v.module(&i.to_string(), m);
        }
    }
}

/// An optional module: its tensors under the field's own name when present.
impl<M: Module> Module for Option<M> {
    fn visit(&self, v: &mut dyn Visitor) {
        if let Some(m) = self {
            m.visit(v);
        }
    }
    fn visit_mut<'a>(&'a mut self, v: &mut dyn VisitorMut<'a>) {
        if let Some(m) = self {
            m.visit_mut(v);
        }
    }
    fn set_training(&mut self, training: bool) {
        if let Some(m) = self {
            m.set_training(training);
        }
    }
}

/// A module that maps one tensor to one tensor.
pub trait Layer: Module {
    /// Apply to `x`.
    fn forward(&self, x: &Tensor) -> Tensor;

    /// The layer as `Any`, so tools that rewrite a model (structured pruning) can find
    /// the concrete layers inside a [`Sequential`]. Layers those tools need to see
    /// override it; the default hides the layer (`None`).
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}

/// Support for `#[derive(Module)]`: which kind a field is, decided by its type through
/// autoref-based dispatch (tensors first, then modules, then anything else, ignored).
#[doc(hidden)]
pub mod derive {
    use super::{Module, Role, Visitor, VisitorMut};
    use crate::Tensor;
    use std::cell::Cell;

    pub struct Field<'a, T: ?Sized>(pub &'a T, pub Role);

    pub trait TensorField {
        fn visit_field(&self, name: &str, v: &mut dyn Visitor);
    }
    impl TensorField for &&Field<'_, Tensor> {
        fn visit_field(&self, name: &str, v: &mut dyn Visitor) {
            v.tensor(name, self.0, self.1);
        }
    }
    impl TensorField for &&Field<'_, Option<Tensor>> {
        fn visit_field(&self, name: &str, v: &mut dyn Visitor) {
            if let Some(t) = self.0 {
                v.tensor(name, t, self.1);
            }
        }
    }
    pub trait ModuleField {
        fn visit_field(&self, name: &str, v: &mut dyn Visitor);
    }
    impl<T: Module> ModuleField for &Field<'_, T> {
        fn visit_field(&self, name: &str, v: &mut dyn Visitor) {
            v.module(name, self.0);
        }
    }
    pub trait OtherField {
        fn visit_field(&self, _name: &str, _v: &mut dyn Visitor) {}
    }
    impl<T: ?Sized> OtherField for Field<'_, T> {}

    pub struct FieldMut<'a, T: ?Sized>(Cell<Option<&'a mut T>>, Role);

    impl<'a, T: ?Sized> FieldMut<'a, T> {
        pub fn new(t: &'a mut T, role: Role) -> Self {
            FieldMut(Cell::new(Some(t)), role)
        }
    }

    pub trait TensorFieldMut<'a> {
        fn visit_field_mut(&self, name: &str, v: &mut dyn VisitorMut<'a>);
    }
    impl<'a> TensorFieldMut<'a> for &&FieldMut<'a, Tensor> {
        fn visit_field_mut(&self, name: &str, v: &mut dyn VisitorMut<'a>) {
            if let Some(t) = self.0.take() {
                v.tensor(name, t, self.1);
            }
        }
    }
    impl<'a> TensorFieldMut<'a> for &&FieldMut<'a, Option<Tensor>> {
        fn visit_field_mut(&self, name: &str, v: &mut dyn VisitorMut<'a>) {
            if let Some(Some(t)) = self.0.take() {
                v.tensor(name, t, self.1);
            }
        }
    }
    pub trait ModuleFieldMut<'a> {
        fn visit_field_mut(&self, name: &str, v: &mut dyn VisitorMut<'a>);
    }
    impl<'a, T: Module + 'a> ModuleFieldMut<'a> for &FieldMut<'a, T> {
        fn visit_field_mut(&self, name: &str, v: &mut dyn VisitorMut<'a>) {
            if let Some(m) = self.0.take() {
                v.module(name, m);
            }
        }
    }
    pub trait OtherFieldMut<'a> {
        fn visit_field_mut(&self, _name: &str, _v: &mut dyn VisitorMut<'a>) {}
    }
    impl<'a, T: ?Sized> OtherFieldMut<'a> for FieldMut<'a, T> {}
}
