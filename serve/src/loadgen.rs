//! `tessera-serve loadgen`: N concurrent clients for T seconds against servers on
//! loopback, one sentence per request. Without `--url` it starts its own servers (this
//! binary, on free loopback ports, sharing the default repository, with the batching
//! options given to loadgen) and measures in one run: dynamic batching against
//! `max_batch_size=1` (unique sentences, so every request
//! misses the cache; the two alternate in `--rounds` rounds, so a change in the host's
//! load falls on both), and a cold cache against a warm one (a fixed set of sentences,
//! sent once to warm it). It prints throughput, p50/p90/p99 latency, the mean batch size
//! and the cache hit rate, as a table or `--json`.

use crate::{Res, ServeArgs};
use clap::Args;
use serde_json::json;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
pub struct LoadgenArgs {
    /// A server to drive (loopback only); without it, loadgen starts its own.
    #[arg(long)]
    url: Option<String>,
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Seconds per measured phase.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long, default_value = "minilm")]
    model: String,
    /// Device for the servers loadgen starts.
    #[arg(long)]
    device: Option<String>,
    /// Repository for the servers loadgen starts.
    #[arg(long)]
    repo: Option<PathBuf>,
    #[arg(long)]
    json: bool,
    /// Rounds in which batching on and `max_batch_size=1` alternate, each taking
    /// `seconds / rounds` of its phase.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
}

/// One phase's numbers.
#[derive(Clone, Debug, Default)]
struct Phase {
    name: String,
    requests: u64,
    ok: u64,
    errors: u64,
    rejected: u64,
    seconds: f64,
    latencies_ms: Vec<f64>,
    batch_sum: u64,
    hits: u64,
}

impl Phase {
    fn pct(&self, p: f64) -> f64 {
        if self.latencies_ms.is_empty() {
            return f64::NAN;
        }
        let mut v = self.latencies_ms.clone();
        v.sort_by(f64::total_cmp);
        v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
    }
    /// Add another run of the same phase.
    fn merge(&mut self, o: Phase) {
        self.requests += o.requests;
        self.ok += o.ok;
        self.errors += o.errors;
        self.rejected += o.rejected;
        self.seconds += o.seconds;
        self.latencies_ms.extend(o.latencies_ms);
        self.batch_sum += o.batch_sum;
        self.hits += o.hits;
    }
    /// Hits do not form batches: the mean batch size is over computed requests.
    fn finish(mut self) -> Phase {
        let computed = self.ok - self.hits;
        if let Some(mean_scaled) = (self.batch_sum * self.ok).checked_div(computed) {
            self.batch_sum = mean_scaled;
        }
        self
    }
    fn throughput(&self) -> f64 {
        self.ok as f64 / self.seconds.max(1e-9)
    }
    fn json(&self) -> serde_json::Value {
        json!({
            "phase": self.name,
            "requests": self.requests,
            "ok": self.ok,
            "errors": self.errors,
            "rejected_429": self.rejected,
            "seconds": self.seconds,
            "throughput_rps": self.throughput(),
            "p50_ms": self.pct(0.5),
            "p90_ms": self.pct(0.9),
            "p99_ms": self.pct(0.99),
            "mean_batch_size": self.batch_sum as f64 / self.ok.max(1) as f64,
            "cache_hit_rate": self.hits as f64 / self.ok.max(1) as f64,
        })
    }
}

/// A server this process started.
struct Spawned {
    child: std::process::Child,
    url: String,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // SIGTERM: a graceful stop.
        let _ = std::process::Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
    }
}

/// Start a server on a free port with loadgen's batching options, batches of at most
/// `max_batch_size`.
fn spawn(a: &LoadgenArgs, serve: &ServeArgs, max_batch_size: usize) -> Res<Spawned> {
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--port", "0"]).stdout(std::process::Stdio::piped());
    let batching = [
        ("--max-batch-size", max_batch_size.to_string()),
        ("--max-delay-ms", serve.max_delay_ms.to_string()),
        ("--batch-quiet-ms", serve.batch_quiet_ms.to_string()),
        ("--max-batch-tokens", serve.max_batch_tokens.to_string()),
        ("--queue-capacity", serve.queue_capacity.to_string()),
        ("--request-timeout-s", serve.request_timeout_s.to_string()),
        ("--warm-lengths", serve.warm_lengths.to_string()),
    ];
    for (flag, value) in batching {
        cmd.args([flag, value.as_str()]);
    }
    if serve.quick_warm_up {
        cmd.arg("--quick-warm-up");
    }
    if let Some(d) = &a.device {
        cmd.args(["--device", d]);
    }
    if let Some(r) = &a.repo {
        cmd.arg("--repo").arg(r);
    }
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| format!("unexpected first line from the server: {line:?}"))?
        .to_string();
    Ok(Spawned { child, url })
}

async fn wait_ready(client: &reqwest::Client, url: &str) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while Instant::now() < deadline {
        if let Ok(r) = client.get(format!("{url}/health/ready")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("{url} did not become ready").into())
}

/// `clients` loops for `seconds`, each posting one sentence per request; `text(c, k)`
/// gives client c's k-th sentence.
async fn phase(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    name: &str,
    clients: usize,
    seconds: f64,
    text: Arc<dyn Fn(usize, u64) -> String + Send + Sync>,
) -> Phase {
    let stop = Arc::new(AtomicBool::new(false));
    let out = Arc::new(Mutex::new(Phase { name: name.into(), ..Default::default() }));
    let sent = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (client, url, model, stop, out, sent, text) =
            (client.clone(), url.to_string(), model.to_string(), stop.clone(), out.clone(), sent.clone(), text.clone());
        tasks.push(tokio::spawn(async move {
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let body = json!({ "model": model, "input": text(c, k) });
                k += 1;
                sent.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                let r = client.post(format!("{url}/v1/embeddings")).json(&body).send().await;
                // What happened: Some((ok, latency, batch, hit)) for an answer, None for
                // a transport error; 429s are retried after a pause.
                let outcome = match r {
                    Ok(resp) if resp.status().is_success() => {
                        let batch = resp
                            .headers()
                            .get("x-batch-size")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<u64>().ok())
                            .unwrap_or(0);
                        let hit = resp.headers().get("x-cache").is_some_and(|v| v == "hit");
                        let full = resp.bytes().await.is_ok();
                        Some((full, t.elapsed().as_secs_f64() * 1e3, batch, hit, false))
                    }
                    Ok(resp) if resp.status().as_u16() == 429 => Some((false, 0.0, 0, false, true)),
                    _ => None,
                };
                let rejected = {
                    let mut p = out.lock().unwrap_or_else(|e| e.into_inner());
                    p.requests += 1;
                    match outcome {
                        Some((_, _, _, _, true)) => {
                            p.rejected += 1;
                            true
                        }
                        Some((true, ms, batch, hit, false)) => {
                            p.ok += 1;
                            p.latencies_ms.push(ms);
                            p.batch_sum += if hit { 0 } else { batch };
                            p.hits += hit as u64;
                            false
                        }
                        _ => {
                            p.errors += 1;
                            false
                        }
                    }
                };
                if rejected {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let mut p = out.lock().unwrap_or_else(|e| e.into_inner()).clone();
    p.seconds = t0.elapsed().as_secs_f64();
    p
}

/// Run loadgen; the servers it starts take `serve`'s batching options.
pub fn run(serve: ServeArgs, a: LoadgenArgs) -> Res<()> {
    if let Some(u) = &a.url {
        let host = reqwest::Url::parse(u)?.host_str().unwrap_or_default().to_string();
        if !matches!(host.as_str(), "127.0.0.1" | "localhost" | "::1" | "[::1]") {
            return Err(format!("loadgen drives loopback servers only, not {host}").into());
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (phases, per_round) = rt.block_on(async {
        let client = reqwest::Client::builder().pool_max_idle_per_host(a.clients * 2).build()?;
        // Sentences no phase sends twice (round r), so every request misses the cache.
        let unique = |r: usize| -> Arc<dyn Fn(usize, u64) -> String + Send + Sync> {
            Arc::new(move |c, k| {
                format!("Request {k}.{r} from client {c}: the quick brown fox jumps over the lazy dog.")
            })
        };
        let fixed: Arc<dyn Fn(usize, u64) -> String + Send + Sync> =
            Arc::new(|c, k| format!("Sentence number {} about a cached embedding.", (c as u64 * 7 + k) % 64));
        let mut phases = Vec::new();
        let batched;
        let mut unbatched: Option<Spawned> = None;
        let url = match &a.url {
            Some(u) => u.clone(),
            None => {
                batched = spawn(&a, &serve, serve.max_batch_size)?;
                batched.url.clone()
            }
        };
        wait_ready(&client, &url).await?;
        // Warm the server (kernels compiled, plans cached) before measuring, with
        // sentences shaped like the measured ones (the same template, so the same token
        // counts and kernels) that the measured phases never send (round 99).
        let warm = unique(99);
        let _ = phase(&client, &url, &a.model, "warm-up", a.clients, 2.0, warm.clone()).await;
        // Batching on against max_batch_size=1, in alternating rounds.
        if a.url.is_none() {
            let s = spawn(&a, &serve, 1)?;
            wait_ready(&client, &s.url).await?;
            let _ = phase(&client, &s.url, &a.model, "warm-up", a.clients, 2.0, warm.clone()).await;
            unbatched = Some(s);
        }
        let rounds = if unbatched.is_some() { a.rounds.max(1) } else { 1 };
        let (on_name, off_name) = ("batching on, cold cache", "max_batch_size=1, cold cache");
        let mut on = Phase { name: on_name.into(), ..Default::default() };
        let mut off = Phase { name: off_name.into(), ..Default::default() };
        let mut per_round = Vec::new();
        for r in 0..rounds {
            let secs = a.seconds / rounds as f64;
            let x = phase(&client, &url, &a.model, on_name, a.clients, secs, unique(r)).await;
            let ratio = x.throughput();
            on.merge(x);
            if let Some(u) = &unbatched {
                let y = phase(&client, &u.url, &a.model, off_name, a.clients, secs, unique(r)).await;
                per_round.push(ratio / y.throughput().max(1e-9));
                off.merge(y);
            }
        }
        phases.push(on.finish());
        // Fill the cache with the fixed set, then measure all hits.
        for k in 0..64u64 {
            let _ = client
                .post(format!("{url}/v1/embeddings"))
                .json(&json!({ "model": a.model, "input": fixed(0, k) }))
                .send()
                .await;
        }
        phases.push(
            phase(&client, &url, &a.model, "warm cache (all hits)", a.clients, a.seconds.min(5.0), fixed.clone())
                .await
                .finish(),
        );
        // What one hit costs with nothing queued ahead of it: at 32 clients on a small
        // host, the hit latency is mostly waiting for a core (Little's law).
        phases.push(
            phase(&client, &url, &a.model, "warm cache, 1 client", 1, a.seconds.min(3.0), fixed.clone()).await.finish(),
        );
        if unbatched.is_some() {
            phases.push(off.finish());
        }
        Ok::<(Vec<Phase>, Vec<f64>), Box<dyn std::error::Error + Send + Sync>>((phases, per_round))
    })?;
    let on = phases.iter().find(|p| p.name.starts_with("batching on"));
    let off = phases.iter().find(|p| p.name.starts_with("max_batch_size=1"));
    let ratio = match (on, off) {
        (Some(x), Some(y)) => Some(x.throughput() / y.throughput().max(1e-9)),
        _ => None,
    };
    // A hit's p50 alone, and among all the clients.
    let hit_p50 = |name: &str| phases.iter().find(|p| p.name == name && p.ok > 0).map(|p| p.pct(0.5));
    let hits = (hit_p50("warm cache, 1 client"), hit_p50("warm cache (all hits)"));
    if a.json {
        for p in &phases {
            println!("{}", p.json());
        }
        if let Some(r) = ratio {
            println!("{}", json!({ "batching_speedup": r, "per_round": per_round, "clients": a.clients }));
        }
        if let (Some(one), Some(all)) = hits {
            println!(
                "{}",
                json!({ "cache_hit_p50_ms": { "one_client": one, "all_clients": all }, "clients": a.clients })
            );
        }
    } else {
        println!("{} clients, one sentence per request, {} s per phase, model {}\n", a.clients, a.seconds, a.model);
        println!(
            "{:<32} {:>9} {:>10} {:>9} {:>9} {:>9} {:>7} {:>6} {:>6}",
            "phase", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "batch", "hits", "errors"
        );
        for p in &phases {
            println!(
                "{:<32} {:>9} {:>10.1} {:>9.2} {:>9.2} {:>9.2} {:>7.1} {:>5.0}% {:>6}",
                p.name,
                p.requests,
                p.throughput(),
                p.pct(0.5),
                p.pct(0.9),
                p.pct(0.99),
                p.batch_sum as f64 / p.ok.max(1) as f64,
                100.0 * p.hits as f64 / p.ok.max(1) as f64,
                p.errors + p.rejected
            );
        }
        if let Some(r) = ratio {
            let rounds: Vec<String> = per_round.iter().map(|x| format!("{x:.2}x")).collect();
            println!(
                "\ndynamic batching: {r:.2}x the throughput of max_batch_size=1 (alternating rounds: {})",
                rounds.join(", ")
            );
        }
        if let (Some(one), Some(all)) = hits {
            println!(
                "a cache hit: p50 {one:.2} ms with one client; {all:.2} ms among {} clients, most of it waiting for a core",
                a.clients
            );
        }
    }
    Ok(())
}
