#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Shared by the RL integration tests (rl_e2e_test.py, rl_resume_test.py):
a real `pcp --gateway` and two real `pcp --worker`s (CPU, IREE) on
127.0.0.1, a short DiLoCo training job on data/tiny_shakespeare.txt for the
base model (a small char GPT), the prompts files, and HTTP helpers.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "data", "tiny_shakespeare.txt")
JOIN = "rl-join"
FAILURES = []

# The base model: a char GPT of 2 layers of width 64 (about 110k
# parameters), block 64 so that a prompt of up to 16 characters and 32 new
# tokens fit. 24 outer steps of tau 10 at lr 3e-3 take it to the bigram
# plateau and a little past (loss ~2.4): it writes Shakespeare-looking
# letters and punctuation, so a reward on a character is rare but not zero.
SPEC = {"kind": "gpt", "layers": 2, "heads": 4, "width": 64, "vocab": 65,
        "block_size": 64, "batch": 16}
TRAIN_STEPS = int(os.environ.get("PCP_RL_E2E_TRAIN_STEPS", "24"))

# Prompts: the names of speakers as they open a line in the play. Training
# and held-out sets are disjoint.
TRAIN_NAMES = ["ROMEO", "JULIET", "MENENIUS", "CORIOLANUS", "GLOUCESTER",
               "KING RICHARD II", "QUEEN ELIZABETH", "BRUTUS", "SICINIUS",
               "VOLUMNIA", "CLARENCE", "ISABELLA", "DUKE VINCENTIO", "LUCIO",
               "ANGELO", "PETRUCHIO"]
EVAL_NAMES = ["BUCKINGHAM", "HASTINGS", "KATHARINA", "NURSE", "MERCUTIO",
              "CAPULET", "PAULINA", "LEONTES"]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, seconds, what, interval=0.2):
    deadline = time.time() + seconds
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    check(False, "timed out after %ds: %s" % (seconds, what))
    return None


class Cluster:
    """A gateway with its state dir and two workers."""

    def __init__(self, pcp, work):
        self.pcp = pcp
        self.work = work
        self.api = free_port()
        self.fabric = free_port()
        self.base = "http://127.0.0.1:%d" % self.api
        self.state = os.path.join(work, "state")
        self.data = os.path.join(self.state, "data")
        os.makedirs(self.data, exist_ok=True)
        self.config = os.path.join(work, "gateway.json")
        with open(self.config, "w") as f:
            json.dump({"gateway_id": "gw-rl", "lab_id": "lab",
                       "state_dir": self.state,
                       "worker_fabric": {"host": "127.0.0.1",
                                         "port": self.fabric,
                                         "join_token_env": "RL_JOIN",
                                         "heartbeat_ms": 1000}}, f)
        self.gateway = None
        self.workers = []
        self.gateway_starts = 0

    def gateway_start(self):
        self.gateway_starts += 1
        err = open(os.path.join(self.work, "gateway%d.err" %
                                self.gateway_starts), "w")
        self.gateway = subprocess.Popen(
            [self.pcp, "--gateway", "--gateway-config", self.config,
             "--api-port", str(self.api)],
            env=dict(os.environ, RL_JOIN=JOIN), stderr=err)
        return wait_for(lambda: self.request("GET", "/healthz")[0] == 200, 60,
                        "the gateway answers")

    def workers_start(self, count=2, classes=None):
        """|classes|: each worker's --worker-class (None: none)."""
        for device in range(count):
            extra = (["--worker-class", classes[device]]
                     if classes and classes[device] else [])
            self.workers.append(subprocess.Popen(
                [self.pcp, "--worker", "--connect",
                 "127.0.0.1:%d" % self.fabric, "--device-id", str(device),
                 "--cache-dir", os.path.join(self.work, "cache%d" % device)]
                + extra,
                env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN),
                stderr=open(os.path.join(self.work, "worker%d.err" % device),
                            "a")))
        return self.workers_wait(count)

    def workers_wait(self, count=2):
        return wait_for(lambda: self.request("GET", "/v1/workers")[1].get(
            "counts", {}).get("connected") == count, 120,
            "%d workers connected" % count)

    def request(self, method, path, body=None, timeout=60):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method,
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw.strip() else {}
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw or b"{}")
            except ValueError:
                return e.code, {"raw": raw.decode(errors="replace")}
        except (OSError, ValueError):
            return 0, {}

    def gateway_kill(self):
        self.gateway.send_signal(signal.SIGKILL)
        self.gateway.wait(timeout=30)

    def stop(self):
        procs = ([self.gateway] if self.gateway else []) + self.workers
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()

    def logs(self):
        for name in sorted(os.listdir(self.work)):
            if name.endswith(".err"):
                lines = open(os.path.join(self.work, name),
                             errors="replace").readlines()
                print("--- %s (last 25 lines)" % name)
                print("".join(lines[-25:]), end="")

    def train_base(self, steps=TRAIN_STEPS):
        """The base model: a short DiLoCo job; returns its id."""
        experiment = {
            "name": "rl-base", "model": SPEC, "data_path": DATA,
            "tokenizer": "char", "sampling": "random",
            "learning_rate": 0.003, "tau": 10,
            "outer_loop_steps": steps, "nesterov_momentum": 0.0,
            "outer_learning_rate": 1.0, "checkpoint_every": steps,
            "seed": 3}
        t0 = time.time()
        status, job = self.request("POST", "/v1/training/jobs", experiment)
        check(status == 202, "training job accepted: %s %s" %
              (status, job.get("job_id") or job))
        job_id = job.get("job_id")
        if not job_id:
            return None
        wait_for(lambda: self.request(
            "GET", "/v1/training/jobs/%s" % job_id)[1].get("state") in
            ("succeeded", "failed", "cancelled"), 600, "training to finish",
            interval=0.5)
        _, body = self.request("GET", "/v1/training/jobs/%s" % job_id)
        check(body.get("state") == "succeeded",
              "base training succeeded in %.0f s (loss %s): %s" %
              (time.time() - t0, body.get("training", {}).get("loss"),
               body.get("state")))
        return job_id if body.get("state") == "succeeded" else None

    def prompts_write(self):
        """prompts.jsonl and eval.jsonl under the state dir's data root."""
        paths = []
        for name, names in (("prompts.jsonl", TRAIN_NAMES),
                            ("eval.jsonl", EVAL_NAMES)):
            path = os.path.join(self.data, name)
            with open(path, "w") as f:
                for n in names:
                    f.write(json.dumps({"prompt": "%s:\n" % n}) + "\n")
            paths.append(path)
        return paths


def remove(work):
    shutil.rmtree(work, ignore_errors=True)
