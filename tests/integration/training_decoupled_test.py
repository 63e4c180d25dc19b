#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Decoupled DiLoCo end to end (issue 17 Deliver 1): a real gateway and a
node manager with three CPU workers on 127.0.0.1, the smallest char GPT.

- Run F (f32 deltas) and run Q (int4 on the wire, `decoupled_verify_int4`:
  each learner's first int4 delta is checked against the f32 @delta of the
  same state, within the codec's bound) complete, every scheduled syncer
  step is a fragment sync with all three learners, and their losses fall
  comparably to a streaming DiLoCo run (run S) over about the same tokens.
- Per sync, Q's delta bytes are about 7x smaller than F's (measured: the
  sizes of the tasks' outputs), and the tokens counters add up.
- The event tape in the job's directory decodes (Python, from the documented
  layout) to one fragment_sync per sync, and the gateway replayed it to its
  syncer state at the end (`tape_replayed`).
- Run L (gateway restarted with PCP_DECOUPLED_TEST_DELAY): learner 3 is held
  back for its first steps; rounds close on grace without it, and it takes
  part in later rounds again.
- Bit-identity (issue 17 Deliver 3): every @mix returns the SHA-256 of the
  global values it received (f32) or of the broadcast copy it held plus the
  int4 change (int4_down); runs F and Q verify them all with no mismatch.
- int4 on the down path: Q (int4_down auto: on) against D (the same with
  int4_down off): the fragments sent down are ~7x fewer bytes, the measured
  gateway_out differs by what the gateway counted, the losses are close.
- A fourth worker with PCP_WORKER_TEST_CORRUPT_PARAM=4,8,... (its 4th and
  8th hashed tasks, each job's 2nd @mix after its two hashed @init, flip a
  bit of what they received): with on_param_mismatch
  "fail" the job fails with DATA_LOSS naming it and both hashes; with
  "resync" the job succeeds, the mismatch is an event and counted, the
  learner got the fragment again and later @mix tasks verify.
- A worker with PCP_WORKER_TEST_OMIT_HASH=3 answers its first @mix without
  the hash section: that learner is lost, the job succeeds with three. With
  PCP_WORKER_TEST_CORRUPT_PARAM=4 its next job's first @init (a full
  resync) is corrupted: a mismatch, the @init is sent again; with
  PCP_WORKER_TEST_CORRUPT_OUTPUT=1 its first @mix_int4's output hash (of
  the g it keeps) differs from the gateway's B: a mismatch, a resync.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway_test as gt  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, request, wait_for  # noqa: E402

STEPS = 40
MODEL = {"kind": "gpt", "layers": 1, "heads": 2, "kv_heads": 2,
         "width": 64, "vocab": 65,
         "block_size": 32, "batch": 8}
# A bound on one @train_steps TASK_ASSIGN frame and its answer on the
# gateway's out path (~4,400 bytes measured in docs/performance.md
# "diloco_comm": every resident tensor listed twice in JSON).
TASK_FRAME_MAX = 8192

DECOUPLED = {"num_fragments": 2, "sync_interval_h": 4, "overlap_tau": 1,
             "min_quorum": 2, "grace_window_ms": 5000,
             "merge_strategy": "weighted_average",
             "fragment_strategy": "balanced_tensor", "learner_alpha": 0.0,
             "outer_learning_rate": 1.0,
             # The runs here count the scheduled rounds 1..STEPS (and the
             # resume test, which copies this block, its tapes): the final
             # rounds past STEPS are training_decoupled_final_sync_test's.
             "final_sync": False}


def experiment(**extra):
    return te.experiment(model=MODEL, learning_rate=0.003,
                         nesterov_momentum=0.0, outer_learning_rate=1.0,
                         **extra)


def start_cluster(work):
    api_port, fabric_port = gt.free_port(), gt.free_port()
    gt.BASE = "http://127.0.0.1:%d" % api_port
    gw = gt.Gateway(work, api_port, fabric_port)
    te.relax_heartbeat(gw)
    gw.start()
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN)
    nm = subprocess.Popen(
        [gt.PCP, "--node-manager", "--scale", "3", "--host", "127.0.0.1",
         "--port", str(fabric_port), "--backend", "cpu", "--api-port", "0",
         "--start-stagger-ms", "100"],
        env=env, stderr=open(os.path.join(work, "nm.err"), "w"))
    wait_for(lambda: request("GET", "/v1/workers")[1]["counts"][
        "connected"] == 3, 90, "three workers joined")
    return gw, nm


def connected():
    s, r = request("GET", "/v1/workers")
    return [w["worker_id"] for w in r.get("workers", [])
            if w.get("state") == "connected"] if s == 200 else []


def run(body, seconds=900):
    job = te.submit(body)
    if not job:
        raise RuntimeError("submit refused")
    t0 = time.time()
    te.wait_done(job, seconds)
    wall = time.time() - t0
    s, r = request("GET", "/v1/training/jobs/%s" % job)
    check(r.get("state") == "succeeded", "job %s succeeded: %s" % (
        job, r.get("error", r.get("state"))))
    return job, te.steps_of(job), wall


def summary_of(job):
    for e in te.events(job):
        if e["type"] == "training.decoupled":
            return e["payload"]
    return {}


def tape_syncs(path):
    """Fragment syncs of a tape file, decoded from decoupled.h's layout
    (CRCs not rechecked here: the gateway's replay does that)."""
    with open(path, "rb") as f:
        data = f.read()
    check(data[:8] == b"PCPTAPE1" and
          struct.unpack_from("<I", data, 8)[0] == 1, "tape header")
    at, syncs, ids = 16, [], []
    while at < len(data):
        length, _crc = struct.unpack_from("<II", data, at)
        payload = data[at + 8:at + 8 + length]
        at += 8 + length
        rid, kind, step, frag = struct.unpack_from("<QBQI", payload, 0)
        ids.append(rid)
        if kind == 1:
            count = struct.unpack_from("<I", payload, 8 + 1 + 8 + 4 + 4 + 8)[0]
            base = 8 + 1 + 8 + 4 + 4 + 8 + 4
            learners = [struct.unpack_from("<I", payload, base + 36 * k)[0]
                        for k in range(count)]
            syncs.append((step, frag, learners))
    check(ids == list(range(1, len(ids) + 1)), "tape ids 1..n")
    return syncs


def check_hashes(summary, what):
    ph = summary.get("param_hash") or {}
    check(ph.get("mismatches") == 0 and ph.get("verified_step") and
          len(ph.get("sha256") or "") == 64 and summary.get("resyncs") == 0,
          "%s: every @mix hash verified, no mismatch: %s" % (what, ph))


def loss_tail(steps, n=4):
    losses = [steps[k]["loss"] for k in sorted(steps)
              if steps[k].get("loss") is not None]
    return losses, sum(losses[-n:]) / min(n, len(losses))


def main():
    work = tempfile.mkdtemp(prefix="pcp-decoupled-")
    gw = nm = None
    extra = []
    try:
        gw, nm = start_cluster(work)
        if gt.FAILURES:
            return 1
        # Run F: f32 deltas.
        f_job, f_steps, f_wall = run(experiment(
            outer_loop_steps=STEPS, aggregation_strategy="decoupled_diloco",
            decoupled_diloco=DECOUPLED))
        f_losses, f_tail = loss_tail(f_steps)
        f_sum = summary_of(f_job)
        print("decoupled f32: %d syncs, %.1f s, losses %s" % (
            len(f_steps), f_wall, " ".join("%.3f" % x for x in f_losses)))
        print("  summary %s" % f_sum)
        want = [s for s in range(1, STEPS + 1) if s % 4 in (0, 1)]
        syncer = sorted(p["syncer_step"] for p in f_steps.values())
        check(syncer == want, "a sync per scheduled syncer step: %s" % syncer)
        check(all(sorted(p["participants"]) == [1, 2, 3] and
                  not p["skipped"] for p in f_steps.values()),
              "every round merged all three learners")
        check(f_losses[0] > 3.5 and f_tail < f_losses[0] - 0.5,
              "the loss falls (first %.3f, last four %.3f)" % (
                  f_losses[0], f_tail))
        # A learner stops once no round is left for it (docs/training.md
        # "In the training service"): at most 3 x STEPS steps, whole steps.
        tokens = 3 * STEPS * MODEL["batch"] * MODEL["block_size"]
        computed = f_sum.get("tokens_computed", 0)
        check(0 < computed <= tokens and
              computed % (MODEL["batch"] * MODEL["block_size"]) == 0 and
              0 < f_sum.get("tokens_merged", 0) <= computed,
              "tokens computed %s <= 3 x %d x B x T = %d, merged %s" % (
                  f_sum.get("tokens_computed"), STEPS, tokens,
                  f_sum.get("tokens_merged")))
        check(f_sum.get("tape_replayed") is True,
              "the gateway replayed the tape to its state")
        check_hashes(f_sum, "f32")
        tape = os.path.join(work, "state", "training", f_job,
                            "decoupled.tape")
        syncs = tape_syncs(tape)
        check([(s, f) for s, f, _ in syncs] ==
              [(p["syncer_step"], p["fragment"])
               for _, p in sorted(f_steps.items())] and
              all(sorted(ls) == [1, 2, 3] for _, _, ls in syncs),
              "the tape holds one fragment_sync per sync with its learners")

        # Run Q: int4 on the wire, the first delta of each learner checked
        # against the f32 one.
        q_job, q_steps, q_wall = run(experiment(
            outer_loop_steps=STEPS, aggregation_strategy="decoupled_diloco",
            decoupled_verify_int4=True,
            decoupled_diloco=dict(DECOUPLED,
                                  outer_gradient_compression="int4")))
        q_losses, q_tail = loss_tail(q_steps)
        q_sum = summary_of(q_job)
        print("decoupled int4: %d syncs, %.1f s, losses %s" % (
            len(q_steps), q_wall, " ".join("%.3f" % x for x in q_losses)))
        print("  summary %s" % q_sum)
        check(q_sum.get("int4_verified") == 3 and
              q_sum.get("int4_error_over_bound", 9) <= 1.0,
              "int4 deltas within the bound of the f32 ones (3 checked, "
              "max error / bound %s)" % q_sum.get("int4_error_over_bound"))
        ratios = []
        for k, p in q_steps.items():
            fp = next((x for x in f_steps.values()
                       if x["syncer_step"] == p["syncer_step"]), None)
            if fp and fp["participants"] == p["participants"] and p[
                    "delta_bytes"]:
                ratios.append(fp["delta_bytes"] / p["delta_bytes"])
        print("  f32 / int4 delta bytes per sync: %s" % sorted(
            set(round(r, 3) for r in ratios)))
        check(ratios and all(6.5 < r < 8.0 for r in ratios),
              "int4 deltas ~7x smaller than f32 on the wire")
        check(abs(q_tail - f_tail) < 0.3,
              "int4 loss close to f32's (%.3f vs %.3f)" % (q_tail, f_tail))
        check_hashes(q_sum, "int4 both ways")
        check(q_sum.get("down_compression") == "int4" and
              q_sum.get("down_int4_sends", 0) > 0 and
              q_sum.get("int4_down_error_over_bound", 9) <= 1.0,
              "int4_down on by default with int4: %s int4 / %s f32 sends, "
              "error / bound %s" % (q_sum.get("down_int4_sends"),
                                    q_sum.get("down_f32_sends"),
                                    q_sum.get("int4_down_error_over_bound")))

        # Run D: int4 up, f32 down (int4_down off): the down path alone
        # differs from Q.
        d_job, d_steps, d_wall = run(experiment(
            outer_loop_steps=STEPS, aggregation_strategy="decoupled_diloco",
            decoupled_diloco=dict(DECOUPLED, outer_gradient_compression="int4",
                                  int4_down="off")))
        d_losses, d_tail = loss_tail(d_steps)
        d_sum = summary_of(d_job)
        print("decoupled int4 up, f32 down: %d syncs, %.1f s, losses %s" % (
            len(d_steps), d_wall, " ".join("%.3f" % x for x in d_losses)))
        print("  summary %s" % d_sum)
        check_hashes(d_sum, "int4 up, f32 down")
        q_down = q_sum.get("fragment_bytes_down_total", 0)
        d_down = d_sum.get("fragment_bytes_down_total", 0)
        # Like with like: both runs measured between their first and last
        # sync events (the programs were fetched before the first; after
        # the last come the final fragments, the step-40 hash check and the
        # end of the job, whose share in the summary's window depends on
        # timing: the 0.7 MB misses seen under load). In that window the
        # two runs differ by their down path and by how many local steps
        # they ran (timing): each step task sends its token ids and
        # targets (counted: token_bytes) and a TASK_ASSIGN frame (not
        # counted). So the measured difference less the counted down and
        # token differences must be within the task count difference x
        # TASK_FRAME_MAX plus 3%: it still fails if Q sent f32 fragments
        # down while counting int4 (5.8 MB off).
        def window(steps):
            first, last = steps[min(steps)], steps[max(steps)]
            def delta(key):
                if key == "gateway_out":
                    return ((last.get("bytes_total") or {}).get(key, 0) -
                            (first.get("bytes_total") or {}).get(key, 0))
                return last.get(key, 0) - first.get(key, 0)
            return {k: delta(k) for k in (
                "gateway_out", "fragment_bytes_down_total", "token_bytes",
                "step_tasks")}
        qw, dw = window(q_steps), window(d_steps)
        q_out, d_out = qw["gateway_out"], dw["gateway_out"]
        counted = (dw["fragment_bytes_down_total"] -
                   qw["fragment_bytes_down_total"])
        tokens = dw["token_bytes"] - qw["token_bytes"]
        tasks = dw["step_tasks"] - qw["step_tasks"]
        rest = (d_out - q_out) - counted - tokens
        print("DOWN f32 %d bytes, int4 %d bytes (%.2fx); between the first "
              "and last syncs: measured gateway_out %d vs %d, difference %d; "
              "counted down %d, token bytes %d, step tasks %d vs %d (%+d), "
              "unexplained %d (%.0f per task of the difference)" % (
                  d_down, q_down, d_down / max(q_down, 1), d_out, q_out,
                  d_out - q_out, counted, tokens, dw["step_tasks"],
                  qw["step_tasks"], tasks, rest, rest / tasks if tasks else 0))
        check(q_down > 0 and 6.5 < d_down / q_down < 7.3,
              "the fragments sent down are ~7x fewer bytes with int4_down "
              "(%.2fx)" % (d_down / max(q_down, 1)))
        check(d_out > q_out > 0 and counted > 0.8 * (d_down - q_down) and
              abs(rest) <= abs(tasks) * TASK_FRAME_MAX + 0.03 * counted,
              "the measured gateway_out shrinks by what the gateway counted "
              "(down %d + tokens %d, the rest %d within %d step tasks x %d "
              "+ 3%%)" % (counted, tokens, rest, tasks, TASK_FRAME_MAX))
        # 0.3: the spread of this tail over runs of one configuration
        # (2.87-3.09 for F, the timing of blends varies); measured Q - D:
        # -0.15, -0.07, +0.13.
        check(abs(q_tail - d_tail) < 0.3,
              "int4 down loss within 0.3 of f32 down's (%.3f vs %.3f)" % (
                  q_tail, d_tail))

        # Run S: streaming DiLoCo on about the same tokens (P=2, H=4,
        # overlap 1, 9 rounds: 4*9 + 2 + 1 = 39 local steps per worker).
        s_job, s_steps, s_wall = run(experiment(
            max_epochs=9, streaming={"num_fragments": 2, "inner_steps": 4,
                                     "overlap_tau": 1, "alpha": 0.0}))
        s_losses, s_tail = loss_tail(s_steps)
        print("streaming: %d syncs, %.1f s, losses %s" % (
            len(s_steps), s_wall, " ".join("%.3f" % x for x in s_losses)))
        print("LOSSES decoupled f32 %.3f, decoupled int4 %.3f, streaming "
              "%.3f (mean of the last four syncs)" % (f_tail, q_tail, s_tail))
        check(abs(f_tail - s_tail) < 0.3,
              "decoupled loss comparable to streaming's (%.3f vs %.3f)" % (
                  f_tail, s_tail))

        # Run L: learner 3 busy for 3 s before each of its first 3 steps
        # (gateway hook).
        gw.proc.terminate()
        gw.proc.wait()
        os.environ["PCP_DECOUPLED_TEST_DELAY"] = "2:3000:3"
        gw.start()
        del os.environ["PCP_DECOUPLED_TEST_DELAY"]
        wait_for(lambda: request("GET", "/v1/workers")[1]["counts"][
            "connected"] == 3, 90, "three workers back")
        l_job, l_steps, l_wall = run(experiment(
            outer_loop_steps=STEPS, aggregation_strategy="decoupled_diloco",
            decoupled_diloco=dict(DECOUPLED, grace_window_ms=1500,
                                  outer_gradient_compression="int4")))
        l_sum = summary_of(l_job)
        order = [l_steps[k] for k in sorted(l_steps)]
        print("slow learner: %.1f s, participants %s" % (
            l_wall, [p["participants"] for p in order]))
        print("  late %s" % [p["late"] for p in order])
        print("  summary %s" % l_sum)
        without = [p for p in order if 3 not in p["participants"]]
        first_back = next((i for i, p in enumerate(order)
                           if 3 in p["participants"]), None)
        check(len(without) >= 2 and 3 not in order[0]["participants"] and
              all(p["skipped_learners"] >= 1 for p in without),
              "the first rounds close on grace without learner 3")
        check(first_back is not None and
              all(3 in p["participants"] for p in order[-3:]),
              "learner 3 takes part in later rounds again (from sync %s)" %
              first_back)
        # Goodput itself varies from run to run (0.59-0.76 without a slow
        # learner: when the blend lands decides how much is overwritten),
        # so it is printed, not compared.
        check(sum(p["late"] for p in order) +
              l_sum.get("dropped_pulls", 0) >= 1 and
              l_sum.get("tokens_merged", 0) < l_sum.get("tokens_computed", 0),
              "late or dropped contributions counted (goodput %.3f; %.3f "
              "without the slow learner)" % (
                  l_sum.get("goodput", 0), f_sum.get("goodput", 0)))

        # A fourth worker whose 4th, 8th, 17th and 18th hashed tasks flip a
        # bit of what they received. Each job hashes its two @init (full
        # resyncs of the 2 fragments) first, so the 4th is the fail job's
        # 2nd @mix; the 8th the resync job's 2nd @mix; that job hashes 2
        # @init, 6 @mix and 1 resync, so the 17th and 18th are the third
        # job's 2nd @mix and its resync.
        corrupt = subprocess.Popen(
            [gt.PCP, "--node-manager", "--scale", "1", "--host", "127.0.0.1",
             "--port", str(gw.fabric_port), "--backend", "cpu",
             "--api-port", "0"],
            env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN,
                     POD_NAME="nm-corrupt",
                     PCP_WORKER_TEST_CORRUPT_PARAM="4,8,17,18"),
            stderr=open(os.path.join(work, "nm-corrupt.err"), "w"))
        extra.append(corrupt)
        before = set(connected())
        wait_for(lambda: len(connected()) == 4, 90, "a fourth worker")
        bad = sorted(set(connected()) - before)
        bad = bad[0] if bad else None
        # fail: f32 down; resync: int4 down (the corrupted payload, then B
        # in f32 to that learner, then int4 again).
        x_job = te.submit(experiment(
            outer_loop_steps=12, aggregation_strategy="decoupled_diloco",
            on_param_mismatch="fail", decoupled_diloco=dict(DECOUPLED)))
        te.wait_done(x_job, 600)
        s, r = request("GET", "/v1/training/jobs/%s" % x_job)
        found = [e["payload"] for e in te.events(x_job)
                 if e["type"] == "training.param_hash_mismatch"]
        error = str(r.get("error", ""))
        print("corrupted, fail: %s; %s" % (r.get("state"), error))
        check(r.get("state") == "failed" and len(found) == 1 and
              found[0]["worker_id"] == bad and bad in error and
              "DATA_LOSS" in error.upper().replace(" ", "_") and
              found[0]["worker_sha256"] in error and
              found[0]["gateway_sha256"] in error,
              "on_param_mismatch fail: the job fails with DATA_LOSS naming "
              "%s and both hashes" % bad)
        y_job, y_steps, _ = run(experiment(
            outer_loop_steps=12, aggregation_strategy="decoupled_diloco",
            decoupled_diloco=dict(DECOUPLED,
                                  outer_gradient_compression="int4")))
        y_sum = summary_of(y_job)
        found = [e["payload"] for e in te.events(y_job)
                 if e["type"] == "training.param_hash_mismatch"]
        ph = y_sum.get("param_hash") or {}
        print("corrupted, resync: %s; summary %s" % (found, y_sum))
        check(len(found) == 1 and found[0]["worker_id"] == bad and
              found[0]["policy"] == "resync" and
              found[0]["worker_sha256"] != found[0]["gateway_sha256"],
              "on_param_mismatch resync: one mismatch event naming %s" % bad)
        check(ph.get("mismatches") == 1 and y_sum.get("resyncs") == 1 and
              y_sum.get("down_f32_sends", 0) >= 1 and
              y_sum.get("down_int4_sends", 0) > 0 and
              ph.get("verified_step") == max(
                  p["syncer_step"] for p in y_steps.values()),
              "the learner got the fragment again (B in f32, then int4 "
              "again) and the last sync's @mix verified: %s, resyncs %s, "
              "f32 sends %s" % (ph, y_sum.get("resyncs"),
                                y_sum.get("down_f32_sends")))
        hashed = 2 + y_sum.get("syncs", 0) + 1
        z_job, z_steps, _ = run(experiment(
            outer_loop_steps=12, aggregation_strategy="decoupled_diloco",
            decoupled_diloco=dict(DECOUPLED)))
        z_sum = summary_of(z_job)
        found = [e["payload"] for e in te.events(z_job)
                 if e["type"] == "training.param_hash_mismatch"]
        last = z_steps[max(z_steps)] if z_steps else {}
        print("corrupted twice: %d mismatches, workers alive at the end %s "
              "(the resync job hashed %d tasks on it)" % (
                  len(found), last.get("workers_alive"), hashed))
        check(hashed == 9 and len(found) == 2 and
              all(f["worker_id"] == bad for f in found) and
              last.get("workers_alive") == 3 and
              (z_sum.get("param_hash") or {}).get("mismatches") == 2,
              "a learner whose resync mismatches too is dropped; the job "
              "finishes with the other three")

        # A worker whose 3rd hashed task (the next job's first @mix after
        # its two @init) answers without the hash section, as a build that
        # ignores hash_inputs would: that learner is lost, the job goes on
        # (it failed with INTERNAL before).
        corrupt.terminate()
        corrupt.wait(30)
        wait_for(lambda: len(connected()) == 3, 90, "the corrupt worker gone")
        omit = subprocess.Popen(
            [gt.PCP, "--node-manager", "--scale", "1", "--host", "127.0.0.1",
             "--port", str(gw.fabric_port), "--backend", "cpu",
             "--api-port", "0"],
            env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN,
                     POD_NAME="nm-omit", PCP_WORKER_TEST_OMIT_HASH="3",
                     PCP_WORKER_TEST_CORRUPT_OUTPUT="1",
                     PCP_WORKER_TEST_CORRUPT_PARAM="4"),
            stderr=open(os.path.join(work, "nm-omit.err"), "w"))
        extra.append(omit)
        wait_for(lambda: len(connected()) == 4, 90, "a worker omitting a hash")
        o_job, o_steps, _ = run(experiment(
            outer_loop_steps=8, aggregation_strategy="decoupled_diloco",
            decoupled_diloco=dict(DECOUPLED)))
        last = o_steps[max(o_steps)] if o_steps else {}
        first = o_steps[min(o_steps)] if o_steps else {}
        print("a @mix without its hash: workers alive first %s, last %s" % (
            first.get("workers_alive"), last.get("workers_alive")))
        check(last.get("workers_alive") == 3,
              "a @mix answered without its hash loses that learner; the job "
              "finishes with the other three")
        # The same worker's 4th hashed task (the next job's first @init, a
        # full resync) flips a bit of the fragment it received: a mismatch,
        # and that @init is sent again. Its first @mix_int4 (its first task
        # that hashes its outputs) reports a g it keeps that differs from
        # B, though s and q arrived intact: caught by the output hash at
        # that sync (the input hash alone would see it only at the
        # fragment's next @mix).
        # seeded_init off: that @init carries values, so the flipped bit is
        # a bit-identity mismatch (a seeded @init's differing hash is only
        # a fallback to values, training_decoupled_seeded_test).
        omit_id = sorted(set(connected()) - before - {bad})
        k_job, k_steps, _ = run(experiment(
            outer_loop_steps=8, aggregation_strategy="decoupled_diloco",
            decoupled_diloco=dict(DECOUPLED,
                                  outer_gradient_compression="int4",
                                  seeded_init="off")))
        k_sum = summary_of(k_job)
        found = [e["payload"] for e in te.events(k_job)
                 if e["type"] == "training.param_hash_mismatch"]
        last = k_steps[max(k_steps)] if k_steps else {}
        print("a corrupted @init, a kept g off B: %s; resyncs %s, int4 sends "
              "%s, alive %s" % (
            found, k_sum.get("resyncs"), k_sum.get("down_int4_sends"),
            last.get("workers_alive")))
        check(len(found) == 2 and
              all([f["worker_id"]] == omit_id for f in found) and
              found[0]["step"] == 0 and found[1]["step"] >= 1 and
              k_sum.get("resyncs") == 2 and
              k_sum.get("down_int4_sends", 0) > 0 and
              last.get("workers_alive") == 4,
              "a corrupted @init is caught and sent again; @mix_int4's output "
              "hash catches a kept g that differs from B (two mismatches "
              "naming %s, two resyncs, all four alive)" % omit_id)
    finally:
        for proc in extra:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        te.stop_all(nm, gw)
    if gt.FAILURES:
        print("training_decoupled_test: %d failures (logs in %s)" % (
            len(gt.FAILURES), work))
        return 1
    print("training_decoupled_test: all passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
