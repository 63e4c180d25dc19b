# SPDX-License-Identifier: Apache-2.0
"""bench/diloco_comm: bytes on the wire per worker of DDP, classic DiLoCo,
streaming DiLoCo and decoupled DiLoCo with int4 deltas, measured on real
training jobs with the same model and the same tokens per worker.

Run by build/bench/diloco_comm (argv: pcp binary, then options). For each
mode: a fresh `pcp --gateway` on a fresh state dir (the compiled programs
copied from the previous run: the artifact cache is content-keyed) and W
`pcp --worker` processes with their own empty program caches, one training
job, and when it has succeeded:

- the fabric's own byte counters of each worker's link (GET /v1/workers
  bytes_to_worker + bytes_from_worker: what the gateway handed to and read
  from that socket, framing, task headers, tokens, losses and heartbeats
  included), minus the programs the worker fetched (the sizes of the VMFBs
  in its cache: one-off, reported separately). The trained model is not
  served on these workers (`serve_worker_class` names a class none has), so
  no inference traffic is counted;
- the job's own sync payload counters: `wire_bytes` of the training.step
  events (classic, streaming, ddp: parameters/gradients down and up), and
  for decoupled the `delta_bytes_total` (measured: the answers' output
  bytes) + `fragment_bytes_down_total` of its training.decoupled summary;
- the training loss: the mean of the losses the job reported over its last
  quarter of inner steps (decoupled DiLoCo has no held-out evaluation in
  the service yet, so all modes are compared on the same training-loss
  figure, with eval_fraction 0; its noise is printed: the spread of those
  losses).

The comparison is per token (tokens per worker differ a little: streaming
runs max_epochs x H + the last fragment's phase local steps), steady state
except for the one-off initial state each mode sends (parameters down at
the start), which stays in the figures.

Last line: `diloco_comm ratio=<x>`, x = ddp's fabric bytes per worker per
token / decoupled+int4's (programs excluded). Goal: x >= 500 at tau 100
with decoupled's loss within 2% of ddp's; under PCP_BENCH_CHECK=1 a miss
exits 1. With no ddp mode in this build the bench fails ("ddp not
available") rather than print a ratio of something else.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

TOKEN = "bench-diloco-token"
JOIN = "bench-diloco-join"
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "tiny_shakespeare.txt")
# BENCH_DILOCO_DEBUG=1: info logs and the work directory kept (printed).
DEBUG = os.environ.get("BENCH_DILOCO_DEBUG", "") not in ("", "0")
MODES = ("ddp", "classic", "streaming", "decoupled_int4", "decoupled_f32")
# A worker class no worker has: the job's export is not loaded onto the
# measured workers, so their counters hold training traffic only.
NO_SERVE_CLASS = "bench-no-serve"


class NotAvailable(Exception):
    """A mode this build does not have (its job is refused)."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(base, method, path, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": "Bearer " + TOKEN}
    if data is not None:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as e:
        payload = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(payload)
        except ValueError:
            return e.code, payload


def wait_for(what, predicate, seconds, period=0.2):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(period)
    raise RuntimeError("timed out after %d s waiting for %s" % (seconds, what))


def stop(proc):
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def program_bytes(path):
    """Bytes of the programs (VMFBs) a worker fetched into its cache."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if name.endswith(".vmfb") and not os.path.islink(full):
                total += os.path.getsize(full)
    return total


def experiment(mode, model, steps, tau, data_path, fragments=2, seed=3,
               lr=0.003):
    """The job of |mode| over |steps| inner steps per worker with sync
    interval |tau| (classic tau, streaming H, decoupled sync_interval_h,
    ddp: tau inner steps per reported step)."""
    # Plain averaging (outer lr 1, momentum 0) for every DiLoCo mode: the
    # tuning runs of 2026-12-05 (docs/performance.md "diloco_comm", run 3)
    # found no decoupled setting better at tau 100 (4 syncs per fragment):
    # the DiLoCo paper's outer Nesterov (lr 0.7 or 1.0, momentum 0.9), outer
    # lr 0.7, 1.5 or 2.0 and the avg_embedding_rda_model merge ended at tail
    # losses 2.560-2.635, inside or just above plain averaging's own spread
    # (2.509-2.615, mean 2.555, over five runs).
    e = {"name": "bench-" + mode, "model": model, "data_path": data_path,
         "tokenizer": "char", "sampling": "random", "learning_rate": lr,
         "nesterov_momentum": 0.0, "outer_learning_rate": 1.0,
         "eval_fraction": 0.0, "checkpoint_every": 100000, "seed": seed,
         "serve_worker_class": NO_SERVE_CLASS}
    if mode == "ddp":
        e.update(aggregation_strategy="ddp", tau=tau,
                 outer_loop_steps=max(1, steps // tau))
    elif mode == "classic":
        e.update(tau=tau, outer_loop_steps=max(1, steps // tau),
                 inner_state="keep")
    elif mode == "streaming":
        # Local steps: max_epochs x H + the last fragment's phase.
        e.update(tau=tau, max_epochs=max(1, steps // tau),
                 streaming={"num_fragments": fragments, "inner_steps": tau,
                            "overlap_tau": 1, "alpha": 0.0})
    elif mode.startswith("decoupled"):
        block = {"num_fragments": fragments, "sync_interval_h": tau,
                 "overlap_tau": 1, "min_quorum": 1,
                 "grace_window_ms": 2000,
                 "merge_strategy": "weighted_average",
                 "fragment_strategy": "balanced_tensor",
                 "learner_alpha": 0.0, "outer_learning_rate": 1.0}
        if mode == "decoupled_int4":
            # int4 both ways: deltas up, and the merged fragment down as
            # the int4 change of the broadcast copy (int4_down).
            block.update(outer_gradient_compression="int4",
                         int4_block_size=64, int4_down="on")
        # Exploration hook: PCP_BENCH_DECOUPLED_EXTRA='{"steps_per_task":
        # 8}' adds keys to the decoupled block (checked by the gateway).
        block.update(json.loads(
            os.environ.get("PCP_BENCH_DECOUPLED_EXTRA", "{}")))
        e.update(aggregation_strategy="decoupled_diloco", tau=tau,
                 outer_loop_steps=steps, decoupled_diloco=block)
    else:
        raise ValueError("mode %r: want one of %s" % (mode, ", ".join(MODES)))
    return e


def job_events(base, job_id):
    s, r = request(base, "GET", "/v1/jobs/%s/events" % job_id)
    return (r or {}).get("events", []) if s == 200 else []


def inner_steps_of(mode, experiment_, payload):
    """Inner (local) steps per worker covered up to a training.step event."""
    if mode in ("ddp", "classic"):
        return payload["outer_step"] * experiment_["tau"]
    if mode == "streaming":
        return payload.get("local_step", 0)
    return payload.get("syncer_step", 0)


def summarize(mode, experiment_, events, total_steps):
    """(sync payload bytes of the job, tail losses, loss per event) from
    the job's events."""
    steps = [e["payload"] for e in events if e["type"] == "training.step"]
    summary = {}
    for e in events:
        if e["type"] == "training.decoupled":
            summary = e["payload"]
    if mode.startswith("decoupled"):
        sync = (summary.get("delta_bytes_total", 0) +
                summary.get("fragment_bytes_down_total", 0))
    else:
        sync = max([p.get("wire_bytes", 0) for p in steps] or [0])
    curve = [(inner_steps_of(mode, experiment_, p), p["loss"]) for p in steps
             if isinstance(p.get("loss"), (int, float))]
    cut = total_steps - max(1, total_steps // 4)
    tail = [loss for at, loss in curve if at > cut] or \
        [loss for _, loss in curve[-1:]]
    return sync, tail, curve, summary


class LocalCluster:
    """`pcp --gateway` and W `pcp --worker` on loopback, each worker with
    its own program cache."""

    def __init__(self, pcp, work, workers, name, previous=None):
        self.pcp, self.workers, self.procs = pcp, workers, []
        self.state = os.path.join(work, "state-" + name)
        os.makedirs(os.path.join(self.state, "data"))
        if previous and os.path.isdir(os.path.join(previous, "artifacts")):
            shutil.copytree(os.path.join(previous, "artifacts"),
                            os.path.join(self.state, "artifacts"))
        self.data = os.path.join(self.state, "data", "text.txt")
        shutil.copyfile(os.path.join(work, "text.txt"), self.data)
        api, self.fabric = free_port(), free_port()
        self.base = "http://127.0.0.1:%d" % api
        self.config = os.path.join(work, "g-%s.json" % name)
        with open(self.config, "w") as f:
            json.dump({"gateway_id": "bench", "lab_id": "bench",
                       "state_dir": self.state,
                       "api": {"token_env": "BENCH_DILOCO_TOKEN"},
                       "worker_fabric": {"host": "127.0.0.1",
                                         "port": self.fabric,
                                         "join_token_env":
                                             "BENCH_DILOCO_JOIN",
                                         "heartbeat_ms": 1000}}, f)
        self.env = dict(os.environ, BENCH_DILOCO_TOKEN=TOKEN,
                        BENCH_DILOCO_JOIN=JOIN, PCP_WORKER_JOIN_TOKEN=JOIN,
                        PCP_LOG_LEVEL="info" if DEBUG else "warn")
        self.log = open(self.state + ".log", "w")
        self.caches = ["%s-cache-%d" % (self.state, i)
                       for i in range(workers)]
        self.api = api

    def __enter__(self):
        try:
            self.procs.append(subprocess.Popen(
                [self.pcp, "--gateway", "--gateway-config", self.config,
                 "--api-port", str(self.api)], env=self.env,
                stderr=self.log))
            wait_for("the gateway", lambda: request(
                self.base, "GET", "/healthz")[0] == 200, 60)
            for i, cache in enumerate(self.caches):
                self.procs.append(subprocess.Popen(
                    [self.pcp, "--worker", "--connect",
                     "127.0.0.1:%d" % self.fabric, "--device-id", str(i),
                     "--cache-dir", cache], env=self.env, stderr=self.log))
            wait_for("%d workers" % self.workers, lambda: request(
                self.base, "GET", "/v1/workers")[1]["counts"]["connected"]
                == self.workers, 120)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for p in reversed(self.procs):
            stop(p)
        self.log.close()

    def links(self):
        listing = request(self.base, "GET", "/v1/workers")[1]["workers"]
        return {w["worker_id"]: w for w in listing}


def run_job(req, body, seconds):
    """Submits |body| through |req|(method, path, body) -> (status, JSON);
    returns (job id, final job object, seconds from
    submit to the end). Raises NotAvailable when the mode is refused as an
    unknown aggregation strategy."""
    t0 = time.time()
    status, job = req("POST", "/v1/training/jobs", body)
    if status != 202:
        text = json.dumps(job)
        if status == 400 and "aggregation_strategy" in text:
            raise NotAvailable(text)
        raise RuntimeError("job not accepted: %s %s" % (status, text))
    job_id = job["job_id"]

    def finished():
        s, r = req("GET", "/v1/training/jobs/" + job_id, None)
        finished.last = r
        return s == 200 and r.get("state") in ("succeeded", "failed",
                                               "cancelled")
    finished.last = None
    wait_for("job %s (%s)" % (job_id, body["name"]), finished, seconds,
             period=0.5)
    if finished.last.get("state") != "succeeded":
        raise RuntimeError("job %s (%s) %s: %s" % (
            job_id, body["name"], finished.last.get("state"),
            json.dumps(finished.last.get("error",
                                         finished.last))[:600]))
    return job_id, finished.last, time.time() - t0


def measure(pcp, work, mode, workers, model, steps, tau, seconds, previous):
    with LocalCluster(pcp, work, workers, mode, previous) as lc:
        before = lc.links()
        body = experiment(mode, model, steps, tau, lc.data)
        job_id, job, wall = run_job(
            lambda m, p, b: request(lc.base, m, p, b), body, seconds)
        # The last task answers are in; a heartbeat or two may follow.
        time.sleep(1.0)
        after = lc.links()
        events = job_events(lc.base, job_id)
    per_worker = []
    for wid, w in after.items():
        b = before.get(wid, {"bytes_to_worker": 0, "bytes_from_worker": 0})
        per_worker.append((w["bytes_to_worker"] - b["bytes_to_worker"],
                           w["bytes_from_worker"] - b["bytes_from_worker"],
                           w.get("eviction_count", 0)))
    programs = [program_bytes(c) for c in lc.caches]
    training = job.get("training", {})
    tokens_per_worker = 0
    step_events = [e["payload"] for e in events if e["type"] ==
                   "training.step"]
    total_steps = max([inner_steps_of(mode, body, p) for p in step_events]
                      or [steps])
    if mode.startswith("decoupled") or mode == "streaming":
        total_steps = max(total_steps, steps)
    b, t = model["batch"], model["block_size"]
    tokens_per_worker = total_steps * b * t
    sync, tail, curve, summary = summarize(mode, body, events, total_steps)
    return {"mode": mode, "job": job_id, "wall": wall, "state": lc.state,
            "n": training.get("parameter_count"), "links": per_worker,
            "programs": programs, "sync": sync, "tail": tail, "curve": curve,
            "steps": total_steps, "tokens": tokens_per_worker,
            "summary": summary, "training": training}


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pcp")
    parser.add_argument("--quick", action="store_true",
                        help="a smaller model and 2 syncs per mode")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=0,
                        help="inner steps per worker (default 400, quick "
                        "200)")
    parser.add_argument("--tau", type=int, default=100)
    parser.add_argument("--modes", default="ddp,classic,streaming,"
                        "decoupled_int4")
    parser.add_argument("--budget-s", type=int, default=0,
                        help="per job (default 600, quick 300)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        parser.error("--modes: one or more of %s" % ", ".join(MODES))
    if "ddp" not in modes or "decoupled_int4" not in modes:
        parser.error("--modes must hold ddp and decoupled_int4 (the ratio)")
    if not 1 <= args.workers <= 8:
        parser.error("--workers: 1..8")
    steps = args.steps or (200 if args.quick else 400)
    if not 1 <= args.tau <= 1000 or not args.tau <= steps <= 100000:
        parser.error("--tau 1..1000 and --steps tau..100000")
    budget = args.budget_s or (300 if args.quick else 600)
    if not 10 <= budget <= 3600:
        parser.error("--budget-s: 10..3600")
    # ~0.8M parameters (quick: ~0.2M): big enough that the tokens and
    # per-task framing (B x T x 8 + a few hundred bytes per step) are a
    # small share of even the decoupled syncs, small enough that 4 CPU
    # workers run 400 steps in a few minutes on 2 cores.
    width = 128 if args.quick else 256
    model = {"kind": "gpt", "layers": 1, "heads": 4, "kv_heads": 4,
             "width": width, "vocab": 65, "block_size": 32, "batch": 8}
    work = tempfile.mkdtemp(prefix="pcp-bench-diloco-")
    check = os.environ.get("PCP_BENCH_CHECK", "") not in ("", "0")
    try:
        with open(DATA, "rb") as src, \
                open(os.path.join(work, "text.txt"), "wb") as dst:
            dst.write(src.read(400000))
        print("diloco_comm: W=%d CPU workers on loopback, model gpt 1 layer "
              "width %d block 32 batch 8, %d inner steps per worker, sync "
              "every %d steps (classic tau, streaming H with P=2, "
              "decoupled sync_interval_h with P=2), lr 0.003, "
              "eval_fraction 0" % (args.workers, width, steps, args.tau),
              flush=True)
        results, previous, missing = {}, None, None
        for mode in modes:
            try:
                r = measure(args.pcp, work, mode, args.workers, model, steps,
                            args.tau, budget, previous)
            except NotAvailable as e:
                if mode != "ddp":
                    raise
                missing = "the job was refused: %s" % str(e)[:300]
                print("ddp: not available in this build (%s)" % missing,
                      flush=True)
                continue
            moved = mean([x[0] + x[1] for x in r["links"]])
            if mode == "ddp" and moved < 0.5 * 8 * (r["n"] or 0) * r["steps"]:
                # A build without ddp ran the job as classic DiLoCo (an
                # unknown aggregation_strategy was not refused before).
                missing = ("the job moved %.0f bytes per worker: not a "
                           "per-step gradient exchange (%d parameters, %d "
                           "steps)" % (moved, r["n"] or 0, r["steps"]))
                print("ddp: not available in this build (%s)" % missing,
                      flush=True)
                continue
            previous = r["state"]
            results[mode] = r
            n = r["n"] or 0
            down = [x[0] for x in r["links"]]
            up = [x[1] for x in r["links"]]
            net = [d + u - p for d, u, p in zip(down, up, r["programs"])]
            r["net"] = mean(net)
            r["evictions"] = sum(x[2] for x in r["links"])
            r["per_token"] = r["net"] / r["tokens"]
            r["sync_per_worker"] = r["sync"] / args.workers
            print("%-15s N=%d %5.0f s  steps/worker %d  fabric bytes per "
                  "worker down %s up %s, programs %s; net (programs "
                  "excluded) %.0f = %.1f B/token; job sync payload %.0f "
                  "per worker; gateway link %d; evictions %d; tail loss "
                  "%.4f (%d reports, %.4f..%.4f)" % (
                      mode, n, r["wall"], r["steps"],
                      "/".join(str(x) for x in down),
                      "/".join(str(x) for x in up),
                      "/".join(str(x) for x in r["programs"]), r["net"],
                      r["per_token"], r["sync_per_worker"],
                      sum(down) + sum(up), r["evictions"], mean(r["tail"]),
                      len(r["tail"]), min(r["tail"] or [0]),
                      max(r["tail"] or [0])), flush=True)
        if "ddp" not in results:
            print("diloco_comm: ddp not available (%s); no ratio" % missing)
            return 1
        ddp, dec = results["ddp"], results["decoupled_int4"]
        for mode, r in results.items():
            print("%-15s loss at inner step: %s" % (mode, " ".join(
                "%d:%.3f" % (at, loss) for at, loss in r["curve"][-8:])))
        print()
        print("%-15s %14s %12s %14s %12s %10s" % (
            "mode", "bytes/worker", "B/token", "sync/worker", "vs ddp",
            "tail loss"))
        for mode, r in results.items():
            print("%-15s %14.0f %12.2f %14.0f %11.1fx %10.4f" % (
                mode, r["net"], r["per_token"], r["sync_per_worker"],
                ddp["per_token"] / r["per_token"], mean(r["tail"])))
        ratio = ddp["per_token"] / dec["per_token"]
        sync_ratio = (ddp["sync"] / ddp["tokens"]) / max(
            1e-12, dec["sync"] / dec["tokens"])
        loss_ddp, loss_dec = mean(ddp["tail"]), mean(dec["tail"])
        loss_ok = loss_dec <= loss_ddp * 1.02
        print("ratio of the job's sync payloads alone (ddp / decoupled+int4, "
              "per token): %.1f" % sync_ratio)
        # What it takes to reach 2000: decoupled's bytes per token at sync
        # interval H are (initial + syncs x per_sync) / tokens + other per
        # token; ddp's per token do not depend on H.
        syncs = max(1, dec["summary"].get("syncs", 0))
        n = dec["n"] or 1
        frags = 2
        per_full_sync = dec["sync"] / args.workers / syncs * frags
        # The initial parameters (4N down, once: @init builds the rest of
        # the state on the worker) are one-off, not per step; with seeded
        # init (the default) an @init that stayed seeded sent none of them.
        summary = dec["summary"]
        inits = frags * args.workers
        seeded = max(0, summary.get("seeded_inits", 0) -
                     summary.get("seeded_init_fallbacks", 0))
        initial = 4 * (dec["n"] or 0) * max(0.0, 1.0 - seeded / inits)
        other_per_step = (dec["net"] - dec["sync"] / args.workers -
                          initial) / dec["steps"]
        ddp_per_step = ddp["net"] / ddp["steps"]
        print("decoupled+int4 measured: %.0f bytes per worker per sync of "
              "the whole model (%d fragment syncs, %.2f B/parameter), "
              "%.0f bytes per worker per local step besides the syncs "
              "(tokens, losses, task frames, heartbeats; the initial "
              "parameters excluded: %.0f bytes, %d of %d @init seeded); "
              "ddp %.0f bytes per worker per step (%.2f B/parameter)" % (
                  per_full_sync, syncs, per_full_sync / n, other_per_step,
                  initial, seeded, inits, ddp_per_step, ddp_per_step / n))
        for goal in (500, 2000):
            if other_per_step > 0 and ddp_per_step / other_per_step <= goal:
                print("to reach %d: not reachable at any H with this "
                      "model: the per-step traffic besides the syncs alone "
                      "is 1/%.0f of ddp's (a larger model or batch "
                      "compression of the tokens is needed); the sync "
                      "payloads alone need H >= %.0f" % (
                          goal, ddp_per_step / other_per_step,
                          goal * per_full_sync / ddp_per_step))
            else:
                h = goal * per_full_sync / (ddp_per_step - goal *
                                            max(0.0, other_per_step))
                print("to reach %d: H (tau) >= %.0f at these measured "
                      "per-sync and per-step bytes" % (goal, h))
        print("loss: ddp %.4f, decoupled+int4 %.4f (%+.2f%%): within 2%%: "
              "%s" % (loss_ddp, loss_dec, 100 * (loss_dec / loss_ddp - 1),
                      "yes" if loss_ok else "NO"))
        ok = ratio >= 500 and loss_ok and \
            all(r["evictions"] == 0 for r in results.values())
        print("diloco_comm goal ratio >= 500 at tau %d with decoupled's loss "
              "within 2%% of ddp's: %s" % (args.tau, "met" if ok else
                                            "MISSED"))
        print("diloco_comm ratio=%.1f" % ratio)
        return 1 if (check and not ok) else 0
    finally:
        if DEBUG:
            print("work directory kept:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
