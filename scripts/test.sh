#!/usr/bin/env bash
# Set-up plus all tests: installs missing packages, builds, runs ctest, then the ThreadSanitizer build of the core.
set -euo pipefail
cd "$(dirname "$0")/.."

export CUDAToolkit_ROOT=${CUDAToolkit_ROOT:-/usr/local/cuda}
cuda_root=$CUDAToolkit_ROOT
scripts/setup.sh
jobs=$(nproc)

echo "== build (RelWithDebInfo)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda_root" -DGPUMEM_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$jobs"

echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs"

# ctest ran the .deb from a scratch root (tests/install); as root, on a machine without gpumem
# installed, also the real thing: dpkg -i, gpumem run on the emulated device, then dpkg --purge.
if [ "$(id -u)" = 0 ] && ! dpkg-query -W gpumem > /dev/null 2>&1; then
  echo "== the .deb: dpkg -i, gpumem run, dpkg --purge"
  pkg=$(mktemp -d)
  trap 'dpkg --purge gpumem > /dev/null 2>&1 || true; rm -rf "$pkg"' EXIT
  cpack -G DEB --config build/CPackConfig.cmake -B "$pkg" > /dev/null
  dpkg -i "$pkg"/gpumem_*.deb > /dev/null
  emu=$(pwd)/build/tests/emu
  (cd "$pkg" && LD_LIBRARY_PATH=$emu/driver:$emu gpumem run --no-summary -o "$pkg/logs/" -- "$emu/emu_rt_shared_app" train 20 > /dev/null)
  ls "$pkg"/logs/gpumem-*.jsonl > /dev/null
  dpkg --purge gpumem > /dev/null
  [ ! -e /usr/bin/gpumem ] || { echo "test: dpkg --purge left /usr/bin/gpumem" >&2; exit 1; }
  rm -rf "$pkg"
  trap - EXIT
fi

echo "== ThreadSanitizer build of the core and its tests"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DGPUMEM_TSAN=ON -DCUDAToolkit_ROOT="$cuda_root" >/dev/null
tsan_targets=(core_tests)
for t in pool_tests; do
  cmake --build build-tsan --target help | grep -q " $t\$" && tsan_targets+=("$t")
done
cmake --build build-tsan -j"$jobs" --target "${tsan_targets[@]}"
# The stress cases are the point of the TSan run; halt_on_error makes any race fail the script.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
build-tsan/tests/core/core_tests "event log*"
for t in "${tsan_targets[@]:1}"; do
  bin=$(find build-tsan/tests -type f -name "$t" -perm -u+x | head -1)
  "$bin"
done
echo "== all tests passed"
