#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`pcp submit rl` (and `pcp submit train`'s shared follow loop) against a
fake gateway: a stdlib http.server on 127.0.0.1 that answers POST
/v1/rl/jobs and GET /v1/jobs/{id} from a script, so the client's control
flow is checked without workers (the real gateway's run is the RL e2e):

  1. 202 then a job that advances (queued, 3 iterations, succeeded): exit
     0, the id, one progress line per change (iteration, reward mean +- std,
     KL, clip fraction, tok/s, eval reward when present), the posted bytes
     are the file's, the bearer token from --api-token-env is sent;
  2. a job that fails: exit 1 and the job's error printed;
  3. a 400 with a JSON error: exit 1 with the server's message;
  4. a file over 1 MiB: exit 1, refused before any request;
  5. Ctrl-C while following: exit 130, the job is NOT cancelled (no cancel
     request; the training submit never cancelled either);
  6. on a terminal (a pty) the line is rewritten in place (\\r ... ESC[K);
  7. usage errors exit 2; --no-follow posts only; --help names `rl`;
  8. `pcp submit train` through the same loop prints the same line as
     before the refactor.
Every wait is bounded.
"""
import http.server
import json
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

PCP = sys.argv[1] if len(sys.argv) > 1 else "build/pcp"
TOKEN = "submit-rl-token"
FAILURES = []


def check(ok, what):
    print("%s: %s" % ("ok" if ok else "FAIL", what), flush=True)
    if not ok:
        FAILURES.append(what)


def rl_progress(i, n, eval_mean=None):
    h = [{"iteration": k, "reward_mean": 0.1 * k, "reward_std": 0.05,
          "kl": 0.001 * k, "clip_fraction": 0.01 * k} for k in range(1, i + 1)]
    return {"iteration": i, "num_iterations": n, "policy_version": i,
            "served_model": "rl-fake", "reward_mean": 0.1 * i,
            "reward_std": 0.05, "kl": 0.001 * i, "clip_fraction": 0.01 * i,
            "mean_ratio": 1.0, "loss": -0.1, "grad_norm": 0.5,
            "tokens_per_second": 1000.0 + i, "rollout_tokens": 640 * i,
            "stale_dropped": 0, "degenerate_groups": 0, "truncated_tokens": 0,
            "weight_refresh_seconds": 0.01, "weight_refresh_bytes": 4096,
            "eval_reward_mean": eval_mean, "checkpoint_iteration": i,
            "history": h}


class Fake:
    """Scripted jobs: the experiment's "name" picks the script; each GET
    returns the script's next step (the last one repeats)."""

    def __init__(self):
        self.requests = []  # (method, path, headers, body)
        self.jobs = {}  # id -> [job JSON per GET]
        self.lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                with fake.lock:
                    fake.requests.append(("POST", self.path,
                                          dict(self.headers), body))
                if self.path.endswith("/cancel"):
                    self.answer(200, {"state": "cancelling"})
                    return
                name = json.loads(body).get("name", "")
                code, job = fake.script(self.path, name)
                self.answer(code, job)

            def do_GET(self):
                with fake.lock:
                    fake.requests.append(("GET", self.path,
                                          dict(self.headers), b""))
                    job_id = self.path.rsplit("/", 1)[-1]
                    steps = self.jobs_for(job_id)
                if steps is None:
                    self.answer(404, {"error": {"code": "NOT_FOUND",
                                                "message": "no job"}})
                    return
                self.answer(200, steps.pop(0) if len(steps) > 1 else steps[0])

            def jobs_for(self, job_id):
                return fake.jobs.get(job_id)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      Handler)
        self.base = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def script(self, path, name):
        spec = {"experiment": {"name": name, "num_iterations": 3}}

        def job(job_id, state, rl=None, error=None, kind="rl"):
            j = {"job_id": job_id, "kind": kind, "state": state, "spec": spec}
            if rl is not None:
                j["rl"] = rl
            if error is not None:
                j["error"] = error
            return j

        if path == "/v1/training/jobs":
            t = {"outer_step": 1, "outer_loop_steps": 2, "loss": 2.5,
                 "tokens_per_s": 100.0, "wire_bytes": 1048576, "lr": 1e-3}
            t2 = dict(t, outer_step=2, loss=2.25, val_loss=2.3)
            steps = [job("tr-ok", "running", kind="training"),
                     dict(job("tr-ok", "running", kind="training"),
                          training=t),
                     dict(job("tr-ok", "succeeded", kind="training"),
                          training=t2)]
            with self.lock:
                self.jobs["tr-ok"] = steps
            return 202, steps[0]
        if path != "/v1/rl/jobs":
            return 404, {"error": {"code": "NOT_FOUND", "message": path}}
        if name == "bad":
            return 400, {"error": {"code": "INVALID_ARGUMENT",
                                   "message": "group_size: must be in "
                                              "[2, 1024]"}}
        if name == "ok":
            steps = [job("rl-ok", "queued"),
                     job("rl-ok", "running"),
                     job("rl-ok", "running", rl_progress(1, 3)),
                     job("rl-ok", "running", rl_progress(1, 3)),  # no change
                     job("rl-ok", "running", rl_progress(2, 3, 0.25)),
                     job("rl-ok", "running", rl_progress(3, 3, 0.5)),
                     job("rl-ok", "succeeded", rl_progress(3, 3, 0.5))]
        elif name == "fail":
            steps = [job("rl-fail", "queued"),
                     job("rl-fail", "running", rl_progress(1, 3)),
                     job("rl-fail", "failed", rl_progress(1, 3),
                         error="verifier http://127.0.0.1:9/score: "
                               "connection refused after 3 tries")]
        else:  # "hang": runs until cancelled
            steps = [job("rl-hang", "running", rl_progress(1, 3))]
        with self.lock:
            self.jobs[steps[0]["job_id"]] = steps
        return 202, steps[0]

    def take(self):
        with self.lock:
            out, self.requests = self.requests, []
        return out

    def close(self):
        self.server.shutdown()


def run(args, env_token=True, timeout=30):
    env = dict(os.environ)
    if env_token:
        env["SUBMIT_RL_TOKEN"] = TOKEN
    p = subprocess.run([PCP, "submit"] + args, capture_output=True, text=True,
                       env=env, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def write(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f)
    return path


def main():
    fake = Fake()
    work = tempfile.mkdtemp(prefix="pcp-submit-rl-")
    common = ["--gateway", fake.base, "--poll-ms", "10",
              "--api-token-env", "SUBMIT_RL_TOKEN"]
    try:
        # 1. Success.
        path = write(os.path.join(work, "ok.json"),
                     {"name": "ok", "num_iterations": 3})
        rc, out, err = run(["rl", path] + common)
        lines = out.splitlines()
        check(rc == 0, "success exits 0 (rc %d, stderr %r)" % (rc, err))
        check(lines and lines[0] == "job rl-ok",
              "prints the id: %r" % lines[:1])
        progress = [l for l in lines if l.startswith("[")]
        check(any("iter 1/3 reward 0.100 +- 0.050 kl 0.0010 clip 0.010 "
                  "tok/s 1001 running" in l for l in progress),
              "iteration 1 line: %r" % progress)
        check(any("iter 2/3 reward 0.200 +- 0.050 kl 0.0020 clip 0.020 "
                  "tok/s 1002 eval 0.250 running" in l for l in progress),
              "iteration 2 line with the eval reward: %r" % progress)
        check(any(l.startswith("[" + "#" * 30 + "] iter 3/3") and
                  l.endswith("succeeded") for l in progress),
              "a full bar at the end: %r" % progress[-1:])
        check(progress and "iter 0/3 reward - +- - kl - clip - tok/s - queued"
              in progress[0],
              "before the first iteration the experiment gives the total: %r"
              % progress[:1])
        check(len(progress) == len(set(progress)),
              "one line per change (no repeats): %r" % progress)
        check("job rl-ok succeeded" in lines and
              "final reward_mean 0.3000 eval_reward_mean 0.5000" in lines and
              "policy served as model rl-fake" in lines,
              "the end: state, final reward, served model: %r" % lines[-3:])
        reqs = fake.take()
        posts = [r for r in reqs if r[0] == "POST"]
        gets = [r for r in reqs if r[0] == "GET"]
        with open(path, "rb") as f:
            sent = f.read()
        check(len(posts) == 1 and posts[0][1] == "/v1/rl/jobs" and
              posts[0][3] == sent,
              "one POST /v1/rl/jobs with the file's bytes")
        check(posts and posts[0][2].get("Authorization") == "Bearer " + TOKEN,
              "bearer token from --api-token-env")
        check(gets and all(g[1] == "/v1/jobs/rl-ok" for g in gets),
              "follows GET /v1/jobs/{id}: %r" % sorted({g[1] for g in gets}))

        # 2. A failed job.
        path = write(os.path.join(work, "fail.json"), {"name": "fail"})
        rc, out, err = run(["rl", path] + common)
        check(rc == 1, "a failed job exits 1 (rc %d)" % rc)
        check("job rl-fail failed: verifier http://127.0.0.1:9/score: "
              "connection refused after 3 tries" in out,
              "the job's error is printed: %r" % out[-200:])
        fake.take()

        # 3. A 400 with a JSON error.
        path = write(os.path.join(work, "bad.json"), {"name": "bad"})
        rc, out, err = run(["rl", path] + common)
        check(rc == 1, "a 400 exits 1 (rc %d)" % rc)
        check("HTTP 400: group_size: must be in [2, 1024]" in err and
              err.startswith("pcp submit: "),
              "the server's message: %r" % err)
        check(len(fake.take()) == 1, "a refused post is not followed")

        # 4. Over 1 MiB: refused before any request.
        big = os.path.join(work, "big.json")
        with open(big, "w") as f:
            f.write('{"name": "ok", "pad": "%s"}' % ("x" * (1 << 20)))
        rc, out, err = run(["rl", big] + common)
        check(rc == 1 and "is over 1 MiB" in err,
              "a file over 1 MiB is refused: rc %d %r" % (rc, err))
        check(fake.take() == [], "no request sent for the big file")

        # 5. Ctrl-C while following: exit 130, no cancel.
        path = write(os.path.join(work, "hang.json"), {"name": "hang"})
        env = dict(os.environ, SUBMIT_RL_TOKEN=TOKEN)
        p = subprocess.Popen([PCP, "submit", "rl", path] + common,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
        deadline = time.time() + 20
        while time.time() < deadline and not any(
                r[0] == "GET" for r in list(fake.requests)):
            time.sleep(0.02)
        time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        check(p.returncode == 130, "Ctrl-C exits 130 (rc %s)" % p.returncode)
        check("job rl-hang keeps running" in out,
              "says the job keeps running: %r" % out[-200:])
        reqs = fake.take()
        check(not any(r[1].endswith("/cancel") for r in reqs),
              "Ctrl-C does not cancel the job")

        # 6. A terminal: the line is rewritten in place.
        path = os.path.join(work, "ok.json")
        pid, fd = pty.fork()
        if pid == 0:
            os.environ["SUBMIT_RL_TOKEN"] = TOKEN
            os.execv(PCP, [PCP, "submit", "rl", path] + common)
        data = b""
        deadline = time.time() + 30
        while time.time() < deadline:
            r, _, _ = select.select([fd], [], [], 0.5)
            if not r:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        _, status = os.waitpid(pid, 0)
        text = data.decode(errors="replace")
        check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0,
              "on a tty: exit 0 (status %d)" % status)
        check(text.count("\r[") >= 3 and "\x1b[K" in text and
              "job rl-ok succeeded" in text,
              "on a tty the line is rewritten in place: %r" % text[-300:])
        fake.take()

        # 7. Usage, --no-follow, --help.
        rc, out, err = run(["rl"])
        check(rc == 2 and "expected one experiment file after 'rl'" in err,
              "no file: exit 2: %r" % err)
        rc, out, err = run(["grpo", path])
        check(rc == 2 and "expected 'train EXP.json' or 'rl EXP.json', got "
              "'grpo'" in err, "unknown kind: exit 2: %r" % err)
        rc, out, err = run(["rl", path, "--no-follow"] + common)
        reqs = fake.take()
        check(rc == 0 and out.strip() == "job rl-ok" and
              [r[0] for r in reqs] == ["POST"],
              "--no-follow: the id, no GET (rc %d, %r)" % (rc, out))
        rc, out, err = run(["--help"])
        check(rc == 0 and "pcp submit rl EXP.json" in out and
              "/v1/rl/jobs" in out, "--help names submit rl")
        check(fake.take() == [], "usage errors send nothing")

        # 8. Training through the shared loop: the same line as before.
        path = write(os.path.join(work, "train.json"), {"name": "t"})
        rc, out, err = run(["train", path] + common)
        lines = out.splitlines()
        check(rc == 0 and lines[0] == "job tr-ok", "train: exit 0, the id")
        bar = "#" * 15 + "." * 15
        check("[%s] step 1/2 loss 2.5000 val - lr 1.00e-03 tok/s 100 wire "
              "1.00 MiB running" % bar in lines,
              "train: the progress line is unchanged: %r" % lines)
        check("job tr-ok succeeded" in lines and
              "final val_loss 2.3000" in lines, "train: the end")
        gets = {r[1] for r in fake.take() if r[0] == "GET"}
        check(gets == {"/v1/training/jobs/tr-ok"},
              "train follows its own route: %r" % gets)
    finally:
        fake.close()
    if FAILURES:
        print("%d failure(s)" % len(FAILURES), file=sys.stderr)
        return 1
    print("submit rl test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
