#!/usr/bin/env bash
# Runs one benchmark (tools/bench.sh NAME) or all of them. Each prints its
# figures and, last, "NAME ratio=<x>".
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build/bench
if [[ $# -gt 0 && -n "$1" ]]; then
  [[ -x "$dir/$1" ]] || { echo "bench: no benchmark '$1' in $dir (have: $(ls "$dir" 2>/dev/null | tr '\n' ' '))" >&2; exit 2; }
  exec "$dir/$1"
fi
status=0
for b in "$dir"/*; do
  [[ -f "$b" && -x "$b" ]] || continue
  echo "== $(basename "$b")"
  "$b" || status=1
done
exit $status
