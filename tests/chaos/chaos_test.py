#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Chaos for training (issue 17 Deliver 6): a real gateway and
`pcp --node-manager --scale 8` with eight CPU workers train the smallest
char GPT while a seeded schedule SIGKILLs a random worker every PERIOD
seconds (the node manager restarts it, so the fleet comes back) and
SIGSTOPs another for STOP seconds (with 1 s heartbeats it is evicted after
3 s and rejoins on SIGCONT), for each training mode the service has:
classic DiLoCo, streaming DiLoCo and decoupled DiLoCo (when the service
accepts it).

Per mode it checks and prints: the job completes with every outer step /
fragment sync reported; no round took longer than its bound (the round's
own median plus the waits a chaos event may legitimately add: eviction
3 x heartbeat, the stop, the service's 15 s worker grace, see ROUND_BOUND);
no task wait hit its deadline (the gateway's log); goodput = tokens merged
into the global model / tokens computed, the service's own counters for
every mode (the job's tokens_merged / tokens_computed, docs/training.md
"Goodput"), asserted >= 0.90 for decoupled DiLoCo (the issue's goal) in
the short and the long run, printed for all (classic's merged tokens also
checked against its step events); the live workers' global parameters
bit-identical (the job's param_hash, where the service reports it: no
mismatch over the run); the fleet back at eight workers at the end.

The schedule is a function of the seed (PCP_CHAOS_SEED, default 17,
printed with every action) so a failure reproduces: the same slots are
killed and stopped at the same offsets from the start of training.

Short (make test): two to three modes in about 2.5 minutes on an idle
2-core machine. Long: `--long` or PCP_CHAOS_LONG=1 (about 4 minutes of
chaos per mode, larger jobs). PCP_CHAOS_MODES=classic,streaming picks
modes; PCP_CHAOS_KEEP=1 keeps the logs and the gateway's state of a
passing run.
"""
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

# --long is ours; gateway_test reads the pcp binary from argv[1] on import.
LONG = "--long" in sys.argv or os.environ.get("PCP_CHAOS_LONG") == "1"
sys.argv = [a for a in sys.argv if a != "--long"]
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import gateway_test as gt  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, request, wait_for  # noqa: E402

SEED = int(os.environ.get("PCP_CHAOS_SEED", "17"))
WORKERS = 8
PERIOD = 15.0  # seconds between chaos ticks (a kill and a stop each)
FIRST = 4.0  # the first tick, seconds after the job's first step event
STOP = 5.0  # SIGSTOP length
HEARTBEAT_MS = 1000
# The service's wait for the previous round's worker count
# (WORKER_GRACE_MS in src/workloads/train/service_impl.h).
WORKER_GRACE_S = 15.0
MODES_ALL = ["classic", "streaming", "decoupled"]

# The smallest char GPT the service takes that still learns: one layer of
# width 32, blocks of 32, batch 4 (8 workers share 2 cores).
MODEL = {"kind": "gpt", "layers": 1, "heads": 2, "kv_heads": 2,
         "width": 32, "vocab": 65,
         "block_size": 32, "batch": 4}
# Classic: tau 40 so a worker spends most of a round computing and a kill
# or a stop usually lands on a task in flight.
TAU = 40
# Sized so a mode trains for about 35-45 s under chaos on an idle 2-core
# machine (short) or about 4 minutes (long).
# (Measured at load 20: a classic round of tau 40 on 8 workers ~0.4 s, a
# streaming local step ~0.02 s; a kill adds the restart to the next round.)
CLASSIC_STEPS = 600 if LONG else 80
STREAM_H = 25
STREAM_ROUNDS = 400 if LONG else 70
STREAMING = {"num_fragments": 2, "inner_steps": STREAM_H, "overlap_tau": 1,
             "alpha": 0.5}
# Decoupled (the service's keys as in docs/training.md "In the training
# service"): the same fragments and interval as streaming, each learner
# runs outer_loop_steps local steps; rounds close on a quorum of 1 plus a
# 2 s grace (adaptive grace off: the grace bound is the window).
DECOUPLED_STEPS = STREAM_ROUNDS * STREAM_H
DECOUPLED = {"num_fragments": 2, "sync_interval_h": STREAM_H,
             "overlap_tau": 1, "min_quorum": 1, "grace_window_ms": 2000,
             "adaptive_grace_enabled": False}


def experiment(mode):
    e = {"name": "chaos-%s" % mode, "model": dict(MODEL),
         "data_path": te.DATA, "tokenizer": "char", "sampling": "random",
         "learning_rate": 0.003, "tau": TAU,
         "nesterov_momentum": 0.0, "outer_learning_rate": 1.0,
         "checkpoint_every": 1000, "seed": SEED}
    if mode == "classic":
        e["outer_loop_steps"] = CLASSIC_STEPS
        # The long run's 600 rounds of 8 x tau x B x T tokens pass over the
        # train split about 24 times: max_epochs (default 10) must not end
        # it first (it did, at step 247).
        e["max_epochs"] = 1000
    elif mode == "streaming":
        e["max_epochs"] = STREAM_ROUNDS
        e["streaming"] = dict(STREAMING)
    else:
        e["outer_loop_steps"] = DECOUPLED_STEPS
        e["aggregation_strategy"] = "decoupled_diloco"
        e["decoupled_diloco"] = dict(DECOUPLED)
    return e


def all_events(job_id):
    """Every event of the job (the API pages at 1,000)."""
    out, after = [], 0
    while True:
        s, r = request("GET", "/v1/jobs/%s/events?after=%d" % (job_id, after))
        if s != 200:
            return out
        out += r.get("events", [])
        if not r.get("more") or not r.get("events"):
            return out
        after = r["events"][-1]["event_id"]


def steps_of(job_id):
    """{outer_step: payload} of the last training.step event per step."""
    return {e["payload"]["outer_step"]: e["payload"]
            for e in all_events(job_id) if e["type"] == "training.step"}


def schedule(seed, ticks):
    """[(offset_s, kill_slot, stop_slot)]: a pure function of the seed."""
    rng = random.Random(seed)
    out = []
    for k in range(ticks):
        kill = rng.randrange(WORKERS)
        stop = rng.choice([s for s in range(WORKERS) if s != kill])
        out.append((FIRST + k * PERIOD, kill, stop))
    return out


class Chaos:
    """Runs the schedule against the node manager's workers from t0 on;
    step() is called from the test's poll loop (no threads: a SIGSTOPped
    worker is continued by the same loop, and always on exit)."""

    def __init__(self, nm_err, plan, t0, log):
        self.nm_err, self.plan, self.t0, self.log = nm_err, plan, t0, log
        self.next = 0
        self.stopped = []  # [(pid, resume_at)]
        self.kills = self.stops = 0
        self.killed_pids = []

    def say(self, what):
        line = "chaos seed=%d t=%6.2fs %s" % (SEED, time.time() - self.t0,
                                              what)
        print(line)
        self.log.append(line)

    def step(self):
        now = time.time()
        for pid, at in list(self.stopped):
            if now >= at:
                self.resume(pid)
        while (self.next < len(self.plan) and
               now - self.t0 >= self.plan[self.next][0]):
            _, kill, stop = self.plan[self.next]
            self.next += 1
            pids = te.worker_pids(self.nm_err)
            stopped = {p for p, _ in self.stopped}
            pid = pids.get(kill)
            if pid and pid not in stopped and signal_ok(pid, signal.SIGKILL):
                self.kills += 1
                self.killed_pids.append(pid)
                self.say("SIGKILL slot %d pid %d" % (kill, pid))
            else:
                self.say("SIGKILL slot %d: no live pid (%s)" % (kill, pid))
            pid = pids.get(stop)
            if pid and pid not in stopped and signal_ok(pid, signal.SIGSTOP):
                self.stops += 1
                self.stopped.append((pid, now + STOP))
                self.say("SIGSTOP slot %d pid %d for %.0f s" % (stop, pid,
                                                                 STOP))
            else:
                self.say("SIGSTOP slot %d: no live pid (%s)" % (stop, pid))

    def resume(self, pid):
        self.stopped = [(p, a) for p, a in self.stopped if p != pid]
        signal_ok(pid, signal.SIGCONT)
        self.say("SIGCONT pid %d" % pid)

    def finish(self):
        for pid, _ in list(self.stopped):
            self.resume(pid)


def signal_ok(pid, sig):
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def tokens_per_step():
    return MODEL["batch"] * MODEL["block_size"]


def round_bound(seconds):
    """The longest a round may take under this schedule: its run's median
    round, plus a stopped worker's eviction (3 heartbeats) and the stop
    itself, plus the service's worker grace (a round after a kill waits up
    to 15 s for the previous round's count), plus 50% of the median for
    the shared machine."""
    med = statistics.median(seconds) if seconds else 0
    return 1.5 * med + 3 * HEARTBEAT_MS / 1000.0 + STOP + WORKER_GRACE_S


def lost_tasks():
    s, text = request("GET", "/metrics", raw=True)[:2]
    m = re.search(r"^pcp_training_lost_tasks_total (\S+)$",
                  text.decode(errors="replace"), re.M) if s == 200 else None
    return float(m.group(1)) if m else 0.0


def decoupled_served(job):
    """main accepts unknown experiment keys (logged), so an
    aggregation_strategy the service does not implement runs as classic
    DiLoCo: the decoupled mode is there when its first step event carries
    its goodput counters (tokens_computed / tokens_merged). When not, the
    job is cancelled and the mode printed as absent (not a pass)."""
    wait_for(lambda: steps_of(job) or te.state_of(job) in
             ("succeeded", "failed", "cancelled"), 300, "decoupled: first step")
    steps = steps_of(job)
    first = steps[min(steps)] if steps else {}
    if "tokens_computed" in first or "tokens_merged" in first:
        return True
    request("POST", "/v1/jobs/%s/cancel" % job)
    te.wait_done(job, 60)
    print("decoupled: NOT SERVED by this build (aggregation_strategy "
          "\"decoupled_diloco\" ran as %s: no tokens_computed in its step "
          "events); job cancelled, not counted" % (
              "streaming" if first.get("streaming") else "classic"))
    return False


def run_mode(mode, work, nm_err, gw_err_path):
    """One job under chaos; returns its table row (dict) or None when the
    service does not serve the mode."""
    body = experiment(mode)
    s, r = request("POST", "/v1/training/jobs", body)
    if s != 202:
        msg = r.get("error", {}).get("message") if isinstance(r, dict) else r
        if mode == "decoupled" and s == 400 and (
                "aggregation_strategy" in str(msg) or
                "decoupled_diloco" in str(msg)):
            print("decoupled: not served by this build (400: %s)" % msg)
            return None
        check(False, "%s job accepted: %s %s" % (mode, s, r))
        return None
    job = r["job_id"]
    t_submit = time.time()
    lost0 = lost_tasks()
    if mode == "decoupled" and not decoupled_served(job):
        return None
    # The schedule starts with training (after the programs compiled and
    # the first step event), so compile time does not eat the chaos.
    wait_for(lambda: steps_of(job) or te.state_of(job) in
             ("succeeded", "failed", "cancelled"), 300,
             "%s: first step" % mode)
    t0 = time.time()
    horizon = 300 if LONG else 60
    plan = schedule(SEED + MODES_ALL.index(mode),
                    int((horizon - FIRST) // PERIOD) + 1)
    print("%s: job %s, compile+first step %.1f s, schedule (offset s, kill "
          "slot, stop slot): %s" % (mode, job, t0 - t_submit, plan))
    log = []
    chaos = Chaos(nm_err, plan, t0, log)
    deadline = t0 + horizon * 4
    try:
        while time.time() < deadline:
            if te.state_of(job) in ("succeeded", "failed", "cancelled"):
                break
            chaos.step()
            time.sleep(0.1)
    finally:
        chaos.finish()
    wall = time.time() - t0
    s, j = request("GET", "/v1/training/jobs/%s" % job)
    state = j.get("state")
    check(state == "succeeded", "%s: job completed under chaos: %s %s" % (
        mode, state, j.get("error")))
    steps = steps_of(job)
    # Decoupled: one event per closed round, as many as the job reports.
    total = j.get("training", {}).get("outer_step")
    if mode == "classic":
        total = CLASSIC_STEPS
    elif mode == "streaming":
        total = STREAMING["num_fragments"] * STREAM_ROUNDS
    check(sorted(steps) == list(range(1, (total or 0) + 1)),
          "%s: every outer step / sync reported (%d of %s)" % (
              mode, len(steps), total))
    check(chaos.kills >= 1 and chaos.stops >= 1,
          "%s: the schedule killed (%d) and stopped (%d) workers while the "
          "job ran" % (mode, chaos.kills, chaos.stops))
    # The first step includes the programs' compile: not a chaos round.
    seconds = [p["seconds"] for k, p in steps.items()
               if k > 1 and "seconds" in p]
    bound = round_bound(seconds)
    slow = {k: p["seconds"] for k, p in steps.items()
            if k > 1 and p.get("seconds", 0) > bound}
    if mode == "decoupled":
        # A decoupled round closes at its quorum plus the grace it used:
        # never more than the window (adaptive grace is off).
        window = DECOUPLED["grace_window_ms"]
        over = {k: p.get("grace_ms") for k, p in steps.items()
                if p.get("grace_ms", 0) > window}
        check(not over, "decoupled: no round's grace past %d ms: %s" % (
            window, over))
    check(not slow, "%s: no round past its bound %.1f s: %s" % (
        mode, bound, slow))
    # A task wait that reached its deadline is logged by the service.
    with open(gw_err_path, errors="replace") as f:
        gw_log = f.read()
    blocked = [ln for ln in gw_log.splitlines()
               if job in ln and "DEADLINE_EXCEEDED" in ln]
    check(not blocked, "%s: no task wait reached its deadline: %s" % (
        mode, blocked[:3]))
    training = j.get("training", {})
    lost = lost_tasks() - lost0
    # Goodput: the service's running totals (the job's progress, else its
    # last event), the same fields in every mode.
    last_ev = steps[max(steps)] if steps else {}
    merged = training.get("tokens_merged", last_ev.get("tokens_merged"))
    computed = training.get("tokens_computed", last_ev.get("tokens_computed"))
    check(merged is not None and computed,
          "%s: tokens_merged / tokens_computed reported: %s" % (
              mode, {k: training.get(k) for k in ("tokens_merged",
                                                  "tokens_computed")}))
    merged = merged or 0
    goodput = merged / computed if computed else 0.0
    check(computed and 0 < merged <= computed,
          "%s: 0 < tokens merged %s <= computed %s" % (mode, merged,
                                                       computed))
    if mode == "classic":
        # Every averaged task merged tau x B x T tokens; every submitted one
        # computed as much, plus the tasks of rounds that ended with no
        # reporter (repeated without an event): lost tasks bound those.
        task = TAU * tokens_per_step()
        want = sum(p["workers"] for p in steps.values()) * task
        submitted = sum(p.get("workers_submitted", p["workers"])
                        for p in steps.values()) * task
        check(merged == want and
              submitted <= computed <= submitted + int(lost) * task,
              "classic: merged %d == the step events' %d; computed %d in "
              "[%d, %d + lost tasks %d x tau x B x T]" % (
                  merged, want, computed, submitted, submitted, lost))
    if mode == "decoupled":
        # Issue 17's goal, in the short run as in the long one.
        check(goodput >= 0.90, "decoupled: goodput %.3f >= 0.90" % goodput)
    ph = training.get("param_hash")
    mismatches = [e for e in all_events(job)
                  if e["type"] == "training.param_hash_mismatch"]
    if ph is not None:
        # Classic verifies the parameters a round received (the outer step
        # before it): the last verified step is the last but one there.
        # Decoupled verifies a sync at its blend, after the sync's event:
        # by the last event, the last but one syncer step.
        want = (training.get("outer_step") or 0) - 1
        if mode == "decoupled":
            synced = sorted(p["syncer_step"] for p in steps.values()
                            if "syncer_step" in p)
            want = synced[-2] if len(synced) > 1 else 0
        check(not mismatches and not ph.get("mismatches") and
              (ph.get("verified_step") or 0) >= want > 0,
              "%s: live workers bit-identical through the run (param_hash "
              "%s, mismatch events %d)" % (mode, ph, len(mismatches)))
        identity = "ok@%s" % ph.get("verified_step") \
            if not mismatches and not ph.get("mismatches") else "MISMATCH"
    else:
        identity = "n/a (service has no param_hash)"
    final_workers = [steps[k]["workers"] for k in sorted(steps)][-1:] or [0]
    losses = [steps[k]["loss"] for k in sorted(steps)]
    # The fleet comes back: eight connected once the last stop ended and
    # the node manager restarted the last kill.
    back = wait_for(lambda: request("GET", "/v1/workers")[1]["counts"][
        "connected"] == WORKERS, 60, "%s: fleet back at %d" % (mode,
                                                              WORKERS))
    check(bool(back), "%s: all %d workers connected again after the run" % (
        mode, WORKERS))
    return {"mode": mode, "state": state, "steps": len(steps),
            "wall": wall, "kills": chaos.kills, "stops": chaos.stops,
            "max_round": max(seconds) if seconds else 0.0, "bound": bound,
            "median_round": statistics.median(seconds) if seconds else 0.0,
            "goodput": goodput, "merged": merged, "computed": computed,
            "lost_tasks": lost, "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "final_workers": final_workers[0], "identity": identity,
            "bytes_total": training.get("bytes_total"),
            "log": log}


def print_table(rows):
    print("\nchaos seed=%d %s, %d CPU workers, kill+stop every %.0f s "
          "(stop %.0f s), heartbeat %d ms" % (
              SEED, "long" if LONG else "short", WORKERS, PERIOD, STOP,
              HEARTBEAT_MS))
    head = ("mode", "state", "syncs", "wall s", "kills", "stops",
            "round med/max/bound s", "goodput", "lost tasks", "loss",
            "workers@end", "bit-identical", "gateway MB in/out")
    print(" | ".join(head))
    for r in rows:
        bt = r.get("bytes_total")
        print(" | ".join([
            r["mode"], r["state"], str(r["steps"]), "%.1f" % r["wall"],
            str(r["kills"]), str(r["stops"]),
            "%.2f/%.2f/%.1f" % (r["median_round"], r["max_round"],
                                r["bound"]),
            "%.3f (%s/%s)" % (r["goodput"], r["merged"], r["computed"]),
            "%d" % r["lost_tasks"],
            "%.3f->%.3f" % (r["first_loss"] or 0, r["last_loss"] or 0),
            str(r["final_workers"]), r["identity"],
            "%.1f/%.1f" % (bt.get("gateway_in", 0) / 1e6,
                           bt.get("gateway_out", 0) / 1e6)
            if bt else "n/a"]))


def main():
    if not os.path.exists(te.DATA):
        print("no %s" % te.DATA)
        return 1
    modes = os.environ.get("PCP_CHAOS_MODES", ",".join(MODES_ALL))
    modes = [m for m in modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES_ALL]
    if unknown:
        print("unknown PCP_CHAOS_MODES %s (have %s)" % (unknown, MODES_ALL))
        return 1
    work = tempfile.mkdtemp(prefix="pcp-chaos-")
    t_start = time.time()
    api_port, fabric_port = gt.free_port(), gt.free_port()
    gt.BASE = "http://127.0.0.1:%d" % api_port
    gw = gt.Gateway(work, api_port, fabric_port)
    te.relax_heartbeat(gw)
    nm = None
    rows = []
    try:
        gw.start()
        env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN)
        nm_err = os.path.join(work, "nm.err")
        nm = subprocess.Popen(
            [gt.PCP, "--node-manager", "--scale", str(WORKERS), "--host",
             "127.0.0.1", "--port", str(fabric_port), "--backend", "cpu",
             "--api-port", "0", "--restart-min-ms", "200",
             "--restart-max-ms", "500", "--start-stagger-ms", "50"],
            env=env, stderr=open(nm_err, "w"))
        if not wait_for(lambda: request("GET", "/v1/workers")[1]["counts"][
                "connected"] == WORKERS, 90, "%d workers joined" % WORKERS):
            return 1
        print("cluster up in %.1f s" % (time.time() - t_start))
        for mode in modes:
            row = run_mode(mode, work, nm_err,
                           os.path.join(work, "gw%d.err" % gw.starts))
            if row:
                rows.append(row)
        print_table(rows)
        with open(nm_err, errors="replace") as f:
            starts = len(re.findall(r'msg="child started"', f.read()))
        kills = sum(r["kills"] for r in rows)
        check(starts >= WORKERS + kills,
              "the node manager restarted every killed worker (%d starts, "
              "%d kills)" % (starts, kills))
    finally:
        te.stop_all(nm, gw)
    print("chaos: %.1f s in all" % (time.time() - t_start))
    if gt.FAILURES:
        print("chaos_test: %d failures (seed %d; logs in %s)" % (
            len(gt.FAILURES), SEED, work))
        return 1
    print("chaos_test: all passed")
    if os.environ.get("PCP_CHAOS_KEEP") == "1":
        print("chaos_test: logs and state kept in %s" % work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
