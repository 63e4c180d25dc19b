#!/usr/bin/env bash
# tools/sim.sh: runs a batch of seeds, replays one seed byte for byte, and
# refuses bad usage (exit 2).
set -euo pipefail
root=$1
sim="$root/tools/sim.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$sim" --seeds 20 --first 2000 > "$out/batch.txt"
grep -q '^20 seeds from 2000: 0 failed' "$out/batch.txt"
"$sim" --seed 2001 --trace > "$out/a.txt"
"$sim" --seed 2001 --trace > "$out/b.txt"
cmp "$out/a.txt" "$out/b.txt"
[[ $(wc -l < "$out/a.txt") -gt 100 ]]
tail -n 1 "$out/a.txt" | grep -q '^seed 2001 passed: '
rc=0
"$sim" --seeds 0 > /dev/null 2>&1 || rc=$?
[[ $rc -eq 2 ]]
rc=0
"$sim" --seed 1 --workers 99 > /dev/null 2>&1 || rc=$?
[[ $rc -eq 2 ]]
echo "sim_tool: ok"
