#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 12 item 4's test: after a training job, the served model's greedy
reply equals an offline decode of the job's FINAL export.

A real `pcp --gateway` and two real `pcp --worker`s (CPU) run a short
DiLoCo job (a 1-layer char GPT on data/tiny_shakespeare.txt, 4 outer steps,
a checkpoint and so an export every 2 steps and at the end). Each export
notifies the inference service, which reloads the model. Then
tools/check_served_weights.py (the same check `make run` ends with) waits
for /v1/models to report the final export's outer step, asks the gateway
for a greedy chat reply, decodes the prompt offline with
tests/models/jax_reference.py on the exported safetensors and compares the
two token for token.

Also checked: the served version counts the exports (> 1: a checkpoint's
export was served, then replaced), the model.json names the weights' size
and SHA-256, and the check FAILS against other weights (the final export
with its last layer norm negated), so it cannot pass anything.

usage: served_weights_test.py PCP
"""
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
CHECK = os.path.join(ROOT, "tools", "check_served_weights.py")
JOIN = "served-join"
FAILURES = []
STEPS = 4


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except OSError:
        return 0, {}


def wait_for(pred, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    check(False, "timed out after %ds: %s" % (seconds, what))
    return None


def main():
    work = tempfile.mkdtemp(prefix="pcp-served-")
    api, fabric = free_port(), free_port()
    base = "http://127.0.0.1:%d" % api
    state = os.path.join(work, "state")
    config = os.path.join(work, "gateway.json")
    with open(config, "w") as f:
        json.dump({"gateway_id": "gw-served", "lab_id": "lab",
                   "state_dir": state,
                   "worker_fabric": {"host": "127.0.0.1", "port": fabric,
                                     "join_token_env": "SERVED_JOIN",
                                     "heartbeat_ms": 1000}}, f)
    procs = []
    ok = False
    try:
        procs.append(subprocess.Popen(
            [PCP, "--gateway", "--gateway-config", config, "--api-port",
             str(api)], env=dict(os.environ, SERVED_JOIN=JOIN),
            stderr=open(os.path.join(work, "gateway.err"), "w")))
        for device in (0, 1):
            procs.append(subprocess.Popen(
                [PCP, "--worker", "--connect", "127.0.0.1:%d" % fabric,
                 "--device-id", str(device), "--cache-dir",
                 os.path.join(work, "cache%d" % device)],
                env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN),
                stderr=open(os.path.join(work, "worker%d.err" % device),
                            "w")))
        if not wait_for(lambda: request(base, "GET", "/v1/workers")[1].get(
                "counts", {}).get("connected") == 2, 60, "two workers"):
            return
        experiment = {
            "name": "served-char",
            "model": {"kind": "gpt", "layers": 1, "heads": 4, "width": 32,
                      "vocab": 65, "block_size": 32, "batch": 4},
            "data_path": os.path.join(ROOT, "data", "tiny_shakespeare.txt"),
            "tokenizer": "char", "sampling": "random",
            "learning_rate": 0.003, "tau": 4, "outer_loop_steps": STEPS,
            "nesterov_momentum": 0.0, "outer_learning_rate": 1.0,
            "checkpoint_every": 2, "seed": 3}
        status, job = request(base, "POST", "/v1/training/jobs", experiment)
        check(status == 202, "training job accepted: %s %s" % (status, job))
        job_id = job.get("job_id")
        if not job_id:
            return
        export = os.path.join(state, "models", job_id)
        done = wait_for(lambda: request(
            base, "GET", "/v1/training/jobs/%s" % job_id)[1].get("state") in
            ("succeeded", "failed", "cancelled"), 900, "the job to finish")
        status, body = request(base, "GET", "/v1/training/jobs/%s" % job_id)
        check(done and body.get("state") == "succeeded",
              "training job succeeded: %s" % body.get("state"))
        with open(os.path.join(export, "model.json")) as f:
            meta = json.load(f)
        with open(os.path.join(export, "model.safetensors"), "rb") as f:
            weights = f.read()
        check(meta.get("outer_step") == STEPS and meta.get("job_id") == job_id,
              "the final export is outer step %d of %s: %s" %
              (STEPS, job_id, {k: meta.get(k) for k in
                               ("outer_step", "job_id")}))
        check(meta.get("weights_bytes") == len(weights) and
              meta.get("weights_sha256") ==
              hashlib.sha256(weights).hexdigest(),
              "model.json names the weights' size and SHA-256")

        cmd = [sys.executable, CHECK, "--url", base, "--model", "served-char",
               "--models-root", os.path.join(state, "models"), "--prompt",
               "ROMEO:", "--max-tokens", "24", "--pcp", PCP, "--wait-s",
               "300"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        print(r.stdout + r.stderr, end="", flush=True)
        check(r.returncode == 0 and
              "served reply equals the offline decode of the final export "
              "(outer step %d)" % STEPS in r.stdout,
              "the served greedy reply equals the offline decode of the "
              "final export (rc %d)" % r.returncode)
        status, info = request(base, "GET", "/v1/models/served-char")
        check(info.get("version", 0) >= 2 and info.get("job_id") == job_id and
              info.get("outer_step") == STEPS,
              "served version %s (> 1: checkpoint exports were reloaded): %s"
              % (info.get("version"), info))

        # The same check against other weights must fail (else it would
        # pass anything): the final export with its final layer norm's
        # scale negated (the logits negate: the argmax becomes the argmin),
        # presented as the served export.
        from safetensors.numpy import load_file, save_file
        other = os.path.join(work, "other-export")
        os.makedirs(other)
        tensors = load_file(os.path.join(export, "model.safetensors"))
        tensors["transformer.ln_f.weight"] = \
            -tensors["transformer.ln_f.weight"]
        tensors["transformer.ln_f.bias"] = -tensors["transformer.ln_f.bias"]
        save_file(tensors, os.path.join(other, "model.safetensors"))
        with open(os.path.join(other, "model.safetensors"), "rb") as f:
            meta["weights_sha256"] = hashlib.sha256(f.read()).hexdigest()
        with open(os.path.join(other, "model.json"), "w") as f:
            json.dump(meta, f)
        r = subprocess.run(cmd[:cmd.index("--models-root")] +
                           ["--export", other] + cmd[cmd.index("--prompt"):],
                           capture_output=True, text=True, timeout=600)
        check(r.returncode == 1 and "differs" in r.stderr,
              "the check fails on other weights (rc %d: %s)" %
              (r.returncode, r.stderr.strip()[-300:]))
        ok = True
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if FAILURES or not ok:
            print("logs kept in", work)
            path = os.path.join(work, "gateway.err")
            if os.path.exists(path):
                print("".join(open(path).readlines()[-40:]))
        else:
            shutil.rmtree(work, ignore_errors=True)
    return ok


if __name__ == "__main__":
    finished = main()
    if not finished and not FAILURES:
        FAILURES.append("the test stopped early")
    print("%d failed" % len(FAILURES))
    sys.exit(1 if FAILURES else 0)
