#!/usr/bin/env bash
# The browser demo: builds the npm package into web/pkg, then serves the repository on
# http://localhost:8080 (open http://localhost:8080/web/demo/ in a browser with WebGPU).
# PORT=9000 picks another port. For the sentence panel, fetch MiniLM first
# (scripts/fetch_minilm.sh puts it in ~/.cache/tessera/minilm) and choose its files.
set -euo pipefail
cd "$(dirname "$0")/.."
TESSERA_SKIP_CHROMIUM=1 bash scripts/setup.sh
bash scripts/build_web.sh
exec node web/serve.mjs --port "${PORT:-8080}"
