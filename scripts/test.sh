#!/usr/bin/env bash
# Set-up plus all tests: installs missing packages, builds, runs ctest, then the ThreadSanitizer build of the core.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
jobs=$(nproc)
cuda_root=${CUDAToolkit_ROOT:-/usr/local/cuda}

echo "== build (RelWithDebInfo)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda_root" >/dev/null
cmake --build build -j"$jobs"

echo "== tests"
ctest --test-dir build --output-on-failure -j"$jobs"

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
