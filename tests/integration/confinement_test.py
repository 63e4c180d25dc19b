#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 13, paths and limits: a real `pcp --gateway` on 127.0.0.1 with an
API token, probed as a client holding the token would:

  1. data_path /etc/passwd -> 403 naming data_path and the roots, nothing
     about the file (no content, no "exist", no size);
  2. a symlink inside a data root pointing outside -> 403;
  3. checkpoint_dir "../.." and an absolute one outside the state dir -> 403;
  4. model_path /etc/shadow -> 403 and the body holds none of its content
     (nor of /etc/passwd's); a non-MLIR file inside a model root -> 400
     whose message quotes none of the file;
  5. a missing data file under a root -> 400 at submit (not a failed job);
  6. a built-in spec of 2.6e13 parameters -> 400 with the bytes it needs;
     a gateway with max_job_gateway_bytes of 1 MiB refuses a small model;
  7. name and seed are not reported as unknown keys (another key is);
  8. the quickstart experiment (examples/quickstart_train.json, relative
     data_path) is accepted (202) with the default roots, and its stored
     data_path is the resolved file in the project's data/;
  9. a numeric key outside its documented range -> 400 naming it;
 10. a stored job re-checked at run: the gateway restarted on the same
     state dir with narrower data_roots fails it naming data_path.
No workers join: every answer here is the submit's. Every wait is bounded.
"""
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

PCP = os.path.abspath(sys.argv[1] if len(sys.argv) > 1
                      else os.environ["PCP_BINARY"])
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKEN = "confine-token"
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    else:
        print("ok:", what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    def __init__(self, work, extra=None):
        self.work = work
        self.state = os.path.join(work, "state")
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        config = {"gateway_id": "confine", "lab_id": "lab",
                  "state_dir": self.state,
                  "api": {"token_env": "CONFINE_TOKEN"},
                  "worker_fabric": {"host": "127.0.0.1",
                                    "port": free_port(),
                                    "join_token_env": "CONFINE_JOIN"}}
        config.update(extra or {})
        path = os.path.join(work, "gateway.json")
        with open(path, "w") as f:
            json.dump(config, f)
        env = dict(os.environ, CONFINE_TOKEN=TOKEN, CONFINE_JOIN="j" * 16)
        self.err = open(os.path.join(work, "gateway.err"), "w")
        # The repository root as working directory, as `make run` has: the
        # quickstart's relative data_path resolves there.
        self.proc = subprocess.Popen(
            [PCP, "--gateway", "--gateway-config", path,
             "--api-port", str(self.port)], env=env, stderr=self.err,
            cwd=ROOT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("gateway exited: see %s" % self.err.name)
            try:
                if self.request("GET", "/healthz", token=None)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("gateway did not answer /healthz in 30 s")

    def request(self, method, path, body=None, token=TOKEN):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = "Bearer " + token
        req = urllib.request.Request(self.base + path, data=data,
                                     method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw, status = r.read(), r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        return status, raw.decode(errors="replace")

    def submit(self, experiment):
        return self.request("POST", "/v1/training/jobs", experiment)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def small(**extra):
    e = {"model": {"kind": "gpt", "layers": 1, "heads": 4, "width": 16,
                   "vocab": 65, "block_size": 8, "batch": 2},
         "data_path": os.path.join(ROOT, "data", "tiny_shakespeare.txt"),
         "tau": 1, "outer_loop_steps": 1}
    e.update(extra)
    return e


def error_of(status, text):
    try:
        body = json.loads(text)
        return body["error"]["code"], body["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None, text


def file_words(path):
    """Tokens of a file's content long enough not to appear by chance."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    words = set()
    for line in text.splitlines():
        for token in line.replace(":", " ").replace(",", " ").split():
            if len(token) >= 6 and not token.startswith("/"):
                words.add(token)
    return sorted(words)


def expect_denied(gw, experiment, key, what, forbidden=()):
    status, text = gw.submit(experiment)
    code, message = error_of(status, text)
    leaks = [w for w in forbidden if w in text]
    check(status == 403 and code == "PERMISSION_DENIED" and
          ("'%s'" % key) in message and gw.state in text and
          "exist" not in text and "bytes" not in text and
          "No such" not in text and not leaks,
          "%s: 403 naming %s and the roots only: %s %s%s" % (
              what, key, status, text[:400],
              " (leaks %s)" % leaks[:3] if leaks else ""))


def main():
    if not os.path.isfile(os.path.join(ROOT, "data", "tiny_shakespeare.txt")):
        print("FAIL: data/tiny_shakespeare.txt is missing (make setup)")
        return 1
    work = tempfile.mkdtemp(prefix="pcp-confine-")
    gw = None
    try:
        gw = Gateway(work)
        data_root = os.path.join(gw.state, "data")
        os.makedirs(data_root, exist_ok=True)
        passwd_words = file_words("/etc/passwd")
        shadow_words = file_words("/etc/shadow")

        # 1. /etc/passwd as data_path.
        expect_denied(gw, small(data_path="/etc/passwd"), "data_path",
                      "data_path /etc/passwd", passwd_words)
        # The same answer for a path that does not exist: nothing tells the
        # two apart.
        s1, t1 = gw.submit(small(data_path="/etc/passwd"))
        s2, t2 = gw.submit(small(data_path="/etc/no-such-file-pcp"))
        check(s1 == s2 == 403 and t1 == t2,
              "an existing and a missing file outside answer the same")

        # 2. A symlink inside a root pointing outside (file and directory).
        os.symlink("/etc/passwd", os.path.join(data_root, "passwd.txt"))
        os.symlink("/etc", os.path.join(data_root, "etc"))
        expect_denied(gw, small(data_path=os.path.join(data_root,
                                                       "passwd.txt")),
                      "data_path", "symlink to a file outside", passwd_words)
        expect_denied(gw, small(data_path=os.path.join(data_root, "etc",
                                                       "passwd")),
                      "data_path", "symlink to a directory outside",
                      passwd_words)
        expect_denied(gw, small(data_path=os.path.join(
            data_root, "..", "..", "..", "..", "etc", "passwd")),
                      "data_path", "'..' out of a root", passwd_words)

        # 3. checkpoint_dir out of the state dir.
        expect_denied(gw, small(checkpoint_dir="../.."), "checkpoint_dir",
                      "checkpoint_dir ../..")
        outside = os.path.join(work, "elsewhere")
        expect_denied(gw, small(checkpoint_dir=outside), "checkpoint_dir",
                      "absolute checkpoint_dir outside the state dir")
        check(not os.path.exists(outside),
              "no directory created for a refused checkpoint_dir")

        # 4. model_path /etc/shadow; a non-MLIR file inside a model root.
        expect_denied(gw, {"model_path": "/etc/shadow",
                           "data_path": small()["data_path"]},
                      "model_path", "model_path /etc/shadow",
                      shadow_words + passwd_words)
        expect_denied(gw, {"model_path": "/etc/passwd",
                           "data_path": small()["data_path"]},
                      "model_path", "model_path /etc/passwd", passwd_words)
        models = os.path.join(gw.state, "models")
        os.makedirs(models, exist_ok=True)
        secret = os.path.join(models, "secret.mlir")
        with open(secret, "w") as f:
            f.write("root-secret-word:$6$saltsalt$hashhash:19000:0:99999\n")
        status, text = gw.submit({"model_path": secret,
                                  "data_path": small()["data_path"]})
        code, message = error_of(status, text)
        check(status == 400 and "'model_path'" in message and
              "secret-word" not in text and "saltsalt" not in text and
              "hashhash" not in text,
              "a non-MLIR module: 400 quoting none of it: %s %s" % (
                  status, text[:300]))

        # 5. A missing data file under a root: 400 at submit.
        status, text = gw.submit(small(data_path=os.path.join(
            data_root, "missing.txt")))
        code, message = error_of(status, text)
        check(status == 400 and code == "INVALID_ARGUMENT" and
              "'data_path'" in message,
              "missing data file under a root: 400 at submit: %s %s" % (
                  status, text[:300]))

        # 6. 2.6e13 parameters.
        huge = small(model={"kind": "gpt", "layers": 512, "heads": 64,
                            "width": 65536, "vocab": 65, "block_size": 1,
                            "batch": 1})
        status, text = gw.submit(huge)
        code, message = error_of(status, text)
        check(status == 400 and "'model'" in message and
              "bytes" in message and "parameters" in message,
              "2.6e13-parameter spec: 400 with the bytes: %s %s" % (
                  status, text[:400]))

        # 7. name and seed are known keys; a made-up one is reported.
        status, text = gw.submit(small(name="probe", seed=3,
                                       not_a_key=1))
        body = json.loads(text) if status == 202 else {}
        unknown = body.get("spec", {}).get("unknown_keys")
        check(status == 202 and unknown == ["not_a_key"],
              "name and seed are not unknown keys: %s %s" % (
                  status, unknown if unknown is not None else text[:300]))

        # 8. The quickstart experiment, as `make run` submits it.
        with open(os.path.join(ROOT, "examples",
                               "quickstart_train.json")) as f:
            quickstart = json.load(f)
        status, text = gw.submit(quickstart)
        body = json.loads(text) if status == 202 else {}
        quickstart_job = body.get("job_id")
        stored = body.get("spec", {}).get("experiment", {}).get("data_path")
        check(status == 202 and stored == os.path.realpath(os.path.join(
            ROOT, "data", "tiny_shakespeare.txt")),
              "the quickstart experiment is accepted: %s %s" % (
                  status, stored or text[:300]))

        # 9. A numeric key outside its documented range.
        for key, value in [("tau", 0), ("learning_rate", 11),
                           ("seed", -1), ("eval_fraction", 0.6)]:
            status, text = gw.submit(small(**{key: value}))
            code, message = error_of(status, text)
            check(status == 400 and ("'%s'" % key) in message,
                  "%s=%r: 400 naming it: %s %s" % (key, value, status,
                                                  text[:200]))
        gw.stop()
        gw = None

        # 10. The same state dir under narrower roots: the stored quickstart
        # job, re-queued by the restart, is checked again before it opens
        # anything and fails naming data_path (a job stored by an older
        # gateway cannot reach files outside today's roots).
        gw = Gateway(work, {"data_roots": [data_root]})
        deadline = time.time() + 30
        job = {}
        while time.time() < deadline:
            status, text = gw.request("GET", "/v1/training/jobs/%s" %
                                      quickstart_job)
            job = json.loads(text) if status == 200 else {}
            if job.get("state") == "failed":
                break
            time.sleep(0.1)
        error = job.get("error") or ""
        check(job.get("state") == "failed" and "data_path" in error and
              "data_roots" in error and "root:" not in error,
              "a stored job outside today's roots fails at run: %s %s" % (
                  job.get("state"), error[:300]))
        gw.stop()
        gw = None

        # 6b. A gateway whose cap is 1 MiB refuses a model of 2 layers of
        # width 64 (about 0.1M parameters, 1.6 MB) and takes the small one.
        os.makedirs(os.path.join(work, "capped"))
        capped = Gateway(os.path.join(work, "capped"), {
            "max_job_gateway_bytes": 1 << 20,
            "data_roots": [os.path.join(ROOT, "data")]})
        gw = capped
        status, text = gw.submit(small(model={
            "kind": "gpt", "layers": 2, "heads": 4, "width": 64,
            "vocab": 65, "block_size": 8, "batch": 2}))
        code, message = error_of(status, text)
        check(status == 400 and "1048576 bytes" in message and
              "max_job_gateway_bytes" in message,
              "a 1 MiB cap refuses a 0.1M-parameter job: %s %s" % (
                  status, text[:400]))
        status, text = gw.submit(small())
        check(status == 202, "under the cap: accepted: %s %s" % (
            status, text[:300]))
    finally:
        if gw:
            gw.stop()
        shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print("%d failure(s)" % len(FAILURES))
        return 1
    print("confinement: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
