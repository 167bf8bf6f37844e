//! Why the MNIST CNN predicts what it does, as PNG overlays (no window needed): for each
//! chosen test digit, the digit, then its saliency, SmoothGrad, integrated gradients
//! and Grad-CAM (at the second convolution's ReLU) as heatmaps over it, with the
//! predicted class and integrated gradients' completeness gap printed.
//!
//! ```text
//! cargo run --release --example explain                       # digits 8000..8004
//! cargo run --release --example explain -- --digits 8001 8123 --out target/explain
//! ```
//!
//! The CNN comes from the demo's checkpoint (`scripts/demo.sh --model cnn` writes
//! `checkpoints/mnist-cnn.safetensors`), or is trained here for `--train-steps` steps.

use clap::Parser;
use std::path::{Path, PathBuf};
use tessera::explain::{completeness_gap, grad_cam, integrated_gradients, saliency, smoothgrad};
use tessera::io::mnist::Mnist;
use tessera::models::mnist::{build, standardize, TRAIN};
use tessera::nn::{Layer, Module};
use tessera::{Device, Tensor};

#[derive(Parser, Debug)]
#[command(about = "Saliency, SmoothGrad, integrated gradients and Grad-CAM for MNIST digits, as PNG overlays")]
struct Args {
    #[arg(long, default_value = "data/mnist.bin")]
    data: PathBuf,
    /// Test digits to explain (indices into the data set; the test digits start at 8000).
    #[arg(long, num_args = 1.., default_values_t = [8000usize, 8001, 8002, 8003, 8004])]
    digits: Vec<usize>,
    /// The demo's CNN checkpoint; trained here when it does not exist.
    #[arg(long, default_value = "checkpoints/mnist-cnn.safetensors")]
    checkpoint: PathBuf,
    /// Training steps when there is no checkpoint.
    #[arg(long, default_value_t = 400)]
    train_steps: usize,
    #[arg(long, default_value = "target/explain")]
    out: PathBuf,
    /// Integrated gradients' steps.
    #[arg(long, default_value_t = 64)]
    ig_steps: usize,
}

/// Each panel is the 28x28 digit drawn `SCALE` times larger.
const SCALE: usize = 4;
const SIDE: usize = 28 * SCALE;

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> tessera::Result<()> {
    let data = Mnist::load(&args.data)?;
    if let Some(&bad) = args.digits.iter().find(|&&i| i >= data.len()) {
        return Err(tessera::Error::InvalidArgument {
            op: "explain",
            detail: format!("digit {bad}: the data set has {} digits", data.len()),
            location: std::panic::Location::caller(),
        });
    }
    let dev = Device::new()?;
    let mut model = if args.checkpoint.exists() {
        let mut m = build("cnn", 1, &dev)?;
        let mut opt = tessera::optim::Adam::new(1e-3);
        tessera::io::checkpoint::load(&args.checkpoint, &mut m, &mut opt, &dev)?;
        println!("CNN from {}", args.checkpoint.display());
        m
    } else {
        println!("no checkpoint at {}: training the CNN for {} steps", args.checkpoint.display(), args.train_steps);
        tessera::models::mnist::train("cnn", &data, args.train_steps, 1, &dev)?.0
    };
    model.set_training(false);
    std::fs::create_dir_all(&args.out)
        .map_err(|e| tessera::Error::Io { path: args.out.display().to_string(), message: e.to_string() })?;
    println!("device: {} ({})", dev.info().name, dev.info().backend);
    if args.digits.iter().any(|&i| i < TRAIN) {
        println!("note: digits below {TRAIN} are training digits");
    }

    let n = args.digits.len();
    let px = standardize(&data.images_f32(&args.digits));
    let x = Tensor::from_slice(&px, [n, 1, 28, 28], &dev);
    let pred = {
        let _g = tessera::no_grad();
        model.forward(&x).argmax_dim(-1).to_vec_blocking::<i32>()?
    };
    let targets: Vec<usize> = pred.iter().map(|&p| p.clamp(0, 9) as usize).collect();
    // The baseline is a blank digit (all background), standardised like the inputs.
    let blank = Tensor::from_slice(&standardize(&vec![0.0; n * 784]), [n, 1, 28, 28], &dev);
    let sal = saliency(&model, &x, &targets)?;
    let sg = smoothgrad(&model, &x, &targets, 16, 0.3, 7)?;
    let ig = integrated_gradients(&model, &x, &blank, &targets, args.ig_steps)?;
    let cam = grad_cam(&model, 4, &x, &targets)?; // [n, 14, 14]
    let maps = tessera::read_all_blocking(&[sal, sg, ig.clone(), cam])?;
    let gaps = pollster::block_on(completeness_gap(&model, &x, &blank, &targets, &ig))?;

    for (k, &digit) in args.digits.iter().enumerate() {
        let img: Vec<f64> = data.images_f32(&[digit]).iter().map(|&v| v as f64).collect();
        let at = |m: usize, side: usize| maps[m][k * side * side..(k + 1) * side * side].to_vec();
        let panels = [
            ("saliency", magnitude(&at(0, 28)), 28),
            ("smoothgrad", magnitude(&at(1, 28)), 28),
            ("integrated gradients", magnitude(&at(2, 28)), 28),
            ("grad-cam", magnitude(&at(3, 14)), 14),
        ];
        let path = args.out.join(format!("explain-{digit}.png"));
        let mut row = vec![0u8; SIDE * SIDE * 3 * 5];
        draw(&mut row, 0, &img, None, 28);
        for (i, (_, heat, side)) in panels.iter().enumerate() {
            draw(&mut row, i + 1, &img, Some(heat), *side);
        }
        write_png(&path, &row, SIDE * 5, SIDE)?;
        let (sum, diff) = gaps[k];
        println!(
            "digit {digit} (label {}): predicted {}; integrated gradients sum to {sum:.4} against f(x) - f(blank) = {diff:.4} ({:.2}% apart); {}",
            data.labels[digit],
            targets[k],
            100.0 * (sum - diff).abs() / diff.abs().max(1e-12),
            path.display()
        );
    }
    println!("panels: digit | saliency | smoothgrad | integrated gradients | grad-cam");
    Ok(())
}

/// Magnitudes scaled to [0, 1] by the largest.
fn magnitude(v: &[f64]) -> Vec<f64> {
    let top = v.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-12);
    v.iter().map(|x| x.abs() / top).collect()
}

/// Panel `slot` of a row image: the digit in grey, with `heat` (a `side x side` map in
/// [0, 1], upsampled bilinearly) blended over it through the viridis colormap.
fn draw(row: &mut [u8], slot: usize, img: &[f64], heat: Option<&Vec<f64>>, side: usize) {
    let width = SIDE * 5;
    for y in 0..SIDE {
        for x in 0..SIDE {
            let g = img[(y / SCALE) * 28 + x / SCALE];
            let mut rgb = [g; 3];
            if let Some(h) = heat {
                let v = bilinear(h, side, (x as f64 + 0.5) / SIDE as f64, (y as f64 + 0.5) / SIDE as f64);
                let c = viridis(v);
                for (o, ci) in rgb.iter_mut().zip(c) {
                    *o = 0.35 * *o + 0.65 * ci;
                }
            }
            let o = (y * width + slot * SIDE + x) * 3;
            for (d, v) in row[o..o + 3].iter_mut().zip(rgb) {
                *d = (v.clamp(0.0, 1.0) * 255.0).round() as u8;
            }
        }
    }
}

/// `m` (`side x side`) at `(u, v)` in [0, 1]^2, bilinearly.
fn bilinear(m: &[f64], side: usize, u: f64, v: f64) -> f64 {
    let (fx, fy) = ((u * side as f64 - 0.5).max(0.0), (v * side as f64 - 0.5).max(0.0));
    let (x0, y0) = ((fx as usize).min(side - 1), (fy as usize).min(side - 1));
    let (x1, y1) = ((x0 + 1).min(side - 1), (y0 + 1).min(side - 1));
    let (tx, ty) = (fx - x0 as f64, fy - y0 as f64);
    let at = |x: usize, y: usize| m[y * side + x];
    (at(x0, y0) * (1.0 - tx) + at(x1, y0) * tx) * (1.0 - ty) + (at(x0, y1) * (1.0 - tx) + at(x1, y1) * tx) * ty
}

/// The viridis colormap at `t` in [0, 1] (five anchors, linearly between them).
fn viridis(t: f64) -> [f64; 3] {
    const A: [[f64; 3]; 5] = [
        [0.267, 0.005, 0.329],
        [0.230, 0.322, 0.546],
        [0.128, 0.567, 0.551],
        [0.369, 0.789, 0.383],
        [0.993, 0.906, 0.144],
    ];
    let s = t.clamp(0.0, 1.0) * 4.0;
    let i = (s as usize).min(3);
    let f = s - i as f64;
    [0, 1, 2].map(|c| A[i][c] * (1.0 - f) + A[i + 1][c] * f)
}

fn write_png(path: &Path, rgb: &[u8], w: usize, h: usize) -> tessera::Result<()> {
    let io = |e: String| tessera::Error::Io { path: path.display().to_string(), message: e };
    let f = std::fs::File::create(path).map_err(|e| io(e.to_string()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(f), w as u32, h as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().map_err(|e| io(e.to_string()))?;
    wr.write_image_data(rgb).map_err(|e| io(e.to_string()))?;
    Ok(())
}
