#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Decoupled DiLoCo with seeded init (issue 17, decoupled_diloco.seeded_init):
a real gateway and three CPU workers on 127.0.0.1, the smallest char GPT.

A fresh start's @init of each fragment goes down as "init" tensor refs
(init kind, seed, index, dtype, shape): each learner draws the initial
parameters itself with the gateway's own initializer instead of receiving
4 bytes a value, and the @init's input hash proves it holds the gateway's
masters bit for bit.

- Worker 3 runs with PCP_WORKER_TEST_INIT_SKEW=1 (every tensor it fills
  from an init ref has one bit flipped, as a worker whose libm draws other
  bits would): its first seeded @init mismatches, is counted as a
  fallback (not as a bit-identity mismatch or a resync: an expected
  fallback is no failure) and sent again with the values; its second
  fragment goes with values at once (one fallback turns seeded off for
  that learner); the values verify, it stays a learner and the job
  succeeds with every later @mix verified (so it then held the masters bit
  for bit).
- seeded_init other than "auto" or "off" is refused (400 naming the key).
- Runs A (seeded_init auto, the default) and B (seeded_init "off") on the
  same three warm workers (the first job uploaded the programs): A's
  seeded @init count is 2 fragments x 2 learners + 1, B's 0; no mismatch on
  the two normal workers; per normal worker, GET /v1/workers
  bytes_to_worker over A is at least 3N bytes lower than over B (N
  parameters: B ships them as 4N bytes of f32), and the skewed worker's
  bytes differ by far less than that (it got the values in both).
- Job F: the skewed worker is replaced by one run with
  PCP_WORKER_TEST_INIT_SKEW=fail (its seeded @init fails on the worker,
  as on a build before the ref kind): that @init falls back to values, the
  learner is not lost (all three merge every round), 5 seeded, 1
  fallback, no mismatch.
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway_test as gt  # noqa: E402
import training_decoupled_test as td  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, request, wait_for  # noqa: E402

STEPS = 8  # two syncs per fragment (H = 4, P = 2)


def connected():
    s, r = request("GET", "/v1/workers")
    return sorted(w["worker_id"] for w in r.get("workers", [])
                  if w.get("state") == "connected") if s == 200 else []


def bytes_to_workers():
    s, r = request("GET", "/v1/workers")
    return {w["worker_id"]: w["bytes_to_worker"]
            for w in r.get("workers", [])} if s == 200 else {}


def job_body(**decoupled):
    return td.experiment(outer_loop_steps=STEPS,
                         aggregation_strategy="decoupled_diloco",
                         decoupled_diloco=dict(td.DECOUPLED, **decoupled))


def run_measured(body):
    before = bytes_to_workers()
    job, steps, wall = td.run(body, 600)
    after = bytes_to_workers()
    s, r = request("GET", "/v1/training/jobs/%s" % job)
    n = (r.get("training") or {}).get("parameter_count", 0)
    sent = {w: after[w] - before.get(w, 0) for w in after}
    return job, steps, td.summary_of(job), sent, n, wall


def stop(p):
    if p:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def start_skewed(work, port, mode, name):
    return subprocess.Popen(
        [gt.PCP, "--node-manager", "--scale", "1", "--host", "127.0.0.1",
         "--port", str(port), "--backend", "cpu",
         "--api-port", "0"],
        env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN, POD_NAME=name,
                 PCP_WORKER_TEST_INIT_SKEW=mode),
        stderr=open(os.path.join(work, name + ".err"), "w"))


def main():
    work = tempfile.mkdtemp(prefix="pcp-seeded-")
    gw = nm = skew = None
    try:
        gw, nm = te.start_cluster(work)
        if gt.FAILURES:
            return 1
        normal = connected()
        skew = start_skewed(work, gw.fabric_port, "1", "nm-skew")
        wait_for(lambda: len(connected()) == 3, 90, "a third (skewed) worker")
        skewed = sorted(set(connected()) - set(normal))
        check(len(normal) == 2 and len(skewed) == 1,
              "two normal workers %s and a skewed one %s" % (normal, skewed))

        for bad in ("on", True, 1):
            s, r = request("POST", "/v1/training/jobs",
                           job_body(seeded_init=bad))
            check(s == 400 and "seeded_init" in str(r),
                  "seeded_init %r refused with 400 naming the key: %s %s" % (
                      bad, s, r))

        # Job K: the skewed worker's first seeded @init mismatches and is
        # sent again with values, its second goes with values at once; it
        # stays a learner to the end, and nothing counts as a mismatch.
        k_job, k_steps, k_sum, _, n, k_wall = run_measured(job_body())
        found = [e["payload"] for e in te.events(k_job)
                 if e["type"] == "training.param_hash_mismatch"]
        ph = k_sum.get("param_hash") or {}
        last = k_steps[max(k_steps)] if k_steps else {}
        print("skewed worker: %.1f s, mismatches %s, summary seeded %s "
              "fallbacks %s resyncs %s, alive %s" % (
                  k_wall, [(f["worker_id"], f["step"]) for f in found],
                  k_sum.get("seeded_inits"),
                  k_sum.get("seeded_init_fallbacks"), k_sum.get("resyncs"),
                  last.get("workers_alive")))
        check(k_sum.get("seeded_inits") == 2 * 2 + 1 and
              k_sum.get("seeded_init_fallbacks") == 1 and
              k_sum.get("resyncs") == 0 and len(found) == 0,
              "the skewed worker's first seeded @init fell back once, its "
              "second went with values (5 seeded, 1 fallback, no mismatch "
              "event, no resync)")
        check(last.get("workers_alive") == 3 and
              all(sorted(p["participants"]) == [1, 2, 3]
                  for p in k_steps.values()) and
              (ph.get("mismatches") or 0) == 0 and
              ph.get("verified_step") == max(
                  p["syncer_step"] for p in k_steps.values()),
              "the values re-sent verified: all three learners merged every "
              "round and the last sync's @mix hashes verified: %s" % ph)

        # Runs A (seeded) and B (values) on warm workers.
        a_job, a_steps, a_sum, a_sent, n, a_wall = run_measured(job_body())
        b_job, b_steps, b_sum, b_sent, _, b_wall = run_measured(
            job_body(seeded_init="off"))
        print("seeded: %.1f s, %d syncs, summary seeded %s fallbacks %s" % (
            a_wall, len(a_steps), a_sum.get("seeded_inits"),
            a_sum.get("seeded_init_fallbacks")))
        print("values: %.1f s, %d syncs, summary seeded %s" % (
            b_wall, len(b_steps), b_sum.get("seeded_inits")))
        check(a_sum.get("seeded_inits") == 5 and
              a_sum.get("seeded_init_fallbacks") == 1 and
              b_sum.get("seeded_inits") == 0 and
              b_sum.get("seeded_init_fallbacks") == 0,
              "A sent 5 seeded @init (1 fell back), B none")
        check(len(a_steps) == len(b_steps) == STEPS // 2,
              "both ran every sync (%d, %d)" % (len(a_steps), len(b_steps)))
        print("N = %d parameters (4N = %d bytes)" % (n, 4 * n))
        for w in normal + skewed:
            print("BYTES to %s: seeded %d, values %d, saved %d (%.2f x 4N)" % (
                w, a_sent.get(w, 0), b_sent.get(w, 0),
                b_sent.get(w, 0) - a_sent.get(w, 0),
                (b_sent.get(w, 0) - a_sent.get(w, 0)) / (4.0 * n or 1)))
        check(n > 0 and all(b_sent.get(w, 0) - a_sent.get(w, 0) >= 3 * n
                            for w in normal),
              "each normal worker received at least 3N bytes fewer with "
              "seeded init")
        check(all(abs(b_sent.get(w, 0) - a_sent.get(w, 0)) < n
                  for w in skewed),
              "the skewed worker got the values in both runs")

        # Job F: a worker whose seeded @init fails (as a build before the
        # ref kind) gets the values; it is not lost.
        stop(skew)
        skew = None
        wait_for(lambda: len(connected()) == 2, 60, "the skewed worker gone")
        skew = start_skewed(work, gw.fabric_port, "fail", "nm-skew-fail")
        wait_for(lambda: len(connected()) == 3, 90, "a failing worker")
        f_job, f_steps, f_sum, _, _, f_wall = run_measured(job_body())
        fph = f_sum.get("param_hash") or {}
        flast = f_steps[max(f_steps)] if f_steps else {}
        print("failing worker: %.1f s, summary seeded %s fallbacks %s "
              "resyncs %s, alive %s, participants %s" % (
                  f_wall, f_sum.get("seeded_inits"),
                  f_sum.get("seeded_init_fallbacks"), f_sum.get("resyncs"),
                  flast.get("workers_alive"),
                  [p["participants"] for p in f_steps.values()]))
        check(f_sum.get("seeded_inits") == 5 and
              f_sum.get("seeded_init_fallbacks") == 1 and
              f_sum.get("resyncs") == 0 and
              (fph.get("mismatches") or 0) == 0 and
              flast.get("workers_alive") == 3 and
              len(f_steps) == STEPS // 2 and
              all(sorted(p["participants"]) == [1, 2, 3]
                  for p in f_steps.values()),
              "a seeded @init the worker failed fell back to values (5 "
              "seeded, 1 fallback) and all three learners merged every "
              "round")
    finally:
        stop(skew)
        te.stop_all(nm, gw)
    if gt.FAILURES:
        print("training_decoupled_seeded_test: %d failures (logs in %s)" % (
            len(gt.FAILURES), work))
        return 1
    print("training_decoupled_seeded_test: all passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
