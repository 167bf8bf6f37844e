#!/usr/bin/env bash
# Every check a fresh machine runs: install what is missing, then the full test suite on
# every adapter (lavapipe's Vulkan, llvmpipe's GL, each with forced fallbacks), the
# MiniLM checks against the float64 fixture, the info example's self-check, and the
# browser build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch_minilm.sh
source scripts/env.sh

# After setup a Vulkan adapter must exist: a test run that silently found no GPU would
# only have checked the CPU reference against itself.
export TESSERA_REQUIRE_GPU="${TESSERA_REQUIRE_GPU:-1}"
# The model was just fetched: the real-model tests must run, not skip.
export TESSERA_REQUIRE_MODEL="${TESSERA_REQUIRE_MODEL:-1}"
export RUST_BACKTRACE=1

echo "== cargo test"
cargo test --lib --tests --examples
cargo build --benches
cargo test --doc

echo "== info example (every adapter must PASS)"
cargo run --example info

echo "== browser build (wasm32-unknown-unknown)"
cargo build --lib --target wasm32-unknown-unknown
echo "== all checks passed"
