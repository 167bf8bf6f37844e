//! `tessera-serve batch`: predict every line of a JSONL file through the same batcher
//! the server uses, with a progress bar. Output line `k` answers input line `k`
//! (`{"line": k, "embedding": [...]}`, `{"line": k, "label", "probabilities"}` or
//! `{"line": k, "error": "..."}`). An interrupted run resumes: the complete lines already
//! written are kept (a torn last line is cut) and the rest are computed, none twice.

use crate::batcher::{Batcher, Failure};
use crate::model::{Input, Output, PIXELS};
use crate::state::argmax;
use crate::{build_registry, Res, ServeArgs};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct BatchArgs {
    /// The model to run.
    #[arg(long)]
    model: String,
    /// Its version (default: the newest).
    #[arg(long)]
    version: Option<String>,
    /// One input per line: a string or `{"input": "..."}` for embedders, an array of 784
    /// numbers or `{"inputs": [...]}` for classifiers.
    #[arg(long)]
    input: PathBuf,
    #[arg(long)]
    output: PathBuf,
    /// Hide the progress bar.
    #[arg(long)]
    quiet: bool,
}

/// How many complete, in-order lines `path` holds; a torn or foreign tail is cut off.
fn resume_point(path: &Path) -> Res<usize> {
    let Ok(bytes) = std::fs::read(path) else { return Ok(0) };
    let mut keep = 0usize;
    let mut lines = 0usize;
    let mut start = 0usize;
    for (i, &b) in bytes.iter().enumerate() {
        if b != b'\n' {
            continue;
        }
        let ok = serde_json::from_slice::<Value>(&bytes[start..i])
            .ok()
            .and_then(|v| v.get("line").and_then(Value::as_u64))
            .is_some_and(|l| l as usize == lines);
        if !ok {
            break;
        }
        lines += 1;
        keep = i + 1;
        start = i + 1;
    }
    if keep < bytes.len() {
        let f = std::fs::OpenOptions::new().write(true).open(path)?;
        f.set_len(keep as u64)?;
    }
    Ok(lines)
}

fn parse_line(line: &str, embeds: bool) -> Result<Input, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    if embeds {
        let s = match &v {
            Value::String(s) => s.clone(),
            Value::Object(o) => o
                .get("input")
                .or_else(|| o.get("text"))
                .and_then(Value::as_str)
                .ok_or("no \"input\" string")?
                .to_string(),
            _ => return Err("expected a string or {\"input\": \"...\"}".into()),
        };
        if s.trim().is_empty() {
            return Err("empty text".into());
        }
        Ok(Input::Text(s))
    } else {
        let arr = match &v {
            Value::Array(_) => &v,
            Value::Object(o) => o.get("inputs").or_else(|| o.get("pixels")).ok_or("no \"inputs\" array")?,
            _ => return Err("expected an array of 784 numbers".into()),
        };
        let mut px = Vec::new();
        flatten(arr, &mut px)?;
        if px.len() != PIXELS {
            return Err(format!("{} values; the model takes {PIXELS} (28x28)", px.len()));
        }
        Ok(Input::Pixels(px))
    }
}

fn flatten(v: &Value, out: &mut Vec<f32>) -> Result<(), String> {
    match v {
        Value::Number(n) => {
            out.push(n.as_f64().ok_or("bad number")? as f32);
            Ok(())
        }
        Value::Array(a) => a.iter().try_for_each(|x| flatten(x, out)),
        _ => Err("a non-number".into()),
    }
}

fn answer(line: usize, r: Result<Output, String>) -> Value {
    match r {
        Ok(Output::Embedding(e, ..)) => json!({ "line": line, "embedding": e }),
        Ok(Output::Classes(p)) => json!({ "line": line, "label": argmax(&p), "probabilities": p }),
        Ok(Output::Items { items, scores }) => json!({ "line": line, "items": items, "scores": scores }),
        Err(e) => json!({ "line": line, "error": e }),
    }
}

pub fn run(serve: ServeArgs, a: BatchArgs) -> Res<()> {
    let reg = build_registry(&serve)?;
    let version = match a.version.clone() {
        Some(v) => v,
        None => {
            let models = reg.models.read().unwrap_or_else(|e| e.into_inner());
            let m = models.get(&a.model).ok_or_else(|| format!("no model {:?} in {}", a.model, reg.root.display()))?;
            m.versions.keys().max_by(|x, y| crate::repo::natural(x, y)).cloned().ok_or("no versions")?
        }
    };
    reg.load(&a.model, &version).map_err(|e| format!("{}/{version}: {e}", a.model))?;
    let (batcher, embeds): (Arc<Batcher>, bool) = {
        let models = reg.models.read().unwrap_or_else(|e| e.into_inner());
        let m = &models[&a.model];
        (m.versions[&version].batcher.clone().ok_or("not loaded")?, m.embeds)
    };
    let input = std::fs::File::open(&a.input).map_err(|e| format!("{}: {e}", a.input.display()))?;
    let lines: Vec<String> = std::io::BufReader::new(input).lines().collect::<Result<_, _>>()?;
    let done = resume_point(&a.output)?;
    if done > lines.len() {
        return Err(format!(
            "{} holds {done} lines, more than the {} inputs: a different input file?",
            a.output.display(),
            lines.len()
        )
        .into());
    }
    let mut out = std::fs::OpenOptions::new().create(true).append(true).open(&a.output)?;
    let bar = if a.quiet { ProgressBar::hidden() } else { ProgressBar::new(lines.len() as u64) };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{}/{version}", a.model));
    bar.set_position(done as u64);
    if done > 0 {
        eprintln!("[batch] resuming after {done} lines already in {}", a.output.display());
    }
    let t0 = Instant::now();
    let window = (serve.max_batch_size * 4).max(8);
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    rt.block_on(async {
        type Pending = (usize, Result<tokio::sync::oneshot::Receiver<Result<crate::batcher::Done, Failure>>, String>);
        let mut inflight: VecDeque<Pending> = VecDeque::new();
        let mut next = done;
        let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
        loop {
            while inflight.len() < window && next < lines.len() {
                let p = match parse_line(&lines[next], embeds) {
                    Ok(x) => loop {
                        match batcher.submit(x.clone(), far) {
                            Ok(rx) => break Ok(rx),
                            Err(true) => tokio::time::sleep(Duration::from_millis(5)).await,
                            Err(false) => break Err("the batcher stopped".to_string()),
                        }
                    },
                    Err(e) => Err(e),
                };
                inflight.push_back((next, p));
                next += 1;
            }
            let Some((line, p)) = inflight.pop_front() else { break };
            let r = match p {
                Err(e) => Err(e),
                Ok(rx) => match rx.await {
                    Ok(Ok(d)) => Ok(d.output),
                    Ok(Err(f)) => Err(format!("{f:?}")),
                    Err(_) => Err("the batcher stopped".into()),
                },
            };
            let mut text = serde_json::to_string(&answer(line, r))?;
            text.push('\n');
            out.write_all(text.as_bytes())?;
            out.flush()?;
            bar.inc(1);
        }
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    bar.finish_and_clear();
    let n = lines.len() - done;
    eprintln!(
        "[batch] {n} lines in {:.1} s ({:.1}/s) into {}",
        t0.elapsed().as_secs_f64(),
        n as f64 / t0.elapsed().as_secs_f64().max(1e-9),
        a.output.display()
    );
    batcher.shutdown();
    Ok(())
}
