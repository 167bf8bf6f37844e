#!/usr/bin/env bash
# The browser benchmarks, in headless Chromium:
#  - web/tests/bench.mjs: square matmuls on Tessera's CPU backend (wasm SIMD), its WebGPU
#    backend and onnxruntime-web's wasm backend, in one page;
#  - web/tests/bench_onnx.mjs: all-MiniLM-L6-v2 as ONNX (scripts/make_minilm_onnx.sh) on
#    Tessera's WebGPU and CPU backends and onnxruntime-web's WebGPU and wasm backends;
#  - web/tests/bench_peers.mjs: issue #21's browser cases (matmul, an element-wise
#    chain, conv2d, a tiny op with readback) on Tessera's WebGPU backend, tfjs-webgpu,
#    onnxruntime-web's WebGPU provider and naive WGSL kernels, with the floors.
# Builds the package and installs the test packages first. Arguments go to bench.mjs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build_web.sh
bash scripts/make_minilm_onnx.sh
bash scripts/setup_python.sh
.venv/bin/python web/tests/make_peer_models.py web/tests/fixtures/peers
(cd web/tests && npm ci --no-audit --no-fund --loglevel=error)
node web/tests/bench.mjs "$@"
node web/tests/bench_onnx.mjs
node web/tests/bench_peers.mjs
