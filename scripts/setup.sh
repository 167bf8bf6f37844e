#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks for Tessera's demo and tests, idempotently:
# each step checks first and skips what is already present.
#   - Mesa's lavapipe (software Vulkan) when no Vulkan driver is installed, so wgpu has
#     an adapter on a machine without a GPU, and Mesa's software OpenGL;
#   - the wasm32-unknown-unknown Rust target, for the browser build check.
set -euo pipefail

log() { printf '[setup] %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else
    log "need root to run: $*"; return 1; fi
}

apt_missing=()
have_icd() { compgen -G '/usr/share/vulkan/icd.d/*.json' >/dev/null || compgen -G '/etc/vulkan/icd.d/*.json' >/dev/null; }
have_loader() { local libs; libs=$(ldconfig -p 2>/dev/null || true); [[ "$libs" == *libvulkan.so.1* ]]; }
if ! have_icd || ! have_loader; then
  apt_missing+=(mesa-vulkan-drivers libvulkan1)
fi
# Mesa's EGL and software OpenGL: the adapter wgpu falls back to without a Vulkan
# driver, which tests/reliability.rs opens to check what the device says about it.
gl_dir=/usr/lib/$(uname -m)-linux-gnu
if [ ! -e "$gl_dir/libEGL_mesa.so.0" ] || [ ! -e "$gl_dir/dri/swrast_dri.so" ]; then
  apt_missing+=(libegl-mesa0 libgl1-mesa-dri)
fi
# apt_install WHAT-FOR PRESENT-MESSAGE PACKAGE...: install the packages (none: say so).
apt_install() {
  local what=$1 present=$2
  shift 2
  if [ $# -eq 0 ]; then
    log "$present"
  elif command -v apt-get >/dev/null 2>&1; then
    log "installing $*"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
  else
    log "no apt-get: install $* by hand ($what)"
  fi
}

apt_install "a Vulkan driver, Mesa's lavapipe" "Vulkan driver present" "${apt_missing[@]}"

if command -v rustup >/dev/null 2>&1; then
  if ! rustup target list --installed | grep -qx 'wasm32-unknown-unknown'; then
    log "adding the wasm32-unknown-unknown target"
    rustup target add wasm32-unknown-unknown >/dev/null
  else
    log "wasm32-unknown-unknown present"
  fi
fi

# The browser package and its tests (scripts/build_web.sh, scripts/test_web.sh):
# binaryen's wasm-opt, and Debian's Chromium (headless, with a real WebGPU adapter)
# unless TESSERA_SKIP_CHROMIUM=1 (the demo server needs no browser here).
web_missing=()
command -v wasm-opt >/dev/null 2>&1 || web_missing+=(binaryen)
if [ "${TESSERA_SKIP_CHROMIUM:-0}" != "1" ] && ! command -v chromium >/dev/null 2>&1; then
  web_missing+=(chromium)
fi
apt_install "the browser package" "wasm-opt and chromium present" "${web_missing[@]}"

# The inference server's tests check /metrics with promtool (Debian's prometheus).
serve_missing=()
command -v promtool >/dev/null 2>&1 || serve_missing+=(prometheus)
apt_install "the server's metrics check" "promtool present" "${serve_missing[@]}"

# Data-parallel training over MPI (cargo feature `mpi`): Open MPI, and libclang for
# rsmpi's bindgen.
mpi_missing=()
command -v mpirun >/dev/null 2>&1 || mpi_missing+=(openmpi-bin)
[ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || compgen -G '/usr/lib/*/openmpi/include/mpi.h' >/dev/null \
  || mpi_missing+=(libopenmpi-dev)
compgen -G '/usr/lib/llvm-*/lib/libclang.so*' >/dev/null || mpi_missing+=(libclang-dev)
apt_install "MPI for distributed training" "Open MPI and libclang present" "${mpi_missing[@]}"

# The desktop example's screenshot test (scripts/desktop_check.sh): Xvfb, and the X11
# libraries winit opens at run time.
desktop_missing=()
command -v xvfb-run >/dev/null 2>&1 || desktop_missing+=(xvfb xauth)
for lib in libxkbcommon-x11.so.0:libxkbcommon-x11-0 libXcursor.so.1:libxcursor1 libXrandr.so.2:libxrandr2 \
  libXi.so.6:libxi6 libX11-xcb.so.1:libx11-xcb1; do
  ldconfig -p 2>/dev/null | grep -q "${lib%%:*}" || desktop_missing+=("${lib##*:}")
done
apt_install "the desktop example's screenshot test" "Xvfb and the X11 libraries present" "${desktop_missing[@]}"
