# Assertions shared by the shell tests (cli, install, reports); source it after setting W, the
# case's work folder.  Each failed check prints FAIL and counts in $failures; nothing exits early.
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# expect_rc WANT CMD...: runs CMD with stdout in $W/out, stderr in $W/err; checks the exit code.
expect_rc() {
  local want=$1; shift
  "$@" > "$W/out" 2> "$W/err"
  local rc=$?
  if [ "$rc" != "$want" ]; then
    fail "exit $rc, expected $want: $*"
    sed 's/^/    out: /' "$W/out" | head -20
    sed 's/^/    err: /' "$W/err" | head -20
  fi
}
# expect_in FILE TEXT: TEXT (fixed string) occurs in FILE.
expect_in() {
  grep -qF -- "$2" "$1" || { fail "'$2' not in $(basename "$1"):"; sed 's/^/    /' "$1" | head -40; }
}
# expect_not_in FILE TEXT: TEXT does not occur in FILE, which must exist (a file never written
# holds no text, and a missing output passed as if it were clean).
expect_not_in() {
  if [ ! -r "$1" ]; then fail "$(basename "$1") is missing: cannot show '$2' is not in it"; return; fi
  ! grep -qF -- "$2" "$1" || fail "'$2' unexpectedly in $(basename "$1")"
}
