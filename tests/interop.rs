//! Sharing a wgpu device with an application, as an application would: its own wgpu
//! instance, adapter and device (the first adapter, lavapipe in CI) wrapped with
//! `Device::from_wgpu`; its buffers wrapped in place; a realised tensor's buffer read
//! by its own copy; tensors written into its storage textures in one submit, checked
//! texel by texel against the host's colormap.

mod common;

use tessera::interop::Colormap;
use tessera::wgpu;
use tessera::{DType, Device, Tensor};

/// The application's device and queue, on the first adapter Tessera lists.
fn app() -> (wgpu::Device, wgpu::Queue) {
    app_with(Ask::Defaults)
}

/// What the application's device is created with.
#[derive(Clone, Copy)]
enum Ask {
    /// wgpu's defaults: no optional feature, WebGPU's limits.
    Defaults,
    /// Every feature of the adapter that needs no opt-in (wgpu refuses its experimental
    /// ones, such as Mesa 25's ray queries, unless the device enables them), and every
    /// limit.
    Everything,
    /// `Device::wgpu_requirements`.
    Requirements,
}

/// The application's device on the adapter Tessera would pick, made by a fresh wgpu
/// instance as an application's own would be.
fn app_with(ask: Ask) -> (wgpu::Device, wgpu::Queue) {
    let first = Device::list().into_iter().next().unwrap_or_else(|| {
        panic!("no GPU adapter: install Mesa's lavapipe (scripts/setup.sh); these tests need a wgpu device")
    });
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = wgpu::Backends::all();
    let instance = wgpu::Instance::new(desc);
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    let adapter = adapters
        .into_iter()
        .find(|a| a.get_info().name == first.name)
        .unwrap_or_else(|| panic!("adapter {} not found by a fresh wgpu instance", first.name));
    let mut descriptor = wgpu::DeviceDescriptor::default();
    match ask {
        Ask::Defaults => {}
        Ask::Everything => {
            descriptor.required_features = adapter.features() - wgpu::Features::all_experimental_mask();
            descriptor.required_limits = adapter.limits();
        }
        Ask::Requirements => {
            (descriptor.required_features, descriptor.required_limits) = Device::wgpu_requirements(&adapter);
        }
    }
    pollster::block_on(adapter.request_device(&descriptor))
        .unwrap_or_else(|e| panic!("{}: request_device: {e}", first.name))
}

/// Read `bytes` of `buffer` with the application's own copy and map.
fn read_buffer(device: &wgpu::Device, queue: &wgpu::Queue, buffer: &wgpu::Buffer, offset: u64, bytes: u64) -> Vec<u8> {
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("app staging"),
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buffer, offset, &staging, 0, bytes);
    queue.submit(Some(enc.finish()));
    staging.slice(..).map_async(wgpu::MapMode::Read, |r| r.expect("map"));
    device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
    let v = staging.slice(..).get_mapped_range().expect("mapped").to_vec();
    staging.unmap();
    v
}

fn texture(device: &wgpu::Device, w: u32, h: u32, format: wgpu::TextureFormat) -> wgpu::Texture {
    device.create_texture(&wgpu::TextureDescriptor {
        label: Some("app texture"),
        size: wgpu::Extent3d { width: w, height: h, depth_or_array_layers: 1 },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format,
        usage: wgpu::TextureUsages::STORAGE_BINDING
            | wgpu::TextureUsages::COPY_SRC
            | wgpu::TextureUsages::TEXTURE_BINDING,
        view_formats: &[],
    })
}

/// The texture's texels as RGBA f32.
fn read_texture(device: &wgpu::Device, queue: &wgpu::Queue, tex: &wgpu::Texture) -> Vec<[f32; 4]> {
    let (w, h) = (tex.width(), tex.height());
    let texel = if tex.format() == wgpu::TextureFormat::Rgba8Unorm { 4 } else { 8 };
    let row = (w * texel).next_multiple_of(256);
    let staging = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("app texture staging"),
        size: (row * h) as u64,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_texture_to_buffer(
        tex.as_image_copy(),
        wgpu::TexelCopyBufferInfo {
            buffer: &staging,
            layout: wgpu::TexelCopyBufferLayout { offset: 0, bytes_per_row: Some(row), rows_per_image: Some(h) },
        },
        tex.size(),
    );
    queue.submit(Some(enc.finish()));
    staging.slice(..).map_async(wgpu::MapMode::Read, |r| r.expect("map"));
    device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
    let data = staging.slice(..).get_mapped_range().expect("mapped").to_vec();
    staging.unmap();
    let mut out = Vec::new();
    for y in 0..h as usize {
        for x in 0..w as usize {
            let o = y * row as usize + x * texel as usize;
            out.push(if texel == 4 {
                [0, 1, 2, 3].map(|k| data[o + k] as f32 / 255.0)
            } else {
                [0, 1, 2, 3].map(|k| tessera::f16::from_le_bytes([data[o + 2 * k], data[o + 2 * k + 1]]).to_f32())
            });
        }
    }
    out
}

#[test]
fn an_application_buffer_is_a_tensor_in_place() {
    let (device, queue) = app();
    let dev = Device::from_wgpu(device.clone(), queue.clone());
    common::record(&dev);
    let vals: Vec<f32> = (0..37).map(|i| i as f32 * 0.5 - 3.0).collect();
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("app data"),
        size: 256,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&vals));
    let t = Tensor::from_wgpu_buffer(&buffer, [37], DType::F32, &dev).unwrap();
    let y = t.mul_scalar(2.0).add_scalar(1.0).to_vec_blocking::<f32>().unwrap();
    assert_eq!(y, vals.iter().map(|v| v * 2.0 + 1.0).collect::<Vec<_>>());
    // In place, not copied: the application's later write is what the next graph reads.
    queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&[100f32]));
    assert_eq!(t.narrow(0, 0, 1).to_vec_blocking::<f32>().unwrap(), [100.0]);
    // The wrapped buffer is never pooled: dropping the tensor leaves it to the application.
    drop(t);
    assert_eq!(read_buffer(&device, &queue, &buffer, 4, 4), (-2.5f32).to_le_bytes());

    // Bad wraps are errors that say why.
    let small = Tensor::from_wgpu_buffer(&buffer, [100], DType::F32, &dev).err().unwrap().to_string();
    assert!(small.contains("needs 400 bytes; the buffer has 256"), "{small}");
    let uniform = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 64,
        usage: wgpu::BufferUsages::UNIFORM,
        mapped_at_creation: false,
    });
    let e = Tensor::from_wgpu_buffer(&uniform, [4], DType::F32, &dev).err().unwrap().to_string();
    assert!(e.contains("lacks STORAGE or COPY_SRC"), "{e}");
    let e = Tensor::from_wgpu_buffer(&buffer, [32], DType::Q8_0, &dev).err().unwrap().to_string();
    assert!(e.contains("q8_0"), "{e}");
    let e = Tensor::from_wgpu_buffer(&buffer, [4], DType::F32, &Device::cpu()).err().unwrap().to_string();
    assert!(e.contains("needs a wgpu device"), "{e}");
}

#[test]
fn a_realised_tensor_lends_its_buffer() {
    let (device, queue) = app();
    let dev = Device::from_wgpu(device.clone(), queue.clone());
    common::record(&dev);
    let x = Tensor::randn([5, 7], 3, &dev);
    let y = x.mul(&x).sum(&[1], false).sqrt();
    assert!(y.wgpu_buffer().err().unwrap().to_string().contains("not realised yet"));
    y.realize_blocking().unwrap();
    let lent = y.wgpu_buffer().unwrap();
    assert_eq!(lent.size(), 20);
    let bytes = read_buffer(&device, &queue, lent.buffer(), lent.offset(), lent.size());
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
    assert_eq!(got, y.to_vec_blocking::<f32>().unwrap());
    // f16 values are IEEE halves.
    let h = y.cast(DType::F16);
    h.realize_blocking().unwrap();
    let lent = h.wgpu_buffer().unwrap();
    assert_eq!(lent.size(), 10, "five halves");
    // Copies move whole 4-byte words; the buffer always holds them.
    let mut bytes = read_buffer(&device, &queue, lent.buffer(), lent.offset(), lent.size().next_multiple_of(4));
    bytes.truncate(10);
    let halves: Vec<f32> = bytes.chunks_exact(2).map(|b| tessera::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
    assert_eq!(halves, h.to_vec_blocking::<tessera::f16>().unwrap().iter().map(|v| v.to_f32()).collect::<Vec<_>>());
    assert!(Tensor::ones([2], DType::F32, &Device::cpu()).wgpu_buffer().is_err());
}

#[test]
fn an_application_device_takes_the_kernels_of_its_adapter() {
    // `Device::from_wgpu` learns the adapter from the device and takes the features the
    // device was made with: with all of the adapter's, the capabilities Tessera's own
    // device would have; with wgpu's defaults, no optional feature.
    let first = Device::list().into_iter().next().expect("an adapter (app_with checked)");
    let (device, queue) = app_with(Ask::Everything);
    let dev = Device::from_wgpu(device, queue);
    let info = dev.info();
    assert_eq!(
        (info.name.as_str(), info.backend.as_str(), info.device_type.as_str()),
        (first.name.as_str(), first.backend.as_str(), first.device_type.as_str())
    );
    let (c, f) = (dev.capabilities(), &first.capabilities);
    assert_eq!(
        (c.shader_f16, c.subgroups, c.subgroup_min_size, c.subgroup_max_size),
        (f.shader_f16, f.subgroups, f.subgroup_min_size, f.subgroup_max_size)
    );
    assert_eq!(info.unrequested, Vec::<String>::new(), "nothing is missing from a device with every feature");
    let (device, queue) = app();
    let plain = Device::from_wgpu(device, queue);
    assert!(!plain.capabilities().subgroups && !plain.capabilities().shader_f16);
    // It says what its adapter offers that Tessera would have used.
    let missing = &plain.info().unrequested;
    let named = |what: &str| missing.iter().any(|m| m.starts_with(what));
    assert_eq!(named("SUBGROUP "), f.subgroups, "{missing:?}");
    assert_eq!(named("SHADER_F16 "), f.shader_f16, "{missing:?}");
    assert_eq!(named("TIMESTAMP_QUERY "), f.timestamp_query, "{missing:?}");
    assert_eq!(named("SHADER_INT64 "), first.device_type == "Cpu", "lavapipe has 64-bit integers: {missing:?}");
    // And each limit below the adapter's (lavapipe allows 32 storage buffers a stage
    // and 2 GiB buffers, wgpu's defaults 8 and 256 MiB).
    let defaults = wgpu::Limits::default();
    for (limit, below) in [
        (
            "max_storage_buffer_binding_size ",
            f.max_storage_buffer_binding_size > defaults.max_storage_buffer_binding_size,
        ),
        ("max_buffer_size ", f.max_buffer_size > defaults.max_buffer_size),
        (
            "max_storage_buffers_per_shader_stage ",
            f.max_storage_buffers_per_shader_stage > defaults.max_storage_buffers_per_shader_stage,
        ),
        (
            "max_compute_invocations_per_workgroup ",
            f.max_compute_invocations_per_workgroup > defaults.max_compute_invocations_per_workgroup,
        ),
    ] {
        assert_eq!(named(limit), below, "{limit}: {missing:?}");
    }
    // A device made with `Device::wgpu_requirements` misses nothing and has the
    // capabilities of Tessera's own, limits included.
    let (device, queue) = app_with(Ask::Requirements);
    let asked = Device::from_wgpu(device, queue);
    assert_eq!(asked.info().unrequested, Vec::<String>::new());
    assert_eq!(asked.capabilities(), f);
    // Both compute right (their kernels differ on a CPU adapter).
    for d in [&dev, &plain, &asked] {
        let x = Tensor::from_slice(&(0..96 * 64).map(|i| (i % 7) as f32 - 3.0).collect::<Vec<_>>(), [96, 64], d);
        let w = Tensor::from_slice(&(0..64 * 40).map(|i| (i % 5) as f32 - 2.0).collect::<Vec<_>>(), [64, 40], d);
        let got: Vec<f32> = (x.matmul(&w) * 0.5).relu().to_vec_blocking().unwrap();
        for (k, g) in got.iter().enumerate() {
            let (r, c) = (k / 40, k % 40);
            let dot: f32 = (0..64)
                .map(|j| ((r * 64 + j) % 7) as f32 - 3.0)
                .zip((0..64).map(|j| ((j * 40 + c) % 5) as f32 - 2.0))
                .map(|(a, b)| a * b)
                .sum();
            assert_eq!(*g, (dot * 0.5).max(0.0), "{}: element {k}", d.info().name);
        }
    }
}

#[test]
fn an_application_writing_a_lent_buffer_is_seen_by_later_realisations() {
    let (device, queue) = app_with(Ask::Everything);
    let dev = Device::from_wgpu(device.clone(), queue.clone());
    common::record(&dev);
    let x = Tensor::randn([4096], 5, &dev);
    x.realize_blocking().unwrap();
    let scaled = || {
        let before = dev.stats().operand_copies;
        let v = (&x * 3.0).to_vec_blocking::<f32>().unwrap();
        (v, dev.stats().operand_copies - before)
    };
    let (first, copied) = scaled();
    let (again, copied_again) = scaled();
    assert_eq!(first, again);
    // On a CPU adapter an application's device made with the adapter's features reads
    // operands through texture copies as Tessera's own does: the second kernel reads the
    // kept copy, and lending the buffer must drop it (`PooledBuffer::lend`).
    if dev.info().device_type == "Cpu" {
        assert!(copied > 0, "the first kernel reads x through a texture copy");
    }
    if copied > 0 {
        assert_eq!(copied_again, 0, "operand copies of the second kernel");
    }
    // The application overwrites x through the lent buffer.
    let lent = x.wgpu_buffer().unwrap();
    queue.write_buffer(lent.buffer(), lent.offset(), bytemuck::cast_slice(&[1f32; 4096]));
    let (after, _) = scaled();
    assert!(after.iter().all(|&v| v == 3.0), "3 x the written values: {:?}", &after[..4]);
}

#[test]
fn tensors_are_written_into_textures_in_their_own_submit() {
    let (device, queue) = app();
    let dev = Device::from_wgpu(device.clone(), queue.clone());
    common::record(&dev);
    let (h, w) = (13usize, 21usize);
    let vals: Vec<f32> = (0..h * w).map(|i| (i as f32 * 0.37).sin() * 0.7 + 0.4).collect(); // some outside [0, 1]
    for format in [wgpu::TextureFormat::Rgba8Unorm, wgpu::TextureFormat::Rgba16Float] {
        let tol = if format == wgpu::TextureFormat::Rgba8Unorm { 0.6 / 255.0 } else { 2e-3 };
        for map in [None, Some(Colormap::Grayscale), Some(Colormap::Viridis)] {
            let tex = texture(&device, w as u32, h as u32, format);
            // A fused expression: its kernel and the texture write share one submit.
            let x = Tensor::from_slice(&vals, [h, w], &dev);
            x.realize_blocking().unwrap();
            let before = dev.stats();
            x.mul_scalar(1.5).add_scalar(-0.2).write_to_texture_blocking(&tex, map).unwrap();
            let after = dev.stats();
            assert_eq!(after.submits - before.submits, 1, "{format:?} {map:?}: one submit");
            assert_eq!(
                after.kernels_dispatched - before.kernels_dispatched,
                2,
                "{format:?} {map:?}: the producer and the texture write"
            );
            let got = read_texture(&device, &queue, &tex);
            for (i, (g, v)) in got.iter().zip(&vals).enumerate() {
                let want = map.unwrap_or(Colormap::Grayscale).rgba(v * 1.5 - 0.2);
                for k in 0..4 {
                    assert!(
                        (g[k] - want[k]).abs() <= tol,
                        "{format:?} {map:?} texel {i} channel {k}: {} vs {}",
                        g[k],
                        want[k]
                    );
                }
            }
        }
    }
    // Three and four channels go in as RGB(A); an f16 tensor is cast on the way.
    let rgb: Vec<f32> = (0..h * w * 4).map(|i| (i % 11) as f32 / 10.0).collect();
    for c in [3usize, 4] {
        let tex = texture(&device, w as u32, h as u32, wgpu::TextureFormat::Rgba8Unorm);
        let t = Tensor::from_slice(&rgb[..h * w * c], [h, w, c], &dev).cast(DType::F16);
        t.write_to_texture_blocking(&tex, None).unwrap();
        let got = read_texture(&device, &queue, &tex);
        for (i, g) in got.iter().enumerate() {
            for k in 0..4 {
                let want = if k < c { rgb[i * c + k] } else { 1.0 };
                assert!((g[k] - want).abs() <= 1.0 / 255.0, "C={c} texel {i} channel {k}: {} vs {want}", g[k]);
            }
        }
    }
    // What does not fit is refused before anything runs.
    let tex = texture(&device, w as u32, h as u32, wgpu::TextureFormat::Rgba8Unorm);
    let e = |t: &Tensor, map| t.write_to_texture_blocking(&tex, map).err().unwrap().to_string();
    assert!(e(&Tensor::zeros([h + 1, w], DType::F32, &dev), None).contains("the tensor needs 21x14"));
    assert!(e(&Tensor::zeros([h, w, 2], DType::F32, &dev), None).contains("C = 1, 3 or 4"));
    assert!(e(&Tensor::zeros([h, w, 3], DType::F32, &dev), Some(Colormap::Viridis)).contains("maps one channel"));
    assert!(e(&Tensor::zeros([h, w], DType::F32, &Device::cpu()), None).contains("needs a wgpu device"));
    let sampled = device.create_texture(&wgpu::TextureDescriptor {
        label: None,
        size: wgpu::Extent3d { width: w as u32, height: h as u32, depth_or_array_layers: 1 },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba8Unorm,
        usage: wgpu::TextureUsages::TEXTURE_BINDING,
        view_formats: &[],
    });
    let e = Tensor::zeros([h, w], DType::F32, &dev).write_to_texture_blocking(&sampled, None).err().unwrap();
    assert!(e.to_string().contains("lacks STORAGE_BINDING"), "{e}");
}
