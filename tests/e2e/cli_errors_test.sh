#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Error paths of every pcp command through the real binary: each gives a clear
# message and the documented exit code (0 done, 1 the work failed, 2 usage:
# docs/cli.md), never a crash (exit codes >= 128 would mean a signal), and no
# message a user sees names an internal status code or a source location.
set -u
PCP=${PCP_BINARY:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PCP_CACHE_DIR=$tmp/cache
pass=0
fail=0
# Every output `expect` sees, for the final check on internal names.
all_out=$tmp/all_output.txt
: >"$all_out"

# expect NAME EXIT_CODE PATTERN -- command...
expect() {
  local name=$1 want=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  printf '%s\n' "$out" >>"$all_out"
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
expect "unknown cuda target (a flag value)" 2 "unknown cuda target 'sm_99'" -- \
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
expect "bad input literal (a flag value)" 2 "--input '4xf32=1,2,3': input 4xf32 has 3 values; expected 4" -- \
  "$PCP" run "$tmp/add.vmfb" --input 4xf32=1,2,3 --input 4xf32=1
expect "unknown device (a flag value)" 2 "unknown device driver 'tpu'" -- \
  "$PCP" run "$tmp/add.vmfb" --device tpu --input 4xf32=1 --input 4xf32=1
expect "absent gpu" 1 "the cuda driver cannot start here" -- \
  "$PCP" run "$tmp/add.vmfb" --device cuda:0 --input 4xf32=1 --input 4xf32=1
head -c 4096 /dev/urandom >"$tmp/garbage.vmfb"
expect "garbage vmfb" 1 "^pcp run: loading the program: .*FlatBuffer" -- \
  "$PCP" run "$tmp/garbage.vmfb" --input 4xf32=1 --input 4xf32=1
expect "missing program file" 1 "^pcp run: opening '.*nothere.vmfb': No such file" -- "$PCP" run "$tmp/nothere.vmfb"
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

# One CLI (issue 13). For every command: an unknown flag close to a real one
# exits 2 naming it, a bad flag value exits 2, failed work exits 1.
printf '{"facets": [["a", "b"], ["b", "c"]]}\n' >"$tmp/path.json"
printf '{"facets": 3}\n' >"$tmp/badcomplex.json"
expect "chat: typo" 2 "unknown flag '--temprature' \(did you mean '--temperature'\?\)" -- \
  "$PCP" chat --temprature 1 hi
expect "chat: bad value" 2 "'--timeout-s': 0 is out of range" -- "$PCP" chat --timeout-s 0 hi
expect "chat: no server" 1 "^pcp chat: cannot reach the server" -- \
  "$PCP" chat --url http://127.0.0.1:1 hi
expect "compile: typo" 2 "did you mean '--backend'" -- \
  "$PCP" compile "$tmp/add.mlir" --backnd cpu -o "$tmp/x.vmfb"
expect "compile: bad --iree-flag" 2 "iree-flag" -- \
  "$PCP" compile "$tmp/add.mlir" --iree-flag "-o /etc/x" -o "$tmp/x.vmfb"
expect "inspect: typo" 2 "did you mean '--function'" -- "$PCP" inspect "$tmp/add.mlir" --functon main
expect "inspect: bad value" 2 "'--json': expected true or false" -- "$PCP" inspect "$tmp/add.mlir" --json=maybe
expect "inspect: missing file" 1 "^pcp inspect: opening" -- "$PCP" inspect "$tmp/nothere.mlir"
expect "inspect: no such function" 1 "nope" -- "$PCP" inspect "$tmp/add.mlir" --function nope
expect "model: typo" 2 "did you mean '--layers'" -- "$PCP" model gpt --layer 2 -o "$tmp/m.mlir"
expect "model: bad value" 2 "'--layers': expected an integer, got 'two'" -- \
  "$PCP" model gpt --layers two -o "$tmp/m.mlir"
expect "model: unwritable output" 1 "^pcp model: .*nodir" -- \
  "$PCP" model gpt -o "$tmp/nodir/sub/m.mlir"
expect "run: typo" 2 "did you mean '--input'" -- "$PCP" run "$tmp/add.vmfb" --inptu 4xf32=1
expect "run: bad --output" 2 "--output 'x': expected -, @file.npy" -- \
  "$PCP" run "$tmp/add.vmfb" --input 4xf32=1 --input 4xf32=1 --output x
expect "run: bad value" 2 "'--print-max-elements': 0 is out of range" -- \
  "$PCP" run "$tmp/add.vmfb" --print-max-elements 0
expect "submit: typo" 2 "unknown flag '--gatway' \(did you mean '--gateway'\?\)" -- \
  "$PCP" submit train "$tmp/exp.json" --gatway http://x
expect "submit: bad value" 2 "'--poll-ms': 5 is out of range \[10, 60000\]" -- \
  "$PCP" submit train "$tmp/exp.json" --poll-ms 5
expect "submit: bad URL" 2 "--gateway must start with http:// or https://, got 'gw:8000'" -- \
  "$PCP" submit train "$tmp/exp.json" --gateway gw:8000
expect "submit: not a number" 2 "'--timeout-s': expected an integer, got '1x'" -- \
  "$PCP" submit train "$tmp/exp.json" --timeout-s 1x
expect "submit: no file" 2 "expected one experiment file" -- "$PCP" submit train
expect "submit: missing file" 1 "^pcp submit: cannot open .*exp.json" -- \
  "$PCP" submit train "$tmp/exp.json"
printf '{}' >"$tmp/exp.json"
expect "submit: no gateway" 1 "^pcp submit: POST http://127.0.0.1:1/v1/training/jobs" -- \
  "$PCP" submit train "$tmp/exp.json" --gateway http://127.0.0.1:1
expect "tokenize: typo" 2 "did you mean '--tokenizer'" -- "$PCP" tokenize --tokenizr t.json hi
expect "tokenize: bad value" 2 "'--decode': expected true or false" -- \
  "$PCP" tokenize --tokenizer t.json --decode=perhaps hi
expect "tokenize: no tokenizer flag" 2 "missing required flag '--tokenizer'" -- "$PCP" tokenize hi
expect "tokenize: missing tokenizer file" 1 "^pcp tokenize: loading the tokenizer: " -- \
  "$PCP" tokenize --tokenizer "$tmp/nothere.json" hi
expect "topo: typo" 2 "did you mean '--field'" -- "$PCP" topo betti "$tmp/path.json" --feild 3
expect "topo: bad value" 2 "not a prime field" -- "$PCP" topo betti "$tmp/path.json" --field 4
expect "topo: bad complex" 1 "^pcp topo betti: .*facets" -- "$PCP" topo betti "$tmp/badcomplex.json"
expect "topo: works" 0 "betti=\[1,0\]" -- "$PCP" topo betti "$tmp/path.json"
expect "topo: unknown subcommand" 2 "unknown subcommand 'bettti' \(did you mean 'betti'\?\)" -- "$PCP" topo bettti
# Roles: the same parser, and a started role that cannot do its work exits 1.
expect "gateway: typo" 2 "^pcp --gateway: unknown flag '--api-prot' \(did you mean '--api-port'\?\)" -- \
  "$PCP" --gateway --api-prot 1
expect "gateway: bad value" 2 "'--api-port': expected an integer" -- "$PCP" --gateway --api-port x
expect "worker: typo" 2 "did you mean '--connect'" -- "$PCP" --worker --conect 127.0.0.1:1
expect "node manager: typo" 2 "did you mean '--scale'" -- "$PCP" --node-manager --scal 2
expect "node manager: bad value" 2 "'--scale': 0 is out of range" -- "$PCP" --node-manager --scale 0
expect "hub: typo" 2 "did you mean '--api-port'" -- "$PCP" --federation-hub --api-prot 1
expect "supervise: typo" 2 "did you mean '--restart-min-ms'" -- \
  "$PCP" --restart-min-m 5 --supervise -- --worker
expect "supervise: bad value" 2 "'--restart-min-ms': expected an integer" -- \
  "$PCP" --restart-min-ms x --supervise -- --worker
# Renamed flags answer with the new name (docs/cli.md).
expect "chat: --api-key-env renamed" 2 "'--api-key-env' was renamed to '--api-token-env'" -- \
  "$PCP" chat --api-key-env X hi
expect "submit: --token-env renamed" 2 "'--token-env' was renamed to '--api-token-env'" -- \
  "$PCP" submit train "$tmp/exp.json" --token-env X
expect "node manager: --gateway-port renamed" 2 "'--gateway-port' was renamed to '--api-port'" -- \
  "$PCP" --node-manager --gateway-port 9000
expect "node manager: --gateway-host renamed" 2 "'--gateway-host' was renamed to '--api-host'" -- \
  "$PCP" --node-manager --gateway-host 0.0.0.0
# The node manager's probe port is not the gateway's.
nm_port=$("$PCP" --node-manager --dump-config | sed -n 's/.*"api_port": \([0-9]*\).*/\1/p')
gw_port=$("$PCP" help gateway | sed -n 's/^  --api-port PORT .*(default: \([0-9]*\))$/\1/p')
if [[ -n "$nm_port" && -n "$gw_port" && "$nm_port" != "$gw_port" && "$nm_port" != 8000 ]]; then
  pass=$((pass + 1)); echo "ok   node manager probe port $nm_port != gateway $gw_port"
else
  fail=$((fail + 1)); echo "FAIL node manager probe port '$nm_port' vs gateway '$gw_port'"
fi
# Top level: help, version, typos of commands and of pcp's own flags.
expect "pcp --verison" 2 "^pcp: unknown flag '--verison' \(did you mean '--version'\?\)" -- "$PCP" --verison
expect "pcp --hepl" 2 "did you mean '--help'" -- "$PCP" --hepl
expect "pcp --frobnicate (no role)" 2 "^pcp: unknown flag '--frobnicate'$" -- "$PCP" --frobnicate
expect "pcp compil" 2 "^pcp: unknown command 'compil' \(did you mean 'compile'\?\)" -- "$PCP" compil
expect "pcp worker" 2 "^pcp: unknown command 'worker' \(did you mean '--worker'\?\)" -- "$PCP" worker
expect "pcp help" 0 "pcp help \[COMMAND\|ROLE\]" -- "$PCP" help
expect "pcp help submit" 0 "usage: pcp submit train EXP.json" -- "$PCP" help submit
expect "pcp help worker" 0 "--connect" -- "$PCP" help worker
expect "pcp help nosuch" 2 "unknown command or role 'nosuch'" -- "$PCP" help nosuch
expect "pcp version" 0 "^pcp [0-9]" -- "$PCP" version
# `pcp help X` is `pcp X --help` (roles: `pcp --X --help`), exit 0, for all.
for c in chat compile inspect model run submit tokenize topo \
         gateway worker node-manager federation-hub supervise; do
  case $c in
    gateway|worker|node-manager|federation-hub|supervise) direct=(--"$c" --help) ;;
    *) direct=("$c" --help) ;;
  esac
  via_help=$("$PCP" help "$c" 2>&1; echo "exit $?")
  via_flag=$("$PCP" "${direct[@]}" 2>&1; echo "exit $?")
  if [[ "$via_help" == "$via_flag" && "$via_help" == *"exit 0" && "$via_help" == *usage* ]]; then
    pass=$((pass + 1)); echo "ok   pcp help $c = pcp ${direct[*]}"
  else
    fail=$((fail + 1)); echo "FAIL pcp help $c differs from pcp ${direct[*]} (or fails)"
  fi
done
# Internal names appear only at PCP_LOG_LEVEL=debug.
expect "debug shows the code and location" 1 "NOT_FOUND: opening .*\(file\.c:[0-9]+\)" -- \
  env PCP_LOG_LEVEL=debug "$PCP" run "$tmp/nothere.vmfb"
grep -v "^pcp run: NOT_FOUND: opening" "$all_out" >"$tmp/user_out"
codes='OK|CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED|DEFERRED|INCOMPATIBLE'
if grep -nE "\b($codes)\b|\.(c|cc|h):[0-9]+" "$tmp/user_out"; then
  fail=$((fail + 1)); echo "FAIL the lines above show an internal status name or source location"
else
  pass=$((pass + 1)); echo "ok   no status names or source locations in $(wc -l <"$tmp/user_out") output lines"
fi

echo "$pass passed, $fail failed"
[[ $fail -eq 0 ]]
