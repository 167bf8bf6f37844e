//! Copies `shaders/*.wgsl` into `OUT_DIR` for `src/kernels/mod.rs` to include. For
//! wasm32 (the npm package, held to a size budget) comments, indentation and blank
//! lines are left out; `shaders/` stays the documented source, and native builds
//! embed it verbatim.

use std::{env, fs, path::Path};

fn main() {
    let out = Path::new(&env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("shaders");
    fs::create_dir_all(&out).expect("create OUT_DIR/shaders");
    let strip = env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32");
    println!("cargo:rerun-if-changed=shaders");
    for entry in fs::read_dir("shaders").expect("read shaders/") {
        let path = entry.expect("a shaders/ entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        println!("cargo:rerun-if-changed={}", path.display());
        let src = fs::read_to_string(&path).expect("read a shader");
        let text: String = if strip {
            // WGSL has no string literals, so `//` always starts a comment; indentation
            // and blank lines go too.
            src.lines()
                .map(|l| l.split("//").next().unwrap_or_default().trim())
                .filter(|l| !l.is_empty())
                .flat_map(|l| [l, "\n"])
                .collect()
        } else {
            src
        };
        fs::write(out.join(path.file_name().expect("a file name")), text).expect("write a shader");
    }
}
