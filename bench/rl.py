#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bench/rl: rollout tokens per second of a GRPO job against the decode
rate of the same model on the same workers, and weight-refresh time
against the bytes over measured loopback bandwidth (issue 16, Benchmark;
build/bench/rl runs this file).

One gateway and `pcp --node-manager --scale 2` (two CPU workers) on
127.0.0.1:

  0. base model: a short DiLoCo job trains a small char GPT on
     data/tiny_shakespeare.txt; its export is served (the inference
     service), and it is the RL job's base_model ({"train_job": id}).
  a. decode baseline: the aggregate tokens/s of the inference engine on
     that served model and those two workers (the generation driver, the
     code path bench/decode measures in-process, here with the scheduler,
     the fabric and the gateway's sampling that rollouts also go through):
     ROLLOUTS = num_prompts x group_size requests at once (2 workers x 8
     slots: the engine's full batch), the RL job's prompts, temperature,
     top_p and max_tokens, distinct seeds; tokens = the sum of
     usage.completion_tokens, seconds = first request sent to last answer;
     one warm-up round, then the median of ROUNDS rounds before the RL
     job and ROUNDS after it (the load of a shared machine drifts).
  b. RL: a GRPO job of --iterations (default 8) iterations on the same
     model (POST /v1/rl/jobs, followed through GET /v1/jobs/{id}); rollout
     tokens/s =
     job.rl.tokens_per_second (rollout completion tokens / rollout
     seconds) of each iteration; the median over the iterations after the
     first (the first loads and compiles the policy).
     ratio = (b) / (a), goal >= 0.8.
  c. weight refresh: job.rl.weight_refresh_seconds (export -> the new
     version served on the first worker) against job.rl.
     weight_refresh_bytes / the loopback bandwidth measured in the same run
     (a timed 256 MiB TCP transfer over 127.0.0.1 between two threads of
     this process). Reported, no goal.

Last line `rl ratio=<x>`. Under PCP_BENCH_CHECK=1 a ratio below 0.8 exits 1
after it.

usage: rl.py PCP_BINARY [--iterations N] [--budget-s S] [--keep]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data", "tiny_shakespeare.txt")
JOIN = "bench-rl"
RATIO_GOAL = 0.8
NUM_PROMPTS, GROUP_SIZE = 2, 8  # 16 rollouts: 2 workers x 8 slots
MAX_TOKENS = 32
TEMPERATURE = 1.0
ROUNDS = 10
LOOPBACK_BYTES = 256 << 20
SPEC = {"kind": "gpt", "layers": 2, "heads": 4, "width": 64, "vocab": 65,
        "block_size": 64, "batch": 8}


def log(message):
    print("rl: " + message, flush=True)


def die(message):
    print("rl: " + message, file=sys.stderr, flush=True)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(base, method, path, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"{}")
        except ValueError:
            return e.code, {}
    except (OSError, ValueError):
        return 0, {}


def wait_until(what, fn, deadline, procs, period=0.2):
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            die("timed out waiting for %s" % what)
        if any(p.poll() is not None for p in procs):
            die("a pcp process exited while waiting for %s" % what)
        time.sleep(period)


def loopback_bandwidth(total=LOOPBACK_BYTES):
    """Bytes per second of one TCP stream over 127.0.0.1 (4 MiB writes),
    timed from the first byte sent to the last byte received."""
    chunk = 4 << 20
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    got = [0]

    def sink():
        conn, _ = server.accept()
        buf = bytearray(chunk)
        view = memoryview(buf)
        while got[0] < total:
            n = conn.recv_into(view)
            if not n:
                break
            got[0] += n
        conn.close()

    t = threading.Thread(target=sink)
    t.start()
    payload = bytes(chunk)
    c = socket.create_connection(("127.0.0.1", port))
    start = time.perf_counter()
    sent = 0
    while sent < total:
        c.sendall(payload)
        sent += chunk
    t.join()
    seconds = time.perf_counter() - start
    c.close()
    server.close()
    if got[0] < total:
        die("loopback transfer short: %d of %d bytes" % (got[0], total))
    return total / seconds


def prompts_write(path, count=64):
    """Prompts from the corpus: the first 12 characters of lines that have
    them (only characters of the char tokenizer's vocabulary)."""
    out = []
    with open(DATA) as f:
        for line in f:
            line = line.strip()
            if len(line) >= 12 and not line.endswith(":"):
                out.append(line[:12])
            if len(out) == count:
                break
    with open(path, "w") as f:
        for p in out:
            f.write(json.dumps({"prompt": p}) + "\n")
    return out


def decode_round(base, model, prompts, seed0):
    """ROLLOUTS completions at once; (completion tokens, seconds)."""
    results = [None] * len(prompts)

    def one(i):
        results[i] = http(base, "POST", "/v1/completions", {
            "model": model, "prompt": prompts[i], "max_tokens": MAX_TOKENS,
            "temperature": TEMPERATURE, "top_p": 1.0, "seed": seed0 + i},
            timeout=300)

    threads = [threading.Thread(target=one, args=(i,))
               for i in range(len(prompts))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    tokens = 0
    for status, body in results:
        if status != 200:
            die("completion failed: %s %s" % (status, body))
        tokens += body["usage"]["completion_tokens"]
    return tokens, seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pcp")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=840)
    ap.add_argument("--keep", action="store_true",
                    help="keep the work directory (logs, state)")
    args = ap.parse_args()
    deadline = time.time() + args.budget_s
    work = tempfile.mkdtemp(prefix="pcp-bench-rl-")
    api, fabric = free_port(), free_port()
    base = "http://127.0.0.1:%d" % api
    state = os.path.join(work, "state")
    config = os.path.join(work, "gateway.json")
    with open(config, "w") as f:
        json.dump({"gateway_id": "bench-rl", "lab_id": "local",
                   "state_dir": state,
                   "data_roots": [os.path.join(ROOT, "data"), work],
                   "worker_fabric": {"host": "127.0.0.1", "port": fabric,
                                     "join_token_env": "RL_JOIN",
                                     "heartbeat_ms": 1000}}, f)
    prompts_path = os.path.join(work, "prompts.jsonl")
    prompts = prompts_write(prompts_path)
    procs = []
    ok = False
    try:
        bandwidth = loopback_bandwidth()
        log("loopback: %d MiB over one TCP stream at %.0f MiB/s" %
            (LOOPBACK_BYTES >> 20, bandwidth / (1 << 20)))
        procs.append(subprocess.Popen(
            [args.pcp, "--gateway", "--gateway-config", config, "--api-port",
             str(api)], env=dict(os.environ, RL_JOIN=JOIN),
            stderr=open(os.path.join(work, "gateway.log"), "w")))
        procs.append(subprocess.Popen(
            [args.pcp, "--node-manager", "--scale", "2", "--host",
             "127.0.0.1", "--port", str(fabric), "--backend", "cpu",
             "--api-port", "0"],
            env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN),
            stderr=open(os.path.join(work, "node-manager.log"), "w")))
        wait_until("two workers", lambda: http(base, "GET", "/v1/workers")[1]
                   .get("counts", {}).get("connected", 0) >= 2, deadline,
                   procs)

        # 0. The base model.
        name = "bench-rl-base"
        status, job = http(base, "POST", "/v1/training/jobs", {
            "name": name, "model": dict(SPEC), "data_path": DATA,
            "tokenizer": "char", "sampling": "random", "learning_rate": 0.003,
            "tau": 4, "outer_loop_steps": 6, "checkpoint_every": 6,
            "seed": 1})
        if status != 202:
            die("training job refused: %s %s" % (status, job))
        train_id = job["job_id"]
        t0 = time.time()
        end = wait_until("the base model's training", lambda: (
            lambda j: j if j.get("state") in ("succeeded", "failed",
                                              "cancelled") else None)(
            http(base, "GET", "/v1/jobs/%s" % train_id)[1]), deadline, procs,
            0.5)
        if end["state"] != "succeeded":
            die("base model training %s: %s" % (end["state"],
                                                 end.get("error")))
        log("base model: training job %s in %.0f s" % (train_id,
                                                       time.time() - t0))
        wait_until("the base model served", lambda: any(
            m.get("id") == name and m.get("status") == "ready"
            for m in http(base, "GET", "/v1/models")[1].get("data", [])),
            deadline, procs)

        # a. Decode baseline on the served base model.
        n = NUM_PROMPTS * GROUP_SIZE
        batch = [prompts[i // GROUP_SIZE] for i in range(n)]
        decode_round(base, name, batch, 1000)  # warm-up
        rates = []
        for r in range(ROUNDS):
            tokens, seconds = decode_round(base, name, batch, 2000 + 100 * r)
            rates.append(tokens / seconds)
            log("decode round %d: %d tokens in %.2f s, %.1f tok/s" %
                (r + 1, tokens, seconds, tokens / seconds))

        # b. The RL job.
        experiment = {
            "num_iterations": args.iterations, "group_size": GROUP_SIZE,
            "num_prompts": NUM_PROMPTS, "rollout_max_tokens": MAX_TOKENS,
            "learning_rate": 1e-4, "beta": 0.04, "temperature": TEMPERATURE,
            "top_p": 1.0, "max_off_policy_steps": 1,
            "prompts_path": prompts_path,
            "reward": {"type": "contains", "text": "the"},
            "base_model": {"train_job": train_id, "spec": dict(SPEC)},
            "checkpoint_every": args.iterations, "seed": 1}
        status, job = http(base, "POST", "/v1/rl/jobs", experiment)
        if status != 202:
            die("RL job refused: %s %s" % (status, job))
        rl_id = job.get("job_id") or job.get("id")
        per_iteration = {}
        last = None
        t0 = time.time()
        while True:
            if time.time() > deadline:
                die("the RL job did not end in the budget (last %s)" %
                    (last or {}).get("rl"))
            if any(p.poll() is not None for p in procs):
                die("a pcp process exited during the RL job (logs in %s)"
                    % work)
            status, last = http(base, "GET", "/v1/jobs/%s" % rl_id)
            rl = last.get("rl") or {}
            i = rl.get("iteration")
            if i and i not in per_iteration and \
                    rl.get("tokens_per_second") is not None:
                per_iteration[i] = dict(rl)
                log("rl iteration %d: %.1f rollout tok/s, reward %.3f, "
                    "weight refresh %s s for %s bytes" % (
                        i, rl["tokens_per_second"],
                        rl.get("reward_mean") or 0.0,
                        rl.get("weight_refresh_seconds"),
                        rl.get("weight_refresh_bytes")))
            if last.get("state") in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.05)
        if last["state"] != "succeeded":
            die("RL job %s %s: %s (logs in %s)" % (
                rl_id, last["state"], last.get("error"), work))
        log("rl job %s: %d iterations in %.0f s" % (rl_id, args.iterations,
                                                     time.time() - t0))
        # The baseline again after the job (the base model is still
        # served): the machine's load drifts, so both sides are bracketed.
        for r in range(ROUNDS):
            tokens, seconds = decode_round(base, name, batch, 5000 + 100 * r)
            rates.append(tokens / seconds)
            log("decode round %d (after the job): %d tokens in %.2f s, "
                "%.1f tok/s" % (ROUNDS + r + 1, tokens, seconds,
                                tokens / seconds))
        decode_rate = statistics.median(rates)
        rl = last.get("rl") or {}
        if not per_iteration and rl.get("tokens_per_second") is not None:
            per_iteration[rl.get("iteration") or 1] = dict(rl)
        if not per_iteration:
            die("the RL job published no tokens_per_second")
        later = [v["tokens_per_second"] for k, v in per_iteration.items()
                 if k > 1] or [v["tokens_per_second"]
                               for v in per_iteration.values()]
        rollout_rate = statistics.median(later)

        # c. Weight refresh.
        # The first iteration's refresh includes the policy's first load
        # and compile on the workers: left out like its tokens/s.
        refreshes = [(v["weight_refresh_seconds"],
                      v.get("weight_refresh_bytes"))
                     for k, v in per_iteration.items()
                     if k > 1 and v.get("weight_refresh_seconds") is not None]
        first_refresh = per_iteration.get(1, {}).get("weight_refresh_seconds")
        ok = True
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        elif not ok:
            print("rl: logs in %s" % work, file=sys.stderr)

    print("decode (inference engine, same model, 2 workers, %d requests at "
          "once, %d tokens each): %.1f tok/s (median of %d rounds before "
          "and %d after the job: %s)" % (
              NUM_PROMPTS * GROUP_SIZE, MAX_TOKENS, decode_rate, ROUNDS,
              ROUNDS,
              ", ".join("%.1f" % r for r in rates)))
    print("rl rollouts (%d prompts x %d, %d tokens max): %.1f tok/s (median "
          "of iterations %s; per iteration: %s)" % (
              NUM_PROMPTS, GROUP_SIZE, MAX_TOKENS, rollout_rate,
              ",".join(str(k) for k in sorted(per_iteration) if k > 1) or
              "all", ", ".join("%d: %.1f" % (
                  k, per_iteration[k]["tokens_per_second"])
                  for k in sorted(per_iteration))))
    if refreshes:
        secs = statistics.median(s for s, _ in refreshes)
        nbytes = max(b or 0 for _, b in refreshes)
        wire = nbytes / bandwidth
        print("weight refresh: %.3f s for %d bytes (median of iterations "
              "2..; the first, with the policy's load and compile, %s s); "
              "bytes / loopback bandwidth (%.0f MiB/s) = %.4f s; refresh is "
              "%.1fx the wire time" % (
                  secs, nbytes,
                  "%.3f" % first_refresh if first_refresh is not None
                  else "-", bandwidth / (1 << 20), wire,
                  secs / wire if wire > 0 else float("inf")))
    else:
        print("weight refresh: the job published no weight_refresh_seconds "
              "after its first iteration")
    ratio = rollout_rate / decode_rate
    met = ratio >= RATIO_GOAL
    print("rl goal rollout tok/s / decode tok/s >= %.1f (%.3f): %s" %
          (RATIO_GOAL, ratio, "met" if met else "MISSED"))
    print("rl ratio=%.3f" % ratio, flush=True)
    check = os.environ.get("PCP_BENCH_CHECK", "")
    if not met and check not in ("", "0"):
        sys.exit(1)


if __name__ == "__main__":
    main()
