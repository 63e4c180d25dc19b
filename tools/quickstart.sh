#!/usr/bin/env bash
# The quickstart `make run` runs, on this machine only (127.0.0.1):
#   1. a gateway (HTTP API, worker fabric, SQLite state under build/quickstart/),
#   2. a node manager supervising two CPU workers that join the gateway,
#   3. a DiLoCo training job: a char-level GPT on data/tiny_shakespeare.txt
#      (examples/quickstart_train.json), followed with a progress bar and the
#      loss after every outer step,
#   4. chat requests answered by the model it just trained (on the same
#      workers through the OpenAI-compatible API), once the gateway serves
#      the job's final export: greedy, and a sample at temperature 0.8 with
#      a fixed seed; the greedy reply is checked token for token against an
#      offline JAX decode of the exported weights
#      (tools/check_served_weights.py; a mismatch fails `make run`).
# Everything it starts is stopped on exit, also on Ctrl-C or an error.
set -euo pipefail
cd "$(dirname "$0")/.."

pcp=build/pcp
work=build/quickstart
experiment=examples/quickstart_train.json
python=python3

rm -rf "$work"
mkdir -p "$work"

free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
api_port=$(free_port)
fabric_port=$(free_port)
url="http://127.0.0.1:$api_port"

# Workers prove they know this token when they join (HMAC challenge); the
# API itself is left open: it listens on 127.0.0.1 only.
PCP_WORKER_JOIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export PCP_WORKER_JOIN_TOKEN

cat >"$work/gateway.json" <<EOF
{"gateway_id": "quickstart", "lab_id": "local", "state_dir": "$work/state",
 "worker_fabric": {"host": "127.0.0.1", "port": $fabric_port,
                   "join_token_env": "PCP_WORKER_JOIN_TOKEN"}}
EOF

pids=()
cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$status" -ne 0 ]; then
    echo "quickstart failed (exit $status); logs: $work/gateway.log $work/node-manager.log" >&2
    tail -n 20 "$work/gateway.log" "$work/node-manager.log" >&2 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_until() {  # seconds, description, command...
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    for pid in "${pids[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        echo "a process the quickstart started exited while waiting for $what" >&2
        return 1
      fi
    done
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "timed out after ${seconds}s waiting for $what" >&2
      return 1
    fi
    sleep 0.2
  done
}

workers_joined() {
  curl -fsS "$url/v1/workers" | "$python" -c '
import json, sys
body = json.load(sys.stdin)
workers = body.get("workers", body) if isinstance(body, dict) else body
sys.exit(0 if sum(1 for w in workers if w.get("state") == "connected") >= 2 else 1)'
}

echo "== pcp --version"
"$pcp" --version
echo
echo "== gateway on $url (worker fabric on 127.0.0.1:$fabric_port)"
"$pcp" --gateway --gateway-config "$work/gateway.json" --api-port "$api_port" \
  >"$work/gateway.log" 2>&1 &
pids+=($!)
wait_until 30 "the gateway's /healthz" curl -fsS "$url/healthz"

echo "== node manager with 2 CPU workers"
"$pcp" --node-manager --scale 2 --host 127.0.0.1 --port "$fabric_port" \
  --backend cpu --api-port 0 >"$work/node-manager.log" 2>&1 &
pids+=($!)
wait_until 60 "two workers to join" workers_joined
echo "two workers joined"
echo

echo "== pcp submit train $experiment"
echo "   (DiLoCo: each outer step runs tau inner AdamW steps on every worker's"
echo "    shard, averages the deltas and applies the outer update; the first"
echo "    step waits for the training program to compile, cached afterwards)"
"$pcp" submit train "$experiment" --gateway "$url"
echo

model=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$experiment")
# Every checkpoint's export is reloaded by the gateway; wait for the last.
venv_python=.venv/bin/python
"$venv_python" tools/check_served_weights.py --wait-only --url "$url" \
  --model "$model" --models-root "$work/state/models" --wait-s 120

prompt="ROMEO:"
# A GPT's learned position table bounds prompt + reply (block_size tokens;
# one character is one token for this char-level model).
block_size=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["model"]["block_size"])' "$experiment")
max_tokens=$((block_size - ${#prompt}))
echo "== pcp chat --model $model --temperature 0 \"$prompt\""
echo "   (greedy decode with the weights just trained)"
"$pcp" chat --url "$url" --model "$model" --temperature 0 --max-tokens "$max_tokens" \
  --usage "$prompt"
echo
echo "== pcp chat --model $model --temperature 0.8 --seed 1 \"$prompt\""
echo "   (a sample: greedy decoding of a small char model repeats itself;"
echo "    sampling at 0.8 shows what it learned; the seed makes it repeatable)"
"$pcp" chat --url "$url" --model "$model" --temperature 0.8 --seed 1 \
  --max-tokens "$max_tokens" --usage "$prompt"
echo
echo "== the served reply against an offline JAX decode of the final export"
"$venv_python" tools/check_served_weights.py --url "$url" --model "$model" \
  --models-root "$work/state/models" --prompt "$prompt" \
  --max-tokens "$max_tokens" --pcp "$pcp"
echo
echo "quickstart done: state and logs in $work/"
