//! Batched matmul with broadcast batch axes, f32 results (f16 and quantised operands are
//! widened as they load): the workgroup-tiled `matmul.wgsl` / `matmul_vec4.wgsl` on GPUs
//! (with implicit-GEMM operands read in place), the direct kernels on CPU adapters,
//! and `gemv.wgsl` for decode shapes.

use super::codegen::{Gen, Ix, MetaPatch};
use super::{compute_type, header, load_fn, sources, storage_type, KernelSpec, ShaderCaps, TexelRead};
use crate::graph::schedule::permuted_base;
use crate::graph::Op;
use crate::{DType, Error, Result, Tensor};

/// An element-wise expression over a product, fused into the product's store (see
/// [`fuse_epilogues`](crate::graph::schedule::fuse_epilogues)): the node the kernel then
/// materialises, and which nodes are buffers.
pub struct Epilogue<'a> {
    pub root: &'a Tensor,
    pub is_leaf: &'a dyn Fn(&Tensor) -> bool,
}

/// How a product's kernel stores C (`store_c(i, v)`, `i` the linear output index):
/// plainly, or through its epilogue with the leaves it loads (bound from `base`).
struct Store {
    src: String,
    /// C is bound as quads (`vec4<f32>`) and `store_c4` writes 4 columns at once.
    quad: bool,
    leaves: Vec<Tensor>,
    patches: Vec<MetaPatch>,
    out: Tensor,
    uses_f16: bool,
    label: String,
    /// The epilogue finds each element's place in its leaves on its own (integer
    /// divisions and a load per element): large code per stored element.
    per_element: bool,
    /// Leaves read from operand textures, one bit per leaf (`KernelSpec::textured` once
    /// they are bound after the operands).
    textured: u32,
}

/// [`Store`] for product `prod`: `meta` gains the epilogue's slots. With `quad` (rows of
/// C 4-aligned and not transposed), an f32 C stored in place, or under a head split
/// that keeps each quad whole ([`keeps_quads`]), is bound as quads: lavapipe pays for
/// a storage access per lane, almost as much for a scalar as for a vec4.
/// `store_c4(i, v)` stores elements `i .. i + 3` either way.
fn store(
    prod: &Tensor,
    epi: Option<&Epilogue>,
    meta: &mut Vec<u32>,
    base: u32,
    caps: &ShaderCaps,
    quad: bool,
) -> Result<Store> {
    let Some(e) = epi else {
        let quad = quad && prod.dtype() == DType::F32;
        let src = if quad {
            "fn store_c(i: u32, v: f32) {\n    out[i >> 2u][i & 3u] = v;\n}\nfn store_c4(i: u32, v: vec4<f32>) {\n    out[i >> 2u] = v;\n}\n"
        } else {
            "fn store_c(i: u32, v: f32) {\n    out[i] = v;\n}\n"
        };
        return Ok(Store {
            src: format!("{src}{}", if quad { "" } else { STORE_C4_BY_ELEMENT }),
            quad,
            leaves: Vec::new(),
            patches: Vec::new(),
            out: prod.clone(),
            uses_f16: false,
            label: String::new(),
            per_element: false,
            textured: 0,
        });
    };
    let quad = quad && e.root.dtype() == DType::F32 && permuted_base(e.root).is_none_or(|b| keeps_quads(e.root, &b));
    if quad {
        if let Some(st) = quad_store(prod, e, meta, base, caps)? {
            return Ok(st);
        }
    }
    let mut g = epilogue_gen(e, meta, base, caps);
    let mut fns = epilogue_fns(&mut g, e.root, prod, caps, quad)?;
    if !quad {
        fns.push_str(STORE_C4_BY_ELEMENT);
    }
    let dt = e.root.dtype();
    let mut src = g.leaf_decls();
    src.push_str(&g.support(base + g.leaves.len() as u32));
    src.push_str(&fns);
    *meta = g.meta.clone();
    let per_element = !g.leaves.is_empty();
    Ok(Store {
        src,
        quad,
        label: format!("_epi({})", g.ops.join(",")),
        leaves: g.leaves,
        patches: g.patches,
        out: e.root.clone(),
        uses_f16: g.uses_f16 || dt == DType::F16,
        per_element,
        textured: 0,
    })
}

/// The code generator of an epilogue: the product kernel's meta slots so far, and its
/// leaves bound from `base`.
fn epilogue_gen<'a>(e: &Epilogue<'a>, meta: &[u32], base: u32, caps: &ShaderCaps) -> Gen<'a> {
    let mut g = Gen::new(*caps, e.is_leaf);
    for &w in meta {
        g.slot(w);
    }
    g.binding_base = base;
    g
}

/// [`store`] with C bound as quads where every f32 leaf of the epilogue is read at the
/// product's own index or is a row repeated over the rows (a bias): `store_c4` loads
/// each leaf's quad once (`in{k}[q]`, or `in{k}[q % len]` for a row) and evaluates
/// `epilogue(i, acc, p0, ..)` per lane from those values, where the per-element
/// `epilogue(i, acc)` found each element's index in its leaves again (two integer
/// divisions per element for a bias). `None` where a leaf is read otherwise.
fn quad_store(prod: &Tensor, e: &Epilogue, meta: &mut Vec<u32>, base: u32, caps: &ShaderCaps) -> Result<Option<Store>> {
    let mut g = epilogue_gen(e, meta, base, caps);
    g.param_leaves = true;
    g.param_lanes = 4;
    g.value_leaf = Some((prod.id(), "acc".into()));
    let permuted = permuted_base(e.root);
    let v = g.eval(permuted.as_ref().unwrap_or(e.root), &Ix::lin("i"), true);
    let f32s = g.leaves.iter().all(|l| l.dtype() == DType::F32);
    // (A quantised leaf is not f32: the scheduler keeps those out of epilogues anyway.)
    if !g.params_ok || !f32s {
        return Ok(None);
    }
    epilogue_checked(&g, e.root)?;
    let body = g.take_function();
    let leaves = g.leaves.len();
    let mut src = String::new();
    let mut loads = String::new();
    let mut params = "i: u32, acc: f32".to_string();
    // Leaves come from operand textures where the adapter allows
    // (`ShaderCaps::texture_rows`): lavapipe loops over the SIMD lanes for each storage
    // load, and a tile's epilogue loads a quad of each leaf per 4 outputs.
    let mut textured = 0u32;
    for (k, leaf) in g.leaves.iter().enumerate() {
        let binding = base + k as u32;
        let var = format!("in{k}");
        let q = match g.param_period.get(&k) {
            Some(slot) => format!("(i >> 2u) % m({slot}u)"),
            None => "i >> 2u".into(),
        };
        if super::texturable(leaf, caps) {
            src.push_str(&super::texture_binding(binding, &var, "f32", TexelRead::Storage));
            loads.push_str(&format!("    let a{k} = fetch_{var}({q});\n"));
            textured |= 1 << k;
        } else {
            src.push_str(&format!("@group(0) @binding({binding}) var<storage, read> {var}: array<vec4<f32>>;\n"));
            loads.push_str(&format!("    let a{k} = {var}[{q}];\n"));
        }
        params.push_str(&format!(", p{k}: f32"));
    }
    let lane = |c: usize| -> String {
        let i = if c == 0 { "i".to_string() } else { format!("i + {c}u") };
        let args: String = (0..leaves).map(|k| format!(", a{k}[{c}]")).collect();
        format!("epilogue({i}, v[{c}]{args})")
    };
    let scalar_args: String = (0..leaves).map(|k| format!(", a{k}[i & 3u]")).collect();
    let at = match &permuted {
        Some(b) => {
            let d = store_index(&mut g, e.root, b);
            let dst_body = g.take_function();
            src.push_str(&g.support(base + leaves as u32));
            src.push_str(&format!("fn dst(i: u32) -> u32 {{\n{dst_body}    return {d};\n}}\n"));
            "dst(i)"
        }
        None => {
            src.push_str(&g.support(base + leaves as u32));
            "i"
        }
    };
    src.push_str(&format!("fn epilogue({params}) -> f32 {{\n{body}    return {v};\n}}\n"));
    src.push_str(&format!(
        "fn store_c(i: u32, v: f32) {{\n{loads}    let o = {at};\n    out[o >> 2u][o & 3u] = epilogue(i, v{scalar_args});\n}}\n"
    ));
    src.push_str(&format!(
        "fn store_c4(i: u32, v: vec4<f32>) {{\n{loads}    out[{at} >> 2u] = vec4<f32>({}, {}, {}, {});\n}}\n",
        lane(0),
        lane(1),
        lane(2),
        lane(3)
    ));
    *meta = g.meta.clone();
    Ok(Some(Store {
        src,
        quad: true,
        label: format!("_epi({}){}", g.ops.join(","), if textured != 0 { "_tex" } else { "" }),
        leaves: g.leaves,
        patches: g.patches,
        out: e.root.clone(),
        uses_f16: g.uses_f16,
        per_element: false,
        textured,
    }))
}

/// The epilogue must read the product only at its own index and check no gather
/// (the scheduler's rule; a violation is a bug, reported rather than miscomputed).
fn epilogue_checked(g: &Gen, root: &Tensor) -> Result<()> {
    if g.value_misread || !g.checks.is_empty() {
        return Err(Error::Gpu {
            context: "matmul epilogue".into(),
            message: format!("{} reads its product at another index or gathers", root.op().name()),
        });
    }
    Ok(())
}

/// `epilogue(i, acc)`, the expression over product `prod` at its element `i` with the
/// accumulator in place of the product, and the `store_c` that applies it. Under a
/// head split ([`permuted_base`]) the expression is its base's, and `store_c` puts the
/// element where the permutes send it (`dst(i)`). With `quad` (an f32 root, no head
/// split or one that [`keeps_quads`]) `out` holds vec4s and `store_c4` stores 4
/// elements at once.
fn epilogue_fns(g: &mut Gen, root: &Tensor, prod: &Tensor, caps: &ShaderCaps, quad: bool) -> Result<String> {
    g.value_leaf = Some((prod.id(), "acc".into()));
    let base = permuted_base(root);
    let v = g.eval(base.as_ref().unwrap_or(root), &Ix::lin("i"), true);
    epilogue_checked(g, root)?;
    let body = g.take_function();
    let (dt, ty) = (root.dtype(), storage_type(root.dtype(), caps));
    let mut src = format!("fn epilogue(i: u32, acc: f32) -> {} {{\n{body}    return {v};\n}}\n", compute_type(dt));
    match base {
        None if quad => src.push_str(
            "fn store_c(i: u32, v: f32) {\n    out[i >> 2u][i & 3u] = epilogue(i, v);\n}\n\
             fn store_c4(i: u32, v: vec4<f32>) {\n    \
             out[i >> 2u] = vec4<f32>(epilogue(i, v.x), epilogue(i + 1u, v.y), epilogue(i + 2u, v.z), epilogue(i + 3u, v.w));\n}\n",
        ),
        None => src.push_str(&format!("fn store_c(i: u32, v: f32) {{\n    out[i] = {ty}(epilogue(i, v));\n}}\n")),
        Some(b) => {
            let d = store_index(g, root, &b);
            let body = g.take_function();
            src.push_str(&format!("fn dst(i: u32) -> u32 {{\n{body}    return {d};\n}}\n"));
            src.push_str(&match quad {
                // The quad's four elements land side by side, from a multiple of 4: one
                // index computation and one vector store for the four.
                true => "fn store_c(i: u32, v: f32) {\n    let o = dst(i);\n    out[o >> 2u][o & 3u] = epilogue(i, v);\n}\n\
                         fn store_c4(i: u32, v: vec4<f32>) {\n    \
                         out[dst(i) >> 2u] = vec4<f32>(epilogue(i, v.x), epilogue(i + 1u, v.y), epilogue(i + 2u, v.z), epilogue(i + 3u, v.w));\n}\n"
                    .to_string(),
                false => format!("fn store_c(i: u32, v: f32) {{\n    out[dst(i)] = {ty}(epilogue(i, v));\n}}\n"),
            });
        }
    }
    Ok(src)
}

/// Whether the reshapes and permutes from `base` up to `root` keep every quad of `base`
/// (elements 4q .. 4q + 3) side by side in `root`, from a multiple of 4: every shape on
/// the way ends in an axis a multiple of 4 long and no permute moves the last axis (a
/// head split `[b, s, h] -> [b, heads, s, d]` with `d` a multiple of 4).
fn keeps_quads(root: &Tensor, base: &Tensor) -> bool {
    let quads = |t: &Tensor| t.dims().last().is_some_and(|&d| d % 4 == 0);
    let mut t = root.clone();
    while t.id() != base.id() {
        if !quads(&t) {
            return false;
        }
        if let Op::Permute { perm } = t.op() {
            if perm.last() != Some(&(perm.len() - 1)) {
                return false;
            }
        }
        let next = t.node().inputs[0].clone();
        t = next;
    }
    quads(base)
}

/// Where `root` (reshapes and permutes over `base`) holds `base`'s element `i`: its
/// linear index, followed up the chain (a reshape keeps it, a permute moves the
/// coordinates), with every shape from meta slots so one shader serves all sizes.
pub(super) fn store_index(g: &mut Gen, root: &Tensor, base: &Tensor) -> String {
    let mut chain = Vec::new();
    let mut t = root.clone();
    while t.id() != base.id() {
        chain.push(t.clone());
        let next = t.node().inputs[0].clone();
        t = next;
    }
    let mut lin = "i".to_string();
    for node in chain.iter().rev() {
        if let Op::Permute { perm } = node.op() {
            let c = g.coords(&Ix::lin(lin.clone()), &node.node().inputs[0]);
            let moved: Vec<String> = perm.iter().map(|&p| c[p].clone()).collect();
            lin = g.linear(&Ix::coords(moved), node);
        }
    }
    lin
}

/// The per-adapter choice of matmul kernel: the direct (barrier-free) kernel on CPU
/// adapters, the workgroup-tiled one on GPUs; `TESSERA_MATMUL=tiled|direct` overrides.
pub fn prefer_direct(device_type: &str) -> bool {
    match std::env::var("TESSERA_MATMUL").as_deref() {
        Ok("direct") => true,
        Ok("tiled") => false,
        _ => device_type == "Cpu",
    }
}

/// Whether the "tiled-vec4 8x8" configuration takes 128x128 tiles
/// (`TESSERA_MATMUL_128=0` keeps the 64x64 kernel; never in the npm package).
fn big_tiles() -> bool {
    cfg!(not(target_arch = "wasm32")) && std::env::var("TESSERA_MATMUL_128").as_deref() != Ok("0")
}

/// K per step of the 128x128 tiles, and whether the tiles are doubled (one barrier per
/// step): 16 and single by default (on an H200, 4096^3 f32: 32.4 TFLOP/s against 31.6
/// with 8); `TESSERA_MATMUL_BK=8` for steps of 8, `TESSERA_MATMUL_DOUBLE=1` for steps of
/// 8 in doubled tiles (16 KiB, WebGPU's minimum; not yet measured on a GPU).
fn big_tile_steps() -> (u32, bool) {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    match (var("TESSERA_MATMUL_DOUBLE").as_str(), var("TESSERA_MATMUL_BK").as_str()) {
        ("1", _) => (8, true),
        (_, "8") => (8, false),
        _ => (16, false),
    }
}

/// Render the matmul producing `root` from operands `a` and `b`: the tensors owning their
/// buffers, each with whether it is stored transposed (`[.., n, k]` for `b`).
/// With `epi`, C goes through the epilogue and the kernel materialises its root.
pub fn render(
    root: &Tensor,
    a: (Tensor, bool),
    b: (Tensor, bool),
    caps: &ShaderCaps,
    epi: Option<&Epilogue>,
) -> Result<KernelSpec> {
    let r = root.rank();
    // Shapes come from the node's operands (rank-aligned); buffers from `a` and `b`,
    // which may be the un-reshaped tensors owning them.
    let (mut ad, mut bd) = (root.node().inputs[0].dims().to_vec(), root.node().inputs[1].dims().to_vec());
    let (mut m, mut n) = (root.dims()[r - 2], root.dims()[r - 1]);
    let k = ad[r - 1];
    let ((mut a, mut trans_a), (mut b, mut trans_b)) = (a, b);
    // The direct kernel spreads lanes over columns; a thin C (few columns, more rows)
    // is computed as C^T = B^T A^T and stored transposed, so the lanes are not idle.
    // (Not when an operand exceeds a storage binding: the product then splits by rows.)
    let fits = [&a, &b, root].iter().all(|t| t.storage_bytes() <= caps.max_binding);
    let swap = caps.direct_matmul && n < 64 && m > n && fits;
    if swap {
        std::mem::swap(&mut a, &mut b);
        (trans_a, trans_b) = (!trans_b, !trans_a);
        std::mem::swap(&mut ad, &mut bd);
        std::mem::swap(&mut m, &mut n);
    }
    let mut meta = batch_meta(root.dims(), &ad, &bd, (m, n, k));
    // Quantised operands: where their quants start.
    let mut qoff = [None, None];
    for (j, t) in [&a, &b].into_iter().enumerate() {
        if t.dtype().is_quantized() {
            meta.push(crate::quant::gpu_quant_offset_words(t.numel()) as u32);
            qoff[j] = Some(format!("m({}u)", meta.len() - 1));
        }
    }
    // C's rows go out a quad at a time from the direct kernels when 4-aligned.
    let st = store(root, epi, &mut meta, 4, caps, caps.direct_matmul && !swap && n % 4 == 0)?;
    let uses_f16 = a.dtype() == DType::F16 || b.dtype() == DType::F16 || st.uses_f16;
    let mut src = match st.quad {
        true => super::header_with_out(meta.len(), "vec4<f32>", uses_f16, caps),
        false => header(meta.len(), st.out.dtype(), uses_f16, caps),
    };
    src.push_str(&st.src);
    // Few rows against a weight stored [N, K]: the GEMV kernel; on CPU adapters also any
    // number of rows against a quantised weight (blocks dequantised once per 8 rows,
    // lavapipe: Q8_0 128x1536x384 60 -> 14-23 ms).
    // Past 8 rows on CPU adapters with subgroups, a quantised weight [N, K] goes through
    // the subgroup kernel instead, dequantising 4 values per load (a quant word and a
    // scale: half the storage accesses of f32, which bound lavapipe).
    let quant_subgroup = cfg!(not(target_arch = "wasm32"))
        && caps.direct_matmul
        && caps.subgroup_min >= 8
        && m > 8
        && a.dtype() == DType::F32
        && matches!(b.dtype(), DType::Q8_0 | DType::Q4_0)
        && trans_b
        && k % 32 == 0
        && (!trans_a || m % 4 == 0)
        && std::env::var("TESSERA_MATMUL_SUBGROUP").as_deref() != Ok("0")
        && std::env::var("TESSERA_MATMUL_QUANT_SUBGROUP").as_deref() != Ok("0");
    // Where the adapter reads f32 A and the weight's words from textures, the wide kernel
    // takes the quantised weight instead, dequantising 8 values per load (`quant_ld8`):
    // its tiles and B's k-steps as for f32 weights, with one scale and one or two words per
    // load.
    let quant_wide = quant_subgroup
        && caps.wide()
        && !trans_a
        && super::texturable(&a, caps)
        && super::word_texturable(&b, caps)
        && std::env::var("TESSERA_MATMUL_QUANT_WIDE").as_deref() != Ok("0");
    let gemv = !quant_subgroup
        && (m <= 8 || (caps.direct_matmul && b.dtype().is_quantized()))
        && a.dtype() == DType::F32
        && !trans_a
        && trans_b
        && k % 32 == 0
        && k > 0
        // On CPU adapters f32 weights go faster through the vec4 direct kernel.
        && (b.dtype() != DType::F32 || !caps.direct_matmul)
        && matches!(b.dtype(), DType::F32 | DType::Q8_0 | DType::Q4_0)
        && (!b.dtype().is_quantized() || crate::quant::gpu_quant_offset_words(b.numel()).is_multiple_of(4))
        && std::env::var("TESSERA_GEMV").as_deref() != Ok("0");
    if gemv {
        let qoff_b = qoff[1].clone();
        return render_gemv(root, (a, b), (m, n), meta, src, qoff_b.as_deref(), caps).map(|spec| with_store(spec, st));
    }
    // The vec4 kernels (direct, or tiled where the adapter chose it): f32 or f16
    // operands whose loaded rows are 4-aligned.
    // (The tiled one computes 64x64 tiles: thin outputs keep the narrower scalar tiles.)
    let vec4 = quant_subgroup
        || ((caps.direct_matmul || (caps.tiled_vec4 && m > 32 && n > 32))
            && a.dtype() == b.dtype()
            && matches!(a.dtype(), DType::F32 | DType::F16)
            && k % 4 == 0
            && (!trans_a || m % 4 == 0)
            && (trans_b || n % 4 == 0)
            && std::env::var("TESSERA_MATMUL_VEC4").as_deref() != Ok("0"));
    // A loaded once per subgroup and shared by shuffles (every subgroup 8 lanes or more).
    let subgroup = caps.direct_matmul
        && vec4
        && caps.subgroup_min >= 8
        && std::env::var("TESSERA_MATMUL_SUBGROUP").as_deref() != Ok("0");
    // Its wide form: f32 operands loaded 8 values at a time (`matmul_direct_wide.wgsl`).
    // f16 products too (f32 sums), where both operands are read as words from textures
    // (one texel holds 8 halves) and the epilogue is stored a quad at a time: one that
    // reads an f16 leaf element by element ran slower in the wide kernel (MiniLM's FFN-up
    // with its f16 bias, 704 rows, on 88-row tiles: 69-81 against 63-65 ms).
    let half_wide = cfg!(not(target_arch = "wasm32"))
        && !st.per_element
        && a.dtype() == DType::F16
        && b.dtype() == DType::F16
        && [&a, &b].iter().all(|t| super::word_texturable(t, caps))
        && std::env::var("TESSERA_MATMUL_HALF_WIDE").as_deref() != Ok("0");
    let wide = subgroup
        && caps.wide()
        && (quant_wide
            || (!quant_subgroup
                && ((a.dtype() == DType::F32 && b.dtype() == DType::F32) || half_wide)
                && !trans_a
                && m > 8
                && k % 8 == 0
                && (trans_b || n % 8 == 0)))
        && std::env::var("TESSERA_MATMUL_WIDE").as_deref() != Ok("0");
    // Its operands read from textures where the adapter allows (`ShaderCaps::texture_rows`,
    // native only: the npm package's size budget): every binding's bytes in whole texels
    // and within the texture's rows.
    let textured = wide && (quant_wide || half_wide || [&a, &b].iter().all(|t| super::texturable(t, caps)));
    // The other direct kernels take each operand that fits from a texture too: f32 quads,
    // f16 pairs and quantised blocks as 32-bit words.
    let mut tex_bits = if textured { 0b11 } else { 0 };
    // The 128x128 tiles of `matmul_vec4_128.wgsl` where the tuner chose them (large
    // products on discrete GPUs).
    let big = !caps.direct_matmul && vec4 && caps.matmul_tile == (8, 8) && m >= 128 && n >= 128 && big_tiles();
    for (i, (t, name)) in [(&a, "a"), (&b, "b")].into_iter().enumerate() {
        let binding = 2 + i as u32;
        let var = format!("in_{name}");
        // B, loaded once per k-step for all the tile's rows, reads its texture as
        // storage; A, loaded among the rows' work, as sampled (`TexelRead`).
        let read = if i == 1 { TexelRead::Storage } else { TexelRead::Sampled };
        if t.dtype().is_quantized() && (textured || (vec4 && caps.direct_matmul && super::word_texturable(t, caps))) {
            // Quantised blocks as words of an `rgba32uint` texture, dequantised 8 values a
            // load by the wide kernel and 4 by the quad one.
            src.push_str(&super::texture_binding(binding, &var, "u32", read));
            src.push_str(&format!("fn word_{name}(w: u32) -> u32 {{\n    return fetch_{var}(w >> 2u)[w & 3u];\n}}\n"));
            let qoff = qoff[i].as_deref().unwrap_or("0u");
            // (The wide form native only, as operand textures are: the npm package's size
            // budget.)
            #[cfg(not(target_arch = "wasm32"))]
            let ld = if textured { quant_ld8(t.dtype(), qoff) } else { quant_ld4(t.dtype(), qoff) };
            #[cfg(target_arch = "wasm32")]
            let ld = quant_ld4(t.dtype(), qoff);
            src.push_str(&ld);
            tex_bits |= 1 << i;
            continue;
        }
        // (Native only, as operand textures are: the npm package's size budget.)
        #[cfg(not(target_arch = "wasm32"))]
        if textured && t.dtype() == DType::F16 {
            src.push_str(&super::texture_binding(binding, &var, "u32", read));
            src.push_str(&format!(
                "fn ld8_{name}(q: u32) -> Oct {{\n    let w = fetch_{var}(q);\n    \
                 return Oct(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), \
                 vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));\n}}\n"
            ));
            continue;
        }
        if textured {
            src.push_str(&super::texture_ld8(binding, &var, &format!("ld8_{name}"), read));
            continue;
        }
        if wide {
            src.push_str(&format!(
                "@group(0) @binding({binding}) var<storage, read> {var}: array<vec4<u64>>;\n\
                 fn ld8_{name}(q: u32) -> Oct {{\n    return oct({var}[q]);\n}}\n"
            ));
            continue;
        }
        // The vec4 kernel reads groups of 4: a vec4<f32>, 4 halves as two u32 words (the
        // same bits whether the adapter stores f16 natively or packed), or quant words.
        if vec4 && !t.dtype().is_quantized() {
            let ld4 = format!("ld4_{name}");
            let (load, tex) = match caps.direct_matmul {
                true => super::quad_load_or_texture(binding, &var, &ld4, t, caps, read),
                false => (super::quad_load(binding, &var, &ld4, t.dtype()), false),
            };
            src.push_str(&load);
            tex_bits |= u32::from(tex) << i;
            continue;
        }
        let ty = if vec4 { "u32" } else { storage_type(t.dtype(), caps) };
        src.push_str(&format!("@group(0) @binding({binding}) var<storage, read> {var}: array<{ty}>;\n"));
        if vec4 {
            src.push_str(&format!("fn word_{name}(w: u32) -> u32 {{\n    return {var}[w];\n}}\n"));
            src.push_str(&quant_ld4(t.dtype(), qoff[i].as_deref().unwrap_or("0u")));
        } else {
            src.push_str(&load_fn(&format!("ld_{name}"), &var, t.dtype(), caps, qoff[i].as_deref()));
        }
    }
    let batch: usize = root.dims()[..r - 2].iter().product();
    let (tm, tn, bm, bn) = if big {
        let (bk, double) = big_tile_steps();
        src.push_str(&format!(
            "const BK: u32 = {bk}u;\nconst DOUBLE: bool = {double};\nconst STAGES: u32 = {}u;\n",
            if double { 2 } else { 1 }
        ));
        (8, 8, 128, 128)
    } else if wide {
        // Two blocks of columns per lane only for f32 operands read from textures (the
        // case measured, with and without AVX-512); f16 and quantised weights keep one.
        wide_tiles(m, n, batch, textured && !quant_wide && !half_wide, &mut src)
    } else if subgroup {
        subgroup_tiles(m, n, batch, caps, &mut src)
    } else {
        tiles(m, n, vec4, caps.direct_matmul, caps, &mut src)
    };
    src.push_str(&format!(
        "const TRANS_A: bool = {trans_a};\nconst TRANS_B: bool = {trans_b};\nconst TM: u32 = {tm}u;\nconst TN: u32 = {tn}u;\nconst OUT_T: bool = {swap};\n"
    ));
    if !caps.direct_matmul && !vec4 {
        src.push_str(
            "fn load_a(z: u32, off: u32, r: u32, k: u32) -> f32 {\n    return ld_a(off + select(r * m(2u) + k, k * m(0u) + r, TRANS_A));\n}\n\
             fn load_b(z: u32, off: u32, k: u32, c: u32) -> f32 {\n    return ld_b(off + select(k * m(1u) + c, c * m(2u) + k, TRANS_B));\n}\n",
        );
    }
    src.push_str(sources::MATMUL_BATCH);
    if caps.direct_matmul && vec4 {
        // An epilogue that reads its leaves element by element is stored in a loop
        // (`flush_rows`) once a lane holds 8 rows or more.
        // Quads per lane: 2 or 4 in the wide kernel (8 or 16 columns).
        let quads = if wide { tn / 4 } else { 1 };
        let store_loop = st.per_element && tm * quads >= 8;
        src.push_str(&format!(
            "const QUAD_STORE: bool = {};\nconst STORE_LOOP: bool = {store_loop};\nconst QUADS: u32 = {quads}u;\nconst PARKED: u32 = {}u;\n",
            st.quad,
            if store_loop { tm * quads } else { 1 }
        ));
        src.push_str(sources::MATMUL_DIRECT_ROWS);
    }
    if wide {
        src.push_str(sources::WIDE);
        src.push_str(sources::OCT);
    }
    src.push_str(match (caps.direct_matmul, vec4) {
        (true, true) if wide => sources::MATMUL_DIRECT_WIDE,
        (true, true) if subgroup => sources::MATMUL_DIRECT_SUBGROUP,
        (true, true) => sources::MATMUL_DIRECT_VEC4,
        (true, false) => sources::MATMUL_DIRECT,
        (false, true) if big => sources::MATMUL_VEC4_128,
        (false, true) => sources::MATMUL_VEC4,
        (false, false) => sources::MATMUL,
    });
    let layout = format!("{}{}", if trans_a { "t" } else { "n" }, if trans_b { "t" } else { "n" });
    let kind = match (caps.direct_matmul, vec4) {
        (true, true) if textured => "direct8tex_",
        (true, true) if wide => "direct8sg_",
        (true, true) if subgroup => "direct4sg_",
        (true, true) => "direct4_",
        (true, false) => "direct_",
        (false, true) if big => "vec4x128_",
        (false, true) => "vec4_",
        (false, false) => "",
    };
    let swapped = if swap { "_ct" } else { "" };
    let weights = if quant_subgroup { format!("_{}", b.dtype()) } else { String::new() };
    // 16 columns per lane (`wide_cols`).
    let cols = if wide && tn == 16 { "_c16" } else { "" };
    let label = format!("matmul_{kind}{}{weights}_{}x{}_{layout}{swapped}{cols}", a.dtype(), bm, bn);
    // Loads are clamped (direct) or guarded (tiled), stores guarded, workgroup memory
    // indexed below its size: checked on odd shapes by tests/ops.rs.
    let splittable = batch == 1 && !trans_a && !swap && !a.dtype().is_quantized() && epi.is_none();
    let mut spec = product_spec(root, label, src, meta, (a, b), [n.div_ceil(bn), m.div_ceil(bm), batch], caps)?;
    if splittable {
        spec.rows = Some(super::RowSplit { m_slot: 0, a_row: k as u64, c_row: n as u64, rows_per_group: bm as u64 });
    }
    spec.textured = tex_bits;
    if tex_bits != 0 && !textured {
        spec.label.push_str("_tex");
    }
    Ok(with_store(spec, st))
}

/// `store_c4` as four `store_c`s, for a C not bound as quads.
const STORE_C4_BY_ELEMENT: &str = "fn store_c4(i: u32, v: vec4<f32>) {\n    store_c(i, v.x);\n    store_c(i + 1u, v.y);\n    store_c(i + 2u, v.z);\n    store_c(i + 3u, v.w);\n}\n";

/// A product's kernel that stores through `st`: its epilogue's leaves bound after the
/// operands, its scalars patched on replay, and its root as the output.
fn with_store(mut spec: KernelSpec, st: Store) -> KernelSpec {
    spec.label.push_str(&st.label);
    spec.textured |= st.textured << spec.inputs.len();
    spec.inputs.extend(st.leaves);
    spec.patches = st.patches;
    spec.output = st.out;
    spec
}

/// Meta words `[M, N, K, batch rank]`, then per batch axis (outer first) its size and
/// the A and B strides (0 where that operand broadcasts): `matmul_batch.wgsl`'s layout.
fn batch_meta(out: &[usize], ad: &[usize], bd: &[usize], (m, n, k): (usize, usize, usize)) -> Vec<u32> {
    let r = out.len();
    let mut meta = vec![m as u32, n as u32, k as u32, (r - 2) as u32];
    let (mut sa, mut sb) = ((m * k) as u64, (k * n) as u64);
    let mut axes = Vec::new();
    for d in (0..r - 2).rev() {
        let stride_a = if ad[d] == 1 { 0 } else { sa };
        let stride_b = if bd[d] == 1 { 0 } else { sb };
        axes.push([out[d] as u32, stride_a as u32, stride_b as u32]);
        sa *= ad[d] as u64;
        sb *= bd[d] as u64;
    }
    for ax in axes.iter().rev() {
        meta.extend_from_slice(ax);
    }
    meta
}

/// Render a product one of whose operands is an index-remapping expression (see
/// [`reads_operand_in_place`](crate::graph::schedule::reads_operand_in_place)): an implicit GEMM. Both operands load through
/// generated functions of their (batch, row, column) coordinates, in the tiled kernel
/// (whatever the adapter's own choice), so a convolution's windows are gathered as the
/// tiles load instead of being written out as a column matrix first.
pub fn render_in_place(
    root: &Tensor,
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
    epi: Option<&Epilogue>,
) -> Result<KernelSpec> {
    let r = root.rank();
    let (a, b) = (&root.node().inputs[0], &root.node().inputs[1]);
    let (m, n, k) = (root.dims()[r - 2], root.dims()[r - 1], a.dims()[r - 1]);
    let mut g = Gen::new(*caps, is_leaf);
    for w in batch_meta(root.dims(), a.dims(), b.dims(), (m, n, k)) {
        g.slot(w);
    }
    // Each operand's element at (batch z, row, column): the batch coordinates from z
    // (0 on the operand's broadcast axes), then the expression at those coordinates.
    let mut loads = String::new();
    for (t, name, rc) in [(a, "a", ["r", "k"]), (b, "b", ["k", "c"])] {
        let mut rem = "z".to_string();
        let mut coords = vec!["0u".to_string(); r];
        for d in (0..r - 2).rev() {
            let (q, c) = g.divmod(&rem, &format!("m({}u)", 4 + 3 * d));
            if t.dims()[d] > 1 {
                coords[d] = c;
            }
            rem = q;
        }
        coords[r - 2] = rc[0].into();
        coords[r - 1] = rc[1].into();
        let v = g.eval(t, &Ix::coords(coords), false);
        let body = g.take_function();
        loads.push_str(&format!(
            "fn load_{name}(z: u32, off: u32, {}: u32, {}: u32) -> f32 {{\n{body}    return f32({v});\n}}\n",
            rc[0], rc[1]
        ));
    }
    // The store: plain, or the epilogue evaluated at the output index with the
    // accumulator in place of the product.
    let (out, mut label_epi, operand_ops) = (epi.map_or(root, |e| e.root), String::new(), g.ops.len());
    match epi {
        Some(e) => {
            loads.push_str(&epilogue_fns(&mut g, e.root, root, caps, false)?);
            label_epi = format!("_epi({})", g.ops[operand_ops..].join(","));
        }
        None => loads.push_str("fn store_c(i: u32, v: f32) {\n    out[i] = v;\n}\n"),
    }
    let mut src = header(g.meta.len(), out.dtype(), g.uses_f16 || out.dtype() == DType::F16, caps);
    src.push_str(&g.leaf_decls());
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&loads);
    let (tm, tn, bm, bn) = tiles(m, n, false, false, caps, &mut src);
    src.push_str(&format!(
        "const TRANS_A: bool = false;\nconst TRANS_B: bool = false;\nconst TM: u32 = {tm}u;\nconst TN: u32 = {tn}u;\n"
    ));
    src.push_str(sources::MATMUL_BATCH);
    src.push_str(sources::MATMUL);
    let label = format!("matmul_{}_{bm}x{bn}_implicit({}){label_epi}", a.dtype(), g.ops[..operand_ops].join(","));
    let batch: usize = root.dims()[..r - 2].iter().product();
    let groups = check_groups(&label, [n.div_ceil(bn), m.div_ceil(bm), batch], caps)?;
    let workgroups = if root.numel() == 0 { [0, 1, 1] } else { groups };
    let mut spec = g.finish(label, src, out, workgroups);
    // Trusted as the buffer kernels are: the product's own loads are guarded or clamped
    // to the logical operand, and index remaps of an in-range index stay in range (no
    // data-dependent gathers are read in place); tested on odd shapes.
    spec.trusted = true;
    Ok(spec)
}

/// Rows and columns per invocation (`TM`, `TN`) and per workgroup (`BM`, `BN`) of a
/// product, with `LANES` declared in `src` for the direct kernels.
fn tiles(
    m: usize,
    n: usize,
    vec4: bool,
    direct: bool,
    caps: &ShaderCaps,
    src: &mut String,
) -> (usize, usize, usize, usize) {
    if direct {
        // Whole rows per workgroup (uniform A loads), lanes over the columns: TN
        // strided columns each, or 4 consecutive ones in the vec4 kernel.
        let (tile_m, tile_n) = (caps.matmul_tile.0.max(1) as usize, caps.matmul_tile.1.max(1) as usize);
        // (The vec4 kernel names its accumulators: at most 8 rows.)
        let tm = m.next_power_of_two().clamp(1, if vec4 { tile_m.min(8) } else { tile_m });
        let tn = match n {
            0..=64 => 1,
            65..=128 => 2,
            _ => 4,
        }
        .min(tile_n);
        // (32 lanes for outputs of 32 columns or fewer: attention's P @ V per head, where
        // 64 left half of them idle.)
        let lanes = match (vec4, n) {
            (true, _) => 16 * tn,
            (false, 0..=32) => 32,
            (false, _) => 64,
        };
        src.push_str(&format!("const LANES: u32 = {lanes}u;\n"));
        if vec4 {
            (tm, 4, tm, lanes * 4)
        } else {
            (tm, tn, tm, lanes * tn)
        }
    } else {
        // Rows and columns per invocation: 16-, 32- or 64-wide tiles, the smallest that
        // covers M and N, so thin outputs do not waste a 64-wide tile.
        let per = |x: usize, most: u8| {
            match x {
                0..=16 => 1,
                17..=32 => 2,
                _ => 4,
            }
            .min(most.max(1) as usize)
        };
        let (tm, tn) = (per(m, caps.matmul_tile.0), per(n, caps.matmul_tile.1));
        (tm, tn, 16 * tm, 16 * tn)
    }
}

/// [`tiles`] for `matmul_direct_subgroup.wgsl`: rows per workgroup TM (1, 2 or 4 for
/// tiny products, else a multiple of 8 up to 64, or `TESSERA_MATMUL_ROWS`: every 8 rows share one load per
/// k-step, so taller tiles load less), lowered while the product would have fewer than
/// 4 workgroups to spread over the adapter's threads.
fn subgroup_tiles(
    m: usize,
    n: usize,
    batch: usize,
    caps: &ShaderCaps,
    src: &mut String,
) -> (usize, usize, usize, usize) {
    // Columns per workgroup (64 lanes' worth at most): the widest block that leaves the
    // fewest columns idle in the last one (N = 384 takes 3 blocks of 128, not 2 of 256).
    let most = match n {
        0..=64 => 1,
        65..=128 => 2,
        _ => 4,
    }
    .min(caps.matmul_tile.1.max(1) as usize);
    let idle = |tn: usize| n.div_ceil(64 * tn) * 64 * tn - n;
    let tn = [4, 2, 1].into_iter().filter(|&t| t <= most).min_by_key(|&t| (idle(t), usize::MAX - t)).unwrap_or(1);
    let lanes = 16 * tn;
    let col_groups = n.div_ceil(lanes * 4).max(1);
    let cap =
        std::env::var("TESSERA_MATMUL_ROWS").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(64).clamp(8, 64);
    let mut tm = if m <= 8 { m.next_power_of_two().max(1) } else { m.next_multiple_of(8).min(cap / 8 * 8) };
    while tm > 8 && m.div_ceil(tm) * col_groups * batch < 4 {
        tm -= 8;
    }
    src.push_str(&format!("const LANES: u32 = {lanes}u;\n"));
    (tm, 4, tm, lanes * 4)
}

/// [`subgroup_tiles`] for `matmul_direct_wide.wgsl`: 8 columns per lane, 8 to 32 lanes
/// (the fewest idle columns, then the most lanes), and up to 32 rows per workgroup
/// (`TESSERA_MATMUL_ROWS` forces up to 96 with 8 columns), lowered while the product
/// would have fewer than 4 workgroups. With `two_blocks` (f32 operands from textures), a
/// product of more than 24 rows whose columns pad no worse takes 16 columns per lane at
/// 32 rows ([`wide_cols`]). Returns `(TM, columns per lane, BM, BN)`.
fn wide_tiles(m: usize, n: usize, batch: usize, two_blocks: bool, src: &mut String) -> (usize, usize, usize, usize) {
    let cols = if two_blocks { wide_cols(m, n, batch) } else { 8 };
    let lanes = wide_lanes(n, cols);
    let col_groups = n.div_ceil(lanes * cols).max(1);
    let forced = std::env::var("TESSERA_MATMUL_ROWS").ok().and_then(|v| v.parse::<usize>().ok());
    let mut tm = match forced {
        Some(f) if cols == 8 => m.next_multiple_of(8).min(f.clamp(8, 96) / 8 * 8),
        _ => m.next_multiple_of(8).min(32),
    };
    while cols == 8 && tm > 8 && m.div_ceil(tm) * col_groups * batch < 4 {
        tm -= 8;
    }
    src.push_str(&format!("const LANES: u32 = {lanes}u;\nconst COLS: u32 = {cols}u;\n"));
    (tm, cols, tm, lanes * cols)
}

/// Columns per lane of an f32 wide matmul from textures: 16 where the product
/// has more than 24 rows and at least 4 workgroups of 32 rows at the lanes
/// [`wide_lanes`] gives (always from 128 rows), and
/// its columns pad to a multiple of 128 no worse than to one of 64; 8 otherwise
/// (`TESSERA_MATMUL_COLS=8` always). A lane's A values are then shuffled once for 16
/// columns, not 8. In the kernel lab (MiniLM's FFN-up, 704x1536x384, one thread, 2-core
/// Zen 3, best of 6 alternating): 28.7 GFLOP/s at 32 rows against 26.5 with 8 columns at
/// 32 rows and 28.2 at 88 (the tall tile it replaces), with 4% fewer JIT instructions
/// than the 88-row tile, and it compiles in about half the time (2.1 against 3.9 s,
/// Mesa's cache off). On a 2-core Zen 4 (AVX-512), MiniLM's batch of 32 spent 215-216
/// ms in kernels against 231-233 with 8 columns. One height for every such product, so a
/// batch of a size not seen before compiles nothing.
fn wide_cols(m: usize, n: usize, batch: usize) -> usize {
    let pad = |block: usize| n.next_multiple_of(block) - n;
    let groups = m.div_ceil(32) * n.div_ceil(16 * wide_lanes(n, 16)) * batch;
    let off = std::env::var("TESSERA_MATMUL_COLS").as_deref() == Ok("8");
    if !off && m > 24 && groups >= 4 && pad(128) <= pad(64) {
        16
    } else {
        8
    }
}

/// Lanes per workgroup of a wide matmul with `cols` columns per lane: the fewest idle
/// columns over `n`, then the most lanes.
fn wide_lanes(n: usize, cols: usize) -> usize {
    let idle = |lanes: usize| n.div_ceil(cols * lanes) * cols * lanes - n;
    [32, 16, 8].into_iter().min_by_key(|&l| (idle(l), usize::MAX - l)).unwrap_or(8)
}

/// Row counts whose products, between them, take every slowly compiled tile that a
/// product of at most `max_rows` rows can take: 128, from which every f32 wide matmul
/// whose columns suit takes 16 columns per lane at 32 rows ([`wide_cols`]; the same
/// kernel for any row count). Those kernels take seconds each to compile on lavapipe the
/// first time on a machine: a model run once at each count has them, so no later batch
/// waits for one (`tessera-serve` does so at load). The tiles of 32 rows or fewer with 8
/// columns, which products of fewer rows take, compile in a second or less.
pub fn warm_rows(max_rows: usize) -> Vec<usize> {
    if max_rows >= 128 {
        vec![128]
    } else {
        Vec::new()
    }
}

/// Workgroups `[columns, rows, batch]`, checked against the per-dimension limit.
fn check_groups(label: &str, groups: [usize; 3], caps: &ShaderCaps) -> Result<[u32; 3]> {
    let max = caps.max_workgroups as usize;
    for (what, v) in ["columns", "rows", "batch"].into_iter().zip(groups) {
        if v > max {
            return Err(Error::Limit {
                what: format!("{label}: workgroups over {what}"),
                needed: v as u64,
                limit: max as u64,
            });
        }
    }
    Ok(groups.map(|g| g as u32))
}

/// The trusted kernel of a product: workgroups `[columns, rows, batch]` checked against
/// the per-dimension limit (none dispatched for an empty output).
fn product_spec(
    root: &Tensor,
    label: String,
    source: String,
    meta: Vec<u32>,
    (a, b): (Tensor, Tensor),
    groups: [usize; 3],
    caps: &ShaderCaps,
) -> Result<KernelSpec> {
    let groups = check_groups(&label, groups, caps)?;
    let workgroups = if root.numel() == 0 { [0, 1, 1] } else { groups };
    Ok(KernelSpec::hand_written(label, source, meta, vec![a, b], root, workgroups, true))
}

/// WGSL `ld4_b(i)` for the subgroup kernel over a quantised weight bound as
/// `in_b: array<u32>` (scales, then quants from word `qoff`): values `4i .. 4i + 3` of the
/// weight in row-major order, dequantised. K % 32 == 0, so the four lie in one block:
/// block `i / 8`, at offset `4 (i % 8)` in it.
fn quant_ld4(dtype: DType, qoff: &str) -> String {
    let scale = "    let blk = i >> 3u;\n    let s = unpack2x16float(word_b(blk >> 1u))[blk & 1u];\n";
    let body = if dtype == DType::Q8_0 {
        // Q8_0: the block's 32 bytes are 8 words in order; word i holds the four.
        format!(
            "    let w = word_b({qoff} + i);\n    \
             return vec4<f32>(vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u), bitcast<i32>(w)) >> vec4<u32>(24u)) * s;\n"
        )
    } else {
        // Q4_0: 16 bytes, byte j holding value j in its low nibble and j + 16 in its high.
        format!(
            "    let t = i & 7u;\n    let w = word_b({qoff} + blk * 4u + (t & 3u)) >> select(0u, 4u, t >= 4u);\n    \
             let b = (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u);\n    \
             return (vec4<f32>(b) - 8.0) * s;\n"
        )
    };
    format!("fn ld4_b(i: u32) -> vec4<f32> {{\n{scale}{body}}}\n")
}

/// WGSL `ld8_b(q: u32) -> Oct` for the wide kernel over a quantised weight read as words
/// (`word_b`: scales, then quants from word `qoff`): values `8q .. 8q + 7` of the weight
/// in row-major order, dequantised. K % 32 == 0, so the eight lie in one block: block
/// `q / 4`, its 8-value group `q % 4`.
#[cfg(not(target_arch = "wasm32"))]
fn quant_ld8(dtype: DType, qoff: &str) -> String {
    let scale = "    let blk = q >> 2u;\n    let s = unpack2x16float(word_b(blk >> 1u))[blk & 1u];\n";
    let body = if dtype == DType::Q8_0 {
        // Q8_0: the group's 8 bytes are words 2q and 2q + 1, four signed bytes each.
        format!(
            "    return Oct(i8x4(word_b({qoff} + 2u * q)) * s, i8x4(word_b({qoff} + 2u * q + 1u)) * s);\n}}\n\
             fn i8x4(w: u32) -> vec4<f32> {{\n    \
             return vec4<f32>(vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u), bitcast<i32>(w)) >> vec4<u32>(24u));\n"
        )
    } else {
        // Q4_0: 16 bytes, byte j holding value j in its low nibble and j + 16 in its high:
        // groups 0 and 1 are the low nibbles of words 0-1 and 2-3, groups 2 and 3 the high.
        format!(
            "    let g = q & 3u;\n    let at = {qoff} + blk * 4u + 2u * (g & 1u);\n    \
             let sh = select(0u, 4u, g >= 2u);\n    \
             return Oct(u4x4(word_b(at) >> sh) * s, u4x4(word_b(at + 1u) >> sh) * s);\n}}\n\
             fn u4x4(w: u32) -> vec4<f32> {{\n    \
             return vec4<f32>((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u)) - 8.0;\n"
        )
    };
    format!("fn ld8_b(q: u32) -> Oct {{\n{scale}{body}}}\n")
}

/// What the GEMV kernels' block dot products share per weight format: a block's f16
/// scale, and a word's four signed bytes.
const GEMV_SCALE: &str = "fn scale(blk: u32) -> f32 {
    return unpack2x16float(in_b[blk >> 3u][(blk >> 1u) & 3u])[blk & 1u];
}
";
const GEMV_BYTES_I8: &str = "fn bytes_i8(w: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u), bitcast<i32>(w)) >> vec4<u32>(24u));
}
";

/// WGSL `dot_block(blk, xv)` for `gemv.wgsl`: block `blk` (32 values) of a weight in
/// `dtype` (f32 or a block format), bound as `in_b: array<vec4<u32>>`, dotted with the
/// 32 values `xv` (after [`GEMV_SCALE`] and [`GEMV_BYTES_I8`] for block formats).
fn gemv_dot_block(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => {
            "fn dot_block(blk: u32, xv: array<vec4<f32>, 8>) -> f32 {
    var s = 0.0;
    for (var t = 0u; t < 8u; t = t + 1u) {
        s = s + dot(bitcast<vec4<f32>>(in_b[blk * 8u + t]), xv[t]);
    }
    return s;
}
"
        }
        DType::Q8_0 => {
            "fn dot_block(blk: u32, xv: array<vec4<f32>, 8>) -> f32 {
    let q0 = in_b[qoff4() + 2u * blk];
    let q1 = in_b[qoff4() + 2u * blk + 1u];
    let s = dot(bytes_i8(q0.x), xv[0]) + dot(bytes_i8(q0.y), xv[1]) + dot(bytes_i8(q0.z), xv[2]) + dot(bytes_i8(q0.w), xv[3])
        + dot(bytes_i8(q1.x), xv[4]) + dot(bytes_i8(q1.y), xv[5]) + dot(bytes_i8(q1.z), xv[6]) + dot(bytes_i8(q1.w), xv[7]);
    return scale(blk) * s;
}
"
        }
        DType::Q4_0 => {
            "fn dot_block(blk: u32, xv: array<vec4<f32>, 8>) -> f32 {
    let q = in_b[qoff4() + blk];
    var s = 0.0;
    for (var t = 0u; t < 4u; t = t + 1u) {
        // Byte j of the block: element j in its low nibble, element j + 16 in its high.
        let b = (vec4<u32>(q[t]) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u);
        s = s + dot(vec4<f32>(b & vec4<u32>(15u)) - 8.0, xv[t]) + dot(vec4<f32>(b >> vec4<u32>(4u)) - 8.0, xv[4u + t]);
    }
    return scale(blk) * s;
}
"
        }
        _ => "",
    }
}

/// `dot8(blk, x0 .. x7)` of `gemv_rows.wgsl`: [`gemv_dot_block`] with X as eight
/// named vec4s.
fn gemv_dot8(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => {
            "fn dot8(blk: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let b = blk * 8u;
    return dot(bitcast<vec4<f32>>(in_b[b]), x0) + dot(bitcast<vec4<f32>>(in_b[b + 1u]), x1)
        + dot(bitcast<vec4<f32>>(in_b[b + 2u]), x2) + dot(bitcast<vec4<f32>>(in_b[b + 3u]), x3)
        + dot(bitcast<vec4<f32>>(in_b[b + 4u]), x4) + dot(bitcast<vec4<f32>>(in_b[b + 5u]), x5)
        + dot(bitcast<vec4<f32>>(in_b[b + 6u]), x6) + dot(bitcast<vec4<f32>>(in_b[b + 7u]), x7);
}
"
        }
        DType::Q8_0 => {
            "fn dot8(blk: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let q0 = in_b[qoff4() + 2u * blk];
    let q1 = in_b[qoff4() + 2u * blk + 1u];
    return scale(blk) * (dot(bytes_i8(q0.x), x0) + dot(bytes_i8(q0.y), x1) + dot(bytes_i8(q0.z), x2) + dot(bytes_i8(q0.w), x3)
        + dot(bytes_i8(q1.x), x4) + dot(bytes_i8(q1.y), x5) + dot(bytes_i8(q1.z), x6) + dot(bytes_i8(q1.w), x7));
}
"
        }
        DType::Q4_0 => {
            "// Word w of a block: elements 4w .. 4w+3 in its bytes' low nibbles, 16+4w .. in the high.
fn nibbles(w: u32, lo: vec4<f32>, hi: vec4<f32>) -> f32 {
    let b = (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u);
    return dot(vec4<f32>(b & vec4<u32>(15u)) - 8.0, lo) + dot(vec4<f32>(b >> vec4<u32>(4u)) - 8.0, hi);
}
fn dot8(blk: u32, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>, x4: vec4<f32>, x5: vec4<f32>, x6: vec4<f32>, x7: vec4<f32>) -> f32 {
    let q = in_b[qoff4() + blk];
    return scale(blk) * (nibbles(q.x, x0, x4) + nibbles(q.y, x1, x5) + nibbles(q.z, x2, x6) + nibbles(q.w, x3, x7));
}
"
        }
        _ => "",
    }
}

/// Whether one row of X on a GPU takes `gemv_rows.wgsl` (`TESSERA_GEMV_ROWS=0`: the
/// `gemv.wgsl` kernel; never in the npm package).
fn gemv_rows(m: usize, caps: &ShaderCaps) -> bool {
    cfg!(not(target_arch = "wasm32"))
        && m == 1
        && !caps.direct_matmul
        && std::env::var("TESSERA_GEMV_ROWS").as_deref() != Ok("0")
}

/// The GEMV kernel (`shaders/gemv.wgsl`) for `render`'s eligible products.
fn render_gemv(
    root: &Tensor,
    (a, b): (Tensor, Tensor),
    (m, n): (usize, usize),
    meta: Vec<u32>,
    mut src: String,
    qoff_b: Option<&str>,
    caps: &ShaderCaps,
) -> Result<KernelSpec> {
    src.push_str("@group(0) @binding(2) var<storage, read> in_a: array<vec4<f32>>;\n");
    src.push_str("@group(0) @binding(3) var<storage, read> in_b: array<vec4<u32>>;\n");
    if let Some(q) = qoff_b {
        src.push_str(&format!("fn qoff4() -> u32 {{ return {q} >> 2u; }}\n"));
    }
    if b.dtype().is_quantized() {
        src.push_str(GEMV_SCALE);
    }
    if b.dtype() == DType::Q8_0 {
        src.push_str(GEMV_BYTES_I8);
    }
    src.push_str(sources::MATMUL_BATCH);
    let r = root.rank();
    let batch: usize = root.dims()[..r - 2].iter().product();
    if gemv_rows(m, caps) {
        // Rows of W per group of lanes: more in flight for long outputs.
        let rows = match n {
            0..=511 => 1,
            512..=2047 => 2,
            _ => 4,
        };
        src.push_str(&format!("const R: u32 = {rows}u;\n"));
        src.push_str(gemv_dot8(b.dtype()));
        src.push_str(sources::GEMV_ROWS);
        let label = format!("gemv_rows_{}_{}", b.dtype(), 8 * rows);
        return product_spec(root, label, src, meta, (a, b), [n.div_ceil(8 * rows), 1, batch], caps);
    }
    let tm = m.next_power_of_two().clamp(1, 8);
    let (cols, split, cpl) = if caps.direct_matmul { (64, 1, 4) } else { (8, 32, 1) };
    src.push_str(&format!(
        "const TM: u32 = {tm}u;\nconst COLS: u32 = {cols}u;\nconst SPLIT: u32 = {split}u;\nconst CPL: u32 = {cpl}u;\n"
    ));
    src.push_str(gemv_dot_block(b.dtype()));
    src.push_str(sources::GEMV);
    let label = format!("gemv_{}_{}x{}", b.dtype(), tm, cols * cpl);
    // Row and column indices clamped, blocks within each clamped row, stores guarded.
    product_spec(root, label, src, meta, (a, b), [n.div_ceil(cols * cpl), m.div_ceil(tm), batch], caps)
}

#[cfg(test)]
mod tests {
    #[test]
    fn past_24_rows_products_take_one_tile_height() {
        // (m, n) -> columns per lane and workgroup width: MiniLM's products in a batch,
        // few workgroups, and columns that would pad worse in blocks of 128.
        for (m, n, cols, bn) in [
            (704, 384, 16, 128),
            (704, 1536, 16, 512),
            (704, 1152, 16, 128),
            (128, 128, 16, 128),
            (32, 384, 8, 128),
            (96, 128, 8, 128),
            (1000, 136, 8, 64),
            (24, 1536, 8, 256),
            // 512 columns take one block of 32 lanes: 30 rows would be 1 workgroup.
            (30, 512, 8, 256),
            (100, 512, 16, 512),
        ] {
            let mut src = String::new();
            let (tm, c, _, w) = super::wide_tiles(m, n, 1, true, &mut src);
            assert_eq!((c, w), (cols, bn), "{m}x{n}");
            assert!(src.contains(&format!("const COLS: u32 = {cols}u;")), "{src}");
            if cols == 16 {
                assert_eq!(tm, 32, "{m}x{n}");
            }
        }
        // Every product from the warm row on that takes 16 columns takes the same height,
        // and one of 128 rows does wherever a larger one does.
        let warm = super::warm_rows(8192);
        assert_eq!(warm, [128]);
        for n in (8..2048).step_by(8) {
            let at = |m: usize| super::wide_tiles(m, n, 1, true, &mut String::new());
            let first = at(128);
            assert!(first.1 == 8 || first.0 == 32, "{n}");
            for m in (128..4096).step_by(37) {
                let t = at(m);
                assert_eq!(t.1, first.1, "{m}x{n}");
                if t.1 == 16 {
                    assert_eq!(t, first, "{m}x{n}");
                }
            }
        }
        assert!(super::warm_rows(127).is_empty());
        // Without two blocks (f16, quantised, AVX-512): 8 columns, at most 32 rows.
        assert_eq!(super::wide_tiles(704, 1536, 1, false, &mut String::new()), (32, 8, 32, 256));
    }
}
