//! Copies `shaders/*.wgsl` into `OUT_DIR` for `src/kernels/mod.rs` to include. For
//! wasm32 (the npm package, held to a size budget) comments, indentation, blank lines
//! and spaces beside punctuation are left out; `shaders/` stays the documented source,
//! and native builds embed it verbatim.

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
                .flat_map(|l| [tight(l), "\n".to_string()])
                .collect()
        } else {
            src
        };
        fs::write(out.join(path.file_name().expect("a file name")), text).expect("write a shader");
    }
}

/// `line` without the spaces beside `,;:(){}[]`, and those between one of `=+-*/%` and
/// a name, number or closing bracket: no WGSL token contains one of the first set, and a
/// name or number never merges with an operator (`a - -b` and `x<y` keep their spaces).
fn tight(line: &str) -> String {
    let punct = |c: char| ",;:(){}[]".contains(c);
    let op = |c: char| "=+-*/%".contains(c);
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == ')' || c == ']';
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    for (i, &c) in chars.iter().enumerate() {
        if c == ' ' {
            let (p, n) = (out.chars().last().unwrap_or(' '), chars.get(i + 1).copied().unwrap_or(' '));
            if punct(p) || punct(n) || (op(p) && word(n)) || (word(p) && op(n)) {
                continue;
            }
        }
        out.push(c);
    }
    out
}
