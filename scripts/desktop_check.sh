#!/usr/bin/env bash
# The desktop example's screenshot test: the real eframe window under Xvfb on lavapipe.
# The app draws a digit through injected mouse input, waits for its prediction, saves
# a screenshot and a JSON report, and exits non-zero unless the prediction matches the
# same weights on the CPU backend and the heatmap is not empty. Run by scripts/test.sh.
#
#   scripts/desktop_check.sh [OUT_DIR]     (default target/desktop)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/desktop}"
mkdir -p "$out"
command -v xvfb-run >/dev/null || { echo "desktop_check: xvfb-run is missing: run scripts/setup.sh"; exit 1; }
# TESSERA_BUILD: the cargo selection scripts/test.sh builds everything with.
# shellcheck disable=SC2086
cargo build ${TESSERA_BUILD:---release --features desktop} --example desktop
rm -f "$out/desktop.png" "$out/desktop.json"
# A short in-app training (no checkpoint here) keeps the run quick; lavapipe renders.
WGPU_BACKEND=vulkan timeout 600 xvfb-run -a -s "-screen 0 1280x800x24" \
  target/release/examples/desktop --screenshot "$out/desktop.png" --train-steps 60 \
  --checkpoint "$out/no-checkpoint.safetensors"
test -s "$out/desktop.png" || { echo "desktop_check: no screenshot"; exit 1; }
test -s "$out/desktop.json" || { echo "desktop_check: no report"; exit 1; }
echo "desktop_check: screenshot $out/desktop.png, report $(cat "$out/desktop.json")"
