#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Served weights follow the model directory: a real `pcp --gateway` serving
a toy GPT (--model-dir) on a real `pcp --worker`, its directory rewritten
the way a training job's checkpoints rewrite theirs (model.safetensors by
rename, then model.json by rename, naming the weights' size and SHA-256).

  1. A streamed request is started on version 1 and kept in flight (the
     gateway's test hook pauses 100 ms after every scheduling round).
  2. The directory is rewritten with other weights: /v1/models shows
     version 2 (with the export's job_id and outer_step) while the stream
     is still running; a new request then equals the JAX greedy reference
     of the NEW weights, and the stream, when it ends, equals the reference
     of the OLD ones token for token (it finished on the version it began
     on); pcp_model_reloads_total{outcome="ok"} counts it; the old runner
     retires (gateway log).
  3. A model.json whose weights_sha256 does not match the weights file (a
     directory caught mid-rewrite) is not served: reload_error says so,
     outcome="failed" counts it, version 2 keeps answering; the next
     correct model.json is served.
  4. A new directory under <state_dir>/models with a newer model.json of
     the same name (a new training job with the same name) takes over.

References: tests/models/jax_reference.py through inference_models.py
(independent JAX), full forward per token, f32.

usage: inference_reload_test.py PCP
"""
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inference_models as im  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
JOIN = "reload-join"
FAILURES = []
PROMPT = "hello"
LONG = 80   # tokens of the request kept in flight (100 ms per step)
SHORT = 8


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(base, path, timeout=10):
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def complete(base, max_tokens):
    body = json.dumps({"model": "gpt-char", "prompt": PROMPT,
                       "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body,
                                 method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["text"]


def model_info(base):
    status, body = get(base, "/v1/models/gpt-char")
    return json.loads(body) if status == 200 else {}


def metric(base, name, labels):
    _, text = get(base, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + "{") and all(l in line for l in labels):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(what, pred, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    print("timed out after %ds waiting for %s" % (timeout_s, what), flush=True)
    return None


class Stream(threading.Thread):
    """A streamed completion read piece by piece; |first| is set at the
    first text, |done_at| when the stream ended."""

    def __init__(self, port, max_tokens):
        super().__init__(daemon=True)
        self.port, self.max_tokens = port, max_tokens
        self.text, self.error, self.done_at = "", None, None
        self.first = threading.Event()

    def run(self):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                              timeout=120)
            conn.request("POST", "/v1/completions", json.dumps(
                {"model": "gpt-char", "prompt": PROMPT, "stream": True,
                 "max_tokens": self.max_tokens, "temperature": 0}),
                {"Content-Type": "application/json"})
            resp = conn.getresponse()
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    self.error = event["error"]
                    break
                self.text += event["choices"][0].get("text") or ""
                self.first.set()
            conn.close()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.error = repr(e)
        self.done_at = time.time()
        self.first.set()


def write_atomic(path, data, mtime_ns=None):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    if mtime_ns is not None:
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, path)


def export(model, target_dir, name="gpt-char", job_id=None, outer_step=None,
           claim=None, mtime_ns=None):
    """Writes |model|'s weights then model.json into |target_dir| the way a
    training export does; |claim| overrides the weights hash model.json
    names (a model.json that does not match its weights); |mtime_ns| sets
    model.json's modification time."""
    os.makedirs(target_dir, exist_ok=True)
    with open(os.path.join(model.dir, "model.safetensors"), "rb") as f:
        weights = f.read()
    write_atomic(os.path.join(target_dir, "model.safetensors"), weights)
    with open(os.path.join(model.dir, "model.json")) as f:
        meta = json.load(f)
    meta.update(name=name, weights_bytes=len(weights),
                weights_sha256=claim or hashlib.sha256(weights).hexdigest())
    if job_id:
        meta.update(job_id=job_id, outer_step=outer_step)
    write_atomic(os.path.join(target_dir, "model.json"),
                 json.dumps(meta, indent=1).encode(), mtime_ns)


def main():
    work = tempfile.mkdtemp(prefix="pcp-reload-")
    tables = os.path.join(work, "tables")
    os.makedirs(tables)
    # Four weight sets of one shape; each in a scratch dir of its own.
    # The token embedding is scaled down so that the layers, not the last
    # token's own embedding through the tied head, choose the next token:
    # each set then answers differently (unscaled, all repeat the prompt's
    # last character).
    from safetensors.numpy import save_file
    models = []
    for seed in (21, 22, 23, 24):
        root = os.path.join(tables, "s%d" % seed)
        os.makedirs(root)
        m = im.Model(PCP, root, im.GPT, seed)
        m.params["transformer.wte.weight"] *= 0.1
        save_file(m.params, os.path.join(m.dir, "model.safetensors"))
        models.append(m)
    prompt_ids = models[0].encode_prompt(PROMPT)
    want = [m.decode(m.greedy(prompt_ids, LONG)[0]) for m in models]
    check(len(set(w[:SHORT] for w in want)) == 4,
          "the four weight sets answer differently (else nothing is shown): "
          "%s" % [w[:SHORT] for w in want])
    served_dir = os.path.join(work, "served", "gpt-char")
    export(models[0], served_dir)

    api, fabric = free_port(), free_port()
    base = "http://127.0.0.1:%d" % api
    state = os.path.join(work, "state")
    config = os.path.join(work, "gateway.json")
    with open(config, "w") as f:
        json.dump({"gateway_id": "gw-reload", "lab_id": "lab",
                   "state_dir": state,
                   "worker_fabric": {"host": "127.0.0.1", "port": fabric,
                                     "join_token_env": "RELOAD_JOIN",
                                     "heartbeat_ms": 200}}, f)
    gw_log = os.path.join(work, "gateway.err")
    env = dict(os.environ, RELOAD_JOIN=JOIN,
               PCP_GATEWAY_TEST_INFER_STEP_DELAY_MS="100")
    procs = []
    ok = False
    try:
        procs.append(subprocess.Popen(
            [PCP, "--gateway", "--gateway-config", config, "--api-port",
             str(api), "--model-dir", served_dir],
            env=env, stderr=open(gw_log, "w")))
        procs.append(subprocess.Popen(
            [PCP, "--worker", "--connect", "127.0.0.1:%d" % fabric,
             "--cache-dir", os.path.join(work, "cache")],
            env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN),
            stderr=open(os.path.join(work, "worker.err"), "w")))
        ready = wait_for("/readyz", lambda: _ready(base), 600)
        check(bool(ready), "gateway ready with version 1 served")
        if not ready:
            return
        info = model_info(base)
        check(info.get("version") == 1 and info.get("outer_step") is None,
              "version 1 listed: %s" % info)

        # 1-2. A stream in flight across the reload.
        stream = Stream(api, LONG)
        stream.start()
        check(stream.first.wait(60) and stream.error is None,
              "stream on version 1 started")
        export(models[1], served_dir, job_id="job-b", outer_step=7)
        get(base, "/v1/models")  # a listing scans the directories
        info = wait_for("version 2", lambda: _version(base, 2), 120)
        in_flight = stream.done_at is None
        check(bool(info) and info.get("outer_step") == 7 and
              info.get("job_id") == "job-b" and info.get("status") == "ready",
              "version 2 served with the export's job and outer step: %s" %
              info)
        check(in_flight, "the stream was still in flight when version 2 "
              "took over (%d chars so far)" % len(stream.text))
        text = complete(base, SHORT)
        check(text == want[1][:SHORT],
              "a new request answers with the new weights: %r == %r" %
              (text, want[1][:SHORT]))
        check(stream.done_at is None,
              "... while the stream on version 1 is still running")
        stream.join(120)
        check(stream.error is None and stream.text == want[0],
              "the in-flight stream finished on version 1, token for token "
              "the reference of the old weights (%r, error %s)" %
              (stream.text[:40], stream.error))
        check(metric(base, "pcp_model_reloads_total",
                     ['model="gpt-char"', 'outcome="ok"']) == 1,
              "pcp_model_reloads_total{outcome=ok} == 1")
        retired = wait_for("the old runner to retire", lambda: _grep(
            gw_log, "inference runner retired model=gpt-char version=1"), 30)
        check(bool(retired), "the version 1 runner retired once idle")

        # 3. model.json naming other bytes than the weights file holds.
        export(models[2], served_dir, job_id="job-b", outer_step=8,
               claim="0" * 64)
        get(base, "/v1/models")
        info = wait_for("the failed reload", lambda: _reload_error(base), 60)
        check(bool(info) and info.get("version") == 2 and
              "not the file model.json commits to" in
              info.get("reload_error", ""),
              "a mismatched weights file is not served: %s" % info)
        check(metric(base, "pcp_model_reloads_total",
                     ['model="gpt-char"', 'outcome="failed"']) == 1,
              "pcp_model_reloads_total{outcome=failed} == 1")
        text = complete(base, SHORT)
        check(text == want[1][:SHORT],
              "version 2 still answers: %r" % text)
        export(models[2], served_dir, job_id="job-b", outer_step=9)
        get(base, "/v1/models")
        info = wait_for("version 4", lambda: _version(base, 4), 120)
        check(bool(info) and info.get("outer_step") == 9 and
              "reload_error" not in info,
              "the next correct model.json is served: %s" % info)
        text = complete(base, SHORT)
        check(text == want[2][:SHORT],
              "version 4 answers with its weights: %r == %r" %
              (text, want[2][:SHORT]))

        # 4. Another directory, a newer model.json, the same name.
        # Strictly newer than version 4's model.json by construction, not
        # by a sleep and the clock's resolution.
        newer = os.stat(os.path.join(served_dir, "model.json")).st_mtime_ns \
            + 10 * 1000 * 1000
        export(models[3], os.path.join(state, "models", "job-c"),
               job_id="job-c", outer_step=3, mtime_ns=newer)
        get(base, "/v1/models")
        info = wait_for("version 5", lambda: _version(base, 5), 120)
        check(bool(info) and info.get("job_id") == "job-c",
              "a new job's export of the same name takes over: %s" % info)
        text = complete(base, SHORT)
        check(text == want[3][:SHORT],
              "version 5 answers with its weights: %r == %r" %
              (text, want[3][:SHORT]))
        check(metric(base, "pcp_model_reloads_total",
                     ['model="gpt-char"', 'outcome="ok"']) == 3,
              "pcp_model_reloads_total{outcome=ok} == 3")
        ok = True
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if FAILURES or not ok:
            print("logs kept in", work)
            for name in ("gateway.err", "worker.err"):
                path = os.path.join(work, name)
                if os.path.exists(path):
                    print("--- tail of", name)
                    print("".join(open(path).readlines()[-30:]))
        else:
            shutil.rmtree(work, ignore_errors=True)
    return ok


def _ready(base):
    try:
        return get(base, "/readyz")[0] == 200
    except OSError:
        return False


def _version(base, number):
    info = model_info(base)
    return info if info.get("version") == number and \
        info.get("status") == "ready" else None


def _reload_error(base):
    info = model_info(base)
    return info if info.get("reload_error") else None


def _grep(path, text):
    with open(path) as f:
        return text in f.read()


if __name__ == "__main__":
    finished = main()
    if not finished and not FAILURES:
        FAILURES.append("the test stopped early")
    print("%d failed" % len(FAILURES))
    sys.exit(1 if FAILURES else 0)
