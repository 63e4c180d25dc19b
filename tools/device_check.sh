#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU check (issue 12 item 5): on a machine with an NVIDIA GPU, in one
# run with a hard budget (default 470 s, under eight minutes, every wait
# bounded):
#   0. the machine: nvidia-smi (name, compute capability, memory), the IREE
#      runtime wheel's cuda driver, `make build` when build/pcp is missing;
#   1. the built-in GPT's training program derived and compiled for cuda
#      (`pcp compile --program train --inner-steps K --backend cuda
#      --target sm_XX`) and one @train_steps call on the GPU (`pcp run
#      --device cuda`): the K losses must be finite;
#   2. a gateway and a cuda worker: a DiLoCo training job on the cuda worker
#      alone -> outer step time, tokens/s, model FLOPs/token and MFU;
#   3. decode on cuda: the job's export served by the gateway on the cuda
#      worker, a greedy streamed completion -> tokens/s, time to first token;
#   4. a cpu worker joins: a DiLoCo job mixing the cpu and the cuda worker in
#      one run (every outer step must average both workers' deltas).
# Prints the figures and writes them to $OUT/device_check_summary.{txt,json}
# ($OUT if set, else build/device_check/). Exit 0 when every step passed.
#
#   tools/device_check.sh                 the GPU check (needs an NVIDIA GPU)
#   tools/device_check.sh --backend cpu   dry mode: the same script path with
#                                         a cpu worker standing in for the GPU
#                                         (and a smaller model), to test the
#                                         script where no GPU is
# Environment: PCP_DEVICE_CHECK_BUDGET_S (470), PCP_DEVICE_CHECK_TARGET
# (default from the compute capability: sm_80, sm_90a, ...),
# PCP_DEVICE_CHECK_DTYPE (f32 | bf16, default f32).
#
# MFU = achieved model FLOP/s / the GPU's peak. Model FLOPs per token =
# 6 N (N = all parameters, embeddings included; forward + backward) + 12 L W
# T (attention scores and values, forward + backward; L layers, width W,
# context T). Peaks (dense, per GPU) from the vendors' data sheets, see
# peak_flops below. The training figures are end to end through the gateway
# (batches sampled on the gateway, parameters and deltas over TCP each outer
# step), not a kernel benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."

backend=cuda
while [[ $# -gt 0 ]]; do
  case "$1" in
    --backend) backend=${2:-}; shift 2 ;;
    --backend=*) backend=${1#--backend=}; shift ;;
    -h|--help) sed -n '2,34p' "$0"; exit 0 ;;
    *) echo "device_check: unknown argument '$1' (--backend cuda|cpu)" >&2; exit 2 ;;
  esac
done
if [[ "$backend" != cuda && "$backend" != cpu ]]; then
  echo "device_check: --backend must be cuda or cpu, not '$backend'" >&2
  exit 2
fi

budget=${PCP_DEVICE_CHECK_BUDGET_S:-470}
dtype=${PCP_DEVICE_CHECK_DTYPE:-f32}
started=$SECONDS
out=${OUT:-build/device_check}
work=$(mktemp -d "${TMPDIR:-/tmp}/pcp-device-check-XXXXXX")
mkdir -p "$out"
summary="$out/device_check_summary.txt"
summary_json="$out/device_check_summary.json"
: >"$summary"
echo '{}' >"$summary_json"
pcp=build/pcp
py=.venv/bin/python

log() { echo "device_check: $*"; }
note() {  # a summary line: printed and kept
  echo "$*" | tee -a "$summary"
}
record() {  # record KEY JSON-VALUE into the JSON summary
  "$py" - "$summary_json" "$1" "$2" <<'EOF'
import json, sys
path, key, value = sys.argv[1:4]
with open(path) as f:
    data = json.load(f)
data[key] = json.loads(value)
with open(path, "w") as f:
    json.dump(data, f, indent=1)
EOF
}
left() { echo $((budget - (SECONDS - started))); }
# cap SECONDS: the smaller of SECONDS and what is left of the budget (at
# least 1); fails the check once the budget is spent.
cap() {
  local l
  l=$(left)
  if ((l <= 1)); then
    fail "the ${budget}s budget is spent"
  fi
  echo $(($1 < l ? $1 : l))
}

pids=()
status_word=FAILED
cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [[ $rc -ne 0 ]]; then
    echo "device_check: FAILED after $((SECONDS - started))s; logs in $work" >&2
    for f in "$work"/*.log; do
      [[ -f "$f" ]] && { echo "--- tail of $f" >&2; tail -n 15 "$f" >&2; }
    done
    cp "$work"/*.log "$out"/ 2>/dev/null || true
  fi
  note "device_check $status_word in $((SECONDS - started))s (budget ${budget}s, backend $backend)"
  if [[ $rc -eq 0 ]]; then
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() {
  echo "device_check: $*" >&2
  exit 1
}

# wait_until SECONDS WHAT COMMAND...: polls every 0.25 s, bounded by SECONDS
# and the budget; fails when a started process died.
wait_until() {
  local seconds what deadline
  seconds=$(cap "$1")
  what=$2
  shift 2
  deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2>/dev/null || fail "a process exited while waiting for $what"
    done
    ((SECONDS < deadline)) || fail "timed out after ${seconds}s waiting for $what"
    sleep 0.25
  done
}

#===---------------------------------------------------------------------===#
# 0. The machine
#===---------------------------------------------------------------------===#
note "== device_check backend=$backend dtype=$dtype $(date -u +%Y-%m-%dT%H:%M:%SZ)"
gpu_name=cpu
target=
driver=cpu
if [[ $backend == cuda ]]; then
  command -v nvidia-smi >/dev/null ||
    fail "nvidia-smi not found: this check needs an NVIDIA GPU and its driver (--backend cpu runs the dry mode)"
  query=$(timeout 30 nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader | head -n 1) ||
    fail "nvidia-smi failed: $query"
  gpu_name=$(echo "$query" | cut -d, -f1 | sed 's/^ *//;s/ *$//')
  cap_version=$(echo "$query" | cut -d, -f2 | tr -d ' ')
  note "gpu: $query"
  if [[ -n "${PCP_DEVICE_CHECK_TARGET:-}" ]]; then
    target=$PCP_DEVICE_CHECK_TARGET
  else
    case "$cap_version" in
      9.0) target=sm_90a ;;
      *) target=sm_${cap_version//./} ;;
    esac
  fi
  driver=cuda
fi
if [[ ! -x "$pcp" || ! -x "$py" ]]; then
  log "building (make build: setup, configure, compile)"
  timeout "$(cap 300)" make build JOBS="$(nproc)" >"$work/build.log" 2>&1 ||
    fail "make build failed (see $work/build.log)"
fi
[[ -x "$pcp" ]] || fail "no $pcp after make build"
drivers=$(timeout 60 "$py" -c 'import iree.runtime as rt; print(" ".join(rt.query_available_drivers()))') ||
  fail "the IREE runtime wheel does not load in $py"
note "iree runtime drivers: $drivers"
if [[ $backend == cuda && " $drivers " != *" cuda "* ]]; then
  fail "the IREE runtime wheel has no cuda driver (drivers: $drivers)"
fi
record machine "$("$py" -c 'import json,sys; print(json.dumps({"backend": sys.argv[1], "gpu": sys.argv[2], "target": sys.argv[3], "drivers": sys.argv[4].split(), "dtype": sys.argv[5]}))' "$backend" "$gpu_name" "$target" "$drivers" "$dtype")"

# Model and schedule: big enough to load an H200 a little, small enough to
# compile and run in the budget; the dry mode's fits two shared CPU cores.
if [[ $backend == cuda ]]; then
  layers=4 heads=8 width=512 block=256 batch=16 tau=10 steps_gpu=6 steps_mixed=2
  decode_tokens=200
else
  layers=2 heads=4 width=64 block=64 batch=8 tau=4 steps_gpu=3 steps_mixed=2
  decode_tokens=48
fi
vocab=65
target_flag=()
[[ -n "$target" ]] && target_flag=(--target "$target")

#===---------------------------------------------------------------------===#
# 1. The training program compiled for the device, one call on it
#===---------------------------------------------------------------------===#
log "1. pcp compile --program train for $backend ${target:-(default target)}"
"$pcp" model gpt --layers "$layers" --heads "$heads" --width "$width" \
  --vocab "$vocab" --block-size "$block" --batch "$batch" --dtype "$dtype" \
  -o "$work/gpt.mlir" --params-json "$work/params.json" >"$work/model.log" 2>&1 ||
  fail "pcp model failed (see $work/model.log)"
k=2
t0=$SECONDS
timeout "$(cap 240)" "$pcp" compile --program train --inner-steps "$k" \
  "$work/gpt.mlir" --backend "$backend" "${target_flag[@]}" \
  --emit-mlir "$work/train.mlir" -o "$work/train.vmfb" >"$work/compile.log" 2>&1 ||
  fail "pcp compile --program train for $backend ${target} failed (see $work/compile.log)"
note "train program compiled for $backend ${target:-} in $((SECONDS - t0))s ($(grep -o 'compiled in [0-9.]* s\|cache hit' "$work/compile.log" | head -n 1))"
# One @train_steps call on the device with splat inputs: parameters 0.02,
# moments 0, step 1, lr 1e-3, token ids 1; the K losses printed last.
mapfile -t run_args < <("$pcp" inspect "$work/train.mlir" --function train_steps 2>/dev/null |
  "$py" -c '
import re, sys
text = sys.stdin.read()
sig = text[text.index("@train_steps("):]
head, tail = sig[:sig.index(") ->")], sig[sig.index(") ->") + 4:]
args = re.findall(r"arg(\d+): ([^,)]+)", head)
results = [r for r in tail.strip().strip("()").split(", ") if r]
n = len(args)
for i, (_, t) in enumerate(args):
    t = t.strip()
    if t.startswith("tensor<"):
        t = t[len("tensor<"):-1]
    if t.endswith("i32") or t.endswith("i64"):
        value = "1"  # token ids
    elif i == n - 4:
        value = "1"  # step
    elif i == n - 3:
        value = "0.001"  # lr (a scalar or one per fused step)
    elif i < (n - 4) // 3:
        value = "0.02"  # parameters
    else:
        value = "0"  # AdamW moments
    print("--input")
    print("%s=%s" % (t, value))
for i in range(len(results)):
    print("--output")
    print("-" if i == len(results) - 1 else "")
')
((${#run_args[@]} > 0)) || fail "could not read @train_steps' signature"
t0=$SECONDS
timeout "$(cap 120)" "$pcp" run "$work/train.vmfb" --function train_steps \
  --device "$driver" "${run_args[@]}" >"$work/run.log" 2>&1 ||
  fail "pcp run @train_steps on $driver failed (see $work/run.log)"
losses=$(tail -n 1 "$work/run.log")
"$py" - "$losses" "$k" <<'EOF' || fail "@train_steps on $driver: the losses are not $k finite numbers: $losses"
import math, re, sys
values = [float(v) for v in re.findall(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf", sys.argv[1].split("=")[-1])]
k = int(sys.argv[2])
sys.exit(0 if len(values) >= k and all(math.isfinite(v) for v in values[-k:]) else 1)
EOF
note "@train_steps ran on $driver (K=$k, $((SECONDS - t0))s with process start): losses $losses"

#===---------------------------------------------------------------------===#
# 2. Gateway, the device worker, a DiLoCo job on it alone
#===---------------------------------------------------------------------===#
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
api_port=$(free_port)
fabric_port=$(free_port)
url="http://127.0.0.1:$api_port"
PCP_WORKER_JOIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export PCP_WORKER_JOIN_TOKEN
cat >"$work/gateway.json" <<EOF
{"gateway_id": "device-check", "lab_id": "local", "state_dir": "$work/state",
 "worker_fabric": {"host": "127.0.0.1", "port": $fabric_port,
                   "join_token_env": "PCP_WORKER_JOIN_TOKEN",
                   "heartbeat_ms": 2000}}
EOF
"$pcp" --gateway --gateway-config "$work/gateway.json" --api-port "$api_port" \
  >"$work/gateway.log" 2>&1 &
pids+=($!)
wait_until 30 "the gateway's /healthz" curl -fsS "$url/healthz"

connected() {  # connected N: at least N workers connected
  curl -fsS "$url/v1/workers" | "$py" -c '
import json, sys
body = json.load(sys.stdin)
sys.exit(0 if body.get("counts", {}).get("connected", 0) >= int(sys.argv[1]) else 1)' "$1"
}
# The device worker: cuda device 0, or in the dry mode a cpu worker (device
# id 1, half the cores) standing in for it.
if [[ $backend == cuda ]]; then
  "$pcp" --worker --connect "127.0.0.1:$fabric_port" --backend cuda \
    --target "$target" --device-id 0 --cache-dir "$work/cache-gpu" \
    >"$work/worker-gpu.log" 2>&1 &
else
  "$pcp" --worker --connect "127.0.0.1:$fabric_port" --backend cpu \
    --device-id 1 --cpu-threads "$(( $(nproc) > 1 ? $(nproc) / 2 : 1 ))" \
    --cache-dir "$work/cache-gpu" >"$work/worker-gpu.log" 2>&1 &
fi
pids+=($!)
wait_until 60 "the $backend worker to join" connected 1

# submit NAME OUTER_STEPS: prints the job id.
submit() {
  "$py" - "$1" "$2" "$url" "$layers" "$heads" "$width" "$vocab" "$block" \
    "$batch" "$tau" "$dtype" <<'EOF'
import json, sys, urllib.request
name, steps, url, layers, heads, width, vocab, block, batch, tau, dtype = sys.argv[1:]
e = {"name": name,
     "model": {"kind": "gpt", "layers": int(layers), "heads": int(heads),
               "width": int(width), "vocab": int(vocab),
               "block_size": int(block), "batch": int(batch)},
     "data_path": "data/tiny_shakespeare.txt", "tokenizer": "char",
     "sampling": "random", "learning_rate": 0.001, "tau": int(tau),
     "outer_loop_steps": int(steps), "nesterov_momentum": 0.0,
     "outer_learning_rate": 1.0, "checkpoint_every": 1000, "seed": 1,
     "dtype": dtype}
req = urllib.request.Request(url + "/v1/training/jobs",
                             data=json.dumps(e).encode(), method="POST",
                             headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        print(json.loads(r.read())["job_id"])
except urllib.error.HTTPError as err:
    sys.exit("submit: %s %s" % (err.code, err.read().decode()[:400]))
EOF
}
job_done() {  # job_done ID: the job reached a terminal state
  curl -fsS "$url/v1/training/jobs/$1" | "$py" -c '
import json, sys
sys.exit(0 if json.load(sys.stdin).get("state") in ("succeeded", "failed", "cancelled") else 1)'
}
# figures ID LABEL WORKERS: summarises the job's training.step events
# (median over the steps after the first) and checks every step averaged
# WORKERS workers; prints a JSON object.
figures() {
  curl -fsS "$url/v1/training/jobs/$1" >"$work/$1.job.json"
  curl -fsS "$url/v1/jobs/$1/events" >"$work/$1.events.json"
  "$py" - "$work/$1.job.json" "$work/$1.events.json" "$2" "$3" "$gpu_name" \
    "$layers" "$width" "$block" "$batch" "$tau" "$dtype" <<'EOF'
import json, statistics, sys
job_path, events_path, label, workers, gpu, layers, width, block, batch, tau, dtype = sys.argv[1:]
layers, width, block, batch, tau, workers = map(int, (layers, width, block, batch, tau, workers))
job = json.load(open(job_path))
if job.get("state") != "succeeded":
    sys.exit("%s: the job ended %s: %s" % (label, job.get("state"), job.get("error") or job.get("message")))
steps = {}
for e in json.load(open(events_path)).get("events", []):
    if e.get("type") == "training.step":
        steps[e["payload"]["outer_step"]] = e["payload"]
if not steps:
    sys.exit("%s: no training.step events" % label)
bad = [s for s, p in steps.items() if p.get("workers") != workers]
if bad:
    sys.exit("%s: outer steps %s averaged %s workers, not %d" % (label, bad, [steps[s].get("workers") for s in bad], workers))
order = sorted(steps)
steady = [steps[s] for s in order[1:]] or [steps[order[0]]]
seconds = statistics.median(p["seconds"] for p in steady)
tps = statistics.median(p["tokens_per_second"] for p in steady)
n = steps[order[-1]]["parameter_count"]
flops_per_token = 6 * n + 12 * layers * width * block
achieved = flops_per_token * tps
# Dense peaks per GPU (FLOP/s): f32 (CUDA cores) and bf16 (tensor cores),
# from the vendors' data sheets.
peaks = [("H200", 67e12, 989e12), ("H100 PCIe", 51e12, 756e12),
         ("H100", 67e12, 989e12), ("A100", 19.5e12, 312e12),
         ("L40S", 91.6e12, 362e12), ("A10", 31.2e12, 125e12),
         ("L4", 30.3e12, 121e12)]
peak = next(((f, b) for key, f, b in peaks if key in gpu), None)
out = {"label": label, "outer_steps": len(steps), "workers": workers,
       "parameters": n, "tokens_per_outer_step_per_worker": tau * batch * block,
       "outer_step_seconds": round(seconds, 4),
       "inner_step_seconds": round(seconds / tau, 5),
       "tokens_per_second": round(tps, 1),
       "model_flops_per_token": flops_per_token,
       "achieved_tflops": round(achieved / 1e12, 4),
       "last_loss": steps[order[-1]].get("loss")}
if peak:
    out["mfu_vs_f32_peak"] = round(achieved / peak[0], 5)
    out["mfu_vs_bf16_dense_peak"] = round(achieved / peak[1], 5)
    out["peak_f32_tflops"] = peak[0] / 1e12
    out["peak_bf16_dense_tflops"] = peak[1] / 1e12
print(json.dumps(out))
EOF
}
describe() {  # describe JSON: one summary line
  "$py" -c '
import json, sys
f = json.loads(sys.argv[1])
mfu = ("MFU %.2f%% of the f32 peak (%.1f TFLOP/s), %.3f%% of the bf16 dense peak" %
       (100 * f["mfu_vs_f32_peak"], f["peak_f32_tflops"], 100 * f["mfu_vs_bf16_dense_peak"])
       if "mfu_vs_f32_peak" in f else "MFU n/a (no peak for this device)")
print("%s: %d params, outer step %.3f s (inner step %.4f s), %.0f tokens/s, "
      "%.3g model FLOP/token, %.4f TFLOP/s, %s; last loss %s" %
      (f["label"], f["parameters"], f["outer_step_seconds"], f["inner_step_seconds"],
       f["tokens_per_second"], f["model_flops_per_token"], f["achieved_tflops"],
       mfu, f["last_loss"]))' "$1"
}

log "2. DiLoCo training job on the $backend worker alone ($steps_gpu outer steps of tau $tau)"
job_a=$(submit check-gpu "$steps_gpu") || fail "the training job was refused"
wait_until 240 "training job $job_a" job_done "$job_a"
fig_a=$(figures "$job_a" "train on $backend alone" 1) || fail "training job $job_a: $fig_a"
record train_device "$fig_a"
note "$(describe "$fig_a")"

#===---------------------------------------------------------------------===#
# 3. Decode on the device: the job's export, served on the device worker
#===---------------------------------------------------------------------===#
log "3. greedy decode of the exported model on the $backend worker"
served() {
  curl -fsS "$url/v1/models/check-gpu" | "$py" -c '
import json, sys
m = json.load(sys.stdin)
sys.exit(0 if m.get("status") == "ready" and m.get("job_id") == sys.argv[1] else 1)' "$1"
}
wait_until 150 "the model served on the $backend worker" served "$job_a"
decode=$(timeout "$(cap 90)" "$py" - "$url" "$decode_tokens" <<'EOF'
import json, sys, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
body = {"model": "check-gpu", "prompt": "ROMEO:", "max_tokens": n,
        "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}}
req = urllib.request.Request(url + "/v1/completions",
                             data=json.dumps(body).encode(), method="POST",
                             headers={"Content-Type": "application/json"})
start = time.time()
first = last = None
pieces = 0
tokens = None
with urllib.request.urlopen(req, timeout=80) as r:
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            sys.exit("decode: %s" % event["error"])
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
        if event.get("choices") and event["choices"][0].get("text"):
            now = time.time()
            first = first or now
            last = now
            pieces += 1
if not tokens or first is None:
    sys.exit("decode: no tokens came back")
rate = (tokens - 1) / (last - first) if last > first else float("nan")
print(json.dumps({"tokens": tokens, "tokens_per_second": round(rate, 1),
                  "time_to_first_token_s": round(first - start, 4)}))
EOF
) || fail "decode on $backend failed: $decode"
record decode_device "$decode"
note "decode on $backend (1 stream, greedy, char GPT above): $(echo "$decode" | "$py" -c 'import json,sys; d=json.load(sys.stdin); print("%d tokens, %.1f tokens/s, time to first token %.3f s" % (d["tokens"], d["tokens_per_second"], d["time_to_first_token_s"]))')"

#===---------------------------------------------------------------------===#
# 4. A cpu worker joins: one DiLoCo run over both
#===---------------------------------------------------------------------===#
log "4. DiLoCo job mixing a cpu and the $backend worker ($steps_mixed outer steps)"
"$pcp" --worker --connect "127.0.0.1:$fabric_port" --backend cpu \
  --device-id 0 --cpu-threads "$(( $(nproc) > 1 ? $(nproc) / 2 : 1 ))" \
  --cache-dir "$work/cache-cpu" >"$work/worker-cpu.log" 2>&1 &
pids+=($!)
wait_until 60 "the cpu worker to join" connected 2
job_b=$(submit check-mixed "$steps_mixed") || fail "the mixed training job was refused"
wait_until 300 "mixed training job $job_b" job_done "$job_b"
fig_b=$(figures "$job_b" "DiLoCo on cpu + $backend" 2) || fail "mixed job $job_b: $fig_b"
record train_mixed "$fig_b"
note "$(describe "$fig_b")"

status_word=PASSED
record passed true
cp "$work"/*.log "$out"/ 2>/dev/null || true
