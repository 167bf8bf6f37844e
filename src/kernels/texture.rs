//! The kernel that writes a tensor into an application's storage texture
//! (`shaders/texture.wgsl`), used by `Tensor::write_to_texture`.

/// Storage texture formats the kernel writes.
pub const FORMATS: [(wgpu::TextureFormat, &str); 2] =
    [(wgpu::TextureFormat::Rgba8Unorm, "rgba8unorm"), (wgpu::TextureFormat::Rgba16Float, "rgba16float")];

/// The WGSL for a texture of `format` (`None` for a format the kernel does not write).
pub fn render(format: wgpu::TextureFormat) -> Option<String> {
    let (_, name) = FORMATS.iter().find(|(f, _)| *f == format)?;
    Some(format!("@group(0) @binding(2) var dst: texture_storage_2d<{name}, write>;\n{}", super::sources::TEXTURE))
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_format_validates_with_naga() {
        for (format, _) in super::FORMATS {
            let src = super::render(format).unwrap();
            let module = naga::front::wgsl::parse_str(&src).unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
            naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::empty())
                .validate(&module)
                .unwrap_or_else(|e| panic!("{format:?}: {e:?}"));
        }
        assert!(super::render(wgpu::TextureFormat::Bgra8Unorm).is_none());
    }
}
