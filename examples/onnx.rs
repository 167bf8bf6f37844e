//! ONNX on the command line.
//!
//! ```text
//! cargo run --release --example onnx -- info model.onnx
//! cargo run --release --example onnx -- run model.onnx --input x=x.npy [--output-dir out] [--dtype f16|q8_0|q4_0]
//! cargo run --release --example onnx -- test DIR [--expect tests/onnx/node_passing.txt] [--write-passing FILE]
//! ```
//!
//! `run` reads each input from a `.npy` file (f32, f64, f16, int64, int32, int8, uint8,
//! bool) and writes each output to `<output-dir>/<name>.npy` in the model's declared
//! type. `test` runs ONNX backend test cases (a directory of them, or one) and reports
//! pass, fail or unsupported per case; `--expect` makes it fail when a listed case does
//! not pass. `--device` picks `cpu`, `gpu`, `reference` or part of an adapter's name
//! (default: what `Device::new()` picks).

use clap::{Parser, Subcommand};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use tessera::onnx::testcase::{self, Tolerance, Verdict};
use tessera::onnx::{Elem, HostData, HostTensor, LoadOptions, OnnxModel, Value};
use tessera::{quant, Device, DeviceOptions};

#[derive(Parser)]
#[command(about = "Inspect, run and test ONNX models with Tessera")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Device: cpu, gpu, reference, or part of an adapter name (default: Device::new()).
    #[arg(long, global = true)]
    device: Option<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print inputs, outputs, opset and an op histogram.
    Info { model: PathBuf },
    /// Run a model on .npy inputs.
    Run {
        model: PathBuf,
        /// `name=file.npy`, once per input.
        #[arg(long = "input", value_name = "NAME=FILE")]
        inputs: Vec<String>,
        /// Write each output as `<dir>/<name>.npy`.
        #[arg(long)]
        output_dir: Option<PathBuf>,
        /// Convert MatMul and Gemm weights: f16, q8_0 or q4_0.
        #[arg(long)]
        dtype: Option<String>,
        /// Run this many times and report the median time per run.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
    },
    /// Run ONNX backend test cases (model.onnx + test_data_set_N) in DIR.
    Test {
        dir: PathBuf,
        /// Cases that must pass (one name per line); any that does not fails the command.
        #[arg(long)]
        expect: Option<PathBuf>,
        /// Write the names of the passing cases here.
        #[arg(long)]
        write_passing: Option<PathBuf>,
        /// Only cases whose name contains one of these (comma-separated).
        #[arg(long)]
        filter: Option<String>,
        /// Absolute tolerance (default 1e-7, or meta.json's atol).
        #[arg(long)]
        atol: Option<f64>,
        /// Relative tolerance (default 1e-3, or meta.json's rtol).
        #[arg(long)]
        rtol: Option<f64>,
        /// Print every case, not only failures and the summary.
        #[arg(long)]
        verbose: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn open_device(choice: Option<&str>) -> tessera::Result<Device> {
    match choice {
        None | Some("auto") => Device::new(),
        Some(c) => Device::with_options(DeviceOptions { adapter: Some(c.to_string()), ..DeviceOptions::from_env() }),
    }
}

fn run(cli: Cli) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let dev = open_device(cli.device.as_deref())?;
    match cli.cmd {
        Cmd::Info { model } => {
            let m = OnnxModel::load(&model, &dev)?;
            let i = m.info();
            println!("{}: IR {}, opset {}, producer '{}'", model.display(), i.ir_version, i.opset, i.producer);
            println!("{} nodes, {} constant parameters", i.nodes, i.parameters);
            let io = |x: &tessera::onnx::IoInfo| {
                let t = x.elem.map(|e| e.to_string()).unwrap_or_else(|| "?".into());
                let d = match &x.dims {
                    Some(d) => format!("[{}]", d.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
                    None => "(no shape)".into(),
                };
                format!("  {}: {t} {d}", x.name)
            };
            println!("inputs:");
            i.inputs.iter().for_each(|x| println!("{}", io(x)));
            println!("outputs:");
            i.outputs.iter().for_each(|x| println!("{}", io(x)));
            println!("ops:");
            for (op, c) in &i.ops {
                println!("  {c:6} {op}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run { model, inputs, output_dir, dtype, repeat } => {
            let weights = match dtype.as_deref() {
                None => None,
                Some(s) => Some(quant::parse_dtype(s).ok_or_else(|| format!("--dtype {s}: use f16, q8_0 or q4_0"))?),
            };
            let t0 = Instant::now();
            let m = OnnxModel::load_with(&model, &dev, LoadOptions { weights })?;
            println!("loaded {} in {:.1} ms on {}", model.display(), t0.elapsed().as_secs_f64() * 1e3, dev.info().name);
            let mut vals = Vec::new();
            for spec in &inputs {
                let (name, file) = spec.split_once('=').ok_or_else(|| format!("--input {spec}: expected NAME=FILE"))?;
                vals.push((name.to_string(), Value::host(read_npy(Path::new(file))?)));
            }
            let mut times = Vec::new();
            let mut last = None;
            for _ in 0..repeat.max(1) {
                let t = Instant::now();
                let outs = m.run_values(vals.clone())?;
                let tensors: Vec<_> = outs.iter().map(|o| o.tensor.clone()).collect();
                let values = tessera::read_all_blocking(&tensors)?;
                times.push(t.elapsed().as_secs_f64() * 1e3);
                last = Some((outs, values));
            }
            times.sort_by(f64::total_cmp);
            println!("run: {:.2} ms (median of {})", times[times.len() / 2], times.len());
            let (outs, values) = last.ok_or("no run")?;
            for (o, v) in outs.iter().zip(&values) {
                let preview: Vec<String> = v.iter().take(6).map(|x| format!("{x:.6}")).collect();
                println!(
                    "  {} {} {:?}: [{}{}]",
                    o.name,
                    o.elem,
                    o.tensor.dims(),
                    preview.join(", "),
                    if v.len() > 6 { ", ..." } else { "" }
                );
                if let Some(dir) = &output_dir {
                    std::fs::create_dir_all(dir)?;
                    let safe: String = o
                        .name
                        .chars()
                        .map(|c| if c.is_alphanumeric() || "._-".contains(c) { c } else { '_' })
                        .collect();
                    write_npy(&dir.join(format!("{safe}.npy")), o.elem, o.tensor.dims(), v)?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Test { dir, expect, write_passing, filter, atol, rtol, verbose } => {
            test_dir(&dev, &dir, expect.as_deref(), write_passing.as_deref(), filter.as_deref(), atol, rtol, verbose)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn test_dir(
    dev: &Device,
    dir: &Path,
    expect: Option<&Path>,
    write_passing: Option<&Path>,
    filter: Option<&str>,
    atol: Option<f64>,
    rtol: Option<f64>,
    verbose: bool,
) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let mut cases: Vec<PathBuf> = if dir.join("model.onnx").exists() {
        vec![dir.to_path_buf()]
    } else {
        std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e} (make the node tests with scripts/gen_onnx_node_tests.sh)", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("model.onnx").exists())
            .collect()
    };
    cases.sort();
    if let Some(f) = filter {
        cases.retain(|c| c.file_name().and_then(|n| n.to_str()).is_some_and(|n| f.split(',').any(|p| n.contains(p))));
    }
    if cases.is_empty() {
        return Err(format!("no test cases (directories with model.onnx) under {}", dir.display()).into());
    }
    println!("{} cases on {} ({})", cases.len(), dev.info().name, dev.info().backend);
    let t0 = Instant::now();
    let mut verdicts: BTreeMap<String, Verdict> = BTreeMap::new();
    for c in &cases {
        let name = c.file_name().and_then(|n| n.to_str()).unwrap_or("?").to_string();
        // A real-model case may carry its own tolerances in meta.json.
        let meta = std::fs::read_to_string(c.join("meta.json"))
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
        let from_meta = |k: &str| meta.as_ref().and_then(|m| m.get(k)).and_then(|v| v.as_f64());
        let d = Tolerance::default();
        let tol = Tolerance {
            atol: atol.or_else(|| from_meta("atol")).unwrap_or(d.atol),
            rtol: rtol.or_else(|| from_meta("rtol")).unwrap_or(d.rtol),
        };
        let start = Instant::now();
        let v = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| testcase::run_case_dir(c, dev, tol)))
            .unwrap_or_else(|p| {
                let msg =
                    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                Verdict::Fail(format!("PANIC: {}", msg.unwrap_or_default()))
            });
        let ms = start.elapsed().as_secs_f64() * 1e3;
        match &v {
            Verdict::Pass { max_abs_diff } if verbose => {
                println!("pass        {name} (max |diff| {max_abs_diff:.2e}, {ms:.0} ms)")
            }
            Verdict::Pass { .. } => {}
            Verdict::Fail(m) => println!("fail        {name}: {}", short(m)),
            Verdict::Unsupported(m) if verbose => println!("unsupported {name}: {}", short(m)),
            Verdict::Unsupported(_) => {}
        }
        verdicts.insert(name, v);
    }
    let count = |k: &str| verdicts.values().filter(|v| v.kind() == k).count();
    println!(
        "{} pass, {} fail, {} unsupported of {} cases in {:.1} s",
        count("pass"),
        count("fail"),
        count("unsupported"),
        verdicts.len(),
        t0.elapsed().as_secs_f64()
    );
    if let Some(p) = write_passing {
        let list: Vec<&str> = verdicts.iter().filter(|(_, v)| v.is_pass()).map(|(k, _)| k.as_str()).collect();
        std::fs::write(p, list.join("\n") + "\n")?;
        println!("wrote {} passing cases to {}", list.len(), p.display());
    }
    if let Some(p) = expect {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let listed: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
        let mut broken = Vec::new();
        for name in &listed {
            if filter.is_some_and(|f| !f.split(',').any(|p| name.contains(p))) {
                continue;
            }
            match verdicts.get(*name) {
                Some(v) if v.is_pass() => {}
                Some(v) => broken.push(format!(
                    "{name}: {} {}",
                    v.kind(),
                    match v {
                        Verdict::Fail(m) | Verdict::Unsupported(m) => short(m),
                        _ => String::new(),
                    }
                )),
                None => broken.push(format!("{name}: missing from {}", dir.display())),
            }
        }
        if !broken.is_empty() {
            println!("{} listed case(s) in {} no longer pass:", broken.len(), p.display());
            for b in &broken {
                println!("  {b}");
            }
            return Ok(ExitCode::FAILURE);
        }
        println!("all {} listed cases pass", listed.len());
    }
    Ok(ExitCode::SUCCESS)
}

fn short(m: &str) -> String {
    let m = m.replace('\n', " ");
    if m.chars().count() > 240 {
        format!("{}...", m.chars().take(240).collect::<String>())
    } else {
        m
    }
}

/// A `.npy` file as a host tensor.
fn read_npy(path: &Path) -> Result<HostTensor, Box<dyn std::error::Error>> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| format!("{}: {e}", path.display()))?;
    if npy.order() == npyz::Order::Fortran && npy.shape().len() > 1 {
        return Err(format!("{}: Fortran-ordered arrays are not supported", path.display()).into());
    }
    let dims: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let npyz::DType::Plain(ts) = npy.dtype() else {
        return Err(format!("{}: structured arrays are not supported", path.display()).into());
    };
    use npyz::TypeChar as T;
    let (elem, data) = match (ts.type_char(), ts.size_field()) {
        (T::Float, 4) => (Elem::F32, HostData::F(npy.into_vec::<f32>()?.into_iter().map(f64::from).collect())),
        (T::Float, 8) => (Elem::F64, HostData::F(npy.into_vec::<f64>()?)),
        (T::Float, 2) => {
            (Elem::F16, HostData::F(npy.into_vec::<half::f16>()?.into_iter().map(|v| v.to_f64()).collect()))
        }
        (T::Int, 8) => (Elem::I64, HostData::I(npy.into_vec::<i64>()?)),
        (T::Int, 4) => (Elem::I32, HostData::I(npy.into_vec::<i32>()?.into_iter().map(i64::from).collect())),
        (T::Int, 1) => (Elem::I8, HostData::I(npy.into_vec::<i8>()?.into_iter().map(i64::from).collect())),
        (T::Uint, 1) => (Elem::U8, HostData::I(npy.into_vec::<u8>()?.into_iter().map(i64::from).collect())),
        (T::Bool, 1) => (Elem::Bool, HostData::I(npy.into_vec::<bool>()?.into_iter().map(i64::from).collect())),
        (c, s) => return Err(format!("{}: numpy type {c:?}{s} is not supported", path.display()).into()),
    };
    Ok(HostTensor::new(elem, dims, data)?)
}

/// Write values as a `.npy` of the ONNX type `elem`.
fn write_npy(path: &Path, elem: Elem, dims: &[usize], v: &[f64]) -> Result<(), Box<dyn std::error::Error>> {
    use npyz::WriterBuilder;
    let shape: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    let mut out = Vec::new();
    macro_rules! put {
        ($t:ty, $f:expr) => {{
            let mut w = npyz::WriteOptions::<$t>::new().default_dtype().shape(&shape).writer(&mut out).begin_nd()?;
            w.extend(v.iter().map($f))?;
            w.finish()?;
        }};
    }
    match elem {
        Elem::F16 => put!(half::f16, |&x| half::f16::from_f64(x)),
        Elem::F64 => put!(f64, |&x| x),
        Elem::I64 | Elem::U64 => put!(i64, |&x| x as i64),
        Elem::I32 | Elem::U32 | Elem::I16 | Elem::U16 => put!(i32, |&x| x as i32),
        Elem::I8 => put!(i8, |&x| x as i8),
        Elem::U8 => put!(u8, |&x| x as u8),
        Elem::Bool => put!(bool, |&x| x != 0.0),
        _ => put!(f32, |&x| x as f32),
    }
    std::fs::write(path, out).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}
