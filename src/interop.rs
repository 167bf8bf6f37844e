//! Sharing one wgpu device with the application that renders: [`Device::from_wgpu`]
//! takes the application's device and queue, [`Tensor::from_wgpu_buffer`] wraps one of
//! its buffers in place, [`Tensor::wgpu_buffer`] lends a realised tensor's buffer, and
//! [`Tensor::write_to_texture`] writes a tensor into one of its storage textures, in
//! the same submit as the kernels that compute it. No value goes through the CPU.
//!
//! The application and Tessera must link the same wgpu major version (Tessera's is
//! `tessera::wgpu`): wgpu types of two major versions are different types, and the
//! compiler refuses them. eframe and egui-wgpu 0.37 use wgpu 30, as Tessera does.
//!
//! [`Device::from_wgpu`]: crate::Device::from_wgpu

use crate::device::wgpu::{interop::TextureSink, GpuStorage};
use crate::device::{Backend, Storage};
use crate::{DType, Device, Error, Result, Shape, Tensor};
use std::sync::Arc;

/// How one channel maps to a colour in [`Tensor::write_to_texture`]. Values are
/// clamped to [0, 1] first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Colormap {
    /// `(v, v, v, 1)`.
    Grayscale,
    /// Matplotlib's viridis, linear between five anchors.
    Viridis,
}

impl Colormap {
    /// The RGBA colour of `v`, as the kernel computes it.
    pub fn rgba(self, v: f32) -> [f32; 4] {
        let v = v.clamp(0.0, 1.0);
        match self {
            Colormap::Grayscale => [v, v, v, 1.0],
            Colormap::Viridis => {
                const A: [[f32; 3]; 5] = [
                    [0.267, 0.005, 0.329],
                    [0.230, 0.322, 0.546],
                    [0.128, 0.567, 0.551],
                    [0.369, 0.789, 0.383],
                    [0.993, 0.906, 0.144],
                ];
                let s = v * 4.0;
                let i = (s as usize).min(3);
                let f = s - i as f32;
                let c = |k: usize| A[i][k] + (A[i + 1][k] - A[i][k]) * f;
                [c(0), c(1), c(2), 1.0]
            }
        }
    }
}

/// A realised tensor's storage buffer, lent to the application: the values are
/// `size` bytes from `offset`, row-major at the tensor's dtype (f16 as IEEE halves,
/// bool as one u32 per element), and the buffer holds `size` rounded up to whole
/// 4-byte words (what wgpu's copies move). The tensor's memory stays reserved while
/// this lives.
pub struct WgpuBuffer {
    buffer: wgpu::Buffer,
    size: u64,
    _storage: Arc<GpuStorage>,
}

impl WgpuBuffer {
    /// The buffer (the same wgpu buffer Tessera's kernels read and write).
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Where the tensor's values start in [`WgpuBuffer::buffer`].
    pub fn offset(&self) -> u64 {
        0
    }

    /// The bytes of the tensor's values.
    pub fn size(&self) -> u64 {
        self.size
    }
}

fn gpu_of<'a>(dev: &'a Device, op: &str) -> Result<&'a crate::device::wgpu::GpuContext> {
    match &dev.0.backend {
        Backend::Gpu(g) => Ok(g),
        _ => Err(Error::Unsupported(format!("{op} needs a wgpu device; this one is {dev}"))),
    }
}

impl Tensor {
    /// Wrap an application's buffer as a tensor of `shape` and `dtype`, without a copy:
    /// its first bytes are the values, row-major. The buffer must belong to `dev`'s
    /// wgpu device (made with [`Device::from_wgpu`]) and have `STORAGE` and `COPY_SRC`
    /// usage. Tessera reads it when a graph that uses the tensor is realised; writing
    /// it from the application in between changes what later realisations see.
    pub fn from_wgpu_buffer(
        buffer: &wgpu::Buffer,
        shape: impl Into<Shape>,
        dtype: DType,
        dev: &Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let g = gpu_of(dev, "from_wgpu_buffer")?;
        if dtype.is_quantized() {
            return Err(Error::Unsupported(format!(
                "from_wgpu_buffer: {dtype} (wrap f32, f16, i32, u32 or bool values)"
            )));
        }
        let usage = buffer.usage();
        let need = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        if !usage.contains(need) {
            return Err(Error::InvalidArgument {
                op: "from_wgpu_buffer",
                detail: format!("the buffer's usage {usage:?} lacks STORAGE or COPY_SRC"),
                location: std::panic::Location::caller(),
            });
        }
        let n = shape.checked_numel().ok_or_else(|| Error::InvalidArgument {
            op: "from_wgpu_buffer",
            detail: format!("shape {shape} overflows"),
            location: std::panic::Location::caller(),
        })?;
        let bytes = dtype.storage_bytes(n);
        if bytes > buffer.size() {
            return Err(Error::InvalidArgument {
                op: "from_wgpu_buffer",
                detail: format!("{shape} in {dtype} needs {bytes} bytes; the buffer has {}", buffer.size()),
                location: std::panic::Location::caller(),
            });
        }
        Ok(Tensor::from_storage(Storage::Gpu(Arc::new(g.wrap(buffer.clone()))), shape, dtype, dev))
    }

    /// The storage buffer of this realised tensor, lent to the application (call
    /// [`Tensor::realize`] first). Reading it in a later submit of the same queue sees
    /// the values; writing it changes what later realisations read of this tensor (and
    /// of views that share its buffer).
    pub fn wgpu_buffer(&self) -> Result<WgpuBuffer> {
        self.check()?;
        gpu_of(self.device(), "wgpu_buffer")?;
        match self.storage() {
            Some(Storage::Gpu(s)) => {
                // No texture copy of it is kept from now on: the application may write it.
                #[cfg(not(target_arch = "wasm32"))]
                s.buffer.lend();
                Ok(WgpuBuffer {
                    buffer: s.buffer.buffer().clone(),
                    size: self.dtype().storage_bytes(self.numel()),
                    _storage: s,
                })
            }
            _ => Err(Error::Unsupported(format!(
                "wgpu_buffer: tensor {} is not realised yet (call realize() first)",
                self.id()
            ))),
        }
    }

    /// Write this `[H, W]` or `[H, W, C]` tensor (C = 1, 3 or 4) into `texture`, an
    /// `Rgba8Unorm` or `Rgba16Float` 2-D texture of `W x H` with `STORAGE_BINDING`
    /// usage on the same wgpu device. One channel goes through `colormap` (grayscale
    /// when `None`); three or four are written as RGB(A). Values are clamped to [0, 1].
    /// The write is one more kernel in the submit that computes the tensor.
    pub async fn write_to_texture(&self, texture: &wgpu::Texture, colormap: Option<Colormap>) -> Result<()> {
        self.check()?;
        let dev = self.device();
        let g = gpu_of(dev, "write_to_texture")?;
        let bad = |detail: String| Error::InvalidArgument {
            op: "write_to_texture",
            detail,
            location: std::panic::Location::caller(),
        };
        let d = self.dims();
        let (h, w, c) = match d {
            [h, w] => (*h, *w, 1),
            [h, w, c] if matches!(c, 1 | 3 | 4) => (*h, *w, *c),
            _ => return Err(bad(format!("the tensor is {d:?}; it must be [H, W] or [H, W, C] with C = 1, 3 or 4"))),
        };
        if c > 1 && colormap.is_some() {
            return Err(bad(format!("a colormap maps one channel; the tensor has {c}")));
        }
        let size = texture.size();
        if texture.dimension() != wgpu::TextureDimension::D2
            || size.depth_or_array_layers != 1
            || size.width as usize != w
            || size.height as usize != h
        {
            return Err(bad(format!(
                "the texture is {}x{}x{} ({:?}); the tensor needs {w}x{h}",
                size.width,
                size.height,
                size.depth_or_array_layers,
                texture.dimension()
            )));
        }
        if !texture.usage().contains(wgpu::TextureUsages::STORAGE_BINDING) {
            return Err(bad(format!("the texture's usage {:?} lacks STORAGE_BINDING", texture.usage())));
        }
        if crate::kernels::texture::render(texture.format()).is_none() {
            return Err(bad(format!("a {:?} texture (use Rgba8Unorm or Rgba16Float)", texture.format())));
        }
        let bytes = (h * w * c * 4) as u64;
        if bytes > g.info.capabilities.max_storage_buffer_binding_size {
            return Err(Error::Limit {
                what: format!("write_to_texture of a {d:?} tensor ({bytes} bytes of f32)"),
                needed: bytes,
                limit: g.info.capabilities.max_storage_buffer_binding_size,
            });
        }
        let values = if self.dtype() == DType::F32 { self.clone() } else { self.cast(DType::F32) };
        let sink = TextureSink {
            texture: texture.clone(),
            hwc: (h as u32, w as u32, c as u32),
            colormap: u32::from(colormap == Some(Colormap::Viridis)),
        };
        dev.realize_with_sink(&values, &sink).await
    }

    /// Blocking [`Tensor::write_to_texture`] (native only).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn write_to_texture_blocking(&self, texture: &wgpu::Texture, colormap: Option<Colormap>) -> Result<()> {
        pollster::block_on(self.write_to_texture(texture, colormap))
    }
}
