#!/usr/bin/env bash
# The main demo: installs what is missing, then trains on real MNIST digits
# (arguments go to the example: --model cnn, --epochs N, --resume, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch_mnist.sh
source scripts/env.sh
exec cargo run --release --example train_mnist -- "$@"
