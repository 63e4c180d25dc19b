#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`pcp --federation-hub` as a real process on 127.0.0.1 (issue 15, hub
core). The gateways here are tiny Python HTTP servers that only play the
hub's counterpart for control flow (the internal federation job routes);
the real-gateway end to end test is the federation e2e test.

  1. probes (/healthz, /readyz, /metrics through promtool, /openapi.json
     naming every route);
  2. auth split: clients hold the API token, gateways the federation token;
     a token of the other scope is 403, none is 401;
  3. limits and bad input: 413, 400 naming the key (connect fields,
     placement keys, negative workers_required, non-JSON);
  4. connect + peers + services;
  5. placement: workers_required filters; the hub calls the gateway with
     the federation token, never the client's;
  6. lookup and cancel go through the recorded gateway;
  7. staleness: a gateway silent for 3 intervals is stale, never chosen,
     and recovers on its next connect;
  8. GET /v1/jobs fans out in parallel with a timeout: a slow gateway and a
     dead one are reported per job, the page returns in about one timeout;
  9. SIGKILL + restart: registrations come back stale, global job ids keep
     counting, jobs are kept.
Every wait is bounded.
"""
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
API = "hub-api-secret"
FED = "hub-federation-secret"
INTERVAL_MS = 300
TIMEOUT_MS = 800
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    else:
        print("ok  ", what)


def need_tool(name):
    path = shutil.which(name)
    check(path is not None,
          "%s is installed (missing: `make setup` installs it)" % name)
    return path


def request(port, method, path, body=None, token=None, raw=None,
            timeout=10):
    data = raw if raw is not None else (
        json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path),
                                 data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text.startswith(("{", "["))
                              else text)
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


def oversized_post(port, path, length, token):
    """Announces a |length|-byte body and reads the answer without sending
    it: the hub must refuse on Content-Length alone."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("POST %s HTTP/1.1\r\nHost: x\r\n"
                      "Authorization: Bearer %s\r\n"
                      "Content-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n" %
                      (path, token, length)).encode())
        head = sock.recv(4096).decode(errors="replace")
    try:
        return int(head.split()[1])
    except (IndexError, ValueError):
        return 0


def error_message(body):
    return body.get("error", {}).get("message", "") if isinstance(
        body, dict) else str(body)


class FakeGateway:
    """The gateway side of the hub's internal federation routes."""

    def __init__(self, name, get_delay_s=0.0, post_delay_s=0.0):
        self.name, self.get_delay_s = name, get_delay_s
        self.post_delay_s = post_delay_s
        self.refuse_auth = False
        self.auth, self.bodies, self.jobs = [], [], {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                fake.auth.append(self.headers.get("Authorization"))
                if fake.refuse_auth:
                    return self.reply(401, {"error": "unauthorized"})
                time.sleep(fake.post_delay_s)
                if self.path.startswith("/v1/internal/federation/") and \
                        self.path.endswith("/jobs"):
                    job_id = "%s-job-%d" % (fake.name, len(fake.jobs) + 1)
                    fake.bodies.append(json.loads(body or b"{}"))
                    fake.jobs[job_id] = "queued"
                    return self.reply(202, {"accepted": True,
                                            "job_id": job_id})
                if self.path.endswith("/cancel"):
                    job_id = self.path.split("/")[-2]
                    if job_id not in fake.jobs:
                        return self.reply(404, {"error": "JobNotFound"})
                    fake.jobs[job_id] = "cancelling"
                    return self.reply(202, {"accepted": True,
                                            "status": "cancelling",
                                            "job_id": job_id})
                self.reply(404, {"error": "not_found"})

            def do_GET(self):
                fake.auth.append(self.headers.get("Authorization"))
                time.sleep(fake.get_delay_s)
                job_id = self.path.split("/")[-1]
                if job_id not in fake.jobs:
                    return self.reply(404, {"error": "JobNotFound"})
                self.reply(200, {"job_id": job_id,
                                 "status": fake.jobs[job_id]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        threading.Thread(target=self.server.serve_forever,
                         daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def advert(gateway_id, url, workers):
    return {"gateway_id": gateway_id, "lab_id": "lab-" + gateway_id,
            "base_url": url, "graph_backend": "sqlite", "status": "connected",
            "services": [
                {"service_id": "training-main", "service_type": "training",
                 "health_status": "ok",
                 "capabilities": ["training.regular"],
                 "workers_available": workers, "worker_count": workers},
                {"service_id": "rl-main", "service_type": "rl",
                 "health_status": "ok", "workers_available": 1}]}


class Hub:
    def __init__(self, work):
        self.work, self.proc, self.port = work, None, 0
        self.state = os.path.join(work, "state")

    def start(self):
        env = dict(os.environ, HUB_API=API, HUB_FED=FED)
        log = os.path.join(self.work, "hub.err")
        before = 0
        if os.path.exists(log):
            with open(log) as f:
                before = sum('msg="started"' in l for l in f)
        self.err = open(log, "a")
        self.proc = subprocess.Popen(
            [PCP, "--federation-hub", "--state-dir", self.state,
             "--api-port", "0", "--api-token-env", "HUB_API",
             "--federation-token-env", "HUB_FED",
             "--heartbeat-interval-ms", str(INTERVAL_MS),
             "--gateway-timeout-ms", str(TIMEOUT_MS)],
            stderr=self.err, env=env)
        deadline = time.time() + 20
        self.port = 0
        while time.time() < deadline and not self.port:
            with open(os.path.join(self.work, "hub.err")) as f:
                lines = [l for l in f if 'msg="started"' in l]
            if len(lines) > before:
                self.port = int(lines[-1].split("api_port=")[1].split()[0])
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if not self.port:
            raise RuntimeError("the hub did not start: " +
                               open(os.path.join(self.work, "hub.err")).read())


def connect(hub, gateway_id, url, workers, token=FED):
    return request(hub.port, "POST", "/v1/federation/connect",
                   advert(gateway_id, url, workers), token=token)


def peers_status(hub):
    code, body = request(hub.port, "GET", "/v1/federation/peers", token=API)
    return {g["gateway_id"]: g["status"] for g in body["gateways"]}


def main():
    work = tempfile.mkdtemp(prefix="pcp-hub-test-")
    hub = Hub(work)
    hub.start()
    a = FakeGateway("a")
    b = FakeGateway("b")
    slow = FakeGateway("slow", get_delay_s=3.0)
    try:
        run(hub, a, b, slow, work)
    finally:
        if hub.proc and hub.proc.poll() is None:
            hub.proc.send_signal(signal.SIGTERM)
            try:
                hub.proc.wait(10)
            except subprocess.TimeoutExpired:
                hub.proc.kill()
        for g in (a, b, slow):
            try:
                g.stop()
            except Exception:
                pass
    shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print("%d failure(s)" % len(FAILURES), file=sys.stderr)
        return 1
    print("hub_test: all checks passed")
    return 0


def run(hub, a, b, slow, work):
    p = hub.port
    # 1. Probes.
    check(request(p, "GET", "/healthz")[0] == 200, "/healthz is 200")
    code, ready = request(p, "GET", "/readyz")
    check(code == 200 and ready.get("ready") is True and
          ready.get("store") is True, "/readyz: ready with the store open")
    code, doc = request(p, "GET", "/openapi.json")
    paths = doc.get("paths", {}) if code == 200 else {}
    for route in ["/v1/controller", "/v1/federation/connect",
                  "/v1/federation/peers", "/v1/federation/services",
                  "/v1/training/jobs", "/v1/rl/jobs", "/v1/jobs",
                  "/v1/jobs/{id}", "/v1/jobs/{id}/cancel", "/metrics",
                  "/readyz", "/healthz"]:
        check(route in paths, "openapi.json names %s" % route)

    # 2. Auth split.
    check(connect(hub, "gw-a", a.url, 2, token=None)[0] == 401,
          "connect without a token is 401")
    check(connect(hub, "gw-a", a.url, 2, token=API)[0] == 403,
          "connect with the client API token is 403")
    check(request(p, "GET", "/v1/federation/peers", token=FED)[0] == 403,
          "peers with the federation token is 403")
    check(request(p, "GET", "/v1/federation/peers")[0] == 401,
          "peers without a token is 401")
    check(request(p, "GET", "/v1/controller", token=API)[0] == 200,
          "controller with the API token is 200")

    # 3. Limits and bad input.
    code = oversized_post(p, "/v1/federation/connect", (1 << 20) + 1, FED)
    check(code == 413, "a connect body over 1 MiB is 413 (got %d)" % code)
    bad = advert("gw-a", a.url, 2)
    del bad["gateway_id"]
    code, body = request(p, "POST", "/v1/federation/connect", bad, token=FED)
    check(code == 400 and "gateway_id" in error_message(body),
          "connect without gateway_id is 400 naming it")
    bad = advert("gw-a", a.url, 2)
    bad["services"][0]["workers_available"] = -3
    code, body = request(p, "POST", "/v1/federation/connect", bad, token=FED)
    check(code == 400 and "workers_available" in error_message(body),
          "a negative worker count is 400 naming it")
    bad = advert("gw-a", "ftp://x", 2)
    code, body = request(p, "POST", "/v1/federation/connect", bad, token=FED)
    check(code == 400 and "base_url" in error_message(body),
          "a non-http base_url is 400 naming it")
    code, _ = request(p, "POST", "/v1/federation/connect", raw=b"{nope",
                      token=FED)
    check(code == 400, "a non-JSON connect is 400")

    # 4. Connect, peers, services.
    for gid, g, workers in [("gw-a", a, 2), ("gw-b", b, 4),
                            ("gw-slow", slow, 1)]:
        code, body = connect(hub, gid, g.url, workers)
        check(code == 200 and body.get("accepted") is True and
              body["gateway"]["status"] == "connected",
              "connect %s accepted" % gid)
    check(len(body["peers"]["gateways"]) == 3,
          "the connect answer lists every peer")
    check(peers_status(hub) == {"gw-a": "connected", "gw-b": "connected",
                                "gw-slow": "connected"},
          "peers: three connected gateways")
    code, services = request(p, "GET", "/v1/federation/services", token=API)
    check(code == 200 and len(services["services"]) == 6 and
          all(s["gateway_status"] == "connected"
              for s in services["services"]),
          "services: six, flattened with their gateway")

    # 5. Placement.
    code, body = request(p, "POST", "/v1/training/jobs",
                         {"placement": {"workers_required": 3},
                          "job": {"training_kind": "regular"}}, token=API)
    check(code == 202 and body["assignment"]["gateway_id"] == "gw-b" and
          body["global_job_id"].startswith("global-job-"),
          "workers_required 3 places on gw-b (4 workers): %s" % body)
    first_id = body.get("global_job_id")
    check(b.auth and b.auth[-1] == "Bearer " + FED,
          "the hub calls the gateway with the federation token")
    check(all(h != "Bearer " + API for h in a.auth + b.auth + slow.auth),
          "the client's token never reaches a gateway")
    check(b.bodies and b.bodies[-1].get("executor_id") ==
          "gw-b:training:training-main", "the gateway gets the chosen executor")
    code, body = request(p, "POST", "/v1/training/jobs",
                         {"placement": {"workers_required": 5}}, token=API)
    check(code == 503 and "workers available" in error_message(body),
          "workers_required 5 filters every gateway out (503)")
    code, body = request(p, "POST", "/v1/training/jobs",
                         {"placement": {"gateway_id": "gw-slow",
                                        "workers_required": 2}}, token=API)
    check(code == 503, "gw-slow with 1 worker is not chosen for 2")
    code, body = request(p, "POST", "/v1/training/jobs",
                         {"placement": {"workers_required": -1}}, token=API)
    check(code == 400 and "workers_required" in error_message(body),
          "negative workers_required is 400")
    code, body = request(p, "POST", "/v1/training/jobs",
                         {"placement": {"worker": 1}}, token=API)
    check(code == 400 and "placement.worker" in error_message(body),
          "an unknown placement key is 400 naming it")
    code, body = request(p, "POST", "/v1/training/jobs",
                         {"placement": {"gateway_id": "gw-z"}}, token=API)
    check(code == 404, "an unknown gateway is 404")
    code, body = request(p, "POST", "/v1/rl/jobs",
                         {"gateway_id": "gw-a"}, token=API)
    check(code == 202 and body["assignment"]["service_type"] == "rl" and
          body["assignment"]["gateway_id"] == "gw-a",
          "a flat rl request places on the named gateway")

    # A gateway that refuses the hub's credential: 502, not the gateway's
    # 401 (the client's own token is fine), and the job is recorded rejected.
    a.refuse_auth = True
    code, body = request(p, "POST", "/v1/rl/jobs", {"gateway_id": "gw-a"},
                         token=API)
    check(code == 502 and "federation token" in error_message(body),
          "a gateway refusing the hub's token is 502, not 401 (%d)" % code)
    a.refuse_auth = False

    # 6. Lookup and cancel through the gateway.
    code, body = request(p, "GET", "/v1/jobs/" + first_id, token=API)
    check(code == 200 and body["child"]["status"] == "queued",
          "lookup relays the child's status")
    code, body = request(p, "POST", "/v1/jobs/%s/cancel" % first_id,
                         token=API)
    check(code == 202 and body["state"] == "cancelling",
          "cancel goes through the gateway (202, cancelling)")
    check(request(p, "GET", "/v1/jobs/global-job-999", token=API)[0] == 404,
          "an unknown global job is 404")
    check(request(p, "GET", "/v1/jobs/not-a-job", token=API)[0] == 404,
          "a malformed global job id is 404")

    # 7. Staleness: gw-a keeps connecting, gw-b and gw-slow fall silent.
    deadline = time.time() + (3 * INTERVAL_MS) / 1000.0 + 0.5
    while time.time() < deadline:
        connect(hub, "gw-a", a.url, 2)
        time.sleep(INTERVAL_MS / 3000.0)
    status = peers_status(hub)
    check(status == {"gw-a": "connected", "gw-b": "stale",
                     "gw-slow": "stale"},
          "silent for 3 intervals: stale (%s)" % status)
    code, body = request(p, "POST", "/v1/training/jobs",
                         {"placement": {"workers_required": 3}}, token=API)
    check(code == 503, "a stale gateway is never chosen (gw-b had 4)")
    code, body = request(p, "POST", "/v1/training/jobs",
                         {"placement": {"gateway_id": "gw-b"}}, token=API)
    check(code == 409 and "stale" in error_message(body),
          "naming a stale gateway is 409")
    code, _ = request(p, "GET", "/metrics")
    code, metrics = request(p, "GET", "/metrics")
    check('pcp_hub_gateways{status="stale"} 2' in metrics,
          "/metrics counts the stale gateways")
    code, body = connect(hub, "gw-b", b.url, 4)
    check(code == 200 and body["gateway"]["status"] == "connected",
          "gw-b recovers on its next connect")
    code, body = request(p, "POST", "/v1/training/jobs",
                         {"placement": {"workers_required": 3}}, token=API)
    check(code == 202 and body["assignment"]["gateway_id"] == "gw-b",
          "the recovered gateway is chosen again")
    connect(hub, "gw-slow", slow.url, 1)
    for _ in range(3):
        code, body = request(p, "POST", "/v1/training/jobs",
                             {"placement": {"gateway_id": "gw-slow"}},
                             token=API)
        check(code == 202, "a job placed on the slow gateway")

    # 8. Fan-out: the slow gateway times out, a dead one fails; both are
    # reported; the page takes about one timeout, not one per job.
    a.stop()
    t0 = time.time()
    code, body = request(p, "GET", "/v1/jobs", token=API, timeout=30)
    elapsed = time.time() - t0
    jobs = body.get("jobs", []) if code == 200 else []
    by_gateway = {}
    for j in jobs:
        if j["state"] == "rejected":
            check(j["fetch"] == {"ok": True, "source": "hub"},
                  "a rejected job is answered from the hub's record")
            continue
        by_gateway.setdefault(j["assignment"]["gateway_id"], []).append(
            j["fetch"])
    check(code == 200 and len(jobs) == 7,
          "GET /v1/jobs lists every job (%d)" % len(jobs))
    check(all(not f["ok"] for f in by_gateway.get("gw-slow", [])) and
          by_gateway.get("gw-slow"),
          "the slow gateway's job is reported as failed")
    check(all(not f["ok"] and "error" in f for f in by_gateway.get("gw-a", []))
          and by_gateway.get("gw-a"),
          "the dead gateway's job is reported with an error")
    check(all(f["ok"] for f in by_gateway.get("gw-b", [])),
          "gw-b's jobs are fetched")
    check(body.get("failed_fetches", 0) >= 2, "failed_fetches counts them")
    # Three slow jobs one after another would take >= 3 timeouts (2.4 s).
    check(elapsed < TIMEOUT_MS / 1000.0 + 1.1,
          "the fan-out is parallel: %.2f s for %d jobs" % (elapsed, len(jobs)))
    code, body = request(p, "GET", "/v1/jobs?limit=0", token=API)
    check(code == 400, "limit=0 is 400")

    # 9. SIGKILL and restart, with one job in flight to a gateway that
    # takes its time to accept.
    last = max(int(j["global_job_id"].split("-")[-1]) for j in jobs)
    hang = FakeGateway("hang", post_delay_s=5.0)
    connect(hub, "gw-hang", hang.url, 1)
    def submit_and_lose_the_answer():
        try:
            request(p, "POST", "/v1/rl/jobs", {"gateway_id": "gw-hang"}, API,
                    timeout=10)
        except (OSError, urllib.error.URLError, ValueError):
            pass  # the hub dies while this request waits: expected

    in_flight = threading.Thread(target=submit_and_lose_the_answer,
                                 daemon=True)
    in_flight.start()
    deadline = time.time() + 5
    while time.time() < deadline and not hang.auth:
        time.sleep(0.02)
    check(bool(hang.auth), "the in-flight job reached its gateway")
    hub.proc.send_signal(signal.SIGKILL)
    hub.proc.wait(10)
    hub.start()
    p = hub.port
    status = peers_status(hub)
    check(status == {"gw-a": "stale", "gw-b": "stale", "gw-slow": "stale",
                     "gw-hang": "stale"},
          "after SIGKILL: every registration is back, stale (%s)" % status)
    code, body = request(p, "GET", "/v1/jobs/global-job-%d" % (last + 1),
                         token=API)
    check(code == 200 and body["state"] == "placing" and
          "restarted" in body.get("error", ""),
          "the job in flight at the SIGKILL says the hub restarted (%s)" %
          body)
    last += 1
    hang.stop()
    code, body = connect(hub, "gw-b", b.url, 4)
    check(code == 200 and body["gateway"]["status"] == "connected",
          "a restored gateway connects again")
    code, body = request(p, "POST", "/v1/training/jobs", {}, token=API)
    check(code == 202 and body["global_job_id"] == "global-job-%d" %
          (last + 1), "global job ids keep counting across the restart "
          "(%s)" % body.get("global_job_id"))
    code, body = request(p, "GET", "/v1/jobs/" + first_id, token=API)
    check(code == 200 and body["assignment"]["gateway_id"] == "gw-b",
          "a job from before the restart is still there")
    prom = need_tool("promtool")
    if prom:
        code, metrics = request(p, "GET", "/metrics")
        r = subprocess.run([prom, "check", "metrics"], input=metrics.encode(),
                           capture_output=True, timeout=30)
        check(r.returncode == 0, "promtool check metrics passes: %s" %
              r.stdout.decode() + r.stderr.decode())


if __name__ == "__main__":
    sys.exit(main())
