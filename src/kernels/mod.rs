//! Kernel families. Each file turns one scheduled group of nodes into a [`KernelSpec`]:
//! it picks the WGSL file in `shaders/`, renders the variant's header (the convention in
//! `shaders/README.md`), fills the `meta` parameters and computes the dispatch.

pub mod attention;
pub(crate) mod codegen;
pub mod elementwise;
pub mod matmul;
pub mod norm;
pub mod quantize;
pub mod reduce;
pub mod segment;
pub mod softmax;
pub mod texture;
#[cfg(test)]
mod variants;

use crate::graph::schedule::{buffer_source, matmul_operand, KernelKind};
use crate::{DType, Error, Result, Tensor};
use std::panic::Location;

/// Workgroup size of 1-D kernels.
pub const WG: u32 = 256;

/// The WGSL sources of `shaders/`, embedded at build time (`build.rs` copies them;
/// the wasm build leaves out their comments and indentation).
pub mod sources {
    pub const COMMON: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/common.wgsl"));
    /// Division by multiplying (`Gen::divmod`); the npm package divides plainly.
    #[cfg(not(target_arch = "wasm32"))]
    pub const UDIV: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/udiv.wgsl"));
    #[cfg(target_arch = "wasm32")]
    pub const UDIV: &str = "";
    pub const ELEMENTWISE: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/elementwise.wgsl"));
    pub const ELEMENTWISE_VEC4: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/elementwise_vec4.wgsl"));
    pub const REDUCE: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/reduce.wgsl"));
    pub const REDUCE_SMALL: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/reduce_small.wgsl"));
    pub const MATMUL: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul.wgsl"));
    pub const MATMUL_DIRECT: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_direct.wgsl"));
    pub const MATMUL_DIRECT_ROWS: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_direct_rows.wgsl"));
    pub const MATMUL_DIRECT_VEC4: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_direct_vec4.wgsl"));
    pub const MATMUL_DIRECT_SUBGROUP: &str =
        include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_direct_subgroup.wgsl"));
    /// Only CPU adapters with 64-bit integers take it, never the browser build.
    #[cfg(not(target_arch = "wasm32"))]
    pub const MATMUL_DIRECT_WIDE: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_direct_wide.wgsl"));
    #[cfg(target_arch = "wasm32")]
    pub const MATMUL_DIRECT_WIDE: &str = "";
    /// What the wide matmul and the wide attention share (native only, as they are).
    #[cfg(not(target_arch = "wasm32"))]
    pub const WIDE: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/wide.wgsl"));
    #[cfg(target_arch = "wasm32")]
    pub const WIDE: &str = "";
    /// `oct`: the 8 floats of a `vec4<u64>` load (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub const OCT: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/oct.wgsl"));
    #[cfg(target_arch = "wasm32")]
    pub const OCT: &str = "";
    #[cfg(not(target_arch = "wasm32"))]
    pub const ATTENTION_WIDE: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/attention_wide.wgsl"));
    #[cfg(target_arch = "wasm32")]
    pub const ATTENTION_WIDE: &str = "";
    pub const MATMUL_VEC4: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_vec4.wgsl"));
    /// The autotuner's 128x128 tiles for discrete GPUs; not in the npm package.
    #[cfg(not(target_arch = "wasm32"))]
    pub const MATMUL_VEC4_128: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_vec4_128.wgsl"));
    #[cfg(target_arch = "wasm32")]
    pub const MATMUL_VEC4_128: &str = "";
    pub const ATTENTION: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/attention.wgsl"));
    pub const NORM: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/norm.wgsl"));
    pub const NORM_ROWS: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/norm_rows.wgsl"));
    pub const NORM_ROWS_VEC4: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/norm_rows_vec4.wgsl"));
    pub const NORM_STORE: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/norm_store.wgsl"));
    #[cfg(not(target_arch = "wasm32"))]
    pub const NORM_STORE_SUBGROUP: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/norm_store_subgroup.wgsl"));
    #[cfg(target_arch = "wasm32")]
    pub const NORM_STORE_SUBGROUP: &str = "";
    pub const SOFTMAX_ROWS: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/softmax_rows.wgsl"));
    pub const SOFTMAX_ROWS_VEC4: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/softmax_rows_vec4.wgsl"));
    pub const SOFTMAX: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/softmax.wgsl"));
    pub const GEMV: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/gemv.wgsl"));
    /// One row of X on GPUs; not in the npm package.
    #[cfg(not(target_arch = "wasm32"))]
    pub const GEMV_ROWS: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/gemv_rows.wgsl"));
    #[cfg(target_arch = "wasm32")]
    pub const GEMV_ROWS: &str = "";
    pub const MATMUL_BATCH: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/matmul_batch.wgsl"));
    pub const QUANTIZE: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/quantize.wgsl"));
    pub const TEXTURE: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/texture.wgsl"));
    pub const SEGMENT_REDUCE: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/segment_reduce.wgsl"));
    pub const SEGMENT_SUM_VEC4: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/segment_sum_vec4.wgsl"));
    pub const SCATTER_ROWS: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/scatter_rows.wgsl"));
    pub const SCATTER_ROWS_VEC4: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/scatter_rows_vec4.wgsl"));
    pub const TOPK: &str = include_str!(concat!(env!("OUT_DIR"), "/shaders/topk.wgsl"));
}

/// What the target adapter can do, as far as shader text is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShaderCaps {
    /// Store f16 as `array<f16>` (`enable f16;`); otherwise as packed pairs in `u32`.
    pub native_f16: bool,
    /// Largest workgroup count per dispatch dimension.
    pub max_workgroups: u32,
    /// Matmul without workgroup memory (`matmul_direct.wgsl`): the choice for CPU
    /// adapters, where barriers are costly and caches do the tiling.
    pub direct_matmul: bool,
    /// The largest register tile a matmul invocation computes (rows, columns): chosen
    /// per adapter by `device::autotune`.
    pub matmul_tile: (u8, u8),
    /// The tiled kernel loads 4-aligned f32/f16 operands as vectors into 4x4 register
    /// blocks (`matmul_vec4.wgsl`), chosen per adapter like the tile.
    pub tiled_vec4: bool,
    /// Products read a convolution's windows as their tiles load (implicit GEMM; see
    /// `graph::schedule::reads_operand_in_place`) instead of materialising the column matrix:
    /// measured per adapter by the autotuner, on by default with the tiled kernel.
    pub implicit_gemm: bool,
    /// The largest storage binding, in bytes: kernels over larger tensors are rendered
    /// with window slots so the executor can split them (and only those, since the
    /// window arithmetic costs a little on every load).
    pub max_binding: u64,
    /// Subgroup operations are available and every subgroup has at least this many
    /// lanes (0: no subgroup operations). The direct matmul then loads A once per
    /// subgroup (`matmul_direct_subgroup.wgsl`) where its rows per workgroup fit.
    pub subgroup_min: u32,
    /// Element-wise kernels, f32 matmuls and attention may move eight 32-bit values per
    /// storage access, as `vec4<u64>` (64-bit integers, `SHADER_INT64`); element-wise
    /// kernels with arithmetic may store so while loading quads (`elementwise::Form`).
    /// For CPU adapters: lavapipe runs every storage access as a loop over its SIMD
    /// lanes, so eight values per access halve that cost per value.
    pub wide_loads: bool,
    /// With `wide_loads`, a host without AVX-512. There element-wise kernels load eight
    /// values per access whatever their arithmetic. Where the host has AVX-512, LLVM
    /// assembles lavapipe's `vec4<u64>` loads in 512-bit registers, which slows the
    /// 256-bit arithmetic around them, so expressions with a transcendental load quads
    /// (`elementwise::suits`; Sapphire Rapids, and again on Zen 4).
    pub no_avx512: bool,
    /// With `wide_loads`, the rows of the `rgba32float` textures that may hold f32
    /// operands (0: none): the wide matmul's A and B and its epilogue's leaves, and the
    /// quads of the norms, softmax and attention ([`texturable`]). Lavapipe fetches texels
    /// without the loop over SIMD lanes that each storage load runs, so the executor
    /// copies such bindings into textures [`TEXTURE_WIDTH`] texels wide (a binding's
    /// bytes in order) and the kernel reads them with `textureLoad`
    /// (`KernelSpec::textured`). The adapter's largest 2D texture dimension.
    pub texture_rows: u32,
}

impl ShaderCaps {
    /// [`wide_loads`](Self::wide_loads), known to be false on wasm (browsers' adapters
    /// have no 64-bit integers), so that the npm package leaves out the wide kernels'
    /// code (its size budget).
    pub fn wide(&self) -> bool {
        cfg!(not(target_arch = "wasm32")) && self.wide_loads
    }
}

/// Texels per row of an operand held in a texture (`ShaderCaps::texture_rows`): 4,096
/// floats, so a row is 16 KiB, a multiple of the 256 bytes a copy's row pitch needs.
pub const TEXTURE_WIDTH: u32 = 1024;

/// A bounds check a kernel performs on data-dependent indices (gather, index_select).
/// The kernel writes `status[2k] = 1` and `status[2k+1] = bad index` on failure.
#[derive(Clone, Debug)]
pub struct IndexCheck {
    pub op: &'static str,
    pub axis: usize,
    pub size: usize,
    pub location: &'static Location<'static>,
}

impl IndexCheck {
    /// The error this check reports for a bad `index`.
    pub fn error(&self, index: i64) -> Error {
        Error::IndexOutOfRange { op: self.op, index, axis: self.axis, size: self.size, location: self.location }
    }
}

/// One kernel launch, fully described: source, parameters, bindings and grid.
#[derive(Clone)]
pub struct KernelSpec {
    /// A name that says what the kernel is (`fused(add,mul,gelu)`, `reduce_sum`, `matmul_f32_64x64`).
    pub label: String,
    /// The full WGSL module, shared: cached plans and their replays hold the same text.
    pub source: std::sync::Arc<str>,
    /// `meta` parameter words (binding 0).
    pub meta: Vec<u32>,
    /// Input tensors bound at 2, 3, ... (each realised or produced earlier in the schedule).
    pub inputs: Vec<Tensor>,
    /// The node this kernel produces (binding 1).
    pub output: Tensor,
    /// Bounds checks; when non-empty a status buffer is bound after the inputs.
    pub checks: Vec<IndexCheck>,
    /// The meta slot the executor fills with this kernel's first status word.
    pub status_slot: Option<usize>,
    /// Workgroups in x, y, z.
    pub workgroups: [u32; 3],
    /// Meta slots holding node scalars (refilled when a cached plan is replayed).
    pub patches: Vec<codegen::MetaPatch>,
    /// Compiled without wgpu's runtime bounds checks: only kernels whose own indexing
    /// keeps every access in range (clamped or guarded, and tested on odd shapes).
    pub trusted: bool,
    /// Set for kernels that can run as several dispatches over windows of their output
    /// (element-wise kernels), which is how tensors larger than one storage binding are
    /// computed.
    pub window: Option<Window>,
    /// Set for matrix products that can run as several dispatches over row blocks of
    /// A and C (B bound whole), for an A or C larger than one storage binding.
    pub rows: Option<RowSplit>,
    /// An in-place kernel (`ScatterRows`): the tensor whose buffer is also the output,
    /// bound as the output only.
    pub alias: Option<Tensor>,
    /// A multi-output kernel's further outputs, bound after the inputs
    /// (`2 + inputs.len() + k`): element-wise roots of the output's shape, or the
    /// results of further row writes. Such a kernel runs as one dispatch over whole
    /// buffers and has no bounds checks.
    pub extra_outputs: Vec<Tensor>,
    /// For further row writes (empty otherwise): the table each of `extra_outputs`
    /// writes in place, as [`alias`](Self::alias) does for the output.
    pub extra_aliases: Vec<Tensor>,
    /// Inputs bound as textures, one bit per input (bit k: binding `2 + k`): the
    /// executor copies the binding's bytes into a texture [`TEXTURE_WIDTH`] texels wide,
    /// row after row (`ShaderCaps::texture_rows`): `rgba32float` for an f32 input,
    /// `rgba32uint` (its 32-bit words) for f16 and quantised ones.
    pub textured: u32,
}

/// How a matrix product splits by rows: the meta slot holding M, the elements of one
/// row of A (K) and of C (N), and the rows one workgroup covers.
#[derive(Clone, Debug)]
pub struct RowSplit {
    pub m_slot: usize,
    pub a_row: u64,
    pub c_row: u64,
    pub rows_per_group: u64,
}

/// The meta slots through which the executor runs an element-wise kernel over one
/// window of its output at a time, binding only that window of the output and of every
/// input read at the output's own index.
#[derive(Clone, Debug)]
pub struct Window {
    /// Slot of the first thread index of a dispatch.
    pub first: usize,
    /// Slot of the output binding's base, in threads.
    pub out_base: usize,
    /// Per input: the slot of its binding's base (in elements) when it is read at the
    /// output's own index, so it can be windowed too; `None` when it must be bound whole.
    pub input_base: Vec<Option<usize>>,
    /// Output elements per thread (2 for packed f16, else 1): the unit of `first` and
    /// `out_base`.
    pub per_thread: u32,
    /// Elements of a windowed input each output element reads (1 for element-wise
    /// kernels, the row length for a reduction over trailing axes).
    pub inputs_per_output: u64,
    /// Output elements one workgroup covers.
    pub outputs_per_group: u64,
    /// Per input read at other indices (element-wise kernels): its window base and
    /// length slots. Such an input larger than a binding is bound one window per
    /// dispatch, and each dispatch writes only the outputs whose source lies in it.
    pub gather: Vec<Option<(usize, usize)>>,
    /// Reductions: the slot that makes a dispatch combine its result with what the
    /// output already holds (set on every input window after the first), or `None`
    /// where the result cannot be combined (argmax, argmin). Element-wise: `None`.
    pub accumulate: Option<usize>,
    /// Whether this is a reduction (loads outside a window then contribute nothing,
    /// rather than skipping a store).
    pub reduces: bool,
}

impl KernelSpec {
    /// A hand-written kernel (matmul, GEMV, attention, softmax, norm): no generated
    /// bounds checks and no patched scalars; `trusted` as [`KernelSpec::trusted`].
    /// (Not inlined: the npm package's size budget.)
    #[inline(never)]
    pub(crate) fn hand_written(
        label: String,
        source: String,
        meta: Vec<u32>,
        inputs: Vec<Tensor>,
        output: &Tensor,
        workgroups: [u32; 3],
        trusted: bool,
    ) -> KernelSpec {
        KernelSpec {
            label,
            source: source.into(),
            meta,
            inputs,
            output: output.clone(),
            checks: Vec::new(),
            status_slot: None,
            workgroups,
            patches: Vec::new(),
            trusted,
            window: None,
            rows: None,
            alias: None,
            extra_outputs: Vec::new(),
            extra_aliases: Vec::new(),
            textured: 0,
        }
    }
}

/// Render a schedule into kernels: schedule the graph under `targets` for a device
/// with these capabilities and render every kernel (no GPU work).
pub(crate) fn plan_kernels(caps: &ShaderCaps, max_inputs: usize, targets: &[Tensor]) -> Result<Vec<KernelSpec>> {
    let mut sched = crate::graph::schedule::schedule_with(targets, max_inputs, caps.max_binding, caps.implicit_gemm);
    if std::env::var("TESSERA_EPILOGUE").as_deref() != Ok("0") {
        crate::graph::schedule::fuse_epilogues(&mut sched, targets, max_inputs, caps.max_binding, caps.native_f16);
        // (Native only, for the npm package's size budget.)
        #[cfg(not(target_arch = "wasm32"))]
        crate::graph::schedule::fuse_attention_stores(&mut sched, targets);
    }
    if std::env::var("TESSERA_MULTI_OUTPUT").as_deref() != Ok("0") {
        crate::graph::schedule::group_siblings(&mut sched, max_inputs, caps.max_binding);
        if cfg!(not(target_arch = "wasm32")) {
            crate::graph::schedule::group_row_writes(&mut sched, max_inputs);
        }
    }
    let is_leaf = |t: &Tensor| sched.is_buffer(t);
    let mut specs = Vec::with_capacity(sched.kernels.len());
    for k in &sched.kernels {
        let spec = match k.kind {
            KernelKind::Elementwise if !k.siblings.is_empty() => {
                let roots: Vec<Tensor> = std::iter::once(k.root.clone()).chain(k.siblings.iter().cloned()).collect();
                for spec in elementwise::render_siblings(&roots, &is_leaf, caps)? {
                    if spec.output.dtype().is_quantized() {
                        return Err(quantized_output(&spec.output));
                    }
                    specs.push(spec);
                }
                continue;
            }
            KernelKind::Elementwise => elementwise::render(&k.root, &is_leaf, caps)?,
            KernelKind::Reduce => reduce::render(&k.root, &is_leaf, caps)?,
            KernelKind::Quantize => quantize::render(&k.root, &is_leaf, caps)?,
            KernelKind::Segment => segment::render_segment(&k.root, &is_leaf, caps)?,
            KernelKind::Scatter => {
                if cfg!(target_arch = "wasm32") {
                    return Err(rows_left_out());
                }
                let roots: Vec<Tensor> = std::iter::once(k.root.clone()).chain(k.siblings.iter().cloned()).collect();
                specs.extend(segment::render_row_writes(&roots, &is_leaf, caps, max_inputs)?);
                continue;
            }
            KernelKind::TopK => segment::render_topk(&k.root, &is_leaf, caps)?,
            KernelKind::Matmul => {
                // The product, and the element-wise expression fused into its store.
                let prod = k.product.as_ref().unwrap_or(&k.root);
                let epi = k.product.as_ref().map(|_| matmul::Epilogue { root: &k.root, is_leaf: &is_leaf });
                let ins = &prod.node().inputs;
                let src = |i: &Tensor| matmul_operand(i, &sched.materialised);
                match (src(&ins[0]), src(&ins[1])) {
                    (Some(a), Some(b)) => matmul::render(prod, a, b, caps, epi.as_ref())?,
                    // An operand the scheduler left to be read in place (implicit GEMM).
                    _ => matmul::render_in_place(prod, &is_leaf, caps, epi.as_ref())?,
                }
            }
            KernelKind::Attention | KernelKind::Norm | KernelKind::Softmax => {
                // Whole-buffer kernels: every operand is a buffer (or a reshape of one).
                // An attention may store through the moves over it (`product`).
                // (Never in the npm package, whose build has no such pass.)
                let product = k.product.as_ref().filter(|_| cfg!(not(target_arch = "wasm32")));
                let node = product.unwrap_or(&k.root);
                let bufs = node.node().inputs.iter().map(|i| {
                    buffer_source(i, &sched.materialised).ok_or_else(|| Error::Gpu {
                        context: "schedule".into(),
                        message: format!("{} operand {} was not materialised", node.op().name(), i.id()),
                    })
                });
                let bufs: Vec<Tensor> = bufs.collect::<Result<_>>()?;
                match k.kind {
                    KernelKind::Norm => norm::render(&k.root, bufs, caps)?,
                    KernelKind::Softmax => softmax::render(&k.root, bufs, caps)?,
                    _ => attention::render(node, product.map(|_| &k.root), bufs, caps)?,
                }
            }
        };
        if spec.output.dtype().is_quantized() && k.kind != KernelKind::Quantize {
            return Err(quantized_output(&spec.output));
        }
        specs.push(spec);
    }
    Ok(specs)
}

/// Row writes (`Op::ScatterRows`) come only from the sparse optimisers, which the
/// browser package does not offer: its build leaves them out, for its size budget.
pub(crate) fn rows_left_out() -> Error {
    Error::Unsupported("row writes (the sparse optimisers) are not in the browser build".into())
}

/// Kernels cannot write block formats: a quantised view must be cast before it is
/// realised or copied.
pub(crate) fn quantized_output(t: &Tensor) -> Error {
    Error::DType {
        op: "realize",
        dtypes: vec![t.dtype()],
        detail: format!(
            "a {} result of {} cannot be materialised: cast it to f32 or f16 (quantised tensors are read-only)",
            t.dtype(),
            t.op().name()
        ),
        location: t.location(),
    }
}

/// WGSL storage element type for a dtype.
pub(crate) fn storage_type(dtype: DType, caps: &ShaderCaps) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 if caps.native_f16 => "f16",
        DType::F16 => "u32",
        DType::I32 => "i32",
        DType::U32 | DType::Bool | DType::Q8_0 | DType::Q4_0 => "u32",
    }
}

/// WGSL type values of a dtype are computed in.
pub(crate) fn compute_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 | DType::F16 | DType::Q8_0 | DType::Q4_0 => "f32",
        DType::I32 => "i32",
        DType::U32 => "u32",
        DType::Bool => "bool",
    }
}

/// A load function `fn {name}(i: u32) -> compute type` over storage binding `var_name`.
/// Quantised formats need `qoff`, the WGSL expression of their quant region's offset.
pub(crate) fn load_fn(name: &str, var_name: &str, dtype: DType, caps: &ShaderCaps, qoff: Option<&str>) -> String {
    load_fn_at(name, var_name, dtype, caps, qoff, None)
}

/// [`load_fn`] for a binding that starts `base` elements into its tensor (a window).
pub(crate) fn load_fn_at(
    name: &str,
    var_name: &str,
    dtype: DType,
    caps: &ShaderCaps,
    qoff: Option<&str>,
    base: Option<&str>,
) -> String {
    if dtype.is_quantized() {
        let body = crate::quant::wgsl_load(dtype, var_name, qoff.unwrap_or("0u"));
        return format!("fn {name}(i: u32) -> f32 {{\n    {body}\n}}\n");
    }
    let w = match base {
        Some(b) => format!("(i - {b})"),
        None => "i".to_string(),
    };
    let body = match dtype {
        DType::F32 | DType::I32 | DType::U32 => format!("{var_name}[{w}]"),
        DType::F16 if caps.native_f16 => format!("f32({var_name}[{w}])"),
        DType::F16 => format!("unpack2x16float({var_name}[{w} >> 1u])[i & 1u]"),
        DType::Bool => format!("{var_name}[{w}] != 0u"),
        DType::Q8_0 | DType::Q4_0 => unreachable!("handled above"),
    };
    format!("fn {name}(i: u32) -> {} {{\n    return {body};\n}}\n", compute_type(dtype))
}

/// The header every variant starts with: `enable` directives, `WG`, the meta binding
/// and the output binding.
pub(crate) fn header(meta_len: usize, out_dtype: DType, uses_f16: bool, caps: &ShaderCaps) -> String {
    header_with_out(meta_len, storage_type(out_dtype, caps), uses_f16, caps)
}

/// [`header`] with the output binding's element type spelled out (`vec4<f32>`, say).
pub(crate) fn header_with_out(meta_len: usize, out_ty: &str, uses_f16: bool, caps: &ShaderCaps) -> String {
    let mut s = String::new();
    if uses_f16 && caps.native_f16 {
        s.push_str("enable f16;\n");
    }
    let words = meta_len.div_ceil(4).max(1);
    // `m(i)` passes each meta word through a select on the output's length (which is
    // never u32::MAX elements), so no compiler can prove it a pure uniform value.
    // Lavapipe (Mesa 22) otherwise "inlines" uniforms that reach a loop or branch
    // condition: it recompiles the kernel with their values at every dispatch and
    // keeps the variant, unless inlining shrinks the kernel by less than half. A loop
    // over a short row unrolls and grows instead, so such kernels recompiled on every
    // dispatch (a softmax over 7,680 rows of 20: 14 ms a dispatch, 0.55 ms without).
    s.push_str(&format!(
        "const WG: u32 = {WG}u;\nstruct Params {{ v: array<vec4<u32>, {words}> }}\n\
         @group(0) @binding(0) var<uniform> params: Params;\n\
         fn m(i: u32) -> u32 {{ return select(params.v[i >> 2u][i & 3u], 0u, arrayLength(&out) == 0xffffffffu); }}\n\
         @group(0) @binding(1) var<storage, read_write> out: array<{out_ty}>;\n"
    ));
    s
}

/// Bindings and `ld{k}(i)` load functions for `inputs` (bindings 2, 3, ...), none of
/// them quantised.
pub(crate) fn input_loads(inputs: &[Tensor], caps: &ShaderCaps) -> String {
    let mut s = String::new();
    for (k, t) in inputs.iter().enumerate() {
        s.push_str(&input_binding(k, t.dtype(), caps));
        s.push_str(&load_fn(&format!("ld{k}"), &format!("in{k}"), t.dtype(), caps, None));
    }
    s
}

/// Whether `t`'s bytes fit an operand texture on this adapter (`ShaderCaps::texture_rows`,
/// native only: known false on wasm, so the npm package leaves the texture code out):
/// whole texels, within the texture's rows.
fn fits_texture(t: &Tensor, caps: &ShaderCaps) -> bool {
    let bytes = t.storage_bytes();
    cfg!(not(target_arch = "wasm32"))
        && caps.texture_rows > 0
        && bytes > 0
        && bytes.is_multiple_of(16)
        && bytes / 16 <= u64::from(TEXTURE_WIDTH) * u64::from(caps.texture_rows)
}

/// Whether f32 `t` may be bound as an `rgba32float` operand texture.
pub(crate) fn texturable(t: &Tensor, caps: &ShaderCaps) -> bool {
    t.dtype() == DType::F32 && fits_texture(t, caps)
}

/// Whether `t` (f16 or quantised) may be bound as an `rgba32uint` operand texture of its
/// 32-bit words (the executor picks the format by dtype).
pub(crate) fn word_texturable(t: &Tensor, caps: &ShaderCaps) -> bool {
    (t.dtype() == DType::F16 || t.dtype().is_quantized()) && fits_texture(t, caps)
}

/// How a kernel reads an operand texture. Lavapipe (Mesa 22.3) runs a sampled
/// `textureLoad` through a called texel-fetch function that works out the mip level of
/// every lane, and a read-only storage texture's load inline, in fewer than half the
/// instructions (the kernel lab's `sum_stex.wgsl`: 12.8 M against 28.2 M). Inline, it
/// also takes registers from the code around it: it wins where a product loads B for a
/// whole k-step, and loses inside the rows' work, where A is loaded (the lab, 704 rows
/// of MiniLM: B read as storage 5-7% faster, A 12% slower).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TexelRead {
    /// `texture_2d`, read by `textureLoad(t, xy, 0)`.
    Sampled,
    /// `texture_storage_2d<rgba32float or rgba32uint, read>`, read by `textureLoad(t, xy)`.
    Storage,
}

/// Binding `binding` as `var`, an operand texture (`KernelSpec::textured`) of `f32`
/// or `u32` texels read as `read` says, with `fn texel_{var}(q: u32) -> vec2<u32>`, the
/// coordinates of its `q`-th texel (4 values or words), and `fn fetch_{var}(q: u32)`,
/// that texel.
pub(crate) fn texture_binding(binding: u32, var: &str, texel: &str, read: TexelRead) -> String {
    const _: () = assert!(TEXTURE_WIDTH.is_power_of_two());
    let (mask, shift) = (TEXTURE_WIDTH - 1, TEXTURE_WIDTH.trailing_zeros());
    let (ty, level) = match read {
        TexelRead::Sampled => (format!("texture_2d<{texel}>"), ", 0"),
        TexelRead::Storage => {
            (format!("texture_storage_2d<rgba32{}, read>", if texel == "f32" { "float" } else { "uint" }), "")
        }
    };
    format!(
        "@group(0) @binding({binding}) var {var}: {ty};\n\
         fn texel_{var}(q: u32) -> vec2<u32> {{\n    return vec2<u32>(q & {mask}u, q >> {shift}u);\n}}\n\
         fn fetch_{var}(q: u32) -> vec4<{texel}> {{\n    return textureLoad({var}, texel_{var}(q){level});\n}}\n"
    )
}

/// `fn {ld8}(q: u32) -> Oct`: the `q`-th 8 floats of binding `binding`, an operand
/// texture ([`texture_binding`]). Two texels in the same row, since the width is
/// even.
pub(crate) fn texture_ld8(binding: u32, var: &str, ld8: &str, read: TexelRead) -> String {
    const _: () = assert!(TEXTURE_WIDTH.is_multiple_of(2));
    texture_binding(binding, var, "f32", read)
        + &format!("fn {ld8}(q: u32) -> Oct {{\n    return Oct(fetch_{var}(2u * q), fetch_{var}(2u * q + 1u));\n}}\n")
}

/// Input `k` (f32 or f16) read 4 values at a time, `fn ld{k}q(q: u32) -> vec4<f32>`:
/// [`quad_load_or_texture`] as `in{k}`. Returns the source and whether the input is
/// textured (then the caller sets bit `k` of `KernelSpec::textured`).
pub(crate) fn quad_input_or_texture(k: usize, t: &Tensor, caps: &ShaderCaps) -> (String, bool) {
    quad_load_or_texture(2 + k as u32, &format!("in{k}"), &format!("ld{k}q"), t, caps, TexelRead::Storage)
}

/// [`quad_load`] of `t` (f32 or f16) at `binding` as `var`, `fn func(q: u32) ->
/// vec4<f32>`, from an operand texture read as `read` where [`texturable`] or (f16
/// pairs as words) [`word_texturable`]. Returns the source and whether it reads a
/// texture.
pub(crate) fn quad_load_or_texture(
    binding: u32,
    var: &str,
    func: &str,
    t: &Tensor,
    caps: &ShaderCaps,
    read: TexelRead,
) -> (String, bool) {
    let body = if texturable(t, caps) {
        format!("return fetch_{var}(q);")
    } else if t.dtype() == DType::F16 && word_texturable(t, caps) {
        // Quad q is words 2q and 2q + 1: half of texel q / 2.
        format!(
            "let t = fetch_{var}(q >> 1u);\n    let w = select(t.xy, t.zw, (q & 1u) == 1u);\n    \
             return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));"
        )
    } else {
        return (quad_load(binding, var, func, t.dtype()), false);
    };
    let texel = if t.dtype() == DType::F32 { "f32" } else { "u32" };
    (texture_binding(binding, var, texel, read) + &format!("fn {func}(q: u32) -> vec4<f32> {{\n    {body}\n}}\n"), true)
}

/// An f32 or f16 input bound as quads at `binding`, named `var` (`vec4<f32>`, or f16
/// pairs packed in `vec2<u32>`: the same bits whether the adapter stores f16 natively
/// or packed), and `fn func(q: u32) -> vec4<f32>`, values `4q .. 4q + 3`. On lavapipe
/// each storage access runs as a loop over the SIMD lanes, whose cost per lane a quad
/// shares among its 4 values.
pub(crate) fn quad_load(binding: u32, var: &str, func: &str, dtype: DType) -> String {
    let (elem, body) = match dtype {
        DType::F16 => (
            "vec2<u32>",
            format!("let w = {var}[q];\n    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));"),
        ),
        _ => ("vec4<f32>", format!("return {var}[q];")),
    };
    format!(
        "@group(0) @binding({binding}) var<storage, read> {var}: array<{elem}>;\nfn {func}(q: u32) -> vec4<f32> {{\n    {body}\n}}\n"
    )
}

/// Binding declaration for input `k` (binding `2 + k`).
pub(crate) fn input_binding(k: usize, dtype: DType, caps: &ShaderCaps) -> String {
    format!("@group(0) @binding({}) var<storage, read> in{k}: array<{}>;\n", 2 + k, storage_type(dtype, caps))
}

/// Fold a 1-D count of workgroups into x and y so neither exceeds the device limit.
pub(crate) fn fold_groups(groups: u64, caps: &ShaderCaps, label: &str) -> Result<[u32; 3]> {
    let max = caps.max_workgroups.max(1) as u64;
    if groups == 0 {
        return Ok([0, 1, 1]);
    }
    let x = groups.min(max);
    let y = groups.div_ceil(x);
    if y > max {
        return Err(Error::Limit {
            what: format!("kernel {label}: workgroup count"),
            needed: groups,
            limit: max * max,
        });
    }
    Ok([x as u32, y as u32, 1])
}
