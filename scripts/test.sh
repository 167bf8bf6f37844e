#!/usr/bin/env bash
# Every check a fresh machine runs: install what is missing, then the full test suite on
# every adapter (lavapipe's Vulkan, llvmpipe's GL, each with forced fallbacks), the
# MiniLM checks against the float64 fixture, the info example's self-check, and the
# browser package with its tests in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch_minilm.sh
bash scripts/fetch_mnist.sh
source scripts/env.sh

# The tests fail without a GPU adapter or the model (TESSERA_ALLOW_NO_GPU=1 and
# TESSERA_ALLOW_NO_MODEL=1 skip loudly); setup installed both, so neither is set here.
unset TESSERA_ALLOW_NO_GPU TESSERA_ALLOW_NO_MODEL
export RUST_BACKTRACE=1
# Every comparison the harness makes is logged here: binary and device.
export TESSERA_TEST_LOG="$PWD/target/test-devices.log"
mkdir -p target && : >"$TESSERA_TEST_LOG"

echo "== cargo test"
cargo test --lib --tests --examples
cargo build --benches
cargo test --doc
echo "== comparisons per test binary and device"
sort "$TESSERA_TEST_LOG" | uniq -c | awk '{n=$1; $1=""; printf "%7d %s\n", n, $0}'

echo "== no adapter: every example prints what to install"
bash scripts/check_no_adapter.sh

echo "== info example (every adapter must PASS)"
cargo run --example info

echo "== training demos, short runs (errors fail the script)"
ci_out="target/ci-demo"
cargo run --release --example train_mnist -- --max-steps 40 --quiet \
  --checkpoint-dir "$ci_out/ckpt" --log-dir "$ci_out/runs" --predictions "$ci_out/predictions.png"
cargo run --release --example train_charlm -- --steps 4 --sample-every 4 --sample-len 8

echo "== browser: the npm package and its tests in headless Chromium on WebGPU"
bash scripts/test_web.sh
echo "== all checks passed"
