#!/usr/bin/env bash
# The GPU check run on a lent machine without a Rust toolchain (an H200 here): test
# suites and the bench, prebuilt on the development machine.
#   prepare (here):  cargo build --release --example bench
#                    cargo test --release --no-run --test ops --test quant --test attention --test autograd --test train --test engine
#                    then strip each binary into .dev/ (bench, ops, quant, ...), and put the
#                    Vulkan loader's .deb files (libvulkan1 ...) into .gl/ (both git-ignored
#                    via .git/info/exclude)
#   run (there):     bash scripts/device_check.sh   (writes bench.jsonl to $OUT or .; ends
#                    with issue 21 item 7: 4096^3 f32 and Q4_0 GEMV against PEAK_GFLOPS
#                    and PEAK_GBPS, an H200's by default)
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
echo "== issue 21 item 7: f32 4096^3 against the FP32 FMA peak, Q4_0 GEMV against memory bandwidth"
# Peaks of an H200 by default; set PEAK_GFLOPS / PEAK_GBPS for another GPU.
peak_gflops="${PEAK_GFLOPS:-67000}"; peak_gbps="${PEAK_GBPS:-4800}"
# field KEY LINE: the number after "KEY": in a bench JSON line.
field() { sed -nE "s/.*\"$1\":([0-9.eE+-]+).*/\1/p" <<<"$2"; }
report() {  # what value peak floor_percent
  awk -v w="$1" -v v="$2" -v p="$3" -v f="$4" 'BEGIN {
    if (v == "") { printf "%s: NOT MEASURED (no bench line)\n", w; exit }
    pct = 100 * v / p
    printf "%s: %.1f of %.1f = %.1f%% (floor %d%%): %s\n", w, v, p, pct, f, (pct >= f ? "met" : "NOT met") }'
}
mm=$(timeout 180 .dev/bench matmul --devices gpu --sizes 4096 --json --seconds 1 --no-tune 2>/dev/null \
  | grep '"shape":"4096x4096x4096"' | grep '"dtype":"f32"' | head -1)
report "f32 matmul 4096^3, GFLOP/s" "$(field gflops "$mm")" "$peak_gflops" 50
gv=$(timeout 120 .dev/bench gemv --devices gpu --json --seconds 1 --no-tune 2>/dev/null | grep '"dtype":"q4_0"' | head -1)
report "Q4_0 GEMV 1x4096x4096, GB/s of weights" "$(field gbps "$gv")" "$peak_gbps" 70
