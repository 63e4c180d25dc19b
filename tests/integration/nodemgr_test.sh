#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The node manager and `pcp --supervise` with real processes on 127.0.0.1:
#   1. --scale 2 with real `pcp --worker` children: both start, /readyz 200;
#   2. SIGKILL of one worker: restarted, restarts metric 1, /readyz 200 again;
#   3. `promtool check metrics` on /metrics;
#   4. a slot whose worker always exits at once hits the crash-loop cap:
#      failed, /readyz 503 naming it, the node manager keeps serving;
#      SIGHUP gives it another round;
#   5. SIGTERM stops every child (no orphans: kill -0 on every pid ever
#      started) and the node manager exits 0; after a SIGKILL of the node
#      manager its worker ends too;
#   6. --supervise: restart after SIGKILL, SIGKILL after the grace period for
#      a child that ignores SIGTERM, exit 1 after the crash-loop cap.
# Every wait is bounded.
set -u
PCP=${1:?usage: nodemgr_test.sh PATH_TO_PCP}
WORK=$(mktemp -d)
failures=0
NM_PID=
cleanup() {
  # A node manager left running by a failed check gets SIGTERM (which stops
  # its children), then SIGKILL. Pids from the logs are never signalled
  # here: they may belong to someone else by now.
  if [ -n "$NM_PID" ] && kill -0 "$NM_PID" 2>/dev/null; then
    kill -TERM "$NM_PID" 2>/dev/null
    for _ in $(seq 1 100); do
      kill -0 "$NM_PID" 2>/dev/null || break
      sleep 0.05
    done
    kill -KILL "$NM_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# An unused fabric port: nothing listens there, the workers keep waiting.
FABRIC_PORT=1

# wait_for SECONDS COMMAND...: polls COMMAND every 50 ms; 0 when it held.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  while [ "$SECONDS" -le "$deadline" ]; do
    "$@" && return 0
    sleep 0.05
  done
  "$@"
}

api_port_of() {  # api_port_of ERRFILE
  grep -m1 -o 'role=node-manager msg="started" .*' "$1" |
    grep -o 'api_port=[0-9]*' | cut -d= -f2
}

http_status() {  # http_status PATH -> prints the status code
  curl -s -o "$WORK/body" -w '%{http_code}' "http://127.0.0.1:$API_PORT$1"
}

readyz_is() {  # readyz_is CODE
  [ "$(http_status /readyz)" = "$1" ]
}

# json_get EXPR: evaluates a Python expression on the last /readyz body (j).
json_get() {
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' \
    "$WORK/body" "$1"
}

metric() {  # metric NAME_WITH_LABELS -> value
  curl -s "http://127.0.0.1:$API_PORT/metrics" | grep -F "$1 " |
    awk '{print $2}'
}

restarts_are() {  # restarts_are SLOT N
  [ "$(metric "pcp_node_manager_supervisor_restarts_total{backend=\"cpu\",target=\"default\",slot=\"$1\"}")" = "$2" ]
}

all_pids() {  # all_pids ERRFILE: every child pid ever started
  grep -o 'msg="child started" slot=[0-9]* pid=[0-9]*' "$1" | sed 's/.*pid=//'
}

# A worker wrapper: slot 1 (device 1) always exits at once with status 3;
# every other slot runs the real worker.
cat >"$WORK/worker.sh" <<EOF
#!/bin/sh
case " \$* " in
  *" --device-id 1 "*) exit 3 ;;
esac
exec "$PCP" "\$@"
EOF
chmod +x "$WORK/worker.sh"

POLICY=(--start-stagger-ms 100 --running-after-ms 300 --restart-min-ms 200
        --restart-max-ms 400 --crash-loop-restarts 3
        --crash-loop-window-ms 20000 --stop-grace-ms 3000)

#---------------------------------------------------------------------------
# 1-3, 5: two real workers.
"$PCP" --node-manager --scale 2 --host 127.0.0.1 --port "$FABRIC_PORT" \
  --backend cpu --api-port 0 "${POLICY[@]}" >"$WORK/nm.out" 2>"$WORK/nm.err" &
NM_PID=$!
wait_for 10 grep -qs 'role=node-manager msg="started"' "$WORK/nm.err" ||
  fail "node manager: no started line"
API_PORT=$(api_port_of "$WORK/nm.err")
[ -n "$API_PORT" ] || { fail "no api_port in the started line"; exit 1; }

[ "$(http_status /healthz)" = 200 ] || fail "healthz not 200"
wait_for 10 readyz_is 200 || fail "readyz not 200 with both workers up"
[ "$(json_get 'j["running_supervisors"]')" = 2 ] || fail "running != 2"
[ "$(json_get 'j["mode"]')" = node-manager ] || fail "readyz mode"
[ "$(json_get '[s["state"] for s in j["slots"]]')" = "['running', 'running']" ] ||
  fail "slots not both running: $(cat "$WORK/body")"
[ "$(json_get '[s["device_id"] for s in j["slots"]]')" = "[0, 1]" ] ||
  fail "device ids not 0, 1"
grep -q 'role=worker msg="started" .*device_id=0' "$WORK/nm.err" ||
  fail "worker 0 did not start"
grep -q 'role=worker msg="started" .*device_id=1' "$WORK/nm.err" ||
  fail "worker 1 did not start"
grep -q 'role=worker msg="started" .*port=1 .*supervisor_id=' "$WORK/nm.err" ||
  fail "worker not given --connect host:port and --supervisor-id"
PID0=$(json_get 'j["slots"][0]["pid"]')
PID1=$(json_get 'j["slots"][1]["pid"]')
# The full worker command line (grace 3000 ms -> drain 2400 ms).
tr '\0' ' ' </proc/"$PID1"/cmdline >"$WORK/cmdline1"
grep -q -- "--worker --connect 127.0.0.1:$FABRIC_PORT --backend cpu --device-id 1 --supervisor-id [0-9]* --drain-timeout-ms 2400" \
  "$WORK/cmdline1" || fail "worker 1 command line: $(cat "$WORK/cmdline1")"
restarts_are 0 0 || fail "restarts of slot 0 not 0 at start"
[ "$(metric 'pcp_node_manager_running_supervisors{backend="cpu",target="default"}')" = 2 ] ||
  fail "running_supervisors metric not 2"
[ "$(metric 'pcp_node_manager_expected_supervisors{backend="cpu",target="default"}')" = 2 ] ||
  fail "expected_supervisors metric not 2"

# 2. SIGKILL one worker: restarted with a new pid, readyz back to 200.
kill -KILL "$PID0"
wait_for 10 restarts_are 0 1 || fail "restarts of slot 0 did not reach 1"
wait_for 10 readyz_is 200 || fail "readyz not back to 200 after the restart"
NEW_PID0=$(json_get 'j["slots"][0]["pid"]')
[ "$NEW_PID0" != "$PID0" ] && kill -0 "$NEW_PID0" 2>/dev/null ||
  fail "slot 0 has no new live worker ($PID0 -> $NEW_PID0)"
[ "$(json_get 'j["slots"][1]["pid"]')" = "$PID1" ] ||
  fail "slot 1 was restarted too"
restarts_are 1 0 || fail "restarts of slot 1 not 0"
grep -q 'msg="child exited" slot=0 .*signal=SIGKILL next=backing_off' \
  "$WORK/nm.err" || fail "no exit line for the killed worker"

# 3. The exposition passes promtool's lint.
curl -s "http://127.0.0.1:$API_PORT/metrics" >"$WORK/metrics.txt"
if ! promtool check metrics <"$WORK/metrics.txt" >"$WORK/promtool.out" 2>&1; then
  fail "promtool check metrics: $(cat "$WORK/promtool.out")"
fi
grep -q '^pcp_node_manager_info{backend="cpu",target="default"} 1' \
  "$WORK/metrics.txt" || fail "no info metric"

# 5. SIGTERM: every child stops, exit 0, no orphans.
kill -TERM "$NM_PID"
wait_for 10 bash -c "! kill -0 $NM_PID 2>/dev/null" ||
  fail "node manager still running 10 s after SIGTERM"
wait "$NM_PID"
rc=$?
NM_PID=
[ "$rc" -eq 0 ] || fail "node manager exit $rc after SIGTERM, expected 0"
for pid in $(all_pids "$WORK/nm.err"); do
  kill -0 "$pid" 2>/dev/null && fail "worker $pid outlived the node manager"
done
grep -q 'role=node-manager msg="stopping" signal=SIGTERM children=2' \
  "$WORK/nm.err" || fail "no stopping line naming 2 children"
[ "$(grep -c 'msg="child exited" .*next=stopped' "$WORK/nm.err")" = 2 ] ||
  fail "expected 2 children stopped"

# 5b. SIGKILL of the node manager: its workers still end (PR_SET_PDEATHSIG
#     through PCP_SUPERVISOR_PID), none is left orphaned.
"$PCP" --node-manager --scale 1 --port "$FABRIC_PORT" --backend cpu \
  --api-port 0 "${POLICY[@]}" >"$WORK/kill9.out" 2>"$WORK/kill9.err" &
NM_PID=$!
wait_for 10 grep -qs 'role=node-manager msg="started"' "$WORK/kill9.err" ||
  fail "kill -9 node manager: no started line"
API_PORT=$(api_port_of "$WORK/kill9.err")
wait_for 10 readyz_is 200 || fail "kill -9 node manager: not ready"
KPID=$(json_get 'j["slots"][0]["pid"]')
{ kill -KILL "$NM_PID"; wait "$NM_PID"; } 2>/dev/null
NM_PID=
wait_for 15 bash -c "! kill -0 $KPID 2>/dev/null" ||
  fail "worker $KPID outlived a SIGKILLed node manager"

#---------------------------------------------------------------------------
# 4. Crash loop: slot 1's worker always exits at once.
"$PCP" --node-manager --scale 2 --port "$FABRIC_PORT" --backend cpu \
  --api-port 0 --worker-exe "$WORK/worker.sh" "${POLICY[@]}" \
  --restart-min-ms 50 --restart-max-ms 100 \
  >"$WORK/loop.out" 2>"$WORK/loop.err" &
NM_PID=$!
wait_for 10 grep -qs 'role=node-manager msg="started"' "$WORK/loop.err" ||
  fail "crash-loop node manager: no started line"
API_PORT=$(api_port_of "$WORK/loop.err")
slot1_failed() {
  readyz_is 503 && [ "$(json_get '[s["state"] for s in j["slots"]]')" = "['running', 'failed']" ]
}
wait_for 15 slot1_failed || fail "slot 1 not failed: $(cat "$WORK/body")"
[ "$(json_get '[n["slot"] for n in j["not_ready"]]')" = "[1]" ] ||
  fail "readyz does not name slot 1 alone: $(cat "$WORK/body")"
json_get 'j["not_ready"][0]["reason"]' | grep -q 'crash loop' ||
  fail "readyz reason lacks 'crash loop'"
[ "$(json_get 'j["slots"][1]["restarts"]')" = 3 ] ||
  fail "slot 1 restarts != 3 (the cap)"
grep -q 'msg="slot failed" slot=1 reason="crash loop: 4 exits' "$WORK/loop.err" ||
  fail "no slot failed line"
kill -0 "$NM_PID" 2>/dev/null || fail "node manager died with a failed slot"
[ "$(http_status /healthz)" = 200 ] || fail "healthz not 200 with a failed slot"
restarts_are 1 3 || fail "restarts metric of slot 1 not 3"
[ "$(metric 'pcp_node_manager_slots{backend="cpu",target="default",state="failed"}')" = 1 ] ||
  fail "slots{state=failed} not 1"
# Stays failed: no more starts.
starts=$(grep -c 'msg="child started" slot=1' "$WORK/loop.err")
sleep 0.5
[ "$(grep -c 'msg="child started" slot=1' "$WORK/loop.err")" = "$starts" ] ||
  fail "a failed slot was restarted"
# SIGHUP revives it for another round, which fails again.
kill -HUP "$NM_PID"
wait_for 10 grep -qs 'msg="slot revived (SIGHUP)" slot=1' "$WORK/loop.err" ||
  fail "SIGHUP did not revive slot 1"
wait_for 15 bash -c "[ \$(grep -c 'msg=\"slot failed\" slot=1' '$WORK/loop.err') = 2 ]" ||
  fail "revived slot 1 did not fail again"
# A probe port in use: exit 1 before any worker is started.
"$PCP" --node-manager --port "$FABRIC_PORT" --api-port "$API_PORT" \
  >/dev/null 2>"$WORK/busy.err"
rc=$?
[ "$rc" -eq 1 ] || fail "node manager on a busy probe port: exit $rc, expected 1"
grep -q 'child started' "$WORK/busy.err" &&
  fail "node manager on a busy probe port started a worker"
kill -TERM "$NM_PID"
wait_for 10 bash -c "! kill -0 $NM_PID 2>/dev/null" ||
  fail "crash-loop node manager still running after SIGTERM"
wait "$NM_PID"
rc=$?
NM_PID=
[ "$rc" -eq 0 ] || fail "crash-loop node manager exit $rc, expected 0"
for pid in $(all_pids "$WORK/loop.err"); do
  kill -0 "$pid" 2>/dev/null && fail "child $pid outlived the node manager"
done

#---------------------------------------------------------------------------
# 6. --supervise.
"$PCP" --port "$FABRIC_PORT" --restart-min-ms 50 --restart-max-ms 100 \
  --running-after-ms 100 --supervise -- --worker --device-id 3 \
  >"$WORK/sup.out" 2>"$WORK/sup.err" &
NM_PID=$!
wait_for 10 grep -qs 'role=worker msg="started"' "$WORK/sup.err" ||
  fail "supervise: worker did not start"
grep -q 'role=worker msg="started" .*device_id=3 supervisor_id=' "$WORK/sup.err" ||
  fail "supervise: child lacks --supervisor-id"
SPID=$(all_pids "$WORK/sup.err" | head -1)
kill -KILL "$SPID"
wait_for 10 bash -c "[ \$(grep -c 'role=worker msg=\"started\"' '$WORK/sup.err') = 2 ]" ||
  fail "supervise: worker not restarted after SIGKILL"
kill -TERM "$NM_PID"
wait_for 10 bash -c "! kill -0 $NM_PID 2>/dev/null" ||
  fail "supervise still running after SIGTERM"
wait "$NM_PID"
rc=$?
NM_PID=
[ "$rc" -eq 0 ] || fail "supervise exit $rc after SIGTERM, expected 0"
for pid in $(all_pids "$WORK/sup.err"); do
  kill -0 "$pid" 2>/dev/null && fail "supervise: child $pid outlived it"
done

# A child that ignores SIGTERM gets SIGKILL after the grace period.
cat >"$WORK/stubborn.sh" <<'EOF'
#!/bin/sh
trap '' TERM
echo "stubborn up" >&2
while :; do sleep 0.05; done
EOF
chmod +x "$WORK/stubborn.sh"
"$PCP" --stop-grace-ms 300 --worker-exe "$WORK/stubborn.sh" --supervise -- \
  --worker >"$WORK/stub.out" 2>"$WORK/stub.err" &
NM_PID=$!
wait_for 10 grep -qs 'stubborn up' "$WORK/stub.err" ||
  fail "stubborn child did not start"
kill -TERM "$NM_PID"
wait_for 10 bash -c "! kill -0 $NM_PID 2>/dev/null" ||
  fail "supervise did not end a child that ignores SIGTERM"
wait "$NM_PID"
rc=$?
NM_PID=
[ "$rc" -eq 0 ] || fail "supervise (stubborn child) exit $rc, expected 0"
grep -q 'msg="child killed (SIGKILL)"' "$WORK/stub.err" ||
  fail "no SIGKILL line for the stubborn child"
grep -q 'msg="child exited" .*signal=SIGKILL next=stopped' "$WORK/stub.err" ||
  fail "stubborn child not reported killed"

# A second SIGTERM does not wait for the grace period (60 s here).
"$PCP" --stop-grace-ms 60000 --worker-exe "$WORK/stubborn.sh" --supervise -- \
  --worker >"$WORK/stub2.out" 2>"$WORK/stub2.err" &
NM_PID=$!
wait_for 10 grep -qs 'stubborn up' "$WORK/stub2.err" ||
  fail "stubborn child (2) did not start"
kill -TERM "$NM_PID"
wait_for 10 grep -qs 'msg="stopping"' "$WORK/stub2.err" ||
  fail "supervise did not start stopping"
kill -TERM "$NM_PID"
wait_for 10 bash -c "! kill -0 $NM_PID 2>/dev/null" ||
  fail "a second SIGTERM did not end the stop at once"
wait "$NM_PID"
rc=$?
NM_PID=
[ "$rc" -eq 0 ] || fail "supervise (second SIGTERM) exit $rc, expected 0"
grep -q 'msg="stopping now (SIGKILL to the children left)"' \
  "$WORK/stub2.err" || fail "no stopping-now line"

# The crash-loop cap ends --supervise with exit 1.
"$PCP" --restart-min-ms 20 --restart-max-ms 40 --crash-loop-restarts 2 \
  --worker-exe /bin/false --supervise -- --worker \
  >"$WORK/false.out" 2>"$WORK/false.err" &
NM_PID=$!
wait_for 10 bash -c "! kill -0 $NM_PID 2>/dev/null" ||
  fail "supervise did not give up on a crash-looping child"
wait "$NM_PID"
rc=$?
NM_PID=
[ "$rc" -eq 1 ] || fail "supervise exit $rc after the crash-loop cap, expected 1"
[ "$(grep -c 'msg="child started"' "$WORK/false.err")" = 3 ] ||
  fail "supervise: expected 3 starts (2 restarts) before giving up"

# Usage errors.
"$PCP" --supervise -- --worker --supervisor-id 5 >/dev/null 2>"$WORK/u1.err"
[ $? -eq 2 ] && grep -q "is set by the supervisor" "$WORK/u1.err" ||
  fail "supervise: child --supervisor-id not rejected"
"$PCP" --node-manager --restart-min-ms 500 --restart-max-ms 100 \
  >/dev/null 2>"$WORK/u2.err"
[ $? -eq 2 ] && grep -q "restart-max-ms" "$WORK/u2.err" ||
  fail "node manager: restart-max below min not rejected"
"$PCP" --node-manager --worker-exe "$WORK/absent" >/dev/null 2>"$WORK/u3.err"
[ $? -eq 2 ] && grep -q "worker-exe" "$WORK/u3.err" ||
  fail "node manager: missing --worker-exe not rejected"

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  for f in "$WORK"/*.err; do
    echo "--- $(basename "$f")" >&2
    tail -n 40 "$f" >&2
  done
  exit 1
fi
echo "nodemgr_test: all checks passed"
