//! `tessera-serve`: an HTTP inference server for Tessera models.
//!
//! ```text
//! cargo run --release -p tessera-serve                  # 127.0.0.1:8000, the default repository
//! tessera-serve --repo models --port 9000 --device gpu
//! tessera-serve batch --model minilm --input in.jsonl --output out.jsonl
//! tessera-serve loadgen --clients 32 --seconds 10      # spawns servers on loopback, prints a table
//! ```
//!
//! Files: [`repo`] (the model repository and its manifests), [`model`] (the runners),
//! [`batcher`] (dynamic batching on a worker thread per version), [`state`] (versions,
//! canary, quality guard, cache), [`api`] (the HTTP endpoints), [`batch`] (JSONL batch
//! prediction), [`loadgen`] (the load generator).

mod api;
mod batch;
mod batcher;
mod loadgen;
mod model;
mod repo;
mod state;

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "tessera-serve",
    about = "HTTP inference for Tessera models: dynamic batching, a result cache, versions with canary and rollback"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the server (the default).
    Serve,
    /// Predict every line of a JSONL file with the same batcher; resumes an interrupted run.
    Batch(batch::BatchArgs),
    /// Drive servers on loopback with concurrent clients and report throughput and latency.
    Loadgen(loadgen::LoadgenArgs),
}

/// The server's options.
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1", global = true)]
    host: String,
    /// 0 picks a free port (the chosen one is printed).
    #[arg(long, default_value_t = 8000, global = true)]
    port: u16,
    /// The model repository (`<name>/<version>/manifest.json`); built on first start
    /// when empty. Default: `$TESSERA_DATA/serve-models` (`~/.cache/tessera/serve-models`).
    #[arg(long, global = true)]
    repo: Option<PathBuf>,
    /// cpu, gpu, reference, or part of an adapter's name (default: what Device::new() picks).
    #[arg(long, global = true)]
    device: Option<String>,
    #[arg(long, default_value_t = 32, global = true)]
    max_batch_size: usize,
    /// The longest a batch's first request waits for others.
    #[arg(long, default_value_t = 20, global = true)]
    max_delay_ms: u64,
    /// A batch closes once no request has arrived for this long (at most
    /// `--max-delay-ms` after its first): a lone request waits this, a burst is one batch.
    #[arg(long, default_value_t = 5, global = true)]
    batch_quiet_ms: u64,
    /// Padded tokens per text batch (batch size times its longest sequence).
    #[arg(long, default_value_t = 8192, global = true)]
    max_batch_tokens: usize,
    /// Items waiting per version; past it, 429 with Retry-After.
    #[arg(long, default_value_t = 1024, global = true)]
    queue_capacity: usize,
    #[arg(long, default_value_t = 30.0, global = true)]
    request_timeout_s: f64,
    #[arg(long, default_value_t = 1 << 20, global = true)]
    body_limit_bytes: usize,
    /// Seconds a client may take to send its body.
    #[arg(long, default_value_t = 10.0, global = true)]
    body_timeout_s: f64,
    #[arg(long, default_value_t = 256, global = true)]
    max_inputs: usize,
    /// The result cache's size in MiB (0 disables it).
    #[arg(long, default_value_t = 64, global = true)]
    cache_mb: u64,
    /// Load every version at start (default: the newest of each model, made live).
    #[arg(long, global = true)]
    load_all: bool,
    /// Warm a version up with one input only: it goes live sooner, but on a CPU adapter a
    /// batch of a size not seen before may wait while its kernels compile (seconds each
    /// the first time on a machine). By default the warm-up also runs the row counts
    /// that reach every slowly compiled kernel.
    #[arg(long, global = true)]
    quick_warm_up: bool,
    /// Besides the row counts, warm a text model up on every sequence length up to this
    /// many word pieces, alone and padded in a pair: the kernels of short sentences
    /// differ by classes of length, and on a CPU adapter the first sentence of a new
    /// class would wait seconds for them (lavapipe: about 10 s more at start for 32).
    /// 0 leaves those to the first requests.
    #[arg(long, default_value_t = model::WARM_LENGTHS, global = true)]
    warm_lengths: usize,
    /// The canary guard's floor for the mean cosine of embeddings to the live version.
    #[arg(long, default_value_t = 0.99, global = true)]
    guard_min_cosine: f64,
    /// The canary guard's floor for classifiers' top-1 agreement.
    #[arg(long, default_value_t = 0.9, global = true)]
    guard_min_agreement: f64,
    /// Comparisons before the guard judges.
    #[arg(long, default_value_t = 16, global = true)]
    guard_min_samples: usize,
    /// Enable test hooks (POST /v1/admin/lose-device).
    #[arg(long, global = true, hide = true)]
    test_hooks: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        None | Some(Cmd::Serve) => serve(cli.serve),
        Some(Cmd::Batch(b)) => batch::run(cli.serve, b),
        Some(Cmd::Loadgen(l)) => loadgen::run(cli.serve, l),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn open_device(choice: Option<&str>) -> tessera::Result<tessera::Device> {
    match choice {
        None | Some("auto") => tessera::Device::new(),
        Some(c) => tessera::Device::with_options(tessera::DeviceOptions {
            adapter: Some(c.to_string()),
            ..tessera::DeviceOptions::from_env()
        }),
    }
}

/// The registry over the repository, with the newest version of each model (or every
/// version) loaded; the newest ready one of each is live.
pub fn build_registry(a: &ServeArgs) -> Res<Arc<state::Registry>> {
    let dev = open_device(a.device.as_deref())?;
    eprintln!("[serve] device: {} ({})", dev.info().name, dev.info().placement);
    let root = a.repo.clone().unwrap_or_else(|| repo::data_dir().join("serve-models"));
    repo::ensure_default(&root, &dev, &|m| eprintln!("[serve] {m}"))?;
    let batch = batcher::BatchConfig {
        max_batch_size: a.max_batch_size.max(1),
        max_delay: Duration::from_millis(a.max_delay_ms),
        quiet: Duration::from_millis(a.batch_quiet_ms),
        max_batch_tokens: a.max_batch_tokens.max(1),
        queue_capacity: a.queue_capacity.max(1),
        warm_batches: !a.quick_warm_up,
        warm_lengths: a.warm_lengths,
    };
    let guard = state::GuardConfig {
        min_cosine: a.guard_min_cosine,
        min_agreement: a.guard_min_agreement,
        min_samples: a.guard_min_samples.max(1),
        ..Default::default()
    };
    let reg =
        Arc::new(state::Registry::new(root.clone(), batcher::DeviceCell::new(dev), batch, guard, a.cache_mb << 20)?);
    eprintln!("[serve] repository {}", root.display());
    Ok(reg)
}

/// Load what starts loaded and make a version of each model live: the one named in
/// `<repo>/<name>/LIVE` when that file exists, else the newest that loads.
pub fn load_initial(reg: &state::Registry, all: bool) {
    let plan: Vec<(String, Vec<String>)> = {
        let models = reg.models.read().unwrap_or_else(|e| e.into_inner());
        models.iter().map(|(n, m)| (n.clone(), m.versions.keys().cloned().collect())).collect()
    };
    for (name, mut versions) in plan {
        versions.sort_by(|a, b| repo::natural(a, b));
        let pinned = std::fs::read_to_string(reg.root.join(&name).join("LIVE")).ok().map(|s| s.trim().to_string());
        let pinned = pinned.filter(|p| versions.contains(p));
        let wanted: Vec<String> = match (&pinned, all) {
            (_, true) => versions.clone(),
            (Some(p), false) => vec![p.clone()],
            (None, false) => versions.last().cloned().into_iter().collect(),
        };
        for v in &wanted {
            let _ = reg.load(&name, v);
        }
        let order: Vec<&String> = pinned.iter().chain(versions.iter().rev()).collect();
        for v in order {
            if reg.promote(&name, v, None).is_ok() {
                break;
            }
        }
    }
}

fn serve(a: ServeArgs) -> Res<()> {
    let builder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("seconds".into()),
            &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
        )?
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("tessera_batch_size".into()),
            &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
        )?;
    let handle = builder.install_recorder()?;
    describe_metrics();
    let reg = build_registry(&a)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let served = reg.clone();
    rt.block_on(async move {
        let reg = served;
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port)).await?;
        let addr = listener.local_addr()?;
        // Listen at once (live answers; ready waits for the models).
        println!("listening on http://{addr}");
        let limits = api::Limits {
            body_bytes: a.body_limit_bytes,
            body_timeout: Duration::from_secs_f64(a.body_timeout_s.max(0.1)),
            request_timeout: Duration::from_secs_f64(a.request_timeout_s.max(0.1)),
            max_inputs: a.max_inputs.max(1),
            max_text_bytes: 64 << 10,
        };
        let app = api::App { reg: reg.clone(), limits, metrics: handle, test_hooks: a.test_hooks };
        let loader = {
            let reg = reg.clone();
            let all = a.load_all;
            tokio::task::spawn_blocking(move || {
                load_initial(&reg, all);
                reg.ready.store(true, Ordering::Release);
                eprintln!("[serve] ready");
            })
        };
        // Bodies are bounded (size and arrival time) by the handlers' own reader, which
        // answers in the API's JSON error shape.
        let router = api::router(app);
        let shutdown_reg = reg.clone();
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                shutdown_signal().await;
                eprintln!("[serve] shutting down: answering the requests already accepted");
                shutdown_reg.shutting_down.store(true, Ordering::Release);
            })
            .await?;
        let _ = loader.await;
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    for b in reg.batchers() {
        b.shutdown();
    }
    eprintln!("[serve] stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!("tessera_requests_total", "Requests by model, version and HTTP status");
    describe_histogram!("tessera_request_queue_seconds", Unit::Seconds, "Time a request's items waited for a batch");
    describe_histogram!(
        "tessera_request_compute_seconds",
        Unit::Seconds,
        "Time the batch holding a request's items computed"
    );
    describe_histogram!("tessera_request_seconds", Unit::Seconds, "Total time to answer a request");
    describe_histogram!("tessera_batch_size", "Items per batch run");
    describe_counter!("tessera_cache_hits_total", "Items answered from the result cache");
    describe_counter!("tessera_cache_misses_total", "Items computed");
    describe_gauge!("tessera_queue_depth", "Items waiting per model version");
    describe_gauge!("tessera_device_bytes_in_use", Unit::Bytes, "Bytes of device (GPU or CPU backend) buffers in use");
    describe_gauge!(
        "tessera_device_kernels_compiled",
        "Compute kernels compiled on the current device (a request that compiles one waits for it)"
    );
    describe_counter!("tessera_canary_rollbacks_total", "Canaries the quality guard rolled back");
    describe_counter!("tessera_device_recoveries_total", "Devices recovered after a loss");
}
