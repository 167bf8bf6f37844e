#!/usr/bin/env bash
# The main demo: installs what is missing, then lists every adapter and self-checks it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
exec cargo run --release --example info
