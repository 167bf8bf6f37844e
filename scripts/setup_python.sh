#!/usr/bin/env bash
# Makes .venv (a Python virtual environment for the project's Python tools) and
# installs scripts/requirements.txt into it; does nothing when .venv already holds
# exactly those packages.
set -euo pipefail
cd "$(dirname "$0")/.."
req=scripts/requirements.txt
stamp=.venv/.requirements
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && cmp -s "$req" "$stamp"; then
  echo "[python] .venv is up to date"
  exit 0
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
echo "[python] installing $(grep -cv '^#' "$req") packages into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$req"
cp "$req" "$stamp"
