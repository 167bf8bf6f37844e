#!/usr/bin/env bash
# The browser benchmark (web/tests/bench.mjs): square matmuls in headless Chromium on
# Tessera's CPU backend (wasm SIMD), its WebGPU backend and onnxruntime-web's wasm
# backend, in one page. Builds the package and installs the test packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build_web.sh
(cd web/tests && npm ci --no-audit --no-fund --loglevel=error)
node web/tests/bench.mjs "$@"
