#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 16 Deliver 6: an RL job resumes exactly after a gateway SIGKILL.

A real gateway and two workers (rl_cluster.py) train a small base model
briefly (learning is not what this test measures), then run a GRPO job of
8 iterations with a checkpoint every 2. Once a checkpoint exists and the
next iteration ran, the gateway is SIGKILLed mid-run and restarted on the
same state dir (the workers reconnect). The workers have classes: the
policy is served (rollouts decode) on "gen", the update runs on "train".
Asserted:
  - right after the restart, before the run publishes, the job's "rl"
    object is the checkpoint's (iteration = the checkpoint's, history kept);
  - the iteration never goes back below the checkpoint's (sampled while
    the resumed run works), and the first rl.iteration event after the
    restart is checkpoint + 1 (nothing before it is repeated);
  - the history's points up to the checkpoint are the ones the first run
    published, bit for bit, and the iteration after it, which the killed
    run had done, is done again to the same point bit for bit (same
    prompts, seeds, weights and AdamW state; one update worker);
  - the job succeeds with all 8 iterations, a point for each;
  - the final policy is served on the "gen" worker only.

usage: rl_resume_test.py PCP
"""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rl_cluster as rc  # noqa: E402
from rl_cluster import check  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
ITERATIONS = 8
CHECKPOINT_EVERY = 2


def main():
    work = tempfile.mkdtemp(prefix="pcp-rl-resume-")
    c = rc.Cluster(PCP, work)
    ok = False
    t0 = time.time()
    try:
        # Worker classes (issue 16 Deliver 2): rollouts decode on "gen",
        # the update runs on "train".
        if not c.gateway_start() or not c.workers_start(2, ["gen", "train"]):
            return False
        train_job = c.train_base(steps=4)
        if not train_job:
            return False
        prompts, _ = c.prompts_write()
        experiment = {
            "num_iterations": ITERATIONS, "group_size": 4, "num_prompts": 4,
            "rollout_max_tokens": 16, "learning_rate": 1e-3, "beta": 0.04,
            "temperature": 1.0, "max_off_policy_steps": 0,
            "prompts_path": prompts, "checkpoint_every": CHECKPOINT_EVERY,
            "seed": 5, "reward": {"type": "contains", "text": "e"},
            "base_model": {"train_job": train_job, "spec": rc.SPEC},
            "rollout_worker_class": "gen", "trainer_worker_class": "train",
            "served_model_name": "rl-resume"}
        status, job = c.request("POST", "/v1/rl/jobs", experiment)
        check(status == 202, "rl job accepted: %s %s" %
              (status, job.get("job_id") or job))
        job_id = job.get("job_id")
        if not job_id:
            return False

        def past_checkpoint():
            rl = c.request("GET", "/v1/rl/jobs/%s" % job_id)[1].get("rl") or {}
            ckpt = rl.get("checkpoint_iteration")
            if ckpt and rl.get("iteration", 0) > ckpt:
                return rl
            return None
        before = rc.wait_for(past_checkpoint, 600,
                             "a checkpoint and the iteration after it",
                             interval=0.1)
        if not before:
            return False
        c.gateway_kill()
        ckpt = before["checkpoint_iteration"]
        print("SIGKILL at iteration %d, checkpoint %d" %
              (before["iteration"], ckpt), flush=True)
        kept = [p for p in before["history"] if p["iteration"] <= ckpt]
        if not c.gateway_start():
            return False
        status, body = c.request("GET", "/v1/rl/jobs/%s" % job_id)
        rl = body.get("rl") or {}
        check(status == 200 and rl.get("iteration", -1) >= ckpt,
              "after the restart the job shows iteration %s >= the "
              "checkpoint's %d (not 0)" % (rl.get("iteration"), ckpt))
        c.workers_wait(2)
        lowest = None
        deadline = time.time() + 600
        while time.time() < deadline:
            _, body = c.request("GET", "/v1/rl/jobs/%s" % job_id)
            rl = body.get("rl") or {}
            if rl.get("iteration") is not None:
                lowest = rl["iteration"] if lowest is None else min(
                    lowest, rl["iteration"])
            if body.get("state") in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.2)
        check(body.get("state") == "succeeded",
              "the resumed job succeeded: %s %s" %
              (body.get("state"), body.get("error")))
        check(lowest is not None and lowest >= ckpt,
              "the iteration never went below the checkpoint's %d "
              "(lowest seen %s)" % (ckpt, lowest))
        rl = body.get("rl") or {}
        history = rl.get("history") or []
        check(rl.get("iteration") == ITERATIONS and
              [p["iteration"] for p in history] ==
              list(range(1, ITERATIONS + 1)),
              "all %d iterations, one point each: %s" %
              (ITERATIONS, [p["iteration"] for p in history]))
        check(history[:len(kept)] == kept,
              "the %d points up to the checkpoint are kept bit for bit" %
              len(kept))
        # The iteration the killed run did after the checkpoint, done again
        # from the checkpoint: the same prompts, rollout seeds and weights,
        # so the same rewards and the same update.
        redone = [p for p in before["history"] if p["iteration"] == ckpt + 1]
        again = [p for p in history if p["iteration"] == ckpt + 1]
        check(redone and again and redone[0] == again[0],
              "iteration %d redone after the restart is the same point (its "
              "rewards, and the update's KL and clip fraction, bit for bit): "
              "%s vs %s" % (ckpt + 1, redone, again))
        _, events = c.request("GET", "/v1/jobs/%s/events" % job_id)
        evs = events.get("events", [])
        # The recovery's transition back to queued marks the restart.
        requeued = [i for i, e in enumerate(evs) if e.get("type") == "state"
                    and e.get("to") == "queued"]
        after = [e for e in evs[requeued[-1]:] if e.get("type") ==
                 "rl.iteration"] if requeued else []
        first = ((after[0].get("payload") or {}).get("iteration")
                 if after else None)
        check(first == ckpt + 1,
              "the first iteration after the restart is %d: %s" %
              (ckpt + 1, first))
        _, models = c.request("GET", "/v1/models")
        served = [m for m in models.get("data", [])
                  if m.get("id") == "rl-resume"]
        check(served and served[0].get("worker_class") == "gen" and
              served[0].get("workers") == 1 and
              served[0].get("outer_step") == ITERATIONS,
              "the policy is served on the gen worker only, at version %d: "
              "%s" % (ITERATIONS, served))
        print("wall time %.0f s" % (time.time() - t0))
        ok = True
    finally:
        c.stop()
        if rc.FAILURES or not ok:
            print("logs kept in", work)
            c.logs()
        else:
            rc.remove(work)
    return ok and not rc.FAILURES


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
