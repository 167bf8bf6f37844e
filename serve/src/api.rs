//! The HTTP API (axum): OpenAI-compatible embeddings, classifier predictions, model and
//! version control, health, and Prometheus metrics. Every error is a 4xx or 5xx with an
//! OpenAI-shaped body, `{"error": {"message", "type", "code"}}`.

use crate::batcher::Failure;
use crate::model::{Input, Output, PIXELS};
use crate::state::{agreement, argmax, Registry, Route, RouteError};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine;
use serde::Serialize;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Request limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub body_bytes: usize,
    pub body_timeout: Duration,
    pub request_timeout: Duration,
    pub max_inputs: usize,
    pub max_text_bytes: usize,
}

#[derive(Clone)]
pub struct App {
    pub reg: Arc<Registry>,
    pub limits: Limits,
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
    pub test_hooks: bool,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            kind,
            message: message.into(),
            retry_after: None,
        }
    }
    fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalid_request_error", message)
    }
    fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(404, "not_found_error", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "message": self.message, "type": self.kind, "code": self.status.as_u16() } });
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

pub fn router(app: App) -> Router {
    Router::new()
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(list_models))
        .route("/v1/models/{name}/predict", post(predict))
        .route("/v1/models/{name}/versions/{version}/load", post(load_version))
        .route("/v1/models/{name}/versions/{version}/unload", post(unload_version))
        .route("/v1/models/{name}/promote", post(promote))
        .route("/v1/models/{name}/rollback", post(rollback))
        .route("/v1/admin/lose-device", post(lose_device))
        .route("/health/live", get(|| async { axum::Json(json!({ "status": "live" })) }))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .fallback(|| async {
            ApiError::not_found("no such endpoint (see README: /v1/embeddings, /v1/models, /health/ready, /metrics)")
        })
        .with_state(app)
}

/// The body as JSON: bounded in size and in how long the client may take to send it.
async fn json_body(app: &App, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    let limit = app.limits.body_bytes;
    if let Some(len) =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(ApiError::new(
                413,
                "invalid_request_error",
                format!("the body is {len} bytes; the limit is {limit}"),
            ));
        }
    }
    let bytes = tokio::time::timeout(app.limits.body_timeout, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| {
            ApiError::new(
                408,
                "invalid_request_error",
                format!("the body did not arrive within {} s", app.limits.body_timeout.as_secs()),
            )
        })?
        .map_err(|e| {
            if format!("{e:?}").contains("LengthLimit") || e.to_string().contains("length limit") {
                ApiError::new(413, "invalid_request_error", format!("the body is over the limit of {limit} bytes"))
            } else {
                ApiError::bad(format!("could not read the body: {e}"))
            }
        })?;
    let text = std::str::from_utf8(&bytes).map_err(|e| ApiError::bad(format!("the body is not UTF-8 ({e})")))?;
    if text.trim().is_empty() {
        return Err(ApiError::bad("the body is empty: send a JSON object"));
    }
    let v: Value = serde_json::from_str(text).map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad("the body must be a JSON object"));
    }
    Ok(v)
}

/// What an inference came to.
struct Inferred {
    outputs: Vec<Arc<Output>>,
    version: String,
    hits: usize,
    batch_size: usize,
}

fn failure(f: &Failure) -> ApiError {
    match f {
        Failure::BadInput(m) => ApiError::bad(m.clone()),
        Failure::DeviceLost(m) => {
            let mut e = ApiError::new(
                503,
                "unavailable_error",
                format!("the device was lost while running this request ({m}); it is being recovered, retry"),
            );
            e.retry_after = Some(1);
            e
        }
        Failure::Expired => ApiError::new(504, "timeout_error", "the request timed out waiting for the model"),
        Failure::Internal(m) => ApiError::new(500, "server_error", m.clone()),
    }
}

/// Send every input through the cache and the batcher of the routed version.
async fn run_items(
    app: &App,
    route: &Route,
    name: &str,
    inputs: &[Input],
    deadline: Instant,
) -> Result<(Vec<Arc<Output>>, usize, usize, Duration, Duration), ApiError> {
    let mut slots: Vec<Option<Arc<Output>>> = vec![None; inputs.len()];
    let mut waits = Vec::new();
    let mut hits = 0;
    for (i, input) in inputs.iter().enumerate() {
        let key = Registry::cache_key(name, &route.version, &route.dtype, input);
        if let Some(o) = app.reg.cache.get(&key) {
            slots[i] = Some(o);
            hits += 1;
            continue;
        }
        match route.batcher.submit(input.clone(), deadline) {
            Ok(rx) => waits.push((i, key, rx)),
            Err(true) => {
                let mut e = ApiError::new(
                    429,
                    "rate_limit_error",
                    format!("the queue of {name} version {} is full: retry shortly", route.version),
                );
                e.retry_after = Some(1);
                return Err(e);
            }
            Err(false) => {
                let mut e = ApiError::new(
                    503,
                    "unavailable_error",
                    format!("{name} version {} is shutting down", route.version),
                );
                e.retry_after = Some(1);
                return Err(e);
            }
        }
    }
    let (mut batch, mut queue, mut compute) = (0usize, Duration::ZERO, Duration::ZERO);
    for (i, key, rx) in waits {
        let left = deadline.saturating_duration_since(Instant::now());
        let done = match tokio::time::timeout(left, rx).await {
            Err(_) => {
                return Err(ApiError::new(
                    504,
                    "timeout_error",
                    format!("no answer within {} s", app.limits.request_timeout.as_secs_f64()),
                ))
            }
            Ok(Err(_)) => return Err(ApiError::new(503, "unavailable_error", "the model's worker stopped")),
            Ok(Ok(r)) => r.map_err(|f| failure(&f))?,
        };
        batch = batch.max(done.batch_size);
        queue = queue.max(done.queue);
        compute = compute.max(done.compute);
        let o = Arc::new(done.output);
        app.reg.cache.insert(key, o.clone());
        slots[i] = Some(o);
    }
    metrics::counter!("tessera_cache_hits_total", "model" => name.to_string()).increment(hits as u64);
    metrics::counter!("tessera_cache_misses_total", "model" => name.to_string())
        .increment((inputs.len() - hits) as u64);
    let outs = slots
        .into_iter()
        .map(|s| s.ok_or_else(|| ApiError::new(500, "server_error", "an output went missing")))
        .collect::<Result<_, _>>()?;
    Ok((outs, hits, batch, queue, compute))
}

async fn infer(app: &App, name: &str, inputs: Vec<Input>) -> Result<Inferred, ApiError> {
    let t0 = Instant::now();
    let deadline = t0 + app.limits.request_timeout;
    let route = app.reg.route(name).map_err(|e| match e {
        RouteError::UnknownModel => ApiError::not_found(format!("no model {name:?}: GET /v1/models lists them")),
        RouteError::NotReady => {
            let mut e =
                ApiError::new(503, "unavailable_error", format!("model {name:?} has no live version ready yet"));
            e.retry_after = Some(1);
            e
        }
    })?;
    let shadow = route.shadow.clone();
    let (main, live) = match &shadow {
        Some((lv, lb)) => {
            let live_route =
                Route { version: lv.clone(), batcher: lb.clone(), shadow: None, canary: false, dtype: String::new() };
            let lt = Instant::now();
            let (a, b) = tokio::join!(run_items(app, &route, name, &inputs, deadline), async {
                let r = run_items(app, &live_route, name, &inputs, deadline).await;
                (r, lt.elapsed())
            });
            (a, Some(b))
        }
        None => (run_items(app, &route, name, &inputs, deadline).await, None),
    };
    let total = t0.elapsed();
    let status = match &main {
        Ok(_) => "200".to_string(),
        Err(e) => e.status.as_u16().to_string(),
    };
    metrics::counter!("tessera_requests_total", "model" => name.to_string(), "version" => route.version.clone(), "status" => status).increment(1);
    if route.canary {
        let ok = main.as_ref().map(|_| true).unwrap_or_else(|e| e.status.as_u16() < 500);
        let (agree, live_latency) = match (&main, &live) {
            (Ok(m), Some((Ok(l), lt))) => {
                let a: f64 = m.0.iter().zip(&l.0).map(|(x, y)| agreement(x, y)).sum::<f64>() / m.0.len().max(1) as f64;
                (Some(a), Some(*lt))
            }
            _ => (None, None),
        };
        app.reg.canary_report(name, &route.version, ok, total, live_latency, agree);
    }
    let (outputs, hits, batch_size, queue, compute) = main?;
    let (m, v) = (name.to_string(), route.version.clone());
    metrics::histogram!("tessera_request_queue_seconds", "model" => m.clone(), "version" => v.clone())
        .record(queue.as_secs_f64());
    metrics::histogram!("tessera_request_compute_seconds", "model" => m.clone(), "version" => v.clone())
        .record(compute.as_secs_f64());
    metrics::histogram!("tessera_request_seconds", "model" => m, "version" => v).record(total.as_secs_f64());
    Ok(Inferred { outputs, version: route.version, hits, batch_size })
}

fn headers(r: &mut Response, inf: &Inferred, n: usize) {
    let h = r.headers_mut();
    let cache = if inf.hits == n {
        "hit"
    } else if inf.hits == 0 {
        "miss"
    } else {
        "partial"
    };
    if let Ok(v) = HeaderValue::from_str(&inf.version) {
        h.insert("x-tessera-version", v);
    }
    h.insert("x-cache", HeaderValue::from_static(cache));
    h.insert("x-batch-size", HeaderValue::from(inf.batch_size));
}

async fn embeddings(State(app): State<App>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let v = json_body(&app, &parts.headers, body).await?;
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad("'model' is required: the name of an embedding model (GET /v1/models)"))?;
    let texts: Vec<String> = match v.get("input") {
        None => return Err(ApiError::bad("'input' is required: a string or an array of strings")),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.is_empty() {
                return Err(ApiError::bad("'input' is an empty array"));
            }
            a.iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::String(s) => Ok(s.clone()),
                    Value::Number(_) | Value::Array(_) => {
                        Err(ApiError::bad("token arrays are not supported: send the text"))
                    }
                    other => Err(ApiError::bad(format!("'input'[{i}] is {}, not a string", kind(other)))),
                })
                .collect::<Result<_, _>>()?
        }
        Some(other) => {
            return Err(ApiError::bad(format!("'input' is {}: send a string or an array of strings", kind(other))))
        }
    };
    if texts.len() > app.limits.max_inputs {
        return Err(ApiError::bad(format!("{} inputs: at most {} per request", texts.len(), app.limits.max_inputs)));
    }
    for (i, t) in texts.iter().enumerate() {
        if t.trim().is_empty() {
            return Err(ApiError::bad(format!("'input'[{i}] is empty")));
        }
        if t.len() > app.limits.max_text_bytes {
            return Err(ApiError::bad(format!(
                "'input'[{i}] is {} bytes; at most {}",
                t.len(),
                app.limits.max_text_bytes
            )));
        }
    }
    let base64 = match v.get("encoding_format").and_then(Value::as_str) {
        None | Some("float") => false,
        Some("base64") => true,
        Some(f) => return Err(ApiError::bad(format!("encoding_format {f:?}: use \"float\" or \"base64\""))),
    };
    let dims = match v.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(d) => Some(
            d.as_u64().filter(|&d| d > 0).ok_or_else(|| ApiError::bad("'dimensions' must be a positive integer"))?
                as usize,
        ),
    };
    check_task(&app, model, true)?;
    let n = texts.len();
    let inf = infer(&app, model, texts.into_iter().map(Input::Text).collect()).await?;
    let mut data = Vec::with_capacity(n);
    let mut tokens = 0;
    for (i, o) in inf.outputs.iter().enumerate() {
        let Output::Embedding(e, text, t) = o.as_ref() else {
            return Err(ApiError::new(500, "server_error", "not an embedding"));
        };
        tokens += t;
        if dims.is_none() && !base64 {
            if let Some(raw) = text.get(e) {
                data.push(EmbeddingItem { object: "embedding", index: i, embedding: EmbeddingData::Text(raw) });
                continue;
            }
        }
        let e: Cow<[f32]> = match dims {
            Some(d) if d > e.len() => {
                return Err(ApiError::bad(format!("'dimensions' {d} is more than the model's {}", e.len())))
            }
            Some(d) => {
                let norm = e[..d].iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                Cow::Owned(e[..d].iter().map(|x| x / norm).collect())
            }
            None => Cow::Borrowed(e),
        };
        let embedding = if base64 {
            EmbeddingData::Base64(
                base64::engine::general_purpose::STANDARD
                    .encode(e.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
            )
        } else {
            EmbeddingData::Float(e)
        };
        data.push(EmbeddingItem { object: "embedding", index: i, embedding });
    }
    let usage = Usage { prompt_tokens: tokens, total_tokens: tokens };
    let body = EmbeddingList { object: "list", data, model, usage };
    let mut r = axum::Json(body).into_response();
    headers(&mut r, &inf, n);
    Ok(r)
}

/// `/v1/embeddings`' answer, serialised straight from the outputs: each float as the
/// shortest text that reads back to the same f32 (a `Value` would widen it to f64 and
/// print 17 digits, at twice the bytes and about a third of a cache hit's time).
#[derive(Serialize)]
struct EmbeddingList<'a> {
    object: &'static str,
    data: Vec<EmbeddingItem<'a>>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct EmbeddingItem<'a> {
    object: &'static str,
    index: usize,
    embedding: EmbeddingData<'a>,
}

/// `encoding_format` float (numbers) or base64 (little-endian f32 bytes).
#[derive(Serialize)]
#[serde(untagged)]
enum EmbeddingData<'a> {
    Float(Cow<'a, [f32]>),
    Base64(String),
    /// The floats' JSON text, written once per cached embedding.
    Text(&'a serde_json::value::RawValue),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The model must exist and do what the endpoint does.
fn check_task(app: &App, name: &str, embeds: bool) -> Result<(), ApiError> {
    let models = app.reg.models.read().unwrap_or_else(|e| e.into_inner());
    let m =
        models.get(name).ok_or_else(|| ApiError::not_found(format!("no model {name:?}: GET /v1/models lists them")))?;
    if m.embeds != embeds {
        let what = if m.embeds {
            "an embedding model: POST /v1/embeddings"
        } else {
            "a classifier: POST /v1/models/{name}/predict"
        };
        return Err(ApiError::bad(format!("{name:?} is {what}")));
    }
    Ok(())
}

/// Flatten nested arrays of numbers.
fn numbers(v: &Value, out: &mut Vec<f32>) -> Result<(), String> {
    match v {
        Value::Number(n) => {
            let x = n.as_f64().ok_or("a number out of range")? as f32;
            if !x.is_finite() {
                return Err("a number that is not finite".into());
            }
            out.push(x);
            Ok(())
        }
        Value::Array(a) => a.iter().try_for_each(|x| numbers(x, out)),
        other => Err(format!("{} where a number belongs", kind(other))),
    }
}

async fn predict(State(app): State<App>, Path(name): Path<String>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    check_task(&app, &name, false)?;
    let v = json_body(&app, &parts.headers, body).await?;
    let list = v
        .get("inputs")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("'inputs' is required: an array of images, each 784 numbers (28x28) in [0, 1]"))?;
    if list.is_empty() {
        return Err(ApiError::bad("'inputs' is an empty array"));
    }
    if list.len() > app.limits.max_inputs {
        return Err(ApiError::bad(format!("{} inputs: at most {} per request", list.len(), app.limits.max_inputs)));
    }
    let mut inputs = Vec::with_capacity(list.len());
    for (i, x) in list.iter().enumerate() {
        // A recommender's request: {"user": id, "k": n} (k defaults to 10).
        if let Some(o) = x.as_object().filter(|o| o.contains_key("user")) {
            let int = |key: &str, default: Option<u64>| -> Result<u64, ApiError> {
                match o.get(key) {
                    None => default.ok_or_else(|| ApiError::bad(format!("'inputs'[{i}]: no '{key}'"))),
                    Some(v) => v.as_u64().ok_or_else(|| {
                        ApiError::bad(format!("'inputs'[{i}].{key}: expected a non-negative integer, got {v}"))
                    }),
                }
            };
            let user = u32::try_from(int("user", None)?)
                .map_err(|_| ApiError::bad(format!("'inputs'[{i}].user is out of range")))?;
            let k = int("k", Some(10))?.min(u64::from(u32::MAX)) as usize;
            inputs.push(Input::User { user, k });
            continue;
        }
        let mut px = Vec::with_capacity(PIXELS);
        numbers(x, &mut px).map_err(|e| ApiError::bad(format!("'inputs'[{i}]: {e}")))?;
        if px.len() != PIXELS {
            return Err(ApiError::bad(format!(
                "'inputs'[{i}] has {} values; the model takes {PIXELS} (a 28x28 image)",
                px.len()
            )));
        }
        inputs.push(Input::Pixels(px));
    }
    let n = inputs.len();
    let inf = infer(&app, &name, inputs).await?;
    let preds: Vec<Value> = inf
        .outputs
        .iter()
        .map(|o| match o.as_ref() {
            Output::Classes(p) => json!({ "label": argmax(p), "probabilities": p }),
            Output::Items { items, scores } => json!({ "items": items, "scores": scores }),
            Output::Embedding(..) => json!(null),
        })
        .collect();
    let mut r = axum::Json(json!({ "model": name, "version": inf.version, "predictions": preds })).into_response();
    headers(&mut r, &inf, n);
    Ok(r)
}

async fn list_models(State(app): State<App>) -> Response {
    axum::Json(app.reg.describe()).into_response()
}

fn control(r: Result<String, (u16, String)>) -> Result<Response, ApiError> {
    match r {
        Ok(m) => Ok(axum::Json(json!({ "status": "ok", "message": m })).into_response()),
        Err((404, m)) => Err(ApiError::not_found(m)),
        Err((409, m)) => Err(ApiError::new(409, "conflict_error", m)),
        Err((s, m)) => Err(ApiError::new(s, "invalid_request_error", m)),
    }
}

fn known(app: &App, name: &str, version: &str) -> Result<(), ApiError> {
    let models = app.reg.models.read().unwrap_or_else(|e| e.into_inner());
    let m = models.get(name).ok_or_else(|| ApiError::not_found(format!("no model {name:?}")))?;
    if !m.versions.contains_key(version) {
        return Err(ApiError::not_found(format!("model {name:?} has no version {version:?}")));
    }
    Ok(())
}

async fn load_version(
    State(app): State<App>,
    Path((name, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    known(&app, &name, &version)?;
    let reg = app.reg.clone();
    let (n, v) = (name.clone(), version.clone());
    match tokio::task::spawn_blocking(move || reg.load(&n, &v)).await {
        Ok(Ok(())) => Ok(axum::Json(json!({ "status": "ready", "model": name, "version": version })).into_response()),
        Ok(Err(reason)) => Err(ApiError::new(
            422,
            "invalid_request_error",
            format!("version {version} was refused: {reason}; the live version keeps serving"),
        )),
        Err(e) => Err(ApiError::new(500, "server_error", format!("the loader stopped: {e}"))),
    }
}

async fn unload_version(
    State(app): State<App>,
    Path((name, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    known(&app, &name, &version)?;
    control(app.reg.unload(&name, &version).map(|()| format!("version {version} unloaded")))
}

async fn promote(State(app): State<App>, Path(name): Path<String>, req: Request) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let v = json_body(&app, &parts.headers, body).await?;
    // A misspelt option must not pass for none: `{"version": "2", "fraction": 0.1}` would
    // otherwise promote version 2 to all traffic instead of a tenth.
    only_keys(&v, &["version", "canary_fraction"])?;
    let version = match v.get("version") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => return Err(ApiError::bad("'version' is required")),
    };
    let fraction = match v.get("canary_fraction") {
        None | Some(Value::Null) => None,
        Some(f) => Some(f.as_f64().ok_or_else(|| ApiError::bad("'canary_fraction' must be a number in (0, 1]"))?),
    };
    control(app.reg.promote(&name, &version, fraction))
}

/// A control request's body must be an object holding only these keys.
fn only_keys(v: &Value, allowed: &[&str]) -> Result<(), ApiError> {
    let o = v.as_object().ok_or_else(|| ApiError::bad("the body must be a JSON object"))?;
    match o.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(ApiError::bad(format!("unknown field {k:?}: this endpoint takes {}", allowed.join(", ")))),
        None => Ok(()),
    }
}

async fn rollback(State(app): State<App>, Path(name): Path<String>) -> Result<Response, ApiError> {
    control(app.reg.rollback(&name, "requested"))
}

async fn lose_device(State(app): State<App>) -> Result<Response, ApiError> {
    if !app.test_hooks {
        return Err(ApiError::not_found("no such endpoint"));
    }
    app.reg.devices.current().0.lose_for_testing();
    Ok(axum::Json(json!({ "status": "device lost (test hook)" })).into_response())
}

async fn ready(State(app): State<App>) -> Response {
    if app.reg.ready.load(Ordering::Acquire) && !app.reg.shutting_down.load(Ordering::Acquire) {
        axum::Json(json!({ "status": "ready" })).into_response()
    } else {
        ApiError::new(503, "unavailable_error", "not ready: models are loading or the server is shutting down")
            .into_response()
    }
}

async fn metrics_text(State(app): State<App>) -> Response {
    let dev = app.reg.devices.current().0;
    let stats = dev.stats();
    metrics::gauge!("tessera_device_bytes_in_use").set(stats.bytes_in_use as f64);
    metrics::gauge!("tessera_device_kernels_compiled").set(stats.pipelines_compiled as f64);
    let mut r = app.metrics.render().into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    r
}
