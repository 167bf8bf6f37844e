#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks for Tessera's demo and tests, idempotently:
# each step checks first and skips what is already present.
#   - Mesa's lavapipe (software Vulkan) when no Vulkan driver is installed, so wgpu has
#     an adapter on a machine without a GPU;
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
if [ ${#apt_missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    log "installing ${apt_missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${apt_missing[@]}" >/dev/null
  else
    log "no apt-get: install a Vulkan driver (Mesa lavapipe) by hand"
  fi
else
  log "Vulkan driver present"
fi

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
if [ ${#web_missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    log "installing ${web_missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${web_missing[@]}" >/dev/null
  else
    log "no apt-get: install ${web_missing[*]} by hand for the browser package"
  fi
else
  log "wasm-opt and chromium present"
fi
