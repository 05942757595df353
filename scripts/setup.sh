#!/usr/bin/env bash
# Installs the Debian 12 packages gpumem builds and tests with, if any are missing (needs root or sudo).
set -euo pipefail

packages=(cmake make g++ binutils python3 libspdlog-dev nlohmann-json3-dev catch2 libsimdjson-dev)
# python3: the CLI tests read JSON reports and parse JUnit XML with it.
if [ "${GPUMEM_WITH_BROWSER:-1}" = 1 ]; then
  packages+=(chromium)   # headless screenshot test of the HTML report
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x /usr/local/cuda/bin/nvcc ] && [ ! -f /usr/local/cuda/include/cuda.h ]; then
  echo "setup: the CUDA Toolkit headers are expected at /usr/local/cuda (set CUDAToolkit_ROOT otherwise)" >&2
  exit 1
fi
