#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Served model versions are jobs of kind "inference" (issue 14): a real
`pcp --gateway` and a real `pcp --worker`, a toy GPT under
<state_dir>/models (where training exports go).

  1. The served model shows up in GET /v1/jobs?kind=inference as one job,
     running, whose events went queued -> placing -> compiling -> running,
     with "inference": {model, version, workers} in its JSON.
  2. A newer model.json: the old job ends succeeded with the placement
     "replaced by version 2", a new job runs and answers.
  3. A gateway restart (same state dir) resumes the same job ids: no
     second job for a model.json already seen; the served one runs again.
  4. POST /v1/jobs/{id}/cancel: the job ends cancelled, the model is no
     longer listed and a completion for it gets 404 model_not_found; the
     periodic scan does not bring it back; a rewritten model.json does (a
     new job, running, answering).

usage: inference_jobs_test.py PCP
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inference_models as im  # noqa: E402
import inference_reload_test as rt  # noqa: E402  (export, free_port, ...)

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
JOIN = "jobs-join"
FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def call(base, method, path, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"raw": text.decode(errors="replace")}
    except OSError:
        return 0, {}  # not listening (yet, or again after a restart)


def inference_jobs(base):
    status, body = call(base, "GET", "/v1/jobs?kind=inference")
    return body.get("jobs", []) if status == 200 else []


def job(base, job_id):
    status, body = call(base, "GET", "/v1/jobs/" + job_id)
    return body if status == 200 else {}


def complete(base):
    return call(base, "POST", "/v1/completions",
                {"model": "gpt-char", "prompt": "hello", "max_tokens": 4,
                 "temperature": 0}, timeout=120)


def served(base, version):
    status, info = call(base, "GET", "/v1/models/gpt-char")
    return status == 200 and info.get("version") == version and \
        info.get("status") == "ready"


def start_gateway(work, config, api, env):
    return subprocess.Popen(
        [PCP, "--gateway", "--gateway-config", config, "--api-port",
         str(api)], env=env,
        stderr=open(os.path.join(work, "gateway.err"), "a"))


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()


def running_job(base, version):
    jobs = [j for j in inference_jobs(base) if j["state"] == "running" and
            j.get("inference", {}).get("version") == version]
    return jobs[0] if len(jobs) == 1 else None


def main():
    work = tempfile.mkdtemp(prefix="pcp-infer-jobs-")
    tables = os.path.join(work, "tables")
    models = []
    for seed in (31, 32):
        root = os.path.join(tables, "s%d" % seed)
        os.makedirs(root)
        models.append(im.Model(PCP, root, im.GPT, seed))
    state = os.path.join(work, "state")
    served_dir = os.path.join(state, "models", "gpt-char")
    rt.export(models[0], served_dir)

    api, fabric = rt.free_port(), rt.free_port()
    base = "http://127.0.0.1:%d" % api
    config = os.path.join(work, "gateway.json")
    with open(config, "w") as f:
        json.dump({"gateway_id": "gw-jobs", "lab_id": "lab",
                   "state_dir": state,
                   "worker_fabric": {"host": "127.0.0.1", "port": fabric,
                                     "join_token_env": "JOBS_JOIN",
                                     "heartbeat_ms": 200}}, f)
    env = dict(os.environ, JOBS_JOIN=JOIN)
    gateway = worker = None
    ok = False
    try:
        gateway = start_gateway(work, config, api, env)
        worker = subprocess.Popen(
            [PCP, "--worker", "--connect", "127.0.0.1:%d" % fabric,
             "--cache-dir", os.path.join(work, "cache")],
            env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN),
            stderr=open(os.path.join(work, "worker.err"), "w"))

        # 1. One job, running.
        first = rt.wait_for("a running inference job",
                            lambda: running_job(base, 1), 600)
        check(bool(first), "the served model is an inference job, running")
        if not first:
            return False
        jobs = inference_jobs(base)
        check(len(jobs) == 1, "exactly one inference job: %s" %
              [(j["job_id"], j["state"]) for j in jobs])
        spec = first.get("spec", {})
        check(spec.get("name") == "gpt-char" and
              spec.get("dir") == served_dir and spec.get("pinned") is False,
              "its spec names the model and its directory: %s" % spec)
        progress = first.get("inference", {})
        check(progress.get("model") == "gpt-char" and
              progress.get("workers", 0) >= 1,
              "its JSON has the live inference progress: %s" % progress)
        status, events = call(base, "GET",
                              "/v1/jobs/%s/events" % first["job_id"])
        tos = [e.get("to") for e in events.get("events", []) if e.get("to")]
        check(tos[:4] == ["queued", "placing", "compiling", "running"],
              "its states went queued, placing, compiling, running: %s" % tos)
        status, body = complete(base)
        check(status == 200, "version 1 answers: %s" % status)
        status, body = complete(base)
        live = job(base, first["job_id"]).get("inference", {})
        check(live.get("requests", 0) >= 2 and
              live.get("generated_tokens", 0) >= 1,
              "requests and tokens show in the job: %s" % live)

        # 2. A newer model.json replaces it.
        rt.export(models[1], served_dir, job_id="train-7", outer_step=7)
        second = rt.wait_for("version 2 running",
                             lambda: running_job(base, 2), 300)
        check(bool(second) and second["job_id"] != first["job_id"],
              "a newer model.json is a new job, running")
        old = rt.wait_for("the old job to end", lambda: (
            lambda j: j if j.get("state") == "succeeded" else None)(
                job(base, first["job_id"])), 60)
        check(bool(old) and old.get("placement", {}).get("reason") ==
              "replaced by version 2",
              "the old job succeeded, replaced by version 2: %s" %
              (old or {}).get("placement"))
        if second:
            check(second.get("spec", {}).get("job_id") == "train-7" and
                  second.get("spec", {}).get("outer_step") == 7,
                  "the new job's spec has the export's job and step: %s" %
                  second.get("spec"))
        status, _ = complete(base)
        check(status == 200, "version 2 answers: %s" % status)
        if not second:
            return False

        # 3. Restart: the same ids.
        stop(gateway)
        gateway = start_gateway(work, config, api, env)
        again = rt.wait_for("the job running again after a restart",
                            lambda: running_job(base, 1), 300)
        ids = sorted(j["job_id"] for j in inference_jobs(base))
        check(ids == sorted([first["job_id"], second["job_id"]]),
              "after a restart the same job ids, no duplicate: %s" % ids)
        check(bool(again) and again["job_id"] == second["job_id"],
              "the served version's job resumed under its id")
        check(job(base, first["job_id"]).get("state") == "succeeded",
              "the replaced job stays succeeded")
        status, _ = complete(base)
        check(status == 200, "it answers after the restart: %s" % status)

        # 4. Cancel.
        status, body = call(base, "POST",
                            "/v1/jobs/%s/cancel" % second["job_id"], {})
        check(status in (200, 202), "cancel accepted: %s %s" % (status, body))
        ended = rt.wait_for("the cancel", lambda: (
            lambda j: j if j.get("state") == "cancelled" else None)(
                job(base, second["job_id"])), 60)
        check(bool(ended), "the job ended cancelled")
        status, body = complete(base)
        check(status == 404 and body.get("error", {}).get("code") ==
              "model_not_found",
              "a completion for the cancelled model: 404 model_not_found: "
              "%s %s" % (status, body))
        status, listing = call(base, "GET", "/v1/models")
        names = [m.get("id") for m in listing.get("data", [])]
        check("gpt-char" not in names, "not listed: %s" % names)
        time.sleep(3)  # past the service's periodic scan (2 s)
        status, body = complete(base)
        check(status == 404, "still gone after a periodic scan: %s" % status)
        check(len(inference_jobs(base)) == 2, "no job made by the scan")
        rt.export(models[0], served_dir, job_id="train-8", outer_step=8)
        back = rt.wait_for("the rewritten model running", lambda: (
            [j for j in inference_jobs(base) if j["state"] == "running"]
            or None), 300)
        check(bool(back) and back[0]["job_id"] not in ids,
              "a rewritten model.json is a new job, running")
        status, _ = complete(base)
        check(status == 200, "and it answers again: %s" % status)
        ok = True
    finally:
        for p in (gateway, worker):
            if p:
                stop(p)
        if FAILURES or not ok:
            print("logs kept in", work)
            for name in ("gateway.err", "worker.err"):
                path = os.path.join(work, name)
                if os.path.exists(path):
                    print("--- tail of", name)
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
