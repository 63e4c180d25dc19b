#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An inference job that runs is not failed by a worker loss while another
worker's target could not compile the version (review of issue 14's
inference kind): a real `pcp --gateway`, worker A (the CPU default target)
serving the model, worker B joining with a target its compile refuses.
When A goes, the version has no runner and a failed compile, but another
target did compile it: the job stays running (0 workers) and A's return
serves again. Before the fix the job ended failed with B's compile error,
and a gateway restart then skipped that model.json for good.

usage: inference_job_worker_loss_test.py PCP
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inference_jobs_test as jt  # noqa: E402  (call, job, start_gateway)
import inference_models as im  # noqa: E402
import inference_reload_test as rt  # noqa: E402  (export, free_port, ...)

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
JOIN = "loss-join"
FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def start_worker(work, fabric, name, extra):
    return subprocess.Popen(
        [PCP, "--worker", "--connect", "127.0.0.1:%d" % fabric,
         "--cache-dir", os.path.join(work, "cache-" + name)] + extra,
        env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN),
        stderr=open(os.path.join(work, "worker-%s.err" % name), "w"))


def log_has(work, text):
    with open(os.path.join(work, "gateway.err")) as f:
        return text in f.read()


def main():
    work = tempfile.mkdtemp(prefix="pcp-infer-loss-")
    root = os.path.join(work, "tables")
    os.makedirs(root)
    model = im.Model(PCP, root, im.GPT, 41)
    state = os.path.join(work, "state")
    rt.export(model, os.path.join(state, "models", "gpt-char"))
    api, fabric = rt.free_port(), rt.free_port()
    base = "http://127.0.0.1:%d" % api
    config = os.path.join(work, "gateway.json")
    with open(config, "w") as f:
        json.dump({"gateway_id": "gw-loss", "lab_id": "lab",
                   "state_dir": state,
                   "worker_fabric": {"host": "127.0.0.1", "port": fabric,
                                     "join_token_env": "JOBS_JOIN",
                                     "heartbeat_ms": 200}}, f)
    env = dict(os.environ, JOBS_JOIN=JOIN)
    procs = {}
    ok = False
    try:
        procs["gateway"] = jt.start_gateway(work, config, api, env)
        procs["a"] = start_worker(work, fabric, "a", [])
        first = rt.wait_for("a running inference job",
                            lambda: jt.running_job(base, 1), 600)
        check(bool(first), "the served model's job runs on worker A")
        if not first:
            return False
        job_id = first["job_id"]
        procs["b"] = start_worker(work, fabric, "b",
                                  ["--target", "no-such-arch-pcp"])
        failed = rt.wait_for("worker B's compile to fail", lambda: log_has(
            work, "inference compile failed"), 300)
        check(bool(failed), "worker B's target does not compile the model")
        if not failed:
            return False
        time.sleep(2)  # past the manager's pass that saw it fail
        check(jt.job(base, job_id).get("state") == "running",
              "the job still runs while worker A serves")
        procs["a"].kill()
        procs["a"].wait()
        gone = rt.wait_for("worker A's runner gone", lambda: jt.job(
            base, job_id).get("inference", {}).get("workers") == 0 or
            jt.job(base, job_id).get("state") != "running", 120)
        check(bool(gone), "worker A's loss shows")
        time.sleep(4)  # several manager passes
        after = jt.job(base, job_id)
        check(after.get("state") == "running",
              "a worker loss does not fail the job: %s %s" %
              (after.get("state"), after.get("error")))
        if FAILURES:
            return False
        procs["a"] = start_worker(work, fabric, "a", [])
        back = rt.wait_for("worker A serving again", lambda: jt.job(
            base, job_id).get("inference", {}).get("workers", 0) >= 1, 300)
        check(bool(back), "worker A's return serves the same job again")
        ok = True
    finally:
        for p in procs.values():
            jt.stop(p)
        if ok and not FAILURES:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("kept " + work, flush=True)
    return ok and not FAILURES


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
