//! Files in and out of the page: safetensors and GGUF (from an `ArrayBuffer`), and the
//! MNIST digits the demo trains on.

use crate::tensor::JsTensor;
use crate::{device, js, js_err};
use js_sys::{Array, Object, Reflect, Uint8Array};
use std::collections::BTreeMap;
use tessera::io::gguf::Value;
use tessera::{io, Tensor};
use wasm_bindgen::prelude::*;

fn tensors_object(tensors: BTreeMap<String, Tensor>) -> Result<JsValue, JsError> {
    let o = Object::new();
    for (name, t) in tensors {
        Reflect::set(&o, &JsValue::from_str(&name), &JsTensor::wrap(t)?.into())
            .map_err(|_| JsError::new("could not build the tensor map"))?;
    }
    Ok(o.into())
}

/// Parse a safetensors file: `{ tensors: { name: Tensor }, metadata: { key: string } }`.
/// Every dtype the format has loads (integers and bool widen, bf16 and f64 become f32);
/// a corrupt or truncated file throws an `Error` naming what is wrong.
#[wasm_bindgen(js_name = loadSafetensors, unchecked_return_type = "{ tensors: Record<string, Tensor>, metadata: Record<string, string> }")]
pub fn load_safetensors(
    #[wasm_bindgen(unchecked_param_type = "ArrayBuffer | Uint8Array")] bytes: JsValue,
) -> Result<JsValue, JsError> {
    let data = js::bytes(&bytes, "bytes")?;
    let file = io::safetensors::load_bytes(&data, &device()?).map_err(js_err)?;
    let meta = Object::new();
    for (k, v) in &file.metadata {
        let _ = Reflect::set(&meta, &JsValue::from_str(k), &JsValue::from_str(v));
    }
    Ok(js::object(&[("tensors", tensors_object(file.tensors)?), ("metadata", meta.into())]))
}

fn gguf_value(v: &Value) -> JsValue {
    match v {
        Value::U8(x) => (*x as f64).into(),
        Value::I8(x) => (*x as f64).into(),
        Value::U16(x) => (*x as f64).into(),
        Value::I16(x) => (*x as f64).into(),
        Value::U32(x) => (*x as f64).into(),
        Value::I32(x) => (*x as f64).into(),
        Value::F32(x) => (*x as f64).into(),
        Value::U64(x) => js_sys::BigInt::from(*x).into(),
        Value::I64(x) => js_sys::BigInt::from(*x).into(),
        Value::F64(x) => (*x).into(),
        Value::Bool(x) => (*x).into(),
        Value::String(s) => s.as_str().into(),
        Value::Array(_, items) => items.iter().map(gguf_value).collect::<Array>().into(),
    }
}

/// Parse a GGUF file: `{ version, metadata: { key: value }, tensors: { name: Tensor } }`.
/// F32, F16, Q8_0 and Q4_0 tensors load; Q8_0/Q4_0 stay in their blocks on the GPU
/// (matmuls dequantise as they load). 64-bit metadata integers are `BigInt`s.
#[wasm_bindgen(js_name = loadGguf, unchecked_return_type = "{ version: number, metadata: Record<string, unknown>, tensors: Record<string, Tensor> }")]
pub fn load_gguf(
    #[wasm_bindgen(unchecked_param_type = "ArrayBuffer | Uint8Array")] bytes: JsValue,
) -> Result<JsValue, JsError> {
    let data = js::bytes(&bytes, "bytes")?;
    let file = io::gguf::parse(&data).map_err(js_err)?;
    let tensors = file.to_tensors(&device()?).map_err(js_err)?;
    let meta = Object::new();
    for (k, v) in &file.metadata {
        let _ = Reflect::set(&meta, &JsValue::from_str(k), &gguf_value(v));
    }
    Ok(js::object(&[
        ("version", file.version.into()),
        ("metadata", meta.into()),
        ("tensors", tensors_object(tensors)?),
    ]))
}

/// Serialise tensors (`{ name: Tensor }`) and string metadata as a safetensors file.
#[wasm_bindgen(js_name = saveSafetensors, unchecked_return_type = "Promise<Uint8Array>")]
pub fn save_safetensors(
    #[wasm_bindgen(unchecked_param_type = "Record<string, Tensor>")] tensors: JsValue,
    #[wasm_bindgen(unchecked_param_type = "Record<string, string> | undefined")] metadata: JsValue,
) -> Result<js_sys::Promise, JsError> {
    if !tensors.is_object() {
        return Err(JsError::new("tensors must be an object mapping names to Tensors"));
    }
    let mut list = Vec::new();
    for entry in Object::entries(&tensors.clone().into()).iter() {
        let pair = Array::from(&entry);
        let name = pair.get(0).as_string().unwrap_or_default();
        let t = JsTensor::list(&Array::of1(&pair.get(1)).into(), &format!("tensors[{name:?}]"))?;
        list.extend(t.into_iter().map(|t| (name.clone(), t)));
    }
    let mut meta = BTreeMap::new();
    if metadata.is_object() {
        for entry in Object::entries(&metadata.clone().into()).iter() {
            let pair = Array::from(&entry);
            let v = pair.get(1).as_string().ok_or_else(|| JsError::new("metadata values must be strings"))?;
            meta.insert(pair.get(0).as_string().unwrap_or_default(), v);
        }
    }
    Ok(wasm_bindgen_futures::future_to_promise(async move {
        let bytes = io::safetensors::to_bytes(&list, &meta).await.map_err(js_err)?;
        Ok(Uint8Array::from(&bytes[..]).into())
    }))
}

/// MNIST digits in the TMNIST01 format of `data/mnist.bin` (28x28, labels 0-9).
#[wasm_bindgen]
pub struct Mnist {
    inner: io::mnist::Mnist,
}

#[wasm_bindgen]
impl Mnist {
    /// Parse the bytes of a TMNIST01 file.
    pub fn parse(
        #[wasm_bindgen(unchecked_param_type = "ArrayBuffer | Uint8Array")] bytes: JsValue,
    ) -> Result<Mnist, JsError> {
        let data = js::bytes(&bytes, "bytes")?;
        Ok(Mnist { inner: io::mnist::Mnist::parse(&data).map_err(js_err)? })
    }

    /// How many digits.
    #[wasm_bindgen(getter)]
    pub fn length(&self) -> u32 {
        self.inner.len() as u32
    }

    /// Digits `indices` as `{ x: Tensor [n, 784] f32 in [0, 1], y: Tensor [n] i32 }`.
    #[wasm_bindgen(unchecked_return_type = "{ x: Tensor, y: Tensor }")]
    pub fn batch(
        &self,
        #[wasm_bindgen(unchecked_param_type = "ArrayLike<number>")] indices: JsValue,
    ) -> Result<JsValue, JsError> {
        let idx = js::usizes(&indices, "indices")?;
        if let Some(&bad) = idx.iter().find(|&&i| i >= self.inner.len()) {
            return Err(JsError::new(&format!("index {bad} is out of range: there are {} digits", self.inner.len())));
        }
        let dev = device()?;
        let x = Tensor::from_slice(&self.inner.images_f32(&idx), [idx.len(), 784], &dev);
        let y = Tensor::from_slice(&self.inner.labels_i32(&idx), [idx.len()], &dev);
        Ok(js::object(&[("x", JsTensor::wrap(x)?.into()), ("y", JsTensor::wrap(y)?.into())]))
    }

    /// The 784 pixels of one digit (0-255, row-major).
    pub fn image(&self, index: u32) -> Result<Uint8Array, JsError> {
        let i = index as usize;
        if i >= self.inner.len() {
            return Err(JsError::new(&format!("index {i} is out of range: there are {} digits", self.inner.len())));
        }
        let px: Vec<u8> = self.inner.images_f32(&[i]).iter().map(|v| (v * 255.0).round() as u8).collect();
        Ok(Uint8Array::from(&px[..]))
    }

    /// The label of one digit.
    pub fn label(&self, index: u32) -> Result<u32, JsError> {
        let i = index as usize;
        if i >= self.inner.len() {
            return Err(JsError::new(&format!("index {i} is out of range: there are {} digits", self.inner.len())));
        }
        Ok(self.inner.labels_i32(&[i])[0] as u32)
    }
}
