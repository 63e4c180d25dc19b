#!/usr/bin/env bash
# Runs one benchmark (tools/bench.sh NAME) or all of them. Each prints its
# figures and, last, "NAME ratio=<x>" (higher is better).
#
# tools/bench.sh --check [NAME...]   (make bench-check) runs each bench with
# its goal: PCP_BENCH_CHECK=1 makes a bench exit non-zero when it misses its
# goal, and a bench fails here too when its last line is not
# "NAME ratio=<number>" or when it runs past PCP_BENCH_TIMEOUT seconds
# (default 900; diloco_comm 1800: its goal run trains four modes for 6,400
# steps, ~14 min on 2 cores). Prints a summary; exits 1 when any bench
# failed.
# PCP_BENCH_DIR overrides the directory of the benchmarks (tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${PCP_BENCH_DIR:-build/bench}
check=0
if [[ "${1:-}" == "--check" ]]; then
  check=1
  shift
fi
if [[ $check -eq 0 && $# -gt 0 && -n "$1" ]]; then
  [[ -x "$dir/$1" ]] || { echo "bench: no benchmark '$1' in $dir (have: $(ls "$dir" 2>/dev/null | tr '\n' ' '))" >&2; exit 2; }
  exec "$dir/$1"
fi
names=()
if [[ $# -gt 0 && -n "$1" ]]; then
  for n in "$@"; do
    [[ -x "$dir/$n" ]] || { echo "bench: no benchmark '$n' in $dir" >&2; exit 2; }
    names+=("$n")
  done
else
  for b in "$dir"/*; do
    [[ -f "$b" && -x "$b" ]] && names+=("$(basename "$b")")
  done
fi
[[ ${#names[@]} -gt 0 ]] || { echo "bench: no benchmarks in $dir (run make build)" >&2; exit 2; }
status=0
if [[ $check -eq 0 ]]; then
  for n in "${names[@]}"; do
    echo "== $n"
    "$dir/$n" || status=1
  done
  exit $status
fi
export PCP_BENCH_CHECK=1
# Benches whose default run is longer than the common limit.
declare -A long_limit=([diloco_comm]=1800)
summary=()
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for n in "${names[@]}"; do
  echo "== $n (check)"
  rc=0
  limit=${PCP_BENCH_TIMEOUT:-${long_limit[$n]:-900}}
  timeout --kill-after=10 "$limit" "$dir/$n" 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
  last=$(tail -n 1 "$log")
  verdict=pass
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    verdict="FAIL (ran past ${limit} s)"
  elif [[ $rc -ne 0 ]]; then
    verdict="FAIL (exit $rc: goal missed or error)"
  elif ! [[ "$last" =~ ^$n\ ratio=[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; then
    verdict="FAIL (last line is not '$n ratio=<number>': '$last')"
  fi
  [[ $verdict == pass ]] || status=1
  summary+=("$(printf '%-18s %-22s %s' "$n" "${last#"$n "}" "$verdict")")
done
echo "== bench-check summary"
printf '%s\n' "${summary[@]}"
exit $status
