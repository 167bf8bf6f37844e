#!/usr/bin/env bash
# Alternate lab runs of several kernels ROUNDS times and print each one's rates and the
# best (a shared host's noise is mostly slowdowns). From the repository root:
#   bash examples/kernel_lab/ab.sh 4 "rows|examples/kernel_lab/kernels/matmul_rows.wgsl|--const TM=8 --const LANES=64 --bm 8 --bn 256" ...
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh
lab=target/release/examples/kernel_lab
rounds=$1
shift
for _ in $(seq "$rounds"); do
  for spec in "$@"; do
    IFS='|' read -r label file rest <<<"$spec"
    # shellcheck disable=SC2086
    rate=$("$lab" "$file" $rest 2>&1 | grep -oE '[0-9.]+ GFLOP/s' | cut -d' ' -f1)
    echo "$label $rate"
  done
done | awk '{a[$1] = a[$1] " " $2; if ($2 > b[$1]) b[$1] = $2} END {for (k in a) printf "%-24s best %8.2f :%s\n", k, b[k], a[k]}' | sort
