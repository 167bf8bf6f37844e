//! Fused element-wise kernels: a root node and every element-wise or movement node under
//! it, down to materialised leaves, rendered into `shaders/elementwise.wgsl`.

use super::codegen::{Gen, Ix};
use super::{
    fold_groups, header, header_with_out, sources, storage_type, KernelSpec, ShaderCaps, TexelRead, Window, WG,
};

/// Outputs per invocation of an element-wise kernel (fewer workgroups to launch: on
/// lavapipe a 1M-element chain runs about 1.5x faster with 4 than with 1).
pub const EPT: u32 = 4;
use crate::graph::{BinaryOp, Op};
use crate::{DType, Result, Tensor};

/// Render the kernel that materialises `root`. `is_leaf` says which nodes are read from
/// buffers rather than recomputed.
pub fn render(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<KernelSpec> {
    let mut g = Gen::new(*caps, is_leaf);
    let n = root.numel();
    g.slot(n as u32); // meta[0]: element count
                      // meta[1], meta[2]: the first thread of this dispatch and the output binding's base
                      // (both 0 unless the executor splits the kernel into windows).
    g.slot(0);
    g.slot(0);
    g.windows = true;
    let v = g.eval(root, &Ix::lin("i"), true);
    g.decide_windows(root.storage_bytes());
    let quads = n > 0 && n.is_multiple_of(4) && !g.emit_windows && g.no_quantised_leaves();
    if quads && std::env::var("TESSERA_VEC4").as_deref() != Ok("0") {
        for lanes in Lanes::for_len(n, caps).into_iter().filter(|l| suits(l.form, &g.ops, caps)) {
            if let Some(spec) = render_vectors(root, is_leaf, lanes)? {
                return Ok(spec);
            }
        }
        if let Some(spec) = render_gathered_quads(root, is_leaf, caps)? {
            return Ok(spec);
        }
    }
    if let Some(spec) = render_runs(std::slice::from_ref(root), is_leaf, caps)? {
        return Ok(spec);
    }
    let body = std::mem::take(&mut g.body);
    let dt = root.dtype();
    let packed = dt == DType::F16 && !caps.native_f16;
    if dt == DType::F16 {
        g.uses_f16 = true;
    }
    let mut src = header(g.meta.len(), dt, g.uses_f16, caps);
    src.push_str(&g.leaf_decls());
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&format!("fn eval_out(i: u32) -> {} {{\n{body}    return {v};\n}}\n", super::compute_type(dt)));
    let store = match dt {
        DType::F16 if packed => "    let j = 2u * i;\n    if (j >= m(0u)) { return; }\n    let a = eval_out(j);\n    var b = 0.0;\n    if (j + 1u < m(0u)) { b = eval_out(j + 1u); }\n    out[i - m(2u)] = pack2x16float(vec2<f32>(a, b));\n".to_string(),
        // A load outside a gathered input's window (`Gen::leaf_len`) skips the store.
        DType::Bool if g.emit_windows => "    if (i >= m(0u)) { return; }\n    skip_out = false;\n    let v = select(0u, 1u, eval_out(i));\n    if (skip_out) { return; }\n    out[i - m(2u)] = v;\n".to_string(),
        DType::Bool => "    if (i >= m(0u)) { return; }\n    out[i] = select(0u, 1u, eval_out(i));\n".to_string(),
        _ if g.emit_windows => format!(
            "    if (i >= m(0u)) {{ return; }}\n    skip_out = false;\n    let v = {}(eval_out(i));\n    if (skip_out) {{ return; }}\n    out[i - m(2u)] = v;\n",
            storage_type(dt, caps)
        ),
        _ => format!("    if (i >= m(0u)) {{ return; }}\n    out[i] = {}(eval_out(i));\n", storage_type(dt, caps)),
    };
    if g.emit_windows {
        src.push_str("var<private> skip_out: bool;\n");
    }
    src.push_str(&format!("fn store_out(i: u32) {{\n{store}}}\n"));
    let threads = if packed { n.div_ceil(2) } else { n } as u64;
    let ept = EPT as u64;
    src.push_str(&format!("const EPT: u32 = {EPT}u;\n"));
    src.push_str(sources::ELEMENTWISE);
    let label = label(&g.ops);
    let workgroups = fold_groups(threads.div_ceil(WG as u64 * ept), caps, &label)?;
    let input_base = g.window_bases(n);
    let gather = g.gather_slots();
    let mut spec = g.finish(label, src, root, workgroups);
    let per_thread = if packed { 2 } else { 1 };
    spec.window = Some(Window {
        first: 1,
        out_base: 2,
        input_base,
        per_thread,
        inputs_per_output: 1,
        outputs_per_group: WG as u64 * ept * per_thread as u64,
        // Packed f16 stores two outputs per word, which may come from two windows.
        gather: if packed { Vec::new() } else { gather },
        accumulate: None,
        reduces: false,
    });
    Ok(spec)
}

/// Whether an expression of these ops suits `form` (where the adapter has wide loads).
/// [`Form::TexelsIn`] suits every expression with an f32 input that fits an operand
/// texture; the other forms are for the rest. Measured on lavapipe (2-core Xeon,
/// AVX-512), ms per 4M f32, two runs of `TESSERA_ELEMENTWISE_FORM=... bench
/// elementwise-ops`:
///
/// | expression | quads | wide | wide stores |
/// | --- | --- | --- | --- |
/// | `x * 2 + 1` | 3.33-3.42 | 2.31-2.50 | 2.74-2.78 |
/// | `exp(x)` | 3.54 | 2.90-2.98 | 2.88-2.96 |
/// | `sigmoid(x)` | 3.74-3.78 | 3.56-3.77 | 2.86 (5.82 once) |
/// | `relu(x)` | 3.04-3.10 | 3.96-4.17 | 2.43-2.63 |
/// | `relu(x + y)` | 4.23-4.42 | 2.94-3.13 | 3.59-3.79 |
/// | `relu(x * 2 + 1)` | 3.31 | 2.34-2.36 | 2.68-2.83 |
/// | `relu(x) * y` | 4.19 | 3.01-3.05 | 3.65-3.76 |
/// | `relu(tanh(exp(x*2+1))*x)` | 5.66-5.75 | 6.96-7.45 | 4.54-4.98 |
/// | `gelu(x)` | 4.10-4.36 | 5.11-5.26 | 4.09-4.66 |
/// | `log(abs(x) + 1)` | 4.20-4.21 | 3.88-3.92 | 3.37-3.48 |
/// | `x / (sqrt(abs(y)) + 1e-8)` | 4.56-4.67 | 3.07-3.35 | 4.07-4.27 |
///
/// So on hosts with AVX-512: cheap expressions wide (a relu among other ops too, but not
/// a relu alone), ones with a transcendental wide stores, and erf and GELU quads. (`log`
/// took 3.8-4.2, 5.2 and 5.1-5.7 ms while its NaN below 0 was a float select; see
/// `codegen::nan_below_zero`.)
///
/// Without AVX-512 ([`ShaderCaps::no_avx512`]) every expression goes wide. 2-core AMD
/// EPYC (Zen 3, AVX2), same bench, two runs each (default choice / wide): `exp` 18.4-19.7
/// / 12.5-12.7 ms, `sigmoid` 17.7-19.2 / 12.4-12.6, `relu` 16.9-19.7 / 12.0-12.1, the
/// chain 20.9-21.4 / 14.6-15.1, `gelu` 20.9-21.2 / 14.5, `log(abs(x) + 1)` 20.4-21.6 /
/// 13.2-14.3; wide stores took 17-23 ms on all of these.
///
/// Where f32 inputs fit operand textures, they go as texels ([`Form::TexelsIn`]) before
/// any of that. On that Zen 3, with the copy into the texture in every run, two runs each
/// (wide / texels in, ms): `x * 2 + 1` 9.3-9.4 / 3.8-6.2, `exp` 9.8 / 4.4-4.9, `sigmoid`
/// 9.9 / 4.7-7.9, `relu` 9.6-14.6 / 3.4-3.9, `relu(x + y)` 16.6-16.7 / 6.3-7.6, the chain
/// 11.0-11.2 / 6.1-6.4, `gelu` 11.1 / 5.9-6.1, `x / (sqrt(abs(y)) + 1e-8)` 17.0 / 6.9-7.1.
/// On a 2-core Zen 4 (AVX-512) the copy (about 1.6 ms for 4M f32, on one thread) ate what
/// the texel loads saved until the pool kept copies across submits; since, an input
/// realised earlier is copied once, and two alternating runs (the form above / texels
/// in, ms): `x * 2 + 1` 3.35-3.45 / 2.24-2.48, `exp` 3.83-5.74 / 2.50-2.63, `sigmoid`
/// 4.30-8.77 / 2.67-2.77, `relu` 3.84-7.82 / 1.94-2.04, `relu(x + y)` 4.23-8.31 /
/// 2.81-3.04, the chain 6.21-7.69 / 4.12-4.23, `gelu` 6.19-6.21 / 3.73-3.95,
/// `log(abs(x) + 1)` 4.78-4.97 / 3.53-4.24, `x / (sqrt(abs(y)) + 1e-8)` 4.76-5.12 /
/// 5.13-5.20 (the one not faster).
///
/// `TESSERA_ELEMENTWISE_FORM=quads|wide|wide-stores|texels-in` forces a form where it applies
/// (quads otherwise), for such measurements.
fn suits(form: Form, ops: &[String], caps: &ShaderCaps) -> bool {
    const TRANSCENDENTAL: [&str; 11] =
        ["exp", "log", "tanh", "sigmoid", "silu", "sin", "cos", "pow", "erf", "geluerf", "gelutanh"];
    const QUADS_FASTER: [&str; 3] = ["erf", "geluerf", "gelutanh"];
    let has = |names: &[&str]| names.iter().any(|n| ops.iter().any(|o| o == n));
    let relu_alone = !ops.is_empty() && ops.iter().all(|o| o == "relu");
    if cfg!(target_arch = "wasm32") {
        return true;
    }
    if let Ok(forced) = std::env::var("TESSERA_ELEMENTWISE_FORM") {
        let name = match form {
            Form::Quads => "quads",
            Form::Wide => "wide",
            Form::WideStores => "wide-stores",
            Form::TexelsIn => "texels-in",
        };
        return form == Form::Quads || forced == name;
    }
    match form {
        Form::Quads => true,
        Form::WideStores => !has(&QUADS_FASTER),
        Form::Wide => caps.no_avx512 || (!has(&TRANSCENDENTAL) && !relu_alone),
        // Every CPU adapter (see `Form::TexelsIn`).
        Form::TexelsIn => true,
    }
}

/// How a vector kernel moves values ([`Lanes`]).
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// A quad (4 values) per storage access, in the dtype's own vector.
    Quads,
    /// Eight 32-bit values per access, loads and stores, as one `vec4<u64>`
    /// ([`ShaderCaps::wide_loads`]).
    Wide,
    /// Eight values per invocation, loaded as two quads and stored as one `vec4<u64>`.
    /// On lavapipe (AVX-512 hosts) LLVM assembles a wide load in a 512-bit register, and
    /// while 512-bit operations are in flight the 256-bit arithmetic around them slows
    /// (one 64-bit multiply added to the quad chain cost it 15%); a wide store is packed
    /// lane by lane in scalar registers and does not. Kernel lab, 4M f32, best of 3
    /// interleaved runs on the lab's scale (wide stores, wide, quads): `exp` 552, 494,
    /// 447; `tanh` 484, 398, 412; `x * 2 + 1` 617, 721, 527. See [`suits`].
    WideStores,
    /// [`WideStores`](Self::WideStores) with each f32 input that fits an operand
    /// texture ([`ShaderCaps::texture_rows`]) read as two texels of a read-only storage
    /// texture (`kernels::TexelRead`): lavapipe loads a texel inline, without the loop
    /// over the SIMD lanes that a storage load runs, and the executor's copy into the
    /// texture costs less than that loop (and is kept for later submits where the input
    /// was realised before). Kernel lab, 2-core Zen 3 (AVX2), 4M f32, the chain
    /// `relu(tanh(exp(x*2+1))*x)` with its copy: 8.0-8.8 ms against 12.2-12.3 as
    /// `vec4<u64>` in and out (two threads).
    TexelsIn,
}

/// How a vector kernel moves values: its [`Form`] on an adapter with these caps.
#[derive(Clone, Copy)]
struct Lanes {
    form: Form,
    caps: ShaderCaps,
}

const XYZW: [&str; 4] = ["x", "y", "z", "w"];

impl Lanes {
    /// The forms to try for `n` elements (a multiple of 4), widest first.
    fn for_len(n: usize, caps: &ShaderCaps) -> Vec<Lanes> {
        let wide = caps.wide() && n.is_multiple_of(8);
        let texels = wide && caps.texture_rows > 0;
        [Form::TexelsIn, Form::Wide, Form::WideStores, Form::Quads]
            .into_iter()
            .filter(|&f| match f {
                Form::Quads => true,
                Form::TexelsIn => texels,
                Form::Wide | Form::WideStores => wide,
            })
            .map(|form| Lanes { form, caps: *caps })
            .collect()
    }

    /// Whether inputs load eight values at a time. Never in the npm package: browsers
    /// have no 64-bit integers, and the constant drops the wide code from it.
    fn wide_in(self) -> bool {
        !cfg!(target_arch = "wasm32") && self.form == Form::Wide
    }

    /// Whether the output stores eight values at a time (never in the npm package).
    fn wide_out(self) -> bool {
        !cfg!(target_arch = "wasm32") && self.form != Form::Quads
    }

    /// Whether each input loads as two quads (wide stores).
    fn two_quads(self) -> bool {
        self.wide_out() && !self.wide_in()
    }

    /// Whether leaf `t` is read from an operand texture ([`Form::TexelsIn`]).
    fn texels(self, t: &Tensor) -> bool {
        self.form == Form::TexelsIn && super::texturable(t, &self.caps)
    }

    /// Values per invocation (per output vector).
    fn width(self) -> usize {
        if self.wide_out() {
            8
        } else {
            4
        }
    }

    /// Values per input load.
    fn load_width(self) -> usize {
        if self.wide_in() {
            8
        } else {
            4
        }
    }

    /// Whether inputs of `t` load this way: quads take every dtype, wide loads 32-bit ones.
    fn loads(self, t: DType) -> bool {
        !self.wide_in() || is_32_bit(t)
    }

    /// Whether outputs of `t` store this way: wide stores take 32-bit ones.
    fn stores(self, t: DType) -> bool {
        !self.wide_out() || is_32_bit(t)
    }

    /// The WGSL type of one quad of `t`.
    fn quad_type(self, t: DType) -> &'static str {
        match t {
            DType::F32 => "vec4<f32>",
            DType::I32 => "vec4<i32>",
            DType::F16 if self.caps.native_f16 => "vec4<f16>",
            DType::F16 => "vec2<u32>",
            _ => "vec4<u32>",
        }
    }

    /// The WGSL type of one input vector of `t`.
    fn in_type(self, t: DType) -> &'static str {
        if self.wide_in() {
            "vec4<u64>"
        } else {
            self.quad_type(t)
        }
    }

    /// The WGSL type of one output vector of `t`.
    fn out_type(self, t: DType) -> &'static str {
        if self.wide_out() {
            "vec4<u64>"
        } else {
            self.quad_type(t)
        }
    }

    /// Lane `c` of input `k`'s loaded vectors `a{k}` (`a{k}_0`, `a{k}_1` for two quads),
    /// in `t`'s compute type.
    fn read(self, t: DType, k: usize, c: usize) -> String {
        if self.wide_in() {
            let word = format!("a{k}.{}", XYZW[c / 2]);
            let bits = match c % 2 {
                0 => format!("u32({word} & 0xfffffffflu)"),
                _ => format!("u32({word} >> 32u)"),
            };
            return match t {
                DType::Bool => format!("({bits} != 0u)"),
                DType::F32 => format!("bitcast<f32>({bits})"),
                DType::I32 => format!("bitcast<i32>({bits})"),
                _ => bits,
            };
        }
        let a = match self.two_quads() {
            true => format!("a{k}_{}", c / 4),
            false => format!("a{k}"),
        };
        let c = c % 4;
        match t {
            DType::Bool => format!("({a}.{} != 0u)", XYZW[c]),
            DType::F16 if self.caps.native_f16 => format!("f32({a}.{})", XYZW[c]),
            DType::F16 => format!("unpack2x16float({a}.{})[{}u]", XYZW[c / 2], c % 2),
            _ => format!("{a}.{}", XYZW[c]),
        }
    }

    /// The loads of every leaf of `g` as vectors, declared in `src`: the parameters of
    /// `eval_out`, the statements loading vector `q` (or the permute input's `pq`, or
    /// `q % len` of a repeated row; quads `2q` and `2q + 1` for wide stores), per lane
    /// the arguments that pass the leaves, and the leaves read from textures (one bit
    /// per leaf, `KernelSpec::textured`).
    fn bind_leaves(self, g: &Gen, src: &mut String) -> (Vec<String>, String, Vec<String>, u32) {
        let mut params = vec!["i: u32".to_string()];
        let mut loads = String::new();
        let mut args = vec![String::new(); self.width()];
        let mut textured = 0u32;
        for (k, t) in g.leaves.iter().enumerate() {
            let texels = self.texels(t);
            if texels {
                src.push_str(&super::texture_binding(2 + k as u32, &format!("in{k}"), "f32", TexelRead::Storage));
                textured |= 1 << k;
            } else {
                src.push_str(&format!(
                    "@group(0) @binding({}) var<storage, read> in{k}: array<{}>;\n",
                    2 + k,
                    self.in_type(t.dtype())
                ));
            }
            params.push(format!("p{k}: {}", super::compute_type(t.dtype())));
            // Under a permute read by quads, the leaf's quad is the permute input's `pq`.
            let q = if g.param_permuted.contains(&k) { "pq" } else { "q" };
            let at = |v: &str| match (g.param_period.get(&k), texels) {
                (Some(slot), false) => format!("in{k}[{v} % m({slot}u)]"),
                (None, false) => format!("in{k}[{v}]"),
                (Some(slot), true) => format!("fetch_in{k}({v} % m({slot}u))"),
                (None, true) => format!("fetch_in{k}({v})"),
            };
            if self.two_quads() {
                loads.push_str(&format!(
                    "    let a{k}_0 = {};\n    let a{k}_1 = {};\n",
                    at(&format!("(2u * {q})")),
                    at(&format!("(2u * {q} + 1u)"))
                ));
            } else {
                loads.push_str(&format!("    let a{k} = {};\n", at(q)));
            }
            for (c, a) in args.iter_mut().enumerate() {
                a.push_str(&format!(", {}", self.read(t.dtype(), k, c)));
            }
        }
        (params, loads, args, textured)
    }

    /// The output vector of `t` that stores `values`, one per lane in `t`'s compute type.
    fn pack(self, t: DType, values: &[String]) -> String {
        let store = |e: &String| store_value(t, e, &self.caps);
        if self.wide_out() {
            let bits = |e: &String| match t {
                DType::F32 | DType::I32 => format!("bitcast<u32>({})", store(e)),
                _ => store(e),
            };
            let words: Vec<String> =
                values.chunks(2).map(|p| format!("(u64({}) | (u64({}) << 32u))", bits(&p[0]), bits(&p[1]))).collect();
            return format!("vec4<u64>({})", words.join(", "));
        }
        if t == DType::F16 && !self.caps.native_f16 {
            let pair = |a: &String, b: &String| format!("pack2x16float(vec2<f32>({a}, {b}))");
            return format!("vec2<u32>({}, {})", pair(&values[0], &values[1]), pair(&values[2], &values[3]));
        }
        let lanes: Vec<String> = values.iter().map(store).collect();
        format!("{}({})", self.quad_type(t), lanes.join(", "))
    }
}

/// Rows gathered from f32 tables along an outer axis (an embedding lookup, or a sum of
/// several: BERT's word, position and token-type rows), a quad at a time: every value
/// on the way from the tables to the output keeps the innermost axis (a multiple of 4
/// long), so a quad of the output reads one quad of each table row (`ld{k}q`), and the
/// ids are read once per quad instead of once per element. The index expressions are
/// evaluated as in the scalar kernel, bounds checks included. Native only (the npm
/// package's size budget). `None` where the expression is not of that form.
/// (lavapipe, MiniLM's embeddings for 32 x 22 tokens: 3.4 ms element by element.)
fn render_gathered_quads(
    root: &Tensor,
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
) -> Result<Option<KernelSpec>> {
    let d = root.dims().last().copied().unwrap_or(0);
    let n = root.numel();
    if cfg!(target_arch = "wasm32") || root.dtype() != DType::F32 || d == 0 || !d.is_multiple_of(4) || n == 0 {
        return Ok(None);
    }
    let mut path = GatheredPath::default();
    if !path.walk(root, d, is_leaf, true) || path.index_roots.is_empty() {
        return Ok(None);
    }
    // The index expressions are evaluated per element; none may reach a quad value.
    let mut seen = std::collections::HashSet::new();
    if path.index_roots.iter().any(|t| path.reaches_values(t, is_leaf, &mut seen)) {
        return Ok(None);
    }
    let mut g = Gen::new(*caps, is_leaf);
    g.slot((n / 4) as u32); // meta[0]: quad count
    g.quad_reads = path.tables;
    // (`render` took this path only where no leaf is quantised.)
    let v = g.eval(root, &Ix::lin("i"), true);
    let body = std::mem::take(&mut g.body);
    let mut src = header_with_out(g.meta.len(), "vec4<f32>", g.uses_f16, caps);
    src.push_str(&g.leaf_decls());
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&format!("fn eval_out(i: u32) -> vec4<f32> {{\n{body}    return {v};\n}}\n"));
    src.push_str("fn store_quad(q: u32) {\n    if (q >= m(0u)) { return; }\n    out[q] = eval_out(4u * q);\n}\n");
    src.push_str(&format!("const EPT: u32 = {EPT}u;\n"));
    src.push_str(sources::ELEMENTWISE_VEC4);
    let label = label(&g.ops);
    let workgroups = fold_groups(((n / 4) as u64).div_ceil(WG as u64 * EPT as u64), caps, &label)?;
    Ok(Some(g.finish(label, src, root, workgroups)))
}

/// The comment that opens a run kernel's `store_quad`.
const RUNS: &str = "// Four lanes along the innermost axis: lane j at coordinate base + j.\n";

/// Runs of four along the innermost axis (a multiple of 4 long), for expressions whose
/// index arithmetic the vector kernels cannot avoid (sliding windows, permutes that move
/// the innermost axis, slices): each invocation unravels the run's first index once and
/// evaluates the expression at `base + j` of the innermost coordinate for each lane `j`,
/// so a division the lanes share is done once (a reshape splitting that coordinate by
/// a length that is a multiple of 4 divides `base`: [`Gen::lane_coords`]), then stores
/// the four values as one vector. Loads stay per element, bounds checks included.
/// Sibling roots of one shape ([`render_siblings`]) share the runs and store a vector
/// each. (lavapipe, the columns of a 3x3 convolution over 8x64x56x56: 369-404 ms
/// element by element, five divisions each, 143 ms in runs.) `TESSERA_RUNS=0` turns it
/// off, for measurements.
fn render_runs(roots: &[Tensor], is_leaf: &dyn Fn(&Tensor) -> bool, caps: &ShaderCaps) -> Result<Option<KernelSpec>> {
    let root = &roots[0];
    let (n, d) = (root.numel(), root.dims().last().copied().unwrap_or(0));
    let off = std::env::var("TESSERA_RUNS").as_deref() == Ok("0");
    // Rows whose length is not a multiple of 4 run in ragged runs: each row is cut
    // into runs of four from its start, the last one partly past the row's end (its
    // lanes there evaluate the row's last element and store nothing), where those
    // lanes number at most a quarter of the row's length (rows of 7, 10, 11, 13 on).
    let ragged = !d.is_multiple_of(4);
    if off
        || n == 0
        || d == 0
        || (ragged && 4 * d.div_ceil(4) * 4 > 5 * d)
        || roots.iter().any(|r| !is_32_bit(r.dtype()) || r.dims() != root.dims())
    {
        return Ok(None);
    }
    // Only where the element-by-element kernel divides (an unravel, a window's taps)
    // and fits its bindings.
    let mut probe = Gen::new(*caps, is_leaf);
    probe.windows = true;
    for r in roots {
        probe.eval(r, &Ix::lin("i"), true);
    }
    probe.decide_windows(roots.iter().map(|r| r.storage_bytes()).max().unwrap_or(0));
    let divides = ["udiv(", " / ", " % "].iter().any(|d| probe.body.contains(d));
    if !divides || probe.emit_windows {
        return Ok(None);
    }
    let mut g = Gen::new(*caps, is_leaf);
    let runs = if ragged { n / d * d.div_ceil(4) } else { n / 4 };
    g.slot(runs as u32); // meta[0]: run count

    // The run's first index `i`: `4q`, or in ragged runs the row's start plus 4 per run.
    let row_len = ragged.then(|| {
        let per_row = g.slot(d.div_ceil(4) as u32);
        let row_len = g.slot(d as u32);
        let (row, r) = g.divmod("q", &per_row);
        g.emit(&format!("let i = {row} * {row_len} + 4u * {r};"));
        row_len
    });
    let base = g.coords(&Ix::lin("i"), root);
    let last = base.len() - 1;
    let past_end = row_len.as_ref().map(|_| g.slot((d - 1) as u32));
    let mut values = vec![Vec::with_capacity(4); roots.len()];
    for j in 0..4u32 {
        let mut c = base.clone();
        c[last] = match (j, &past_end) {
            (0, _) => base[last].clone(),
            (_, Some(end)) => format!("min({} + {j}u, {end})", base[last]),
            _ => format!("({} + {j}u)", base[last]),
        };
        if !ragged {
            g.lane_coords.insert(c[last].clone(), (base[last].clone(), j));
        }
        for (r, v) in roots.iter().zip(&mut values) {
            let e = g.eval(r, &Ix::coords(c.clone()), true);
            v.push(store_value(r.dtype(), &e, caps));
        }
    }
    // (As the other multi-output kernels: none with bounds checks.)
    if roots.len() > 1 && !g.checks.is_empty() {
        return Ok(None);
    }
    let body = std::mem::take(&mut g.body);
    // A vector per root, or in ragged runs each lane's value where it lies in the row.
    let ty = |t: DType| match (t, ragged) {
        (_, true) => storage_type(t, caps),
        (DType::F32, _) => "vec4<f32>",
        (DType::I32, _) => "vec4<i32>",
        _ => "vec4<u32>",
    };
    let store = |out: &str, t: DType, v: &[String]| match &row_len {
        None => format!("    {out}[q] = {}({});\n", ty(t), v.join(", ")),
        Some(len) => (0..4)
            .map(|j| match j {
                0 => format!("    {out}[i] = {};\n", v[0]),
                _ => format!("    if ({} + {j}u < {len}) {{ {out}[i + {j}u] = {}; }}\n", base[last], v[j]),
            })
            .collect(),
    };
    let mut src = header_with_out(g.meta.len(), ty(root.dtype()), g.uses_f16, caps);
    src.push_str(&g.leaf_decls());
    // Inputs at 2.., then the further outputs.
    let leaves = g.leaves.len();
    let mut stores = store("out", root.dtype(), &values[0]);
    for (j, r) in roots.iter().enumerate().skip(1) {
        src.push_str(&format!(
            "@group(0) @binding({}) var<storage, read_write> out{j}: array<{}>;\n",
            1 + leaves + j,
            ty(r.dtype())
        ));
        stores.push_str(&store(&format!("out{j}"), r.dtype(), &values[j]));
    }
    src.push_str(&g.support(1 + (leaves + roots.len()) as u32));
    src.push_str(RUNS);
    let first = if ragged { "" } else { "    let i = 4u * q;\n" };
    src.push_str(&format!("fn store_quad(q: u32) {{\n    if (q >= m(0u)) {{ return; }}\n{first}{body}{stores}}}\n"));
    src.push_str(&format!("const EPT: u32 = {EPT}u;\n"));
    src.push_str(sources::ELEMENTWISE_VEC4);
    let label = match roots.len() {
        1 => label(&g.ops),
        k => format!("multi{k}_{}", label(&g.ops)),
    };
    let workgroups = fold_groups((runs as u64).div_ceil(WG as u64 * EPT as u64), caps, &label)?;
    let mut spec = g.finish(label, src, root, workgroups);
    spec.extra_outputs = roots[1..].to_vec();
    Ok(Some(spec))
}

/// What [`render_gathered_quads`] found under its root.
#[derive(Default)]
struct GatheredPath {
    /// The leaves read as quads (f32 tables, or f32 tensors read at the output's index).
    tables: std::collections::HashSet<u64>,
    /// Every node whose value is a quad.
    values: std::collections::HashSet<u64>,
    /// The index tensors of the gathers, evaluated per element.
    index_roots: Vec<Tensor>,
}

impl GatheredPath {
    /// Whether `t` (innermost axis `d` long) is a quad value: an f32 leaf, an add,
    /// subtract or multiply of two, a reshape or a broadcast that keeps the innermost
    /// axis, or an `index_select` along another axis.
    fn walk(&mut self, t: &Tensor, d: usize, is_leaf: &dyn Fn(&Tensor) -> bool, root: bool) -> bool {
        if t.dtype() != DType::F32 || t.dims().last() != Some(&d) {
            return false;
        }
        self.values.insert(t.id());
        if !root && is_leaf(t) {
            self.tables.insert(t.id());
            return true;
        }
        let ins = &t.node().inputs;
        match t.op() {
            Op::Binary(BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul) => {
                self.walk(&ins[0], d, is_leaf, false) && self.walk(&ins[1], d, is_leaf, false)
            }
            Op::Reshape | Op::Expand => self.walk(&ins[0], d, is_leaf, false),
            Op::IndexSelect { axis } if axis + 1 < t.rank() => {
                self.index_roots.push(ins[1].clone());
                self.walk(&ins[0], d, is_leaf, false)
            }
            _ => false,
        }
    }

    /// Whether evaluating `t` reads a node of [`GatheredPath::values`].
    fn reaches_values(
        &self,
        t: &Tensor,
        is_leaf: &dyn Fn(&Tensor) -> bool,
        seen: &mut std::collections::HashSet<u64>,
    ) -> bool {
        if self.values.contains(&t.id()) {
            return true;
        }
        if !seen.insert(t.id()) || is_leaf(t) {
            return false;
        }
        t.node().inputs.iter().any(|i| self.reaches_values(i, is_leaf, seen))
    }
}

/// Whether `t` moves as 32-bit words (and so fits a `vec4<u64>` eight at a time).
fn is_32_bit(t: DType) -> bool {
    matches!(t, DType::F32 | DType::I32 | DType::U32 | DType::Bool)
}

/// Expression `e` (in `t`'s compute type) as `t` is stored.
fn store_value(t: DType, e: &str, caps: &ShaderCaps) -> String {
    match t {
        DType::Bool => format!("select(0u, 1u, {e})"),
        _ => format!("{}({e})", storage_type(t, caps)),
    }
}

/// The vector variant: `root` has a whole number of vectors ([`Lanes`]), fits one
/// binding, and every leaf is read only at the output's own index or is a row (a whole
/// number of vectors) repeated over leading axes; under quads, also through a permute
/// that keeps the innermost axis. Each invocation loads a vector of every input,
/// evaluates the expression per lane (the leaves are parameters of `eval_out`) and
/// stores one vector: a quarter (an eighth) of the loads, stores and bounds checks, and
/// no per-element index arithmetic. `None` if some leaf turns out not to qualify.
fn render_vectors(root: &Tensor, is_leaf: &dyn Fn(&Tensor) -> bool, lanes: Lanes) -> Result<Option<KernelSpec>> {
    let caps = &lanes.caps;
    let w = lanes.width();
    let mut g = Gen::new(*caps, is_leaf);
    let n = root.numel();
    g.slot((n / w) as u32); // meta[0]: vector count
    g.windows = true;
    g.param_leaves = true;
    g.param_lanes = lanes.load_width();
    g.quad_permute = !lanes.wide_out();
    let v = g.eval(root, &Ix::lin("i"), true);
    let dt = root.dtype();
    if !g.params_ok || !g.no_quantised_leaves() || !lanes.stores(dt) || !g.leaves.iter().all(|l| lanes.loads(l.dtype()))
    {
        return Ok(None);
    }
    let body = std::mem::take(&mut g.body);
    if dt == DType::F16 {
        g.uses_f16 = true;
    }
    let mut src = header_with_out(g.meta.len(), lanes.out_type(dt), g.uses_f16, caps);
    let (params, loads, args, textured) = lanes.bind_leaves(&g, &mut src);
    if lanes.form == Form::TexelsIn && textured == 0 {
        return Ok(None); // no input fits a texture: wide loads do better
    }
    src.push_str(&g.support(2 + g.leaves.len() as u32));
    src.push_str(&format!(
        "fn eval_out({}) -> {} {{\n{body}    return {v};\n}}\n",
        params.join(", "),
        super::compute_type(dt)
    ));
    let values: Vec<String> = (0..w)
        .map(|c| {
            let i = if c == 0 { "i".to_string() } else { format!("i + {c}u") };
            format!("eval_out({i}{})", args[c])
        })
        .collect();
    let value = lanes.pack(dt, &values);
    let pq = g.permute_quad.as_deref().unwrap_or_default();
    src.push_str(&format!(
        "fn store_quad(q: u32) {{\n    if (q >= m(0u)) {{ return; }}\n    let i = {w}u * q;\n{pq}{loads}    out[q] = {value};\n}}\n"
    ));
    src.push_str(&format!("const EPT: u32 = {EPT}u;\n"));
    src.push_str(sources::ELEMENTWISE_VEC4);
    let label = label(&g.ops) + if textured != 0 { "_tex" } else { "" };
    let workgroups = fold_groups(((n / w) as u64).div_ceil(WG as u64 * EPT as u64), caps, &label)?;
    let mut spec = g.finish(label, src, root, workgroups);
    spec.textured = textured;
    // Trusted (no runtime bounds checks): every access is at vector `q < n / w` of the
    // output and of inputs read at its own index (which hold at least its element count),
    // or at `q % len` of a repeated row of `len` vectors; gathers never take this kernel.
    spec.trusted = std::env::var("TESSERA_VEC4_CHECKED").as_deref() != Ok("1");
    Ok(Some(spec))
}

/// The kernels of element-wise `roots` of one shape that the scheduler grouped
/// ([`group_siblings`](crate::graph::schedule::group_siblings)): one kernel that evaluates
/// them all at each index and stores each (a root read by another is computed, not
/// loaded), or, where that kernel does not apply (packed f16 outputs off whole quads,
/// bounds-checked gathers, windows), one kernel per root in order.
pub fn render_siblings(
    roots: &[Tensor],
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
) -> Result<Vec<KernelSpec>> {
    let ids: std::collections::HashSet<u64> = roots.iter().map(|r| r.id()).collect();
    let inner = |t: &Tensor| is_leaf(t) && !ids.contains(&t.id());
    let n = roots[0].numel();
    if n > 0 && n.is_multiple_of(4) && std::env::var("TESSERA_VEC4").as_deref() != Ok("0") {
        for lanes in Lanes::for_len(n, caps) {
            if let Some(spec) = render_multi(roots, &inner, caps, Some(lanes))? {
                return Ok(vec![spec]);
            }
        }
    }
    if let Some(spec) = render_runs(roots, &inner, caps)? {
        return Ok(vec![spec]);
    }
    if let Some(spec) = render_multi(roots, &inner, caps, None)? {
        return Ok(vec![spec]);
    }
    roots.iter().map(|r| render(r, is_leaf, caps)).collect()
}

/// The multi-output kernel of [`render_siblings`], over vectors (`lanes`, the form of
/// [`render_vectors`]) or element by element (`None`); `None` where it does not apply.
fn render_multi(
    roots: &[Tensor],
    is_leaf: &dyn Fn(&Tensor) -> bool,
    caps: &ShaderCaps,
    lanes: Option<Lanes>,
) -> Result<Option<KernelSpec>> {
    let mut g = Gen::new(*caps, is_leaf);
    let n = roots[0].numel();
    let w = lanes.map_or(1, |l| l.width());
    g.slot((n / w) as u32); // meta[0]: vector or element count
    if lanes.is_none() {
        // meta[1], meta[2]: the scalar entry point's first thread and output base (0:
        // a multi-output kernel is one dispatch over whole buffers).
        g.slot(0);
        g.slot(0);
    }
    g.windows = true;
    g.param_leaves = lanes.is_some();
    g.param_lanes = lanes.map_or(4, |l| l.load_width());
    let vals: Vec<String> = roots.iter().map(|r| g.eval(r, &Ix::lin("i"), true)).collect();
    let biggest = roots.iter().map(|r| r.storage_bytes()).max().unwrap_or(0);
    g.decide_windows(biggest);
    let packed = |t: &Tensor| t.dtype() == DType::F16 && !caps.native_f16;
    let ok = !g.emit_windows
        && g.checks.is_empty()
        && match lanes {
            Some(l) => {
                suits(l.form, &g.ops, caps)
                    && g.params_ok
                    && g.no_quantised_leaves()
                    && roots.iter().all(|t| l.stores(t.dtype()))
                    && g.leaves.iter().all(|t| l.loads(t.dtype()))
            }
            None => !roots.iter().any(packed),
        };
    if !ok {
        return Ok(None);
    }
    let body = std::mem::take(&mut g.body);
    if roots.iter().any(|r| r.dtype() == DType::F16) {
        g.uses_f16 = true;
    }
    let elem_type = |t: DType| match lanes {
        Some(l) => l.out_type(t),
        None => storage_type(t, caps),
    };
    let mut src = header_with_out(g.meta.len(), elem_type(roots[0].dtype()), g.uses_f16, caps);
    // Inputs at 2.., then the further outputs.
    let leaves = g.leaves.len();
    let (params, loads, args, textured) = match lanes {
        Some(l) => l.bind_leaves(&g, &mut src),
        None => {
            src.push_str(&g.leaf_decls());
            (vec!["i: u32".to_string()], String::new(), Vec::new(), 0)
        }
    };
    if lanes.is_some_and(|l| l.form == Form::TexelsIn) && textured == 0 {
        return Ok(None); // no input fits a texture: wide loads do better
    }
    for (j, r) in roots.iter().enumerate().skip(1) {
        src.push_str(&format!(
            "@group(0) @binding({}) var<storage, read_write> out{j}: array<{}>;\n",
            1 + leaves + j,
            elem_type(r.dtype())
        ));
    }
    src.push_str(&g.support(1 + (leaves + roots.len()) as u32));
    let fields: Vec<String> =
        roots.iter().enumerate().map(|(j, r)| format!("o{j}: {}", super::compute_type(r.dtype()))).collect();
    src.push_str(&format!("struct Outs {{ {} }}\n", fields.join(", ")));
    src.push_str(&format!(
        "fn eval_out({}) -> Outs {{\n{body}    return Outs({});\n}}\n",
        params.join(", "),
        vals.join(", ")
    ));
    let name = |j: usize| if j == 0 { "out".to_string() } else { format!("out{j}") };
    if let Some(l) = lanes {
        let mut body = String::new();
        for (c, a) in args.iter().enumerate() {
            let i = if c == 0 { "i".to_string() } else { format!("i + {c}u") };
            body.push_str(&format!("    let r{c} = eval_out({i}{a});\n"));
        }
        for (j, r) in roots.iter().enumerate() {
            let values: Vec<String> = (0..w).map(|c| format!("r{c}.o{j}")).collect();
            body.push_str(&format!("    {}[q] = {};\n", name(j), l.pack(r.dtype(), &values)));
        }
        src.push_str(&format!(
            "fn store_quad(q: u32) {{\n    if (q >= m(0u)) {{ return; }}\n    let i = {w}u * q;\n{loads}{body}}}\n"
        ));
        src.push_str(&format!("const EPT: u32 = {EPT}u;\n"));
        src.push_str(sources::ELEMENTWISE_VEC4);
    } else {
        let mut body = String::from("    if (i >= m(0u)) { return; }\n    let r = eval_out(i);\n");
        for (j, r) in roots.iter().enumerate() {
            body.push_str(&format!("    {}[i] = {};\n", name(j), store_value(r.dtype(), &format!("r.o{j}"), caps)));
        }
        src.push_str(&format!("fn store_out(i: u32) {{\n{body}}}\n"));
        src.push_str(&format!("const EPT: u32 = {EPT}u;\n"));
        src.push_str(sources::ELEMENTWISE);
    }
    let label = format!("multi{}_{}{}", roots.len(), label(&g.ops), if textured != 0 { "_tex" } else { "" });
    let per_group = WG as u64 * EPT as u64;
    let workgroups = fold_groups(((n / w) as u64).div_ceil(per_group), caps, &label)?;
    let mut spec = g.finish(label, src, &roots[0], workgroups);
    spec.textured = textured;
    spec.extra_outputs = roots[1..].to_vec();
    // Trusted as the single-output kernels of the same form: every access is at the
    // output's own index (vector) or a repeated row's, and gathers are bounds-checked
    // (kernels with checks do not take this form).
    spec.trusted = lanes.is_some() && std::env::var("TESSERA_VEC4_CHECKED").as_deref() != Ok("1");
    Ok(Some(spec))
}

/// `fused(add,mul,gelu)`, or `copy` for a pure data movement.
fn label(ops: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for o in ops.iter().rev() {
        if !seen.contains(&o.as_str()) {
            seen.push(o);
        }
    }
    if seen.is_empty() {
        "copy".into()
    } else {
        format!("fused({})", seen.join(","))
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::variants::all_caps;
    use crate::{DType, Device, Tensor};

    fn source(t: &Tensor, caps: &crate::kernels::ShaderCaps) -> String {
        let specs = crate::kernels::plan_kernels(caps, 14, std::slice::from_ref(t)).expect("plan");
        specs.last().expect("a kernel").source.to_string()
    }

    #[test]
    fn whole_quads_read_at_their_own_index_take_the_vec4_kernel() {
        let d = Device::cpu();
        let caps = all_caps()[0];
        let x = Tensor::rand([4, 8], 1, &d);
        let row = Tensor::rand([8], 2, &d);
        let col = Tensor::rand([4, 1], 3, &d);
        crate::read_all_blocking(&[x.clone(), row.clone(), col.clone()]).expect("realise");
        let xs = x;
        for (what, t, quads) in [
            ("contiguous chain", (&xs * 2.0 + 1.0).exp().tanh().relu() * &xs, true),
            ("f16 in, f32 out", xs.cast(DType::F16).cast(DType::F32) + &xs, true),
            ("odd length", xs.narrow(1, 0, 7).exp(), false),
            ("transposed read", xs.t().exp(), false),
            ("a bias row repeated over rows", (&xs + &row).relu() * &row, true),
            ("a row through a reshape", &xs * &row.reshape([1, 8]), true),
            ("a sliced row", &xs + &xs.narrow(0, 0, 1), false),
            ("a column repeated along rows", &xs + &col, false),
            // BERT's head split: a bias add, then [b, s, h, d] -> [b, h, s, d].
            ("a head split", (&xs + &row).reshape([2, 2, 2, 4]).permute(&[0, 2, 1, 3]), true),
            ("a permute of rows of 2", xs.reshape([4, 4, 2]).permute(&[1, 0, 2]), false),
            ("a permute moving the last axis", xs.reshape([4, 2, 4]).permute(&[0, 2, 1]), false),
            ("a leaf read both ways", xs.reshape([2, 2, 8]).permute(&[1, 0, 2]).reshape([4, 8]) + &xs, false),
            ("an op over a permuted leaf", xs.reshape([2, 2, 8]).permute(&[1, 0, 2]).exp(), true),
        ] {
            let src = source(&t, &caps);
            assert_eq!(src.contains("fn store_quad") && !src.contains(super::RUNS), quads, "{what}:\n{src}");
        }
        // Where a tensor may exceed a binding (window mode), the scalar kernel.
        let windowed = all_caps()[4];
        assert!(!source(&(xs.exp()), &windowed).contains("fn store_quad"), "windowed caps use the scalar kernel");
    }

    #[test]
    fn index_arithmetic_takes_runs_of_four_lanes() {
        let d = Device::cpu();
        let caps = all_caps()[0];
        let img = Tensor::rand([2, 3, 12, 16], 1, &d);
        let x = Tensor::rand([4, 8], 2, &d);
        crate::read_all_blocking(&[img.clone(), x.clone()]).expect("realise");
        let w = crate::graph::Window { kernel: (3, 3), stride: (1, 1), padding: (1, 1), dilation: (1, 1) };
        let cols = source(&img.im2col(w, 0.0).reshape([2, 27, 192]), &caps);
        let (_, runs) = cols.split_once(super::RUNS).unwrap_or_else(|| panic!("a convolution's columns:\n{cols}"));
        // The lanes split the pixel index as their base does (by a width of 16): no
        // lane's coordinate is divided, and the taps are read without a branch.
        assert!(runs.contains(" + 3u)") && !runs.contains(" + 3u), m(") && !runs.contains("if (ok"), "{runs}");
        for (what, t, runs) in [
            ("a transposed read", x.t().exp(), true),
            ("a permute moving the last axis", x.reshape([2, 4, 4]).permute(&[0, 2, 1]) + 1.0, true),
            // Ragged runs where at most a quarter of the lanes fall past a row's end.
            ("rows of 7", x.narrow(1, 0, 7).exp(), true),
            ("rows of 6", x.narrow(1, 0, 6).exp(), false),
            ("rows of 5", x.narrow(1, 0, 5).exp(), false),
            ("rows of 2", x.reshape([4, 4, 2]).permute(&[1, 0, 2]).exp(), false),
            ("no index arithmetic", x.exp(), false),
        ] {
            assert_eq!(source(&t, &caps).contains(super::RUNS), runs, "{what}");
        }
        // A ragged run stores each lane that lies in its row.
        let ragged = source(&x.narrow(1, 0, 7).exp(), &caps);
        assert!(
            ragged.contains("out: array<f32>") && ragged.contains(" + 3u < m(") && ragged.contains("min("),
            "{ragged}"
        );
        let windowed = all_caps()[4];
        assert!(!source(&(x.t().exp()), &windowed).contains("fn store_quad"), "windowed caps use the scalar kernel");
        // Siblings of one shape share the runs, each storing its own vectors.
        let xt = x.t();
        let roots = [xt.exp(), &xt * 2.0, xt.gt(&xt.exp())];
        let specs = super::render_siblings(&roots, &|t: &Tensor| t.id() == x.id(), &caps).expect("render");
        let src = &specs[0].source;
        assert!(specs.len() == 1 && src.contains(super::RUNS) && src.contains("out2[q] = vec4<u32>("), "{src}");
    }

    #[test]
    fn rows_gathered_along_an_outer_axis_take_the_quad_kernel() {
        let d = Device::cpu();
        let caps = all_caps()[0];
        let table = Tensor::rand([10, 8], 1, &d);
        let pos = Tensor::rand([4, 8], 2, &d);
        let narrow = Tensor::rand([10, 6], 3, &d);
        let x = Tensor::rand([2, 3, 8], 4, &d);
        let ids = Tensor::from_slice(&[1i32, 9, 0, 4, 4, 2], [2, 3], &d);
        crate::read_all_blocking(&[table.clone(), pos.clone(), narrow.clone(), x.clone(), ids.clone()])
            .expect("realise");
        let emb = |t: &Tensor, i: &Tensor| t.index_select(0, &i.flatten()).reshape([2, 3, t.dims()[1]]);
        let p = Tensor::arange(0.0, 3.0, 1.0, DType::I32, &d);
        let bert = emb(&table, &ids) + pos.index_select(0, &p).reshape([1, 3, 8]).broadcast_to([2, 3, 8]);
        for (what, t, quads) in [
            ("a lookup", emb(&table, &ids), true),
            ("two lookups, one broadcast", bert, true),
            ("a lookup times a tensor", emb(&table, &ids) * &x, true),
            ("rows of 6", emb(&narrow, &ids), false),
            (
                "a gather along the innermost axis",
                table.index_select(1, &Tensor::from_slice(&[1i32, 0], [2], &d)),
                false,
            ),
            (
                "ids read from a gathered value",
                table.index_select(0, &emb(&table, &ids).cast(DType::I32).flatten()),
                false,
            ),
            ("an exp over a lookup", emb(&table, &ids).exp(), false),
        ] {
            let src = source(&t, &caps);
            assert_eq!(src.contains("fn store_quad") && !src.contains(super::RUNS), quads, "{what}:\n{src}");
        }
    }

    #[test]
    fn wide_loads_take_eight_32_bit_values_per_access() {
        let d = Device::cpu();
        let caps = crate::kernels::ShaderCaps { wide_loads: true, ..all_caps()[2] };
        let x = Tensor::rand([4, 8], 1, &d);
        let row8 = Tensor::rand([8], 2, &d);
        let row4 = Tensor::rand([4], 3, &d);
        let y = Tensor::rand([12], 4, &d);
        let h = Tensor::rand([4, 8], 5, &d).cast(DType::F16);
        crate::read_all_blocking(&[x.clone(), row8.clone(), row4.clone(), y.clone(), h.clone()]).expect("realise");
        // The form a kernel took, from its bindings.
        let form = |t: &Tensor, caps: &crate::kernels::ShaderCaps| {
            let src = source(t, caps);
            match (src.contains("in0: array<vec4<u64>>"), src.contains("out: array<vec4<u64>>")) {
                (true, true) => "wide",
                (false, true) => "wide stores",
                _ => "quads",
            }
        };
        for (what, t, expect) in [
            ("the chain", ((&x * 2.0 + 1.0).exp().tanh() * &x).relu(), "wide stores"),
            ("two transcendentals", (&x * 2.0).exp().tanh(), "wide stores"),
            ("relu", x.relu(), "wide stores"),
            ("relu after a product", (&x * 2.0).relu(), "wide"),
            ("a repeated row, copied", row8.broadcast_to([4, 8]), "wide"),
            ("gelu", x.gelu(), "quads"),
            ("log", (&x + 1.0).log(), "wide stores"),
            ("one exp", (&x * 2.0 + 1.0).exp() * &x, "wide stores"),
            ("tanh", x.tanh(), "wide stores"),
            ("a product and a sum", &x * &x + 1.0, "wide"),
            ("i32 out", (&x * 4.0).cast(DType::I32), "wide"),
            ("bool out", x.gt_scalar(0.5), "wide"),
            ("a row of 8 repeated", (&x + &row8).abs(), "wide"),
            ("a row of 4 repeated", &x.reshape([8, 4]) + &row4, "wide stores"),
            ("a row of 4 repeated, exp", (&x.reshape([8, 4]) + &row4).exp(), "wide stores"),
            ("f16 in", h.cast(DType::F32).exp(), "wide stores"),
            ("f16 out", x.cast(DType::F16), "quads"),
            ("12 elements", &y + 1.0, "quads"),
            ("a head split", x.reshape([2, 2, 2, 4]).permute(&[0, 2, 1, 3]) + 1.0, "quads"),
        ] {
            assert_eq!(form(&t, &caps), expect, "{what}:\n{}", source(&t, &caps));
        }
        // Without AVX-512 every expression whose inputs are 32-bit and whole eights loads
        // wide; the others keep the forms above.
        let arith = crate::kernels::ShaderCaps { no_avx512: true, ..caps };
        for (what, t, expect) in [
            ("the chain", ((&x * 2.0 + 1.0).exp().tanh() * &x).relu(), "wide"),
            ("relu", x.relu(), "wide"),
            ("gelu", x.gelu(), "wide"),
            ("log", (&x + 1.0).log(), "wide"),
            ("a row of 4 repeated, exp", (&x.reshape([8, 4]) + &row4).exp(), "wide stores"),
            ("f16 in", h.cast(DType::F32).exp(), "wide stores"),
            ("f16 out", x.cast(DType::F16), "quads"),
        ] {
            assert_eq!(form(&t, &arith), expect, "{what} without AVX-512:\n{}", source(&t, &arith));
        }
        let no_wide = crate::kernels::ShaderCaps { wide_loads: false, ..caps };
        assert!(!source(&x.exp(), &no_wide).contains("array<vec4<u64>>"), "adapters without wide loads never see u64");
    }
}
