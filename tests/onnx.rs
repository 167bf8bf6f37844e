//! ONNX: models exported from Tessera run in onnxruntime (the oracle, through
//! `scripts/ort_run.py` in the project's .venv) and re-import into Tessera on every
//! device; imports with symbolic dimensions, weight conversion, and hostile files.

mod common;
use common::{assert_close, devices, label, rand_t, Tol};
use std::path::PathBuf;
use tessera::nn::{
    Activation, AvgPool2d, BatchNorm2d, Conv2d, ConvTranspose2d, Flatten, Layer, LayerNorm, Linear, MaxPool2d, Module,
    Sequential, TransformerEncoderLayer,
};
use tessera::onnx::proto;
use tessera::onnx::testcase::{decode_tensor, encode_tensor};
use tessera::onnx::{Elem, HostData, HostTensor, LoadOptions, OnnxModel, Value};
use tessera::ops::nn::Conv2dOptions;
use tessera::{DType, Device, Error, Tensor};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The project's Python, with onnxruntime: the test fails (it cannot check) without it.
fn python() -> PathBuf {
    let p = root().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run `bash scripts/setup_python.sh` (numpy, onnx, onnxruntime) so onnxruntime can check exported models",
        p.display()
    );
    p
}

/// Run `model` in onnxruntime on `inputs`.
fn ort(model: &[u8], inputs: &[HostTensor]) -> Vec<HostTensor> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, model).expect("write model");
    for (i, t) in inputs.iter().enumerate() {
        std::fs::write(dir.path().join(format!("input_{i}.pb")), encode_tensor(&format!("input_{i}"), t))
            .expect("write input");
    }
    let out = std::process::Command::new(python())
        .arg(root().join("scripts/ort_run.py"))
        .arg(&path)
        .arg(dir.path())
        .output()
        .expect("run python");
    assert!(out.status.success(), "onnxruntime failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let mut outs = Vec::new();
    for k in 0.. {
        let p = dir.path().join(format!("output_{k}.pb"));
        if !p.exists() {
            break;
        }
        outs.push(decode_tensor(&std::fs::read(p).expect("read output")).expect("decode output").1);
    }
    outs
}

fn host(t: &Tensor) -> HostTensor {
    let v = t.to_f64_vec_blocking().expect("read");
    let elem = Elem::of_dtype(t.dtype());
    let data = if elem.is_float() { HostData::F(v) } else { HostData::I(v.iter().map(|&x| x as i64).collect()) };
    HostTensor::new(elem, t.dims().to_vec(), data).expect("host tensor")
}

/// Export `model` on the CPU backend, check onnxruntime's outputs against Tessera's,
/// then re-import the file on every device and check again.
fn round_trip(
    name: &str,
    model: &dyn Module,
    inputs: &[(&str, Tensor)],
    forward: impl Fn() -> Vec<(String, Tensor)>,
    tol: Tol,
) {
    let want_t: Vec<(String, Tensor)> = forward();
    let want: Vec<Vec<f64>> = want_t.iter().map(|(_, t)| t.to_f64_vec_blocking().expect("native forward")).collect();
    let bytes = tessera::onnx::export_with(model, inputs, forward).unwrap_or_else(|e| panic!("{name}: export: {e}"));
    let host_inputs: Vec<HostTensor> = inputs.iter().map(|(_, t)| host(t)).collect();
    let from_ort = ort(&bytes, &host_inputs);
    assert_eq!(from_ort.len(), want.len(), "{name}: onnxruntime output count");
    for (k, (o, w)) in from_ort.iter().zip(&want).enumerate() {
        assert_eq!(o.dims, want_t[k].1.dims(), "{name}: onnxruntime output {k} shape");
        assert_close(&format!("{name}: onnxruntime output {k}"), &o.data_f64(), w, tol);
    }
    for dev in devices() {
        let m = OnnxModel::from_bytes(&bytes, &dev, LoadOptions::default())
            .unwrap_or_else(|e| panic!("{name}: re-import: {e}"));
        let vals: Vec<(String, Value)> =
            inputs.iter().zip(&host_inputs).map(|((n, _), h)| (n.to_string(), Value::host(h.clone()))).collect();
        let outs = m.run_values(vals).unwrap_or_else(|e| panic!("{name} on {}: {e}", label(&dev)));
        for (k, o) in outs.iter().enumerate() {
            let got = o.tensor.to_f64_vec_blocking().unwrap_or_else(|e| panic!("{name} on {}: {e}", label(&dev)));
            assert_close(&format!("{name}: re-imported output {k} on {}", label(&dev)), &got, &want[k], tol);
        }
        common::record(&dev);
    }
}

trait DataF64 {
    fn data_f64(&self) -> Vec<f64>;
}
impl DataF64 for HostTensor {
    fn data_f64(&self) -> Vec<f64> {
        self.floats()
    }
}

fn mnist_models(dev: &Device) -> Vec<(&'static str, Sequential, Vec<usize>)> {
    let lin = |i, o, s| Linear::new(i, o, true, s, dev);
    vec![
        (
            "mnist mlp",
            Sequential::new().add(Flatten).add(lin(784, 256, 1)).add(Activation::Relu).add(lin(256, 10, 2)),
            vec![2, 784],
        ),
        (
            "mnist cnn",
            Sequential::new()
                .add(Conv2d::new(1, 8, 3, Conv2dOptions::new(1, 1), 3, dev))
                .add(Activation::Relu)
                .add(MaxPool2d::new(2))
                .add(Conv2d::new(8, 16, 3, Conv2dOptions::new(1, 1), 4, dev))
                .add(Activation::Relu)
                .add(MaxPool2d::new(2))
                .add(Flatten)
                .add(lin(16 * 7 * 7, 64, 5))
                .add(Activation::Relu)
                .add(lin(64, 10, 6)),
            vec![2, 1, 28, 28],
        ),
    ]
}

#[test]
fn exported_mnist_models_match_onnxruntime_and_reimport() {
    let dev = Device::cpu();
    for (name, mut model, shape) in mnist_models(&dev) {
        model.set_training(false);
        let x = rand_t(&shape, 7, -1.0, 1.0, &dev);
        let m = &model;
        round_trip(
            name,
            m,
            &[("input", x.clone())],
            || vec![("output".into(), m.forward(&x))],
            Tol { atol: 1e-4, rtol: 1e-4 },
        );
    }
}

#[test]
fn exported_layers_match_onnxruntime_and_reimport() {
    let dev = Device::cpu();
    let mut bn = BatchNorm2d::new(8, &dev);
    *bn.running_mean.get_mut().unwrap() = rand_t(&[8], 11, -0.5, 0.5, &dev);
    *bn.running_var.get_mut().unwrap() = rand_t(&[8], 12, 0.5, 2.0, &dev);
    let depthwise = Conv2dOptions { groups: 8, ..Conv2dOptions::new(1, 1) };
    let mut model = Sequential::new()
        .add(Conv2d::new(3, 8, 3, Conv2dOptions::new(2, 1), 21, &dev))
        .add(bn)
        .add(Activation::Gelu)
        .add(Conv2d::new(8, 8, 3, depthwise, 22, &dev))
        .add(Activation::Silu)
        .add(ConvTranspose2d::new(8, 4, 2, Conv2dOptions::new(2, 0), 23, &dev))
        .add(Activation::GeluTanh)
        .add(AvgPool2d::new(2))
        .add(MaxPool2d::new(2))
        .add(Activation::Tanh)
        .add(Flatten)
        .add(Linear::new(4 * 4 * 4, 32, true, 24, &dev))
        .add(LayerNorm::new(32, 1e-5, &dev))
        .add(Activation::Sigmoid)
        .add(Linear::new(32, 5, false, 25, &dev));
    model.set_training(false);
    let x = rand_t(&[2, 3, 16, 16], 26, -1.0, 1.0, &dev);
    let m = &model;
    round_trip(
        "layer zoo",
        m,
        &[("input", x.clone())],
        || vec![("output".into(), m.forward(&x))],
        Tol { atol: 1e-4, rtol: 1e-4 },
    );
}

#[test]
fn exported_transformer_layer_with_mask_matches_onnxruntime() {
    let dev = Device::cpu();
    let mut layer = TransformerEncoderLayer::new(32, 4, 64, 0.0, 31, &dev);
    layer.set_training(false);
    let x = rand_t(&[2, 6, 32], 32, -1.0, 1.0, &dev);
    // Additive mask: the last two keys of the second sequence hidden.
    let mut m = vec![0f32; 2 * 6];
    m[10] = -1e9;
    m[11] = -1e9;
    let mask = Tensor::from_slice(&m, [2, 1, 1, 6], &dev);
    let l = &layer;
    round_trip(
        "transformer encoder layer",
        l,
        &[("x", x.clone()), ("mask", mask.clone())],
        || vec![("y".into(), l.forward_masked(&x, Some(&mask)))],
        Tol { atol: 2e-4, rtol: 1e-4 },
    );
}

#[test]
fn exported_minilm_matches_onnxruntime() {
    let Some(dir) = common::model_dir() else { return };
    let dev = Device::cpu();
    let model = tessera::models::bert::load_dir(&dir, &dev).expect("load MiniLM");
    let ids: Vec<i32> = vec![101, 7592, 2088, 2003, 1037, 3231, 102, 0, 101, 2023, 2003, 2178, 6251, 2007, 2062, 102];
    let mask: Vec<f32> = vec![1., 1., 1., 1., 1., 1., 1., 0., 1., 1., 1., 1., 1., 1., 1., 1.];
    let ids = Tensor::from_slice(&ids, [2, 8], &dev);
    let mask = Tensor::from_slice(&mask, [2, 8], &dev);
    let m = &model;
    round_trip(
        "MiniLM",
        m,
        &[("input_ids", ids.clone()), ("attention_mask", mask.clone())],
        || vec![("last_hidden_state".into(), m.forward(&ids, &mask))],
        Tol { atol: 1e-4, rtol: 1e-4 },
    );
}

// ---- hand-built models ----------------------------------------------------------------

fn vi(name: &str, elem: i32, dims: &[Result<i64, &str>]) -> proto::ValueInfoProto {
    use proto::tensor_shape_proto::{dimension::Value as D, Dimension};
    proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(proto::TypeProto {
            value: Some(proto::type_proto::Value::TensorType(proto::type_proto::Tensor {
                elem_type: Some(elem),
                shape: Some(proto::TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            value: Some(match d {
                                Ok(n) => D::DimValue(*n),
                                Err(s) => D::DimParam(s.to_string()),
                            }),
                            denotation: None,
                        })
                        .collect(),
                }),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

fn node(op: &str, ins: &[&str], outs: &[&str]) -> proto::NodeProto {
    proto::NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("{op}_{}", outs.join("_"))),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn with_attr(mut n: proto::NodeProto, a: proto::AttributeProto) -> proto::NodeProto {
    n.attribute.push(a);
    n
}

fn int_attr(name: &str, v: i64) -> proto::AttributeProto {
    proto::AttributeProto { name: Some(name.into()), r#type: Some(2), i: Some(v), ..Default::default() }
}

fn init_f32(name: &str, dims: &[i64], v: &[f32]) -> proto::TensorProto {
    proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        float_data: v.to_vec(),
        ..Default::default()
    }
}

fn init_i64(name: &str, dims: &[i64], v: &[i64]) -> proto::TensorProto {
    proto::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(7),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn model(g: proto::GraphProto) -> Vec<u8> {
    use prost::Message;
    proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![proto::OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(g),
        ..Default::default()
    }
    .encode_to_vec()
}

/// `y = reshape(x @ w + b, [batch, 2, 4])` with a symbolic batch: the target shape is
/// built from `Shape(x)` at run time.
fn dynamic_batch_model() -> Vec<u8> {
    let w: Vec<f32> = (0..24).map(|i| (i as f32 - 11.5) / 10.0).collect();
    model(proto::GraphProto {
        node: vec![
            node("MatMul", &["x", "w"], &["xw"]),
            node("Add", &["xw", "b"], &["h"]),
            node("Shape", &["x"], &["s"]),
            with_attr(node("Gather", &["s", "zero"], &["batch"]), int_attr("axis", 0)),
            node("Unsqueeze", &["batch", "axes0"], &["batch1"]),
            with_attr(node("Concat", &["batch1", "rest"], &["target"]), int_attr("axis", 0)),
            node("Reshape", &["h", "target"], &["r"]),
            node("Relu", &["r"], &["y"]),
        ],
        initializer: vec![
            init_f32("w", &[3, 8], &w[..]),
            init_f32("b", &[8], &[0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8]),
            init_i64("zero", &[], &[0]),
            init_i64("axes0", &[1], &[0]),
            init_i64("rest", &[2], &[2, 4]),
        ],
        input: vec![vi("x", 1, &[Err("batch"), Ok(3)])],
        output: vec![vi("y", 1, &[Err("batch"), Ok(2), Ok(4)])],
        ..Default::default()
    })
}

#[test]
fn symbolic_batch_runs_with_any_batch_on_every_device() {
    let bytes = dynamic_batch_model();
    for dev in devices() {
        let m = OnnxModel::from_bytes(&bytes, &dev, LoadOptions::default()).expect("load");
        for batch in [1usize, 3, 5] {
            let xs = common::data(batch * 3, batch as u64, -1.0, 1.0);
            let x = Tensor::from_slice(&xs, [batch, 3], &dev);
            let out = m.run(&[("x", x)]).unwrap_or_else(|e| panic!("batch {batch} on {}: {e}", label(&dev)));
            assert_eq!(out[0].tensor.dims(), [batch, 2, 4]);
            let got = out[0].tensor.to_f64_vec_blocking().expect("read");
            let w: Vec<f64> = (0..24).map(|i| (i as f64 - 11.5) / 10.0).collect();
            let b = [0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8];
            let want: Vec<f64> = (0..batch * 8)
                .map(|p| {
                    let (r, c) = (p / 8, p % 8);
                    let v: f64 = (0..3).map(|k| xs[r * 3 + k] as f64 * w[k * 8 + c]).sum::<f64>() + b[c];
                    v.max(0.0)
                })
                .collect();
            assert_close(
                &format!("dynamic batch {batch} on {}", label(&dev)),
                &got,
                &want,
                Tol { atol: 1e-5, rtol: 1e-5 },
            );
        }
        // A declared fixed dimension is checked.
        let bad = Tensor::zeros([2, 4], DType::F32, &dev);
        let e = m.run(&[("x", bad)]).expect_err("wrong width");
        assert!(e.to_string().contains("declares [batch, 3]"), "{e}");
        common::record(&dev);
    }
}

#[test]
fn weights_convert_to_f16_and_block_formats() {
    let dev = Device::cpu();
    let mut mlp = Sequential::new()
        .add(Linear::new(64, 96, true, 41, &dev))
        .add(Activation::Relu)
        .add(Linear::new(96, 32, true, 42, &dev));
    mlp.set_training(false);
    let x = rand_t(&[4, 64], 43, -1.0, 1.0, &dev);
    let bytes = tessera::onnx::export_bytes(&mlp, std::slice::from_ref(&x)).expect("export");
    let want = mlp.forward(&x).to_f64_vec_blocking().expect("forward");
    for dev in devices() {
        for (dt, tol) in [(DType::F16, 2e-2), (DType::Q8_0, 3e-2), (DType::Q4_0, 0.2)] {
            let m = OnnxModel::from_bytes(&bytes, &dev, LoadOptions { weights: Some(dt) }).expect("load");
            assert_eq!(m.info().converted_weights, 2, "both Gemm/MatMul weights convert to {dt}");
            let xd = Tensor::from_slice(&x.to_vec_blocking::<f32>().expect("x"), [4, 64], &dev);
            let got = m.run(&[("input", xd)]).expect("run")[0].tensor.to_f64_vec_blocking().expect("read");
            let err = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max);
            assert!(err < tol, "{dt} weights on {}: max error {err}", label(&dev));
        }
        common::record(&dev);
    }
}

// ---- hostile files --------------------------------------------------------------------

fn load_err(bytes: &[u8]) -> String {
    match OnnxModel::from_bytes(bytes, &Device::cpu(), LoadOptions::default()) {
        Ok(_) => panic!("a hostile model loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn truncated_files_fail_cleanly() {
    let bytes = dynamic_batch_model();
    let mut errors = 0;
    for cut in (0..bytes.len()).step_by(3) {
        // Must not panic; most cuts land mid-field and are decode errors.
        if OnnxModel::from_bytes(&bytes[..cut], &Device::cpu(), LoadOptions::default()).is_err() {
            errors += 1;
        }
    }
    assert!(errors > bytes.len() / 6, "only {errors} truncations were rejected");
    assert!(load_err(&bytes[..bytes.len() / 2]).contains("onnx"));
}

#[test]
fn hostile_graphs_give_clear_errors() {
    let base = |nodes: Vec<proto::NodeProto>, inits: Vec<proto::TensorProto>| {
        model(proto::GraphProto {
            node: nodes,
            initializer: inits,
            input: vec![vi("x", 1, &[Ok(2)])],
            output: vec![vi("y", 1, &[Ok(2)])],
            ..Default::default()
        })
    };
    // Dimensions near 2^63.
    let huge = init_f32("w", &[1 << 62, 4], &[]);
    let e = load_err(&base(vec![node("Add", &["x", "w"], &["y"])], vec![huge]));
    assert!(e.contains("initializer 'w'") && e.contains("dimension"), "{e}");
    let overflow = init_f32("w", &[1 << 31, 1 << 31, 4], &[]);
    let e = load_err(&base(vec![node("Add", &["x", "w"], &["y"])], vec![overflow]));
    assert!(e.contains("'w'"), "{e}");
    // Data that does not match the dims.
    let short = init_f32("w", &[3], &[1.0]);
    let e = load_err(&base(vec![node("Add", &["x", "w"], &["y"])], vec![short]));
    assert!(e.contains("initializer 'w'") && e.contains("1 values for dims [3]"), "{e}");
    // A cycle.
    let e = load_err(&base(
        vec![node("Add", &["x", "b"], &["a"]), node("Relu", &["a"], &["b"]), node("Relu", &["a"], &["y"])],
        vec![],
    ));
    assert!(e.contains("cycle"), "{e}");
    // A missing initializer.
    let e = load_err(&base(vec![node("Add", &["x", "missing_w"], &["y"])], vec![]));
    assert!(e.contains("'missing_w'") && e.contains("no graph input, initializer or node"), "{e}");
    // A value defined twice.
    let e = load_err(&base(vec![node("Relu", &["x"], &["y"]), node("Neg", &["x"], &["y"])], vec![]));
    assert!(e.contains("defined twice"), "{e}");
    // Every unsupported op, with node names, at load.
    let e = load_err(&base(
        vec![node("FancyOp", &["x"], &["a"]), node("OtherOp", &["a"], &["b"]), node("FancyOp", &["b"], &["y"])],
        vec![],
    ));
    assert!(e.contains("2 unsupported op type(s)") && e.contains("FancyOp") && e.contains("OtherOp"), "{e}");
    assert!(e.contains("FancyOp_a") && e.contains("FancyOp_y") && e.contains("OtherOp_b"), "{e}");
    // A graph output nothing produces.
    let e = load_err(&base(vec![node("Relu", &["x"], &["z"])], vec![]));
    assert!(e.contains("graph output 'y'"), "{e}");
}

#[test]
fn deeply_nested_subgraphs_are_refused() {
    // If inside If inside If ... 200 deep.
    let mut g = proto::GraphProto {
        node: vec![node("Identity", &["x"], &["out0"])],
        output: vec![vi("out0", 1, &[Ok(2)])],
        ..Default::default()
    };
    for d in 1..200 {
        let out = format!("out{d}");
        let mut n = node("If", &["c"], &[&out]);
        let leaf = proto::GraphProto {
            node: vec![node("Identity", &["x"], &["leaf"])],
            output: vec![vi("leaf", 1, &[Ok(2)])],
            ..Default::default()
        };
        for (branch, body) in [("then_branch", g), ("else_branch", leaf)] {
            n.attribute.push(proto::AttributeProto {
                name: Some(branch.into()),
                r#type: Some(5),
                g: Some(body),
                ..Default::default()
            });
        }
        g = proto::GraphProto { node: vec![n], output: vec![vi(&out, 1, &[Ok(2)])], ..Default::default() };
    }
    g.input = vec![vi("x", 1, &[Ok(2)]), vi("c", 9, &[])];
    let e = load_err(&model(g));
    assert!(e.contains("nested") || e.contains("recursion"), "{e}");
}

#[test]
fn int64_values_outside_i32_name_the_tensor() {
    let bytes = model(proto::GraphProto {
        node: vec![node("Cast", &["x"], &["xi"]), node("Add", &["xi", "big"], &["y"])],
        initializer: vec![init_i64("big", &[2], &[1, 3_000_000_000])],
        input: vec![vi("x", 1, &[Ok(2)])],
        output: vec![vi("y", 7, &[Ok(2)])],
        ..Default::default()
    })
    .into_iter()
    .collect::<Vec<u8>>();
    // Cast needs a `to`: patch it in.
    let mut m: proto::ModelProto = prost::Message::decode(&bytes[..]).expect("decode");
    m.graph.as_mut().expect("graph").node[0].attribute.push(int_attr("to", 7));
    let bytes = prost::Message::encode_to_vec(&m);
    let dev = Device::cpu();
    let model = OnnxModel::from_bytes(&bytes, &dev, LoadOptions::default()).expect("load");
    let e = model.run(&[("x", Tensor::zeros([2], DType::F32, &dev))]).expect_err("out of i32 range");
    let s = e.to_string();
    assert!(s.contains("'big'") && s.contains("3000000000"), "{s}");
}

#[test]
fn external_data_stays_inside_the_model_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let weights: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.path().join("w.bin"), &weights).expect("write weights");
    let ext = |location: &str, offset: &str, length: &str| {
        let kv = |k: &str, v: &str| proto::StringStringEntryProto { key: Some(k.into()), value: Some(v.into()) };
        let mut t = init_f32("w", &[2], &[]);
        t.data_location = Some(1);
        t.external_data = vec![kv("location", location), kv("offset", offset), kv("length", length)];
        model(proto::GraphProto {
            node: vec![node("Add", &["x", "w"], &["y"])],
            initializer: vec![t],
            input: vec![vi("x", 1, &[Ok(2)])],
            output: vec![vi("y", 1, &[Ok(2)])],
            ..Default::default()
        })
    };
    let dev = Device::cpu();
    let load = |bytes: Vec<u8>| {
        let p = dir.path().join("m.onnx");
        std::fs::write(&p, bytes).expect("write model");
        OnnxModel::load(&p, &dev)
    };
    let m = load(ext("w.bin", "0", "8")).expect("external data");
    let y = m.run(&[("x", Tensor::from_slice(&[10.0f32, 20.0], [2], &dev))]).expect("run");
    assert_eq!(y[0].tensor.to_vec_blocking::<f32>().expect("read"), vec![11.0, 22.0]);
    for (loc, off, len, needle) in [
        ("../w.bin", "0", "8", "relative path inside"),
        ("/etc/passwd", "0", "8", "relative path inside"),
        ("w.bin", "4", "8", "runs past the end"),
        ("w.bin", "0", "4", "its dims need 8"),
        ("absent.bin", "0", "8", "absent.bin"),
    ] {
        let e = load(ext(loc, off, len)).expect_err("hostile external data").to_string();
        assert!(e.contains(needle), "{loc} {off} {len}: {e}");
    }
    // From bytes there is no directory: the error says to load from the path.
    let e = OnnxModel::from_bytes(&ext("w.bin", "0", "8"), &dev, LoadOptions::default()).expect_err("no dir");
    assert!(e.to_string().contains("load the model from its path"), "{e}");
}

#[test]
fn oversized_constants_fail_at_run_not_by_aborting() {
    let bytes = model(proto::GraphProto {
        node: vec![node("ConstantOfShape", &["shape"], &["big"]), node("Add", &["x", "big"], &["y"])],
        initializer: vec![init_i64("shape", &[2], &[1 << 30, 1 << 12])],
        input: vec![vi("x", 1, &[Ok(1)])],
        output: vec![vi("y", 1, &[Err("n"), Err("m")])],
        ..Default::default()
    });
    let dev = Device::cpu();
    let m = OnnxModel::from_bytes(&bytes, &dev, LoadOptions::default()).expect("load");
    let r = m.run(&[("x", Tensor::zeros([1], DType::F32, &dev))]).and_then(|o| o[0].tensor.realize_blocking());
    let e = r.expect_err("a 16 TiB constant");
    let s = e.to_string();
    assert!(matches!(e, Error::OutOfMemory { .. } | Error::Limit { .. }) || s.contains("too"), "{s}");
}

fn ints_attr(name: &str, v: &[i64]) -> proto::AttributeProto {
    proto::AttributeProto { name: Some(name.into()), r#type: Some(7), ints: v.to_vec(), ..Default::default() }
}

fn str_attr(name: &str, v: &str) -> proto::AttributeProto {
    proto::AttributeProto { name: Some(name.into()), r#type: Some(3), s: Some(v.into()), ..Default::default() }
}

/// Nodes whose attributes, shapes or arity do not fit (each found by mutating the ONNX
/// node tests' models: every one panicked or looped before) fail their run with an
/// error naming the node, and the model stays usable.
#[test]
fn hostile_nodes_fail_their_run_with_clear_errors() {
    let dev = Device::cpu();
    let x4 = vi("x", 1, &[Ok(1), Ok(1), Ok(4), Ok(4)]);
    let run_err = |nodes: Vec<proto::NodeProto>, inits: Vec<proto::TensorProto>, input: proto::ValueInfoProto| {
        let bytes = model(proto::GraphProto {
            node: nodes,
            initializer: inits,
            input: vec![input.clone()],
            output: vec![vi("y", 1, &[])],
            ..Default::default()
        });
        let m = OnnxModel::from_bytes(&bytes, &dev, LoadOptions::default()).expect("the model loads");
        let dims: Vec<usize> = m.inputs()[0]
            .dims
            .as_ref()
            .unwrap()
            .iter()
            .map(|d| match d {
                tessera::onnx::Dim::Fixed(n) => *n as usize,
                _ => 1,
            })
            .collect();
        let x = Tensor::zeros(dims, DType::F32, &dev);
        let r = m.run(&[("x", x)]).and_then(|o| o[0].tensor.realize_blocking());
        r.err().map(|e| e.to_string())
    };
    let cases: Vec<(&str, Vec<proto::NodeProto>, Vec<proto::TensorProto>, &str)> = vec![
        ("MatMul with one input", vec![node("MatMul", &["x"], &["y"])], vec![], "input 1 is required"),
        ("Gemm with one input", vec![node("Gemm", &["x"], &["y"])], vec![], "input 1 is required"),
        (
            "a zero kernel size",
            vec![with_attr(node("ConvTranspose", &["x", "w"], &["y"]), ints_attr("kernel_shape", &[3, 0]))],
            vec![init_f32("w", &[1, 1, 3, 3], &[0.0; 9])],
            "kernel_shape needs a size of at least 1",
        ),
        (
            "a kernel past the input",
            vec![with_attr(node("ConvTranspose", &["x", "w"], &["y"]), ints_attr("kernel_shape", &[3]))],
            vec![init_f32("w", &[1, 1, 3, 3], &[0.0; 9])],
            "kernel_shape needs a size of at least 1",
        ),
        (
            "past keys that are not 4-D",
            vec![node("Attention", &["x", "x", "x", "", "p", "p"], &["y"])],
            vec![init_f32("p", &[2], &[0.0; 2])],
            "must be 4-D",
        ),
        (
            "past values that do not fit, with grouped query heads",
            vec![node("Attention", &["q", "x", "x", "", "pk", "pv"], &["y"])],
            vec![
                init_f32("q", &[1, 2, 4, 4], &[0.0; 32]),
                init_f32("pk", &[1, 1, 2, 4], &[0.0; 8]),
                init_f32("pv", &[1, 1, 2, 3], &[0.0; 6]),
            ],
            "shape mismatch",
        ),
        (
            "keys that do not fit the queries",
            vec![node("Attention", &["x", "k", "x"], &["y"])],
            vec![init_f32("k", &[1, 1, 4, 3], &[0.0; 12])],
            "shape mismatch",
        ),
        (
            "an einsum term naming more axes than its input",
            vec![with_attr(node("Einsum", &["x"], &["y"]), str_attr("equation", "abcde...->a"))],
            vec![],
            "is not supported",
        ),
        (
            "RNN weights that are not 3-D",
            vec![with_attr(node("GRU", &["x3", "w", "w"], &["y"]), int_attr("hidden_size", 5))],
            vec![init_f32("w", &[15], &[0.0; 15])],
            "do not fit hidden_size 5",
        ),
        (
            "an empty axis",
            vec![node("CumSum", &["x", "a"], &["y"])],
            vec![init_i64("a", &[0], &[])],
            "is empty; it must hold one value",
        ),
        (
            "a negative number of outputs",
            vec![with_attr(node("Split", &["x"], &["y"]), int_attr("num_outputs", -2))],
            vec![],
            "num_outputs -2 for 1 outputs",
        ),
        (
            "a block size whose square overflows",
            vec![with_attr(node("DepthToSpace", &["x"], &["y"]), int_attr("blocksize", 1 << 40))],
            vec![],
            "do not divide by blocksize",
        ),
        (
            "a weight zero point that does not broadcast",
            vec![node("ConvInteger", &["xi", "w", "", "wz"], &["y"])],
            vec![init_i64("w", &[2, 1, 2, 2], &[1; 8]), init_i64("wz", &[3], &[0; 3])],
            "shape mismatch",
        ),
        (
            "edge padding around an empty input axis",
            vec![with_attr(node("Pad", &["x", "p"], &["y"]), str_attr("mode", "edge"))],
            vec![init_i64("p", &[8], &[0, 0, 1, 0, 0, 0, 1, 0])],
            "edge padding of 1 and 1 around an axis of 0",
        ),
        (
            "wrap padding that would list 2^40 positions",
            vec![with_attr(node("Pad", &["x", "p"], &["y"]), str_attr("mode", "wrap"))],
            vec![init_i64("p", &[8], &[0, 0, 0, 1 << 40, 0, 0, 0, 0])],
            "wrap padding of 1099511627776 and 0",
        ),
        (
            "resizing an empty input axis",
            vec![node("Resize", &["x", "", "", "sizes"], &["y"])],
            vec![init_i64("sizes", &[4], &[1, 1, 3, 4])],
            "cannot resize an empty axis",
        ),
        (
            "repeats whose product overflows",
            vec![node("Tile", &["x", "r"], &["y"])],
            vec![init_i64("r", &[4], &[1, 1, 1, 1 << 62])],
            "element count overflows",
        ),
        (
            "a scale that resizes an axis to 4e9 positions",
            vec![node("Resize", &["x", "", "sc"], &["y"])],
            vec![init_f32("sc", &[4], &[1.0, 1.0, 1.0, 1e9])],
            "an axis resized past 2^24 positions",
        ),
        (
            "a pool over no spatial axes",
            vec![
                node("Flatten", &["x"], &["f"]),
                with_attr(node("AveragePool", &["f"], &["y"]), ints_attr("kernel_shape", &[])),
            ],
            vec![],
            "only 1-D and 2-D windows",
        ),
        (
            "pads that make the pooled output enormous",
            vec![with_attr(
                with_attr(node("AveragePool", &["x"], &["y"]), ints_attr("kernel_shape", &[1, 2])),
                ints_attr("pads", &[0, 0, 0, 1 << 40]),
            )],
            vec![],
            "is too large",
        ),
    ];
    for (what, nodes, inits, want) in cases {
        // The GRU case reads a 3-D input.
        let (nodes, input) = if what.starts_with("RNN") {
            let mut nodes = nodes;
            nodes.insert(0, node("Squeeze", &["x"], &["x3"]));
            (nodes, vi("x", 1, &[Ok(1), Ok(2), Ok(2), Ok(3)]))
        } else if what.contains("empty input axis") {
            (nodes, vi("x", 1, &[Ok(1), Ok(1), Ok(0), Ok(4)]))
        } else if what.contains("zero point") {
            let mut nodes = nodes;
            nodes.insert(0, with_attr(node("Cast", &["x"], &["xi"]), int_attr("to", 3)));
            (nodes, x4.clone())
        } else {
            (nodes, x4.clone())
        };
        let e = run_err(nodes, inits, input).unwrap_or_else(|| panic!("{what}: the node ran"));
        assert!(e.contains(want), "{what}: {e}");
    }
    // An LRN window of 2^40 channels: cut to the channels there are, it runs at once and
    // gives what any window past both ends gives.
    let lrn = |size: i64| {
        let bytes = model(proto::GraphProto {
            node: vec![with_attr(node("LRN", &["x"], &["y"]), int_attr("size", size))],
            input: vec![x4.clone()],
            output: vec![vi("y", 1, &[])],
            ..Default::default()
        });
        let m = OnnxModel::from_bytes(&bytes, &dev, LoadOptions::default()).expect("LRN loads");
        let x = rand_t(&[1, 1, 4, 4], 3, 1.0, 2.0, &dev);
        m.run(&[("x", x)]).unwrap()[0].tensor.to_vec_blocking::<f32>().unwrap()
    };
    let (huge, wide) = (lrn(1 << 40), lrn(3));
    // Both sum the one channel; the scale is alpha / size, so the huge window divides by
    // nearly nothing: its denominators are the bias alone.
    assert!(huge.iter().zip(&wide).all(|(h, w)| h.is_finite() && *h >= *w), "{huge:?} against {wide:?}");
    // A pooling window of 2^31 x 2^31 with SAME pads: every window covers the whole
    // input and about 2^62 cells of pads. Only the taps that reach the input are read,
    // so it runs at once (it used to run for minutes, and the average's window area
    // overflowed) and gives the whole input's reduction everywhere.
    let x = rand_t(&[1, 1, 4, 4], 5, -2.0, 2.0, &dev);
    let xs = x.to_vec_blocking::<f32>().unwrap();
    for (op, extra) in [("AveragePool", None), ("MaxPool", None), ("LpPool", Some(int_attr("p", 1)))] {
        let mut n = with_attr(
            with_attr(node(op, &["x"], &["y"]), ints_attr("kernel_shape", &[1 << 31, 1 << 31])),
            str_attr("auto_pad", "SAME_UPPER"),
        );
        if let Some(a) = extra {
            n = with_attr(n, a);
        }
        let bytes = model(proto::GraphProto {
            node: vec![n],
            input: vec![x4.clone()],
            output: vec![vi("y", 1, &[])],
            ..Default::default()
        });
        let m = OnnxModel::from_bytes(&bytes, &dev, LoadOptions::default()).expect("the pool loads");
        let out = &m.run(&[("x", x.clone())]).unwrap()[0].tensor;
        assert_eq!(out.dims(), [1, 1, 4, 4], "{op}");
        let want = match op {
            "AveragePool" => xs.iter().sum::<f32>() / 16.0,
            "MaxPool" => xs.iter().cloned().fold(f32::MIN, f32::max),
            _ => xs.iter().map(|v| v.abs()).sum::<f32>(),
        };
        for (i, g) in out.to_vec_blocking::<f32>().unwrap().iter().enumerate() {
            assert!((g - want).abs() < 1e-4, "{op} output {i}: {g} against {want}");
        }
    }
}
