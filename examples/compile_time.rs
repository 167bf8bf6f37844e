// Scratch (not committed): time lavapipe's pipeline creation for WGSL files.
fn main() {
    let d = tessera::Device::with_options(tessera::DeviceOptions { adapter: Some("gpu".into()), ..Default::default() })
        .unwrap();
    let (dev, _q) = d.wgpu().unwrap();
    for f in std::env::args().skip(1) {
        let src = std::fs::read_to_string(&f).unwrap();
        let t = std::time::Instant::now();
        let m = dev.create_shader_module(tessera::wgpu::ShaderModuleDescriptor {
            label: None,
            source: tessera::wgpu::ShaderSource::Wgsl(src.into()),
        });
        let _p = dev.create_compute_pipeline(&tessera::wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &m,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        println!("{:8.2} s  {}", t.elapsed().as_secs_f64(), f);
    }
}
