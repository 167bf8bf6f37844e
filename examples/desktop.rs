//! A desktop app (eframe on its wgpu renderer) that shares its GPU device with Tessera:
//! draw a digit with the mouse, and the MNIST CNN predicts as you draw, with the class
//! probabilities as bars and a saliency or Grad-CAM heatmap over the drawing. Tessera
//! runs on the device eframe created (`Device::from_wgpu` on its `RenderState`), and
//! writes the drawing and the heatmap straight into the textures egui draws
//! (`Tensor::write_to_texture`): no pixel goes through the CPU. A side panel shows
//! per-kernel GPU time (where the adapter has timestamp queries) and memory in use.
//!
//! ```text
//! cargo run --release --features desktop --example desktop
//! ```
//!
//! The CNN comes from the demo's checkpoint (`scripts/demo.sh --model cnn` writes
//! `checkpoints/mnist-cnn.safetensors`), or is trained in the app, with a progress
//! bar, when there is none. `--screenshot out.png` is the self-test that
//! `scripts/desktop_check.sh` runs under Xvfb: it draws a digit through injected mouse
//! input, waits for the prediction, saves a screenshot and a JSON report, checks the
//! prediction against the same weights on the CPU backend and that the heatmap is not
//! empty, and exits (non-zero when a check fails).

use clap::Parser;
use eframe::egui;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tessera::interop::Colormap;
use tessera::io::mnist::Mnist;
use tessera::models::mnist::{build, standardize, TRAIN};
use tessera::nn::{loss, Layer, Module, Sequential};
use tessera::optim::{Adam, Optimizer};
use tessera::wgpu;
use tessera::{Device, Tensor};

#[derive(Parser, Debug, Clone)]
#[command(about = "Draw a digit; the MNIST CNN predicts it and shows why, on the app's own GPU device")]
struct Args {
    #[arg(long, default_value = "checkpoints/mnist-cnn.safetensors")]
    checkpoint: PathBuf,
    #[arg(long, default_value = "data/mnist.bin")]
    data: PathBuf,
    /// Training steps when there is no checkpoint.
    #[arg(long, default_value_t = 600)]
    train_steps: usize,
    /// Self-test: draw a digit by injected input, save a screenshot here (and a JSON
    /// report next to it), check, exit.
    #[arg(long)]
    screenshot: Option<PathBuf>,
}

const SIDE: usize = 28;
const CANVAS: f32 = 336.0;

#[derive(Clone, Copy, PartialEq)]
enum Method {
    Saliency,
    GradCam,
}

/// A texture Tessera writes and egui draws.
struct Shared {
    texture: wgpu::Texture,
    id: egui::TextureId,
}

struct App {
    args: Args,
    dev: Device,
    model: Arc<Mutex<Option<Sequential>>>,
    trained: Arc<AtomicUsize>,
    failure: Arc<Mutex<Option<String>>>,
    canvas: Vec<f32>,
    last: Option<egui::Pos2>,
    dirty: bool,
    probs: Vec<f32>,
    pred: Option<usize>,
    heat: Option<Tensor>,
    method: Method,
    overlay: bool,
    drawing: Shared,
    heatmap: Shared,
    canvas_rect: Option<egui::Rect>,
    profile: Vec<(String, f64, usize)>,
    timestamps: bool,
    adapter: String,
    /// What eframe's device lacks that Tessera would use (empty: `wgpu_options` asks).
    unrequested: Vec<String>,
    selftest: SelfTest,
}

/// Where the injected-input self-test stands.
#[derive(Default)]
struct SelfTest {
    frame: usize,
    ready_frames: usize,
    stroke: Vec<egui::Pos2>,
    released: bool,
    requested: bool,
    done: Arc<Mutex<Option<Result<(), String>>>>,
}

fn shared_texture(rs: &eframe::egui_wgpu::RenderState, filter: wgpu::FilterMode) -> Shared {
    let texture = rs.device.create_texture(&wgpu::TextureDescriptor {
        label: Some("tessera output"),
        size: wgpu::Extent3d { width: SIDE as u32, height: SIDE as u32, depth_or_array_layers: 1 },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: wgpu::TextureFormat::Rgba8Unorm,
        usage: wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::TEXTURE_BINDING,
        view_formats: &[],
    });
    let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
    let id = rs.renderer.write().register_native_texture(&rs.device, &view, filter);
    Shared { texture, id }
}

impl App {
    fn new(cc: &eframe::CreationContext<'_>, args: Args) -> Result<App, String> {
        let rs = cc.wgpu_render_state.as_ref().ok_or("eframe did not start its wgpu renderer")?;
        // Tessera on the app's own device and queue.
        let dev = Device::from_wgpu(rs.device.clone(), rs.queue.clone());
        let timestamps = dev.info().capabilities.timestamp_query;
        // The adapter, and what the device it made gives Tessera's kernels.
        let info = dev.info();
        let unrequested = info.unrequested.clone();
        let adapter = format!(
            "{} ({}, {}, subgroups of {})",
            info.name, info.backend, info.device_type, info.capabilities.subgroup_min_size
        );
        if timestamps {
            tessera::profile::start();
        }
        let data = Mnist::load(&args.data).map_err(|e| e.to_string())?;
        let model = Arc::new(Mutex::new(None));
        let trained = Arc::new(AtomicUsize::new(0));
        let failure = Arc::new(Mutex::new(None));
        if args.checkpoint.exists() {
            let mut m = build("cnn", 1, &dev).map_err(|e| e.to_string())?;
            let mut opt = Adam::new(1e-3);
            tessera::io::checkpoint::load(&args.checkpoint, &mut m, &mut opt, &dev).map_err(|e| e.to_string())?;
            m.set_training(false);
            *model.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
        } else {
            let (model, trained, failure, dev, steps) =
                (model.clone(), trained.clone(), failure.clone(), dev.clone(), args.train_steps);
            let ctx = cc.egui_ctx.clone();
            std::thread::spawn(move || {
                if let Err(e) = train(&data, steps, &dev, &model, &trained, &ctx) {
                    *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                }
                ctx.request_repaint();
            });
        }
        let drawing = shared_texture(rs, wgpu::FilterMode::Nearest);
        let heatmap = shared_texture(rs, wgpu::FilterMode::Linear);
        Ok(App {
            args,
            dev,
            model,
            trained,
            failure,
            canvas: vec![0.0; SIDE * SIDE],
            last: None,
            dirty: true,
            probs: vec![0.0; 10],
            pred: None,
            heat: None,
            method: Method::Saliency,
            overlay: true,
            drawing,
            heatmap,
            canvas_rect: None,
            profile: Vec::new(),
            timestamps,
            adapter,
            unrequested,
            selftest: SelfTest::default(),
        })
    }

    /// Ink along the segment from `a` to `b` (canvas cells), with a soft round brush.
    fn ink(&mut self, a: egui::Pos2, b: egui::Pos2) {
        let steps = ((b - a).length() * 3.0).ceil().max(1.0) as usize;
        for s in 0..=steps {
            let p = a + (b - a) * (s as f32 / steps as f32);
            for y in 0..SIDE {
                for x in 0..SIDE {
                    let d = egui::vec2(x as f32 + 0.5 - p.x, y as f32 + 0.5 - p.y).length();
                    let v = (1.6 - d).clamp(0.0, 1.0);
                    let c = &mut self.canvas[y * SIDE + x];
                    *c = c.max(v);
                }
            }
        }
        self.dirty = true;
    }

    /// Predict the drawing, and write the drawing and the heatmap into their textures.
    fn update_prediction(&mut self) -> tessera::Result<()> {
        let guard = self.model.lock().unwrap_or_else(|e| e.into_inner());
        let Some(model) = guard.as_ref() else { return Ok(()) };
        let c = Tensor::from_slice(&self.canvas, [SIDE, SIDE], &self.dev);
        c.write_to_texture(&self.drawing.texture, Some(Colormap::Grayscale)).block()?;
        let x = Tensor::from_slice(&standardize(&self.canvas), [1, 1, SIDE, SIDE], &self.dev);
        let probs = {
            let _g = tessera::no_grad();
            model.forward(&x).softmax(-1).to_vec_blocking::<f32>()?
        };
        let pred = probs.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i).unwrap_or(0);
        let heat = match self.method {
            Method::Saliency => tessera::explain::saliency(model, &x, &[pred])?.reshape(vec![SIDE, SIDE]),
            Method::GradCam => {
                // Grad-CAM at the second convolution's ReLU (14x14), doubled to 28x28.
                let cam = tessera::explain::grad_cam(model, 4, &x, &[pred])?.reshape(vec![14, 1, 14, 1]);
                cam.broadcast_to(vec![14, 2, 14, 2]).reshape(vec![SIDE, SIDE])
            }
        };
        let heat = tessera::explain::normalize_map(&heat);
        heat.write_to_texture(&self.heatmap.texture, Some(Colormap::Viridis)).block()?;
        self.probs = probs;
        self.pred = Some(pred);
        self.heat = Some(heat);
        self.dirty = false;
        if self.timestamps {
            self.profile = tessera::profile::top(6);
            tessera::profile::stop();
            tessera::profile::start();
        }
        Ok(())
    }
}

/// Blocking on a future in the UI thread: the realisations here are small.
trait Block: std::future::Future + Sized {
    fn block(self) -> Self::Output {
        pollster::block_on(self)
    }
}
impl<F: std::future::Future> Block for F {}

fn train(
    data: &Mnist,
    steps: usize,
    dev: &Device,
    model: &Mutex<Option<Sequential>>,
    done: &AtomicUsize,
    ctx: &egui::Context,
) -> tessera::Result<()> {
    let mut m = build("cnn", 1, dev)?;
    let mut opt = Adam::new(1e-3);
    for s in 0..steps {
        let idx: Vec<usize> = (0..64).map(|i| (s * 64 + i * 7919) % TRAIN).collect();
        let x = Tensor::from_slice(&standardize(&data.images_f32(&idx)), [64, 1, SIDE, SIDE], dev);
        let y = Tensor::from_slice(&data.labels_i32(&idx), [64], dev);
        let l = loss::cross_entropy(&m.forward(&x), &y);
        opt.step(&mut m, &l)?;
        done.store(s + 1, Ordering::Relaxed);
        ctx.request_repaint();
    }
    m.set_training(false);
    *model.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
    Ok(())
}

impl eframe::App for App {
    fn raw_input_hook(&mut self, _ctx: &egui::Context, raw: &mut egui::RawInput) {
        // The self-test draws a "7" through the same pointer events a mouse sends.
        let ready = self.model.lock().map(|m| m.is_some()).unwrap_or(false);
        let (Some(_), Some(rect), true) = (&self.args.screenshot, self.canvas_rect, ready) else { return };
        let t = &mut self.selftest;
        // Start once the layout has settled (the training bar is gone).
        t.ready_frames += 1;
        if t.ready_frames < 5 {
            return;
        }
        if t.stroke.is_empty() && !t.released {
            let cell = |x: f32, y: f32| rect.min + egui::vec2(x, y) * (rect.width() / SIDE as f32);
            let pts = [(7.0, 6.0), (21.0, 6.0), (17.0, 14.0), (13.0, 23.0)];
            for w in pts.windows(2) {
                for k in 0..8 {
                    let f = k as f32 / 8.0;
                    t.stroke.push(cell(w[0].0 + (w[1].0 - w[0].0) * f, w[0].1 + (w[1].1 - w[0].1) * f));
                }
            }
            t.stroke.push(cell(13.0, 23.0));
            t.stroke.reverse();
            let p = *t.stroke.last().unwrap_or(&rect.center());
            raw.events.push(egui::Event::PointerMoved(p));
            raw.events.push(egui::Event::PointerButton {
                pos: p,
                button: egui::PointerButton::Primary,
                pressed: true,
                modifiers: Default::default(),
            });
            return;
        }
        if let Some(p) = t.stroke.pop() {
            raw.events.push(egui::Event::PointerMoved(p));
            if t.stroke.is_empty() {
                raw.events.push(egui::Event::PointerButton {
                    pos: p,
                    button: egui::PointerButton::Primary,
                    pressed: false,
                    modifiers: Default::default(),
                });
                t.released = true;
            }
        }
    }

    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        if let Some(e) = self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            egui::CentralPanel::default().show(ui, |ui| ui.colored_label(egui::Color32::RED, &e));
            if self.args.screenshot.is_some() {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
            return;
        }
        let ready = self.model.lock().map(|m| m.is_some()).unwrap_or(false);
        if ready && self.dirty {
            if let Err(e) = self.update_prediction() {
                *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
            }
        }
        egui::Panel::right("stats").min_size(260.0).show(ui, |ui| {
            ui.heading("GPU");
            ui.label(format!("{} (shared with the app)", self.adapter));
            let s = self.dev.stats();
            ui.label(format!(
                "memory in use: {:.2} MB (peak {:.2} MB)",
                s.bytes_in_use as f64 / 1e6,
                s.peak_bytes as f64 / 1e6
            ));
            ui.label(format!("kernels {}, submits {}", s.kernels_dispatched, s.submits));
            ui.separator();
            if self.timestamps {
                ui.label("GPU time per kernel, last prediction:");
                for (label, ms, n) in &self.profile {
                    ui.monospace(format!("{ms:7.3} ms x{n} {}", label.chars().take(28).collect::<String>()));
                }
            } else {
                ui.label("GPU time per kernel: this adapter has no timestamp queries");
            }
        });
        egui::CentralPanel::default().show(ui, |ui| {
            if !ready {
                let n = self.trained.load(Ordering::Relaxed);
                ui.label(format!("no checkpoint at {}: training the CNN", self.args.checkpoint.display()));
                ui.add(
                    egui::ProgressBar::new(n as f32 / self.args.train_steps.max(1) as f32)
                        .text(format!("step {n} of {}", self.args.train_steps)),
                );
            }
            ui.horizontal(|ui| {
                if ui.button("Clear").clicked() {
                    self.canvas.iter_mut().for_each(|v| *v = 0.0);
                    self.dirty = true;
                }
                let before = self.method;
                ui.radio_value(&mut self.method, Method::Saliency, "saliency");
                ui.radio_value(&mut self.method, Method::GradCam, "Grad-CAM");
                self.dirty |= before != self.method;
                ui.checkbox(&mut self.overlay, "heatmap");
            });
            ui.horizontal(|ui| {
                let (rect, resp) = ui.allocate_exact_size(egui::vec2(CANVAS, CANVAS), egui::Sense::drag());
                self.canvas_rect = Some(rect);
                let uv = egui::Rect::from_min_max(egui::pos2(0.0, 0.0), egui::pos2(1.0, 1.0));
                ui.painter().image(self.drawing.id, rect, uv, egui::Color32::WHITE);
                if self.overlay && self.heat.is_some() {
                    ui.painter().image(self.heatmap.id, rect, uv, egui::Color32::from_white_alpha(150));
                }
                // The primary button held over the canvas inks it.
                let (down, pointer) = ui.input(|i| (i.pointer.primary_down(), i.pointer.interact_pos()));
                if let (true, Some(p)) = (down && resp.contains_pointer(), pointer) {
                    let cell = ((p - rect.min) / (rect.width() / SIDE as f32)).to_pos2();
                    let from = self.last.unwrap_or(cell);
                    self.ink(from, cell);
                    self.last = Some(cell);
                } else {
                    self.last = None;
                }
                ui.vertical(|ui| {
                    ui.heading(match self.pred {
                        Some(p) => format!("prediction: {p}"),
                        None => "prediction: -".into(),
                    });
                    for (d, p) in self.probs.iter().enumerate() {
                        let bar =
                            egui::ProgressBar::new(*p).desired_width(180.0).text(format!("{d}: {:5.1}%", p * 100.0));
                        ui.add(if Some(d) == self.pred { bar.fill(egui::Color32::from_rgb(60, 150, 90)) } else { bar });
                    }
                });
            });
        });
        self.selftest_step(&ctx);
        // The training thread asks for a frame after each step; only the self-test's
        // injected stroke needs frames back to back. Rendering continuously while the
        // model trains would take a CPU core from it under lavapipe.
        if self.args.screenshot.is_some() && ready {
            ctx.request_repaint();
        }
    }
}

impl App {
    /// After the injected stroke: wait for the prediction, take the screenshot, check
    /// and report, then close.
    fn selftest_step(&mut self, ctx: &egui::Context) {
        let Some(path) = self.args.screenshot.clone() else { return };
        if let Some(result) = self.selftest.done.lock().unwrap_or_else(|e| e.into_inner()).take() {
            match result {
                Ok(()) => std::process::exit(0),
                Err(e) => {
                    eprintln!("desktop self-test failed: {e}");
                    std::process::exit(1);
                }
            }
        }
        self.selftest.frame += 1;
        if !self.selftest.released || self.dirty || self.selftest.requested {
            return;
        }
        self.selftest.requested = true;
        let report = match self.check() {
            Ok(r) => r,
            Err(e) => {
                *self.selftest.done.lock().unwrap_or_else(|e| e.into_inner()) = Some(Err(e));
                return;
            }
        };
        let done = self.selftest.done.clone();
        let repaint = ctx.clone();
        ctx.send_viewport_cmd(egui::ViewportCommand::Screenshot(egui::ScreenshotCallback::new(move |img| {
            let r = save_screenshot(&path, &img).and_then(|region_colours| {
                let json = path.with_extension("json");
                let mut report = report;
                report["canvas_colours_in_screenshot"] = serde_json::json!(region_colours);
                std::fs::write(&json, report.to_string()).map_err(|e| format!("{}: {e}", json.display()))?;
                println!("{report}");
                if region_colours < 8 {
                    return Err(format!("the canvas in the screenshot has only {region_colours} colours"));
                }
                Ok(())
            });
            *done.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            repaint.request_repaint();
        })));
    }

    /// The prediction against the same weights on the CPU backend, and the heatmap.
    fn check(&self) -> Result<serde_json::Value, String> {
        let guard = self.model.lock().unwrap_or_else(|e| e.into_inner());
        let model = guard.as_ref().ok_or("no model")?;
        let cpu = Device::cpu();
        let mut twin = build("cnn", 1, &cpu).map_err(|e| e.to_string())?;
        let dict: tessera::nn::StateDict = model
            .state_dict()
            .iter()
            .map(|(n, t)| {
                t.to_vec_blocking::<f32>().map(|v| (n.to_string(), Tensor::from_slice(&v, t.dims().to_vec(), &cpu)))
            })
            .collect::<tessera::Result<_>>()
            .map_err(|e| e.to_string())?;
        twin.load_state_dict(&dict, true).map_err(|e| e.to_string())?;
        twin.set_training(false);
        let x = Tensor::from_slice(&standardize(&self.canvas), [1, 1, SIDE, SIDE], &cpu);
        let reference =
            twin.forward(&x).argmax_dim(-1).to_vec_blocking::<i32>().map_err(|e| e.to_string())?[0] as usize;
        let heat = self.heat.as_ref().ok_or("no heatmap")?.to_vec_blocking::<f32>().map_err(|e| e.to_string())?;
        let hot = heat.iter().filter(|v| **v > 0.1).count();
        let inked = self.canvas.iter().filter(|v| **v > 0.5).count();
        let report = serde_json::json!({
            "adapter": self.adapter, "unrequested": self.unrequested, "predicted": self.pred,
            "cpu_backend_predicts": reference, "probabilities": self.probs, "inked_cells": inked,
            "heatmap_cells_over_0_1": hot,
        });
        if !self.unrequested.is_empty() {
            return Err(format!("eframe's device lacks what Tessera would use: {report}"));
        }
        if self.pred != Some(reference) {
            return Err(format!("the app predicts {:?}, the same weights on the CPU backend {reference}", self.pred));
        }
        if hot == 0 || inked == 0 {
            return Err(format!("empty drawing or heatmap: {report}"));
        }
        Ok(report)
    }
}

/// Save the screenshot as PNG; returns how many distinct colours the canvas area has.
fn save_screenshot(path: &std::path::Path, img: &egui::ColorImage) -> Result<usize, String> {
    let [w, h] = img.size;
    let rgba: Vec<u8> = img.pixels.iter().flat_map(|c| c.to_array()).collect();
    let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(f), w as u32, h as u32);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().map_err(|e| e.to_string())?;
    wr.write_image_data(&rgba).map_err(|e| e.to_string())?;
    let colours: std::collections::HashSet<[u8; 4]> = img.pixels.iter().map(|c| c.to_array()).collect();
    Ok(colours.len())
}

fn main() {
    let args = Args::parse();
    let options = eframe::NativeOptions {
        renderer: eframe::Renderer::Wgpu,
        viewport: egui::ViewportBuilder::default()
            .with_inner_size([900.0, 520.0])
            .with_title("Tessera: MNIST, explained"),
        wgpu_options: wgpu_options(),
        ..Default::default()
    };
    let result = eframe::run_native(
        "tessera-desktop",
        options,
        Box::new(move |cc| App::new(cc, args).map(|a| Box::new(a) as Box<dyn eframe::App>).map_err(Into::into)),
    );
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// eframe's device, with the features and limits that Tessera's own device would ask
/// of the adapter (`Device::wgpu_requirements`): timestamp queries (the profiler), f16,
/// subgroups, on CPU adapters 64-bit integers, and the adapter's limits.
/// `Device::from_wgpu` then runs the same kernels (on lavapipe, wide loads and operand
/// textures) and its `unrequested` list is empty.
fn wgpu_options() -> eframe::egui_wgpu::WgpuConfiguration {
    let mut setup = eframe::egui_wgpu::WgpuSetupCreateNew::without_display_handle();
    let base = setup.device_descriptor.clone();
    setup.device_descriptor = Arc::new(move |adapter| {
        let mut d = base(adapter);
        let (features, limits) = tessera::Device::wgpu_requirements(adapter);
        d.required_features |= features;
        d.required_limits = limits;
        d
    });
    eframe::egui_wgpu::WgpuConfiguration {
        wgpu_setup: eframe::egui_wgpu::WgpuSetup::CreateNew(setup),
        ..Default::default()
    }
}
