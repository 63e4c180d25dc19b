#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A real PCP training run inside a tools/cluster cluster (issue 17
Deliver 5): `pcp --gateway` in host h0, a `pcp --node-manager --scale 1`
with one CPU worker in each of h1 and h2, the workers behind 100 Mbit/s tbf
links, everything listening on the cluster's private addresses only.

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
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "cluster"))
import cluster  # noqa: E402

PCP = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                      os.environ["PCP_BINARY"])
DATA = os.path.join(ROOT, "data", "tiny_shakespeare.txt")
TOKEN, JOIN = "cluster-api-token", "cluster-join-token"
API_PORT, FABRIC_PORT = 8000, 8080
STEPS = 3
FAILURES = []
BASE = None


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def request(method, path, body=None, timeout=30):
    """The gateway's API; call inside `with c.inside(0)`."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        BASE + path, data=data, method=method,
        headers={"Authorization": "Bearer " + TOKEN,
                 "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
    except (OSError, ValueError) as e:
        return None, str(e)


def wait_for(pred, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    check(False, "timed out: " + what)
    return None


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


def tc_sent(c, ns_args):
    """Bytes a tbf qdisc sent (`tc -s qdisc show`), 0 when not found."""
    r = subprocess.run(["tc", "-s"] + ns_args, capture_output=True,
                       text=True, timeout=30)
    m = re.search(r"qdisc tbf .*?Sent (\d+) bytes", r.stdout, re.S)
    return int(m.group(1)) if m else 0


def listeners(c, i):
    """Local addresses of the TCP listeners in host i."""
    r = c.run(i, ["ss", "-Hltn"], capture_output=True, text=True)
    return [line.split()[3] for line in r.stdout.splitlines() if line]


def run(c, work):
    global BASE
    gw_addr = c.addr(0)
    BASE = "http://%s:%d" % (gw_addr, API_PORT)
    config = os.path.join(work, "gateway.json")
    roots = [os.path.join(ROOT, "data"), work]
    with open(config, "w") as f:
        json.dump({"gateway_id": "gw-cluster", "lab_id": "lab",
                   "state_dir": os.path.join(work, "state"),
                   "api": {"token_env": "GW_TEST_TOKEN"},
                   "worker_fabric": {"host": gw_addr, "port": FABRIC_PORT,
                                     "join_token_env": "GW_TEST_JOIN",
                                     "heartbeat_ms": 1000},
                   "data_roots": roots, "model_roots": roots}, f)
    env = dict(os.environ, GW_TEST_TOKEN=TOKEN, GW_TEST_JOIN=JOIN,
               PCP_WORKER_JOIN_TOKEN=JOIN)
    c.spawn(0, [PCP, "--gateway", "--gateway-config", config, "--api-host",
                gw_addr, "--api-port", str(API_PORT)], env=env,
            stderr=open(os.path.join(work, "gw.err"), "w"))
    with c.inside(0):
        if not wait_for(lambda: request("GET", "/healthz")[0] == 200, 60,
                        "gateway /healthz on %s" % BASE):
            return
    for i in (1, 2):
        c.spawn(i, [PCP, "--node-manager", "--scale", "1", "--host", gw_addr,
                    "--port", str(FABRIC_PORT), "--backend", "cpu",
                    "--api-host", c.addr(i), "--api-port", "0"], env=env,
                stderr=open(os.path.join(work, "nm%d.err" % i), "w"))
    with c.inside(0):
        if not wait_for(lambda: (request("GET", "/v1/workers")[1] or {}).get(
                "counts", {}).get("connected") == 2, 90,
                "two workers joined from h1 and h2"):
            return
        for i in range(3):
            got = listeners(c, i)
            check(got and all(a.rsplit(":", 1)[0] in (c.addr(i), "127.0.0.1")
                              for a in got),
                  "h%d listens only on its private address: %s" % (i, got))
        t0 = time.time()
        s, r = request("POST", "/v1/training/jobs", experiment())
        if not check(s == 202, "training job accepted: %s %s" % (s, r)):
            return
        job = r["job_id"]
        done = wait_for(lambda: request(
            "GET", "/v1/training/jobs/" + job)[1].get("state") in (
                "succeeded", "failed", "cancelled"), 150, "job finished")
        wall = time.time() - t0
        s, r = request("GET", "/v1/training/jobs/" + job)
        check(done and r.get("state") == "succeeded",
              "the job succeeded in the cluster (%.1f s): %s %s" % (
                  wall, r.get("state"), r.get("error", "")))
        s, ev = request("GET", "/v1/jobs/%s/events" % job)
        steps = {e["payload"]["outer_step"]: e["payload"]
                 for e in (ev or {}).get("events", [])
                 if e["type"] == "training.step"}
        check(sorted(steps) == list(range(1, STEPS + 1)),
              "outer steps 1..%d reported: %s" % (STEPS, sorted(steps)))
        print("  losses: %s; seconds per step: %s" % (
            [round(p["loss"], 3) for _, p in sorted(steps.items())],
            [round(p.get("seconds", 0), 2) for _, p in sorted(steps.items())]))
        n = (r.get("training") or {}).get("parameter_count", 0)
        s, w = request("GET", "/v1/workers")
        workers = (w or {}).get("workers", [])
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
    up = sum(tc_sent(c, ["-n", c.ns(i), "qdisc", "show", "dev", "eth0"])
             for i in (1, 2))
    down = sum(tc_sent(c, ["-n", c.hub, "qdisc", "show", "dev", "p%d" % i])
               for i in (1, 2))
    sent = sum(wk["bytes_from_worker"] for wk in workers)
    recv = sum(wk["bytes_to_worker"] for wk in workers)
    print("  tbf: uplinks sent %d B (workers' bytes %d), downlinks %d B "
          "(%d)" % (up, sent, down, recv))
    check(up >= sent and down >= recv and sent and recv,
          "the fabric's bytes crossed the 100 Mbit/s tbf qdiscs both ways")


def main():
    cluster.require_or_exit("cluster_pcp_test")
    cluster.cleanup_stale(log=print)
    if not os.path.exists(DATA):
        check(False, "no %s" % DATA)
        return 1
    work = tempfile.mkdtemp(prefix="pcp-cluster-")
    t0 = time.time()
    with cluster.Cluster(hosts=3, rates=[None, "100mbit", "100mbit"],
                         log=print) as c:
        tag = c.tag
        run(c, work)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True,
                          text=True).stdout
    check("pcp-%s-" % tag not in left, "no namespace of %s left" % tag)
    print("cluster_pcp_test: %.1f s, %d failures" % (time.time() - t0,
                                                    len(FAILURES)))
    if FAILURES:
        print("logs in %s" % work, file=sys.stderr)
        for name in sorted(os.listdir(work)):
            if name.endswith(".err"):
                with open(os.path.join(work, name)) as f:
                    print("--- %s (tail)\n%s" % (name, f.read()[-1500:]),
                          file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
