# SPDX-License-Identifier: Apache-2.0
"""bench/diloco_comm measured: bytes on the fabric per worker and at the
gateway link for a real DiLoCo job over loopback, W = 1, 2, 4 CPU workers,
against the arithmetic prediction of the same run.

Run by build/bench/diloco_comm (argv: pcp binary, then options). For each W:
a fresh `pcp --gateway` on a fresh state dir (the compiled programs copied
from the previous W, so the round program compiles once) and W
`pcp --worker` processes with empty program caches; one training job (a small built-in GPT, inner_state reset so no worker state crosses the
wire, no validation); when it has succeeded, GET /v1/workers gives the
fabric's own byte counters of each worker's link (what the gateway read from
and handed to that socket, handshake, heartbeats and framing included).

Prediction per worker (the payload, docs/training.md "Wire accounting"):
  steps x (N x 4 params down + N x 4 deltas up
           + tau x B x T x 4 x 2 token ids and targets down
           + tau x 4 learning rates down + tau x 4 losses up)
  + every program the worker fetched, once (the sizes of the files it
    cached: the round program, and the inference service's)
  + N x 4 for the inference service's load of the final weights (the job's
    export is served at its end: the bench waits until the model is ready
    and the links are quiet, so that traffic is always counted whole).
The gateway link carries the sum over the workers. The job's own
`wire_bytes` must equal W x steps x N x 8 (checked).

Prints, per W, measured / predicted bytes per worker and at the gateway link,
and the data-parallel ring all-reduce the same inner steps would move per
worker (2 (W-1)/W x 4N per inner step, arithmetic: there is no DP runtime to
measure). Goal: at every W, predicted / measured in [0.9, 1.0] for every
worker (the counters see at least the payload, and framing, handshake and
heartbeats add under 10 %). Last line: `diloco_comm ratio=<x>`, x = the
smallest predicted / measured over every worker of every W (higher is
better, 1 = nothing but payload on the wire).
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

TOKEN = "bench-diloco-token"
JOIN = "bench-diloco-join"
HERE = os.path.dirname(os.path.abspath(__file__))
# BENCH_DILOCO_DEBUG=1: info logs, the cached programs listed, and the work
# directory kept (printed).
DEBUG = os.environ.get("BENCH_DILOCO_DEBUG", "") not in ("", "0")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(base, method, path, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": "Bearer " + TOKEN}
    if data is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as e:
        payload = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(payload)
        except ValueError:
            return e.code, payload


def wait_for(what, predicate, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("timed out after %d s waiting for %s" % (seconds, what))


def stop(proc):
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def programs(path):
    """Sizes of the programs (VMFBs) a worker fetched into its cache."""
    sizes = []
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if name.endswith(".vmfb") and not os.path.islink(full):
                sizes.append(os.path.getsize(full))
    return sizes


def run_one(pcp, work, workers, experiment, seconds):
    """One job on a fresh state dir (a second job in the same one moves
    more: the gateway finds the first job's state) that reuses the compiled
    programs of the previous run (the artifact cache is content-keyed)."""
    previous = getattr(run_one, "previous", None)
    run_one.count = getattr(run_one, "count", 0) + 1
    state = os.path.join(work, "state-%d-w%d" % (run_one.count, workers))
    os.makedirs(os.path.join(state, "data"))
    if previous and os.path.isdir(os.path.join(previous, "artifacts")):
        shutil.copytree(os.path.join(previous, "artifacts"),
                        os.path.join(state, "artifacts"))
    run_one.previous = state
    experiment = dict(experiment, data_path=os.path.join(state, "data",
                                                         "text.txt"))
    shutil.copyfile(os.path.join(work, "text.txt"), experiment["data_path"])
    api, fabric = free_port(), free_port()
    base = "http://127.0.0.1:%d" % api
    config = os.path.join(work, "g.json")
    with open(config, "w") as f:
        json.dump({"gateway_id": "bench", "lab_id": "bench",
                   "state_dir": state,
                   "api": {"token_env": "BENCH_DILOCO_TOKEN"},
                   "worker_fabric": {"host": "127.0.0.1", "port": fabric,
                                     "join_token_env": "BENCH_DILOCO_JOIN",
                                     "heartbeat_ms": 1000}}, f)
    env = dict(os.environ, BENCH_DILOCO_TOKEN=TOKEN, BENCH_DILOCO_JOIN=JOIN,
               PCP_WORKER_JOIN_TOKEN=JOIN,
               PCP_LOG_LEVEL="info" if DEBUG else "warn")
    logs = open(state + ".log", "w")
    procs = []
    # A worker id names its host and device: one device id per worker.
    try:
        gateway = subprocess.Popen(
            [pcp, "--gateway", "--gateway-config", config, "--api-port",
             str(api)], env=env, stderr=logs)
        procs.append(gateway)
        wait_for("the gateway", lambda: request(base, "GET", "/healthz")[0]
                 == 200, 60)
        caches = []
        for i in range(workers):
            cache = "%s-cache-%d" % (state, i)
            shutil.rmtree(cache, ignore_errors=True)
            caches.append(cache)
            procs.append(subprocess.Popen(
                [pcp, "--worker", "--connect", "127.0.0.1:%d" % fabric,
                 "--device-id", str(i), "--cache-dir", cache], env=env,
                stderr=logs))
        wait_for("%d workers" % workers, lambda: request(
            base, "GET", "/v1/workers")[1]["counts"]["connected"] == workers,
            120)
        status, job = request(base, "POST", "/v1/training/jobs", experiment)
        if status != 202:
            raise RuntimeError("job not accepted: %s %s" % (status, job))
        job_id = job["job_id"]

        def finished():
            s, r = request(base, "GET", "/v1/training/jobs/" + job_id)
            finished.last = r
            return s == 200 and r.get("state") in ("succeeded", "failed",
                                                   "cancelled")
        wait_for("job %s" % job_id, finished, seconds)
        if finished.last.get("state") != "succeeded":
            raise RuntimeError("job %s: %s" % (job_id, finished.last))
        # The job's final export is then served: the inference service
        # compiles its program and loads the weights onto the workers. Wait
        # until the model is ready and the links are quiet (heartbeats
        # only), so that traffic is counted whole, every time.
        def served():
            models = request(base, "GET", "/v1/models")[1].get("data", [])
            return any(m.get("job_id") == job_id and
                       m.get("status") in ("ready", "failed") and
                       not m.get("pending_version") for m in models)
        wait_for("the trained model served", served, seconds)

        def quiet():
            now = [w["bytes_to_worker"] + w["bytes_from_worker"] for w in
                   request(base, "GET", "/v1/workers")[1]["workers"]]
            before, quiet.last = getattr(quiet, "last", None), now
            if before is None or len(before) != len(now):
                return False
            time.sleep(1.5)
            return all(b - a < 1024 for a, b in zip(before, now))
        wait_for("quiet links", quiet, 60)
        listing = request(base, "GET", "/v1/workers")[1]["workers"]
        links = [(w["bytes_to_worker"], w["bytes_from_worker"],
                  w["eviction_count"]) for w in listing
                 if w["state"] == "connected"]
        if len(links) != workers:
            raise RuntimeError("%d workers connected at the end, want %d"
                               % (len(links), workers))
        fetched = [programs(c) for c in caches]
        if DEBUG:
            for c in caches:
                for root, _, files in os.walk(c):
                    for name in files:
                        full = os.path.join(root, name)
                        print("  cache", full, os.path.getsize(full))
        return finished.last["training"], links, fetched
    finally:
        for p in reversed(procs):
            stop(p)
        logs.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pcp")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tau", type=int, default=2)
    parser.add_argument("--budget-s", type=int, default=240,
                        help="per job")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    if not counts or min(counts) < 1 or max(counts) > 8:
        parser.error("--workers: 1..8 each")
    if not 1 <= args.steps <= 100 or not 1 <= args.tau <= 100:
        parser.error("--steps and --tau: 1..100")
    model = {"kind": "gpt", "layers": 2, "heads": 4, "kv_heads": 4,
             "width": 64, "vocab": 65, "block_size": 32, "batch": 4}
    work = tempfile.mkdtemp(prefix="pcp-bench-diloco-")
    try:
        data = os.path.join(work, "text.txt")
        with open(os.path.join(HERE, "..", "data", "tiny_shakespeare.txt"),
                  "rb") as src, open(data, "wb") as dst:
            dst.write(src.read(200000))
        experiment = {
            "name": "bench-diloco-comm", "model": model, "data_path": data,
            "tokenizer": "char", "sampling": "fifo", "learning_rate": 0.003,
            "tau": args.tau, "outer_loop_steps": args.steps,
            "nesterov_momentum": 0.0, "outer_learning_rate": 1.0,
            "inner_state": "reset", "eval_fraction": 0.0,
            "checkpoint_every": 1000, "seed": 3}
        b, t, tau, steps = model["batch"], model["block_size"], args.tau, \
            args.steps
        worst = None
        per_worker_measured = {}
        ok = True
        print("model gpt 2 layers width 64 block 32 batch 4, tau %d, %d outer "
              "steps, inner_state reset, f32 deltas" % (tau, steps))
        for w in counts:
            t0 = time.time()
            training, links, fetched = run_one(args.pcp, work, w, experiment,
                                               args.budget_s)
            n = training["parameter_count"]
            payload = steps * (n * 4 + n * 4 + tau * b * t * 4 * 2
                               + tau * 4 * 2)
            evictions = sum(link[2] for link in links)
            measured = [link[0] + link[1] for link in links]
            vmfb = [sum(f) for f in fetched]
            # Each program past the round program is the inference
            # service's, and came with one load of the f32 weights.
            serving = [n * 4 * max(0, len(f) - 1) for f in fetched]
            predicted = [payload + v + s for v, s in zip(vmfb, serving)]
            shares = [p / m for p, m in zip(predicted, measured)]
            ring = steps * tau * 2 * (w - 1) * 4 * n / w
            link_measured, link_predicted = sum(measured), sum(predicted)
            per_worker_measured[w] = sum(measured) / w
            print("W=%d (%.0f s): N=%d, job wire_bytes=%d; per worker "
                  "measured %s bytes (down+up), predicted %s (training "
                  "payload %d + programs %s + served weights %s), "
                  "predicted/measured %s; evictions %d"
                  % (w, time.time() - t0, n, training["wire_bytes"],
                     "/".join(str(m) for m in measured),
                     "/".join(str(p) for p in predicted), payload,
                     "/".join(str(v) for v in vmfb),
                     "/".join(str(s) for s in serving),
                     "/".join("%.3f" % s for s in shares), evictions))
            print("W=%d gateway link: measured %d bytes, predicted %d, "
                  "%.3f; a DP ring all-reduce of the same %d inner steps "
                  "would move %.0f bytes per worker, %.2fx DiLoCo's "
                  "training payload per worker, and has no central link"
                  % (w, link_measured, link_predicted,
                     link_predicted / link_measured, steps * tau, ring,
                     ring / payload))
            for s in shares:
                ok &= 0.9 <= s <= 1.0
                worst = s if worst is None else min(worst, s)
            ok &= evictions == 0 and min(vmfb) > 0 and \
                training["wire_bytes"] == w * steps * n * 8
        first = counts[0]
        print("growth with W (vs W=%d): per worker %s; gateway link %s"
              % (first, ", ".join("W=%d %.2fx" % (w, per_worker_measured[w]
                                                  / per_worker_measured[first])
                                  for w in counts),
                 ", ".join("W=%d %.2fx" % (w, per_worker_measured[w] * w /
                                           per_worker_measured[first] / first)
                           for w in counts)))
        print("diloco_comm goal predicted/measured in [0.9, 1.0] for every "
              "worker, no eviction: %s" % ("met" if ok else "MISSED"))
        print("diloco_comm ratio=%.3f" % worst)
        check = os.environ.get("PCP_BENCH_CHECK", "") not in ("", "0")
        return 1 if (check and not ok) else 0
    finally:
        if DEBUG:
            print("work directory kept:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
