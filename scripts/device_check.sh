#!/usr/bin/env bash
# The GPU check run on a lent machine without a Rust toolchain (an H200 here): the bench
# and test suites, prebuilt on the development machine.
#   prepare (here):  bash scripts/device_prepare.sh (binaries into .dev/, loaders into .gl/)
#   run (there):     bash scripts/device_check.sh   (logs and JSON lines to $OUT or .)
# Issue 21 item 7 comes first: f32 matmul 4096^3 against the FP32 FMA peak (floor 50%)
# and Q4_0 GEMV against memory bandwidth (floor 70%), an H200's peaks by default
# (PEAK_GFLOPS, PEAK_GBPS for another GPU); then SECTIONS (default all): the other
# kernel choices (variants), the peer cases (peer), the test suites (tests).
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done
ldconfig 2>/dev/null
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/xdg}"; mkdir -p "$XDG_RUNTIME_DIR"
export TESSERA_ADAPTER=gpu TESSERA_CACHE_DIR=/tmp/tessera-cache
out="${OUT:-.}"
bin=/tmp/tessera-dev; mkdir -p "$bin"
for f in .dev/*.xz; do xz -dc "$f" >"$bin/$(basename "$f" .xz)" && chmod +x "$bin/$(basename "$f" .xz)"; done
if [ ! -x "$bin/bench" ]; then
  echo "no prebuilt bench in .dev/ (see the header of this script)"; exit 1
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total --format=csv

echo "== issue 21 item 7 (autotuned; kernel_* from GPU timestamps, the rest wall time with the wait)"
timeout 240 "$bin/bench" peak --devices gpu --json --seconds 1 2>&1 | tee "$out/peak.jsonl"
peak_gflops="${PEAK_GFLOPS:-67000}"; peak_gbps="${PEAK_GBPS:-4800}"
# field KEY LINE: the number after "KEY": in a JSON line.
field() { sed -nE "s/.*\"$1\":([0-9.eE+-]+).*/\1/p" <<<"$2"; }
report() { # what value peak floor_percent
  awk -v w="$1" -v v="$2" -v p="$3" -v f="$4" 'BEGIN {
    if (v == "") { printf "%s: NOT MEASURED\n", w; exit }
    pct = 100 * v / p
    printf "%s: %.1f of %.1f = %.1f%% (floor %d%%): %s\n", w, v, p, pct, f, (pct >= f ? "met" : "NOT met") }'
}
mm=$(grep '"shape":"4096x4096x4096"' "$out/peak.jsonl" | head -1)
report "f32 matmul 4096^3, GFLOP/s of kernel time" "$(field kernel_gflops "$mm")" "$peak_gflops" 50
report "f32 matmul 4096^3, GFLOP/s of wall time" "$(field gflops "$mm")" "$peak_gflops" 50
for n in 4096 16384; do
  gv=$(grep "\"shape\":\"1x${n}x${n}\"" "$out/peak.jsonl" | head -1)
  report "Q4_0 GEMV 1x${n}x${n}, GB/s of kernel time" "$(field kernel_gbps "$gv")" "$peak_gbps" 70
done

sections="${SECTIONS:-variants peer tests}"
if [[ $sections == *variants* ]]; then
  echo "== the other kernel choices (each against the defaults above)"
  for v in TESSERA_MATMUL_BK=8 TESSERA_MATMUL_DOUBLE=1 TESSERA_MATMUL_128=0 TESSERA_GEMV_ROWS=0; do
    echo "-- $v"; env "$v" timeout 60 "$bin/bench" peak --devices gpu --json --seconds 0.5 2>&1 | grep '"case":"peak'
  done
fi
if [[ $sections == *peer* ]]; then
  echo "== the peer cases (issue 21's table)"
  timeout 150 "$bin/bench" --peer-cases --devices gpu --json --seconds 1 2>&1 | tee "$out/peer.jsonl"
fi
if [[ $sections == *tests* ]]; then
  # Vulkan only: the GL adapter (EGL without a display) loses its device on these machines.
  echo "== tests (Vulkan adapters, in parallel)"
  for t in engine ops quant attention autograd train; do
    [ -x "$bin/$t" ] && TESSERA_TEST_ADAPTERS=vulkan timeout 120 "$bin/$t" >"/tmp/test-$t.log" 2>&1 &
  done
  wait
  for t in engine ops quant attention autograd train; do
    echo "-- $t"; grep -E "test result|panicked|FAILED" -A2 "/tmp/test-$t.log" | head -12
  done
fi
