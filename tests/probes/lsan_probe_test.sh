#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs lsan_probe (a deliberate leak) under the suite's ASAN_OPTIONS and
# LSAN_OPTIONS: it must fail with LeakSanitizer's report, which names the
# leaking function (ours, so no suppression in tools/lsan.supp may hide it).
# Usage: lsan_probe_test.sh LSAN_PROBE
set -uo pipefail
out=$("$1" 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the deliberate leak exited 0: leak checking is off" \
    "(ASAN_OPTIONS=${ASAN_OPTIONS:-})" >&2
  exit 1
fi
if ! grep -q "LeakSanitizer: detected memory leaks" <<<"$out" ||
   ! grep -q "in main .*lsan_probe.c" <<<"$out"; then
  echo "FAIL: exit $rc without a leak report naming lsan_probe.c:" >&2
  echo "$out" >&2
  exit 1
fi
echo "lsan_probe: leak reported (exit $rc), as it must be"
