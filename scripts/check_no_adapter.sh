#!/usr/bin/env bash
# With no adapter at all (Vulkan's loader pointed at no driver, GL disabled), every
# example must run on the CPU backend: exit 0, say it runs on the CPU, and never panic.
# Asking for a GPU explicitly (TESSERA_ADAPTER=gpu) must fail with Tessera's error
# naming what to install. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
# TESSERA_BUILD: the cargo selection scripts/test.sh builds everything with.
# shellcheck disable=SC2086
cargo build ${TESSERA_BUILD:---release} --examples --quiet
no_adapter=(env VK_ICD_FILENAMES=/nonexistent/icd.json VK_DRIVER_FILES=/nonexistent/icd.json WGPU_BACKEND=vulkan
  RUST_BACKTRACE=1 timeout 300)
fail=0
for run in "info" "bench --no-tune --seconds 0.05 elementwise" "train_mnist --max-steps 2 --quiet" \
  "train_charlm --steps 1" "embed hello" "quantize"; do
  ex=${run%% *}
  set +e
  # shellcheck disable=SC2086
  out=$("${no_adapter[@]}" target/release/examples/$run 2>&1)
  rc=$?
  set -e
  if [ "$rc" -ne 0 ] || ! grep -qiE "cpu \(|no GPU adapter" <<<"$out" || grep -Eq "panicked|stack backtrace" <<<"$out"; then
    echo "[no-adapter] $ex: exit $rc, output:"; echo "$out" | tail -20; fail=1
  else
    echo "[no-adapter] $ex: exit 0 on the CPU backend: $(grep -m1 -iE 'cpu \(|no GPU adapter' <<<"$out" | cut -c1-150)"
  fi
done
set +e
out=$(TESSERA_ADAPTER=gpu "${no_adapter[@]}" target/release/examples/train_mnist --max-steps 1 --quiet 2>&1)
rc=$?
set -e
if [ "$rc" -eq 0 ] || ! grep -q "lavapipe" <<<"$out" || grep -Eq "panicked|stack backtrace" <<<"$out"; then
  echo "[no-adapter] TESSERA_ADAPTER=gpu: exit $rc, output:"; echo "$out" | tail -20; fail=1
else
  echo "[no-adapter] TESSERA_ADAPTER=gpu: exit $rc: $(grep -m1 lavapipe <<<"$out" | cut -c1-150)"
fi
exit $fail
