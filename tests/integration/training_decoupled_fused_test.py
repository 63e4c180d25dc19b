#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Decoupled DiLoCo with K local steps per learner task
(`decoupled_diloco.steps_per_task`, docs/training.md "Steps per task"):
a real gateway and node managers with CPU workers on 127.0.0.1, the
smallest char GPT.

- A bad steps_per_task (0, 65, 2.5) is refused with 400 naming the key.
- One learner, the same seed and data, steps_per_task 1 and then 4: the
  same syncs, per-sync losses and exported weights within 1e-5 (the same
  math; the fused program is another IREE compile of an unrolled loop, so
  bit equality is reported, not required), and the K=4 job sent far fewer
  step tasks (the training.decoupled summary's step_tasks) and fewer
  bytes on the fabric (GET /v1/workers, the difference over each job).
- Three learners with steps_per_task 4: every scheduled syncer step merges
  all three, every @mix hash verifies, goodput is reported and the step
  tasks are well under one per local step.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway_test as gt  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, request, wait_for  # noqa: E402

STEPS = 32
MODEL = {"kind": "gpt", "layers": 1, "heads": 2, "kv_heads": 2,
         "width": 64, "vocab": 65, "block_size": 32, "batch": 8}
# Fragment syncs at syncer steps s % 16 in {0, 1} (1, 16, 17, 32): long
# boundary-free stretches between them for K = 4.
DECOUPLED = {"num_fragments": 2, "sync_interval_h": 16, "overlap_tau": 1,
             "min_quorum": 1, "grace_window_ms": 0,
             "merge_strategy": "weighted_average",
             "fragment_strategy": "balanced_tensor", "learner_alpha": 0.0,
             "outer_learning_rate": 1.0,
             # Rounds at 1, 16, 17, 32 only (the task counts below): the
             # final round at 33 is training_decoupled_final_sync_test's.
             "final_sync": False}
# Same math, another compile (the K-step program unrolls K steps): IREE
# may fuse or order the f32 reductions differently, so allow a few ulps of
# drift through 32 AdamW steps, far below any real difference (one step's
# update is ~lr = 3e-3 per weight).
TOLERANCE = 1e-5


def experiment(k, **keys):
    return te.experiment(
        model=MODEL, learning_rate=0.003, nesterov_momentum=0.0,
        outer_learning_rate=1.0, outer_loop_steps=STEPS,
        aggregation_strategy="decoupled_diloco",
        decoupled_diloco=dict(DECOUPLED, steps_per_task=k, **keys))


def node_manager(work, port, scale, name):
    return subprocess.Popen(
        [gt.PCP, "--node-manager", "--scale", str(scale), "--host",
         "127.0.0.1", "--port", str(port), "--backend", "cpu",
         "--api-port", "0", "--start-stagger-ms", "100"],
        env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN, POD_NAME=name),
        stderr=open(os.path.join(work, name + ".err"), "w"))


def connected():
    s, r = request("GET", "/v1/workers")
    return [w for w in r.get("workers", [])
            if w.get("state") == "connected"] if s == 200 else []


def fabric_bytes():
    """worker_id -> bytes_to_worker + bytes_from_worker."""
    return {w["worker_id"]: w["bytes_to_worker"] + w["bytes_from_worker"]
            for w in connected()}


def summary_of(job):
    for e in te.events(job):
        if e["type"] == "training.decoupled":
            return e["payload"]
    return {}


def run(body):
    before = fabric_bytes()
    job = te.submit(body)
    if not job:
        return None
    te.wait_done(job, 600)
    s, r = request("GET", "/v1/training/jobs/%s" % job)
    check(r.get("state") == "succeeded", "job %s succeeded: %s" % (
        job, r.get("error", r.get("state"))))
    after = fabric_bytes()
    moved = {w: after[w] - before.get(w, 0) for w in after}
    return {"job": job, "steps": te.steps_of(job), "summary": summary_of(job),
            "bytes": moved}


def weights(work, job):
    """{tensor name: list of floats} of the exported model.safetensors."""
    path = os.path.join(work, "state", "models", job, "model.safetensors")
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack_from("<Q", data, 0)[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        check(meta["dtype"] == "F32", "f32 tensor %s" % name)
        a, b = meta["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        out[name] = struct.unpack("<%df" % (len(raw) // 4), raw)
    return out


def refusals():
    for bad in (0, 65, 2.5, "4"):
        s, r = request("POST", "/v1/training/jobs", experiment(bad))
        check(s == 400 and "decoupled_diloco: key 'steps_per_task'" in
              r.get("error", {}).get("message", json.dumps(r)),
              "steps_per_task %r refused with 400 naming the key: %s %s" % (
                  bad, s, r))
    s, r = request("POST", "/v1/training/jobs", experiment(1, step_per_task=4))
    check(s == 400 and "decoupled_diloco.step_per_task" in json.dumps(r),
          "an unknown decoupled key refused with 400 naming it: %s %s" % (
              s, r))


def one_learner(work):
    # The first job ships the programs (both @train_steps, the fragment
    # modules) to the worker, which keeps them: the measured jobs' fabric
    # bytes are the training's only.
    if not run(experiment(4)):
        return
    runs = {k: run(experiment(k)) for k in (1, 4)}
    if not all(runs.values()):
        return
    one, four = runs[1], runs[4]
    for k, r in sorted(runs.items()):
        per_worker = sorted(r["bytes"].values())
        print("one learner, steps_per_task %d: %s step tasks, fabric bytes "
              "per worker %s, loss %s" % (
                  k, r["summary"].get("step_tasks"), per_worker,
                  r["summary"].get("loss")))
    syncs = sorted(one["steps"])
    check(syncs == sorted(four["steps"]) and
          [p["syncer_step"] for _, p in sorted(one["steps"].items())] ==
          [1, 16, 17, 32],
          "the same syncs at syncer steps 1, 16, 17, 32: %s %s" % (
              sorted(one["steps"]), sorted(four["steps"])))
    diffs = [abs(one["steps"][s]["loss"] - four["steps"][s]["loss"])
             for s in syncs if s in four["steps"]]
    print("per-sync losses K=1 %s K=4 %s" % (
        [one["steps"][s]["loss"] for s in syncs],
        [four["steps"].get(s, {}).get("loss") for s in syncs]))
    check(diffs and max(diffs) <= TOLERANCE,
          "per-sync losses agree within %g: %s" % (TOLERANCE, diffs))
    w1, w4 = weights(work, one["job"]), weights(work, four["job"])
    check(sorted(w1) == sorted(w4) and w1, "the same exported tensors")
    worst, equal = 0.0, True
    for name in w1:
        for a, b in zip(w1[name], w4.get(name, ())):
            worst = max(worst, abs(a - b))
            equal = equal and a == b
    print("exported weights: max |K=1 - K=4| = %g (bit-identical: %s)" % (
        worst, equal))
    check(worst <= TOLERANCE,
          "exported weights agree within %g (max diff %g)" % (
              TOLERANCE, worst))
    t1 = one["summary"].get("step_tasks", 0)
    t4 = four["summary"].get("step_tasks", 0)
    # K = 1: one task per local step (32). K = 4: nothing may be due after
    # a task's inner steps: syncs at 1, 16, 17, 32, blends due by 2, 17,
    # 18, 33, and the overlap budget (step <= next open round + 1) cuts
    # 15: tasks 1, 2, 3-6, 7-10, 11-14, 15, 16, 17, 18, 19-22, 23-26,
    # 27-30, 31, 32 (31-34 would pass the last step): 14.
    check(t1 == STEPS and t4 == 14,
          "step tasks: %s at K=1 (want %d), %s at K=4 (want 14)" % (
              t1, STEPS, t4))
    check(one["summary"].get("tokens_computed") ==
          four["summary"].get("tokens_computed"),
          "the same tokens computed")
    b1, b4 = sum(one["bytes"].values()), sum(four["bytes"].values())
    check(0 < b4 < b1, "fewer fabric bytes at K=4: %d < %d" % (b4, b1))


def three_learners(work, port, extra):
    extra.append(node_manager(work, port, 2, "nm-more"))
    if not wait_for(lambda: len(connected()) == 3, 90,
                    "three workers joined"):
        return
    r = run(experiment(4, min_quorum=3, grace_window_ms=5000))
    if not r:
        return
    s = r["summary"]
    print("three learners, steps_per_task 4: %s step tasks, goodput %s, "
          "fabric bytes per worker %s, syncs %s" % (
              s.get("step_tasks"), s.get("goodput"),
              sorted(r["bytes"].values()), sorted(r["steps"])))
    check(all(sorted(p["participants"]) == [1, 2, 3] and not p["skipped"]
              for p in r["steps"].values()) and len(r["steps"]) == 4,
          "every round merged all three learners")
    ph = s.get("param_hash") or {}
    check(ph.get("mismatches") == 0 and ph.get("verified_step") and
          len(ph.get("sha256") or "") == 64 and s.get("resyncs") == 0,
          "every @mix hash verified, no mismatch: %s" % ph)
    check(0 < s.get("goodput", 0) <= 1, "goodput reported: %s" %
          s.get("goodput"))
    # 14 per learner as with one (the boundaries are the schedule's);
    # a slack for timing.
    check(0 < s.get("step_tasks", 0) <= 3 * 16,
          "three learners at K=4: at most half a task per local step (%s)" %
          s.get("step_tasks"))


def main():
    work = tempfile.mkdtemp(prefix="pcp-decoupled-fused-")
    gw = None
    extra = []
    try:
        api_port, fabric_port = gt.free_port(), gt.free_port()
        gt.BASE = "http://127.0.0.1:%d" % api_port
        gw = gt.Gateway(work, api_port, fabric_port)
        te.relax_heartbeat(gw)
        gw.start()
        extra.append(node_manager(work, fabric_port, 1, "nm-one"))
        if wait_for(lambda: len(connected()) == 1, 90, "one worker joined"):
            refusals()
            one_learner(work)
            three_learners(work, fabric_port, extra)
    finally:
        for proc in extra:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        te.stop_all(None, gw)
    if gt.FAILURES:
        print("training_decoupled_fused_test: %d failures (logs in %s)" % (
            len(gt.FAILURES), work))
        return 1
    print("training_decoupled_fused_test: all passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
