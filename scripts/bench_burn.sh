#!/usr/bin/env bash
# Issue #21's comparison, burn beside Tessera in one run on one adapter (lavapipe on a
# machine without a GPU): peers/burn (burn 0.22.1's wgpu backend, fusion and autotune
# on) and `examples/bench --peer-cases` run the same cases by the same method, each
# twice, alternating, and the table gives each engine's median rate and their ratio.
# Arguments (`--seconds S`) go to both. Not part of CI: burn takes long to build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
# test.sh's build selection, so the two share one set of artifacts.
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
cargo build --release --workspace --exclude tessera-web --features tessera/mpi,tessera/desktop --example bench
(cd peers/burn && cargo build --release)
out=target/peer-compare
mkdir -p "$out"
: > "$out/burn.jsonl"
: > "$out/tessera.jsonl"
for round in 1 2; do
  echo "[bench_burn] round $round: burn"
  peers/burn/target/release/burn-peer --json "$@" | grep '^{' | tee -a "$out/burn.jsonl"
  echo "[bench_burn] round $round: Tessera"
  target/release/examples/bench --peer-cases --json --devices gpu "$@" | grep '^{' | tee -a "$out/tessera.jsonl"
done
python3 - "$out/burn.jsonl" "$out/tessera.jsonl" <<'PY'
import json, statistics, sys
def load(path):
    rates, units = {}, {}
    for line in open(path):
        r = json.loads(line)
        rates.setdefault(r["case"], []).extend(r["rate"])
        units[r["case"]] = r["unit"]
    return rates, units
burn, units = load(sys.argv[1])
tessera, tunits = load(sys.argv[2])
units.update(tunits)
print(f"\n{'case':<38} {'burn':>10} {'Tessera':>10}  unit      Tessera/burn   (medians of 4 passes)")
for case in tessera:
    t = statistics.median(tessera[case])
    # Tessera's fused attention is compared with burn's composition (burn has no fused op).
    peer = case if case in burn else case.replace("attention f32", "attention-composed f32")
    if peer not in burn:
        print(f"{case:<38} {'-':>10} {t:>10.2f}  {units[case]:<8}")
        continue
    b = statistics.median(burn[peer])
    print(f"{case:<38} {b:>10.2f} {t:>10.2f}  {units[case]:<8}  {t / b:6.2f}x")
PY
