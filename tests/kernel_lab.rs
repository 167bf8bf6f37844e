//! The kernel lab's kernels (`examples/kernel_lab/kernels/*.wgsl`, the evidence behind
//! the lab README's findings and several engine kernels) stay valid WGSL: each one
//! parses and validates with naga, with the constants its header's run line sets
//! (`--const NAME=VALUE`, as the lab prepends them), and again with every other value
//! the header gives a constant, so a finding can be rerun as written.

use std::collections::BTreeMap;
use std::path::Path;

/// The constants a kernel's header comments set: each name with every value given for
/// it (`--const TM=8`, then `TM=16` elsewhere in the header), the first one first.
fn header_constants(src: &str) -> BTreeMap<String, Vec<String>> {
    let header: Vec<&str> = src.lines().take_while(|l| l.trim_start().starts_with("//")).collect();
    let words: Vec<&str> = header.iter().flat_map(|l| l.split_whitespace()).collect();
    let mut consts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pair in words.windows(2).filter(|w| w[0] == "--const") {
        if let Some((name, value)) = pair[1].split_once('=') {
            consts.entry(name.to_string()).or_default().push(value.to_string());
        }
    }
    // Other values of the same names anywhere in the header (`(ROW_LANES=1: ...`).
    for word in &words {
        let word = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '=');
        if let Some((name, value)) = word.split_once('=') {
            let value = value.trim_end_matches(|c: char| !c.is_ascii_digit());
            if let Some(values) = consts.get_mut(name) {
                if !value.is_empty() && !values.iter().any(|v| v == value) {
                    values.push(value.to_string());
                }
            }
        }
    }
    consts
}

#[test]
fn lab_kernels_parse_and_validate_with_their_constants() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/kernel_lab/kernels");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "wgsl"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "expected the lab's kernels in {}, found {}", dir.display(), files.len());
    let (mut checked, mut failures) = (0, Vec::new());
    for path in &files {
        let src = std::fs::read_to_string(path).expect("a readable kernel");
        let consts = header_constants(&src);
        // The run line's values, then each other value of one constant at a time.
        let first: BTreeMap<&str, &str> = consts.iter().map(|(k, v)| (k.as_str(), v[0].as_str())).collect();
        let mut variants = vec![first.clone()];
        for (name, values) in &consts {
            for v in &values[1..] {
                let mut other = first.clone();
                other.insert(name, v);
                variants.push(other);
            }
        }
        for set in variants {
            let prefix: String = set.iter().map(|(k, v)| format!("const {k}: u32 = {v}u;\n")).collect();
            let what = format!("{} with {set:?}", path.file_name().unwrap_or_default().to_string_lossy());
            let module = match naga::front::wgsl::parse_str(&format!("{prefix}{src}")) {
                Ok(m) => m,
                Err(e) => {
                    failures.push(format!("{what}: {}", e.emit_to_string(&src)));
                    continue;
                }
            };
            let mut validator =
                naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all());
            if let Err(e) = validator.validate(&module) {
                failures.push(format!("{what}: {e:?}"));
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{} lab kernel variants failed:\n{}", failures.len(), failures.join("\n\n"));
    println!("{checked} variants of {} lab kernels validated", files.len());
}

#[test]
fn header_constants_take_every_value_given() {
    let src = "// Run: --m 8 --const TM=8 --const LANES=64\n//   (TM=16: --groups 4,1,1)\nconst X: u32 = 1u;\n// TM=32 not in the header\n";
    let c = header_constants(src);
    assert_eq!(c.get("TM"), Some(&vec!["8".to_string(), "16".to_string()]));
    assert_eq!(c.get("LANES"), Some(&vec!["64".to_string()]));
    assert_eq!(c.len(), 2);
}
