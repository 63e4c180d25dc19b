#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tools/bench.sh --check (make bench-check): a bench that misses its goal
# (non-zero exit under PCP_BENCH_CHECK=1), one whose last line is not
# "NAME ratio=<number>" and one that runs past PCP_BENCH_TIMEOUT each fail
# the run; benches that meet their goals pass it; plain mode runs them
# without PCP_BENCH_CHECK.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
check() {  # check DESCRIPTION CONDITION...
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; failures=$((failures + 1)); fi
}
bench() {  # bench NAME BODY
  printf '#!/usr/bin/env bash\n%s\n' "$2" >"$dir/$1"
  chmod +x "$dir/$1"
}
# Meets its goal only when PCP_BENCH_CHECK is set (proves it is exported).
bench good 'echo figures; [[ "${PCP_BENCH_CHECK:-}" == 1 ]] || exit 3; echo "good ratio=1.25"'
bench missed 'echo "missed goal x: MISSED"; echo "missed ratio=0.5"; [[ "${PCP_BENCH_CHECK:-}" == 1 ]] && exit 1; exit 0'
bench noratio 'echo "noratio ratio=fast"'
bench slow 'sleep 30; echo "slow ratio=1"'

export PCP_BENCH_DIR="$dir" PCP_BENCH_TIMEOUT=2
out=$("$root/tools/bench.sh" --check good 2>&1)
check "a bench that meets its goal passes (exit $?)" test $? -eq 0
check "summary names it" grep -qE '^good +ratio=1.25 +pass$' <<<"$out"

for name in missed noratio slow; do
  out=$("$root/tools/bench.sh" --check good "$name" 2>&1)
  rc=$?
  check "$name fails the run (exit $rc)" test $rc -eq 1
  check "$name is FAIL in the summary" grep -qE "^$name .*FAIL" <<<"$out"
  check "good still passes beside $name" grep -qE '^good .*pass$' <<<"$out"
done
out=$("$root/tools/bench.sh" --check 2>&1)
check "all benches: the run fails" test $? -eq 1
summary=$(sed -n '/^== bench-check summary$/,$p' <<<"$out")
check "all four in the summary, one failing each way" test "$(grep -cE '^(good +ratio=1.25 +pass|missed .*FAIL \(exit 1|noratio .*FAIL \(last line|slow .*FAIL \(ran past)' <<<"$summary")" -eq 4

# Plain mode: no PCP_BENCH_CHECK, so a missed goal is printed, exit 0.
out=$("$root/tools/bench.sh" missed 2>&1)
check "plain mode prints the miss and exits 0" test $? -eq 0
check "plain mode output" grep -q "MISSED" <<<"$out"
"$root/tools/bench.sh" nosuch >/dev/null 2>&1
check "unknown bench: exit 2" test $? -eq 2
"$root/tools/bench.sh" --check nosuch >/dev/null 2>&1
check "unknown bench in check mode: exit 2" test $? -eq 2

[[ $failures -eq 0 ]] || { echo "$failures check(s) failed"; exit 1; }
echo "all bench-check checks passed"
