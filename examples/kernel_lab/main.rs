//! A kernel lab for WGSL variants (as llm.c's `dev/cuda`): load a WGSL file from disk,
//! run it on a Vulkan adapter over random inputs, check a product against the host, then
//! time it. Edit the WGSL and rerun; nothing recompiles. See README.md beside this file
//! for the binding convention, the options, and what it showed on lavapipe.
//!
//! `cargo run --release --example kernel_lab -- examples/kernel_lab/kernels/matmul_rows.wgsl --const TM=8 --const LANES=64 --bm 8 --bn 256`

use std::time::Instant;
use tessera::wgpu;
use wgpu::util::DeviceExt;

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.into())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kernel_lab: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let file = args
        .first()
        .cloned()
        .ok_or("usage: kernel_lab FILE.wgsl [--m M --n N --k K --bm BM --bn BN] (see README.md)")?;
    let num = |n: &str, d: &str| arg(&args, n, d).parse::<u32>().map_err(|e| format!("{n}: {e}"));
    let (m, n, k) = (num("--m", "1024")?, num("--n", "1024")?, num("--k", "1024")?);
    let (bm, bn) = (num("--bm", "8")?, num("--bn", "256")?);
    let iters = num("--iters", "10")?.max(1);
    let b_layout = arg(&args, "--b", "kn");
    let mut header = String::new();
    for (i, a) in args.iter().enumerate() {
        if a == "--const" {
            let (name, v) = args.get(i + 1).and_then(|a| a.split_once('=')).ok_or("--const takes NAME=VALUE")?;
            header.push_str(&format!("const {name}: u32 = {v}u;\n"));
        }
    }
    let src = header + &std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?;

    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    let instance = wgpu::Instance::new(desc);
    let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions::default()))
        .map_err(|e| format!("no Vulkan adapter ({e}): install lavapipe with scripts/setup.sh"))?;
    let limits = adapter.limits();
    eprintln!(
        "adapter: {} (per stage: {} storage buffers, {} storage textures, {} sampled textures)",
        adapter.get_info().name,
        limits.max_storage_buffers_per_shader_stage,
        limits.max_storage_textures_per_shader_stage,
        limits.max_sampled_textures_per_shader_stage
    );
    if std::env::var("LAB_LIMITS").is_ok() {
        eprintln!("{:#?}", adapter.limits());
    }
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: adapter.features()
            & (wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16 | wgpu::Features::SHADER_INT64),
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .map_err(|e| format!("device: {e}"))?;
    // A kernel that does not compile: wgpu's message, not its default panic.
    device.on_uncaptured_error(std::sync::Arc::new(|e: wgpu::Error| {
        eprintln!("kernel_lab: {e}");
        std::process::exit(1);
    }));

    let mut seed = 1u64;
    let mut rnd = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    };
    let (mu, nu, ku) = (m as usize, n as usize, k as usize);
    // `--a-len`/`--out-len` size A and C for kernels that are not products (the check
    // then does not apply).
    let a_len = arg(&args, "--a-len", "0").parse::<usize>().unwrap_or(0);
    let out_len = arg(&args, "--out-len", "0").parse::<usize>().unwrap_or(0);
    // `--b-len` sizes B for a kernel that rereads a window of it (a 64 KiB uniform B).
    let b_len = arg(&args, "--b-len", "0").parse::<usize>().unwrap_or(0);
    let a = rnd(if a_len > 0 { a_len } else { mu * ku });
    let b = rnd(if b_len > 0 { b_len } else { ku * nu });
    // B as stored: [K, N] or [N, K].
    let b_stored: Vec<f32> = if b_len > 0 {
        b.clone()
    } else if b_layout == "nk" {
        (0..nu * ku).map(|i| b[(i % ku) * nu + i / ku]).collect()
    } else {
        b.clone()
    };
    let params = [m, n, k, 0u32];
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let pbuf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&params),
        usage: wgpu::BufferUsages::UNIFORM,
    });
    let abuf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&a),
        usage,
    });
    let bbuf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: None,
        contents: bytemuck::cast_slice(&b_stored),
        // A kernel may bind a B of up to 64 KiB as a uniform buffer.
        usage: if b_stored.len() * 4 <= 65536 { usage | wgpu::BufferUsages::UNIFORM } else { usage },
    });
    let cbytes = (if out_len > 0 { out_len } else { mu * nu } * 4) as u64;
    let cbuf =
        device.create_buffer(&wgpu::BufferDescriptor { label: None, size: cbytes, usage, mapped_at_creation: false });
    let read = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: cbytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let t0 = Instant::now();
    let desc = wgpu::ShaderModuleDescriptor { label: None, source: wgpu::ShaderSource::Wgsl(src.into()) };
    // `--unchecked`: without naga's bounds checks, as the engine compiles its trusted kernels.
    let module = if args.iter().any(|a| a == "--unchecked") {
        // SAFETY: a lab kernel's author vouches for its indexing; the lab is never run on input it did not make.
        unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
    } else {
        device.create_shader_module(desc)
    };
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let layout = pipeline.get_bind_group_layout(0);
    // `--tex-a W` / `--tex-out W`: A read from, or C written to, an rgba32float texture W
    // texels wide, staged by a copy inside every timed run.
    let tex = |w: u32, len: usize, usage: wgpu::TextureUsages| {
        let h = (len / 4) as u32 / w.max(1);
        let t = device.create_texture(&wgpu::TextureDescriptor {
            label: None,
            size: wgpu::Extent3d { width: w, height: h, depth_or_array_layers: 1 },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Float,
            usage,
            view_formats: &[],
        });
        let v = t.create_view(&Default::default());
        (t, v, w, h)
    };
    let tex_a = num("--tex-a", "0")?;
    let tex_b = num("--tex-b", "0")?;
    let tex_out = num("--tex-out", "0")?;
    // (Also storage-bindable, so a kernel may declare them `texture_storage_2d<rgba32float, read>`.)
    let sampled =
        wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::COPY_DST;
    let ta = (tex_a > 0).then(|| tex(tex_a, a.len(), sampled));
    let tb = (tex_b > 0).then(|| tex(tex_b, b_stored.len(), sampled));
    let tc = (tex_out > 0).then(|| {
        tex(tex_out, cbytes as usize / 4, wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::COPY_SRC)
    });
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &layout,
        entries: &[
            wgpu::BindGroupEntry { binding: 0, resource: pbuf.as_entire_binding() },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: match &tc {
                    Some(t) => wgpu::BindingResource::TextureView(&t.1),
                    None => cbuf.as_entire_binding(),
                },
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: match &ta {
                    Some(t) => wgpu::BindingResource::TextureView(&t.1),
                    None => abuf.as_entire_binding(),
                },
            },
            wgpu::BindGroupEntry {
                binding: 3,
                resource: match &tb {
                    Some(t) => wgpu::BindingResource::TextureView(&t.1),
                    None => bbuf.as_entire_binding(),
                },
            },
        ],
    });
    let groups = match arg(&args, "--groups", "").split(',').map(|g| g.parse::<u32>()).collect::<Vec<_>>()[..] {
        [Ok(x), Ok(y), Ok(z)] => [x, y, z],
        _ => [n.div_ceil(bn), m.div_ceil(bm), 1],
    };
    let run = |copy: bool| {
        let mut enc = device.create_command_encoder(&Default::default());
        for (t, w, h, buf) in
            ta.iter().map(|t| (&t.0, t.2, t.3, &abuf)).chain(tb.iter().map(|t| (&t.0, t.2, t.3, &bbuf)))
        {
            enc.copy_buffer_to_texture(
                wgpu::TexelCopyBufferInfo {
                    buffer: buf,
                    layout: wgpu::TexelCopyBufferLayout {
                        offset: 0,
                        bytes_per_row: Some(w * 16),
                        rows_per_image: None,
                    },
                },
                t.as_image_copy(),
                wgpu::Extent3d { width: w, height: h, depth_or_array_layers: 1 },
            );
        }
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        }
        if let Some((t, _, w, h)) = &tc {
            enc.copy_texture_to_buffer(
                t.as_image_copy(),
                wgpu::TexelCopyBufferInfo {
                    buffer: &cbuf,
                    layout: wgpu::TexelCopyBufferLayout {
                        offset: 0,
                        bytes_per_row: Some(w * 16),
                        rows_per_image: None,
                    },
                },
                wgpu::Extent3d { width: *w, height: *h, depth_or_array_layers: 1 },
            );
        }
        if copy {
            enc.copy_buffer_to_buffer(&cbuf, 0, &read, 0, cbytes);
        }
        queue.submit([enc.finish()]);
        let _ = device.poll(wgpu::PollType::wait_indefinitely());
    };
    run(true);
    eprintln!("first run (compile + run): {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    let slice = read.slice(..);
    slice.map_async(wgpu::MapMode::Read, |_| {});
    device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| format!("poll: {e}"))?;
    let c: Vec<f32> = bytemuck::cast_slice(&slice.get_mapped_range().map_err(|e| format!("map: {e}"))?).to_vec();
    read.unmap();
    // Check a sample of entries (every one for small products).
    let mut worst = 0f64;
    let step = ((mu * nu) / 20000).max(1);
    let checked = if out_len > 0 || a_len > 0 || b_len > 0 { 0 } else { mu * nu };
    for idx in (0..checked).step_by(step).chain([checked.max(1) - 1]).filter(|_| checked > 0) {
        let (r, col) = (idx / nu, idx % nu);
        let want: f64 = (0..ku).map(|j| a[r * ku + j] as f64 * b[j * nu + col] as f64).sum();
        worst = worst.max((c[idx] as f64 - want).abs());
    }
    let ok = worst < 1e-3 * (ku as f64).sqrt();
    let mut times = Vec::new();
    for _ in 0..iters {
        let t = Instant::now();
        run(false);
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    let gflops = 2.0 * mu as f64 * nu as f64 * ku as f64 / med / 1e9;
    println!(
        "{file} {m}x{n}x{k} bm={bm} bn={bn}: {:.2} ms median, {gflops:.2} GFLOP/s, max err {worst:.2e} {}",
        med * 1e3,
        if ok { "OK" } else { "WRONG" }
    );
    Ok(())
}
