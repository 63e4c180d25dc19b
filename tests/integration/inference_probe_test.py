#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The inference readiness probe stays out of the way of real traffic: a
real `pcp --gateway` serving a toy GPT (--model-dir) on one real
`pcp --worker` (IREE on CPU).

The probe (a one-token prompt, @prefill then @decode) runs on each serving
scheduler once a second. On a scheduler that ended a real request with a
token within that second it does not run: the request proved the same path,
and a probe there only made the next request wait for its two tasks
(bench/gateway_overhead's largest outliers, docs/performance.md).

  1. /readyz turns 200 (the first probe ran: there was no traffic).
  2. 4 s of back-to-back completions (max_tokens 1: one @prefill task
     each): the worker runs one task per request and at most one probe's
     two tasks (one may be due as the traffic starts); before the change
     a probe ran every second (+8 tasks). /readyz stays 200 throughout.
  3. Idle again: the probe comes back (its tasks appear within 3 s) and
     /readyz stays 200.

The worker logs every finished task at debug level ("task done"); the test
counts those lines.

usage: inference_probe_test.py PCP
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inference_models as im  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
JOIN = "probe-join"
FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(conn, method, path, body=None):
    conn.request(method, path, json.dumps(body) if body is not None else None,
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read().decode()


def main():
    work = tempfile.mkdtemp(prefix="pcp-infer-probe-")
    gpt = im.Model(PCP, work, im.GPT, 11)
    api, fabric = free_port(), free_port()
    config = os.path.join(work, "gateway.json")
    with open(config, "w") as f:
        json.dump({"gateway_id": "gw-probe", "lab_id": "lab",
                   "state_dir": os.path.join(work, "state"),
                   "worker_fabric": {"host": "127.0.0.1", "port": fabric,
                                     "join_token_env": "PROBE_JOIN",
                                     "heartbeat_ms": 200}}, f)
    gw_err = open(os.path.join(work, "gateway.err"), "w")
    gateway = subprocess.Popen(
        [PCP, "--gateway", "--gateway-config", config, "--api-port",
         str(api), "--model-dir", gpt.dir],
        env=dict(os.environ, PROBE_JOIN=JOIN), stderr=gw_err)
    worker_log = os.path.join(work, "worker.err")
    worker = subprocess.Popen(
        [PCP, "--worker", "--connect", "127.0.0.1:%d" % fabric,
         "--cache-dir", os.path.join(work, "cache")],
        env=dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN,
                 PCP_LOG_LEVEL="debug"),
        stderr=open(worker_log, "w"))

    def tasks_done():
        with open(worker_log) as f:
            return f.read().count("task done")

    ok = False
    try:
        conn = None
        deadline = time.time() + 300
        status, body = 0, ""
        while time.time() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", api,
                                                  timeout=60)
                status, body = request(conn, "GET", "/readyz")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        check(status == 200, "readyz 200 after the first probe: %s" %
              body[:200])
        if status != 200:
            return
        prompt = {"model": "gpt-char", "prompt": "hello world",
                  "max_tokens": 1, "temperature": 0}
        status, body = request(conn, "POST", "/v1/completions", prompt)
        check(status == 200, "a completion answers: %s" % body[:200])

        before = tasks_done()
        sent, errors, not_ready = 0, 0, 0
        end = time.time() + 4.0
        while time.time() < end:
            status, _ = request(conn, "POST", "/v1/completions", prompt)
            sent += 1
            errors += status != 200
            if sent % 50 == 0:
                status, _ = request(conn, "GET", "/readyz")
                not_ready += status != 200
        time.sleep(0.2)  # the last task's log line
        ran = tasks_done() - before
        check(errors == 0 and sent >= 20,
              "%d completions in 4 s, %d failed" % (sent, errors))
        check(sent <= ran <= sent + 2,
              "under traffic the probe stays away: %d tasks for %d requests "
              "(at most one probe's 2 extra; a probe a second would add 8)" %
              (ran, sent))
        status, body = request(conn, "GET", "/readyz")
        check(not_ready == 0 and status == 200,
              "readyz stayed 200 under traffic (%d misses; now %d %s)" %
              (not_ready, status, body[:200]))

        idle_from = tasks_done()
        deadline = time.time() + 3.0
        while time.time() < deadline and tasks_done() - idle_from < 2:
            time.sleep(0.1)
        check(tasks_done() - idle_from >= 2,
              "idle again, the probe runs (%d tasks in 3 s)" %
              (tasks_done() - idle_from))
        status, body = request(conn, "GET", "/readyz")
        check(status == 200, "readyz 200 when idle: %s" % body[:200])
        ok = True
    finally:
        for p in (worker, gateway):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (worker, gateway):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        gw_err.close()
        if ok and not FAILURES:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("logs kept in %s" % work)
    if FAILURES or not ok:
        print("%d checks failed" % len(FAILURES))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
