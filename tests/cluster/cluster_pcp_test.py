#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A real PCP training run inside a tools/cluster cluster (issue 17
Deliver 5), through tools/cluster/pcp_cluster.py: `pcp --gateway` in host
h0, a `pcp --node-manager --scale 1` with one CPU worker in each of h1 and
h2, the workers behind 100 Mbit/s tbf links, every server on its host's
private address.

A short DiLoCo job (the char GPT of training_e2e_test.py, 3 outer steps of
tau 10) completes; GET /v1/workers shows both workers with non-zero byte
counters (bytes_from_worker / bytes_to_worker: what the gateway read from
and wrote to each worker's socket), each at least the f32 parameters and
deltas of the 3 outer steps; the workers' tbf qdiscs (uplink and downlink)
carried at least those bytes, so the fabric really crossed the shaped
links; no process of the cluster listens on a wildcard address; after the
run nothing of the cluster is left.

Usage: cluster_pcp_test.py PCP_BINARY. Needs root (see cluster_test.py;
PCP_CLUSTER_OPTIONAL=1: exit 3 where namespaces are not allowed).
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
FAILURES = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def experiment():
    # training_e2e_test.py's model (its compiled round program is likely in
    # the shared test artifact cache), 3 outer steps.
    return {"name": "cluster-char",
            "model": {"kind": "gpt", "layers": 2, "heads": 4, "width": 192,
                      "vocab": 65, "block_size": 64, "batch": 16},
            "data_path": DATA, "tokenizer": "char", "sampling": "random",
            "learning_rate": 0.003, "tau": 10, "outer_loop_steps": STEPS,
            "nesterov_momentum": 0.0, "outer_learning_rate": 1.0,
            "checkpoint_every": STEPS, "seed": 1}


def listeners(c, i):
    """Local addresses of the TCP listeners in host i."""
    r = c.run(i, ["ss", "-Hltn"], capture_output=True, text=True)
    return [line.split()[3] for line in r.stdout.splitlines() if line]


def run(pc):
    c = pc.cluster
    for i in range(3):
        got = listeners(c, i)
        check(got and all(a.rsplit(":", 1)[0] in (c.addr(i), "127.0.0.1")
                          for a in got),
              "h%d listens only on its private address: %s" % (i, got))
    t0 = time.time()
    s, r = pc.request("POST", "/v1/training/jobs", experiment())
    if not check(s == 202, "training job accepted: %s %s" % (s, r)):
        return
    job = r["job_id"]

    def state():
        s, r = pc.request("GET", "/v1/training/jobs/" + job)
        return r.get("state") if s == 200 else None
    done = pc.wait_for(lambda: state() in ("succeeded", "failed",
                                           "cancelled"), 150)
    wall = time.time() - t0
    s, r = pc.request("GET", "/v1/training/jobs/" + job)
    check(done and r.get("state") == "succeeded",
          "the job succeeded in the cluster (%.1f s): %s %s" % (
              wall, r.get("state"), r.get("error", "")))
    s, ev = pc.request("GET", "/v1/jobs/%s/events" % job)
    steps = {e["payload"]["outer_step"]: e["payload"]
             for e in (ev or {}).get("events", [])
             if e["type"] == "training.step"}
    check(sorted(steps) == list(range(1, STEPS + 1)),
          "outer steps 1..%d reported: %s" % (STEPS, sorted(steps)))
    print("  losses: %s; seconds per step: %s" % (
        [round(p["loss"], 3) for _, p in sorted(steps.items())],
        [round(p.get("seconds", 0), 2) for _, p in sorted(steps.items())]))
    n = (r.get("training") or {}).get("parameter_count", 0)
    workers = pc.workers()
    check(len(workers) == 2 and n > 0, "two workers, %d parameters" % n)
    floor = n * 4 * STEPS
    for wk in workers:
        print("  %s: bytes_from_worker %d, bytes_to_worker %d" % (
            wk["worker_id"], wk["bytes_from_worker"], wk["bytes_to_worker"]))
        check(wk["bytes_from_worker"] >= floor and
              wk["bytes_to_worker"] >= floor,
              "worker %s: byte counters non-zero and at least the f32 "
              "parameters x %d outer steps (%d)" % (
                  wk["worker_id"], STEPS, floor))
    # What the shaped links carried: the workers' uplinks (eth0 in h1, h2)
    # and downlinks (their bridge ports in the hub).
    links = [pc.link_bytes(i) for i in (1, 2)]
    up, down = sum(x[0] for x in links), sum(x[1] for x in links)
    sent = sum(wk["bytes_from_worker"] for wk in workers)
    recv = sum(wk["bytes_to_worker"] for wk in workers)
    print("  tbf: uplinks sent %d B (workers' bytes %d), downlinks %d B "
          "(%d)" % (up, sent, down, recv))
    check(up >= sent and down >= recv and sent and recv,
          "the fabric's bytes crossed the 100 Mbit/s tbf qdiscs both ways")


def main():
    return pcp_cluster.run_test(
        "cluster_pcp_test", PCP, DATA, run, check, FAILURES,
        worker_hosts=2, rate="100mbit")


if __name__ == "__main__":
    sys.exit(main())
