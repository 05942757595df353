#!/usr/bin/env bash
# Set-up plus all tests: installs missing packages, builds, runs ctest, then the ThreadSanitizer build of
# the core, the ASan+UBSan analyzer over the bad-input corpus, and 60 s of libFuzzer (with clang).
set -euo pipefail
cd "$(dirname "$0")/.."

export CUDAToolkit_ROOT=${CUDAToolkit_ROOT:-/usr/local/cuda}
cuda_root=$CUDAToolkit_ROOT
scripts/setup.sh
jobs=$(nproc)

# Each stage prints its seconds: CI's budget is about 15 minutes on 2 cores (docs/benchmarks.md).
echo "== build (RelWithDebInfo)"
t_stage=$SECONDS
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$cuda_root" -DGPUMEM_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$jobs"
echo "(build: $((SECONDS - t_stage)) s)"

echo "== tests"
t_stage=$SECONDS
# --no-tests=error: a tree where no test was registered fails (ctest passes it with exit 0).
ctest --test-dir build --output-on-failure -j"$jobs" --no-tests=error
echo "(tests: $((SECONDS - t_stage)) s)"

# ctest ran the .deb from a scratch root (tests/install); as root, on a machine without gpumem
# installed, also the real thing: dpkg -i, gpumem run on the emulated device, then dpkg --purge.
if [ "$(id -u)" = 0 ] && ! dpkg-query -W gpumem > /dev/null 2>&1; then
  echo "== the .deb: dpkg -i, gpumem run, dpkg --purge"
  t_stage=$SECONDS
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
  echo "(the .deb: $((SECONDS - t_stage)) s)"
else
  echo "== the .deb: dpkg -i, gpumem run, dpkg --purge: SKIPPED ($( [ "$(id -u)" = 0 ] && echo "gpumem is installed on this machine" || echo "not root"))"
fi

echo "== ThreadSanitizer build of the core and its tests"
t_stage=$SECONDS
# Debug (asserts on) at -O1, as TSan's documentation advises for speed: the "event log*" run took
# 325 s at -O0 and 117 s at -O1, the same 3,000,177 assertions (docs/benchmarks.md); most of it is
# the test reading back its 1M lines on one thread, not the threads under test.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DGPUMEM_TSAN=ON \
  -DCUDAToolkit_ROOT="$cuda_root" >/dev/null
cmake --build build-tsan -j"$jobs" --target core_tests pool_tests
# The cases with threads are the point of the TSan run; halt_on_error makes any race fail the
# script.  The pool's: its 8-thread stress, the registry's lock-free lookups and switch, the
# capture table, and giveable_bytes beside a waiting operation (18 s).  The TSan tree builds
# pool_tests from the files that start threads alone (tests/pool/CMakeLists.txt): the rest, mostly
# single-threaded property runs, took 200 s to run and 36 s of CPU to compile under TSan.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
# -w NoTests: a name here that matches nothing (a renamed case) fails instead of passing.
# The core's threaded cases: the event log's, and the lock-free handle table's (add, set, find and
# take from 4 threads, and mempool_kinds' notes on it).
build-tsan/tests/core/core_tests -w NoTests "event log*,handle_table*,mempool_kinds*"
build-tsan/tests/pool/pool_tests -w NoTests "[threads],[registry],capture table*,giveable_bytes never waits*"
echo "(ThreadSanitizer build and run: $((SECONDS - t_stage)) s)"

# The analyzer reads hostile input (issue 14): an ASan+UBSan build of it alone (libgpumem.so is never
# sanitized) runs the bad-input corpus and every log under tests/data through each command and
# output, then, with clang, libFuzzer runs on the parser and the whole analysis.  ccache, when
# installed, makes a rebuild of unchanged sources cheap.
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
t_san=$SECONDS
# -O1 without debug info: the gcc build took 287 s instead of 548 s at RelWithDebInfo
# (docs/benchmarks.md), and ASan's reports still name each frame's function.
if command -v clang++ > /dev/null; then
  # One clang tree makes both gpumem and fuzz_parser from the same ASan+UBSan objects, which also
  # carry libFuzzer's coverage (GPUMEM_ASAN with GPUMEM_FUZZ): the analyzer is compiled once
  # instead of in a gcc tree and again in a clang one.  That took 278 s of CPU against 460 s for
  # the two, and this -O1 fuzz_parser runs about twice as many inputs a minute as the
  # RelWithDebInfo one did (docs/benchmarks.md).
  san=build-san
  echo "== AddressSanitizer+UBSan build of the analyzer (clang, with libFuzzer coverage): gpumem and fuzz_parser"
  cmake -S . -B "$san" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O1 -DGPUMEM_ASAN=ON -DGPUMEM_FUZZ=ON \
    -DGPUMEM_BUILD_TESTS=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCUDAToolkit_ROOT="$cuda_root" \
    "${launcher[@]}" >/dev/null
  cmake --build "$san" -j"$jobs" --target gpumem fuzz_parser
else
  san=build-asan
  echo "== AddressSanitizer+UBSan build of the analyzer (gcc; no clang, so no libFuzzer run): gpumem"
  cmake -S . -B "$san" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O1 -DGPUMEM_ASAN=ON -DGPUMEM_BUILD_TESTS=OFF \
    -DCUDAToolkit_ROOT="$cuda_root" "${launcher[@]}" >/dev/null
  cmake --build "$san" -j"$jobs" --target gpumem
fi
echo "(sanitizer build: $((SECONDS - t_san)) s)"

echo "== the bad-input corpus and the logs under tests/data through the ASan+UBSan gpumem"
t_corpus=$SECONDS
tests/cli/sanitizer_corpus.sh "$san/analyzer/gpumem" "$(pwd)" "$san/corpus-run"
echo "(corpus: $((SECONDS - t_corpus)) s)"

# libFuzzer on the log parser and the whole analysis (tests/analyzer/fuzz_parser.cc) for 60 s;
# seeded with every log under tests/data, and the corpus it grows is kept in build-san/fuzz/corpus
# for the next run.  A crash, or any UBSan finding (-fno-sanitize-recover), fails the script; its
# input stays in build-san/fuzz/crashes/.
if [ "$san" = build-san ]; then
  echo "== libFuzzer: the analyzer's parser for ${GPUMEM_FUZZ_SECONDS:-60} s"
  t_fuzz=$SECONDS
  fuzz=$san/fuzz
  mkdir -p "$fuzz/corpus" "$fuzz/seeds" "$fuzz/crashes"
  cp tests/data/bad/* tests/data/golden/*.jsonl tests/data/cli/*.jsonl tests/data/h200/*.jsonl tests/data/fuzz_seeds/*.jsonl \
     "$fuzz/seeds/"
  # The start of each gzipped log (head closes the pipe early: zcat's SIGPIPE is expected).
  for z in tests/data/replay/*.jsonl.gz; do zcat "$z" 2> /dev/null | head -c 65536 > "$fuzz/seeds/$(basename "$z" .gz)" || true; done
  fuzz_bin=$(find "$san/tests" -type f -name fuzz_parser -perm -u+x | head -1)
  if ! "$fuzz_bin" -max_total_time="${GPUMEM_FUZZ_SECONDS:-60}" -timeout=20 -max_len=65536 -print_final_stats=1 \
       -artifact_prefix="$fuzz/crashes/" "$fuzz/corpus" "$fuzz/seeds" > "$fuzz/fuzz.log" 2>&1; then
    tail -60 "$fuzz/fuzz.log"
    echo "test: libFuzzer found a failing input; kept in $(pwd)/$fuzz/crashes/:" >&2
    for c in "$fuzz"/crashes/*; do
      [ -f "$c" ] || continue
      echo "  $c ($(stat -c %s "$c") bytes), base64:" >&2
      head -c 4096 "$c" | base64 >&2
    done
    exit 1
  fi
  grep -E "^stat::(number_of_executed_units|peak_rss_mb)|^Done" "$fuzz/fuzz.log" || true
  echo "(libFuzzer run: $((SECONDS - t_fuzz)) s)"
fi
echo "(sanitizer stages in all: $((SECONDS - t_san)) s)"
echo "== all tests passed"
