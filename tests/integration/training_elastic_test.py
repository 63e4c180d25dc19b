#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Elastic streaming DiLoCo (issue 17 Deliver 2): a real gateway, a node
manager with two CPU workers and a third worker started by the test under a
fixed id (PCP_WORKER_ID) and another target ("host": a second (backend,
target) kind, its programs compiled when it joins), a small char GPT, P=2 fragments, H=10, tau=1 and
alpha=0, so a fragment's receive makes every worker's snapshot of it equal
to the masters, bit for bit.

  1. the third worker joins mid-run: a sync event names it in
     workers_joined, participants are 3 from then on, its own local loss is
     reported (worker_losses), and every checkpoint's worker state file
     (p, m, v, s per live worker) holds 3 workers whose snapshots are equal
     to the others' byte for byte (its state came from the masters and it
     took part in the syncs);
  2. it is SIGKILLed: a sync event names it in workers_left, the rounds it
     was in count their dropped contributions (fragment_replanned), the run
     goes on with 2 participants (a checkpoint of 2 workers);
  3. restarted under the same id it joins again (participants 3) and the
     job succeeds with every sync reported.
Every wait is bounded.
"""
import re
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway_test as gt  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, request, wait_for  # noqa: E402

ROUNDS = int(os.environ.get("PCP_ELASTIC_ROUNDS", "20"))
STREAMING = {"num_fragments": 2, "inner_steps": 10, "overlap_tau": 1,
             "alpha": 0.0}
# The smallest model of the training tests: a sync is a few local steps of
# tiny tasks, so the run is paced by the fabric, not the compute.
MODEL = {"kind": "gpt", "layers": 1, "heads": 4, "width": 32, "vocab": 65,
         "block_size": 32, "batch": 4}
THIRD = "elastic-third"


def start_third(work, fabric_port):
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN,
               PCP_WORKER_ID=THIRD)
    return subprocess.Popen(
        [gt.PCP, "--worker", "--connect", "127.0.0.1:%d" % fabric_port,
         "--backend", "cpu", "--target", "host", "--cache-dir", os.path.join(work, "third-cache")],
        env=env, stderr=open(os.path.join(work, "third.err"), "a"))


def sync_events(job):
    return [e["payload"] for e in te.events(job)
            if e["type"] == "training.step"]


def first_sync(job, pred):
    """The first sync event satisfying pred, or None."""
    for p in sync_events(job):
        if pred(p):
            return p
    return None


def main():
    work = tempfile.mkdtemp(prefix="pcp-elastic-")
    gw = nm = third = None
    try:
        gw, nm = te.start_cluster(work)
        if gt.FAILURES:
            return 1
        job = te.submit(te.experiment(model=MODEL, max_epochs=ROUNDS,
                                      checkpoint_every=2,
                                      streaming=STREAMING))
        t0 = time.time()
        # 1. A third worker joins after sync 2.
        wait_for(lambda: 2 in te.steps_of(job), 300, "sync 2 reported")
        third = start_third(work, gw.fabric_port)
        joined = wait_for(lambda: first_sync(
            job, lambda p: THIRD in p.get("workers_joined", [])), 300,
            "a sync event names %s joined" % THIRD)
        j = first_sync(job, lambda p: THIRD in p.get("workers_joined", []))
        with open(os.path.join(work, "gw%d.err" % gw.starts)) as f:
            log = f.read()
        check(re.search(r'compiling label=%s program=train backend=cpu '
                        r'target=host ' % job, log) is not None,
              "the train module compiled for the joiner's kind (cpu, host)")
        check(j is not None and len(j["participants"]) == 3 and
              THIRD in j["participants"] and j["workers_received"] == 3,
              "joined: participants 3 at sync %s: %s" % (
                  j and j["outer_step"], j and j["participants"]))
        # Three syncs with it (its loss reported, a checkpoint of 3 workers
        # complete), then SIGKILL it.
        wait_for(lambda: any(p["outer_step"] >= j["outer_step"] + 3
                             for p in sync_events(job)), 120,
                 "three syncs after the join")
        with3 = [p for p in sync_events(job)
                 if p["outer_step"] > j["outer_step"]]
        check(with3 and all(len(p["participants"]) == 3 for p in with3) and
              all(isinstance(p["worker_losses"].get(THIRD), float)
                  for p in with3),
              "the third worker takes part, its own loss reported: %s" % [
                  p["worker_losses"] for p in with3])
        time.sleep(0.3)
        third.send_signal(signal.SIGKILL)
        third.wait()
        kill_sync = max(te.steps_of(job))
        left = wait_for(lambda: first_sync(
            job, lambda p: THIRD in p.get("workers_left", [])), 120,
            "a sync event names %s left" % THIRD)
        lp = first_sync(job, lambda p: THIRD in p.get("workers_left", []))
        # Three syncs with the two others (a checkpoint of 2 workers), then
        # restart it under the same id.
        wait_for(lambda: any(p["outer_step"] >= lp["outer_step"] + 3
                             for p in sync_events(job)), 120,
                 "three syncs after the loss")
        events = sync_events(job)
        after = [p for p in events if p["outer_step"] >= lp["outer_step"]]
        dropped = [(p["outer_step"], p["fragment"], p["contributions_dropped"])
                   for p in events if p["outer_step"] > kill_sync - 1 and
                   p["contributions_dropped"]]
        print("killed after sync %d; left at sync %d; dropped %s" % (
            kill_sync, lp["outer_step"], dropped))
        check(left and all(len(p["participants"]) == 2 and
                           THIRD not in p["participants"] for p in after),
              "lost: participants 2 from sync %d: %s" % (
                  lp["outer_step"], [p["participants"] for p in after]))
        check(dropped and all(p["fragment_replanned"] for p in events
                              if p["contributions_dropped"]) and
              all(n <= 1 for _, _, n in dropped),
              "the lost worker's rounds in flight closed without it, its "
              "contribution dropped and counted: %s" % dropped)
        third = start_third(work, gw.fabric_port)
        wait_for(lambda: first_sync(
            job, lambda p: p["outer_step"] > lp["outer_step"] and
            THIRD in p.get("workers_joined", [])), 120,
            "the restarted worker rejoins")
        rj = first_sync(job, lambda p: p["outer_step"] > lp["outer_step"] and
                        THIRD in p.get("workers_joined", []))
        check(rj is not None and len(rj["participants"]) == 3,
              "restarted: participants 3 again at sync %s" % (
                  rj and rj["outer_step"]))
        te.wait_done(job, 600)
        wall = time.time() - t0
        s, r = request("GET", "/v1/training/jobs/%s" % job)
        check(r.get("state") == "succeeded", "elastic job succeeded: %s %s" % (
            r.get("state"), r.get("error")))
        steps = te.steps_of(job)
        check(sorted(steps) == list(range(1, 2 * ROUNDS + 1)),
              "every sync reported: %s" % sorted(steps))
        final = steps.get(2 * ROUNDS, {})
        check(len(final.get("participants", [])) == 3,
              "three participants at the end: %s" % final.get("participants"))
        # Worker state files: per checkpoint, every live worker's snapshots
        # equal (alpha 0: each fragment's last receive set them to the
        # masters; the joiners' came from the masters).
        n = r["training"]["parameter_count"]
        counts = []
        for e in te.events(job):
            if e["type"] != "checkpoint":
                continue
            path = e["payload"]["path"]
            k = int(path.rsplit("step-", 1)[1].split(".")[0])
            side = os.path.join(work, "state", os.path.dirname(path),
                                "stream-%020d.workers" % k)
            if not os.path.exists(side):
                check(False, "sync %d: worker state file %s" % (k, side))
                continue
            with open(side, "rb") as f:
                data = f.read()
            workers = len(data) // (16 * n)
            snaps = [data[(w * 4 + 3) * n * 4:(w * 4 + 4) * n * 4]
                     for w in range(workers)]
            check(len(data) == workers * 16 * n and workers >= 2 and
                  all(x == snaps[0] for x in snaps),
                  "sync %d: %d workers' snapshots equal byte for byte" % (
                      k, workers))
            counts.append((k, workers))
        print("checkpoints (sync, workers): %s; %.1f s" % (counts, wall))
        check(any(w == 3 for k, w in counts if k < kill_sync) and
              any(w == 2 for _, w in counts) and counts and
              counts[-1][1] == 3,
              "checkpoints with 3 workers (joined), 2 (lost) and 3 "
              "(rejoined): %s" % counts)
    finally:
        if third and third.poll() is None:
            third.kill()
            third.wait()
        te.stop_all(nm, gw)
    if gt.FAILURES:
        print("training_elastic_test: %d failures (logs in %s)" % (
            len(gt.FAILURES), work))
        return 1
    print("training_elastic_test: all passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
