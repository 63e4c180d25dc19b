#!/usr/bin/env bash
# bench/image (build/bench/image, `make bench BENCH=image`):
#   1. cold start to green: a gateway and a node manager with two CPU workers
#      started at once, until the gateway's /readyz answers 200 with both
#      workers connected and the node manager's /readyz answers 200; fresh
#      state each time (a new state directory / a new named volume); the
#      median of PCP_BENCH_IMAGE_RUNS (default 5) starts as containers of
#      localhost/pcp:latest against the same binary started on the host;
#   2. the image's size against the sum of the files it must hold: the pcp
#      binary, the shared libraries it links and loads (ldd closure inside
#      the image, with the C++ runtime the IREE libraries need), the Python
#      interpreter and standard library it embeds, and the venv with the
#      pinned wheels.
# Last line: "image ratio=<host median / container median>" (higher is
# better; 1 = containers start as fast as processes). With PCP_BENCH_CHECK=1
# a ratio under 0.5 exits 1.
set -euo pipefail
source_dir=${PCP_SOURCE_DIR:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$source_dir"
pcp=${PCP_BINARY:-$source_dir/build/pcp}
runs=${PCP_BENCH_IMAGE_RUNS:-5}
image=localhost/pcp:latest
python=python3
die() { echo "image: error: $*" >&2; exit 1; }

command -v podman >/dev/null || die "podman is not installed ('make setup')"
[[ -x $pcp ]] || die "$pcp is missing ('make build')"
# The image of this binary (warm: only the binary's layer is rebuilt).
PCP_BINARY=$pcp PCP_IMAGE_SAVE=0 deploy/image/build.sh 2>/dev/null ||
  die "deploy/image/build.sh failed (run it for the reason)"

run_options=(--runtime runc --network=host --ulimit nofile=20000:20000
  --ulimit nproc=4096:4096)
work=$(mktemp -d /tmp/pcp-bench-image.XXXXXX)
chmod 755 "$work"
pids=()
containers=()
volumes=()
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
  for c in "${containers[@]}"; do podman rm -f -v -t 3 "$c" >/dev/null 2>&1 || true; done
  containers=()
  for v in "${volumes[@]}"; do podman volume rm -f "$v" >/dev/null 2>&1 || true; done
  volumes=()
}
trap 'stop_all; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
now_ms() { date +%s%3N; }
green() {  # gateway URL, node manager URL
  curl -fsS --max-time 1 "$2/readyz" >/dev/null 2>&1 || return 1
  curl -fsS --max-time 1 "$1/readyz" 2>/dev/null | "$python" -c '
import json, sys
b = json.load(sys.stdin)
sys.exit(0 if b.get("ready") and b.get("workers_connected", 0) >= 2 else 1)'
}
PCP_WORKER_JOIN_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export PCP_WORKER_JOIN_TOKEN

# One start; sets elapsed_ms to the time to green. $1: host or container,
# $2: the run. Not in a subshell, so that the EXIT trap sees what it started.
start_once() {
  local mode=$1 n=$2
  local api fabric nm
  api=$(free_port)
  fabric=$(free_port)
  nm=$(free_port)
  local dir=$work/$mode-$n
  mkdir -p "$dir/etc"
  chmod 755 "$dir" "$dir/etc"
  local state=/var/lib/pcp
  [[ $mode == host ]] && state=$dir/state
  cat >"$dir/etc/gateway.json" <<EOF
{"gateway_id": "bench", "lab_id": "local", "state_dir": "$state",
 "worker_fabric": {"host": "127.0.0.1", "port": $fabric,
                   "join_token_env": "PCP_WORKER_JOIN_TOKEN"}}
EOF
  chmod 644 "$dir/etc/gateway.json"
  local t0
  t0=$(now_ms)
  if [[ $mode == host ]]; then
    "$pcp" --gateway --gateway-config "$dir/etc/gateway.json" --api-port "$api" \
      >"$dir/gateway.log" 2>&1 &
    pids+=($!)
    "$pcp" --node-manager --scale 2 --host 127.0.0.1 --port "$fabric" \
      --backend cpu --api-port "$nm" >"$dir/nodemgr.log" 2>&1 &
    pids+=($!)
  else
    local volume=pcp-bench-image-$$-$n
    podman volume create "$volume" >/dev/null
    volumes+=("$volume")
    containers+=("pcp-bench-image-$$-$n-gw" "pcp-bench-image-$$-$n-nm")
    podman run -d --name "pcp-bench-image-$$-$n-gw" "${run_options[@]}" \
      -e PCP_WORKER_JOIN_TOKEN -v "$volume:/var/lib/pcp" \
      -v "$dir/etc:/etc/pcp:ro" "$image" --gateway \
      --gateway-config /etc/pcp/gateway.json --api-port "$api" >/dev/null &
    podman run -d --name "pcp-bench-image-$$-$n-nm" "${run_options[@]}" \
      -e PCP_WORKER_JOIN_TOKEN "$image" --node-manager --scale 2 \
      --host 127.0.0.1 --port "$fabric" --backend cpu --api-port "$nm" >/dev/null &
    wait
  fi
  local deadline=$((SECONDS + 120))
  until green "http://127.0.0.1:$api" "http://127.0.0.1:$nm"; do
    [[ $SECONDS -lt $deadline ]] || die "$mode start $n: not green after 120 s"
    sleep 0.05
  done
  elapsed_ms=$(($(now_ms) - t0))
  stop_all
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
host_times=()
container_times=()
for ((i = 1; i <= runs; ++i)); do
  # Interleaved, so that a load change on the machine hits both alike.
  start_once host "$i"
  host_times+=("$elapsed_ms")
  start_once container "$i"
  container_times+=("$elapsed_ms")
done
host_ms=$(printf '%s\n' "${host_times[@]}" | median)
container_ms=$(printf '%s\n' "${container_times[@]}" | median)
echo "cold start to /readyz green (gateway + node manager + 2 CPU workers, $runs runs each, median):"
echo "  host processes   ${host_ms} ms   (runs: ${host_times[*]})"
echo "  containers       ${container_ms} ms   (runs: ${container_times[*]})"

# The files the image must hold, measured inside it.
must_kb=$(podman run --rm "${run_options[@]}" --entrypoint /bin/sh \
  "$image" -c '
libs=$( { ldd /usr/bin/pcp
        for l in libmicrohttpd.so.12 libcurl.so.4 libstdc++.so.6 libgcc_s.so.1; do
          p=$(ldconfig -p | awk -v l="$l" "\$1 == l {print \$NF; exit}");
          echo "x => $p"; ldd "$p"; done; } |
        awk "/=>/ {print \$3} /^\t\// {print \$1}" | sort -u)
du -kcL /usr/bin/pcp /usr/bin/python3.11 /usr/lib/python3.11 /opt/pcp/venv $libs |
  tail -n 1 | cut -f1') || die "measuring the files inside the image failed"
image_bytes=$(podman image inspect --format '{{.Size}}' "$image")
must_mb=$((must_kb / 1024))
image_mb=$((image_bytes / 1048576))
echo "image size: ${image_mb} MiB; files it must hold: ${must_mb} MiB (pcp, its libraries, python3.11 + stdlib, the venv); overhead $((image_mb - must_mb)) MiB"
echo "image size_ratio=$(awk -v a="$must_mb" -v b="$image_mb" 'BEGIN {printf "%.3f", a / b}') (must-hold / image)"
ratio=$(awk -v h="$host_ms" -v c="$container_ms" 'BEGIN {printf "%.3f", h / c}')
if [[ ${PCP_BENCH_CHECK:-0} == 1 ]] && awk -v r="$ratio" 'BEGIN {exit !(r < 0.5)}'; then
  echo "goal missed: containers take more than twice as long as processes to start" >&2
  echo "image ratio=$ratio"
  exit 1
fi
echo "image ratio=$ratio"
