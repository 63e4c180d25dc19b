#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Error paths of `pcp compile`, `pcp run` and `pcp --version` through the real
# binary: each gives a clear message and the documented exit code, never a
# crash (exit codes >= 128 would mean a signal).
set -u
PCP=${PCP_BINARY:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PCP_CACHE_DIR=$tmp/cache
pass=0
fail=0

# expect NAME EXIT_CODE PATTERN -- command...
expect() {
  local name=$1 want=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -eq $want ]] && grep -qE -- "$pattern" <<<"$out"; then
    pass=$((pass + 1))
    echo "ok   $name"
  else
    fail=$((fail + 1))
    echo "FAIL $name: exit $rc (want $want), output: $out"
  fi
}

cat >"$tmp/add.mlir" <<'MLIR'
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
MLIR
printf 'func.func @main(%%a: tensor<4xf32>) -> tensor<4xf32> {\n  %%0 = stablehlo.bogus %%a : tensor<4xf32>\n  return %%0 : tensor<4xf32>\n}\n' >"$tmp/bad.mlir"

expect "compile ok" 0 "wrote" -- "$PCP" compile "$tmp/add.mlir" -o "$tmp/add.vmfb"
expect "compile cache hit" 0 "cache hit" -- "$PCP" compile "$tmp/add.mlir" -o "$tmp/add.vmfb"
expect "run prints like iree-run-module" 0 "^4xf32=2 3 4 5$" -- \
  "$PCP" run "$tmp/add.vmfb" --input 4xf32=1,2,3,4 --input 4xf32=1
# Same program, same inputs: pcp run prints exactly what iree-run-module prints.
site=$("${PCP_VENV:?}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
root=$(cd "$(dirname "$0")/../.." && pwd)
"$PCP" compile "$root/examples/quickstart.mlir" -o "$tmp/q.vmfb" >/dev/null 2>&1
qin=(2x4xf32=1,2,3,4,-1,0.5,0,2 4x8xf32=0.1,-0.2,0.3,0.05,0.2,-0.1,0.4,0,0.3,0.1,-0.3,0.2,0,0.25,-0.05,0.1,-0.1,0.2,0.1,0.3,-0.2,0,0.15,0.05,0.2,0,0.05,-0.1,0.3,0.1,0,0.2 8xf32=0.01 8x3xf32=0.5,-0.2,0.1,0,0.3,-0.1,0.2,0.2,0.2,-0.3,0.1,0.4,0.1,0,-0.2,0.25,-0.25,0,0.05,0.1,0.3,-0.1,0.2,0)
ours=$("$PCP" run "$tmp/q.vmfb" "${qin[@]/#/--input=}" 2>&1)
theirs=$("$site/iree/_runtime_libs/iree-run-module" --device=local-task --module="$tmp/q.vmfb" \
  --function=main "${qin[@]/#/--input=}" 2>&1)
if [[ -n "$ours" && "$ours" == "$theirs" ]]; then
  pass=$((pass + 1)); echo "ok   output identical to iree-run-module"
else
  fail=$((fail + 1)); echo "FAIL output differs from iree-run-module:"; diff <(echo "$ours") <(echo "$theirs")
fi

expect "malformed MLIR has the diagnostic" 1 "bad.mlir:2:.*error" -- \
  "$PCP" compile "$tmp/bad.mlir" -o "$tmp/bad.vmfb"
expect "unknown backend" 2 "unknown backend 'tpu'" -- \
  "$PCP" compile "$tmp/add.mlir" --backend tpu -o "$tmp/x.vmfb"
expect "unknown cuda target" 1 "unknown cuda target 'sm_99'" -- \
  "$PCP" compile "$tmp/add.mlir" --backend cuda --target sm_99 -o "$tmp/x.vmfb"
expect "accumulate 0" 2 "'--accumulate': 0 is out of range \[1, 4096\]" -- \
  "$PCP" compile --program train "$tmp/add.mlir" --accumulate 0 -o "$tmp/x.vmfb"
expect "accumulate over 4096" 2 "'--accumulate': 4097 is out of range" -- \
  "$PCP" compile --program diloco --inner-steps 2 "$tmp/add.mlir" --accumulate 4097 -o "$tmp/x.vmfb"
expect "accumulate without --program" 2 "--accumulate needs --program" -- \
  "$PCP" compile "$tmp/add.mlir" --accumulate 2 -o "$tmp/x.vmfb"
expect "inner-state without --program diloco" 2 "--inner-state needs --program diloco" -- \
  "$PCP" compile --program train --inner-steps 2 "$tmp/add.mlir" --inner-state keep -o "$tmp/x.vmfb"
expect "unknown inner-state" 2 "must be reset or keep, got 'kept'" -- \
  "$PCP" compile --program diloco --inner-steps 2 "$tmp/add.mlir" --inner-state kept -o "$tmp/x.vmfb"
expect "unknown flag" 2 "unknown flag '--frobnicate'" -- "$PCP" run "$tmp/add.vmfb" --frobnicate
expect "unknown function" 1 "no function 'nope'.*exported: main" -- \
  "$PCP" run "$tmp/add.vmfb" --function nope
expect "wrong input count" 1 "takes 2 inputs, got 1" -- \
  "$PCP" run "$tmp/add.vmfb" --input 4xf32=1
expect "wrong input shape" 1 "expected 4xf32, got 3xf32" -- \
  "$PCP" run "$tmp/add.vmfb" --input 3xf32=1 --input 4xf32=1
expect "wrong input dtype" 1 "expected 4xf32, got 4xi32" -- \
  "$PCP" run "$tmp/add.vmfb" --input 4xi32=1 --input 4xf32=1
expect "bad input literal" 1 "has 3 values; expected 4" -- \
  "$PCP" run "$tmp/add.vmfb" --input 4xf32=1,2,3 --input 4xf32=1
expect "unknown device" 1 "unknown device driver 'tpu'" -- \
  "$PCP" run "$tmp/add.vmfb" --device tpu --input 4xf32=1 --input 4xf32=1
expect "absent gpu" 1 "UNAVAILABLE|NOT_FOUND" -- \
  "$PCP" run "$tmp/add.vmfb" --device cuda:0 --input 4xf32=1 --input 4xf32=1
head -c 4096 /dev/urandom >"$tmp/garbage.vmfb"
expect "garbage vmfb" 1 "INVALID_ARGUMENT: loading the program" -- \
  "$PCP" run "$tmp/garbage.vmfb" --input 4xf32=1 --input 4xf32=1
expect "missing program file" 1 "NOT_FOUND.*nothere.vmfb" -- "$PCP" run "$tmp/nothere.vmfb"
expect "missing venv (run)" 1 "make setup" -- \
  env PCP_VENV=/nonexistent "$PCP" run "$tmp/add.vmfb" --input 4xf32=1 --input 4xf32=1
expect "missing venv (compile)" 1 "make setup" -- \
  env PCP_VENV=/nonexistent "$PCP" compile "$tmp/add.mlir" --no-cache -o "$tmp/y.vmfb"
# A venv whose site-packages lacks the wheels.
mkdir -p "$tmp/fakevenv/bin" "$tmp/fakevenv/lib/python3.11/site-packages"
ln -s /usr/bin/python3.11 "$tmp/fakevenv/bin/python3"
printf 'home = /usr/bin\ninclude-system-site-packages = false\n' >"$tmp/fakevenv/pyvenv.cfg"
expect "missing wheel" 1 "IREE runtime unavailable.*make setup" -- \
  env PCP_VENV=$tmp/fakevenv "$PCP" run "$tmp/add.vmfb" --input 4xf32=1 --input 4xf32=1
expect "version" 0 "iree-compiler: 3\.13" -- "$PCP" --version
expect "version without venv" 0 "iree-runtime: unavailable" -- env PCP_VENV=/nonexistent "$PCP" --version

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
