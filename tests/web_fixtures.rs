//! The reference values the browser tests check against (`web/tests/fixtures/*.json`).
//!
//! Each op case is written twice, as a Rust closure and as the JavaScript expression the
//! page evaluates. The expected values come from the CPU reference (the oracle); this
//! test recomputes them and fails if the committed JSON is stale, and checks every GPU
//! adapter here against it at the case's tolerance, the same check the page makes.
//! `TESSERA_WRITE_WEB_FIXTURES=1 cargo test --test web_fixtures` rewrites the files.

mod common;

use common::{assert_close, devices, label, model_dir, Tol};
use serde_json::{json, Value};
use std::collections::HashMap;
use tessera::ops::nn::Conv2dOptions;
use tessera::{quant, DType, Device, Tensor};

type Inputs = HashMap<&'static str, Tensor>;

struct Input {
    name: &'static str,
    shape: Vec<usize>,
    dtype: DType,
    /// Values are `lo + (hi - lo) * u` for a seeded uniform `u`; integer dtypes floor them.
    lo: f64,
    hi: f64,
}

struct Case {
    name: &'static str,
    inputs: Vec<Input>,
    /// A JavaScript expression over the inputs and `T` (the module), awaited.
    js: &'static str,
    run: fn(&Inputs) -> Tensor,
    tol: Tol,
}

fn inp(name: &'static str, shape: &[usize], dtype: DType) -> Input {
    Input { name, shape: shape.to_vec(), dtype, lo: -2.0, hi: 2.0 }
}

fn ranged(name: &'static str, shape: &[usize], dtype: DType, lo: f64, hi: f64) -> Input {
    Input { name, shape: shape.to_vec(), dtype, lo, hi }
}

const F32: Tol = Tol { atol: 2e-5, rtol: 1e-4 };
const F16: Tol = Tol { atol: 5e-3, rtol: 5e-3 };
const EXACT: Tol = Tol { atol: 0.0, rtol: 0.0 };
/// Quantised weights: the same blocks on both sides, so only the accumulation differs.
const QUANT: Tol = Tol { atol: 1e-4, rtol: 1e-3 };

fn cases() -> Vec<Case> {
    use DType::{F16 as H, F32 as S, I32};
    vec![
        Case {
            name: "add_broadcast",
            inputs: vec![inp("a", &[3, 5], S), inp("b", &[5], S)],
            js: "a.add(b)",
            run: |t| t["a"].add(&t["b"]),
            tol: F32,
        },
        Case {
            name: "sub_mul_div_scalar",
            inputs: vec![inp("a", &[4, 7], S), inp("b", &[4, 7], S)],
            js: "a.sub(b).mul(a).divScalar(3)",
            run: |t| t["a"].sub(&t["b"]).mul(&t["a"]).div_scalar(3.0),
            tol: F32,
        },
        Case {
            name: "unary_chain",
            inputs: vec![inp("a", &[6, 11], S)],
            js: "a.tanh().exp().addScalar(-1).sigmoid()",
            run: |t| t["a"].tanh().exp().add_scalar(-1.0).sigmoid(),
            tol: F32,
        },
        Case {
            name: "activations",
            inputs: vec![inp("a", &[3, 7], S)],
            js: "T.Tensor.stack([a.relu(), a.gelu(), a.silu(), a.geluTanh()], 0)",
            run: |t| Tensor::stack(&[t["a"].relu(), t["a"].gelu(), t["a"].silu(), t["a"].gelu_tanh()], 0),
            tol: F32,
        },
        Case {
            name: "sqrt_log_pow_clamp",
            inputs: vec![inp("a", &[5, 9], S)],
            js: "a.abs().addScalar(0.5).sqrt().log().add(a.abs().powScalar(1.5).clamp(0.1, 2))",
            run: |t| t["a"].abs().add_scalar(0.5).sqrt().log().add(&t["a"].abs().pow_scalar(1.5).clamp(0.1, 2.0)),
            tol: F32,
        },
        Case {
            name: "matmul_odd",
            inputs: vec![inp("a", &[7, 13], S), inp("b", &[13, 9], S)],
            js: "a.matmul(b)",
            run: |t| t["a"].matmul(&t["b"]),
            tol: F32,
        },
        Case {
            name: "matmul_batched_broadcast",
            inputs: vec![inp("a", &[2, 5, 6], S), inp("b", &[6, 3], S)],
            js: "a.matmul(b)",
            run: |t| t["a"].matmul(&t["b"]),
            tol: F32,
        },
        Case {
            name: "matmul_transposed",
            inputs: vec![inp("a", &[6, 10], S), inp("b", &[4, 10], S)],
            js: "a.matmul(b.t())",
            run: |t| t["a"].matmul(&t["b"].t()),
            tol: F32,
        },
        Case {
            name: "gemv",
            inputs: vec![inp("a", &[1, 64], S), inp("w", &[40, 64], S)],
            js: "a.matmul(w.t())",
            run: |t| t["a"].matmul(&t["w"].t()),
            tol: F32,
        },
        Case {
            name: "sum_axis_keepdim",
            inputs: vec![inp("a", &[5, 6, 7], S)],
            js: "a.sum([1], true)",
            run: |t| t["a"].sum(&[1], true),
            tol: F32,
        },
        Case {
            name: "mean_all",
            inputs: vec![inp("a", &[9, 13], S)],
            js: "a.mean()",
            run: |t| t["a"].mean(&[0, 1], false),
            tol: F32,
        },
        Case {
            name: "min_two_axes",
            inputs: vec![inp("a", &[3, 4, 5], S)],
            js: "a.min([0, 2])",
            run: |t| t["a"].min(&[0, 2], false),
            tol: F32,
        },
        Case {
            name: "max_and_argmax",
            inputs: vec![inp("a", &[6, 11], S)],
            js: "T.Tensor.concat([a.max(1), a.argmax(-1).cast('f32')], 0)",
            run: |t| Tensor::concat(&[t["a"].max(&[1], false), t["a"].argmax(&[-1], false).cast(DType::F32)], 0),
            tol: F32,
        },
        Case {
            name: "var_axis0",
            inputs: vec![inp("a", &[8, 5], S)],
            js: "a.var(0)",
            run: |t| t["a"].var(&[0], false),
            tol: F32,
        },
        Case {
            name: "softmax_row",
            inputs: vec![ranged("a", &[4, 37], S, -6.0, 6.0)],
            js: "a.softmax(-1)",
            run: |t| t["a"].softmax(-1),
            tol: F32,
        },
        Case {
            name: "log_softmax_axis0",
            inputs: vec![ranged("a", &[5, 6], S, -6.0, 6.0)],
            js: "a.logSoftmax(0)",
            run: |t| t["a"].log_softmax(0),
            tol: F32,
        },
        Case {
            name: "layer_norm",
            inputs: vec![inp("a", &[5, 33], S)],
            js: "a.layerNorm(1e-5)",
            run: |t| t["a"].layer_norm(None, None, 1e-5),
            tol: F32,
        },
        Case {
            name: "rms_norm",
            inputs: vec![inp("a", &[3, 20], S)],
            js: "a.rmsNorm(1e-6)",
            run: |t| t["a"].rms_norm(None, 1e-6),
            tol: F32,
        },
        Case {
            name: "permute_reshape_add",
            inputs: vec![inp("a", &[2, 3, 4], S), inp("b", &[6], S)],
            js: "a.permute([2, 0, 1]).reshape([4, 6]).add(b)",
            run: |t| t["a"].permute(&[2, 0, 1]).reshape([4, 6]).add(&t["b"]),
            tol: F32,
        },
        Case {
            name: "slice_step_negative",
            inputs: vec![inp("a", &[9, 8], S)],
            js: "a.slice(0, 1, 8, 2).slice(1, -5, 8)",
            run: |t| t["a"].slice(0, 1, 8, 2).slice(1, -5, 8, 1),
            tol: F32,
        },
        Case {
            name: "concat_transpose",
            inputs: vec![inp("a", &[3, 2], S), inp("b", &[3, 4], S)],
            js: "T.Tensor.concat([a, b], 1).transpose(0, 1)",
            run: |t| Tensor::concat(&[t["a"].clone(), t["b"].clone()], 1).transpose(0, 1),
            tol: F32,
        },
        Case {
            name: "where_gt",
            inputs: vec![inp("a", &[4, 6], S), inp("b", &[4, 6], S)],
            js: "T.Tensor.where(a.gt(b), a, b.mulScalar(2))",
            run: |t| Tensor::where_(&t["a"].gt(&t["b"]), &t["a"], &t["b"].mul_scalar(2.0)),
            tol: F32,
        },
        Case {
            name: "compare_bool",
            inputs: vec![inp("a", &[3, 5], S), inp("b", &[5], S)],
            js: "a.lt(b)",
            run: |t| t["a"].lt(&t["b"]),
            tol: EXACT,
        },
        Case {
            name: "index_select_gather",
            inputs: vec![inp("a", &[5, 4], S), ranged("i", &[3], I32, 0.0, 5.0)],
            js: "a.indexSelect(0, i).add(a.narrow(0, 1, 3))",
            run: |t| t["a"].index_select(0, &t["i"]).add(&t["a"].narrow(0, 1, 3)),
            tol: F32,
        },
        Case {
            name: "i32_arith",
            inputs: vec![ranged("a", &[10], I32, -50.0, 50.0), ranged("b", &[10], I32, -9.0, 9.0)],
            js: "a.mul(b).addScalar(3)",
            run: |t| t["a"].mul(&t["b"]).add_scalar(3.0),
            tol: EXACT,
        },
        Case {
            name: "f16_elementwise",
            inputs: vec![inp("a", &[5, 9], H), inp("b", &[5, 9], H)],
            js: "a.mul(b).add(a).cast('f32')",
            run: |t| t["a"].mul(&t["b"]).add(&t["a"]).cast(DType::F32),
            tol: F16,
        },
        Case {
            name: "f16_matmul",
            inputs: vec![ranged("a", &[9, 17], H, -1.0, 1.0), ranged("b", &[17, 5], H, -1.0, 1.0)],
            js: "a.matmul(b).cast('f32')",
            run: |t| t["a"].matmul(&t["b"]).cast(DType::F32),
            tol: F16,
        },
        Case {
            name: "f16_sum",
            inputs: vec![ranged("a", &[6, 20], H, -1.0, 1.0)],
            js: "a.sum([1]).cast('f32')",
            run: |t| t["a"].sum(&[1], false).cast(DType::F32),
            tol: F16,
        },
        Case {
            name: "f16_softmax",
            inputs: vec![inp("a", &[3, 10], H)],
            js: "a.softmax(-1).cast('f32')",
            run: |t| t["a"].softmax(-1).cast(DType::F32),
            tol: F16,
        },
        Case {
            name: "attention",
            inputs: vec![inp("q", &[1, 2, 5, 8], S), inp("k", &[1, 2, 6, 8], S), inp("v", &[1, 2, 6, 8], S)],
            js: "q.scaledDotProductAttention(k, v, false)",
            run: |t| Tensor::scaled_dot_product_attention(&t["q"], &t["k"], &t["v"], None, false),
            tol: F32,
        },
        Case {
            name: "attention_fused_causal",
            inputs: vec![inp("q", &[1, 2, 6, 8], S), inp("k", &[1, 2, 6, 8], S), inp("v", &[1, 2, 6, 8], S)],
            js: "q.scaledDotProductAttention(k, v, true, true)",
            run: |t| Tensor::scaled_dot_product_attention_fused(&t["q"], &t["k"], &t["v"], None, true),
            tol: F32,
        },
        Case {
            name: "conv2d_stride_pad_groups",
            inputs: vec![inp("x", &[2, 4, 9, 7], S), inp("w", &[6, 2, 3, 3], S), inp("b", &[6], S)],
            js: "x.conv2d(w, b, { stride: [2, 1], padding: 1, groups: 2 })",
            run: |t| {
                let o = Conv2dOptions { stride: (2, 1), padding: (1, 1), dilation: (1, 1), groups: 2 };
                t["x"].conv2d(&t["w"], Some(&t["b"]), o)
            },
            tol: F32,
        },
        Case {
            name: "conv2d_dilated_no_bias",
            inputs: vec![inp("x", &[1, 3, 10, 10], S), inp("w", &[4, 3, 3, 3], S)],
            js: "x.conv2d(w, undefined, { dilation: 2 })",
            run: |t| t["x"].conv2d(&t["w"], None, Conv2dOptions { dilation: (2, 2), ..Default::default() }),
            tol: F32,
        },
        Case {
            name: "conv_transpose2d",
            inputs: vec![inp("x", &[2, 4, 5, 6], S), inp("w", &[4, 3, 3, 3], S), inp("b", &[3], S)],
            js: "x.convTranspose2d(w, b, { stride: 2, padding: 1, outputPadding: 1 })",
            run: |t| t["x"].conv_transpose2d(&t["w"], Some(&t["b"]), Conv2dOptions::new(2, 1), (1, 1)),
            tol: F32,
        },
        Case {
            name: "max_and_avg_pool2d",
            inputs: vec![inp("x", &[2, 3, 8, 8], S)],
            js: "T.Tensor.stack([x.maxPool2d(2), x.avgPool2d(3, 1, 1).narrow(2, 0, 4).narrow(3, 0, 4)], 0)",
            run: |t| {
                Tensor::stack(
                    &[t["x"].max_pool2d(2, 2, 0), t["x"].avg_pool2d(3, 1, 1).narrow(2, 0, 4).narrow(3, 0, 4)],
                    0,
                )
            },
            tol: F32,
        },
        Case {
            name: "q8_0_matmul",
            inputs: vec![inp("a", &[3, 64], S), inp("w", &[5, 64], S)],
            js: "a.matmul((await w.quantize('q8_0')).t())",
            run: |t| t["a"].matmul(&t["w"].quantize(DType::Q8_0).t()),
            tol: QUANT,
        },
        Case {
            name: "q4_0_gemv",
            inputs: vec![inp("a", &[1, 64], S), inp("w", &[7, 64], S)],
            js: "a.matmul((await w.quantize('q4_0')).t())",
            run: |t| t["a"].matmul(&t["w"].quantize(DType::Q4_0).t()),
            tol: QUANT,
        },
    ]
}

/// Seeded values for one input (a small LCG, so the JSON is the only source the page needs).
fn values(input: &Input, seed: u64) -> Vec<f64> {
    let n: usize = input.shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            let v = input.lo + (input.hi - input.lo) * u;
            if input.dtype.is_float() {
                input.dtype.round(v)
            } else {
                v.floor()
            }
        })
        .collect()
}

fn build(case: &Case, dev: &Device) -> (Inputs, Vec<(String, Vec<f64>)>) {
    let mut map = Inputs::new();
    let mut raw = Vec::new();
    for (i, input) in case.inputs.iter().enumerate() {
        let seed = case.name.bytes().fold(i as u64 + 1, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        let v = values(input, seed);
        map.insert(input.name, Tensor::from_f64(&v, input.shape.clone(), input.dtype, dev));
        raw.push((input.name.to_string(), v));
    }
    (map, raw)
}

const OPS_PATH: &str = "web/tests/fixtures/ops.json";

fn write_mode() -> bool {
    std::env::var("TESSERA_WRITE_WEB_FIXTURES").is_ok_and(|v| v == "1")
}

#[test]
fn op_fixtures_are_current_and_hold_on_every_adapter() {
    let cpu = Device::reference();
    let mut out = Vec::new();
    for case in cases() {
        let (inputs, raw) = build(&case, &cpu);
        let y = (case.run)(&inputs);
        let expected = y.to_f64_vec_blocking().unwrap_or_else(|e| panic!("{}: {e}", case.name));
        out.push(json!({
            "name": case.name,
            "js": case.js,
            "inputs": case.inputs.iter().zip(&raw).map(|(i, (_, v))| json!({
                "name": i.name, "shape": i.shape, "dtype": i.dtype.name(), "data": v,
            })).collect::<Vec<_>>(),
            "dtype": y.dtype().name(),
            "shape": y.dims(),
            "expected": expected,
            "atol": case.tol.atol,
            "rtol": case.tol.rtol,
        }));
        for dev in &devices() {
            common::record(dev);
            let (inputs, _) = build(&case, dev);
            let got = (case.run)(&inputs).to_f64_vec_blocking().unwrap_or_else(|e| panic!("{}: {e}", case.name));
            assert_close(&format!("{} on {}", case.name, label(dev)), &got, &expected, case.tol);
        }
    }
    let doc = json!({
        "about": "Op cases for the browser tests: inputs, a JavaScript expression and the CPU reference's values. Written by tests/web_fixtures.rs (TESSERA_WRITE_WEB_FIXTURES=1).",
        "cases": out,
    });
    if write_mode() {
        std::fs::create_dir_all("web/tests/fixtures").unwrap();
        std::fs::write(OPS_PATH, serde_json::to_string(&doc).unwrap() + "\n").unwrap();
        return;
    }
    let text = std::fs::read_to_string(OPS_PATH)
        .expect("web/tests/fixtures/ops.json (regenerate: TESSERA_WRITE_WEB_FIXTURES=1)");
    let committed: Value = serde_json::from_str(&text).unwrap();
    let (want, have) = (doc["cases"].as_array().unwrap(), committed["cases"].as_array().unwrap());
    assert_eq!(want.len(), have.len(), "{OPS_PATH} is stale: rerun with TESSERA_WRITE_WEB_FIXTURES=1");
    for (w, h) in want.iter().zip(have) {
        let name = w["name"].as_str().unwrap();
        for key in ["name", "js", "inputs", "dtype", "shape"] {
            assert!(
                same(&w[key], &h[key]),
                "{OPS_PATH}: case {name} field {key} is stale: rerun with TESSERA_WRITE_WEB_FIXTURES=1"
            );
        }
        let nums = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect::<Vec<_>>();
        assert_close(
            &format!("{OPS_PATH}: {name}"),
            &nums(&h["expected"]),
            &nums(&w["expected"]),
            Tol { atol: 1e-6, rtol: 1e-6 },
        );
    }
}

const EMBED_PATH: &str = "web/tests/fixtures/embeddings.json";

/// Native embeddings of the MiniLM fixture's sentences: the page must match them to 1e-4.
#[test]
fn embedding_fixture_matches_native() {
    let Some(dir) = model_dir() else { return };
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string("tests/fixtures/minilm_reference.json").unwrap()).unwrap();
    let texts: Vec<String> =
        reference["sentences"].as_array().unwrap().iter().map(|s| s["text"].as_str().unwrap().to_string()).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let dev = common::first_device();
    let embedder = tessera::models::bert::SentenceEmbedder::load(&dir, &dev).unwrap();
    let got = embedder.embed_blocking(&refs).unwrap();
    let ids = embedder.tokenize(&refs).unwrap();
    if write_mode() {
        let doc = json!({
            "about": format!("all-MiniLM-L6-v2 embeddings computed natively on {} by tests/web_fixtures.rs", label(&dev)),
            "texts": texts,
            "token_ids": ids,
            "embeddings": got,
        });
        std::fs::write(EMBED_PATH, serde_json::to_string(&doc).unwrap() + "\n").unwrap();
        return;
    }
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(EMBED_PATH).unwrap()).unwrap();
    assert_eq!(committed["texts"], json!(texts));
    assert_eq!(committed["token_ids"], json!(ids));
    for (i, row) in got.iter().enumerate() {
        let want: Vec<f64> =
            committed["embeddings"][i].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let have: Vec<f64> = row.iter().map(|&v| v as f64).collect();
        assert_close(&format!("{EMBED_PATH} sentence {i}"), &have, &want, Tol { atol: 1e-5, rtol: 0.0 });
    }
}

const GGUF_PATH: &str = "web/tests/fixtures/tiny.gguf";
const GGUF_JSON: &str = "web/tests/fixtures/gguf.json";

/// A small GGUF file (F32, F16, Q8_0 and Q4_0 tensors, metadata of several types) and
/// the values each tensor must load as, for the page's `loadGguf` check.
#[test]
fn gguf_fixture_is_current() {
    use tessera::io::gguf::{self, GgufFile};
    let cpu = Device::reference();
    let w = |shape: [usize; 2], seed: u64| Tensor::randn(shape, seed, &cpu);
    let tensors = vec![
        ("w_f32".to_string(), w([3, 32], 1)),
        ("w_f16".to_string(), w([2, 32], 2).cast(DType::F16)),
        ("w_q8_0".to_string(), quant::quantize_tensor_blocking(&w([2, 64], 3), DType::Q8_0).unwrap()),
        ("w_q4_0".to_string(), quant::quantize_tensor_blocking(&w([1, 96], 4), DType::Q4_0).unwrap()),
    ];
    let file = GgufFile {
        version: 3,
        metadata: vec![
            ("general.name".into(), gguf::Value::String("tiny".into())),
            ("tiny.count".into(), gguf::Value::U32(7)),
            ("tiny.big".into(), gguf::Value::U64(1 << 40)),
            ("tiny.scale".into(), gguf::Value::F32(0.5)),
            (
                "tiny.list".into(),
                gguf::Value::Array(5, vec![gguf::Value::I32(1), gguf::Value::I32(-2), gguf::Value::I32(3)]),
            ),
        ],
        tensors: pollster::block_on(gguf::tensors_to_data(&tensors)).unwrap(),
    };
    let bytes = gguf::to_bytes(&file).unwrap();
    let values: serde_json::Map<String, Value> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                json!({ "dtype": t.dtype().name(), "shape": t.dims(), "values": t.to_f64_vec_blocking().unwrap() }),
            )
        })
        .collect();
    let doc = json!({ "about": "Expected contents of tiny.gguf (tests/web_fixtures.rs)", "tensors": values });
    if write_mode() {
        std::fs::write(GGUF_PATH, &bytes).unwrap();
        std::fs::write(GGUF_JSON, serde_json::to_string(&doc).unwrap() + "\n").unwrap();
        return;
    }
    assert_eq!(
        std::fs::read(GGUF_PATH).unwrap(),
        bytes,
        "{GGUF_PATH} is stale: rerun with TESSERA_WRITE_WEB_FIXTURES=1"
    );
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(GGUF_JSON).unwrap()).unwrap();
    assert!(same(&committed, &doc), "{GGUF_JSON} is stale: rerun with TESSERA_WRITE_WEB_FIXTURES=1");
}

/// JSON equality with numbers compared as f32 (serde_json's parser may differ from the
/// written f64 in the last bit; every value here is an f32 or narrower).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64().map(|v| v as f32) == y.as_f64().map(|v| v as f32),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}
