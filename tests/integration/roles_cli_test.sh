#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs `pcp --<role>` for real: usage errors exit 2 with one message line
# plus the Try line, --help and --dump-config exit 0, and started roles stop
# cleanly (exit 0) on SIGTERM and SIGINT.
set -u
PCP=${1:?usage: roles_cli_test.sh PATH_TO_PCP}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run NAME EXPECTED_RC ARGS...: runs pcp, keeps stdout/stderr in $WORK/NAME.*
run() {
  local name=$1 expected=$2
  shift 2
  "$PCP" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
  local rc=$?
  if [ "$rc" -ne "$expected" ]; then
    fail "$name: exit $rc, expected $expected (pcp $*)"
    sed 's/^/  stderr: /' "$WORK/$name.err" >&2
  fi
}

expect_in() {  # expect_in NAME FILE TEXT
  if ! grep -qF -- "$3" "$2"; then
    fail "$1: '$3' not in $(basename "$2")"
    sed 's/^/  | /' "$2" >&2
  fi
}

expect_usage_error() {  # NAME ROLE MESSAGE: two lines, message then Try
  local name=$1 role=$2 message=$3
  local lines
  lines=$(wc -l <"$WORK/$name.err")
  [ "$lines" -eq 2 ] || fail "$name: stderr has $lines lines, expected 2"
  local first
  first=$(sed -n 1p "$WORK/$name.err")
  case "$first" in
    "pcp $role: "*"$message"*) ;;
    *) fail "$name: first line '$first' lacks 'pcp $role: ...$message'" ;;
  esac
  [ "$(sed -n 2p "$WORK/$name.err")" = "Try 'pcp $role --help'." ] ||
    fail "$name: second line is not the Try line"
  [ -s "$WORK/$name.out" ] && fail "$name: unexpected stdout"
}

# 1. Unknown flags are errors, per role.
run unknown 2 --worker --foo
expect_usage_error unknown --worker "unknown flag '--foo'"
run unknown_eq 2 --federation-hub --nope=1
expect_usage_error unknown_eq --federation-hub "unknown flag '--nope'"
run other_role_flag 2 --node-manager --device-id 1
expect_usage_error other_role_flag --node-manager "unknown flag '--device-id'"
run conflicting 2 --worker --gateway
expect_in conflicting "$WORK/conflicting.err" "conflicting role flags"

# 2. Values that do not parse are errors (no silent fallback to 8080).
run bad_port 2 --worker --port http
expect_usage_error bad_port --worker "flag '--port': expected an integer, got 'http'"
run big_port 2 --worker --port 70000
expect_usage_error big_port --worker "out of range [1, 65535]"
run bad_connect 2 --connect gw:x
expect_usage_error bad_connect --worker "flag '--connect': port 'x'"
run bad_backend 2 --worker --backend tpu
expect_usage_error bad_backend --worker "(allowed: auto, cpu, cuda, metal, vulkan, rocm)"
run missing_value 2 --worker --host
expect_usage_error missing_value --worker "flag '--host' needs a value"

# 3. Legacy standalone-mode flags fail with a hint.
for flag in --shepherd --inference --config --inference-config --model \
            --resume --rl --no-dashboard --terminate --streaming; do
  run legacy 2 --worker "$flag"
  expect_usage_error legacy --worker "flag '$flag' was removed"
done
run legacy_hint 2 --inference
expect_in legacy_hint "$WORK/legacy_hint.err" "controllers.inference"

# 4. --help lists every worker flag with its default, and exits 0.
run worker_help 0 --worker --help
for row in "--connect HOST:PORT" "--host HOST" "(default: 127.0.0.1)" \
           "--port PORT" "(default: 8080)" "--backend auto|cpu" \
           "(default: auto)" "--target ARCH" "--device-id N" "(default: 0)" \
           "--dump-config" "--worker" "--help" "--supervisor-id ID" \
           "(default: -1)"; do
  expect_in worker_help "$WORK/worker_help.out" "$row"
done
run worker_help_short 0 --worker -h
expect_in worker_help_short "$WORK/worker_help_short.out" "--device-id N"
run gateway_help 0 --gateway --help
for row in "--gateway-config PATH" "(required)" "--api-port PORT" \
           "(default: 8000)" "--gateway-port PORT" "(alias of --api-port)" \
           "--control-port PORT" "--api-token-env ENV" "--workers N" \
           "(default: 2)"; do
  expect_in gateway_help "$WORK/gateway_help.out" "$row"
done
run nodemgr_help 0 --node-manager --help
expect_in nodemgr_help "$WORK/nodemgr_help.out" "--scale N"
run hub_help 0 --federation-hub --help
expect_in hub_help "$WORK/hub_help.out" "--api-token-env ENV"

# 5. The gateway needs --gateway-config and names it.
run no_config 2 --gateway
expect_usage_error no_config --gateway "missing required flag '--gateway-config'"
run default_role 2 --api-port 9000
expect_usage_error default_role --gateway "missing required flag '--gateway-config'"
run missing_file 2 --gateway --gateway-config "$WORK/absent.json"
expect_usage_error missing_file --gateway "flag '--gateway-config': opening"

# 6. --dump-config prints the flags, the loaded file and the effective
#    settings; a secret's variable name is shown, never its value.
cat >"$WORK/gw.json" <<'JSON'
{
  "gateway_id": "site-a-gw",
  "lab_id": "site-a",
  "api": {"token_env": "PCP_TEST_API_TOKEN"},
  "federation": {"enabled": true, "upstream": "http://10.0.0.5:19010"},
  "worker_fabric": {"port": 18080},
  "state_dir": "STATE_DIR",
  "controllers": {"training": {"enabled": true, "config_path": "t.json"}},
  "not_a_key": true
}
JSON
sed -i "s|STATE_DIR|$WORK/state|" "$WORK/gw.json"
PCP_TEST_API_TOKEN=s3cret-value run dump 0 --gateway --gateway-config \
  "$WORK/gw.json" --api-port 9000 --dump-config
for text in '"flags": {' '"gateway_config": "' '"api_port": 9000' \
            '"gateway_config": {' '"gateway_id": "site-a-gw"' \
            '"token_env": "PCP_TEST_API_TOKEN"' '"effective": {' \
            '"worker_fabric_port": 18080' \
            '"federation_upstream": "http://10.0.0.5:19010"' \
            '"training@127.0.0.1:9001"'; do
  expect_in dump "$WORK/dump.out" "$text"
done
grep -q "s3cret-value" "$WORK/dump.out" && fail "dump: secret value printed"
expect_in dump "$WORK/dump.err" "unknown key 'not_a_key' ignored"
# python3 comes with `make setup`: missing is a failure, not a skip.
command -v python3 >/dev/null || fail "python3 not found (make setup installs it)"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' \
  "$WORK/dump.out" || fail "dump: output is not JSON"

printf '{"gateway_id": "g", "lab_id": "l", "worker_fabric": {"port": "x"}}' \
  >"$WORK/bad.json"
run bad_config 2 --gateway --gateway-config "$WORK/bad.json"
expect_usage_error bad_config --gateway \
  "key 'worker_fabric.port': expected an integer, got a string"

run worker_dump 0 --connect 10.1.2.3:7000 --device-id 1 --dump-config
expect_in worker_dump "$WORK/worker_dump.out" '"host": "10.1.2.3"'
expect_in worker_dump "$WORK/worker_dump.out" \
  '"worker_id": "local-default-unknown-node-unknown-pod-cpu-default-device-1"'
PCP_WORKER_ID="my worker" run worker_id_env 0 --worker --dump-config
expect_in worker_id_env "$WORK/worker_id_env.out" '"worker_id": "my-worker"'

run supervise_child 2 --supervise -- --gateway
expect_usage_error supervise_child --supervise "must be a worker"

# 7. Started roles log "started", then exit 0 on SIGTERM (and SIGINT).
# start_and_stop NAME SIGNAL ARGS...
start_and_stop() {
  local name=$1 sig=$2
  shift 2
  "$PCP" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  local pid=$! i
  for i in $(seq 1 100); do
    grep -q 'msg="started"' "$WORK/$name.err" && break
    sleep 0.05
  done
  if ! grep -q 'msg="started"' "$WORK/$name.err"; then
    fail "$name: no started line"
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return
  fi
  kill "-$sig" "$pid"
  local rc=0
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    fail "$name: still running 5 s after SIG$sig"
    kill -KILL "$pid"
  fi
  wait "$pid"
  rc=$?
  [ "$rc" -eq 0 ] || fail "$name: exit $rc after SIG$sig, expected 0"
  expect_in "$name" "$WORK/$name.err" 'msg="stopping"'
  # Supervised workers share stderr: count the role's own started line.
  local started
  started=$(grep -m1 -o 'role=[a-z-]* msg="started"' "$WORK/$name.err")
  [ "$(grep -c -- "$started" "$WORK/$name.err")" -eq 1 ] ||
    fail "$name: expected exactly one started line"
}

start_and_stop worker_term TERM --worker --connect 127.0.0.1:18080 --device-id 2
expect_in worker_term "$WORK/worker_term.err" 'role=worker msg="started"'
expect_in worker_term "$WORK/worker_term.err" 'port=18080'
expect_in worker_term "$WORK/worker_term.err" 'signal=SIGTERM'
start_and_stop worker_int INT --worker
expect_in worker_int "$WORK/worker_int.err" 'signal=SIGINT'
PCP_WORKER_JOIN_TOKEN=join-token start_and_stop gateway_term TERM --gateway --gateway-config "$WORK/gw.json"
expect_in gateway_term "$WORK/gateway_term.err" 'gateway_id=site-a-gw'
start_and_stop hub_term TERM --federation-hub --api-port 19010 --state-dir "$WORK/hub-state"
start_and_stop nodemgr_term TERM --node-manager --scale 2 --api-port 0
start_and_stop supervise_term TERM --port 18080 --supervise -- --worker

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "roles_cli_test: all checks passed"
