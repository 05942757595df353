#!/usr/bin/env bash
# Tests of the first ten minutes: `cmake --install` (docs, man page), the .deb from `cpack -G DEB`
# unpacked into a scratch root and run there, and scripts/demo.sh on the binaries already built.
#
# usage: install_test.sh CASE   with GPUMEM, BUILD (build tree), SRC (source tree) and WORK set.
set -uo pipefail
case_name=$1
: "${GPUMEM:?}" "${BUILD:?}" "${SRC:?}" "${WORK:?}"
EMU=$BUILD/tests/emu
W=$WORK/$case_name
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
. "$SRC/tests/lib/expect.sh"

case $case_name in
install_docs)
  # bin and lib are checked by tests/cli (run_installed); here the docs and the man page.
  cmake --install "$BUILD" --prefix "$W/prefix" > "$W/install.log" || fail "cmake --install failed"
  for f in README.md guide.md log-format.md metrics.md pool.md; do
    [ -f "$W/prefix/share/doc/gpumem/$f" ] || fail "no share/doc/gpumem/$f"
  done
  man=$W/prefix/share/man/man1/gpumem.1
  [ -f "$man" ] || fail "no share/man/man1/gpumem.1"
  expect_in "$man" ".TH GPUMEM 1"
  # Each subcommand's --help is in the page, word for word apart from roff escapes.
  # Every subcommand `gpumem --help` lists (at least these four).
  subs=$("$GPUMEM" --help | sed -n '/^Subcommands:/,$p' | sed -n 's/^  \([a-z][a-z0-9_-]*\) .*/\1/p')
  for s in report run check diff; do echo "$subs" | grep -qx "$s" || fail "gpumem --help does not list $s"; done
  # Every line of it that roff leaves as written (none starting with . or ', none with a backslash):
  # the check took line 3 alone, which is blank in CLI11's layout, and so compared nothing.
  for sub in $subs; do
    expect_in "$man" ".SH GPUMEM $(echo "$sub" | tr a-z A-Z)"
    "$GPUMEM" "$sub" --help 2>&1 | grep -v '^[.'"'"']' | grep -v '\\' | grep -v '^$' > "$W/help-$sub.txt"
    [ "$(wc -l < "$W/help-$sub.txt")" -ge 5 ] || fail "gpumem $sub --help: fewer than 5 lines to compare: $(cat "$W/help-$sub.txt")"
    missing=$(grep -vxF -f "$man" "$W/help-$sub.txt")
    [ -z "$missing" ] || fail "gpumem $sub --help lines not in gpumem.1: $missing"
  done
  if command -v man > /dev/null; then
    man -l "$man" > "$W/man.txt" 2>&1 || fail "man -l cannot render gpumem.1"
    # As the guide says: with PREFIX/bin on the PATH, `man gpumem` finds PREFIX/share/man.
    [ "$(PATH=$W/prefix/bin:$PATH man -w gpumem 2>&1)" = "$man" ] || fail "man -w gpumem does not find $man"
  fi
  ;;
package_deb)
  # Build the .deb, unpack it into a scratch root (dpkg -x: the system stays as it was) and run its
  # gpumem there: it must find the packaged libgpumem.so, two folders up from /usr/bin.
  expect_rc 0 cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$W/pkg"
  deb=$(ls "$W"/pkg/gpumem_*.deb 2>/dev/null | head -1)
  [ -n "$deb" ] || { fail "cpack wrote no gpumem_*.deb"; cat "$W/out" "$W/err"; }
  dpkg-deb -f "$deb" Package Version Depends > "$W/control"
  expect_in "$W/control" "Package: gpumem"
  expect_in "$W/control" "libc6"
  dpkg-deb -c "$deb" > "$W/contents"
  for f in ./usr/bin/gpumem ./usr/lib/libgpumem.so ./usr/share/man/man1/gpumem.1 ./usr/share/doc/gpumem/guide.md; do
    expect_in "$W/contents" "$f"
  done
  dpkg-deb -x "$deb" "$W/root"
  # The packaged library still needs nothing beyond libc (it is stripped, not relinked).
  readelf -d "$W/root/usr/lib/libgpumem.so" | grep NEEDED > "$W/needed"
  # An empty list (readelf missing, or failing on the file) passed the check below: libc must be in it.
  expect_in "$W/needed" "libc.so"
  grep -vE 'libc\.so|libm\.so|ld-linux|libdl\.so|libpthread\.so' "$W/needed" && fail "packaged libgpumem.so needs more than libc"
  export LD_LIBRARY_PATH=$EMU/driver:$EMU
  expect_rc 0 "$W/root/usr/bin/gpumem" run -- sh -c 'echo "preload=$LD_PRELOAD"'
  expect_in "$W/out" "preload=$W/root/usr/lib/libgpumem.so"
  expect_rc 0 "$W/root/usr/bin/gpumem" run -o "$W/logs/" -- "$EMU/emu_rt_shared_app" train 20
  expect_in "$W/out" "steps=20"
  expect_in "$W/err" "gpumem run: 1 log"
  expect_rc 0 "$W/root/usr/bin/gpumem" report "$W"/logs/gpumem-*.jsonl
  expect_in "$W/out" "Requested memory"
  ;;
demo)
  # The demo's steps after the build, on the binaries of this build: gpumem run, the text and HTML
  # reports, the three closing lines, and nothing left in TMPDIR.
  mkdir -p "$W/tmp"
  expect_rc 0 env TMPDIR="$W/tmp" GPUMEM_DEMO_NO_BUILD=1 GPUMEM_DEMO_BUILD="$BUILD" GPUMEM_DEMO_OUT="$W/demo" \
    GPUMEM_DEMO_STEPS=50 bash "$SRC/scripts/demo.sh"
  expect_in "$W/out" "== gpumem run -o $W/demo/ -- $EMU/emu_rt_shared_app train 50"
  expect_in "$W/out" "steps=50"
  expect_in "$W/out" "Requested memory"
  [ -s "$W/demo/report.html" ] || fail "no $W/demo/report.html"
  grep -q "</html>" "$W/demo/report.html" || fail "report.html is incomplete"
  [ "$(ls "$W"/demo/gpumem-*.jsonl | wc -l)" = 1 ] || fail "expected one log in $W/demo"
  tail -3 "$W/out" > "$W/last3"
  expect_in "$W/last3" "binaries: $BUILD/analyzer/gpumem and $BUILD/preload/libgpumem.so"
  expect_in "$W/last3" "HTML report: open file://$W/demo/report.html"
  expect_in "$W/last3" "your own program: LD_LIBRARY_PATH=$EMU/driver:$EMU $BUILD/analyzer/gpumem run -- PROGRAM"
  [ -z "$(ls -A "$W/tmp")" ] || fail "the demo left $(ls "$W/tmp") in TMPDIR"
  # The command it prints for your own program works as printed (here with the demo's program).
  cmd=$(sed -n 's/^your own program: \(.*\) -- PROGRAM .*/\1/p' "$W/last3")
  expect_rc 0 env -u LD_LIBRARY_PATH bash -c "cd '$W' && $cmd -o '$W/own/' -- '$EMU/emu_rt_shared_app' train 5"
  expect_in "$W/err" "gpumem run: 1 log"
  ;;
emu_without_tests)
  # What scripts/demo.sh configures: the emulated device without the tests, and without Catch2
  # (CMAKE_DISABLE_FIND_PACKAGE_Catch2 makes any find_package(Catch2) fail).
  expect_rc 0 cmake -S "$SRC" -B "$W/b" -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_BUILD_EMU=ON -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON \
    ${CUDAToolkit_ROOT:+-DCUDAToolkit_ROOT=$CUDAToolkit_ROOT}
  cmake --build "$W/b" --target help > "$W/targets"
  for t in gpumem gpumem_preload gpumem_emu_cuda emu_rt_shared_app; do expect_in "$W/targets" "... $t"; done
  grep -qE '\.\.\. (core_tests|integration_tests|analyzer_tests)$' "$W/targets" && fail "test targets configured with GPUMEM_BUILD_TESTS=OFF"
  # The same without GPUMEM_BUILD_EMU: the product alone.
  expect_rc 0 cmake -S "$SRC" -B "$W/p" -DGPUMEM_BUILD_TESTS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Catch2=ON \
    ${CUDAToolkit_ROOT:+-DCUDAToolkit_ROOT=$CUDAToolkit_ROOT}
  cmake --build "$W/p" --target help > "$W/product"
  expect_in "$W/product" "... gpumem_preload"
  grep -q "emu_rt_shared_app" "$W/product" && fail "emulated device configured without GPUMEM_BUILD_EMU"
  ;;
setup_cuda_root)
  # scripts/setup.sh looks for the CUDA headers where CUDAToolkit_ROOT says (test.sh and demo.sh
  # export it).  The packages are installed by then (test.sh ran setup.sh first), so this installs nothing.
  expect_rc 1 env CUDAToolkit_ROOT="$W/no-cuda" GPUMEM_WITH_TESTS=0 GPUMEM_WITH_BROWSER=0 bash "$SRC/scripts/setup.sh"
  expect_in "$W/err" "no CUDA Toolkit headers at $W/no-cuda/include/cuda.h"
  mkdir -p "$W/cuda/include" && touch "$W/cuda/include/cuda.h"
  expect_rc 0 env CUDAToolkit_ROOT="$W/cuda" GPUMEM_WITH_TESTS=0 GPUMEM_WITH_BROWSER=0 bash "$SRC/scripts/setup.sh"
  expect_in "$SRC/scripts/test.sh" 'export CUDAToolkit_ROOT=${CUDAToolkit_ROOT:-/usr/local/cuda}'
  expect_in "$SRC/scripts/demo.sh" 'export CUDAToolkit_ROOT=${CUDAToolkit_ROOT:-/usr/local/cuda}'
  ;;
guide_install)
  # docs/guide.md's Install section and its GitHub Actions job install exactly the packages that
  # scripts/setup.sh installs for the product, and the job puts the install folder on the PATH.
  guide=$SRC/docs/guide.md
  want=$(sed -n 's/^packages=(\(.*\))$/\1/p' "$SRC/scripts/setup.sh" | tr ' ' '\n' | sort | tr '\n' ' ')
  [ -n "$want" ] || fail "no packages=(...) line in scripts/setup.sh"
  n=0
  while IFS= read -r line; do
    got=$(echo "$line" | sed 's/.*--no-install-recommends //' | tr ' ' '\n' | grep -v '^$' | sort | tr '\n' ' ')
    [ "$got" = "$want" ] || fail "guide.md installs '$got', setup.sh '$want'"
    n=$((n + 1))
  done < <(grep 'apt-get install' "$guide")
  [ "$n" = 2 ] || fail "expected 2 apt-get install lines in guide.md (Install, GitHub Actions), found $n"
  expect_in "$guide" 'echo "$HOME/.local/bin" >> "$GITHUB_PATH"'
  expect_in "$guide" 'cmake --install /tmp/gpumem/build --prefix "$HOME/.local"'
  ;;
*)
  echo "unknown case $case_name"; exit 2 ;;
esac

if [ "$failures" -gt 0 ]; then
  echo "$case_name: $failures failure(s)"
  exit 1
fi
echo "$case_name: ok"
