#!/usr/bin/env bash
# Builds the npm package `tessera-web` into web/pkg: the wasm-bindgen crate in web/ for
# wasm32-unknown-unknown (profile `wasm`: size-optimised, LTO), wasm-bindgen's ES module
# and TypeScript types, wasm-opt -Oz where binaryen is installed, a package.json with an
# exports map, then prints the .wasm size raw and gzipped and what dominates it.
# Installs what it lacks, skipping what is present: the wasm32 target and
# wasm-bindgen-cli at exactly the version of the wasm-bindgen crate in Cargo.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[build_web] %s\n' "$*"; }

if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  log "adding the wasm32-unknown-unknown target"
  rustup target add wasm32-unknown-unknown >/dev/null
fi

want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}' || true)
if [ "$have" != "$want" ]; then
  # --locked fails on this registry today (a locked dependency is missing), so it is not used.
  # Built unoptimised: the install takes under half the time (4m32 -> 1m51 on a 2-core CI
  # machine) and the tool still runs in seconds on our module, writing the same output.
  log "installing wasm-bindgen-cli $want (found: ${have:-none}); this takes a minute or two once"
  CARGO_PROFILE_RELEASE_OPT_LEVEL=0 cargo install wasm-bindgen-cli --version "$want" --force --quiet
fi

cargo build -p tessera-web --target wasm32-unknown-unknown --profile wasm
built=target/wasm32-unknown-unknown/wasm/tessera_web.wasm
out=web/pkg
bindgen_input="$built"
if command -v wasm-opt >/dev/null 2>&1; then
  # Before wasm-bindgen, not after: Debian 12's binaryen (108) breaks the externref
  # table that wasm-bindgen adds. The --enable flags are the features rustc's wasm32
  # target emits. --low-memory-unused (what Emscripten passes) folds a pointer plus a
  # small constant into the access's offset; it differs only where that sum would wrap
  # past 2^32 into the first KiB, which Rust never does (7 KB gzipped less);
  # --converge repeats the passes while they still shrink it (2 KB more).
  bindgen_input="${built%.wasm}.opt.wasm"
  wasm-opt -Oz --low-memory-unused --converge --enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext \
    --enable-mutable-globals --enable-reference-types --enable-multivalue "$built" -o "$bindgen_input"
  log "wasm-opt -Oz --low-memory-unused --converge: $(stat -c %s "$built") -> $(stat -c %s "$bindgen_input") bytes (names kept until wasm-bindgen)"
else
  log "wasm-opt not found (Debian: apt-get install binaryen): the .wasm is not post-optimised"
fi
rm -rf "$out"
wasm-bindgen --target web --out-dir "$out" --out-name tessera --remove-name-section "$bindgen_input"
wasm="$out/tessera_bg.wasm"

version=$(awk -F'"' '/^version = / { print $2; exit }' web/Cargo.toml)
cat > "$out/package.json" <<EOF
{
  "name": "tessera-web",
  "version": "$version",
  "description": "Tessera in the browser: lazy tensors, fused WGSL kernels on WebGPU, training, safetensors/GGUF and sentence embeddings.",
  "license": "MIT OR Apache-2.0",
  "type": "module",
  "main": "./tessera.js",
  "module": "./tessera.js",
  "types": "./tessera.d.ts",
  "exports": {
    ".": {
      "types": "./tessera.d.ts",
      "import": "./tessera.js",
      "default": "./tessera.js"
    },
    "./tessera_bg.wasm": "./tessera_bg.wasm",
    "./package.json": "./package.json"
  },
  "files": ["tessera.js", "tessera.d.ts", "tessera_bg.wasm", "tessera_bg.wasm.d.ts", "README.md", "LICENSE-MIT", "LICENSE-APACHE"],
  "sideEffects": false,
  "keywords": ["webgpu", "wgsl", "tensor", "machine-learning", "wasm"]
}
EOF
cp web/PACKAGE.md "$out/README.md"
cp LICENSE-MIT LICENSE-APACHE "$out/"
# wasm-bindgen writes its own .gitignore ("*"), which would make npm pack skip every file.
rm -f "$out/.gitignore"

raw=$(stat -c %s "$wasm")
gz=$(gzip -9c "$wasm" | wc -c)
log "$wasm: $raw bytes raw, $gz gzipped (budget: 3,500,000 raw, 1,300,000 gzipped)"
log "what dominates it (code bytes by crate in the cargo output, before wasm-opt):"
python3 web/wasm_size.py "$built" 10 | sed 's/^/[build_web]   /'
if [ "$raw" -gt 3500000 ] || [ "$gz" -gt 1300000 ]; then
  if [ "$bindgen_input" = "$built" ]; then
    log "over the budget without wasm-opt: install binaryen"
  else
    log "over the budget (3.5 MB raw, 1.3 MB gzipped)"
    exit 1
  fi
fi
