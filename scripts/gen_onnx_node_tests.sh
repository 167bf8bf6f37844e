#!/usr/bin/env bash
# Writes onnx's official node test cases (model.onnx + test_data_set_N/{input,output}_K.pb
# per case, ~1,900 cases) from the onnx package pinned in scripts/requirements.txt,
# into OUT (first argument; default ${TESSERA_DATA:-~/.cache/tessera}/onnx-node-tests).
# A stamp file records the onnx version: reruns with the same version do nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-${TESSERA_DATA:-$HOME/.cache/tessera}/onnx-node-tests}"
bash "$root/scripts/setup_python.sh"
py="$root/.venv/bin/python"
# The stamp names the onnx version and the helper's hash, so either changing regenerates.
ver="onnx==$("$py" -c 'import onnx; print(onnx.__version__)') gen=$(sha256sum "$root/scripts/gen_onnx_node_tests.py" | cut -c1-12)"
stamp="$out/.stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$ver" ]; then
  echo "[onnx-node-tests] present in $out ($ver, $(find "$out" -mindepth 1 -maxdepth 1 -type d | wc -l) cases)"
  exit 0
fi
mkdir -p "$(dirname "$out")"
"$py" "$root/scripts/gen_onnx_node_tests.py" "$out"
echo "$ver" > "$stamp"
