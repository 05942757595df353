#!/usr/bin/env bash
# Installs the Debian 12 packages gpumem builds and tests with, if any are missing (needs root or sudo),
# and checks that the CUDA Toolkit headers are where CUDAToolkit_ROOT (default /usr/local/cuda) says.
#
# GPUMEM_WITH_TESTS=0 leaves out what only the tests need (Catch2, python3), as scripts/demo.sh does;
# GPUMEM_WITH_BROWSER=0 leaves out chromium (the HTML report's screenshot test).
set -euo pipefail

# The product: compiler and build tools, and the libraries gpumem is built with (header-only, except
# simdjson and the analyzer's spdlog).  libcli11-dev: the gpumem command line.
# dpkg-dev: `cpack -G DEB` computes the package's dependencies with dpkg-shlibdeps.
# libdw-dev, pkg-config: the analyzer names native call-stack frames with libdw (elfutils).
packages=(cmake make g++ binutils dpkg-dev pkg-config libspdlog-dev nlohmann-json3-dev libsimdjson-dev libcli11-dev libdw-dev)
if [ "${GPUMEM_WITH_TESTS:-1}" = 1 ]; then
  packages+=(catch2 python3 strace)   # python3: the CLI tests read JSON reports and parse JUnit XML with it;
  # strace: cli_pipes checks that a piped log is read twice from its spool
fi
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

cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}
if [ ! -f "$cuda_root/include/cuda.h" ]; then
  echo "setup: no CUDA Toolkit headers at $cuda_root/include/cuda.h; install the CUDA Toolkit" \
       "(its headers are enough) or set CUDAToolkit_ROOT to where it is" >&2
  exit 1
fi
