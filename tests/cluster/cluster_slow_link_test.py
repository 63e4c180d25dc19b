#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Training over 10 Mbit/s links with 1 s heartbeats (issue 17 Deliver 5;
docs/cluster.md "Slow links and the fabric's heartbeat").

The fabric evicts a peer that sent nothing for 3 heartbeat periods. One
outer step's task inputs for a worker take longer than that to cross a
10 Mbit/s link, and the gateway's heartbeats queue behind them on the same
connection. Before liveness counted bytes (not only whole frames) each
worker dropped every 3 s, rejoined, and the job repeated outer step 1
forever. This runs cluster_pcp_training's job (the char GPT, 3 outer steps
of tau 10; no held-out evaluation) with two workers behind 10 Mbit/s tbf links and the gateway's
heartbeat_ms 1000, and checks that:
- the job succeeds with outer steps 1..3 reported;
- each worker joined once and was never evicted (no reconnect loop);
- the bytes to each worker took more than 3 heartbeats of link time per
  outer step on average (the test exercises the problem, it does not dodge
  it), and they crossed the tbf qdiscs.

It gives up early when a worker has joined 4 times (the reconnect loop).
Usage: cluster_slow_link_test.py PCP_BINARY. Needs root (see
cluster_test.py; PCP_CLUSTER_OPTIONAL=1: exit 3 where namespaces are not
allowed).
"""
import os
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "cluster"))
import pcp_cluster  # noqa: E402

PCP = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                      os.environ["PCP_BINARY"])
DATA = os.path.join(ROOT, "data", "tiny_shakespeare.txt")
STEPS = 3
RATE_BITS = 10_000_000
HEARTBEAT_MS = 1000
WAIT_S = 165
FAILURES = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def experiment():
    # cluster_pcp_training's job without the held-out evaluation at the end
    # (eval_fraction 0): that one sends one worker its program and the
    # parameters over the same 10 Mbit/s link again, which costs a minute
    # on a loaded machine and exercises nothing the outer steps do not.
    return {"name": "cluster-slow-link", "eval_fraction": 0,
            "model": {"kind": "gpt", "layers": 2, "heads": 4, "width": 192,
                      "vocab": 65, "block_size": 64, "batch": 16},
            "data_path": DATA, "tokenizer": "char", "sampling": "random",
            "learning_rate": 0.003, "tau": 10, "outer_loop_steps": STEPS,
            "nesterov_momentum": 0.0, "outer_learning_rate": 1.0,
            "checkpoint_every": STEPS, "seed": 1}


def run(pc):
    t0 = time.time()
    s, r = pc.request("POST", "/v1/training/jobs", experiment())
    if not check(s == 202, "training job accepted: %s %s" % (s, r)):
        return
    job = r["job_id"]
    stuck = []

    def finished():
        s, r = pc.request("GET", "/v1/training/jobs/" + job)
        if s == 200 and r.get("state") in ("succeeded", "failed",
                                           "cancelled"):
            return True
        joins = [w.get("join_count", 0) for w in pc.workers()]
        if joins and max(joins) >= 4:
            stuck.append(joins)
            return True
        return False
    done = pc.wait_for(finished, WAIT_S, period=1.0)
    wall = time.time() - t0
    s, r = pc.request("GET", "/v1/training/jobs/" + job)
    check(done and not stuck and r.get("state") == "succeeded",
          "the job succeeded over 10 Mbit/s links with %d ms heartbeats "
          "(%.1f s): %s %s%s" % (
              HEARTBEAT_MS, wall, r.get("state"), r.get("error", ""),
              "; stuck in a reconnect loop, joins %s" % stuck[0]
              if stuck else ""))
    s, ev = pc.request("GET", "/v1/jobs/%s/events" % job)
    steps = {e["payload"]["outer_step"]: e["payload"]
             for e in (ev or {}).get("events", [])
             if e["type"] == "training.step"}
    check(sorted(steps) == list(range(1, STEPS + 1)),
          "outer steps 1..%d reported: %s" % (STEPS, sorted(steps)))
    print("  losses: %s; seconds per step: %s" % (
        [round(p["loss"], 4) for _, p in sorted(steps.items())],
        [round(p.get("seconds", 0), 2) for _, p in sorted(steps.items())]),
        flush=True)
    workers = pc.workers()
    check(len(workers) == 2, "two workers: %d" % len(workers))
    link_bytes_per_s = RATE_BITS / 8
    for wk in workers:
        print("  %s: join_count %s, eviction_count %s, bytes_from_worker %d, "
              "bytes_to_worker %d" % (
                  wk["worker_id"], wk.get("join_count"),
                  wk.get("eviction_count"), wk["bytes_from_worker"],
                  wk["bytes_to_worker"]), flush=True)
        check(wk.get("join_count") == 1 and wk.get("eviction_count") == 0,
              "worker %s joined once and was never evicted" %
              wk["worker_id"])
        # Per outer step the gateway sends each worker at least the global
        # parameters (plus programs once): more than 3H of link time.
        per_step_s = wk["bytes_to_worker"] / STEPS / link_bytes_per_s
        check(per_step_s > 3 * HEARTBEAT_MS / 1000,
              "worker %s: its bytes take %.1f s of link time per outer "
              "step on average, more than 3 heartbeats (%.1f s)" % (
                  wk["worker_id"], per_step_s, 3 * HEARTBEAT_MS / 1000))
    links = [pc.link_bytes(i) for i in (1, 2)]
    down = sum(x[1] for x in links)
    recv = sum(wk["bytes_to_worker"] for wk in workers)
    print("  tbf downlinks sent %d B (fabric's bytes to workers %d)" % (
        down, recv), flush=True)
    check(recv and down >= recv,
          "the fabric's bytes crossed the 10 Mbit/s tbf qdiscs")


def main():
    return pcp_cluster.run_test(
        "cluster_slow_link_test", PCP, DATA, run, check, FAILURES,
        worker_hosts=2, rate="10mbit",
        heartbeat_ms=HEARTBEAT_MS)


if __name__ == "__main__":
    sys.exit(main())
