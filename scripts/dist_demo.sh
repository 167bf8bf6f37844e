#!/usr/bin/env bash
# Data-parallel MNIST over MPI on this machine: builds train_mnist with the `mpi`
# feature and runs it under `mpirun -np ${NP:-2}` (loopback shared memory; root and
# more ranks than cores allowed). Extra arguments go to train_mnist, e.g.
#   scripts/dist_demo.sh --model cnn --epochs 2
#   NP=4 scripts/dist_demo.sh --max-steps 200
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
bash scripts/fetch_mnist.sh >/dev/null
source scripts/env.sh
# TESSERA_BUILD: the cargo selection scripts/test.sh builds everything with.
# shellcheck disable=SC2086
cargo build ${TESSERA_BUILD:---release --features mpi} --example train_mnist
np="${NP:-2}"
# Share the cores between the ranks: one rayon thread each unless told otherwise.
threads="${RAYON_NUM_THREADS:-$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))}"
exec mpirun --allow-run-as-root --oversubscribe -np "$np" --mca btl self,vader \
  -x RAYON_NUM_THREADS="$threads" \
  target/release/examples/train_mnist --distributed --checkpoint-dir "${CHECKPOINT_DIR:-checkpoints}" "$@"
