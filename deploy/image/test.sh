#!/usr/bin/env bash
# `make image-test` (also the ctest test `image`, part of `make test`): the
# containerised cluster on this machine.
#   1. `pcp --version` in the image names the IREE compiler and runtime, and
#      the image runs as uid 10001;
#   2. a gateway container (config from /etc/pcp, state in a named volume at
#      /var/lib/pcp, training data bind-mounted at /data) and a node-manager
#      container with two CPU workers, --network=host on free ports; the host
#      reaches the gateway's /healthz, /readyz and /metrics and the node
#      manager's /healthz and /readyz;
#   3. `pcp submit train` (run from the image) trains the quickstart model
#      for a few outer steps; the gateway serves its final export and answers
#      a chat request from the host;
#   4. the gateway container is stopped (SIGTERM), removed and started again
#      on the same volume: the job is still listed (succeeded) and the model
#      is still served.
# --build first runs deploy/image/build.sh (without the OCI archive): what
# ctest does, so a changed binary is in the image it tests.
# A machine that cannot run containers FAILS here with the reason.
# Everything it starts (containers, the volume) is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
say() { printf 'image-test: %s\n' "$*"; }
fail() { printf 'image-test: FAIL: %s\n' "$*" >&2; exit 1; }

build=0
[[ ${1:-} == --build ]] && build=1
image=${PCP_IMAGE:-localhost/pcp:latest}
python=python3

command -v podman >/dev/null ||
  fail "podman is not installed: this machine cannot run containers ('make setup' installs podman and runc)"
command -v runc >/dev/null ||
  fail "runc is not installed: this machine cannot run containers ('make setup' installs it)"
if ! info=$(podman info 2>&1); then
  fail "podman cannot run containers on this machine: $(tail -n 3 <<<"$info")"
fi
if [[ $build -eq 1 ]]; then
  PCP_IMAGE_SAVE=0 deploy/image/build.sh || fail "building the image failed"
fi
podman image exists "$image" || fail "no image $image: run 'make image' first"

id=pcp-image-test-$$
volume=$id-state
gateway=$id-gateway
nodemgr=$id-nodemgr
work=build/image-test/$$
rm -rf "$work"
mkdir -p "$work/etc"
chmod 755 "$work/etc"
# The sandbox lacks CAP_SYS_RESOURCE (ulimits at most what it has) and
# crun fails on its cgroups; host networking needs no CNI bridge.
run_options=(--runtime runc --network=host --ulimit nofile=20000:20000
  --ulimit nproc=4096:4096)

containers=()
cleanup() {
  local status=$?
  if [[ $status -ne 0 ]]; then
    for c in "${containers[@]}"; do
      echo "--- podman logs $c (last 25 lines)" >&2
      podman logs --tail 25 "$c" >&2 2>/dev/null || true
    done
  fi
  for c in "${containers[@]}"; do podman rm -f -v -t 3 "$c" >/dev/null 2>&1 || true; done
  podman volume rm -f "$volume" >/dev/null 2>&1 || true
  if [[ $status -eq 0 ]]; then
    rm -rf "$work"
  else
    echo "image-test: failed (exit $status); files in $work" >&2
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
api_port=$(free_port)
fabric_port=$(free_port)
nm_port=$(free_port)
url=http://127.0.0.1:$api_port
nm_url=http://127.0.0.1:$nm_port

wait_until() {  # seconds, description, command...
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    for c in "${containers[@]}"; do
      [[ $(podman inspect --format '{{.State.Running}}' "$c" 2>/dev/null) == true ]] ||
        fail "container $c exited while waiting for $what"
    done
    [[ $SECONDS -lt $deadline ]] || fail "timed out after ${seconds}s waiting for $what"
    sleep 0.3
  done
}
json_check() {  # URL, python expression over `body` that must be true
  curl -fsS --max-time 5 "$1" | "$python" -c "
import json, sys
body = json.load(sys.stdin)
sys.exit(0 if ($2) else 1)"
}

start=$SECONDS
# 1. The image itself.
version_text=$(podman run --rm "${run_options[@]}" "$image" --version) ||
  fail "podman run $image --version failed"
echo "$version_text"
grep -Eq '^iree-compiler: [0-9]' <<<"$version_text" ||
  fail "pcp --version in the image does not name the IREE compiler"
grep -Eq '^iree-runtime: [0-9]' <<<"$version_text" ||
  fail "pcp --version in the image does not name the IREE runtime"
grep -q '^venv: /opt/pcp/venv$' <<<"$version_text" ||
  fail "pcp in the image does not use /opt/pcp/venv"
uid=$(podman run --rm "${run_options[@]}" --entrypoint /usr/bin/id "$image" -u) ||
  fail "podman run --entrypoint /usr/bin/id $image failed"
[[ $uid == 10001 ]] || fail "the image runs as uid $uid, not 10001 (pcp)"
# Only what it must hold: no build tree, no pip, no wheel files; and a size
# bound (605 MB when written) that catches something large slipping in.
extra=$(podman run --rm "${run_options[@]}" --entrypoint /bin/sh "$image" -c \
  'ls -d /work /opt/pcp/venv/bin/pip* /tmp/wheels 2>/dev/null
   find / -xdev \( -name "*.whl" -o -name CMakeLists.txt -o -name "*.ninja" \) \
     -print 2>/dev/null | head -n 5') ||
  fail "podman run $image /bin/sh failed"
[[ -z $extra ]] || fail "the image holds what it should not: $extra"
size=$(podman image inspect --format '{{.Size}}' "$image")
((size < 750000000)) || fail "the image is $size bytes, over the 750 MB bound"

# 2. The cluster. Workers prove the join token (HMAC challenge).
PCP_WORKER_JOIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export PCP_WORKER_JOIN_TOKEN
cat >"$work/etc/gateway.json" <<EOF
{"gateway_id": "image-test", "lab_id": "local", "state_dir": "/var/lib/pcp",
 "data_roots": ["/data"],
 "worker_fabric": {"host": "127.0.0.1", "port": $fabric_port,
                   "join_token_env": "PCP_WORKER_JOIN_TOKEN"}}
EOF
# The quickstart model, a few outer steps; the final step is exported.
outer_steps=3
"$python" - "$outer_steps" >"$work/etc/experiment.json" <<'EOF'
import json, sys
e = json.load(open("examples/quickstart_train.json"))
steps = int(sys.argv[1])
e.update(data_path="/data/tiny_shakespeare.txt", outer_loop_steps=steps,
         checkpoint_every=steps, eval_every=steps, warmup_steps=5)
print(json.dumps(e, indent=1))
EOF
chmod 644 "$work/etc/"*.json
model=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$work/etc/experiment.json") ||
  fail "cannot read the experiment's name"

podman volume create "$volume" >/dev/null || fail "podman volume create failed"
start_gateway() {
  podman run -d --name "$gateway" "${run_options[@]}" \
    -e PCP_WORKER_JOIN_TOKEN \
    -v "$volume:/var/lib/pcp" -v "$root/$work/etc:/etc/pcp:ro" \
    -v "$root/data:/data:ro" \
    "$image" --gateway --gateway-config /etc/pcp/gateway.json \
    --api-port "$api_port" >/dev/null || fail "podman run (gateway) failed"
}
containers+=("$gateway")
start_gateway
wait_until 60 "the gateway's /healthz" curl -fsS --max-time 2 "$url/healthz"
say "gateway container up on $url ($((SECONDS - start)) s)"

containers+=("$nodemgr")
podman run -d --name "$nodemgr" "${run_options[@]}" -e PCP_WORKER_JOIN_TOKEN \
  "$image" --node-manager --scale 2 --host 127.0.0.1 --port "$fabric_port" \
  --backend cpu --api-port "$nm_port" >/dev/null ||
  fail "podman run (node manager) failed"
wait_until 90 "two workers to join" json_check "$url/v1/workers" \
  'body["counts"]["connected"] >= 2'
wait_until 30 "the gateway's /readyz" curl -fsS --max-time 2 "$url/readyz"
json_check "$url/readyz" 'body["ready"] is True and body["workers_connected"] >= 2' ||
  fail "/readyz does not report the two workers"
wait_until 30 "the node manager's /readyz" curl -fsS --max-time 2 "$nm_url/readyz"
curl -fsS --max-time 5 "$nm_url/healthz" >/dev/null || fail "node manager /healthz"
metrics=$(curl -fsS --max-time 5 "$url/metrics") || fail "/metrics did not answer"
grep -Eq '^pcp_[a-z_]+(\{[^}]*\})? [0-9]' <<<"$metrics" ||
  fail "/metrics holds no pcp_ sample"
say "two workers joined; /healthz, /readyz, /metrics answer ($((SECONDS - start)) s)"

# 3. Training, submitted with the image's own pcp.
submit_log=$work/submit.log
podman run --rm "${run_options[@]}" -v "$root/$work/etc:/etc/pcp:ro" "$image" \
  submit train /etc/pcp/experiment.json --gateway "$url" --timeout-s 240 \
  >"$submit_log" 2>&1 || { tail -n 20 "$submit_log" >&2; fail "pcp submit train failed"; }
tail -n 3 "$submit_log"
job=$(curl -fsS "$url/v1/jobs?kind=training" | "$python" -c '
import json, sys
jobs = json.load(sys.stdin)["jobs"]
print(jobs[-1]["job_id"] if jobs else "")') || fail "GET /v1/jobs failed"
[[ -n $job ]] || fail "no training job listed after pcp submit"
# It learned: a uniform guess over the 65 characters has loss ln 65 = 4.17.
json_check "$url/v1/training/jobs/$job" \
  "body['state'] == 'succeeded' and body['training']['outer_step'] == $outer_steps
   and 0 < body['training']['val_loss'] < 3.5" ||
  fail "job $job did not complete $outer_steps outer steps with val_loss < 3.5: $(curl -fsS "$url/v1/training/jobs/$job")"
say "job $job trained $outer_steps outer steps ($((SECONDS - start)) s)"

served() {
  json_check "$url/v1/models/$model" \
    "body['status'] == 'ready' and body.get('job_id') == '$job' and body.get('outer_step') == $outer_steps"
}
wait_until 120 "the gateway to serve the final export of $model" served
chat() {
  curl -fsS --max-time 60 "$url/v1/chat/completions" \
    -H 'Content-Type: application/json' \
    -d "{\"model\": \"$model\", \"temperature\": 0, \"max_tokens\": 24,
         \"messages\": [{\"role\": \"user\", \"content\": \"ROMEO:\"}]}"
}
reply_text() {  # the reply's text as JSON; fails unless it is a completion
  "$python" -c '
import json, sys
r = json.loads(sys.argv[1])
text = r["choices"][0]["message"]["content"]
assert r["object"] == "chat.completion" and r["usage"]["completion_tokens"] > 0
assert isinstance(text, str) and text, "empty reply"
print(json.dumps(text))' "$1"
}
reply=$(chat) || fail "the chat request failed"
first=$(reply_text "$reply") || fail "the chat reply is not a completion: $reply"
say "chat reply (greedy, answered by the container): $first"
# The state is the container user's: the volume and what the gateway wrote.
owners=$(podman exec "$gateway" sh -c \
  'stat -c %u /var/lib/pcp; find /var/lib/pcp -mindepth 1 -maxdepth 2 -printf "%U\n"') ||
  fail "podman exec in the gateway container failed"
[[ $(sort -u <<<"$owners" | paste -sd' ') == 10001 ]] ||
  fail "/var/lib/pcp holds files not owned by uid 10001: $(sort -u <<<"$owners" | paste -sd' ')"
[[ $(podman exec "$gateway" sh -c 'ls /var/lib/pcp' | wc -l) -gt 0 ]] ||
  fail "the gateway wrote nothing under /var/lib/pcp"

# 4. The state volume survives the container.
podman stop -t 20 "$gateway" >/dev/null || fail "podman stop (gateway) failed"
podman rm "$gateway" >/dev/null || fail "podman rm (gateway) failed"
say "gateway container stopped and removed; starting a new one on volume $volume"
start_gateway
wait_until 60 "the restarted gateway's /healthz" curl -fsS --max-time 2 "$url/healthz"
json_check "$url/v1/jobs" "any(j['job_id'] == '$job' and j['state'] == 'succeeded' for j in body['jobs'])" ||
  fail "job $job is not listed (succeeded) after the restart: $(curl -fsS "$url/v1/jobs")"
wait_until 60 "the restarted gateway's /readyz" curl -fsS --max-time 2 "$url/readyz"
wait_until 120 "the restarted gateway to serve $model again" served
reply=$(chat) || fail "the chat request after the restart failed"
again=$(reply_text "$reply") || fail "the reply after the restart is not a completion: $reply"
# Greedy decoding of the same export: the weights came back from the volume.
[[ $again == "$first" ]] ||
  fail "the greedy reply changed across the restart: $first, then $again"
say "job $job still listed after the restart; $model served and answering ($((SECONDS - start)) s)"
say "PASS ($((SECONDS - start)) s)"
