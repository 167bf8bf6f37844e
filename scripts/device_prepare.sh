#!/usr/bin/env bash
# Prepare a run of scripts/device_check.sh on a lent GPU machine that has no Rust
# toolchain: build the bench and the GPU test suites here, strip and xz them into .dev/,
# and download the Vulkan/EGL loaders into .gl/ (both ignored through .git/info/exclude).
# Then call the device tool with carry [".gl", ".dev"] and the command
#   set -o pipefail; bash scripts/device_check.sh 2>&1 | tee $OUT/device.log
# (SECTIONS="variants tests" skips the peer cases). About 3 minutes here, warm.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
suites=(engine ops quant attention autograd train)
cargo build --release --example bench
cargo test --release --no-run $(printf -- '--test %s ' "${suites[@]}") 2>&1 | tee /tmp/device_prepare.log | grep -E "Executable" || true
mkdir -p .git/info .dev .gl
for p in /.gl/ /.dev/; do grep -qxF "$p" .git/info/exclude 2>/dev/null || echo "$p" >>.git/info/exclude; done
rm -f .dev/*
pack() { # binary name
  strip -o "/tmp/device_prepare.$2" "$1" && xz -T2 -6 -c "/tmp/device_prepare.$2" >".dev/$2.xz"
}
pack target/release/examples/bench bench
for t in "${suites[@]}"; do
  exe=$(sed -nE "s/.*Executable tests\/$t\.rs \((.*)\)/\1/p" /tmp/device_prepare.log | head -1)
  [ -n "$exe" ] || { echo "no test binary for $t"; exit 1; }
  pack "$exe" "$t"
done
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  mkdir -p /tmp/amd64/partial
  apt-get $o update >/dev/null
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .dev .gl
