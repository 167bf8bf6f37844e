//! The real `tessera-serve` binary on an ephemeral 127.0.0.1 port, driven over HTTP by
//! a real client (reqwest). Each test builds its own repository in a temporary
//! directory; MiniLM comes from the cache `scripts/fetch_minilm.sh` fills (a missing
//! model fails the test with that hint).

use serde_json::{json, Value};
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn data_dir() -> PathBuf {
    std::env::var_os("TESSERA_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tessera"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A server process; SIGTERM and a wait on drop.
struct Server {
    child: Option<Child>,
    url: String,
    stderr: Arc<std::sync::Mutex<String>>,
}

impl Server {
    fn start(repo: &Path, args: &[&str]) -> Server {
        let minilm = data_dir().join("minilm/model.safetensors");
        assert!(minilm.exists(), "{} is missing: run `bash scripts/fetch_minilm.sh`", minilm.display());
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera-serve"))
            .args(["--port", "0", "--repo"])
            .arg(repo)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tessera-serve");
        let stderr = Arc::new(std::sync::Mutex::new(String::new()));
        let err = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("  [server] {line}");
                sink.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("first line");
        let url =
            line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line: {line:?}")).to_string();
        let s = Server { child: Some(child), url, stderr };
        s.wait_ready();
        s
    }

    fn wait_ready(&self) {
        let c = client();
        let deadline = Instant::now() + Duration::from_secs(300);
        while Instant::now() < deadline {
            if c.get(self.at("/health/ready")).send().is_ok_and(|r| r.status() == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the server did not become ready:\n{}", self.stderr.lock().unwrap());
    }

    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value, reqwest::header::HeaderMap) {
        let r = client().post(self.at(path)).json(body).send().expect("request");
        let (s, h) = (r.status().as_u16(), r.headers().clone());
        (s, r.json().unwrap_or(Value::Null), h)
    }

    fn get(&self, path: &str) -> (u16, String) {
        let r = client().get(self.at(path)).send().expect("request");
        (r.status().as_u16(), r.text().unwrap_or_default())
    }

    /// SIGTERM, then the exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = child.try_wait().expect("wait") {
                return s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the server did not exit within 60 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder().timeout(Duration::from_secs(120)).build().expect("client")
}

/// A repository with the default models (the server builds them on first start), plus
/// MiniLM versions in other dtypes sharing its files.
fn repo_with(extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    // First start builds minilm/1 and mnist/1.
    let mut s = Server::start(dir.path(), &["--device", "cpu"]);
    assert!(s.terminate().success());
    for (version, dtype) in extra {
        let m: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("minilm/1/manifest.json")).unwrap()).unwrap();
        let mut m = m;
        m["dtype"] = json!(dtype);
        let d = dir.path().join("minilm").join(version);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("manifest.json"), serde_json::to_string_pretty(&m).unwrap()).unwrap();
    }
    dir
}

fn embedding(v: &Value, i: usize) -> Vec<f32> {
    v["data"][i]["embedding"].as_array().expect("embedding").iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

#[test]
fn embeddings_predictions_models_health_and_metrics() {
    let repo = repo_with(&[]);
    let s = Server::start(repo.path(), &["--device", "cpu"]);
    // Embeddings match the in-process SentenceEmbedder.
    let texts =
        ["A man is eating food.", "The new movie is awesome.", "GPU kernels written in WGSL run in the browser."];
    let (st, one, h) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": texts[0] }));
    assert_eq!(st, 200, "{one}");
    assert_eq!(h["x-tessera-version"], "1");
    assert_eq!(one["object"], "list");
    assert_eq!(one["data"][0]["object"], "embedding");
    let (st, many, _) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": texts }));
    assert_eq!(st, 200, "{many}");
    let dev = tessera::Device::cpu();
    let emb = tessera::models::bert::SentenceEmbedder::load(data_dir().join("minilm"), &dev).expect("embedder");
    let want = emb.embed_blocking(&texts).expect("embed");
    for (i, w) in want.iter().enumerate() {
        let got = embedding(&many, i);
        let err = got.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 1e-5, "text {i}: max difference {err} from the in-process embedder");
    }
    // Usage counts the tokens the model read, [CLS] and [SEP] included.
    let counts: Vec<u64> = emb.tokenize(&texts).expect("tokenize").iter().map(|t| t.len() as u64).collect();
    assert_eq!(counts[0], 8, "{counts:?}");
    assert_eq!(one["usage"]["prompt_tokens"], counts[0]);
    assert_eq!(one["usage"]["total_tokens"], counts[0]);
    assert_eq!(many["usage"]["prompt_tokens"], counts.iter().sum::<u64>());
    // The repeat is a cache hit with the same values and usage; base64 decodes to the
    // same floats.
    let (_, again, h) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": texts[0] }));
    assert_eq!(h["x-cache"], "hit");
    assert_eq!(embedding(&again, 0), embedding(&one, 0));
    assert_eq!(again["usage"], one["usage"]);
    let (st, b64, _) =
        s.post("/v1/embeddings", &json!({ "model": "minilm", "input": texts[0], "encoding_format": "base64" }));
    assert_eq!(st, 200);
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD.decode(b64["data"][0]["embedding"].as_str().unwrap()).unwrap();
    let floats: Vec<f32> = raw.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(floats, embedding(&one, 0));
    // OpenAI's own Python client (scripts/setup_python.sh installs it) reads the same
    // vectors, through base64, and raises NotFoundError for an unknown model.
    let python = root().join(".venv/bin/python");
    assert!(python.exists(), "{} is missing: run `bash scripts/setup_python.sh`", python.display());
    let out = Command::new(&python)
        .arg(root().join("scripts/openai_client.py"))
        .arg(&s.url)
        .arg("minilm")
        .args(texts)
        .output()
        .expect("run scripts/openai_client.py");
    assert!(out.status.success(), "openai client: {}", String::from_utf8_lossy(&out.stderr));
    let oa: Value = serde_json::from_slice(&out.stdout).expect("openai client JSON");
    assert_eq!(oa["model"], "minilm");
    for i in 0..texts.len() {
        let got: Vec<f32> =
            oa["embeddings"][i].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        assert_eq!(got, embedding(&many, i), "text {i} through the OpenAI client");
    }
    // Predictions match the classifier run in process on the same digits.
    let data = tessera::io::mnist::Mnist::load(&root().join("data/mnist.bin")).expect("mnist");
    let idx: Vec<usize> = (8000..8016).collect();
    let px = data.images_f32(&idx);
    let inputs: Vec<Vec<f32>> = px.chunks(784).map(|c| c.to_vec()).collect();
    let (st, pred, _) = s.post("/v1/models/mnist/predict", &json!({ "inputs": inputs }));
    assert_eq!(st, 200, "{pred}");
    let mut model = tessera::models::mnist::build("mlp", 0, &dev).unwrap();
    let mut opt = tessera::optim::Adam::new(1e-3);
    tessera::io::checkpoint::load(repo.path().join("mnist/1/model.ckpt"), &mut model, &mut opt, &dev).unwrap();
    use tessera::nn::Layer;
    let x = tessera::Tensor::from_slice(&tessera::models::mnist::standardize(&px), [16, 784], &dev);
    let labels: Vec<i32> = model.forward(&x).argmax_dim(-1).to_vec_blocking().unwrap();
    let served: Vec<i32> =
        pred["predictions"].as_array().unwrap().iter().map(|p| p["label"].as_i64().unwrap() as i32).collect();
    assert_eq!(served, labels);
    let correct = served.iter().zip(&idx).filter(|(p, &i)| **p == data.labels[i] as i32).count();
    assert!(correct >= 12, "the served classifier got {correct}/16 digits");
    // A 28x28 nested array works too.
    let nested: Vec<Vec<f32>> = inputs[0].chunks(28).map(|r| r.to_vec()).collect();
    let (st, p1, _) = s.post("/v1/models/mnist/predict", &json!({ "inputs": [nested] }));
    assert_eq!((st, p1["predictions"][0]["label"].as_i64()), (200, Some(labels[0] as i64)));
    // Models, health, metrics.
    let (st, models) = s.get("/v1/models");
    assert_eq!(st, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    let minilm = models["data"].as_array().unwrap().iter().find(|m| m["id"] == "minilm").unwrap();
    assert_eq!(minilm["live"], "1");
    assert_eq!(minilm["versions"][0]["state"], "ready");
    // The warm-up ran one input, then (no short lengths: the CPU backend compiles no
    // kernel) a sequence at each row count that reaches a slowly compiled tile
    // (`kernels::matmul::warm_rows`: 128 rows); the classifier's batches of 32 reach none.
    let warm = tessera::kernels::matmul::warm_rows(256).len();
    assert_eq!(warm, 1);
    let events = minilm["events"].to_string();
    assert!(events.contains(&format!("(warm-up runs: {})", 1 + warm)), "{events}");
    let mnist = models["data"].as_array().unwrap().iter().find(|m| m["id"] == "mnist").unwrap();
    assert!(mnist["events"].to_string().contains("(warm-up runs: 1)"), "{mnist}");
    assert_eq!(s.get("/health/live").0, 200);
    assert_eq!(s.get("/health/ready").0, 200);
    let (st, metrics) = s.get("/metrics");
    assert_eq!(st, 200);
    for m in [
        "tessera_requests_total{model=\"minilm\",version=\"1\",status=\"200\"}",
        "tessera_request_queue_seconds_bucket",
        "tessera_request_compute_seconds_bucket",
        "tessera_request_seconds_bucket",
        "tessera_batch_size_bucket",
        "tessera_cache_hits_total",
        "tessera_cache_misses_total",
        "tessera_queue_depth",
        "tessera_device_bytes_in_use",
        "tessera_device_kernels_compiled",
    ] {
        assert!(metrics.contains(m), "/metrics lacks {m}:\n{metrics}");
    }
    // promtool accepts the exposition.
    let promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut p = promtool.expect("promtool is missing: install Debian's prometheus package (scripts/setup.sh does)");
    p.stdin.take().unwrap().write_all(metrics.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn hostile_requests_get_clear_4xx_and_the_server_keeps_serving() {
    let repo = repo_with(&[]);
    let s = Server::start(
        repo.path(),
        &["--device", "cpu", "--body-limit-bytes", "65536", "--body-timeout-s", "1", "--max-inputs", "8"],
    );
    let raw = |body: &[u8]| {
        let r = client()
            .post(s.at("/v1/embeddings"))
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
            .unwrap();
        let st = r.status().as_u16();
        (st, r.json::<Value>().unwrap_or(Value::Null))
    };
    let check = |what: &str, (st, v): (u16, Value), want: u16, needle: &str| {
        assert_eq!(st, want, "{what}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_else(|| panic!("{what}: no error message in {v}"));
        assert!(v["error"]["type"].is_string(), "{what}: {v}");
        assert!(msg.contains(needle), "{what}: {msg:?} lacks {needle:?}");
    };
    check("malformed JSON", raw(b"{\"model\": \"minilm\", \"input\": "), 400, "not valid JSON");
    check("not an object", raw(b"[1, 2]"), 400, "JSON object");
    check("empty body", raw(b""), 400, "empty");
    check("non-UTF-8", raw(b"{\"model\": \"minilm\", \"input\": \"\xff\xfe\"}"), 400, "UTF-8");
    check("wrong type", raw(br#"{"model": "minilm", "input": 42}"#), 400, "a number");
    check("wrong item type", raw(br#"{"model": "minilm", "input": ["ok", {"a": 1}]}"#), 400, "'input'[1]");
    check("empty string", raw(br#"{"model": "minilm", "input": ""}"#), 400, "empty");
    check("empty array", raw(br#"{"model": "minilm", "input": []}"#), 400, "empty array");
    check("missing model", raw(br#"{"input": "hi"}"#), 400, "'model' is required");
    let nine: Vec<String> = (0..9).map(|i| format!("text {i}")).collect();
    let (st, v, _) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": nine }));
    check("too many inputs", (st, v), 400, "at most 8");
    check("unknown model", raw(br#"{"model": "nope", "input": "hi"}"#), 404, "no model");
    check("classifier as embedder", raw(br#"{"model": "mnist", "input": "hi"}"#), 400, "classifier");
    check("token arrays", raw(br#"{"model": "minilm", "input": [[1, 2, 3]]}"#), 400, "token arrays");
    check(
        "bad encoding",
        raw(br#"{"model": "minilm", "input": "hi", "encoding_format": "hex"}"#),
        400,
        "encoding_format",
    );
    let big = format!("{{\"model\": \"minilm\", \"input\": \"{}\"}}", "a".repeat(70_000));
    check("body over the limit", raw(big.as_bytes()), 413, "limit");
    let p = |b: Value| {
        let (a, v, _) = s.post("/v1/models/mnist/predict", &b);
        (a, v)
    };
    check("wrong image size", p(json!({ "inputs": [vec![0.5f32; 700]] })), 400, "700 values");
    check("not numbers", p(json!({ "inputs": [["a"]] })), 400, "a string");
    check("no inputs", p(json!({ "x": 1 })), 400, "'inputs' is required");
    let (st, v, _) = s.post("/v1/models/nope/predict", &json!({ "inputs": [vec![0.0f32; 784]] }));
    check("unknown model (predict)", (st, v), 404, "no model");
    let (st, v, _) = s.post("/v1/models/minilm/versions/7/load", &json!({}));
    check("unknown version", (st, v), 404, "no version");
    let (st, v, _) = s.post("/v1/models/minilm/promote", &json!({ "version": "7" }));
    check("promote unknown version", (st, v), 404, "no version");
    let (st, v, _) = s.post("/v1/models/minilm/promote", &json!({ "version": "1", "fraction": 0.1 }));
    check("promote with a misspelt canary fraction", (st, v), 400, "unknown field \"fraction\"");
    let (st, v, _) = s.post("/v1/models/minilm/promote", &json!(["1"]));
    check("promote with a non-object body", (st, v), 400, "JSON object");
    let (st, v, _) = s.post("/v1/models/minilm/rollback", &json!({}));
    check("rollback with no history", (st, v), 409, "nothing to roll back");
    let r = client().get(s.at("/v2/nothing")).send().unwrap();
    check("unknown path", (r.status().as_u16(), r.json().unwrap()), 404, "no such endpoint");
    // A slow client: headers promise a body that never comes.
    let addr = s.url.trim_start_matches("http://").to_string();
    let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
    write!(tcp, "POST /v1/embeddings HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"model\"").unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let t = Instant::now();
    let mut answer = String::new();
    let _ = tcp.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "slow client got {answer:?}");
    assert!(t.elapsed() < Duration::from_secs(10), "the slow client held the server {:?}", t.elapsed());
    // Still serving.
    let (st, _, _) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": "still here" }));
    assert_eq!(st, 200);
    let (_, metrics) = s.get("/metrics");
    assert!(!metrics.contains("status=\"500\""), "a hostile request was answered 500:\n{metrics}");
}

/// Clients posting one sentence per request until `stop`; counts sent, answered, 5xx.
struct Load {
    sent: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
    server_errors: Arc<AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(url: &str, clients: usize) -> Load {
        let l = Load {
            sent: Arc::default(),
            answered: Arc::default(),
            server_errors: Arc::default(),
            stop: Arc::default(),
            threads: Vec::new(),
        };
        let mut threads = Vec::new();
        for c in 0..clients {
            let (url, sent, answered, errs, stop) =
                (url.to_string(), l.sent.clone(), l.answered.clone(), l.server_errors.clone(), l.stop.clone());
            threads.push(std::thread::spawn(move || {
                let cl = client();
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    sent.fetch_add(1, Ordering::SeqCst);
                    let body = json!({ "model": "minilm", "input": format!("client {c} says hello number {k}") });
                    if let Ok(r) = cl.post(format!("{url}/v1/embeddings")).json(&body).send() {
                        let st = r.status().as_u16();
                        if r.bytes().is_ok() {
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        if st >= 500 {
                            errs.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }));
        }
        Load { threads, ..l }
    }

    fn stop(self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        (
            self.sent.load(Ordering::SeqCst),
            self.answered.load(Ordering::SeqCst),
            self.server_errors.load(Ordering::SeqCst),
        )
    }
}

#[test]
fn promote_rollback_and_an_automatic_canary_rollback_lose_no_request_under_load() {
    // v2: q8_0 (close to f32); v3: q4_0 without calibration (a worse copy); v4: a file
    // whose checksum does not match.
    let repo = repo_with(&[("2", "q8_0"), ("3", "q4_0")]);
    let bad = repo.path().join("minilm/4");
    std::fs::create_dir_all(&bad).unwrap();
    let mut m: Value =
        serde_json::from_str(&std::fs::read_to_string(repo.path().join("minilm/1/manifest.json")).unwrap()).unwrap();
    m["files"]["model.safetensors"]["sha256"] = json!("0".repeat(64));
    std::fs::write(bad.join("manifest.json"), m.to_string()).unwrap();
    std::fs::write(repo.path().join("minilm/LIVE"), "1").unwrap();
    let s =
        Server::start(repo.path(), &["--device", "cpu", "--guard-min-cosine", "0.995", "--guard-min-samples", "12"]);
    let load = Load::start(&s.url, 8);
    std::thread::sleep(Duration::from_millis(500));
    let ok = |(st, v, _): (u16, Value, reqwest::header::HeaderMap)| {
        assert_eq!(st, 200, "{v}");
        v
    };
    ok(s.post("/v1/models/minilm/versions/2/load", &json!({})));
    ok(s.post("/v1/models/minilm/promote", &json!({ "version": "2" })));
    std::thread::sleep(Duration::from_millis(500));
    let (_, v, h) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": "which version?" }));
    assert_eq!(h["x-tessera-version"], "2", "{v}");
    ok(s.post("/v1/models/minilm/rollback", &json!({})));
    let (_, _, h) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": "which version now?" }));
    assert_eq!(h["x-tessera-version"], "1");
    // A version that fails its checksum is refused; v1 keeps serving.
    let (st, v, _) = s.post("/v1/models/minilm/versions/4/load", &json!({}));
    assert_eq!(st, 422, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("SHA-256"), "{v}");
    // The bad canary: rolled back by the guard, on its own.
    ok(s.post("/v1/models/minilm/versions/3/load", &json!({})));
    ok(s.post("/v1/models/minilm/promote", &json!({ "version": "3", "canary_fraction": 0.5 })));
    let deadline = Instant::now() + Duration::from_secs(120);
    let models = loop {
        let (_, text) = s.get("/v1/models");
        let v: Value = serde_json::from_str(&text).unwrap();
        let m = v["data"].as_array().unwrap().iter().find(|m| m["id"] == "minilm").unwrap().clone();
        if m["canary"].is_null() {
            break m;
        }
        assert!(Instant::now() < deadline, "the canary was not rolled back: {m}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let (sent, answered, errors) = load.stop();
    let events = models["events"].to_string();
    assert!(events.contains("canary 3 rolled back (automatic: mean cosine"), "{events}");
    assert_eq!(models["live"], "1");
    assert!(models["versions"].as_array().unwrap().iter().any(|v| v["version"] == "4" && v["state"] == "failed"));
    eprintln!("under load: {sent} requests sent, {answered} answered, {errors} 5xx");
    assert_eq!(sent, answered, "requests were lost");
    assert_eq!(errors, 0, "5xx answers under promote/rollback/canary");
    assert!(sent > 50, "only {sent} requests ran");
}

#[test]
fn a_batch_closes_when_requests_stop_arriving_not_at_the_delay_cap() {
    let repo = repo_with(&[]);
    // A long cap and a short quiet period: three requests 100 ms apart are one batch that
    // closes 600 ms after the last (under the old rule, a window of the cap, the two sent
    // 3 s later would have joined them).
    let s = Server::start(
        repo.path(),
        &["--device", "cpu", "--max-delay-ms", "20000", "--batch-quiet-ms", "600", "--cache-mb", "0"],
    );
    let t0 = Instant::now();
    let handles: Vec<_> = [0u64, 100, 200, 3200, 3300]
        .into_iter()
        .enumerate()
        .map(|(i, at)| {
            let url = s.at("/v1/embeddings");
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(at).saturating_sub(t0.elapsed()));
                let r = client()
                    .post(url)
                    .json(&json!({ "model": "minilm", "input": format!("sentence {i} of a burst") }))
                    .send()
                    .expect("request");
                assert_eq!(r.status(), 200);
                r.headers()["x-batch-size"].to_str().unwrap().parse::<usize>().unwrap()
            })
        })
        .collect();
    let sizes: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(sizes, [3, 3, 3, 2, 2], "batch sizes per request");
    // A lone request waits only the quiet period, not the 20 s cap.
    let t = Instant::now();
    let (status, _, h) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": "alone" }));
    assert_eq!((status, h["x-batch-size"].to_str().unwrap()), (200, "1"));
    assert!(t.elapsed() < Duration::from_secs(15), "a lone request waited for the cap: {:?}", t.elapsed());
}

#[test]
fn sigterm_answers_every_accepted_request_then_exits_zero() {
    let repo = repo_with(&[]);
    let mut s = Server::start(repo.path(), &["--device", "cpu", "--max-batch-size", "4"]);
    // 12 requests of 8 sentences each: several batches' work in flight.
    let handles: Vec<_> = (0..12)
        .map(|i| {
            let url = s.at("/v1/embeddings");
            std::thread::spawn(move || {
                let texts: Vec<String> =
                    (0..8).map(|k| format!("request {i} sentence {k} with a few more words in it")).collect();
                client()
                    .post(url)
                    .json(&json!({ "model": "minilm", "input": texts }))
                    .send()
                    .map(|r| r.status().as_u16())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(150));
    let status = s.terminate();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(status.success(), "exit status {status:?}");
    // Requests the server accepted are answered 200; none is dropped mid-way.
    for code in results.iter().flatten() {
        assert_eq!(*code, 200, "{results:?}");
    }
    let answered = results.iter().filter(|r| r.is_ok()).count();
    assert!(answered >= 1, "no request was in flight at SIGTERM: {results:?}");
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let repo = repo_with(&[]);
    let s = Server::start(
        repo.path(),
        &["--device", "cpu", "--max-batch-size", "1", "--queue-capacity", "2", "--cache-mb", "0"],
    );
    let handles: Vec<_> = (0..24)
        .map(|i| {
            let url = s.at("/v1/embeddings");
            std::thread::spawn(move || {
                let texts: Vec<String> = (0..4).map(|k| format!("flood {i} {k}")).collect();
                let r = client().post(url).json(&json!({ "model": "minilm", "input": texts })).send().unwrap();
                (r.status().as_u16(), r.headers().get("retry-after").is_some())
            })
        })
        .collect();
    let results: Vec<(u16, bool)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results.iter().any(|r| r.0 == 429), "no 429 from a queue of 2: {results:?}");
    assert!(results.iter().all(|r| r.0 == 200 || (r.0 == 429 && r.1)), "{results:?}");
}

/// The kernels compiled on the server's device, from `/metrics`.
fn kernels_compiled(s: &Server) -> u64 {
    let (_, metrics) = s.get("/metrics");
    let line = metrics.lines().find(|l| l.starts_with("tessera_device_kernels_compiled "));
    let value = line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<f64>().ok());
    value.unwrap_or_else(|| panic!("/metrics lacks tessera_device_kernels_compiled:\n{metrics}")) as u64
}

#[test]
fn a_warm_server_compiles_no_kernel_for_new_sentence_lengths_or_batches() {
    // On lavapipe a kernel compiles in up to seconds, which a request would wait for.
    // The default warm-up runs every length up to 32 word pieces alone and in pairs:
    // sentences of other lengths and batches of other sizes then reuse its kernels.
    let repo = repo_with(&[]);
    let s = Server::start(repo.path(), &["--device", "gpu"]);
    let warm = kernels_compiled(&s);
    assert!(warm > 0, "the warm-up compiled no kernel");
    let words = ["apple", "river", "stone", "cloud", "horse", "bread", "light", "music", "paper", "green"];
    let sentence = |n: usize, salt: usize| -> String {
        (0..n).map(|i| words[(i * 7 + salt) % words.len()]).collect::<Vec<_>>().join(" ")
    };
    let mut salt = 0;
    let mut batch = |lengths: &[usize]| -> Value {
        salt += 1;
        json!(lengths.iter().map(|&n| sentence(n, salt)).collect::<Vec<_>>())
    };
    let cases: Vec<Value> = vec![
        batch(&[1]),
        batch(&[5]),
        batch(&[9]),
        batch(&[14]),
        batch(&[16]),
        batch(&[21]),
        batch(&[26]),
        batch(&[40]),
        batch(&[90]),
        batch(&[7, 3]),
        batch(&[17, 11]),
        batch(&[24, 2, 9]),
        batch(&[8, 8, 8, 8]),
        batch(&[13, 4, 4, 4, 4]),
        batch(&[30; 8]),
        batch(&[60, 10, 10]),
    ];
    for input in cases {
        let (st, v, _) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": input }));
        assert_eq!(st, 200, "{v}");
        assert_eq!(kernels_compiled(&s), warm, "{input} compiled a kernel the warm-up did not");
    }
    // 32 clients at once, one sentence each: the batcher forms batches of its own.
    let url = s.at("/v1/embeddings");
    let clients: Vec<_> = (0..32)
        .map(|i| {
            let (url, text) = (url.clone(), format!("client {i} asks about {}", sentence(i % 12 + 1, i)));
            std::thread::spawn(move || {
                client().post(url).json(&json!({ "model": "minilm", "input": text })).send().unwrap().status()
            })
        })
        .collect();
    for c in clients {
        assert_eq!(c.join().unwrap().as_u16(), 200);
    }
    assert_eq!(kernels_compiled(&s), warm, "concurrent clients' batches compiled a kernel the warm-up did not");
}

#[test]
fn a_warm_onnx_text_model_compiles_no_kernel_for_long_sentences() {
    // MiniLM as ONNX composes its attention of products, whose kernels differ by classes
    // of sequence length past 32 pieces too (tile heights, column blocks, length mod 8,
    // padding masks): the warm-up runs the last lengths of each class. The short
    // lengths are warmed only to 8 here, and sequences to 160 pieces, to keep the
    // warm-up short; every request below has 37 pieces or more.
    let repo = repo_with(&[]);
    add_minilm_onnx(repo.path());
    let s = Server::start(repo.path(), &["--device", "gpu", "--warm-lengths", "8", "--max-batch-tokens", "160"]);
    let warm = kernels_compiled(&s);
    let words = ["apple", "river", "stone", "cloud", "horse", "bread", "light", "music", "paper", "green"];
    // n word pieces in all: [CLS], n - 2 words of one piece each, [SEP].
    let sentence = |n: usize, salt: usize| -> String {
        (0..n - 2).map(|i| words[(i * 7 + salt) % words.len()]).collect::<Vec<_>>().join(" ")
    };
    let cases: &[&[usize]] = &[
        &[37],
        &[38],
        &[41],
        &[44],
        &[46],
        &[51],
        &[52],
        &[60],
        &[63],
        &[66],
        &[68],
        &[75],
        &[100],
        &[129],
        &[132],
        &[150],
        &[158],
        &[44, 40],
        &[52, 45],
        &[63, 61],
        &[68, 66],
        &[75, 70],
    ];
    for (salt, lengths) in cases.iter().enumerate() {
        let input: Vec<String> = lengths.iter().map(|&n| sentence(n, salt)).collect();
        let (st, v, _) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": input }));
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["usage"]["prompt_tokens"], lengths.iter().sum::<usize>(), "{lengths:?}: not one piece a word");
        assert_eq!(kernels_compiled(&s), warm, "{lengths:?} word pieces compiled a kernel the warm-up did not");
    }
}

#[test]
fn a_lost_device_answers_503_then_recovers() {
    let repo = repo_with(&[]);
    // (One input to warm up: the kernels of every batch size are not this test's concern.)
    let s = Server::start(repo.path(), &["--device", "gpu", "--test-hooks", "--quick-warm-up"]);
    let (st, _, _) = s.post("/v1/models/mnist/predict", &json!({ "inputs": [vec![0.1f32; 784]] }));
    assert_eq!(st, 200);
    let (st, _, _) = s.post("/v1/admin/lose-device", &json!({}));
    assert_eq!(st, 200);
    let (st, v, h) = s.post("/v1/models/mnist/predict", &json!({ "inputs": [vec![0.2f32; 784]] }));
    assert_eq!(st, 503, "{v}");
    assert!(
        h.contains_key("retry-after") && v["error"]["message"].as_str().unwrap().contains("device was lost"),
        "{v}"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (st, v, _) = s.post("/v1/models/mnist/predict", &json!({ "inputs": [vec![0.3f32; 784]] }));
        if st == 200 {
            break;
        }
        assert!(st == 503 && Instant::now() < deadline, "{st}: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, metrics) = s.get("/metrics");
    assert!(metrics.contains("tessera_device_recoveries_total"), "{metrics}");
}

#[test]
fn batch_prediction_resumes_without_redoing_or_duplicating_lines() {
    let repo = repo_with(&[]);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let lines: Vec<String> = (0..40)
        .map(|i| {
            if i == 13 {
                "not json".to_string()
            } else {
                json!({ "input": format!("batch line {i} about a topic") }).to_string()
            }
        })
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let run = |out: &Path| {
        let st = Command::new(env!("CARGO_BIN_EXE_tessera-serve"))
            .args(["batch", "--quiet", "--model", "minilm", "--device", "cpu", "--repo"])
            .arg(repo.path())
            .arg("--input")
            .arg(&input)
            .arg("--output")
            .arg(out)
            .status()
            .unwrap();
        assert!(st.success());
    };
    let full = dir.path().join("full.jsonl");
    run(&full);
    let text = std::fs::read_to_string(&full).unwrap();
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 40);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["line"], i);
    }
    assert!(rows[13]["error"].as_str().unwrap().contains("not JSON"));
    assert_eq!(rows[0]["embedding"].as_array().unwrap().len(), 384);
    // An interrupted run: 17 complete lines and a torn one.
    let partial = dir.path().join("partial.jsonl");
    let mut cut: String = text.lines().take(17).map(|l| format!("{l}\n")).collect();
    cut.push_str(&text.lines().nth(17).unwrap()[..50]);
    std::fs::write(&partial, cut).unwrap();
    run(&partial);
    let resumed = std::fs::read_to_string(&partial).unwrap();
    let again: Vec<Value> = resumed.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(again.len(), 40, "lines redone or duplicated");
    for (a, b) in again.iter().zip(&rows) {
        assert_eq!(a["line"], b["line"]);
        if let (Some(x), Some(y)) = (a["embedding"].as_array(), b["embedding"].as_array()) {
            let d = x.iter().zip(y).map(|(p, q)| (p.as_f64().unwrap() - q.as_f64().unwrap()).abs()).fold(0.0, f64::max);
            assert!(d < 1e-5, "line {}: {d}", a["line"]);
        }
    }
}

#[test]
fn loadgen_reports_batching_and_cache_phases() {
    let repo = repo_with(&[]);
    let out = Command::new(env!("CARGO_BIN_EXE_tessera-serve"))
        .args(["loadgen", "--json", "--clients", "8", "--seconds", "2", "--device", "cpu", "--repo"])
        .arg(repo.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let phase = |name: &str| {
        rows.iter()
            .find(|r| r["phase"].as_str().is_some_and(|p| p.starts_with(name)))
            .unwrap_or_else(|| panic!("{text}"))
    };
    let on = phase("batching on");
    let warm = phase("warm cache");
    let single = phase("warm cache, 1 client");
    let off = phase("max_batch_size=1");
    for r in [on, warm, single, off] {
        assert!(r["ok"].as_u64().unwrap() > 0 && r["errors"] == 0, "{r}");
    }
    assert!(warm["cache_hit_rate"].as_f64().unwrap() > 0.99, "{warm}");
    assert!(single["cache_hit_rate"].as_f64().unwrap() > 0.99, "{single}");
    assert!(on["mean_batch_size"].as_f64().unwrap() > 1.0, "{on}");
    assert!((off["mean_batch_size"].as_f64().unwrap() - 1.0).abs() < 1e-9, "{off}");
    // Batching on and off alternate in rounds, each round with sentences of its own, so
    // neither ever hits the cache.
    for r in [on, off] {
        assert_eq!(r["cache_hit_rate"].as_f64(), Some(0.0), "{r}");
    }
    let speedup = rows.iter().find(|r| r["batching_speedup"].is_number()).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(speedup["per_round"].as_array().map(Vec::len), Some(2), "{speedup}");
    let hit = rows.iter().find(|r| r["cache_hit_p50_ms"].is_object()).unwrap_or_else(|| panic!("{text}"));
    for k in ["one_client", "all_clients"] {
        assert!(hit["cache_hit_p50_ms"][k].as_f64().is_some_and(|ms| ms > 0.0), "{hit}");
    }
}

fn sha256_hex(path: &Path) -> String {
    use sha2::Digest;
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// ONNX versions (kind `onnx`) serve the same answers as the native ones: MiniLM from
/// `scripts/make_minilm_onnx.sh`, and the MNIST classifier exported by Tessera itself.
/// Also `dimensions` and unloading a version.
/// Add MiniLM as ONNX (`scripts/make_minilm_onnx.sh`) to `repo` as minilm/2.
fn add_minilm_onnx(repo: &Path) {
    let minilm_onnx = data_dir().join("minilm/model.onnx");
    assert!(minilm_onnx.exists(), "{} is missing: run `bash scripts/make_minilm_onnx.sh`", minilm_onnx.display());
    let tok = data_dir().join("minilm/tokenizer.json");
    let v2 = repo.join("minilm/2");
    std::fs::create_dir_all(&v2).unwrap();
    let manifest = json!({
        "kind": "onnx", "task": "embedding", "dtype": "f32",
        "files": {
            "model.onnx": { "path": minilm_onnx, "sha256": sha256_hex(&minilm_onnx) },
            "tokenizer.json": { "path": tok, "sha256": sha256_hex(&tok) },
        }
    });
    std::fs::write(v2.join("manifest.json"), manifest.to_string()).unwrap();
}

#[test]
fn onnx_versions_answer_like_the_native_ones() {
    let repo = repo_with(&[]);
    add_minilm_onnx(repo.path());
    // The classifier of mnist/1, exported to ONNX by tessera::onnx::export.
    let dev = tessera::Device::cpu();
    let mut model = tessera::models::mnist::build("mlp", 0, &dev).unwrap();
    let mut opt = tessera::optim::Adam::new(1e-3);
    tessera::io::checkpoint::load(repo.path().join("mnist/1/model.ckpt"), &mut model, &mut opt, &dev).unwrap();
    let m2 = repo.path().join("mnist/2");
    std::fs::create_dir_all(&m2).unwrap();
    let example = tessera::Tensor::zeros([1, 784], tessera::DType::F32, &dev);
    tessera::onnx::export(&model, &[example], m2.join("model.onnx")).expect("export");
    let manifest = json!({
        "kind": "onnx", "task": "classification", "dtype": "f32",
        "files": { "model.onnx": { "sha256": sha256_hex(&m2.join("model.onnx")) } }
    });
    std::fs::write(m2.join("manifest.json"), manifest.to_string()).unwrap();

    // The newest version of each model starts live: both are ONNX.
    let s = Server::start(repo.path(), &["--device", "cpu"]);
    let texts = ["A man is eating food.", "Rust compiles WGSL kernels at run time."];
    let (st, got, h) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": texts }));
    assert_eq!((st, h["x-tessera-version"].to_str().unwrap()), (200, "2"), "{got}");
    let emb = tessera::models::bert::SentenceEmbedder::load(data_dir().join("minilm"), &dev).expect("embedder");
    let want = emb.embed_blocking(&texts).expect("embed");
    for (i, w) in want.iter().enumerate() {
        let err = embedding(&got, i).iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 1e-4, "text {i}: the ONNX version is {err} from the native embedder");
    }
    // `dimensions` keeps the first d values, renormalised (OpenAI's Matryoshka option).
    let (st, short, _) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": texts[0], "dimensions": 64 }));
    assert_eq!(st, 200, "{short}");
    let short = embedding(&short, 0);
    let full = embedding(&got, 0);
    let norm = full[..64].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert_eq!(short.len(), 64);
    for (a, b) in short.iter().zip(&full[..64]) {
        assert!((a - b / norm).abs() < 1e-6);
    }
    let (st, v, _) = s.post("/v1/embeddings", &json!({ "model": "minilm", "input": "x", "dimensions": 1000 }));
    assert!(st == 400 && v["error"]["message"].as_str().unwrap().contains("more than"), "{st} {v}");

    let data = tessera::io::mnist::Mnist::load(&root().join("data/mnist.bin")).expect("mnist");
    let idx: Vec<usize> = (8100..8110).collect();
    let px = data.images_f32(&idx);
    let inputs: Vec<Vec<f32>> = px.chunks(784).map(|c| c.to_vec()).collect();
    let (st, pred, h) = s.post("/v1/models/mnist/predict", &json!({ "inputs": inputs }));
    assert_eq!((st, h["x-tessera-version"].to_str().unwrap()), (200, "2"), "{pred}");
    use tessera::nn::Layer;
    let x = tessera::Tensor::from_slice(&tessera::models::mnist::standardize(&px), [10, 784], &dev);
    let want: Vec<Vec<f32>> =
        model.forward(&x).softmax(-1).to_vec_blocking::<f32>().unwrap().chunks(10).map(|c| c.to_vec()).collect();
    for (i, w) in want.iter().enumerate() {
        let p: Vec<f32> = pred["predictions"][i]["probabilities"]
            .as_array()
            .unwrap_or_else(|| panic!("{pred}"))
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let err = p.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err < 1e-5, "digit {i}: ONNX probabilities {err} from the native model");
    }
    // Unloading the live version is refused; loading and unloading another works.
    let (st, v, _) = s.post("/v1/models/mnist/versions/2/unload", &json!({}));
    assert_eq!(st, 409, "{v}");
    let (st, v, _) = s.post("/v1/models/mnist/versions/1/load", &json!({}));
    assert_eq!(st, 200, "{v}");
    let (st, v, _) = s.post("/v1/models/mnist/versions/1/unload", &json!({}));
    assert_eq!(st, 200, "{v}");
    let (_, models) = s.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    let mnist = models["data"].as_array().unwrap().iter().find(|m| m["id"] == "mnist").unwrap();
    let state =
        |v: &str| mnist["versions"].as_array().unwrap().iter().find(|x| x["version"] == v).unwrap()["state"].clone();
    assert_eq!((state("1"), state("2")), (json!("unloaded"), json!("ready")), "{mnist}");
}

/// A `two-tower` version (`models::recsys::TwoTower` trained briefly here, over the
/// cached MovieLens-100K file) answers top-k requests like the model in process, never
/// recommends what the user rated, and refuses bad requests with a 400.
#[test]
fn a_two_tower_version_recommends_unseen_items() {
    let ml = data_dir().join("ml-100k.bin");
    assert!(ml.exists(), "{} is missing: run `bash scripts/fetch_movielens.sh`", ml.display());
    let data = tessera::io::movielens::MovieLens::load(&ml).expect("movielens");
    let dev = tessera::Device::cpu();
    let mut model = tessera::models::recsys::TwoTower::new(&data, 16, 3, &dev);
    let mut opt = tessera::optim::SparseAdam::new(3e-3);
    use tessera::optim::Optimizer;
    for chunk in (0..data.len()).collect::<Vec<_>>().chunks(2048).take(20) {
        let users: Vec<u32> = chunk.iter().map(|&k| data.users[k]).collect();
        let items: Vec<u32> = chunk.iter().map(|&k| data.items[k]).collect();
        let loss = model.loss(&data, &users, &items, None).expect("loss");
        opt.step(&mut model, &loss).expect("step");
    }
    let repo = repo_with(&[]);
    let v1 = repo.path().join("recs/1");
    std::fs::create_dir_all(&v1).unwrap();
    tessera::io::checkpoint::save(v1.join("model.ckpt"), &mut model, &mut opt, &Default::default()).expect("save");
    let manifest = json!({
        "kind": "two-tower", "dim": 16, "dtype": "f32",
        "files": {
            "model.ckpt": { "sha256": sha256_hex(&v1.join("model.ckpt")) },
            "ml-100k.bin": { "path": ml, "sha256": sha256_hex(&ml) },
        }
    });
    std::fs::write(v1.join("manifest.json"), manifest.to_string()).unwrap();

    let s = Server::start(repo.path(), &["--device", "cpu"]);
    let (st, got, _) = s.post("/v1/models/recs/predict", &json!({ "inputs": [{ "user": 0, "k": 10 }, { "user": 5 }] }));
    assert_eq!(st, 200, "{got}");
    let all: Vec<usize> = (0..data.len()).collect();
    let seen = tessera::models::recsys::items_by_user(&data, &all);
    let table = model.item_table(&data).unwrap();
    for (i, user) in [0u32, 5].into_iter().enumerate() {
        let items: Vec<u32> = got["predictions"][i]["items"]
            .as_array()
            .unwrap_or_else(|| panic!("{got}"))
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let scores: Vec<f64> =
            got["predictions"][i]["scores"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(items.len(), 10, "{got}");
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "scores not in order: {scores:?}");
        assert!(
            items.iter().all(|i| seen[user as usize].binary_search(i).is_err()),
            "user {user} rated one of {items:?}"
        );
        let want = model.recommend(&data, &table, user, &seen[user as usize], 10).unwrap();
        assert_eq!(items, want, "user {user}: the server and the model in process disagree");
    }
    for (body, needle) in [
        (json!({ "inputs": [{ "user": 5000 }] }), "user 5000"),
        (json!({ "inputs": [{ "user": 1, "k": 0 }] }), "k = 0"),
        (json!({ "inputs": [{ "user": 1, "k": 65 }] }), "k = 65"),
        (json!({ "inputs": [{ "user": -1 }] }), "non-negative integer"),
        (json!({ "inputs": [{ "user": "a" }] }), "non-negative integer"),
        (json!({ "inputs": [vec![0.0; 784]] }), "does not take"),
    ] {
        let (st, v, _) = s.post("/v1/models/recs/predict", &body);
        let msg = v["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(st == 400 && msg.contains(needle), "{body}: {st} {v}");
    }
    // The classifier refuses a recommendation request the same way.
    let (st, v, _) = s.post("/v1/models/mnist/predict", &json!({ "inputs": [{ "user": 1 }] }));
    assert_eq!(st, 400, "{v}");
}
