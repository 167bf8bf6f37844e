#!/usr/bin/env bash
# With no adapter at all (Vulkan's loader pointed at no driver, GL disabled), every
# example must exit non-zero with Tessera's error naming what to install, and never
# panic or print a backtrace. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --examples --quiet
fail=0
for run in "info" "bench --no-tune elementwise" "train_mnist --max-steps 1" "train_charlm --steps 1" \
  "embed hello" "quantize"; do
  ex=${run%% *}
  set +e
  # shellcheck disable=SC2086
  out=$(VK_ICD_FILENAMES=/nonexistent/icd.json VK_DRIVER_FILES=/nonexistent/icd.json WGPU_BACKEND=vulkan \
    RUST_BACKTRACE=1 timeout 120 target/debug/examples/$run 2>&1)
  rc=$?
  set -e
  if [ "$rc" -eq 0 ] || ! grep -q "lavapipe" <<<"$out" || grep -Eq "panicked|stack backtrace" <<<"$out"; then
    echo "[no-adapter] $ex: exit $rc, output:"; echo "$out" | head -20; fail=1
  else
    echo "[no-adapter] $ex: exit $rc: $(grep -m1 lavapipe <<<"$out" | cut -c1-150)"
  fi
done
exit $fail
