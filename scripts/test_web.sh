#!/usr/bin/env bash
# The browser tests: builds the npm package (scripts/build_web.sh), installs the test
# driver (playwright-core, pinned in web/tests/package-lock.json; it never downloads a
# browser), then runs web/tests/run.mjs in Debian's headless Chromium on WebGPU.
# Arguments filter the tests by name. Artefacts (the demo screenshot, the packed
# tarball, a summary) land in web/tests/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build_web.sh
if [ ! -d web/tests/node_modules/playwright-core ]; then
  (cd web/tests && npm ci --no-audit --no-fund --loglevel=error)
fi
node web/tests/run.mjs "$@"
