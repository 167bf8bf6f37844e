//! all-MiniLM-L6-v2 against an independent float64 implementation
//! (`tests/fixtures/minilm_reference.json`): token ids exactly, embeddings within 5e-7
//! max abs (cosine ≥ 0.999999) in f32 on the CPU backend, the first GPU and the
//! reference. Needs the model (`scripts/fetch_minilm.sh`); without it the tests fail
//! unless `TESSERA_ALLOW_NO_MODEL=1`.

mod common;
use common::model_dir;
use tessera::models::bert::{self, check_memory, check_memory_within, estimate_memory, SentenceEmbedder};
use tessera::quant;
use tessera::{DType, Device, DeviceOptions};

fn fixture() -> serde_json::Value {
    serde_json::from_str(include_str!("fixtures/minilm_reference.json")).unwrap()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn minilm_matches_the_float64_reference() {
    let Some(dir) = model_dir() else { return };
    let fx = fixture();
    let sentences = fx["sentences"].as_array().unwrap();
    let texts: Vec<&str> = sentences.iter().map(|s| s["text"].as_str().unwrap()).collect();
    // The CPU backend, the first GPU and the reference.
    let mut devices: Vec<Device> = common::devices().into_iter().take(2).collect();
    devices.push(Device::reference());
    for d in devices {
        let emb = SentenceEmbedder::load(&dir, &d).unwrap();
        let ids = emb.tokenize(&texts).unwrap();
        for (s, got) in sentences.iter().zip(&ids) {
            let want: Vec<u32> =
                s["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            assert_eq!(got, &want, "token ids of {:?}", s["text"]);
        }
        let out = emb.embed_blocking(&texts).unwrap();
        for (s, e) in sentences.iter().zip(&out) {
            let want: Vec<f64> = s["embedding"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
            let got: Vec<f64> = e.iter().map(|&x| x as f64).collect();
            assert_eq!(got.len(), 384);
            assert!(got.iter().all(|x| !x.is_nan()));
            let max_abs = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            let cos = cosine(&got, &want);
            eprintln!("{d}: {:?}: max abs {max_abs:.2e}, cosine {cos:.8}", s["text"]);
            assert!(max_abs <= 5e-7, "{d}: max abs diff {max_abs} for {:?}", s["text"]);
            assert!(cos >= 0.999999, "{d}: cosine {cos} for {:?}", s["text"]);
        }
        // The similarity matrix, too.
        let m = fx["cosine_matrix"].as_array().unwrap();
        for i in 0..out.len() {
            for j in 0..out.len() {
                let a: Vec<f64> = out[i].iter().map(|&x| x as f64).collect();
                let b: Vec<f64> = out[j].iter().map(|&x| x as f64).collect();
                let want = m[i][j].as_f64().unwrap();
                assert!((cosine(&a, &b) - want).abs() < 1e-6, "{d}: similarity [{i}][{j}]");
            }
        }
    }
}

#[test]
fn memory_estimate_is_reported_before_loading() {
    let cfg = tessera::models::bert::BertConfig::from_json(include_str!("fixtures/minilm_config.json")).unwrap();
    assert_eq!(cfg.parameter_count(), 22_565_376); // 22.7M with the unused pooler
    let f32_est = estimate_memory(&cfg, 8, 128, DType::F32);
    let q4_est = estimate_memory(&cfg, 8, 128, DType::Q4_0);
    assert!(f32_est.weights > 85_000_000 && f32_est.weights < 95_000_000, "{f32_est:?}");
    // Linear weights (10.6M values) shrink from 4 bytes to 18/32 of a byte each.
    assert!(f32_est.weights - q4_est.weights > 36_000_000, "{q4_est:?}");
    assert!(estimate_memory(&cfg, 32, 128, DType::F32).activations > f32_est.activations);
}

#[test]
fn memory_over_the_limits_is_refused_before_loading() {
    let cfg = tessera::models::bert::BertConfig::from_json(include_str!("fixtures/minilm_config.json")).unwrap();
    let d = Device::reference();
    let gpu = common::first_device();
    assert!(check_memory_within(&cfg, 8, 128, DType::F32, &gpu, None).is_ok());
    // Attention scores of 512 × 12 × 512 × 512 floats exceed a 128 MiB binding.
    if !gpu.is_cpu() {
        let e = check_memory_within(&cfg, 512, 512, DType::F32, &gpu, None).unwrap_err();
        assert!(matches!(e, tessera::Error::Limit { .. }), "{e}");
    }
    let e = check_memory_within(&cfg, 8, 128, DType::F32, &d, Some(50_000_000)).unwrap_err();
    assert!(e.to_string().contains("weights") && e.to_string().contains("50000000"), "{e}");
    // The device's own budget, with the K/M/G suffixes TESSERA_MEMORY_LIMIT accepts, is
    // what check_memory holds a model to (a GPU device and the CPU backend alike).
    let budget = tessera::device::parse_bytes("50M");
    assert_eq!(budget, Some(50 << 20));
    let mut devices = vec![Device::with_options(DeviceOptions {
        adapter: Some("cpu".into()),
        memory_limit: budget,
        ..Default::default()
    })
    .unwrap()];
    devices.extend(common::private_gpu(DeviceOptions { memory_limit: budget, ..Default::default() }));
    for dev in devices {
        assert_eq!(dev.memory_limit(), budget, "{}", common::label(&dev));
        let e = check_memory(&cfg, 8, 128, DType::F32, &dev).unwrap_err();
        assert!(e.to_string().contains(&(50u64 << 20).to_string()), "{e}");
    }
}

#[test]
fn quantised_models_save_and_reload_exactly() {
    let Some(dir) = model_dir() else { return };
    let d = common::first_device();
    let texts = ["The cat sits outside.", "A man is playing a guitar."];
    let reference = SentenceEmbedder::load(&dir, &d).unwrap().embed_blocking(&texts).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for (dt, min_cos) in [(DType::F16, 0.9999), (DType::Q8_0, 0.999)] {
        let mut model = bert::load_dir(&dir, &d).unwrap();
        pollster::block_on(quant::quantize_linears(model.linears_mut(), dt)).unwrap();
        let direct = SentenceEmbedder::from_model(model, &dir.join("tokenizer.json")).unwrap();
        let before = direct.embed_blocking(&texts).unwrap();
        for ext in ["gguf", "safetensors"] {
            let path = tmp.path().join(format!("m.{ext}"));
            bert::save(&direct.model, &path).unwrap();
            let again = SentenceEmbedder::from_model(bert::load_saved(&path, &d).unwrap(), &dir.join("tokenizer.json"))
                .unwrap();
            assert_eq!(again.embed_blocking(&texts).unwrap(), before, "{dt} via {ext}: reload changed the model");
        }
        for (a, b) in before.iter().zip(&reference) {
            let cos: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
            assert!(cos as f64 >= min_cos, "{dt}: cosine to f32 {cos}");
        }
    }
}

/// Sentences in no fixture, no calibration set and no example: the Q4_0 floor is
/// measured on text the calibration never saw.
const UNSEEN: [&str; 12] = [
    "The ferry to the island leaves every two hours in summer.",
    "My grandmother grows tomatoes and basil on her balcony.",
    "Please restart the router if the connection keeps dropping.",
    "The committee postponed its vote until next Thursday.",
    "A spoonful of honey dissolves slowly in cold tea.",
    "Volcanic ash grounded flights across northern Europe.",
    "He fixed the squeaky hinge with a drop of oil.",
    "Which platform does the overnight train to Vienna use?",
    "The orchestra tuned their instruments before the concert.",
    "Quarterly revenue beat analysts' expectations by four percent.",
    "Children built a snowman with a carrot for a nose.",
    "Compile the shader again after changing the workgroup size.",
];

#[test]
fn q4_0_keeps_unseen_sentences_close_to_f32() {
    let Some(dir) = model_dir() else { return };
    // The floor is the first GPU adapter's (lavapipe in CI); the CPU backend computes
    // the same products (minilm_matches_the_float64_reference).
    {
        let d = common::first_device();
        common::record(&d);
        let f32_emb = SentenceEmbedder::load(&dir, &d).unwrap().embed_blocking(&UNSEEN).unwrap();
        // What `embed --dtype q4_0`, the server and the browser's Embedder do: GPTQ on
        // the shipped calibration sentences.
        let mut q = SentenceEmbedder::load(&dir, &d).unwrap();
        pollster::block_on(q.quantize(DType::Q4_0, None)).unwrap();
        let got = q.embed_blocking(&UNSEEN).unwrap();
        let cos: Vec<f64> = got
            .iter()
            .zip(&f32_emb)
            .map(|(a, b)| {
                let a: Vec<f64> = a.iter().map(|&x| x as f64).collect();
                let b: Vec<f64> = b.iter().map(|&x| x as f64).collect();
                cosine(&a, &b)
            })
            .collect();
        let mean = cos.iter().sum::<f64>() / cos.len() as f64;
        let min = cos.iter().cloned().fold(1.0, f64::min);
        eprintln!("{d}: Q4_0 against f32 on unseen sentences: mean cosine {mean:.4}, min {min:.4} ({cos:.4?})");
        assert!(mean >= 0.98 && min >= 0.94, "{d}: mean cosine {mean:.4} (floor 0.98), min {min:.4} (floor 0.94)");
    }
}
