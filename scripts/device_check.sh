#!/usr/bin/env bash
# The GPU check run on a lent machine without a Rust toolchain (an H200 here): test
# suites and the bench, prebuilt on the development machine.
#   prepare (here):  cargo build --release --example bench
#                    cargo test --release --no-run --test ops --test quant --test attention --test autograd --test train --test engine
#                    then strip each binary into .dev/ (bench, ops, quant, ...), and put the
#                    Vulkan loader's .deb files (libvulkan1 ...) into .gl/ (both git-ignored
#                    via .git/info/exclude)
#   run (there):     bash scripts/device_check.sh   (writes bench.jsonl to $OUT or .)
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done
ldconfig 2>/dev/null
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/xdg}"; mkdir -p "$XDG_RUNTIME_DIR"
out="${OUT:-.}"
echo "== tests"
for t in ops quant attention autograd train engine; do
  [ -x ".dev/$t" ] || continue
  echo "-- $t"; timeout 120 ".dev/$t" 2>&1 | grep -E "test result|panicked" -A1 | head -6
done
echo "== bench"
timeout 300 .dev/bench --json --seconds 0.5 2>&1 | grep -v XDG | tee "$out/bench.jsonl"
echo "== the other choice of each tuned switch (attention fused/composed, conv implicit/materialised)"
TESSERA_FUSED_ATTENTION=1 timeout 60 .dev/bench attention --no-tune --seconds 0.5 2>&1 | grep "^attention"
TESSERA_FUSED_ATTENTION=0 timeout 60 .dev/bench attention --no-tune --seconds 0.5 2>&1 | grep "^attention"
TESSERA_IMPLICIT_GEMM=0 timeout 60 .dev/bench conv2d --no-tune --seconds 0.5 2>&1 | grep "^conv2d"
