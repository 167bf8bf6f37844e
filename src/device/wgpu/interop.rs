//! Sharing memory with the application that owns the wgpu device: its buffers wrapped
//! as tensors in place, and the pass that writes a realised tensor into its storage
//! texture inside the realisation's own command encoder (so one submit).

use super::pool::PooledBuffer;
use super::{GpuContext, GpuStorage};
use crate::{Error, Result};
use std::sync::Arc;

/// Where `Tensor::write_to_texture` puts a tensor: the texture, the tensor's
/// `[H, W, C]` extent and the colormap (0 grayscale, 1 viridis).
pub(crate) struct TextureSink {
    pub texture: wgpu::Texture,
    pub hwc: (u32, u32, u32),
    pub colormap: u32,
}

impl GpuContext {
    /// An application's buffer as a tensor's storage, used in place.
    pub fn wrap(&self, buffer: wgpu::Buffer) -> GpuStorage {
        GpuStorage { buffer: Arc::new(self.pool.borrow(buffer)), checks: Vec::new() }
    }

    /// Encode the texture write of `src` (the realised f32 values) into `encoder`.
    /// Returns the parameter buffer, which the caller keeps until it has submitted.
    pub(crate) fn encode_texture_write(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        src: &PooledBuffer,
        sink: &TextureSink,
    ) -> Result<PooledBuffer> {
        let format = sink.texture.format();
        let source = crate::kernels::texture::render(format)
            .ok_or_else(|| Error::Unsupported(format!("write_to_texture: a {format:?} texture")))?;
        let (pipeline, scope) = self.pipeline("texture_write", &source, false);
        if let Some(scope) = scope {
            // A kernel that does not compile shows up as a validation error of the
            // realisation's own scope too; nothing to await here.
            drop(scope.pop());
        }
        let (h, w, c) = sink.hwc;
        let words: Vec<u8> = [h, w, c, sink.colormap].iter().flat_map(|v| v.to_le_bytes()).collect();
        let meta = self.pool.get(&self.device, 16, wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST)?;
        self.queue.write_buffer(meta.buffer(), 0, &words);
        let view = sink.texture.create_view(&wgpu::TextureViewDescriptor::default());
        let bytes = u64::from(h) * u64::from(w) * u64::from(c) * 4;
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("texture_write"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: meta.buffer().as_entire_binding() },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: src.buffer(),
                        offset: 0,
                        size: wgpu::BufferSize::new(bytes),
                    }),
                },
                wgpu::BindGroupEntry { binding: 2, resource: wgpu::BindingResource::TextureView(&view) },
            ],
        });
        let mut pass = encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("texture_write"), timestamp_writes: None });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(w.div_ceil(8), h.div_ceil(8), 1);
        drop(pass);
        Ok(meta)
    }
}
