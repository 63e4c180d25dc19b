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

Checkpoints and resume (issue 5 item 5): run B, the same experiment for
B_ROUNDS rounds with checkpoints every 2 syncs, has its gateway SIGKILLed
after sync KILL_AFTER and restarted; it resumes from its newest indexed
checkpoint (worker state uploaded back into fresh sessions) and its per-sync
losses equal run A's bit for bit. Run C ("resume": true on B's
checkpoint_dir, one more round) continues with run A's losses. A classic job
on that checkpoint, a streaming job with another H and a corrupted worker
state file fail with a clear error.
"""
import json
import os
import re
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
STREAMING = {"num_fragments": 2, "inner_steps": 10, "overlap_tau": 1,
             "alpha": 0.5}
# Run B: the same experiment for B_ROUNDS rounds (2 * B_ROUNDS syncs; the
# schedule of the first rounds does not depend on max_epochs: a fragment's
# send at phase + (r+1)H and its receive tau later exist for every
# r < max_epochs), checkpoints every 2 syncs, the gateway SIGKILLed once
# sync KILL_AFTER is reported.
B_ROUNDS = 4
KILL_AFTER = 5


def checkpoints_of(job_id):
    """[(sync, path)] of the job's "checkpoint" events (the store index)."""
    out = []
    for e in te.events(job_id):
        if e["type"] == "checkpoint":
            path = e["payload"]["path"]
            out.append((int(path.rsplit("step-", 1)[1].split(".")[0]), path))
    return out


def resume_runs(work, gw, a_steps, n):
    """Run B (resumed after a gateway SIGKILL) and run C ("resume": true on
    B's checkpoint_dir) repeat run A's losses bit for bit; checkpoints of
    the wrong kind or schedule, and a corrupted worker state file, fail
    the job with a clear error."""
    ckpt_b = os.path.join(work, "state", "ckpt-b")
    t0 = time.time()
    b = te.submit(te.experiment(max_epochs=B_ROUNDS, checkpoint_every=2,
                                checkpoint_dir=ckpt_b, streaming=STREAMING))
    wait_for(lambda: KILL_AFTER in te.steps_of(b), 300,
             "run B reached sync %d" % KILL_AFTER)
    killed_at = max(te.steps_of(b))
    gw.proc.kill()
    gw.proc.wait()
    gw.start()
    te.wait_done(b, 600)
    wall = time.time() - t0
    check(te.state_of(b) == "succeeded",
          "run B succeeded after a gateway SIGKILL: %s" % te.state_of(b))
    b_events = [e["payload"] for e in te.events(b)
                if e["type"] == "training.step"]
    b_syncs = [p["outer_step"] for p in b_events]
    bs = te.steps_of(b)
    same = [(k, bs.get(k, {}).get("loss"), a_steps[k]["loss"])
            for k in range(1, 2 * B_ROUNDS + 1)]
    print("run B: %.1f s, killed after sync %d, syncs reported %s" % (
        wall, killed_at, b_syncs))
    check(all(x[1] is not None and x[1] == x[2] for x in same),
          "run B (resumed) repeats run A's per-sync losses bit for bit: %s"
          % same)
    # The restarted gateway resumed from a checkpoint written before the
    # kill (the log says where) and redid the syncs after it (reported
    # twice), at the same local steps.
    with open(os.path.join(work, "gw%d.err" % gw.starts)) as f:
        m = re.search(r"streaming resumed at step (\d+) sync (\d+)", f.read())
    at = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    redone = sorted(k for k in set(b_syncs) if b_syncs.count(k) > 1)
    check(m and at[1] in (2, 4, 6) and at[1] <= killed_at and
          at[0] == a_steps[at[1]]["local_step"] + 1 and
          all(k > at[1] for k in redone) and
          (at[1] == killed_at or at[1] + 1 in redone),
          "resumed after the checkpoint of sync %d at step %d, before the "
          "kill (sync %d); syncs redone: %s" % (at[1], at[0], killed_at,
                                                 redone))
    check(all(bs[k]["local_step"] == a_steps[k]["local_step"] for k in bs),
          "same local step per sync as run A")
    ckpts = checkpoints_of(b)
    check([k for k, _ in ckpts] == list(range(2, 2 * B_ROUNDS + 1, 2)),
          "checkpoints indexed every 2 syncs and at the end: %s" % ckpts)
    state = os.path.join(work, "state")
    for k, path in ckpts:
        side = os.path.join(state, os.path.dirname(path),
                            "stream-%020d.workers" % k)
        check(os.path.exists(side) and os.path.getsize(side) == 2 * 4 * n * 4,
              "sync %d: worker state file of 2 workers x 4 x %d f32 beside "
              "its checkpoint" % (k, n))

    # Run C: "resume": true on B's checkpoint_dir, one more round: syncs
    # 2*B_ROUNDS+1.. equal run A's.
    c = te.submit(te.experiment(max_epochs=B_ROUNDS + 1, resume=True,
                                checkpoint_dir=ckpt_b, streaming=STREAMING))
    te.wait_done(c, 300)
    cs = te.steps_of(c)
    want = [2 * B_ROUNDS + 1, 2 * B_ROUNDS + 2]
    check(te.state_of(c) == "succeeded" and sorted(cs) == want and
          all(cs[k]["loss"] == a_steps[k]["loss"] for k in want),
          "resume: true continues at sync %d with run A's losses: %s" % (
              want[0], {k: (p["loss"], a_steps[k]["loss"])
                        for k, p in cs.items()}))

    # Wrong kind, wrong schedule, corrupted worker state: clear failures.
    def fails(exp, words, what):
        job = te.submit(exp)
        te.wait_done(job, 120)
        s, r = request("GET", "/v1/training/jobs/%s" % job)
        err = r.get("error", "")
        check(r.get("state") == "failed" and all(w in err for w in words),
              "%s fails naming %s: %s" % (what, words, r.get("error")))
    fails(te.experiment(outer_loop_steps=12, resume=True,
                        checkpoint_dir=ckpt_b),
          ["streaming DiLoCo run", "classic"],
          "a classic job on a streaming checkpoint")
    fails(te.experiment(max_epochs=B_ROUNDS + 1, resume=True,
                        checkpoint_dir=ckpt_b,
                        streaming=dict(STREAMING, inner_steps=5)),
          ["H=10", "H=5"], "a streaming job with another H")
    bad = os.path.join(work, "state", "ckpt-bad")
    shutil.copytree(ckpt_b, bad)
    for name in os.listdir(bad):
        if name.endswith(".workers"):
            with open(os.path.join(bad, name), "r+b") as f:
                f.seek(1000)
                f.write(b"\x7f\x7f\x7f\x7f")
    fails(te.experiment(max_epochs=B_ROUNDS + 1, resume=True,
                        checkpoint_dir=bad, streaming=STREAMING),
          ["does not match its checkpoint", "SHA-256"],
          "a corrupted worker state file")


def goodput_check(job, steps, elements, n):
    """Streaming goodput counters (docs/training.md "Goodput") against the
    schedule, two workers and no loss: a worker's delta of fragment p sent
    at step t holds its steps since p's last receive (before that step's
    compute; step 1 before any), each token's share of it p's share of the
    parameters (|elements| per fragment, of |n|); the steps between a send
    and its receive are blended away. The last event is the last receive,
    at max_steps before its compute."""
    P, H = STREAMING["num_fragments"], STREAMING["inner_steps"]
    tau, R = STREAMING["overlap_tau"], ROUNDS
    m = te.experiment()["model"]
    bt = m["batch"] * m["block_size"]
    phase = [p * H // P for p in range(P)]
    max_steps = R * H + phase[P - 1] + tau
    first = [1] * P
    merged = 0.0
    for t in range(1, max_steps + 1):
        for p in range(P):
            k = t - phase[p] - tau
            if k > 0 and k % H == 0 and k // H - 1 < R:
                first[p] = t
        for p in range(P):
            k = t - phase[p]
            if k > 0 and k % H == 0 and k // H - 1 < R:
                merged += 2 * (t - first[p] + 1) * bt * elements[p] / n
    computed = 2 * (max_steps - 1) * bt
    t = job.get("training", {})
    last = steps[max(steps)]
    print("streaming goodput: %s (tokens merged %s, computed %s; schedule: "
          "%.0f / %d)" % (t.get("goodput"), t.get("tokens_merged"),
                          t.get("tokens_computed"), merged, computed))
    check(t.get("tokens_computed") == computed == last.get("tokens_computed")
          and abs(t.get("tokens_merged", 0) - merged) <= 1 and
          t.get("tokens_merged") == last.get("tokens_merged") and
          abs(t.get("goodput", 0) - merged / computed) < 1e-9,
          "streaming tokens computed %s == 2 x %d steps x B x T = %d, "
          "merged %s == %.1f by the schedule" % (
              t.get("tokens_computed"), max_steps - 1, computed,
              t.get("tokens_merged"), merged))


def main():
    work = tempfile.mkdtemp(prefix="pcp-stream-")
    gw = nm = None
    try:
        gw, nm = te.start_cluster(work)
        if gt.FAILURES:
            return 1
        exp = te.experiment(
            max_epochs=ROUNDS,
            streaming=STREAMING)
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
        if len(frag) == 2:
            goodput_check(r, steps, {f: b // 8 for f, b in frag.items()}, n)
        meta_path = os.path.join(work, "state", "models", job, "model.json")
        with open(meta_path) as f:
            meta = json.load(f)
        check(meta["outer_step"] == 2 * ROUNDS, "masters exported: %s" % {
            k: v for k, v in meta.items() if k != "tokenizer"})
        resume_runs(work, gw, steps, n)
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
