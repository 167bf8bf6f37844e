//! ONNX backend test cases (`model.onnx` plus `test_data_set_N/{input,output}_K.pb`, the
//! layout of the official node tests): run one and compare its outputs with the
//! expected ones at onnxruntime-like tolerances, as a pass, a fail or unsupported.

use super::proto;
use super::read::tensor_from_proto;
use super::value::{fmt_err, HostTensor, Value};
use super::{LoadOptions, OnnxModel};
use crate::{Device, Error, Result};
use prost::Message;

/// Comparison tolerances: `|got - want| <= atol + rtol * |want|` for floats; integers
/// and booleans compare exactly.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

impl Default for Tolerance {
    /// The ONNX backend test runner's defaults.
    fn default() -> Self {
        Tolerance { atol: 1e-7, rtol: 1e-3 }
    }
}

/// One data set: named inputs and the expected outputs, as serialized `TensorProto`s.
#[derive(Clone, Debug, Default)]
pub struct DataSet {
    pub inputs: Vec<Vec<u8>>,
    pub outputs: Vec<Vec<u8>>,
}

/// What a case came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Every output matched; the largest absolute difference seen.
    Pass { max_abs_diff: f64 },
    /// Ran, but an output differs (or the run failed with an error that is not an
    /// unsupported feature).
    Fail(String),
    /// Uses an op, type or attribute the importer does not support.
    Unsupported(String),
}

impl Verdict {
    pub fn is_pass(&self) -> bool {
        matches!(self, Verdict::Pass { .. })
    }

    /// `pass`, `fail` or `unsupported`.
    pub fn kind(&self) -> &'static str {
        match self {
            Verdict::Pass { .. } => "pass",
            Verdict::Fail(_) => "fail",
            Verdict::Unsupported(_) => "unsupported",
        }
    }
}

fn classify(e: &Error) -> Verdict {
    let msg = e.to_string();
    if matches!(e, Error::Unsupported(_)) || msg.contains("not supported") {
        Verdict::Unsupported(msg)
    } else {
        Verdict::Fail(msg)
    }
}

/// Decode a serialized `TensorProto` (an `input_K.pb` / `output_K.pb` file).
pub fn decode_tensor(bytes: &[u8]) -> Result<(String, HostTensor)> {
    let t = proto::TensorProto::decode(bytes).map_err(|e| fmt_err(format!("not a TensorProto: {e}")))?;
    Ok((t.name.clone().unwrap_or_default(), tensor_from_proto(&t, None)?))
}

/// Run a case: load `model`, feed each data set, compare. Inputs are passed as host
/// values (as the CLI passes `.npy` files).
pub async fn run_case(model: &[u8], sets: &[DataSet], dev: &Device, tol: Tolerance) -> Verdict {
    let m = match OnnxModel::from_bytes(model, dev, LoadOptions::default()) {
        Ok(m) => m,
        Err(e) => return classify(&e),
    };
    if let Some(i) = m.inputs().iter().chain(m.outputs()).find(|i| i.elem.is_none()) {
        return Verdict::Unsupported(format!(
            "'{}' is not a tensor of a supported type (sequences, maps, optionals, strings, 2- and 4-bit integers and 8-bit floats are not supported)",
            i.name
        ));
    }
    let mut worst = 0.0f64;
    for (si, set) in sets.iter().enumerate() {
        match run_set(&m, set, tol).await {
            Ok(d) => worst = worst.max(d),
            Err(v) => {
                return match v {
                    Verdict::Fail(msg) => Verdict::Fail(format!("data set {si}: {msg}")),
                    other => other,
                }
            }
        }
    }
    Verdict::Pass { max_abs_diff: worst }
}

async fn run_set(m: &OnnxModel, set: &DataSet, tol: Tolerance) -> std::result::Result<f64, Verdict> {
    let mut inputs = Vec::new();
    for (k, bytes) in set.inputs.iter().enumerate() {
        let (name, h) = decode_tensor(bytes).map_err(|e| classify(&e))?;
        let name = if !name.is_empty() && m.inputs().iter().any(|i| i.name == name) {
            name
        } else {
            match m.inputs().get(k) {
                Some(i) => i.name.clone(),
                None => return Err(Verdict::Fail(format!("input {k} has no matching graph input"))),
            }
        };
        inputs.push((name, Value::host(h)));
    }
    let outs = m.run_values(inputs).map_err(|e| classify(&e))?;
    if outs.len() != set.outputs.len() {
        return Err(Verdict::Fail(format!("{} outputs, {} expected", outs.len(), set.outputs.len())));
    }
    let tensors: Vec<crate::Tensor> = outs.iter().map(|o| o.tensor.clone()).collect();
    let got = crate::read_all(&tensors).await.map_err(|e| classify(&e))?;
    let mut worst = 0.0f64;
    for (k, (o, bytes)) in outs.iter().zip(&set.outputs).enumerate() {
        let (_, want) = decode_tensor(bytes).map_err(|e| classify(&e))?;
        if o.tensor.dims() != want.dims.as_slice() {
            return Err(Verdict::Fail(format!(
                "output {k} '{}': shape {:?}, expected {:?}",
                o.name,
                o.tensor.dims(),
                want.dims
            )));
        }
        let exact = !want.elem.is_float();
        // 16-bit float outputs: at least four units in their last place, relative.
        let rtol = match want.elem {
            super::Elem::F16 => tol.rtol.max(4.0 / 1024.0),
            super::Elem::BF16 => tol.rtol.max(4.0 / 128.0),
            _ => tol.rtol,
        };
        for (i, &g) in got[k].iter().enumerate() {
            let w = want.data.f(i);
            // The device computes bf16 and f64 outputs in f32: store them as their type.
            let g = want.elem.round(g);
            if g.is_nan() && w.is_nan() {
                continue;
            }
            let d = (g - w).abs();
            let ok = if exact { g == w } else { d <= tol.atol + rtol * w.abs() || g == w };
            if !ok {
                return Err(Verdict::Fail(format!(
                    "output {k} '{}' element {i}: got {g}, expected {w} (|diff| {d:.3e})",
                    o.name
                )));
            }
            if d.is_finite() {
                worst = worst.max(d);
            }
        }
    }
    Ok(worst)
}

/// Read a case directory: `model.onnx` and every `test_data_set_*`.
#[cfg(not(target_arch = "wasm32"))]
pub fn read_case_dir(dir: &std::path::Path) -> Result<(Vec<u8>, Vec<DataSet>)> {
    let io =
        |p: &std::path::Path, e: std::io::Error| Error::Io { path: p.display().to_string(), message: e.to_string() };
    let model_path = dir.join("model.onnx");
    let model = std::fs::read(&model_path).map_err(|e| io(&model_path, e))?;
    let mut set_dirs: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_dir() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("test_data_set_"))
        })
        .collect();
    set_dirs.sort();
    let mut sets = Vec::new();
    for d in set_dirs {
        let mut set = DataSet::default();
        for (prefix, out) in [("input_", &mut set.inputs), ("output_", &mut set.outputs)] {
            let mut k = 0;
            loop {
                let p = d.join(format!("{prefix}{k}.pb"));
                if !p.exists() {
                    break;
                }
                out.push(std::fs::read(&p).map_err(|e| io(&p, e))?);
                k += 1;
            }
        }
        sets.push(set);
    }
    Ok((model, sets))
}

/// [`run_case`] on a directory, blocking (native only).
#[cfg(not(target_arch = "wasm32"))]
pub fn run_case_dir(dir: &std::path::Path, dev: &Device, tol: Tolerance) -> Verdict {
    match read_case_dir(dir) {
        Ok((model, sets)) => pollster::block_on(run_case(&model, &sets, dev, tol)),
        Err(e) => Verdict::Fail(e.to_string()),
    }
}

/// Serialize a host tensor as a `TensorProto` (what `input_K.pb` files hold).
pub fn encode_tensor(name: &str, t: &HostTensor) -> Vec<u8> {
    use super::value::{Elem, HostData};
    let mut p = proto::TensorProto {
        name: Some(name.to_string()),
        dims: t.dims.iter().map(|&d| d as i64).collect(),
        data_type: Some(t.elem.to_proto()),
        ..Default::default()
    };
    let n = t.numel();
    let raw: Vec<u8> = match (&t.data, t.elem) {
        (HostData::F(v), Elem::F16) => v.iter().flat_map(|&x| half::f16::from_f64(x).to_le_bytes()).collect(),
        (HostData::F(v), Elem::BF16) => v.iter().flat_map(|&x| half::bf16::from_f64(x).to_le_bytes()).collect(),
        (HostData::F(v), Elem::F64) => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        (HostData::F(v), _) => v.iter().flat_map(|&x| (x as f32).to_le_bytes()).collect(),
        (HostData::I(v), e) => match super::read::byte_size(e) {
            1 => v.iter().map(|&x| x as u8).collect(),
            2 => v.iter().flat_map(|&x| (x as i16).to_le_bytes()).collect(),
            4 => v.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
            _ => v.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        },
    };
    debug_assert_eq!(raw.len(), n * super::read::byte_size(t.elem));
    p.raw_data = Some(raw);
    p.encode_to_vec()
}
