//! Says which device `Device::new()` picks here and why, lists every adapter wgpu
//! offers with its backend, features and limits, then runs a small self-check (a few
//! ops against the f64 reference) on the CPU backend and on each adapter, and prints
//! PASS/FAIL.
//!
//! `cargo run --release --example info`

use std::process::ExitCode;
use std::time::Instant;
use tessera::{DType, Device, DeviceOptions, Tensor};

/// A few ops covering each kernel family, as (name, outputs).
fn self_check(d: &Device) -> Vec<(&'static str, Vec<Tensor>)> {
    let x = Tensor::from_slice(&[0.5f32, -1.25, 2.0, 3.5, -0.75, 1.0], [2, 3], d);
    let w = Tensor::randn([3, 4], 7, d);
    let idx = Tensor::from_slice(&[1i32, 0, 1], [3], d);
    vec![
        ("fused element-wise", vec![((&x * 2.0 + 1.0).gelu() - x.exp()).sigmoid()]),
        ("broadcast + compare", vec![Tensor::where_(&x.gt_scalar(0.0), &x, &x.sum(&[0], true))]),
        ("reductions", vec![x.sum(&[1], false), x.max(&[0], false), x.argmax(&[1], false), x.var_all()]),
        ("softmax", vec![x.softmax(-1)]),
        ("movement", vec![Tensor::concat(&[x.t(), x.t().neg()], 1).pad(&[(1, 0), (0, 1)], 0.0).slice(1, 0, 5, 2)]),
        ("gather", vec![x.index_select(0, &idx)]),
        ("matmul", vec![x.matmul(&w), Tensor::randn([2, 17, 9], 1, d).matmul(&Tensor::randn([9, 33], 2, d))]),
        ("f16", vec![(x.cast(DType::F16) * 3.0).exp().cast(DType::F32)]),
        ("integers", vec![Tensor::arange(-5.0, 5.0, 1.0, DType::I32, d).div_scalar(3.0)]),
    ]
}

fn compare(d: &Device) -> Result<usize, String> {
    let cpu = Device::reference();
    let mut checked = 0;
    for ((name, got), (_, want)) in self_check(d).into_iter().zip(self_check(&cpu)) {
        let g = tessera::read_all_blocking(&got).map_err(|e| format!("{name}: {e}"))?;
        let w = tessera::read_all_blocking(&want).map_err(|e| format!("{name}: reference: {e}"))?;
        for (t, (gv, wv)) in want.iter().zip(g.iter().zip(&w)) {
            let tol = match t.dtype() {
                DType::F16 => 2e-3,
                DType::F32 => 1e-4,
                _ => 0.0,
            };
            for (i, (a, b)) in gv.iter().zip(wv).enumerate() {
                let ok = (a.is_nan() && b.is_nan()) || (a - b).abs() <= tol * (1.0 + b.abs());
                if !ok {
                    return Err(format!("{name}: element {i} is {a}, reference {b}"));
                }
                checked += 1;
            }
        }
    }
    Ok(checked)
}

fn main() -> ExitCode {
    let adapters = Device::list();
    println!("Tessera {} — {} wgpu adapter(s)\n", env!("CARGO_PKG_VERSION"), adapters.len());
    let mut all_pass = true;
    match Device::new() {
        Ok(d) => println!("Device::new() picks {} ({}): {}\n", d.info().name, d.info().backend, d.info().placement),
        Err(e) => {
            all_pass = false;
            println!("Device::new() fails: {e}\n");
        }
    }
    let t0 = Instant::now();
    let cpu = Device::cpu();
    println!("[cpu] {}", cpu.info().name);
    match compare(&cpu) {
        Ok(n) => println!("    self-check   PASS  ({n} values, {:.0} ms)\n", t0.elapsed().as_secs_f64() * 1e3),
        Err(e) => {
            all_pass = false;
            println!("    self-check   FAIL  ({e})\n");
        }
    }
    if adapters.is_empty() {
        println!(
            "No GPU adapter: the CPU backend runs everything. On Linux, Mesa's lavapipe gives a software one \
             (apt-get install mesa-vulkan-drivers libvulkan1).\n"
        );
    }
    for a in &adapters {
        let c = &a.capabilities;
        println!("[{}] {}", a.index, a.name);
        println!("    backend      {}  ({})", a.backend, a.device_type);
        if !a.driver.is_empty() {
            println!("    driver       {}", a.driver);
        }
        println!(
            "    features     shader-f16: {}  subgroups: {}{}  timestamp-query: {}",
            c.shader_f16,
            c.subgroups,
            if c.subgroups {
                format!(" (size {}..{})", c.subgroup_min_size, c.subgroup_max_size)
            } else {
                String::new()
            },
            c.timestamp_query
        );
        println!(
            "    limits       storage binding {} MiB, buffer {} MiB, {} storage buffers/stage, {} workgroups/dim, {} invocations, {} KiB workgroup memory",
            c.max_storage_buffer_binding_size >> 20,
            c.max_buffer_size >> 20,
            c.max_storage_buffers_per_shader_stage,
            c.max_compute_workgroups_per_dimension,
            c.max_compute_invocations_per_workgroup,
            c.max_compute_workgroup_storage_size >> 10
        );
        let mut modes = vec![false];
        if c.shader_f16 || c.subgroups {
            modes.push(true);
        }
        for fallback in modes {
            let t0 = Instant::now();
            let opened = Device::with_options(DeviceOptions {
                adapter_index: Some(a.index),
                force_fallback: fallback,
                ..Default::default()
            });
            let path = if fallback { "fallback paths" } else { "native paths" };
            match opened.map_err(|e| e.to_string()).and_then(|d| compare(&d).map(|n| (n, d.stats()))) {
                Ok((n, s)) => println!(
                    "    self-check   PASS  ({path}: {n} values, {} kernels, {} pipelines, {:.0} ms)",
                    s.kernels_dispatched,
                    s.pipelines_compiled,
                    t0.elapsed().as_secs_f64() * 1e3
                ),
                Err(e) => {
                    all_pass = false;
                    println!("    self-check   FAIL  ({path}: {e})");
                }
            }
        }
        println!();
    }
    if all_pass {
        println!("PASS");
        ExitCode::SUCCESS
    } else {
        println!("FAIL");
        ExitCode::FAILURE
    }
}
