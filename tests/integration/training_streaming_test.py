#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Streaming DiLoCo end to end (issue 5 item 4): a real gateway and a node
manager with two CPU workers; worker-resident state in fabric sessions (local
parameters, AdamW moments, fragment snapshots), one local step per task,
per-fragment @delta / @mix programs.

The same char GPT as training_e2e_test.py, P=2 fragments, H=10, overlap
tau=1, alpha=0.5: the loss falls into the classic run's band for the same
number of inner steps, every sync moves exactly fragment_elements x workers
x (4 + 4) bytes, and the masters are exported for the inference service.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway_test as gt  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, request, wait_for  # noqa: E402

ROUNDS = int(os.environ.get("PCP_STREAMING_ROUNDS", "30"))


def main():
    work = tempfile.mkdtemp(prefix="pcp-stream-")
    api_port, fabric_port = gt.free_port(), gt.free_port()
    gt.BASE = "http://127.0.0.1:%d" % api_port
    gw = gt.Gateway(work, api_port, fabric_port)
    te.relax_heartbeat(gw)
    nm = None
    try:
        gw.start()
        env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN)
        nm = subprocess.Popen(
            [gt.PCP, "--node-manager", "--scale", "2", "--host", "127.0.0.1",
             "--port", str(fabric_port), "--backend", "cpu", "--api-port",
             "0", "--start-stagger-ms", "100"],
            env=env, stderr=open(os.path.join(work, "nm.err"), "w"))
        if not wait_for(lambda: request("GET", "/v1/workers")[1]["counts"][
                "connected"] == 2, 60, "two workers joined"):
            return 1
        exp = te.experiment(
            max_epochs=ROUNDS,
            streaming={"num_fragments": 2, "inner_steps": 10,
                       "overlap_tau": 1, "alpha": 0.5})
        t0 = time.time()
        job = te.submit(exp)
        te.wait_done(job, 900)
        wall = time.time() - t0
        s, r = request("GET", "/v1/training/jobs/%s" % job)
        check(r.get("state") == "succeeded", "streaming job succeeded: %s" % r)
        steps = te.steps_of(job)
        losses = [steps[k]["loss"] for k in sorted(steps)]
        print("streaming: %d syncs, %.1f s, losses %s" % (
            len(steps), wall, " ".join("%.3f" % x for x in losses)))
        check(sorted(steps) == list(range(1, 2 * ROUNDS + 1)),
              "every fragment sync reported: %s" % sorted(steps))
        check(all(p.get("streaming") and p["fragment"] == (k - 1) % 2
                  for k, p in steps.items()),
              "fragments alternate 0, 1, 0, ...")
        tail = sum(losses[-4:]) / 4 if len(losses) >= 4 else 9
        check(losses and losses[0] > 3.0 and tail < 2.75,
              "loss falls into the classic band (last four %.3f)" % tail)
        # Wire bytes per sync: that fragment's elements x workers x (4 + 4):
        # the two fragments' sizes from the first two syncs, then every
        # later sync of a fragment moves the same bytes.
        # (Syncs during which a worker was lost mix two worker counts.)
        sizes = {}
        for k in sorted(steps):
            p = steps[k]
            if p["workers"] != 2 or p["workers_received"] != 2:
                continue
            sizes.setdefault(p["fragment"], set()).add(
                p["step_wire_bytes"] // 2)
        n = r["training"]["parameter_count"]
        frag = {f: next(iter(v)) for f, v in sizes.items() if len(v) == 1}
        check(len(frag) == 2 and sum(frag.values()) == n * 8,
              "per-sync bytes: fragment elements x (4 + 4), fragments "
              "summing to all %d parameters: %s" % (n, sizes))
        meta_path = os.path.join(work, "state", "models", job, "model.json")
        with open(meta_path) as f:
            meta = json.load(f)
        check(meta["outer_step"] == 2 * ROUNDS, "masters exported: %s" % {
            k: v for k, v in meta.items() if k != "tokenizer"})
    finally:
        te.stop_all(nm, gw)
    if gt.FAILURES:
        print("training_streaming_test: %d failures (logs in %s)" % (
            len(gt.FAILURES), work))
        return 1
    print("training_streaming_test: all passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
