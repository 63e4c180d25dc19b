#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 17 items 3 and 4 through the real training service: a `pcp
--gateway` and two node managers with one CPU worker each (real IREE, a tiny
char GPT). Worker B runs with the debug hook
PCP_WORKER_TEST_CORRUPT_PARAM=2,7,9: its 2nd, 7th and 9th tasks that hash
their inputs flip one bit of their copy of the global parameters.

  1. classic, on_param_mismatch "resync" (4 outer steps; B's 2nd round is
     corrupted): a "training.param_hash_mismatch" event naming B, step 1
     and both hashes, on the job's events and on /v1/events; the metric
     pcp_training_param_hash_mismatch_total{job} is 1 while it runs (gone
     after, as every {job} series); step 2 averaged one
     worker; steps 3-4 have both workers and no mismatch, and the job JSON's
     param_hash says verified step 3 (the parameters the last round
     carried) with one mismatch: bit-identical again after the resync.
     Worker A never mismatches.
  2. measured bytes: every step's "bytes" has both workers, non-zero in
     and out; the workers' sums equal the gateway link's within framing
     (1%); the totals add up; the history has them as columns; a wider
     model moves more bytes per worker.
  3. classic, "fail" (B's 7th hashed task = step 3): the job fails and its
     error names B and both hashes.
  4. streaming ("resync"; B's 9th = the job's 2nd sync): the mismatch event
     at sync 2, B re-synced (alpha 0 on the gateway's copy), the job
     completes with every later sync verified and no other mismatch; then
     a clean classic (wider model) and a clean streaming run: no mismatch.
Every wait is bounded.
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway_test as gt  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, request, wait_for  # noqa: E402

DATA = te.DATA
MODEL = {"kind": "gpt", "layers": 1, "heads": 2, "kv_heads": 2, "width": 32,
         "vocab": 65, "block_size": 16, "batch": 4}
EVENT = "training.param_hash_mismatch"


def experiment(name, **extra):
    e = {"name": name, "model": MODEL, "data_path": DATA,
         "tokenizer": "char", "sampling": "random", "learning_rate": 0.003,
         "tau": 4, "outer_loop_steps": 4, "nesterov_momentum": 0.0,
         "outer_learning_rate": 1.0, "checkpoint_every": 100, "seed": 3,
         "eval_every": 100, "eval_batches": 1}
    e.update(extra)
    return e


def connected():
    s, r = request("GET", "/v1/workers")
    return [w["worker_id"] for w in r.get("workers", [])
            if w.get("state") == "connected"] if s == 200 else []


def node_manager(work, fabric_port, name, env_extra):
    # POD_NAME makes the two node managers' worker ids distinct.
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN, POD_NAME=name,
               **env_extra)
    return subprocess.Popen(
        [gt.PCP, "--node-manager", "--scale", "1", "--host", "127.0.0.1",
         "--port", str(fabric_port), "--backend", "cpu", "--api-port", "0"],
        env=env, stderr=open(os.path.join(work, name + ".err"), "w"))


# The highest pcp_training_param_hash_mismatch_total{job} seen while the
# job ran (its {job} series are removed when it ends, as the others).
METRIC_SEEN = {}


def run(body, seconds=300):
    job = te.submit(body)
    deadline = time.time() + seconds
    while time.time() < deadline and te.state_of(job) not in (
            "succeeded", "failed", "cancelled"):
        v = metric(job)
        if v is not None:
            METRIC_SEEN[job] = max(v, METRIC_SEEN.get(job, 0))
        time.sleep(0.2)
    te.wait_done(job, 10)
    s, r = request("GET", "/v1/training/jobs/%s" % job)
    return job, r


def mismatches(job):
    return [e["payload"] for e in te.events(job) if e["type"] == EVENT]


def metric(job):
    text = request("GET", "/metrics", raw=True)[1].decode()
    for line in text.splitlines():
        if line.startswith(
                'pcp_training_param_hash_mismatch_total{job="%s"}' % job):
            return float(line.split()[-1])
    return None


def check_bytes(steps, what):
    ok = bool(steps)
    worst = 0.0
    for k, p in sorted(steps.items()):
        b = p.get("bytes") or {}
        per = b.get("per_worker", {})
        ins = sum(v["in"] for v in per.values())
        outs = sum(v["out"] for v in per.values())
        if len(per) != 2 or not all(v["in"] > 0 and v["out"] > 0
                                    for v in per.values()):
            ok = False
        for mine, link in ((ins, b.get("gateway_in", 0)),
                           (outs, b.get("gateway_out", 0))):
            if link <= 0:
                ok = False
                continue
            worst = max(worst, abs(mine - link) / link)
        mean = b.get("per_worker_mean", {})
        if abs(mean.get("out", 0) - outs / 2.0) > 1:
            ok = False
    check(ok and worst <= 0.01,
          "%s: per-step bytes of both workers non-zero, their sums equal "
          "the gateway link's within %.4f%%" % (what, 100 * worst))
    last = steps[max(steps)]
    total = last.get("bytes_total", {})
    check(total.get("gateway_out", 0) >= sum(
        (p.get("bytes") or {}).get("gateway_out", 0) for p in steps.values())
        > 0, "%s: bytes_total covers the steps' bytes: %s" % (what, total))


def main():
    work = tempfile.mkdtemp(prefix="pcp-identity-")
    gw = nm_a = nm_b = None
    try:
        api_port, fabric_port = gt.free_port(), gt.free_port()
        gt.BASE = "http://127.0.0.1:%d" % api_port
        gw = gt.Gateway(work, api_port, fabric_port)
        te.relax_heartbeat(gw)
        gw.start()
        nm_a = node_manager(work, fabric_port, "nm-a", {})
        wait_for(lambda: len(connected()) == 1, 60, "worker A joined")
        ids = connected()
        worker_a = ids[0] if ids else None
        nm_b = node_manager(work, fabric_port, "nm-b",
                            {"PCP_WORKER_TEST_CORRUPT_PARAM": "2,7,9"})
        wait_for(lambda: len(connected()) == 2, 60, "worker B joined")
        rest = [w for w in connected() if w != worker_a]
        worker_b = rest[0] if rest else None
        check(worker_a and worker_b, "two workers: %s %s" % (worker_a,
                                                             worker_b))
        if gt.FAILURES:
            return 1

        # 1. classic, resync.
        a, r = run(experiment("identity-resync"))
        check(r.get("state") == "succeeded",
              "resync job succeeded: %s" % r.get("error", r.get("state")))
        steps = te.steps_of(a)
        found = mismatches(a)
        check(len(found) == 1 and found[0]["worker_id"] == worker_b and
              found[0]["step"] == 1 and found[0]["policy"] == "resync" and
              len(found[0]["worker_sha256"]) == 64 and
              found[0]["worker_sha256"] != found[0]["gateway_sha256"],
              "one mismatch event naming B at step 1 with both hashes: %s" %
              found)
        check(METRIC_SEEN.get(a) == 1 and metric(a) is None,
              "pcp_training_param_hash_mismatch_total{job} was 1 while it "
              "ran, removed after: %s" % METRIC_SEEN.get(a))
        check(sorted(steps) == [1, 2, 3, 4], "4 steps: %s" % sorted(steps))
        if sorted(steps) == [1, 2, 3, 4]:
            check(steps[2]["workers"] == 1 and
                  steps[2]["param_mismatches"] == 1,
                  "step 2 averaged A only (B's work on the bad copy "
                  "dropped)")
            check(all(steps[k]["workers"] == 2 and
                      steps[k]["param_mismatches"] == 0 for k in (1, 3, 4)),
                  "steps 1, 3, 4: both workers, no mismatch")
            ph = steps[4].get("param_hash", {})
            check(ph.get("verified_step") == 3 and
                  len(ph.get("sha256") or "") == 64 and
                  ph.get("mismatches") == 1,
                  "after the resync B matches again: verified step 3: %s" %
                  ph)
            check(steps[3]["param_hash"]["sha256"] !=
                  steps[4]["param_hash"]["sha256"],
                  "each step verifies new parameters")
        progress = r.get("training") or {}
        check((progress.get("param_hash") or {}).get("verified_step") == 3,
              "the job JSON shows the last verified step and hash: %s" %
              progress.get("param_hash"))
        _, sse = gt.sse_read("/v1/events", last_event_id=0, seconds=10,
                             want=lambda evs: any(
                                 e["data"].get("type") == EVENT
                                 for e in evs))
        check(any(e["data"].get("type") == EVENT and
                  e["data"].get("job_id") == a for e in sse),
              "/v1/events carries the mismatch event")

        # 2. measured bytes.
        check_bytes(steps, "classic")
        small = sum(p["bytes"]["per_worker_mean"]["out"]
                    for p in steps.values()) / len(steps)
        s, hist = request("GET", "/v1/training/jobs/%s/history" % a)
        check(s == 200 and hist.get("gateway_out") == [
            steps[k]["bytes"]["gateway_out"] for k in sorted(steps)] and
            all(x > 0 for x in hist.get("per_worker_in", [0])),
            "the history carries the measured bytes per step: %s" %
            {k: hist.get(k) for k in ("gateway_out", "per_worker_in")})

        # 3. classic, fail (B's 7th hashed task: this job's step 3).
        f, r = run(experiment("identity-fail", on_param_mismatch="fail"))
        found = mismatches(f)
        error = str(r.get("error", ""))
        check(r.get("state") == "failed", "fail job failed: %s" %
              r.get("state"))
        check(len(found) == 1 and worker_b in error and
              found[0]["worker_sha256"] in error and
              found[0]["gateway_sha256"] in error,
              "the error names B and both hashes: %s" % error)

        # 4. streaming, resync (B's 9th: this job's 2nd sync).
        s_job, r = run(experiment(
            "identity-streaming", max_epochs=3, outer_loop_steps=100,
            streaming={"num_fragments": 2, "inner_steps": 4,
                       "overlap_tau": 1, "alpha": 0.5}))
        check(r.get("state") == "succeeded",
              "streaming job succeeded: %s" % r.get("error", r.get("state")))
        steps = te.steps_of(s_job)
        found = mismatches(s_job)
        check(len(found) == 1 and found[0]["step"] == 2 and
              found[0]["worker_id"] == worker_b,
              "streaming: one mismatch, B at sync 2: %s" % found)
        last = steps[max(steps)] if steps else {}
        ph = last.get("param_hash", {})
        check(len(steps) == 6 and ph.get("verified_step") == max(steps) and
              ph.get("mismatches") == 1 and
              all(p["workers_received"] == 2 for p in steps.values()),
              "streaming: B re-synced and every later sync verified on both "
              "workers: %s" % ph)
        check_bytes({k: p for k, p in steps.items() if k > 1}, "streaming")

        # Bytes grow with the model (no corruption left).
        wide = dict(MODEL, width=64)
        w_job, r = run(experiment("identity-wide", model=wide,
                                  outer_loop_steps=2))
        steps = te.steps_of(w_job)
        check(r.get("state") == "succeeded" and not mismatches(w_job) and
              steps and all(p["param_hash"]["verified_step"] == k - 1 and
                            p["param_hash"]["mismatches"] == 0
                            for k, p in steps.items()),
              "clean classic run (wider model): every step verified, no "
              "mismatch")
        big = sum(p["bytes"]["per_worker_mean"]["out"]
                  for p in steps.values()) / max(1, len(steps))
        # A whole streaming run with no corruption left: no mismatch, every
        # sync verified.
        c_job, r = run(experiment(
            "identity-streaming-clean", max_epochs=2, outer_loop_steps=100,
            streaming={"num_fragments": 2, "inner_steps": 4,
                       "overlap_tau": 1, "alpha": 0.5}))
        steps = te.steps_of(c_job)
        check(r.get("state") == "succeeded" and not mismatches(c_job) and
              steps and all(p["param_hash"]["verified_step"] == k and
                            p["param_hash"]["mismatches"] == 0
                            for k, p in steps.items()),
              "clean streaming run: every sync verified, no mismatch")
        print("bytes per worker per step: width 32 %.0f, width 64 %.0f" %
              (small, big))
        check(big > 1.5 * small,
              "a wider model moves more bytes per worker (%.0f > 1.5 x %.0f)"
              % (big, small))
    finally:
        for proc in (nm_a, nm_b):
            if proc:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        te.stop_all(None, gw)
    if gt.FAILURES:
        print("training_identity_test: %d failures (logs in %s)" % (
            len(gt.FAILURES), work))
        return 1
    print("training_identity_test: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
