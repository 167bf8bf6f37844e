#!/usr/bin/env bash
# The browser tests: builds the npm package (scripts/build_web.sh), installs the test
# driver (playwright-core, pinned in web/tests/package-lock.json; it never downloads a
# browser), then runs web/tests/run.mjs in Debian's headless Chromium on WebGPU.
# Arguments filter the tests by name. Artefacts (the demo screenshot, the packed
# tarball, a summary) land in web/tests/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build_web.sh
if [ ! -d web/tests/node_modules/playwright-core ]; then
  (cd web/tests && npm ci --no-audit --no-fund --loglevel=error)
fi
# The ONNX tests need the official node tests and an MNIST model exported by the demo.
bash scripts/setup_python.sh
bash scripts/gen_onnx_node_tests.sh
if [ ! -f target/ci-demo/mnist.onnx ]; then
  cargo run --release --example train_mnist -- --max-steps 40 --quiet --checkpoint-dir target/ci-demo/ckpt \
    --log-dir target/ci-demo/runs --predictions target/ci-demo/predictions.png --export-onnx target/ci-demo/mnist.onnx
fi
node web/tests/run.mjs "$@"
