#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The synchronous data-parallel baseline end to end (issue 17 Deliver 4,
`aggregation_strategy: "ddp"`): a real gateway and a node manager with two
CPU workers on 127.0.0.1, the smallest char GPT, 60 inner steps reported
every tau = 10.

- An unknown aggregation_strategy, and ddp with a streaming block, are
  refused with 400 INVALID_ARGUMENT naming the key.
- The job succeeds with one training.step event per tau inner steps, both
  workers in each; the loss falls clearly from ln(vocab); val_loss is
  reported.
- Measured bytes (the fabric's counters, progress "bytes"): per worker and
  inner step within [1.0, 1.15] x (8 P + token bytes): the gradient up and
  the averaged gradient down, f32, plus its batch. A DDP that moved the
  parameters or the moments each step would fail the upper bound.
- Every reported step's parameter hashes agree (param_hash.verified_step is
  the step, no mismatch).
- The exported model (models/<job>/model.json at the last step) answers a
  completion through the inference service.
- A worker SIGKILLed mid-run: the job goes on with the other and succeeds.
- The averaging, against an independent model: a one-step job's loss is
  the mean of the two workers' losses computed by JAX
  (tests/models/jax_reference.py) on the batches the service sent
  (ddp_first_batches.npy) from the seeded initial parameters (`pcp model
  --init-dir`), and its exported parameters are NumPy's AdamW step (global
  norm clip 1, betas 0.9/0.999, eps 1e-8, weight decay 0.01) with the mean
  of the two JAX gradients, not with either worker's own.
- Bit identity enforced: a third worker C (its own node manager, with the
  worker's debug hook PCP_WORKER_TEST_CORRUPT_PARAM=2,5: its 2nd and 5th
  hashed tasks flip a bit of the parameters they hash) joins; C's id sorts
  first.
  With resync, the 3-worker job reports a training.param_hash_mismatch
  naming C at step 2, the reference is the hash the other two hold (the
  event's reference_worker is one of them, its policy "drop"), C is
  dropped and the job succeeds on two verified workers. With fail, C's
  5th hashed task (the next job's step 3) fails the job naming C against
  a reference worker (no "gateway's" hash: ddp keeps none).
"""
import json
import math
import os
import shutil
import sys
import signal
import struct
import subprocess
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "models"))
import gateway_test as gt  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, is_error, request  # noqa: E402

TAU = 10
OUTER = 6
MODEL = {"kind": "gpt", "layers": 1, "heads": 2, "kv_heads": 2,
         "width": 64, "vocab": 65, "block_size": 32, "batch": 8}


def experiment(**extra):
    e = te.experiment(name="ddp-char", model=MODEL, learning_rate=0.003,
                      tau=TAU, outer_loop_steps=OUTER, eval_every=3,
                      checkpoint_every=3, aggregation_strategy="ddp")
    e.update(extra)
    return e


def refusals():
    for extra, words in [
        ({"aggregation_strategy": "dpp"},
         ["aggregation_strategy", "'diloco'", "'decoupled_diloco'", "'ddp'"]),
        ({"streaming": {"num_fragments": 1, "inner_steps": TAU}},
         ["aggregation_strategy", "streaming"]),
    ]:
        resp = request("POST", "/v1/training/jobs", experiment(**extra))
        message = (resp[1].get("error", {}).get("message", "")
                   if isinstance(resp[1], dict) else "")
        check(is_error(resp, 400, "INVALID_ARGUMENT") and
              all(w in message for w in words),
              "400 naming %s: %s" % (words, resp))


def lost_worker(work):
    """A worker SIGKILLed mid-run: the step goes on with the other one's
    gradient (no hang), the job succeeds on one worker, and the survivor's
    hashes are still verified. The node manager restarts the killed worker;
    a worker that joins mid-run is not used."""
    # 10 inner steps take about 0.1 s here: 40 reported steps leave time to
    # kill a worker mid-run.
    job = te.submit(experiment(name="ddp-lost", outer_loop_steps=40,
                               eval_every=100, checkpoint_every=100))
    if not job:
        return
    gt.wait_for(lambda: 2 in te.steps_of(job), 120, "step 2 of the lost run")
    pids = te.worker_pids(os.path.join(work, "nm.err"))
    check(len(pids) >= 2, "worker pids known: %s" % pids)
    if pids:
        os.kill(pids[max(pids)], signal.SIGKILL)
    te.wait_done(job, 300)
    s, r = request("GET", "/v1/training/jobs/%s" % job)
    check(r.get("state") == "succeeded", "lost-worker job succeeded: %s" % (
        r.get("error", r.get("state"))))
    steps = te.steps_of(job)
    workers = [steps[k]["workers"] for k in sorted(steps)]
    print("lost run: workers per step %s, last loss %.3f" % (
        workers, steps[max(steps)]["loss"] if steps else float("nan")))
    check(sorted(steps) == list(range(1, 41)) and workers[0] == 2 and
          workers[-1] == 1,
          "the run went on with the surviving worker: %s" % workers)
    check(all(p["param_hash"]["verified_step"] == k and
              p["param_hash"]["mismatches"] == 0 for k, p in steps.items()),
          "the survivor's hashes verified")
    last = steps[max(steps)] if steps else {}
    check(0 < last.get("tokens_merged", 0) <= last.get("tokens_computed", 0)
          and 0.9 < last.get("goodput", 0) <= 1.0,
          "goodput with a lost worker: merged %s <= computed %s, goodput %s" % (
              last.get("tokens_merged"), last.get("tokens_computed"),
              last.get("goodput")))


def exported(work, job):
    path = os.path.join(work, "state", "models", job, "model.safetensors")
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return {name: np.frombuffer(raw[8 + n + info["data_offsets"][0]:
                                    8 + n + info["data_offsets"][1]],
                                np.float32).reshape(info["shape"])
            for name, info in header.items() if name != "__metadata__"}


def first_step(work):
    """One inner step on two workers, recomputed with JAX and NumPy."""
    import jax
    import jax.numpy as jnp
    import jax_reference as ref
    lr = 0.003
    job = te.submit(experiment(name="ddp-one", tau=1, outer_loop_steps=1,
                               learning_rate=lr))
    if not job:
        return
    te.wait_done(job, 120)
    check(te.state_of(job) == "succeeded", "one-step job succeeded")
    steps = te.steps_of(job)
    if 1 not in steps:
        check(False, "one-step job reported its step")
        return
    init = os.path.join(work, "init")
    pjson = os.path.join(work, "p.json")
    subprocess.run([gt.PCP, "model", "gpt", "--layers", "1", "--heads", "2",
                    "--kv-heads", "2", "--width", "64", "--vocab", "65",
                    "--block-size", "32", "--batch", "8",
                    "-o", os.path.join(work, "m.mlir"), "--params-json",
                    pjson, "--init-dir", init, "--seed", "1"],
                   check=True, capture_output=True)
    with open(pjson) as f:
        table = json.load(f)
    names = [e["name"] for e in table["parameters"]]
    files = sorted(os.listdir(init))
    p0 = {name: np.load(os.path.join(init, f))
          for name, f in zip(names, files)}
    batches = np.load(os.path.join(work, "state", "training", job,
                                   "ddp_first_batches.npy"))
    check(batches.shape == (2, 2, 8, 32),
          "ddp_first_batches.npy is [W, 2, B, T]: %s" % (batches.shape,))
    f = jax.value_and_grad(ref.loss_fn(table))
    params = {k: jnp.asarray(v) for k, v in p0.items()}
    losses, grads = [], []
    for k in range(2):
        loss, g = f(params, jnp.asarray(batches[k][0]),
                    jnp.asarray(batches[k][1]))
        losses.append(float(loss))
        grads.append({name: np.asarray(g[name], np.float32)
                      for name in names})
    got = steps[1]["loss"]
    want = (losses[0] + losses[1]) / 2
    print("first step: loss %.6f, JAX workers %.6f %.6f (mean %.6f)" % (
        got, losses[0], losses[1], want))
    check(abs(got - want) < 2e-4 and
          min(abs(got - x) for x in losses) > 1e-3,
          "the step's loss is the mean of the workers' (JAX)")

    def adamw(g):
        norm = math.sqrt(sum(float(np.sum(np.square(g[k], dtype=np.float64)))
                             for k in names))
        scale = np.float32(1.0 / max(norm, 1.0))
        out = {}
        for k in names:
            c = g[k] * scale
            m_hat = (np.float32(0.1) * c) / np.float32(0.1)
            v_hat = (np.float32(0.001) * c * c) / np.float32(0.001)
            out[k] = p0[k] - np.float32(lr) * (
                m_hat / (np.sqrt(v_hat) + np.float32(1e-8)) +
                np.float32(0.01) * p0[k])
        return out

    p1 = exported(work, job)
    mean = {k: (grads[0][k] + grads[1][k]) / np.float32(2) for k in names}

    def off(reference):
        # AdamW's first step is about lr x sign(g): an element whose
        # gradient is near 0 can flip between two implementations, so
        # count the elements off by more than lr / 10.
        bad = sum(int(np.sum(np.abs(p1[k] - reference[k]) > lr / 10))
                  for k in names)
        return bad / sum(p1[k].size for k in names)

    mean_off = off(adamw(mean))
    own_off = [off(adamw(grads[k])) for k in range(2)]
    print("first step: parameters off by > lr/10: %.5f with the mean "
          "gradient, %.3f / %.3f with one worker's own" % (
              mean_off, own_off[0], own_off[1]))
    check(mean_off < 0.002 and min(own_off) > 0.05,
          "the exported step is AdamW with the mean gradient")


def mismatch(work, fabric_port):
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN, POD_NAME="corrupt",
               PCP_WORKER_TEST_CORRUPT_PARAM="2,5")
    nm = subprocess.Popen(
        [gt.PCP, "--node-manager", "--scale", "1", "--host", "127.0.0.1",
         "--port", str(fabric_port), "--backend", "cpu", "--api-port", "0"],
        env=env, stderr=open(os.path.join(work, "nm-corrupt.err"), "w"))
    try:
        def ids():
            s, r = request("GET", "/v1/workers")
            return sorted(w["worker_id"] for w in r.get("workers", [])
                          if w.get("state") == "connected") if s == 200 else []
        gt.wait_for(lambda: len(ids()) == 3 and "corrupt" in ids()[0], 90,
                    "three workers, the corrupting one first by id")
        bad = ids()[0] if ids() else "?"
        job = te.submit(experiment(name="ddp-resync", outer_loop_steps=4,
                                   eval_every=100, checkpoint_every=100))
        if not job:
            return
        te.wait_done(job, 120)
        s, r = request("GET", "/v1/training/jobs/%s" % job)
        check(r.get("state") == "succeeded", "resync job succeeded: %s" % (
            r.get("error", r.get("state"))))
        steps = te.steps_of(job)
        events = [e["payload"] for e in te.events(job)
                  if e["type"] == "training.param_hash_mismatch"]
        workers = [steps[k]["workers"] for k in sorted(steps)]
        print("resync: workers per step %s, mismatch events %s" % (
            workers, [(e["step"], e["worker_id"]) for e in events]))
        # ddp holds no gateway copy: the event names the reference worker
        # (the majority's, not the corrupting one although it is first by
        # id) and says the worker was dropped.
        check(len(events) == 1 and events[0]["worker_id"] == bad and
              events[0]["step"] == 2 and events[0]["policy"] == "drop" and
              events[0].get("reference_worker") not in (None, bad) and
              events[0]["worker_sha256"] != events[0]["reference_sha256"],
              "one mismatch event naming the corrupting worker at step 2 "
              "and a healthy reference worker: %s" % events)
        check(workers == [3, 2, 2, 2] and
              steps[4]["param_hash"]["verified_step"] == 4 and
              steps[4]["param_hash"]["mismatches"] == 1,
              "the corrupting worker was dropped, the others verified: %s" %
              [steps[k]["param_hash"] for k in sorted(steps)])
        job = te.submit(experiment(name="ddp-fail", outer_loop_steps=4,
                                   eval_every=100, checkpoint_every=100,
                                   on_param_mismatch="fail"))
        if not job:
            return
        te.wait_done(job, 120)
        s, r = request("GET", "/v1/training/jobs/%s" % job)
        error = r.get("error", "")
        print("fail: %s: %s" % (r.get("state"), error))
        check(r.get("state") == "failed" and
              ("worker %s holds" % bad) in error and
              "reference worker" in error and "gateway" not in error and
              "on_param_mismatch: fail" in error,
              "the fail job failed naming the corrupting worker against a "
              "reference worker")
    finally:
        nm.terminate()
        try:
            nm.wait(30)
        except subprocess.TimeoutExpired:
            nm.kill()


def main():
    work = tempfile.mkdtemp(prefix="pcp-ddp-")
    gw = nm = None
    try:
        gw, nm = te.start_cluster(work)
        if gt.FAILURES:
            return 1
        refusals()
        job = te.submit(experiment())
        if not job:
            return 1
        te.wait_done(job, 600)
        s, r = request("GET", "/v1/training/jobs/%s" % job)
        check(r.get("state") == "succeeded", "ddp job succeeded: %s" % (
            r.get("error", r.get("state"))))
        steps = te.steps_of(job)
        check(sorted(steps) == list(range(1, OUTER + 1)),
              "one step event per %d inner steps: %s" % (TAU, sorted(steps)))
        if sorted(steps) != list(range(1, OUTER + 1)):
            return 1
        losses = [steps[k]["loss"] for k in sorted(steps)]
        print("ddp losses per %d inner steps: %s" % (
            TAU, " ".join("%.3f" % x for x in losses)))
        start = math.log(MODEL["vocab"])
        check(losses[-1] < 0.8 * start and losses[-1] < losses[0],
              "loss falls clearly: ln(65) = %.3f, %s" % (start, losses))
        check(all(p["workers"] == 2 and p.get("aggregation_strategy") == "ddp"
                  and p.get("inner_steps") == k * TAU
                  for k, p in steps.items()),
              "both workers in every step")
        # Goodput: with no worker lost every batch's gradient is averaged
        # and applied, so merged = computed = steps x workers x B x T.
        rows = MODEL["batch"] * MODEL["block_size"]
        check(all(p.get("tokens_computed") == p.get("tokens_merged") ==
                  k * TAU * 2 * rows and p.get("goodput") == 1.0
                  for k, p in steps.items()),
              "goodput counters: %s" % [
                  (p.get("tokens_computed"), p.get("tokens_merged"),
                   p.get("goodput")) for p in steps.values()])
        vals = [(k, p["val_loss"]) for k, p in steps.items()
                if p.get("evaluated")]
        check([k for k, _ in vals] == [3, 6] and
              all(v is not None and v < start for _, v in vals),
              "val_loss at steps 3 and 6: %s" % vals)
        # Measured bytes per worker and inner step against a fair DDP's
        # 8 P (f32 gradient up, averaged gradient down) + its tokens.
        P = steps[1]["parameter_count"]
        tokens = 2 * MODEL["batch"] * MODEL["block_size"] * 4
        fair = 8 * P + tokens
        ratios = []
        for k in sorted(steps):
            per = steps[k]["bytes"]["per_worker"]
            check(len(per) == 2, "step %d: two workers measured: %s" % (
                k, per))
            for wid, b in per.items():
                ratios.append((b["in"] + b["out"]) / TAU / fair)
        print("P=%d: measured bytes per worker and inner step / (8 P + "
              "tokens) = %s" % (P, " ".join("%.4f" % x for x in ratios)))
        check(ratios and all(1.0 <= x <= 1.15 for x in ratios),
              "bytes per worker per inner step within [1.0, 1.15] x "
              "(8 P + tokens) = %d" % fair)
        # The arithmetic figures: 8 P per worker and inner step.
        training = r.get("training", {})
        check(training.get("wire_bytes_per_worker_outer_step") ==
              8 * P * TAU and
              training.get("wire_bytes") == 2 * OUTER * TAU * 8 * P,
              "analytic wire bytes 8 P per worker and inner step: %s" % {
                  k: training.get(k) for k in
                  ("wire_bytes", "wire_bytes_per_worker_outer_step")})
        check(all(p["param_hash"]["verified_step"] == k and
                  p["param_hash"]["mismatches"] == 0 and
                  p["param_mismatches"] == 0 for k, p in steps.items()),
              "every step's parameter hashes agree: %s" % [
                  p["param_hash"] for p in steps.values()])
        model_dir = os.path.join(work, "state", "models", job)
        with open(os.path.join(model_dir, "model.json")) as f:
            meta = json.load(f)
        check(meta["outer_step"] == OUTER and meta["name"] == "ddp-char",
              "model exported at the last step: %s" % meta.get("outer_step"))
        # The inference service loads the export on a worker first (503
        # "not being served by any worker yet" until then).
        answer = {}

        def completion():
            s, r = request("POST", "/v1/completions",
                           {"model": "ddp-char", "prompt": "ROMEO:",
                            "max_tokens": 8, "temperature": 0}, timeout=120)
            answer["last"] = (s, r)
            if s != 200:
                time.sleep(0.5)
            return s == 200
        gt.wait_for(completion, 300, "the exported model is served")
        s, r = answer.get("last", (0, None))
        text = (r.get("choices") or [{}])[0].get("text") \
            if isinstance(r, dict) else None
        check(s == 200 and isinstance(text, str) and len(text) > 0,
              "the exported model answers a completion: %s %s" % (s, r))
        print("completion: %r" % text)
        first_step(work)
        lost_worker(work)
        mismatch(work, gw.fabric_port)
    finally:
        te.stop_all(nm, gw)
    if gt.FAILURES:
        print("training_ddp_test: %d failures (logs in %s)" % (
            len(gt.FAILURES), work))
        return 1
    print("training_ddp_test: all passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
