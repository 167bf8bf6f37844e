//! Small conversions between JavaScript values and Rust ones, each failing with a
//! message that names the argument.

use js_sys::{Array, Object, Reflect, Uint8Array};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// `value[key]`, or `undefined` when `value` is not an object or has no such key.
pub fn get(value: &JsValue, key: &str) -> JsValue {
    if !value.is_object() && !value.is_function() {
        return JsValue::UNDEFINED;
    }
    Reflect::get(value, &JsValue::from_str(key)).unwrap_or(JsValue::UNDEFINED)
}

/// An optional boolean option.
pub fn get_bool(value: &JsValue, key: &str) -> Option<bool> {
    get(value, key).as_bool()
}

/// An optional number option.
pub fn get_f64(value: &JsValue, key: &str) -> Option<f64> {
    get(value, key).as_f64()
}

/// An optional string option.
pub fn get_str(value: &JsValue, key: &str) -> Option<String> {
    get(value, key).as_string()
}

/// A plain object from key/value pairs.
pub fn object(pairs: &[(&str, JsValue)]) -> JsValue {
    let o = Object::new();
    for (k, v) in pairs {
        let _ = Reflect::set(&o, &JsValue::from_str(k), v);
    }
    o.into()
}

/// Bytes from an `ArrayBuffer`, a typed array or `DataView`, or a string (UTF-8).
pub fn bytes(value: &JsValue, what: &str) -> Result<Vec<u8>, JsError> {
    if let Some(s) = value.as_string() {
        return Ok(s.into_bytes());
    }
    if value.is_instance_of::<js_sys::ArrayBuffer>() || value.is_instance_of::<js_sys::SharedArrayBuffer>() {
        return Ok(Uint8Array::new(value).to_vec());
    }
    if let Some(u8s) = value.dyn_ref::<Uint8Array>() {
        return Ok(u8s.to_vec());
    }
    if js_sys::ArrayBuffer::is_view(value) {
        let buffer = get(value, "buffer");
        let offset = get_f64(value, "byteOffset").unwrap_or(0.0) as u32;
        let len = get_f64(value, "byteLength").unwrap_or(0.0) as u32;
        return Ok(Uint8Array::new_with_byte_offset_and_length(&buffer, offset, len).to_vec());
    }
    Err(JsError::new(&format!("{what} must be an ArrayBuffer, a Uint8Array or a string")))
}

/// Non-negative integers from an array of numbers (a shape, an index list).
pub fn usizes(value: &JsValue, what: &str) -> Result<Vec<usize>, JsError> {
    numbers(value, what)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            if v.fract() == 0.0 && (0.0..=(u32::MAX as f64)).contains(&v) {
                Ok(v as usize)
            } else {
                Err(JsError::new(&format!("{what}[{i}] is {v}: a non-negative integer is expected")))
            }
        })
        .collect()
}

/// Integers (possibly negative, such as axes) from an array of numbers, or from one number.
pub fn isizes(value: &JsValue, what: &str) -> Result<Vec<isize>, JsError> {
    if let Some(v) = value.as_f64() {
        return integer(v, what).map(|v| vec![v]);
    }
    numbers(value, what)?.into_iter().enumerate().map(|(i, v)| integer(v, &format!("{what}[{i}]"))).collect()
}

/// One integer from a number.
pub fn integer(v: f64, what: &str) -> Result<isize, JsError> {
    if v.fract() == 0.0 && v.abs() <= i32::MAX as f64 {
        Ok(v as isize)
    } else {
        Err(JsError::new(&format!("{what} is {v}: an integer is expected")))
    }
}

/// Numbers from an array or typed array.
pub fn numbers(value: &JsValue, what: &str) -> Result<Vec<f64>, JsError> {
    if !Array::is_array(value) && !js_sys::ArrayBuffer::is_view(value) {
        return Err(JsError::new(&format!("{what} must be an array of numbers")));
    }
    let arr = Array::from(value);
    (0..arr.length())
        .map(|i| arr.get(i).as_f64().ok_or_else(|| JsError::new(&format!("{what}[{i}] is not a number"))))
        .collect()
}

/// Strings from an array of strings.
pub fn strings(value: &JsValue, what: &str) -> Result<Vec<String>, JsError> {
    if !Array::is_array(value) {
        return Err(JsError::new(&format!("{what} must be an array of strings")));
    }
    let arr = Array::from(value);
    (0..arr.length())
        .map(|i| arr.get(i).as_string().ok_or_else(|| JsError::new(&format!("{what}[{i}] is not a string"))))
        .collect()
}

/// Let the page's event loop run (repaint, input) before continuing.
pub async fn yield_now() {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        let global: JsValue = js_sys::global().into();
        let set_timeout = get(&global, "setTimeout");
        match set_timeout.dyn_ref::<js_sys::Function>() {
            Some(f) => {
                let _ = f.call2(&global, &resolve, &JsValue::from_f64(0.0));
            }
            None => {
                let _ = resolve.call0(&JsValue::UNDEFINED);
            }
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}
