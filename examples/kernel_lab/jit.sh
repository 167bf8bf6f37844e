#!/usr/bin/env bash
# Instructions lavapipe's JIT code executes per run of a lab kernel, counted by
# callgrind: deterministic where wall time on a shared host is not. Run from the
# repository root after `cargo build --release --example kernel_lab`:
#   bash examples/kernel_lab/jit.sh examples/kernel_lab/kernels/copy.wgsl --m 1 --n 262144 --k 4 --bm 1 --bn 4096
# (The lab runs the kernel once, then 3 timed iterations: the total is divided by 4.)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh
lab=target/release/examples/kernel_lab
out=$(mktemp)
valgrind --tool=callgrind --smc-check=all-non-file --callgrind-out-file="$out" "$lab" "$@" --iters 3 >/dev/null 2>&1
# JIT code has no object file: callgrind lists it as ???:0x... [???].
n=$(callgrind_annotate "$out" 2>/dev/null | grep -E '\?\?\?:0x[0-9a-f]+ \[\?\?\?\]' | awk '{gsub(",", "", $1); s += $1} END {print s + 0}')
rm -f "$out"
echo "$1: $((n / 4)) JIT instructions per run"
