//! ONNX models in the page: `OnnxModel.load(bytes)` imports a model onto the current
//! device and `await model.run({ name: Tensor })` runs it as one realisation.

use crate::tensor::JsTensor;
use crate::{device, js, js_err};
use js_sys::{Array, Object};
use tessera::onnx::{IoInfo, LoadOptions, OnnxModel};
use wasm_bindgen::prelude::*;

/// An imported ONNX model.
#[wasm_bindgen(js_name = OnnxModel)]
pub struct JsOnnxModel {
    model: OnnxModel,
}

fn io_list(list: &[IoInfo]) -> JsValue {
    list.iter()
        .map(|i| {
            let dims: Array = i
                .dims
                .iter()
                .flatten()
                .map(|d| match d {
                    tessera::onnx::Dim::Fixed(n) => JsValue::from(*n as f64),
                    tessera::onnx::Dim::Named(s) => JsValue::from_str(s),
                    tessera::onnx::Dim::Unknown => JsValue::NULL,
                })
                .collect();
            js::object(&[
                ("name", JsValue::from_str(&i.name)),
                ("type", i.elem.map(|e| JsValue::from_str(e.name())).unwrap_or(JsValue::NULL)),
                ("shape", dims.into()),
            ])
        })
        .collect::<Array>()
        .into()
}

#[wasm_bindgen(js_class = OnnxModel)]
impl JsOnnxModel {
    /// Import a model from the bytes of a `.onnx` file. `{ weights: "f16" | "q8_0" |
    /// "q4_0" }` converts MatMul and Gemm weights. An unsupported op throws at once,
    /// listing every unsupported op and node.
    pub fn load(
        #[wasm_bindgen(unchecked_param_type = "ArrayBuffer | Uint8Array")] bytes: JsValue,
        #[wasm_bindgen(unchecked_param_type = "OnnxLoadOptions | undefined")] options: JsValue,
    ) -> Result<JsOnnxModel, JsError> {
        let data = js::bytes(&bytes, "bytes")?;
        let weights = match js::get_str(&options, "weights") {
            None => None,
            Some(s) => Some(
                tessera::quant::parse_dtype(&s)
                    .ok_or_else(|| JsError::new(&format!("weights: {s:?} is not \"f16\", \"q8_0\" or \"q4_0\"")))?,
            ),
        };
        let model = OnnxModel::from_bytes(&data, &device()?, LoadOptions { weights }).map_err(js_err)?;
        Ok(JsOnnxModel { model })
    }

    /// The declared inputs: `[{ name, type, shape }]` (symbolic dimensions as strings).
    #[wasm_bindgen(getter, unchecked_return_type = "OnnxValueInfo[]")]
    pub fn inputs(&self) -> JsValue {
        io_list(self.model.inputs())
    }

    /// The declared outputs.
    #[wasm_bindgen(getter, unchecked_return_type = "OnnxValueInfo[]")]
    pub fn outputs(&self) -> JsValue {
        io_list(self.model.outputs())
    }

    /// `{ opset, producer, nodes, ops: { type: count } }`.
    #[wasm_bindgen(
        getter,
        unchecked_return_type = "{ opset: number, producer: string, nodes: number, ops: Record<string, number> }"
    )]
    pub fn info(&self) -> JsValue {
        let i = self.model.info();
        let ops = Object::new();
        for (op, c) in &i.ops {
            let _ = js_sys::Reflect::set(&ops, &JsValue::from_str(op), &JsValue::from(*c as f64));
        }
        js::object(&[
            ("opset", (i.opset as f64).into()),
            ("producer", JsValue::from_str(&i.producer)),
            ("nodes", (i.nodes as f64).into()),
            ("ops", ops.into()),
        ])
    }

    /// Run on `{ name: Tensor }` (int64 inputs as i32 tensors): resolves to
    /// `{ name: Tensor }` once every output is computed, in one realisation.
    #[wasm_bindgen(unchecked_return_type = "Promise<Record<string, Tensor>>")]
    pub fn run(
        &self,
        #[wasm_bindgen(unchecked_param_type = "Record<string, Tensor>")] inputs: JsValue,
    ) -> Result<js_sys::Promise, JsError> {
        if !inputs.is_object() {
            return Err(JsError::new("inputs must be an object mapping input names to Tensors"));
        }
        let mut given = Vec::new();
        for entry in Object::entries(&inputs.clone().into()).iter() {
            let pair = Array::from(&entry);
            let name = pair.get(0).as_string().unwrap_or_default();
            let t = JsTensor::list(&Array::of1(&pair.get(1)).into(), &format!("inputs[{name:?}]"))?;
            given.extend(t.into_iter().map(|t| (name.clone(), t)));
        }
        let refs: Vec<(&str, tessera::Tensor)> = given.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let outs = self.model.run(&refs).map_err(js_err)?;
        let dev = self.model.device().clone();
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let tensors: Vec<tessera::Tensor> = outs.iter().map(|o| o.tensor.clone()).collect();
            dev.realize(&tensors).await.map_err(|e| JsValue::from(js_err(e)))?;
            let o = Object::new();
            for out in outs {
                let t = JsTensor::wrap(out.tensor).map_err(JsValue::from)?;
                let _ = js_sys::Reflect::set(&o, &JsValue::from_str(&out.name), &t.into());
            }
            Ok(o.into())
        }))
    }
}

/// Run one ONNX backend test case (the official node tests' layout): the model's bytes
/// and, per data set, the serialized input and expected output `TensorProto`s. Resolves
/// to `{ verdict: "pass" | "fail" | "unsupported", detail: string }`.
#[wasm_bindgen(js_name = onnxTestCase, unchecked_return_type = "Promise<{ verdict: string, detail: string }>")]
pub fn onnx_test_case(
    #[wasm_bindgen(unchecked_param_type = "Uint8Array")] model: JsValue,
    #[wasm_bindgen(unchecked_param_type = "Uint8Array[]")] inputs: JsValue,
    #[wasm_bindgen(unchecked_param_type = "Uint8Array[]")] outputs: JsValue,
) -> Result<js_sys::Promise, JsError> {
    use tessera::onnx::testcase::{run_case, DataSet, Tolerance, Verdict};
    let model = js::bytes(&model, "model")?;
    let list = |v: &JsValue, what: &str| -> Result<Vec<Vec<u8>>, JsError> {
        if !Array::is_array(v) {
            return Err(JsError::new(&format!("{what} must be an array of Uint8Arrays")));
        }
        Array::from(v).iter().enumerate().map(|(i, b)| js::bytes(&b, &format!("{what}[{i}]"))).collect()
    };
    let set = DataSet { inputs: list(&inputs, "inputs")?, outputs: list(&outputs, "outputs")? };
    let dev = device()?;
    Ok(wasm_bindgen_futures::future_to_promise(async move {
        let v = run_case(&model, &[set], &dev, Tolerance::default()).await;
        let detail = match &v {
            Verdict::Pass { max_abs_diff } => format!("max |diff| {max_abs_diff:e}"),
            Verdict::Fail(m) | Verdict::Unsupported(m) => m.clone(),
        };
        Ok(js::object(&[("verdict", JsValue::from_str(v.kind())), ("detail", JsValue::from_str(&detail))]))
    }))
}
