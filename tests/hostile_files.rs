//! Hostile and corrupt files fed to every loader (safetensors, GGUF, checkpoints): each
//! bad case must come back as a typed error naming the tensor or field, allocate memory
//! bounded by the file's size, never panic, and leave loaded models usable. The fuzz
//! targets' corpora (`fuzz/corpus/*`) are replayed here too, so CI runs them without
//! cargo-fuzz.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use tessera::io::gguf::{self, GgufFile, TensorData, Value};
use tessera::io::{checkpoint, fuzz, safetensors};
use tessera::nn::{Activation, Layer, Linear, Module, Sequential};
use tessera::optim::{Adam, Optimizer};
use tessera::{quant, DType, Device, Error, Tensor};

// ---- Allocation accounting ------------------------------------------------------------

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        CURRENT.fetch_sub(l.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Tests here measure allocation, so they run one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Run a loader on `bytes`: its result (a panic fails the test, naming `what`) and the
/// most memory it held at once beyond what was allocated before.
fn probe<T>(what: &str, bytes: &[u8], load: impl FnOnce(&[u8]) -> tessera::Result<T>) -> (tessera::Result<T>, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let r = catch_unwind(AssertUnwindSafe(|| load(bytes)));
    let extra = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    match r {
        Ok(r) => (r, extra),
        Err(_) => panic!("{what}: the loader panicked on {} bytes", bytes.len()),
    }
}

/// A failed load must not hold more than a small constant plus a few times the file.
fn assert_bounded(what: &str, len: usize, extra: usize) {
    let bound = 256 * 1024 + 16 * len;
    assert!(extra <= bound, "{what}: a {len}-byte file made the loader allocate {extra} bytes (bound {bound})");
}

fn expect_err<T: std::fmt::Debug>(what: &str, bytes: &[u8], load: impl FnOnce(&[u8]) -> tessera::Result<T>) -> String {
    let (r, extra) = probe(what, bytes, load);
    assert_bounded(what, bytes.len(), extra);
    match r {
        Ok(v) => panic!("{what}: loaded, but should have failed: {v:?}"),
        Err(e @ (Error::Format { .. } | Error::InvalidArgument { .. })) => e.to_string(),
        Err(e) => panic!("{what}: untyped or unexpected error kind: {e:?}"),
    }
}

/// A loader under test: bytes in, the number of tensors (or inputs) it loaded out.
type Loader = fn(&[u8]) -> tessera::Result<usize>;

fn st_load(b: &[u8]) -> tessera::Result<usize> {
    safetensors::load_bytes(b, &Device::reference()).map(|f| f.tensors.len())
}
fn gguf_load(b: &[u8]) -> tessera::Result<usize> {
    gguf::parse(b).and_then(|f| f.to_tensors(&Device::reference())).map(|t| t.len())
}

// ---- Valid files to corrupt --------------------------------------------------------------

fn valid_safetensors() -> Vec<u8> {
    let cpu = Device::reference();
    let q = quant::quantize_tensor_blocking(&Tensor::randn([2, 32], 3, &cpu), DType::Q8_0).unwrap();
    let tensors = vec![
        ("a".to_string(), Tensor::randn([2, 3], 1, &cpu)),
        ("b".to_string(), Tensor::from_slice(&[1i32, -2, 3, 4], [4], &cpu)),
        ("c".to_string(), Tensor::randn([2, 2], 2, &cpu).cast(DType::F16)),
        ("q".to_string(), q),
    ];
    let meta = BTreeMap::from([("note".to_string(), "valid".to_string())]);
    pollster::block_on(safetensors::to_bytes(&tensors, &meta)).unwrap()
}

fn gguf_tensor(name: &str, dtype: DType, shape: &[usize], seed: u64) -> TensorData {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i as u64 * 2654435761 + seed) % 1000) as f32 / 500.0 - 1.0).collect();
    let data = match dtype {
        DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
        q => quant::quantize(q, &v),
    };
    TensorData { name: name.into(), shape: shape.to_vec(), dtype, data }
}

fn valid_gguf_file() -> GgufFile {
    GgufFile {
        version: 3,
        metadata: vec![
            ("general.name".into(), Value::String("hostile".into())),
            ("x.list".into(), Value::Array(4, vec![Value::U32(1), Value::U32(2)])),
            ("x.big".into(), Value::U64(1 << 40)),
        ],
        tensors: vec![
            gguf_tensor("w_f32", DType::F32, &[3, 5], 1),
            gguf_tensor("w_f16", DType::F16, &[2, 3], 2),
            gguf_tensor("w_q8", DType::Q8_0, &[2, 32], 3),
            gguf_tensor("w_q4", DType::Q4_0, &[1, 64], 4),
        ],
    }
}

fn mlp(dev: &Device, out: usize) -> Sequential {
    Sequential::new().add(Linear::new(4, 3, true, 1, dev)).add(Activation::Relu).add(Linear::new(3, out, true, 2, dev))
}

/// A checkpoint of `fuzz::checkpoint`'s model (4-3-2 MLP, Adam after one step).
fn valid_checkpoint(out: usize, poison: bool) -> Vec<u8> {
    let cpu = Device::reference();
    let mut model = mlp(&cpu, out);
    let mut opt = Adam::new(1e-2);
    let x = Tensor::randn([5, 4], 9, &cpu);
    let loss = model.forward(&x).square().mean(&[0, 1], false);
    opt.step(&mut model, &loss).unwrap();
    if poison {
        let state = model
            .state_dict()
            .into_iter()
            .map(|(n, t)| {
                let t = if n.ends_with("bias") { t.mul_scalar(f64::NAN) } else { t };
                (n, t)
            })
            .collect();
        model.load_state_dict(&state, true).unwrap();
    }
    let meta = BTreeMap::from([("step".to_string(), "1".to_string())]);
    pollster::block_on(checkpoint::to_bytes(&mut model, &mut opt, &meta)).unwrap()
}

fn ckpt_load(b: &[u8]) -> tessera::Result<usize> {
    fuzz::checkpoint(b)
}

// ---- Safetensors by hand ----------------------------------------------------------------

/// A safetensors file from a JSON header and a data section.
fn st_raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

// ---- GGUF by hand -----------------------------------------------------------------------

struct G(Vec<u8>);
impl G {
    fn new(n_tensors: u64, n_kv: u64) -> G {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        G(b)
    }
    fn u32(mut self, v: u32) -> G {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> G {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn str(self, s: &str) -> G {
        let mut g = self.u64(s.len() as u64);
        g.0.extend(s.as_bytes());
        g
    }
    /// A tensor info: name, dims (ggml order: fastest first), type code, offset.
    fn tensor(self, name: &str, dims: &[u64], code: u32, offset: u64) -> G {
        let mut g = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            g = g.u64(d);
        }
        g.u32(code).u64(offset)
    }
    /// Pad to the default 32-byte alignment, then append the data section.
    fn data(mut self, bytes: &[u8]) -> Vec<u8> {
        let pad = self.0.len().div_ceil(32) * 32;
        self.0.resize(pad, 0);
        self.0.extend(bytes);
        self.0
    }
}

// ---- Tests ----------------------------------------------------------------------------------

#[test]
fn valid_files_load() {
    let _s = serial();
    assert_eq!(st_load(&valid_safetensors()).unwrap(), 4);
    assert_eq!(gguf_load(&gguf::to_bytes(&valid_gguf_file()).unwrap()).unwrap(), 4);
    assert!(ckpt_load(&valid_checkpoint(2, false)).unwrap() > 0);
    assert!(fuzz::gguf(&gguf::to_bytes(&valid_gguf_file()).unwrap()).is_ok());
    assert!(fuzz::safetensors(&valid_safetensors()).is_ok());
}

#[test]
fn every_truncated_prefix_is_a_clear_error() {
    let _s = serial();
    let files: [(&str, Vec<u8>, Loader); 3] = [
        ("safetensors", valid_safetensors(), st_load),
        ("gguf", gguf::to_bytes(&valid_gguf_file()).unwrap(), gguf_load),
        ("checkpoint", valid_checkpoint(2, false), ckpt_load),
    ];
    for (kind, bytes, load) in files {
        for len in 0..bytes.len() {
            let msg = expect_err(&format!("{kind} cut to {len} bytes"), &bytes[..len], load);
            assert!(!msg.is_empty());
        }
        assert!(load(&bytes).is_ok(), "{kind}: the whole file must load");
    }
}

#[test]
fn lengths_and_counts_past_the_file_allocate_nothing_large() {
    let _s = serial();
    // Safetensors: a header length far beyond the file, and near 2^64.
    for n in [1u64 << 40, u64::MAX - 7, (1 << 63) - 1] {
        let mut b = n.to_le_bytes().to_vec();
        b.extend(b"{}");
        let m = expect_err(&format!("safetensors header length {n}"), &b, st_load);
        assert!(m.contains("safetensors") && m.to_lowercase().contains("header"), "{m}");
    }
    // GGUF: tensor and metadata counts near 2^63, string and array lengths past the end.
    let cases: Vec<(&str, G, &str)> = vec![
        ("tensor count 2^63-1", G::new((1 << 63) - 1, 0), "tensor count"),
        ("metadata count 2^63", G::new(0, 1 << 63), "metadata count"),
        ("key length 2^62", G::new(0, 1).u64(1 << 62), "metadata key 0 length"),
        ("string value length 2^60", G::new(0, 1).str("k").u32(8).u64(1 << 60), "metadata \"k\" length"),
        ("array length 2^63-1", G::new(0, 1).str("arr").u32(9).u32(4).u64((1 << 63) - 1), "array length"),
        ("tensor name length u64::MAX", G::new(1, 0).u64(u64::MAX), "tensor 0 name length"),
        ("rank 2^31", G::new(1, 0).str("t").u32(1 << 31), "rank"),
    ];
    for (what, g, field) in cases {
        // Padding, so the counts themselves are plausible and the length is what fails.
        let mut bytes = g.0;
        bytes.resize(bytes.len() + 64, 0);
        let m = expect_err(&format!("gguf {what}"), &bytes, gguf_load);
        assert!(m.contains(field), "gguf {what}: the error should name {field:?}: {m}");
    }
}

#[test]
fn overlapping_gapped_and_out_of_range_offsets() {
    let _s = serial();
    let data = [0u8; 16];
    for (what, header) in [
        (
            "overlap",
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
        ),
        (
            "gap",
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}"#,
        ),
        ("past the end", r#"{"a":{"dtype":"F32","shape":[250],"data_offsets":[0,1000]}}"#),
        ("reversed", r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#),
    ] {
        let m = expect_err(&format!("safetensors {what}"), &st_raw(header, &data), st_load);
        assert!(m.contains("safetensors"), "{what}: {m}");
    }
    let q = 32 * 4; // one f32 [32] tensor
    for (what, off_b, field) in [
        ("overlap", 0u64, "overlaps"),
        ("gap", q as u64 + 32, "gap"),
        ("past the end", q as u64, "outside"),
        ("unaligned", 4, "alignment"),
    ] {
        let g = G::new(2, 0).tensor("a", &[32], 0, 0).tensor("b", &[32], 0, off_b);
        let len = if what == "past the end" { q + 8 } else { 3 * q };
        let m = expect_err(&format!("gguf {what}"), &g.data(&vec![0u8; len]), gguf_load);
        assert!(m.contains("\"b\"") && m.contains(field), "gguf {what}: {m}");
    }
    let dup = G::new(2, 0).tensor("a", &[32], 0, 0).tensor("a", &[32], 0, q as u64).data(&vec![0u8; 2 * q]);
    let m = expect_err("gguf duplicate name", &dup, gguf_load);
    assert!(m.contains("appears twice"), "{m}");
}

#[test]
fn element_counts_that_overflow_and_dtypes_that_do_not_match_their_bytes() {
    let _s = serial();
    let big = r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}}"#;
    expect_err("safetensors shape overflow", &st_raw(big, &[0; 8]), st_load);
    let short = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    expect_err("safetensors F32 [3] in 8 bytes", &st_raw(short, &[0; 8]), st_load);
    let odd = r#"{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,7]}}"#;
    expect_err("safetensors F64 in 7 bytes", &st_raw(odd, &[0; 7]), st_load);
    let unknown = r#"{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}"#;
    expect_err("safetensors unknown dtype", &st_raw(unknown, &[0; 16]), st_load);
    // A quantisation record that does not match the U8 bytes it describes.
    let q =
        r#"{"__metadata__":{"tessera.quantized.w":"q8_0:2,32"},"w":{"dtype":"U8","shape":[34],"data_offsets":[0,34]}}"#;
    let m = expect_err("safetensors quant record", &st_raw(q, &[0; 34]), st_load);
    assert!(m.contains("from_quantized") || m.contains("\"w\""), "{m}");

    let m = expect_err(
        "gguf dims overflow",
        &G::new(1, 0).tensor("t", &[1 << 40, 1 << 40], 0, 0).data(&[0; 64]),
        gguf_load,
    );
    assert!(m.contains("\"t\""), "{m}");
    let m = expect_err("gguf Q8_0 row of 33", &G::new(1, 0).tensor("t", &[33], 8, 0).data(&[0; 64]), gguf_load);
    assert!(m.contains("\"t\"") && m.contains("q8_0"), "{m}");
    let m = expect_err("gguf unknown type", &G::new(1, 0).tensor("t", &[32], 99, 0).data(&[0; 64]), gguf_load);
    assert!(m.contains("\"t\""), "{m}");
}

#[test]
fn nan_and_inf_payloads() {
    let _s = serial();
    // Plain float tensors carry NaN and infinity through exactly.
    let vals = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.5];
    let data: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f = safetensors::load_bytes(
        &st_raw(r#"{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#, &data),
        &Device::reference(),
    )
    .unwrap();
    let got = f.tensors["x"].to_vec_blocking::<f32>().unwrap();
    assert!(got[0].is_nan() && got[1] == f32::INFINITY && got[2] == f32::NEG_INFINITY && got[3] == 1.5);
    // A quantised block with a NaN or infinite scale is corrupt.
    for bad in [half::f16::NAN, half::f16::INFINITY] {
        let mut t = gguf_tensor("w", DType::Q8_0, &[2, 32], 5);
        t.data[34..36].copy_from_slice(&bad.to_le_bytes());
        let file = GgufFile { version: 3, metadata: vec![], tensors: vec![t] };
        let m = expect_err("gguf NaN scale", &gguf::to_bytes(&file).unwrap(), gguf_load);
        assert!(m.contains("\"w\"") && m.contains("block 1"), "{m}");
    }
    let mut blocks = quant::quantize(DType::Q4_0, &[0.5; 32]);
    blocks[0..2].copy_from_slice(&half::f16::NAN.to_le_bytes());
    let header =
        r#"{"__metadata__":{"tessera.quantized.w":"q4_0:1,32"},"w":{"dtype":"U8","shape":[18],"data_offsets":[0,18]}}"#;
    let m = expect_err("safetensors NaN scale", &st_raw(header, &blocks), st_load);
    assert!(m.contains("\"w\"") && m.contains("block 0"), "{m}");
    // A checkpoint of a diverged run is refused, naming the tensor.
    let m = expect_err("checkpoint with NaN", &valid_checkpoint(2, true), ckpt_load);
    assert!(m.contains("bias") && m.contains("NaN"), "{m}");
}

#[test]
fn loaded_models_stay_usable_after_failed_loads() {
    let _s = serial();
    let cpu = Device::reference();
    let good = gguf::to_bytes(&valid_gguf_file()).unwrap();
    let tensors = gguf::parse(&good).unwrap().to_tensors(&cpu).unwrap();
    let before: Vec<Vec<f64>> = tensors.values().map(|t| t.to_f64_vec_blocking().unwrap()).collect();
    // A model restored from a checkpoint, then hit by bad loads into the same model.
    let mut model = mlp(&cpu, 2);
    let mut opt = Adam::new(1e-3);
    checkpoint::from_bytes(&valid_checkpoint(2, false), &mut model, &mut opt, &cpu).unwrap();
    let x = Tensor::randn([3, 4], 5, &cpu);
    let y0 = model.forward(&x).to_f64_vec_blocking().unwrap();
    for len in (0..good.len()).step_by(7) {
        assert!(gguf_load(&good[..len]).is_err());
    }
    let wrong_shape = valid_checkpoint(3, false); // verifies, but its last layer is 3-wide
    let mut corrupt = valid_checkpoint(2, false);
    let at = corrupt.len() - 5;
    corrupt[at] ^= 0x40;
    for bytes in [&wrong_shape, &corrupt, &valid_checkpoint(2, true)] {
        let e = checkpoint::from_bytes(bytes, &mut model, &mut opt, &cpu).unwrap_err();
        assert!(matches!(e, Error::Format { .. } | Error::Shape { .. } | Error::InvalidArgument { .. }), "{e:?}");
    }
    let after: Vec<Vec<f64>> = tensors.values().map(|t| t.to_f64_vec_blocking().unwrap()).collect();
    assert_eq!(before, after, "tensors loaded earlier changed");
    assert_eq!(model.forward(&x).to_f64_vec_blocking().unwrap(), y0, "a failed checkpoint load changed the model");
}

/// The committed fuzz corpora, each input through its target's entry point.
#[test]
fn fuzz_corpora_replay_without_panics() {
    let _s = serial();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let targets: [(&str, Loader); 4] = [
        ("safetensors", fuzz::safetensors),
        ("gguf", fuzz::gguf),
        ("checkpoint", fuzz::checkpoint),
        ("onnx", fuzz::onnx),
    ];
    for (name, run) in targets {
        let dir = root.join(name);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let (_, extra) = probe(&path.display().to_string(), &bytes, run);
            // Successful loads hold their tensors; bound those by the file size too.
            assert_bounded(&path.display().to_string(), bytes.len(), extra / 8);
            n += 1;
        }
        assert!(n >= 5, "{}: only {n} corpus files", dir.display());
        eprintln!("{name}: {n} corpus inputs replayed");
    }
}

/// Writes the seed corpora into `fuzz/corpus/` (run once by hand:
/// `cargo test --test hostile_files write_fuzz_seeds -- --ignored`); fuzzing adds more.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let put = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    let st = valid_safetensors();
    put("safetensors", "valid", &st);
    put("safetensors", "truncated", &st[..st.len() / 2]);
    put("safetensors", "huge-header", &[255, 255, 255, 255, 255, 255, 255, 127, b'{', b'}']);
    put(
        "safetensors",
        "overlap",
        &st_raw(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            &[0; 16],
        ),
    );
    put(
        "safetensors",
        "quant-record",
        &st_raw(
            r#"{"__metadata__":{"tessera.quantized.w":"q4_0:1,32"},"w":{"dtype":"U8","shape":[18],"data_offsets":[0,18]}}"#,
            &[0; 18],
        ),
    );
    put(
        "safetensors",
        "every-dtype",
        &st_raw(
            r#"{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"I64","shape":[1],"data_offsets":[4,12]},"c":{"dtype":"U8","shape":[2],"data_offsets":[12,14]},"d":{"dtype":"BOOL","shape":[2],"data_offsets":[14,16]}}"#,
            &[1; 16],
        ),
    );
    let g = gguf::to_bytes(&valid_gguf_file()).unwrap();
    put("gguf", "valid", &g);
    put("gguf", "truncated", &g[..g.len() / 2]);
    put("gguf", "count-2p63", &G::new((1 << 63) - 1, 0).0);
    put("gguf", "array-len", &G::new(0, 1).str("arr").u32(9).u32(4).u64((1 << 63) - 1).0);
    put("gguf", "nested", &G::new(0, 1).str("n").u32(9).u32(9).u64(1).u32(8).u64(1).str("x").0);
    put("gguf", "offset-gap", &G::new(2, 0).tensor("a", &[32], 0, 0).tensor("b", &[32], 0, 160).data(&[0; 384]));
    let c = valid_checkpoint(2, false);
    put("checkpoint", "valid", &c);
    put("checkpoint", "truncated", &c[..c.len() - 9]);
    put("checkpoint", "wrong-shape", &valid_checkpoint(3, false));
    put("checkpoint", "nan", &valid_checkpoint(2, true));
    let mut flipped = c.clone();
    let at = flipped.len() - 3;
    flipped[at] ^= 1;
    put("checkpoint", "flipped", &flipped);
}
