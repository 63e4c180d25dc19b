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
- the val loss: every mode trains on the first 90% of tiny_shakespeare
  (cut at a line end; eval_fraction 0: the services' own evaluation would
  add bytes to the counters) and its exported final model
  (state/models/<job>/model.safetensors, checked against model.json's
  SHA-256) is scored on the last 10% by an independent implementation,
  tests/models/jax_reference.py: the mean cross-entropy over fixed windows
  (seeded, the same for every mode) of block_size tokens, tokenized with
  the char vocabulary the job exported in model.json (windows holding a
  character outside it are dropped and counted; none in this text). The
  same model is also scored on windows of its training text: for ddp that
  must agree with the losses the job reported at its end (a mapping check);
- the tail loss, kept for reference: the mean of the training losses the
  job reported over its last quarter of inner steps (for decoupled, the
  learners' local losses on 256-token batches at 2 syncs: noisy, and not
  the global model's).

The comparison is per token (tokens per worker differ a little: streaming
runs max_epochs x H + the last fragment's phase local steps), steady state
except for the one-off initial state each mode sends (parameters down at
the start), which stays in the figures.

Last line: `diloco_comm ratio=<x>`, x = ddp's fabric bytes per worker per
token / decoupled+int4's (programs excluded). Goal: x >= 500 at tau 100
with decoupled's val loss within 2% of ddp's; under PCP_BENCH_CHECK=1 a
miss (or a failed mapping check) exits 1. With no ddp mode in this build
the bench fails ("ddp not available") rather than print a ratio of
something else. --experiment-json and --decoupled-json merge keys into
every job and into the decoupled block, for tuning runs without code
edits.
"""

import argparse
import hashlib
import json
import os
import shutil
import socket
import struct
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
# The peak inner rate of every mode (the schedule: experiment()).
LEARNING_RATE = 0.001

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
               lr=LEARNING_RATE, extra=None, decoupled_extra=None):
    """The job of |mode| over |steps| inner steps per worker with sync
    interval |tau| (classic tau, streaming H, decoupled sync_interval_h,
    ddp: tau inner steps per reported step); |extra| (--experiment-json)
    merged into the job last, |decoupled_extra| (--decoupled-json) into the
    decoupled_diloco block."""
    # Every mode: the same inner AdamW rate schedule, a cosine from |lr|
    # (after a linear warmup of steps/16) down to lr/10 at the last step,
    # and the same peak rate, the best of the sweep in docs/performance.md
    # "diloco_comm" (run 5: ddp and decoupled both at their best at 0.001;
    # 0.003 with a constant rate left ddp and every DiLoCo mode on a noise
    # floor). Plain averaging (outer lr 1, momentum 0) for every DiLoCo
    # mode: outer Nesterov and other outer rates were no better (runs 3 and
    # 5).
    e = {"name": "bench-" + mode, "model": model, "data_path": data_path,
         "tokenizer": "char", "sampling": "random", "learning_rate": lr,
         "nesterov_momentum": 0.0, "outer_learning_rate": 1.0,
         "lr_schedule": "cosine", "warmup_steps": max(1, steps // 16),
         "min_lr": lr / 10,
         "eval_fraction": 0.0, "checkpoint_every": 100000, "seed": seed,
         "serve_worker_class": NO_SERVE_CLASS}
    # ddp and classic also stop at max_epochs passes over a worker's shard
    # (default 10: about 9,800 steps of 4 workers on this text), which
    # would end a long --steps run early with its rate schedule unfinished:
    # the step count decides the length here (measure() checks it).
    if mode == "ddp":
        e.update(aggregation_strategy="ddp", tau=tau,
                 outer_loop_steps=max(1, steps // tau), max_epochs=1000000)
    elif mode == "classic":
        e.update(tau=tau, outer_loop_steps=max(1, steps // tau),
                 inner_state="keep", max_epochs=1000000)
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
                 "learner_alpha": 0.0, "outer_learning_rate": 1.0,
                 # 8 local steps per task where no sync falls between
                 # them (docs/training.md "Steps per task"): the task frame
                 # and the loss back once per 8 steps.
                 "steps_per_task": 8}
        if mode == "decoupled_int4":
            # int4 both ways: deltas up, and the merged fragment down as
            # the int4 change of the broadcast copy (int4_down).
            block.update(outer_gradient_compression="int4",
                         int4_block_size=64, int4_down="on")
        # --decoupled-json (checked by the gateway) last.
        block.update(decoupled_extra or {})
        e.update(aggregation_strategy="decoupled_diloco", tau=tau,
                 outer_loop_steps=steps, decoupled_diloco=block)
    else:
        raise ValueError("mode %r: want one of %s" % (mode, ", ".join(MODES)))
    e.update(extra or {})
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


def summary_of_events(events):
    """The payload of the job's training.decoupled event ({} if none)."""
    summary = {}
    for e in events:
        if e["type"] == "training.decoupled":
            summary = e["payload"]
    return summary


def summarize(mode, experiment_, events, total_steps):
    """(sync payload bytes of the job, tail losses, loss per event) from
    the job's events."""
    steps = [e["payload"] for e in events if e["type"] == "training.step"]
    summary = summary_of_events(events)
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


def measure(pcp, work, mode, workers, model, steps, tau, seconds, previous,
            extra=None, decoupled_extra=None):
    with LocalCluster(pcp, work, workers, mode, previous) as lc:
        before = lc.links()
        body = experiment(mode, model, steps, tau, lc.data, extra=extra,
                          decoupled_extra=decoupled_extra)
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
    # A run that stopped short (an epoch cap, a job key from
    # --experiment-json) compares other tokens and another rate schedule:
    # an error, not a figure.
    wanted = (max(1, steps // tau) * tau if mode in ("ddp", "classic")
              else steps)
    if total_steps < wanted:
        raise RuntimeError("%s: the job ended at inner step %d of %d "
                           "(max_epochs or another stop): no figure" % (
                               mode, total_steps, wanted))
    b, t = model["batch"], model["block_size"]
    tokens_per_worker = total_steps * b * t
    sync, tail, curve, summary = summarize(mode, body, events, total_steps)
    computed = summary.get("tokens_computed")
    if mode.startswith("decoupled") and computed:
        # A learner with no round left to merge its steps stops (the
        # no-wasted-step rule) a few steps before S: count what the
        # learners computed, not S steps each.
        tokens_per_worker = computed / workers
    return {"mode": mode, "job": job_id, "wall": wall, "state": lc.state,
            "n": training.get("parameter_count"), "links": per_worker,
            "programs": programs, "sync": sync, "tail": tail, "curve": curve,
            "steps": total_steps, "tokens": tokens_per_worker,
            "summary": summary, "training": training, "body": body}


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


# Held-out evaluation: every mode's final global model scored the same way
# by an independent implementation, on text none of them trained on.

TRAIN_FRACTION = 0.9
MAX_TEXT_BYTES = 64 << 20
# The windows are drawn once with this seed: the same for every mode and run.
EVAL_SEED = 20261205
MAX_WEIGHTS_BYTES = 1 << 30
MAX_HEADER_BYTES = 16 << 20


def split_text(path):
    """(train bytes, held-out bytes): the first 90% of |path|, cut after the
    last line end before that point (so no UTF-8 character is split), and
    the rest."""
    with open(path, "rb") as f:
        data = f.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
        raise RuntimeError("%s: over %d bytes" % (path, MAX_TEXT_BYTES))
    cut = data.rfind(b"\n", 0, int(len(data) * TRAIN_FRACTION)) + 1
    if cut <= 0 or cut >= len(data):
        raise RuntimeError("%s: no line end to split train and held-out "
                           "text at" % path)
    return data[:cut], data[cut:]


def read_safetensors(path):
    """{name: float32 array} of a safetensors file (F32 or BF16)."""
    import numpy as np
    size = os.path.getsize(path)
    if size < 8 or size > MAX_WEIGHTS_BYTES:
        raise RuntimeError("%s: %d bytes (8..%d)" % (path, size,
                                                    MAX_WEIGHTS_BYTES))
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER_BYTES or 8 + n > len(raw):
        raise RuntimeError("%s: header of %d bytes" % (path, n))
    header = json.loads(raw[8:8 + n])
    body = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        count = 1
        for d in info["shape"]:
            count *= d
        width = {"F32": 4, "BF16": 2}.get(info["dtype"])
        if width is None or not 0 <= lo <= hi <= len(body) or \
                hi - lo != count * width:
            raise RuntimeError("%s: tensor %s: dtype %s, bytes %d..%d of %d "
                               "for shape %s" % (path, name, info["dtype"],
                                                 lo, hi, len(body),
                                                 info["shape"]))
        if width == 4:
            a = np.frombuffer(body[lo:hi], "<f4")
        else:
            # bf16 is the high half of an f32.
            a = (np.frombuffer(body[lo:hi], "<u2").astype(np.uint32)
                 << 16).view(np.float32)
        out[name] = a.reshape(info["shape"])
    return out


class Evaluator:
    """Mean cross-entropy of a job's exported model (state/models/<job>:
    model.json, model.safetensors) over fixed windows of the held-out text,
    computed by tests/models/jax_reference.py (jax.numpy written from the
    architecture descriptions, not from the emitted MLIR) with the parameter
    table `pcp model gpt ... --params-json` gives for the bench's model."""

    def __init__(self, pcp, work, model, held_out, train, windows):
        import numpy as np
        self.np, self.model, self.windows = np, model, windows
        params = os.path.join(work, "params.json")
        subprocess.run(
            [pcp, "model", "gpt", "--layers", str(model["layers"]),
             "--heads", str(model["heads"]), "--kv-heads",
             str(model["kv_heads"]), "--width", str(model["width"]),
             "--vocab", str(model["vocab"]), "--block-size",
             str(model["block_size"]), "--batch", str(model["batch"]),
             "-o", os.path.join(work, "eval.mlir"), "--params-json", params],
            check=True, capture_output=True, timeout=300)
        with open(params) as f:
            self.table = json.load(f)
        # The char tokenizer works on code points (src/data/dataset.c).
        self.texts = {"held-out": held_out.decode("utf-8"),
                      "train": train.decode("utf-8")}
        t = model["block_size"]
        rng = np.random.default_rng(EVAL_SEED)
        self.starts = {}
        for which, text in sorted(self.texts.items()):
            if len(text) < t + 2:
                raise RuntimeError("%s text: %d characters, under a window"
                                   % (which, len(text)))
            self.starts[which] = rng.integers(0, len(text) - t,
                                              size=windows)
        self.fn = None
        self.cache = {}

    def windows_of(self, which, vocab):
        """(ids [n, T], targets [n, T], windows dropped) of the fixed
        windows of |which| text, tokenized with |vocab| (the job's exported
        char vocabulary, id order). A window holding a character outside
        the vocabulary is dropped (none in tiny_shakespeare: its held-out
        tenth uses 61 of the 65 symbols of the first 90%)."""
        np = self.np
        key = (which, vocab)
        if key not in self.cache:
            index = {c: i for i, c in enumerate(vocab)}
            ids = np.array([index.get(c, -1) for c in self.texts[which]],
                           np.int32)
            t = self.model["block_size"]
            rows = ids[self.starts[which][:, None] +
                       np.arange(t + 1)[None, :]]
            keep = (rows >= 0).all(axis=1)
            rows = rows[keep]
            self.cache[key] = (rows[:, :t], rows[:, 1:],
                               int(len(keep) - keep.sum()))
        return self.cache[key]

    def load(self, state, job):
        """(parameters by name, vocabulary, model.json) of |job|'s export;
        raises when it is missing or does not match the bench's model."""
        d = os.path.join(state, "models", job)
        meta_path = os.path.join(d, "model.json")
        if not os.path.exists(meta_path):
            raise RuntimeError("no exported model (%s missing)" % meta_path)
        with open(meta_path) as f:
            meta = json.load(f)
        path = os.path.join(d, meta.get("weights", "model.safetensors"))
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        if digest != meta.get("weights_sha256"):
            raise RuntimeError("%s: SHA-256 %s, model.json says %s" % (
                path, digest, meta.get("weights_sha256")))
        for key in ("layers", "heads", "width", "vocab", "block_size"):
            if meta.get(key) != self.model[key]:
                raise RuntimeError("model.json %s %r, the bench's model %r"
                                   % (key, meta.get(key), self.model[key]))
        tok = meta.get("tokenizer") or {}
        vocab = tok.get("vocab")
        if meta.get("architecture") != "gpt" or tok.get("kind") != "char" \
                or not isinstance(vocab, str) or \
                not 0 < len(vocab) <= self.model["vocab"]:
            raise RuntimeError("model.json: architecture %r, tokenizer %r" % (
                meta.get("architecture"), json.dumps(tok)[:200]))
        weights = read_safetensors(path)
        want = {e["name"]: list(e["shape"]) for e in self.table["parameters"]}
        got = {k: list(v.shape) for k, v in weights.items()}
        if want != got:
            raise RuntimeError("%s: tensors %s, the table wants %s" % (
                path, sorted(got.items())[:4], sorted(want.items())[:4]))
        return weights, vocab, meta

    def loss(self, weights, vocab, which):
        """Mean cross-entropy over the fixed windows of |which| text."""
        if self.fn is None:
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
            import jax
            sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))
            import jax_reference as ref
            self.fn = jax.jit(ref.loss_fn(self.table))
        ids, targets, dropped = self.windows_of(which, vocab)
        if len(ids) < self.windows // 2:
            raise RuntimeError("%d of %d %s windows hold characters outside "
                               "the vocabulary" % (dropped, self.windows,
                                                   which))
        total, chunk = 0.0, 256
        for i in range(0, len(ids), chunk):
            part = slice(i, i + chunk)
            total += float(self.fn(weights, ids[part], targets[part])) * \
                len(ids[part])
        return total / len(ids), dropped

    def evaluate(self, r):
        """Adds val (held-out) and train-text losses to result |r|, or the
        reason there are none."""
        try:
            weights, vocab, meta = self.load(r["state"], r["job"])
            r["val"], r["val_dropped"] = self.loss(weights, vocab,
                                                   "held-out")
            r["train_jax"], _ = self.loss(weights, vocab, "train")
            r["export_step"] = meta.get("outer_step")
        except (OSError, ValueError, KeyError, RuntimeError,
                subprocess.SubprocessError) as e:
            r["val"] = r["train_jax"] = float("nan")
            r["val_error"] = str(e)[:300]


def last_merges(body, steps):
    """Syncer step of each decoupled fragment's last merge within |steps|
    (fragment r syncs at the steps = r mod H, src/workloads/train/
    decoupled_plan.c; 0: never): the exported global model holds each
    fragment as of that merge, not the learners' steps after it."""
    block = body.get("decoupled_diloco", {})
    h, p = block.get("sync_interval_h", 1), block.get("num_fragments", 1)
    out = []
    for r in range(p):
        last = steps - (steps - r) % h if steps >= r else 0
        out.append(last if last >= 1 else 0)
    return out


def json_object_arg(parser, name, text):
    """The JSON object |text| of option |name| ({} when empty)."""
    if not text:
        return {}
    if len(text) > 65536:
        parser.error("%s: over 65536 characters" % name)
    try:
        value = json.loads(text)
    except ValueError as e:
        parser.error("%s: not JSON: %s" % (name, e))
    if not isinstance(value, dict):
        parser.error("%s: want a JSON object, got %s" % (
            name, type(value).__name__))
    return value


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("pcp")
    parser.add_argument("--quick", action="store_true",
                        help="a smaller model and 2 syncs per mode")
    # The defaults are the goal's run: 2 learners (the replica count of the
    # Streaming DiLoCo paper's main results) for 6,400 inner steps (3.3 M
    # tokens, ~4 per parameter; the four modes take ~15 min on 2 cores).
    # DiLoCo's loss cost grows with the learners and shrinks with the
    # tokens: --workers 4 and --steps show it (docs/performance.md,
    # diloco_comm: 4 learners +6-7% at 1,600 steps, +3.2% at 6,400, +0.4%
    # at 16,000; 2 learners +1.6-1.8% at 6,400); the bytes ratio is per
    # worker and does not depend on either.
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=0,
                        help="inner steps per worker (default 6400, quick "
                        "200)")
    parser.add_argument("--tau", type=int, default=100)
    parser.add_argument("--modes", default="ddp,classic,streaming,"
                        "decoupled_int4")
    parser.add_argument("--budget-s", type=int, default=0,
                        help="per job (default 1500, quick 300)")
    parser.add_argument("--experiment-json", default="",
                        help="a JSON object merged into every mode's job "
                        "last (e.g. '{\"learning_rate\": 0.004}')")
    parser.add_argument("--decoupled-json", default="",
                        help="a JSON object merged into the decoupled modes' "
                        "decoupled_diloco block (e.g. "
                        "'{\"steps_per_task\": 8}')")
    parser.add_argument("--eval-windows", type=int, default=1024,
                        help="held-out windows of block_size tokens scored "
                        "per model (default 1024)")
    args = parser.parse_args()
    extra = json_object_arg(parser, "--experiment-json", args.experiment_json)
    # The bench owns these: the split train file, the names it looks the
    # jobs up by, and the counters' premise (no held-out evaluation bytes,
    # no serving on the measured workers).
    owned = sorted(set(extra) & {"name", "data_path", "eval_fraction",
                                 "serve_worker_class"})
    if owned:
        parser.error("--experiment-json: the bench sets %s itself" %
                     ", ".join(owned))
    decoupled_extra = json_object_arg(parser, "--decoupled-json",
                                      args.decoupled_json)
    if not 16 <= args.eval_windows <= 16384:
        parser.error("--eval-windows: 16..16384")
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        parser.error("--modes: one or more of %s" % ", ".join(MODES))
    if "ddp" not in modes or "decoupled_int4" not in modes:
        parser.error("--modes must hold ddp and decoupled_int4 (the ratio)")
    if not 1 <= args.workers <= 8:
        parser.error("--workers: 1..8")
    steps = args.steps or (200 if args.quick else 6400)
    if not 1 <= args.tau <= 1000 or not args.tau <= steps <= 100000:
        parser.error("--tau 1..1000 and --steps tau..100000")
    budget = args.budget_s or (300 if args.quick else 1500)
    if not 10 <= budget <= 3600:
        parser.error("--budget-s: 10..3600")
    # ~0.8M parameters (quick: ~0.2M): big enough that the tokens and
    # per-task framing (B x T x 8 + a few hundred bytes per step) are a
    # small share of even the decoupled syncs, small enough that 2 CPU
    # workers run 6,400 steps in 3-5 minutes per mode on 2 cores.
    width = 128 if args.quick else 256
    model = {"kind": "gpt", "layers": 1, "heads": 4, "kv_heads": 4,
             "width": width, "vocab": 65, "block_size": 32, "batch": 8}
    work = tempfile.mkdtemp(prefix="pcp-bench-diloco-")
    check = os.environ.get("PCP_BENCH_CHECK", "") not in ("", "0")
    try:
        # Every mode trains on the first 90% of the text; the last 10% is
        # the held-out text its final model is scored on.
        train, held_out = split_text(DATA)
        with open(os.path.join(work, "text.txt"), "wb") as dst:
            dst.write(train)
        with open(os.path.join(work, "held_out.txt"), "wb") as dst:
            dst.write(held_out)
        evaluator = Evaluator(args.pcp, work, model, held_out, train,
                              args.eval_windows)
        print("diloco_comm: W=%d CPU workers on loopback, model gpt 1 layer "
              "width %d block 32 batch 8, %d inner steps per worker, sync "
              "every %d steps (classic tau, streaming H with P=2, "
              "decoupled sync_interval_h with P=2), lr %g cosine to %g "
              "after %d warmup steps, "
              "eval_fraction 0; trained on the first %d bytes of %s, val "
              "loss: the exported final model's mean cross-entropy (JAX, "
              "tests/models/jax_reference.py) on %d fixed windows of %d "
              "tokens of the last %d bytes" % (
                  args.workers, width, steps, args.tau, LEARNING_RATE,
                  LEARNING_RATE / 10, max(1, steps // 16), len(train),
                  os.path.basename(DATA), args.eval_windows,
                  model["block_size"], len(held_out)), flush=True)
        if extra or decoupled_extra:
            print("diloco_comm: merged into every job: %s; into the "
                  "decoupled block: %s" % (json.dumps(extra),
                                           json.dumps(decoupled_extra)),
                  flush=True)
        results, previous, missing = {}, None, None
        for mode in modes:
            try:
                r = measure(args.pcp, work, mode, args.workers, model, steps,
                            args.tau, budget, previous, extra,
                            decoupled_extra)
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
            # Scored after the cluster is down: the evaluation takes no CPU
            # from the measured workers.
            evaluator.evaluate(r)
            if "val_error" in r:
                print("%-15s val loss: none: %s" % (mode, r["val_error"]),
                      flush=True)
            else:
                print("%-15s val loss %.4f (held-out, %d windows dropped), "
                      "%.4f on the training text (JAX, the exported model "
                      "at outer step %s)" % (
                          mode, r["val"], r["val_dropped"],
                          r["train_jax"], r.get("export_step")), flush=True)
            if mode.startswith("decoupled"):
                print("%-15s the final model holds each fragment as of its "
                      "last merge, at syncer steps %s of %d" % (
                          mode, "/".join(str(x) for x in
                                         last_merges(r["body"], r["steps"])),
                          r["steps"]), flush=True)
        if "ddp" not in results:
            print("diloco_comm: ddp not available (%s); no ratio" % missing)
            return 1
        ddp, dec = results["ddp"], results["decoupled_int4"]
        for mode, r in results.items():
            print("%-15s loss at inner step: %s" % (mode, " ".join(
                "%d:%.3f" % (at, loss) for at, loss in r["curve"][-8:])))
        print()
        print("%-15s %14s %12s %14s %12s %10s %10s %10s" % (
            "mode", "bytes/worker", "B/token", "sync/worker", "vs ddp",
            "tail loss", "val loss", "val gap"))
        for mode, r in results.items():
            print("%-15s %14.0f %12.2f %14.0f %11.1fx %10.4f %10.4f %+9.2f%%"
                  % (mode, r["net"], r["per_token"], r["sync_per_worker"],
                     ddp["per_token"] / r["per_token"], mean(r["tail"]),
                     r["val"], 100 * (r["val"] / ddp["val"] - 1)))
        ratio = ddp["per_token"] / dec["per_token"]
        sync_ratio = (ddp["sync"] / ddp["tokens"]) / max(
            1e-12, dec["sync"] / dec["tokens"])
        # The loss goal is judged on the held-out loss of the final models
        # (NaN, so NO, when a model was not exported).
        loss_ddp, loss_dec = ddp["val"], dec["val"]
        loss_ok = loss_dec <= loss_ddp * 1.02
        # A mapping check: ddp's final model scored by JAX on its own
        # training text must agree with the losses the job reported at its
        # end (a wrong vocabulary or tensor layout lands far off).
        last = ddp["curve"][-1][1] if ddp["curve"] else float("nan")
        sane = abs(ddp["train_jax"] / last - 1) <= 0.1
        print("sanity: ddp's final model on its training text (JAX) %.4f, "
              "its last reported training loss %.4f (tail mean %.4f): "
              "%+.2f%%: %s" % (ddp["train_jax"], last, mean(ddp["tail"]),
                               100 * (ddp["train_jax"] / last - 1),
                               "agree" if sane else
                               "DISAGREE (over 10%: a mapping bug?)"))
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
        print("tail loss (training reports): ddp %.4f, decoupled+int4 %.4f "
              "(%+.2f%%)" % (mean(ddp["tail"]), mean(dec["tail"]),
                             100 * (mean(dec["tail"]) /
                                    mean(ddp["tail"]) - 1)))
        print("val loss: ddp %.4f, decoupled+int4 %.4f (%+.2f%%): within "
              "2%%: %s" % (loss_ddp, loss_dec,
                           100 * (loss_dec / loss_ddp - 1),
                           "yes" if loss_ok else "NO"))
        ok = ratio >= 500 and loss_ok and sane and \
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
