#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Decoupled DiLoCo's final sync (`decoupled_diloco.final_sync`,
docs/training.md "The final sync"): a real gateway and node managers with
CPU workers on 127.0.0.1, the smallest char GPT, H=16, P=2, S=32, so that
fragment 1 is last scheduled at syncer step 17.

- A bad final_sync (1, "yes") is refused with 400 naming the key.
- One learner, alpha 0, outer lr 1 without momentum (the merged global is
  the learner's values), final_sync false and then true, the same seed and
  data: both ran the same 32 local steps (tokens computed, per-learner
  step 32); true adds exactly one round, syncer step 33 for fragment 1,
  merged (summary final_sync_rounds 1, 0 for false); the exported models'
  fragment-0 tensors are bit-identical (both synced at 32) and every
  fragment-1 tensor changed (17 -> 32 steps), their value counts adding up
  to the two fragments' sizes from the round events; on the job's
  held-out batches (eval_batches.npy, the independent JAX model of
  tests/models) the final sync's export has the lower loss; goodput rises
  to 1.
- A resume of the final_sync run from its checkpoint after round 32 (all
  local steps run, the final round not yet): the learner comes back at
  step 32, runs no step, the final round (outer step 5) closes with its
  hash verified, and the export is the checkpoint's masters (the
  final_sync false model: a resume loses the unmerged steps). The
  checkpoint after the final round, resumed with final_sync false, fails
  naming the key.
- Three learners, quorum 3, final_sync true and false: both complete, the
  final round merges all three, every @mix hash verifies (the final
  round's broadcast included), and goodput with the final sync is at least
  the one without.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "models"))
import gateway_test as gt  # noqa: E402
import training_decoupled_fused_test as ft  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, request, wait_for  # noqa: E402

STEPS = ft.STEPS  # 32
DECOUPLED = dict(ft.DECOUPLED)  # H 16, P 2, alpha 0, outer lr 1
DECOUPLED.pop("final_sync", None)


def experiment(final_sync, **keys):
    block = dict(DECOUPLED, **keys)
    if final_sync is not None:
        block["final_sync"] = final_sync
    return te.experiment(
        model=ft.MODEL, learning_rate=0.003, nesterov_momentum=0.0,
        outer_learning_rate=1.0, outer_loop_steps=STEPS,
        aggregation_strategy="decoupled_diloco", decoupled_diloco=block)


def refusals():
    for bad in (1, "yes"):
        s, r = request("POST", "/v1/training/jobs", experiment(bad))
        check(s == 400 and "decoupled_diloco: key 'final_sync'" in
              r.get("error", {}).get("message", json.dumps(r)),
              "final_sync %r refused with 400 naming the key: %s %s" % (
                  bad, s, r))


def rounds(r):
    return [(p["syncer_step"], p["fragment"], p["skipped"])
            for _, p in sorted(r["steps"].items())]


def fragment_values(r):
    """{fragment: its f32 value count} from the round events."""
    return {p["fragment"]: p["fragment_values"] for p in r["steps"].values()}


def arrays(work, job):
    """{name: np.float32 array} of the exported model.safetensors."""
    path = os.path.join(work, "state", "models", job, "model.safetensors")
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return {name: np.frombuffer(raw[8 + n + i["data_offsets"][0]:
                                    8 + n + i["data_offsets"][1]],
                                np.float32).reshape(i["shape"])
            for name, i in header.items() if name != "__metadata__"}


def held_out_loss(work, jobs):
    """Each job's exported model on the service's held-out batches
    (eval_batches.npy of the first job; the same seed and data draw the
    same ones), by the independent JAX model (tests/models)."""
    import jax.numpy as jnp
    import jax_reference as ref
    m = ft.MODEL
    pjson = os.path.join(work, "p.json")
    subprocess.run([gt.PCP, "model", "gpt", "--layers", str(m["layers"]),
                    "--heads", str(m["heads"]), "--width", str(m["width"]),
                    "--vocab", str(m["vocab"]), "--block-size",
                    str(m["block_size"]), "--batch", str(m["batch"]), "-o",
                    os.path.join(work, "m.mlir"), "--params-json", pjson],
                   check=True, capture_output=True)
    with open(pjson) as f:
        table = json.load(f)
    batches = np.load(os.path.join(work, "state", "training", jobs[0],
                                   "eval_batches.npy"))
    f = ref.loss_fn(table)
    out = []
    for job in jobs:
        named = {k: jnp.asarray(v) for k, v in arrays(work, job).items()}
        losses = [float(f(named, jnp.asarray(batches[0][k]),
                          jnp.asarray(batches[1][k])))
                  for k in range(batches.shape[1])]
        out.append(sum(losses) / len(losses))
    return out


def one_learner(work):
    off = ft.run(experiment(False))
    # The default; a checkpoint per round for the resume below.
    on = ft.run(dict(experiment(None), checkpoint_every=1,
                     checkpoint_dir=os.path.join(work, "state", "ckpt-on")))
    if not off or not on:
        return
    so, sn = off["summary"], on["summary"]
    print("one learner: final_sync false rounds %s goodput %s loss %s; "
          "true rounds %s goodput %s loss %s" % (
              rounds(off), so.get("goodput"), so.get("loss"), rounds(on),
              sn.get("goodput"), sn.get("loss")))
    check(rounds(off) == [(1, 1, False), (16, 0, False), (17, 1, False),
                          (32, 0, False)] and
          rounds(on) == rounds(off) + [(33, 1, False)],
          "final_sync adds one merged round, syncer step 33 for fragment 1")
    check(so.get("final_sync") is False and so.get("final_sync_rounds") == 0
          and sn.get("final_sync") is True and
          sn.get("final_sync_rounds") == 1,
          "the summary reports final_sync and its rounds: %s %s / %s %s" % (
              so.get("final_sync"), so.get("final_sync_rounds"),
              sn.get("final_sync"), sn.get("final_sync_rounds")))
    check(so.get("tokens_computed") == sn.get("tokens_computed") and
          [x["step"] for x in so.get("learner_steps", [])] == [STEPS] and
          [x["step"] for x in sn.get("learner_steps", [])] == [STEPS],
          "the same %d local steps either way (no step in the final round)"
          % STEPS)
    sizes = fragment_values(on)
    w_off, w_on = ft.weights(work, off["job"]), ft.weights(work, on["job"])
    check(sorted(w_off) == sorted(w_on) and w_on, "the same exported tensors")
    same, changed, worst = 0, 0, 0.0
    for name, values in w_on.items():
        old = w_off.get(name, ())
        if list(values) == list(old):
            same += len(values)
        else:
            changed += len(values)
            worst = max(worst, max(abs(a - b) for a, b in zip(values, old)))
    print("exported model: %d values bit-identical, %d changed (max |diff| "
          "%g); fragment sizes %s" % (same, changed, worst, sizes))
    # Fragment 0 synced last at 32 both ways: bit-identical. Fragment 1:
    # 17 local steps without the final sync, all 32 with it.
    check(same == sizes.get(0) and changed == sizes.get(1) and worst > 0,
          "fragment 0 identical, every fragment-1 tensor changed (%d and %d "
          "values, fragments %s)" % (same, changed, sizes))
    # The exported model of S local steps against the one holding 17 of
    # them for fragment 1: held-out loss by an independent evaluation.
    val_off, val_on = held_out_loss(work, [off["job"], on["job"]])
    print("held-out loss of the exported model (JAX, eval_batches.npy): "
          "final_sync false %.4f, true %.4f (%+.2f%%)" % (
              val_off, val_on, 100.0 * (val_on - val_off) / val_off))
    check(val_on < val_off,
          "the final sync's exported model has the lower held-out loss: "
          "%.4f < %.4f" % (val_on, val_off))
    check(sn.get("goodput", 0) > so.get("goodput", 1) and
          abs(sn.get("goodput", 0) - 1.0) < 1e-9,
          "goodput rises to 1 with the final sync: %s -> %s" % (
              so.get("goodput"), sn.get("goodput")))
    resume_in_final_rounds(work, on, off)
    resume_final_checkpoint_without_final_sync(work, on)


def resume_in_final_rounds(work, on, off):
    """Resumes the final_sync run from its checkpoint after round 32
    (outer step 4: every local step run, the final round at 33 not yet):
    the learners come back at local step 32 with no step to run, and the
    final round must open and close by itself."""
    src = os.path.join(work, "state", "checkpoints", on["job"])
    dst = os.path.join(work, "state", "ckpt-final")
    os.makedirs(dst)
    shutil.copy(os.path.join(src, "step-%020d.bin" % 4),
                os.path.join(dst, "latest.ckpt"))
    tape = "decoupled-tape-%020d.workers" % 4
    shutil.copy(os.path.join(src, tape), os.path.join(dst, tape))
    r = ft.run(dict(experiment(None), resume=True, checkpoint_dir=dst))
    if not r:
        return
    s = r["summary"]
    print("resumed after round 32: rounds %s, summary resumed_at %s, "
          "tokens computed %s (the run's %s), step tasks %s" % (
              rounds(r), s.get("resumed_at_syncer_step"),
              s.get("tokens_computed"), on["summary"].get("tokens_computed"),
              s.get("step_tasks")))
    # The learners hold the masters and trained no token since: no merge
    # weight, so the round closes skipped (no outer step on a zero
    # gradient, which with momentum would move the masters with no data).
    final = r["steps"].get(5) or {}
    check(rounds(r) == [(33, 1, True)] and sorted(r["steps"]) == [5] and
          "merge weight 0" in str(final.get("skipped_reason")) and
          s.get("resumed_at_syncer_step") == 32 and
          s.get("tape_replayed") is True and s.get("step_tasks") == 0 and
          [x["step"] for x in s.get("learner_steps", [])] == [STEPS] and
          s.get("tokens_computed") == on["summary"].get("tokens_computed"),
          "a resume in the final rounds closes the final round (outer step "
          "5, syncer step 33; skipped: no data since the receipt) and runs "
          "no local step")
    ph = s.get("param_hash") or {}
    check(ph.get("mismatches") == 0 and ph.get("verified_step"),
          "the resumed final round's @mix hash verified: %s" % ph)
    # As any resume, it loses the learner's steps no round merged before
    # the checkpoint (fragment 1's 18..32): back from the masters, its
    # fragment 1 is theirs, and the final round leaves it there (outer lr
    # 1, no momentum): the final_sync false model.
    w_res, w_off = arrays(work, r["job"]), arrays(work, off["job"])
    worst = max(float(np.max(np.abs(w_res[k] - w_off[k]))) for k in w_off)
    check(sorted(w_res) == sorted(w_off) and worst <= 1e-6,
          "the resumed model is the masters of the checkpoint: max diff "
          "%g against final_sync false" % worst)


def resume_final_checkpoint_without_final_sync(work, on):
    """The checkpoint after the final round (outer step 5, syncer step 33,
    past S) resumed by a job with final_sync false: refused, naming the
    key (its schedule ends at 32, so the cursor is not "malformed")."""
    src = os.path.join(work, "state", "checkpoints", on["job"])
    dst = os.path.join(work, "state", "ckpt-final-off")
    os.makedirs(dst)
    ckpt = os.path.join(src, "step-%020d.bin" % 5)
    tape = "decoupled-tape-%020d.workers" % 5
    have = os.path.exists(ckpt) and os.path.exists(os.path.join(src, tape))
    check(have, "the final round's checkpoint and tape exist: %s" %
          sorted(os.listdir(src)))
    if not have:
        return
    shutil.copy(ckpt, os.path.join(dst, "latest.ckpt"))
    shutil.copy(os.path.join(src, tape), os.path.join(dst, tape))
    job = te.submit(dict(experiment(False), resume=True, checkpoint_dir=dst))
    if not job:
        return
    te.wait_done(job, 300)
    s, r = request("GET", "/v1/training/jobs/%s" % job)
    message = json.dumps(r.get("error", r))
    check(r.get("state") == "failed" and "final sync rounds" in message and
          "'decoupled_diloco.final_sync' false" in message,
          "a final-round checkpoint resumed with final_sync false fails "
          "naming the key: %s %s" % (r.get("state"), message[:300]))


def three_learners(work, port, extra):
    extra.append(ft.node_manager(work, port, 2, "nm-more"))
    if not wait_for(lambda: len(ft.connected()) == 3, 90,
                    "three workers joined"):
        return
    runs = {fs: ft.run(experiment(fs, min_quorum=3, grace_window_ms=5000))
            for fs in (False, True)}
    if not all(runs.values()):
        return
    for fs, r in sorted(runs.items()):
        print("three learners, final_sync %s: rounds %s goodput %s loss %s "
              "tokens computed %s merged %s" % (
                  fs, rounds(r), r["summary"].get("goodput"),
                  r["summary"].get("loss"),
                  r["summary"].get("tokens_computed"),
                  r["summary"].get("tokens_merged")))
    on, off = runs[True], runs[False]
    last = on["steps"][max(on["steps"])]
    check(last["syncer_step"] == 33 and last["fragment"] == 1 and
          sorted(last["participants"]) == [1, 2, 3] and not last["skipped"],
          "the final round (33, fragment 1) merged all three learners: %s" %
          {k: last.get(k) for k in ("syncer_step", "fragment",
                                    "participants", "skipped")})
    s = on["summary"]
    ph = s.get("param_hash") or {}
    check(ph.get("mismatches") == 0 and ph.get("verified_step") and
          len(ph.get("sha256") or "") == 64 and s.get("resyncs") == 0 and
          s.get("tape_replayed") is True,
          "every @mix hash verified, the tape replayed: %s" % ph)
    check(s.get("goodput", 0) >= off["summary"].get("goodput", 1),
          "goodput with the final sync %s >= without %s" % (
              s.get("goodput"), off["summary"].get("goodput")))


def main():
    work = tempfile.mkdtemp(prefix="pcp-decoupled-final-")
    gw = None
    extra = []
    try:
        api_port, fabric_port = gt.free_port(), gt.free_port()
        gt.BASE = "http://127.0.0.1:%d" % api_port
        gw = gt.Gateway(work, api_port, fabric_port)
        te.relax_heartbeat(gw)
        gw.start()
        extra.append(ft.node_manager(work, fabric_port, 1, "nm-one"))
        if wait_for(lambda: len(ft.connected()) == 1, 90,
                    "one worker joined"):
            refusals()
            one_learner(work)
            three_learners(work, fabric_port, extra)
    finally:
        for proc in extra:
            proc.terminate()
            try:
                proc.wait(30)
            except Exception:
                proc.kill()
        te.stop_all(None, gw)
    if gt.FAILURES:
        print("training_decoupled_final_sync_test: %d failures (logs in %s)"
              % (len(gt.FAILURES), work))
        return 1
    print("training_decoupled_final_sync_test: all passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
