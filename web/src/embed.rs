//! The sentence-embedding pipeline: tokenizer, BERT, mean pooling, L2 normalisation
//! (all-MiniLM-L6-v2 or any BERT checkpoint in safetensors).

use crate::{device, js, js_err};
use js_sys::{Array, Float32Array};
use std::rc::Rc;
use tessera::models::bert::SentenceEmbedder;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// Sentence embeddings in the page.
///
/// ```js
/// const embedder = await Embedder.load(
///   { model: modelBuffer, tokenizer: tokenizerJson, config: configJson },
///   { dtype: "f32", onProgress: ({ stage, progress }) => console.log(stage, progress) });
/// const [a, b] = await embedder.embed(["A cat sits.", "A kitten is sitting."]);
/// ```
#[wasm_bindgen]
pub struct Embedder {
    inner: Rc<SentenceEmbedder>,
}

fn report(cb: &Option<js_sys::Function>, stage: &str, progress: f64) {
    if let Some(f) = cb {
        let _ = f.call1(&JsValue::NULL, &js::object(&[("stage", stage.into()), ("progress", progress.into())]));
    }
}

#[wasm_bindgen]
impl Embedder {
    /// Build an embedder from the bytes of `model.safetensors`, `tokenizer.json` and
    /// `config.json` (each an `ArrayBuffer`, `Uint8Array` or, for the JSON files, a
    /// string). Options: `dtype` (`f32`, `f16`, `q8_0`, `q4_0`: how the Linear weights
    /// are stored) and `onProgress({ stage, progress })`, called as each stage
    /// (`config`, `tokenizer`, `weights`, `quantize`, `warmup`, `ready`) starts, with
    /// `progress` from 0 to 1. The warm-up compiles the kernels on a short sentence.
    #[wasm_bindgen(unchecked_return_type = "Promise<Embedder>")]
    pub async fn load(
        #[wasm_bindgen(
            unchecked_param_type = "{ model: ArrayBuffer | Uint8Array, tokenizer: ArrayBuffer | Uint8Array | string, config: ArrayBuffer | Uint8Array | string }"
        )]
        files: JsValue,
        #[wasm_bindgen(
            unchecked_param_type = "{ dtype?: DType, onProgress?: (p: { stage: string, progress: number }) => void } | undefined"
        )]
        options: JsValue,
    ) -> Result<Embedder, JsError> {
        let cb = js::get(&options, "onProgress").dyn_into::<js_sys::Function>().ok();
        let dtype = match js::get_str(&options, "dtype") {
            Some(d) => tessera::quant::parse_dtype(&d)
                .ok_or_else(|| JsError::new(&format!("dtype {d:?}: use f32, f16, q8_0 or q4_0")))?,
            None => tessera::DType::F32,
        };
        let dev = device()?;
        report(&cb, "config", 0.0);
        let config = js::bytes(&js::get(&files, "config"), "files.config")?;
        report(&cb, "tokenizer", 0.1);
        let tokenizer = js::bytes(&js::get(&files, "tokenizer"), "files.tokenizer")?;
        report(&cb, "weights", 0.2);
        js::yield_now().await;
        let weights = js::bytes(&js::get(&files, "model"), "files.model")?;
        let mut embedder = SentenceEmbedder::from_bytes(&config, &weights, &tokenizer, &dev).map_err(js_err)?;
        drop(weights);
        if dtype != tessera::DType::F32 {
            report(&cb, "quantize", 0.5);
            js::yield_now().await;
            embedder.quantize(dtype, None).await.map_err(js_err)?;
        }
        report(&cb, "warmup", 0.7);
        js::yield_now().await;
        embedder.embed(&["warm up"]).await.map_err(js_err)?;
        report(&cb, "ready", 1.0);
        Ok(Embedder { inner: Rc::new(embedder) })
    }

    /// The embedding size (384 for MiniLM).
    #[wasm_bindgen(getter)]
    pub fn dim(&self) -> u32 {
        self.inner.model.config.hidden_size as u32
    }

    /// Token ids of a text, with `[CLS]` and `[SEP]`.
    pub fn tokenize(&self, text: String) -> Result<Vec<u32>, JsError> {
        let mut ids = self.inner.tokenize(&[text.as_str()]).map_err(js_err)?;
        Ok(ids.pop().unwrap_or_default())
    }

    /// Unit-length embeddings of `texts`, one `Float32Array` each, computed as one batch.
    #[wasm_bindgen(unchecked_return_type = "Promise<Float32Array[]>")]
    pub fn embed(
        &self,
        #[wasm_bindgen(unchecked_param_type = "string[]")] texts: JsValue,
    ) -> Result<js_sys::Promise, JsError> {
        let texts = js::strings(&texts, "texts")?;
        let inner = self.inner.clone();
        Ok(wasm_bindgen_futures::future_to_promise(async move {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let rows = inner.embed(&refs).await.map_err(js_err)?;
            Ok(rows.iter().map(|r| JsValue::from(Float32Array::from(&r[..]))).collect::<Array>().into())
        }))
    }
}
