#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Worker classes (issue 16, Deliver 2): a real `pcp --gateway` and two real
`pcp --worker` processes on 127.0.0.1, one started `--worker-class gen`,
the other `--worker-class train`, both CPU, real IREE programs.

  1. A served model directory whose model.json says "worker_class": "gen"
     is served by the gen worker only: GET /v1/models/{id} shows
     workers == 1 and worker_class "gen", and completions answer.
  2. At the same time a training job with "worker_class": "train" (and
     "serve_worker_class": "gen" for its exports) runs on the train
     worker only: every training.step event averaged one worker's delta,
     though two are connected.
  3. While both run, /v1/workers is sampled: the train worker is never seen
     running prefill/decode/load, the gen worker never diloco_round; and
     deterministically, the programs each worker fetched (its program
     cache directory, one file per program hash) are disjoint sets: no
     program of one class was ever offered to the other worker.
  4. The job's export is served with the class it named (workers == 1).
  5. Bad class names: a worker flag exits with a usage error naming
     --worker-class; an experiment's worker_class is a 400 naming the key.

usage: worker_classes_test.py PCP
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gateway_test as gt  # noqa: E402
import inference_models as im  # noqa: E402
import inference_reload_test as rt  # noqa: E402  (export, write_atomic)
import training_e2e_test as te  # noqa: E402

from gateway_test import check, is_error, request, wait_for  # noqa: E402

MODEL = "gpt-gen"
# Not the served model's shape, so its inference program differs from the
# served model's (their caches stay comparable by hash).
TRAIN_MODEL = {"kind": "gpt", "layers": 1, "heads": 2, "kv_heads": 2,
               "width": 32, "vocab": 65, "block_size": 16, "batch": 4}
INFERENCE_FUNCTIONS = ("prefill", "decode", "load")


def experiment(**extra):
    e = {"name": "classes-train", "model": TRAIN_MODEL, "data_path": te.DATA,
         "tokenizer": "char", "sampling": "fifo", "learning_rate": 0.01,
         "tau": 4, "outer_loop_steps": 6, "nesterov_momentum": 0.0,
         "outer_learning_rate": 1.0, "checkpoint_every": 3, "seed": 2,
         "worker_class": "train", "serve_worker_class": "gen"}
    e.update(extra)
    return e


def start_worker(work, fabric_port, worker_id, worker_class):
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN,
               PCP_WORKER_ID=worker_id)
    return subprocess.Popen(
        [gt.PCP, "--worker", "--connect", "127.0.0.1:%d" % fabric_port,
         "--cache-dir", os.path.join(work, "cache-" + worker_id),
         "--worker-class", worker_class],
        env=env, stderr=open(os.path.join(work, worker_id + ".err"), "w"))


def programs(work, worker_id):
    """Program hashes in a worker's cache directory (<hex>.vmfb files)."""
    out = set()
    for root, _, files in os.walk(os.path.join(work, "cache-" + worker_id)):
        out.update(f[:-5] for f in files if f.endswith(".vmfb"))
    return out


def model_info(name):
    s, info = request("GET", "/v1/models/" + name)
    return info if s == 200 and isinstance(info, dict) else {}


class Sampler(threading.Thread):
    """Samples /v1/workers: the functions each worker is seen running."""

    def __init__(self):
        super().__init__(daemon=True)
        self.seen = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            s, body = request("GET", "/v1/workers")
            for w in (body.get("workers", []) if s == 200 else []):
                task = w.get("current_task")
                if task:
                    self.seen.setdefault(w["worker_id"], set()).add(
                        task["function"])
            time.sleep(0.02)


class Chatter(threading.Thread):
    """Completions against the gen model until stopped."""

    def __init__(self):
        super().__init__(daemon=True)
        self.ok = 0
        self.failed = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            s, r = request("POST", "/v1/completions",
                           {"model": MODEL, "prompt": "hello there",
                            "max_tokens": 8, "temperature": 0}, timeout=120)
            if s == 200:
                self.ok += 1
            else:
                self.failed.append((s, r))


def bad_names(work, fabric_port):
    p = subprocess.run(
        [gt.PCP, "--worker", "--connect", "127.0.0.1:%d" % fabric_port,
         "--worker-class", "two words"],
        env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN),
        capture_output=True, timeout=30)
    check(p.returncode != 0 and b"--worker-class" in p.stderr,
          "a malformed --worker-class is a usage error naming the flag: "
          "rc=%d %s" % (p.returncode, p.stderr[-200:]))
    for key, value in (("worker_class", "a/b"), ("worker_class", ""),
                       ("serve_worker_class", "x" * 64)):
        resp = request("POST", "/v1/training/jobs",
                       experiment(name="bad", **{key: value}))
        check(is_error(resp, 400, "INVALID_ARGUMENT") and
              "'%s'" % key in resp[1]["error"]["message"],
              "400 naming %s for %r: %s" % (key, value[:10], resp))


def main():
    work = tempfile.mkdtemp(prefix="pcp-classes-")
    api_port, fabric_port = gt.free_port(), gt.free_port()
    gt.BASE = "http://127.0.0.1:%d" % api_port
    gw = gt.Gateway(work, api_port, fabric_port)
    te.relax_heartbeat(gw)
    # The served model, class "gen", where the gateway looks for models.
    tables = os.path.join(work, "tables")
    os.makedirs(tables)
    model = im.Model(gt.PCP, tables, im.GPT, 41)
    served = os.path.join(work, "state", "models", MODEL)
    rt.export(model, served, name=MODEL)
    path = os.path.join(served, "model.json")
    with open(path) as f:
        meta = json.load(f)
    meta["worker_class"] = "gen"
    rt.write_atomic(path, json.dumps(meta, indent=1).encode())

    workers = []
    ok = False
    try:
        gw.start()
        workers = [start_worker(work, fabric_port, "gen-0", "gen"),
                   start_worker(work, fabric_port, "train-0", "train")]
        wait_for(lambda: request("GET", "/v1/workers")[1]["counts"][
            "connected"] == 2, 60, "two workers joined")
        s, body = request("GET", "/v1/workers")
        classes = {w["worker_id"]: w["worker_class"]
                   for w in body.get("workers", [])}
        check(classes == {"gen-0": "gen", "train-0": "train"},
              "the worker list shows each JOIN's class: %s" % classes)

        # 1. Served by the gen worker only.
        info = wait_for(lambda: model_info(MODEL).get("status") == "ready"
                        and model_info(MODEL), 600, "gpt-gen ready")
        check(bool(info) and info.get("workers") == 1 and
              info.get("worker_class") == "gen",
              "gpt-gen served by one worker of class gen: %s" %
              {k: (info or {}).get(k) for k in ("workers", "worker_class")})
        s, listing = request("GET", "/v1/models")
        rows = [m for m in listing.get("data", []) if m["id"] == MODEL]
        check(len(rows) == 1 and rows[0].get("workers") == 1 and
              rows[0].get("worker_class") == "gen",
              "the listing shows workers 1 and worker_class gen: %s" % rows)
        gen_before = programs(work, "gen-0")
        check(len(gen_before) >= 1 and not programs(work, "train-0"),
              "only the gen worker fetched the model's program: gen %d, "
              "train %d" % (len(gen_before), len(programs(work, "train-0"))))

        # 2 + 3. Both at once, sampled.
        sampler, chatter = Sampler(), Chatter()
        sampler.start()
        chatter.start()
        job = te.submit(experiment())
        running = wait_for(lambda: te.state_of(job) == "running", 120,
                           "training job running")
        done = te.wait_done(job, 600)
        chatter.stop.set()
        sampler.stop.set()
        chatter.join(180)
        sampler.join(10)
        s, r = request("GET", "/v1/training/jobs/%s" % job)
        check(bool(running and done) and r.get("state") == "succeeded",
              "the train-class job succeeded: %s" % r.get("error", ""))
        steps = te.steps_of(job)
        check(len(steps) == 6 and
              all(p.get("workers") == 1 for p in steps.values()),
              "every step averaged one worker (two connected): %s" %
              {k: p.get("workers") for k, p in steps.items()})
        check(chatter.ok >= 2 and not chatter.failed,
              "completions answered while the job ran: %d ok, failed %s" %
              (chatter.ok, chatter.failed[:2]))
        seen = sampler.seen
        check(not (seen.get("train-0", set()) & set(INFERENCE_FUNCTIONS)),
              "the train worker never ran prefill/decode/load: %s" % seen)
        check("diloco_round" not in seen.get("gen-0", set()),
              "the gen worker never ran diloco_round: %s" % seen)
        s, body = request("GET", "/v1/workers")
        done_by = {w["worker_id"]: w.get("tasks_done", 0)
                   for w in body.get("workers", [])}
        check(done_by.get("train-0", 0) >= 6 and done_by.get("gen-0", 0) > 0,
              "both workers answered tasks: %s" % done_by)

        # 4. The export, served with its class.
        export = wait_for(
            lambda: model_info("classes-train").get("status") == "ready" and
            model_info("classes-train"), 300, "the export served")
        check(bool(export) and export.get("worker_class") == "gen" and
              export.get("workers") == 1,
              "the job's export is served on the gen class only: %s" %
              {k: (export or {}).get(k) for k in ("workers", "worker_class")})
        gen_after, train_after = programs(work, "gen-0"), programs(work,
                                                                   "train-0")
        check(len(train_after) >= 1 and gen_before <= gen_after and
              not (gen_after & train_after),
              "the two workers' programs are disjoint: gen %d, train %d, "
              "shared %d" % (len(gen_after), len(train_after),
                             len(gen_after & train_after)))

        print("seen %s; completions %d; programs gen %d train %d; "
              "tasks %s" % ({k: sorted(v) for k, v in seen.items()},
                            chatter.ok, len(gen_after), len(train_after),
                            done_by), flush=True)

        # 5. Bad names.
        bad_names(work, fabric_port)

        # 6. A node manager hands its class to its children.
        nm = subprocess.Popen(
            [gt.PCP, "--node-manager", "--scale", "1", "--host", "127.0.0.1",
             "--port", str(fabric_port), "--backend", "cpu", "--api-port",
             "0", "--worker-class", "nm-pool"],
            env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=gt.JOIN),
            stderr=open(os.path.join(work, "nm.err"), "w"))
        workers.append(nm)
        joined = wait_for(lambda: [
            w for w in request("GET", "/v1/workers")[1].get("workers", [])
            if w["worker_class"] == "nm-pool" and w["state"] == "connected"],
            60, "the node manager's worker joined")
        check(bool(joined) and len(joined) == 1,
              "the node manager's child joined with --worker-class nm-pool")
        p = subprocess.run(
            [gt.PCP, "--node-manager", "--scale", "1", "--host", "127.0.0.1",
             "--port", str(fabric_port), "--api-port", "0",
             "--worker-class", "bad:class"],
            capture_output=True, timeout=30)
        check(p.returncode != 0 and b"--worker-class" in p.stderr,
              "a node manager with a malformed class is a usage error: "
              "rc=%d %s" % (p.returncode, p.stderr[-200:]))
        ok = not gt.FAILURES
    finally:
        for p in workers:
            p.terminate()
        for p in workers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        te.stop_all(None, gw)
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("logs kept in " + work, flush=True)
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
