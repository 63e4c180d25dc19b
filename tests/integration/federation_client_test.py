#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The gateway's federation client against a scripted hub (issue 15 item 2),
so its failure behaviour can be driven exactly: a real `pcp --gateway` with
one CPU worker (node manager), and an HTTP server in this process standing
in for the hub's /v1/federation/connect.

  1. connect: within one interval, with the federation token as bearer;
     the body advertises the training service per (backend, target) of the
     connected workers (cpu, 1 available), the base URL the gateway
     answers on, counts, sequence numbers; /v1/federation/status says
     connected, /peers and /services come from the hub's reply;
  2. backoff: the hub answers 503, then goes silent (connection refused):
     status disconnected with the error, the gaps between attempts grow
     (exponential) but stay under the cap (8 intervals, jitter never above
     it); the hub comes back and the gateway reconnects within the cap;
  3. /v1/capabilities: what this gateway serves, and the worker groups;
  4. internal routes: no token 401, the API token 403 (another scope), the
     federation token: a training job accepted (202, job_id) with the hub's
     placement keys stripped, looked up and cancelled through the internal
     routes; 400 naming the key for a bad experiment; rl 400 naming the
     key (issue 16: the gateway runs RL jobs); unknown job 404;
  5. a gateway with no federation token configured answers 401 on every
     internal route even with a bearer, and federation disabled never
     connects (status "disabled");
  6. POST /v1/federation/connect ends a backoff wait at once (409 when
     federation is disabled); SIGTERM during a backoff wait: the gateway
     exits 0 within a few seconds (the wait is a condition variable).
Every wait is bounded.
"""
import json
import os
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import federation_cluster as fc  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
HEARTBEAT_MS = 300
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)


class FakeHub:
    """Answers POST /v1/federation/connect as the mode says: "ok" (200 with
    a peers list holding the caller and one made-up peer) or "503"."""

    def __init__(self):
        self.port = fc.free_port()
        self.mode = "ok"
        self.connects = []  # (monotonic time, auth header, body)
        self.lock = threading.Lock()
        self.server = None

    def start(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                with hub.lock:
                    hub.connects.append((time.monotonic(),
                                         self.headers.get("Authorization"),
                                         raw))
                    mode = hub.mode
                if self.path != "/v1/federation/connect" or mode != "ok":
                    body = json.dumps({"error": {
                        "code": "UNAVAILABLE", "message": "scripted"}})
                    code = 503 if mode != "ok" else 404
                else:
                    req = json.loads(raw)
                    me = dict(req, status="connected")
                    peer = {"gateway_id": "gw-peer", "lab_id": "lab-peer",
                            "base_url": "http://127.0.0.1:9",
                            "status": "stale",
                            "services": [{"service_id": "training-main",
                                          "service_type": "training",
                                          "workers_available": 0}]}
                    body = json.dumps({"accepted": True, "gateway": me,
                                       "peers": {"gateways": [me, peer]}})
                    code = 200
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever,
                         daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def count(self):
        with self.lock:
            return len(self.connects)

    def times_since(self, index):
        with self.lock:
            return [t for t, _, _ in self.connects[index:]]


def experiment(name, **extra):
    e = {"name": name,
         "model": {"kind": "gpt", "layers": 1, "heads": 2, "kv_heads": 2,
                   "width": 32, "vocab": 65, "block_size": 16, "batch": 4},
         "data_path": os.path.join(fc.ROOT, "data", "tiny_shakespeare.txt"),
         "tokenizer": "char", "learning_rate": 0.01, "tau": 2,
         "outer_loop_steps": 1000, "checkpoint_every": 1000, "seed": 1}
    e.update(extra)
    return e


def connect_and_routes(hub, gw):
    check(fc.wait_until(lambda: hub.count() >= 1, 5) is not None,
          "the gateway connects within a few intervals")
    # A connect after the worker joined carries it.
    n = hub.count()
    fc.wait_until(lambda: hub.count() >= n + 1, 3)
    _, auth, raw = hub.connects[-1]
    body = json.loads(raw)
    check(auth == "Bearer " + fc.FED_TOKEN,
          "connect carries the federation token: %r" % auth)
    check(body.get("gateway_id") == "gw-a" and body.get("lab_id") == "lab-gw-a"
          and body.get("base_url") == gw.base and
          body.get("graph_backend") == "sqlite" and
          body.get("status") == "connected" and
          body.get("heartbeat_interval_ms") == HEARTBEAT_MS,
          "connect body names the gateway and its URL: %s" % body)
    training = [s for s in body.get("services", [])
                if s.get("service_type") == "training"]
    # The node manager's workers join without --target: no target_arch.
    check(len(training) == 1 and training[0].get("worker_class") == "cpu" and
          "target_arch" not in training[0] and
          training[0].get("workers_connected") == 1 and
          training[0].get("workers_available") == 1 and
          "training.regular" in training[0].get("capabilities", []) and
          training[0].get("base_url") == gw.base and
          training[0].get("executor_id") == "gw-a:training:training-main:cpu",
          "one training advertisement for (cpu, target), 1 worker: %s" %
          training)
    check(body.get("workers") and body["workers"][0]["backend"] == "cpu" and
          body["workers"][0]["workers_connected"] == 1,
          "worker groups in the connect body: %s" % body.get("workers"))
    check(isinstance(body.get("last_sequence_no"), int) and
          isinstance(body.get("last_replicated_sequence"), int),
          "sequence numbers in the connect body")
    # The advertised URL is one the gateway really answers on.
    check(fc.call(body["base_url"], "GET", "/healthz")[0] == 200,
          "advertised base_url answers")

    s, st = gw.call("GET", "/v1/federation/status")
    check(s == 200 and st.get("connected") is True and
          st.get("status") == "connected" and st.get("last_error") is None
          and st.get("last_sync_at_ms") and st.get("peer_count") == 2 and
          st.get("upstream") == "http://127.0.0.1:%d" % hub.port and
          st.get("enabled") is True and st.get("token_configured") is True,
          "status connected: %s" % st)
    s, peers = gw.call("GET", "/v1/federation/peers")
    ids = sorted(p.get("gateway_id") for p in peers.get("gateways", []))
    check(s == 200 and ids == ["gw-a", "gw-peer"], "peers: %s" % peers)
    s, svc = gw.call("GET", "/v1/federation/services")
    rows = svc.get("services", []) if s == 200 else []
    check(any(r.get("gateway_id") == "gw-peer" and
              r.get("gateway_status") == "stale" and
              r.get("gateway_base_url") == "http://127.0.0.1:9" for r in rows),
          "services flattened over peers: %s" % svc)
    s, rep = gw.call("GET", "/v1/federation/replication")
    check(s == 200 and "summary" in rep and
          rep["summary"].get("replication_lag") ==
          rep["summary"].get("last_sequence_no") -
          rep["summary"].get("last_replicated_sequence"),
          "replication summary: %s" % rep)
    s, _ = fc.call(gw.base, "GET", "/v1/federation/status")
    check(s == 401, "/v1/federation/status needs the API token: %s" % s)


def backoff(hub, gw):
    cap = 8 * HEARTBEAT_MS / 1000.0
    start = hub.count()
    hub.mode = "503"
    check(fc.wait_until(lambda: gw.call("GET", "/v1/federation/status")[1]
                        .get("status") == "disconnected", 3) is not None,
          "503 from the hub: disconnected")
    s, st = gw.call("GET", "/v1/federation/status")
    check("503" in (st.get("last_error") or "") and
          st.get("consecutive_failures", 0) >= 1 and
          st.get("connected") is False,
          "last_error names the hub's 503: %s" % st)
    # Silence: connection refused from now on.
    hub.stop()
    time.sleep(6.5)
    times = hub.times_since(start)
    s, st = gw.call("GET", "/v1/federation/status")
    failures = st.get("consecutive_failures", 0)
    check(failures >= 4 and "UNAVAILABLE" in (st.get("last_error") or ""),
          "failures counted while the hub is down: %s" % st)
    # Attempts over 6.5 s with no backoff would be ~21; with backoff from
    # 150 ms doubling to the 2.4 s cap, at most ~9.
    check(failures <= 10, "backoff limits attempts: %d in 6.5 s" % failures)
    check(0 < st.get("backoff_ms", 0) <= cap * 1000,
          "backoff never above the cap: %s" % st.get("backoff_ms"))
    gaps = [b - a for a, b in zip(times, times[1:])]
    check(not gaps or max(gaps) <= cap + 0.5,
          "gaps under the cap while 503: %s" % gaps)
    # Back: reconnects within the cap (plus a connect).
    hub2 = FakeHub()
    hub2.port = hub.port
    hub2.start()
    t0 = time.time()
    ok = fc.wait_until(lambda: gw.call("GET", "/v1/federation/status")[1]
                       .get("connected"), cap + 2)
    check(ok is not None, "reconnects after the hub returns")
    print("reconnected after %.2f s (cap %.1f s)" % (time.time() - t0, cap))
    s, st = gw.call("GET", "/v1/federation/status")
    check(st.get("consecutive_failures") == 0 and
          st.get("last_error") is None and
          st.get("backoff_ms") == HEARTBEAT_MS,
          "a success resets the backoff: %s" % st)
    return hub2


def capabilities(gw):
    s, caps = gw.call("GET", "/v1/capabilities")
    names = caps.get("capabilities", []) if s == 200 else []
    for want in ("graph.query", "training.regular", "federation.status",
                 "federation.connect", "federation.training.jobs"):
        check(want in names, "capability %s listed: %s" % (want, names))
    for never in ("service.rl.proxy", "message_family.rl",
                  "service.inference.query_then_infer"):
        check(never not in names, "capability %s not claimed" % never)
    check(caps.get("workers") and caps["workers"][0]["backend"] == "cpu",
          "worker groups in /v1/capabilities: %s" % caps)
    s, doc = fc.call(gw.base, "GET", "/openapi.json")
    for path in ["/v1/federation/status", "/v1/federation/peers",
                 "/v1/federation/services", "/v1/federation/replication",
                 "/v1/federation/connect",
                 "/v1/capabilities", "/v1/internal/federation/training/jobs",
                 "/v1/internal/federation/rl/jobs",
                 "/v1/internal/federation/jobs/{id}",
                 "/v1/internal/federation/jobs/{id}/cancel"]:
        check(path in doc.get("paths", {}), "openapi names " + path)


def internal_routes(gw):
    path = "/v1/internal/federation/training/jobs"
    s, body = fc.call(gw.base, "POST", path, experiment("x"))
    check(s == 401 and "error" in body, "internal route without token: %s" % s)
    s, body = fc.call(gw.base, "POST", path, experiment("x"),
                      token=fc.API_TOKEN)
    check(s == 403, "the API token is another scope: %s %s" % (s, body))
    s, body = fc.call(gw.base, "POST", path, experiment("x", tau=0),
                      token=fc.FED_TOKEN)
    check(s == 400 and "tau" in json.dumps(body),
          "bad experiment: 400 naming the key: %s %s" % (s, body))
    s, body = fc.call(gw.base, "POST", path, b"{not json",
                      token=fc.FED_TOKEN)
    check(s == 400 and "error" in body, "non-JSON body: 400: %s" % s)
    # The hub's placement keys ride along and are not experiment keys.
    s, job = fc.call(gw.base, "POST", path,
                     dict(experiment("fed-cancel"), service_id="training-main",
                          executor_id="gw-a:training:training-main:cpu:x",
                          global_job_id="global-job-7"),
                     token=fc.FED_TOKEN)
    jid = job.get("job_id") if s == 202 else None
    check(jid and job.get("kind") == "training",
          "internal training submit: 202 with job_id: %s %s" % (s, job))
    if jid:
        s, got = gw.call("GET", "/v1/training/jobs/" + jid)
        unknown = got.get("spec", {}).get("unknown_keys", [])
        check(s == 200 and not unknown,
              "placement keys stripped from the experiment: %s" % unknown)
        s, got = fc.call(gw.base, "GET", "/v1/internal/federation/jobs/" + jid,
                         token=fc.FED_TOKEN)
        check(s == 200 and got.get("job_id") == jid,
              "internal lookup: %s %s" % (s, got))
        s, got = fc.call(gw.base, "POST",
                         "/v1/internal/federation/jobs/%s/cancel" % jid,
                         token=fc.FED_TOKEN)
        check(s in (200, 202), "internal cancel: %s %s" % (s, got))
        done = fc.wait_until(lambda: gw.call("GET", "/v1/jobs/" + jid)[1]
                             .get("state") == "cancelled", 60, 0.2)
        check(done is not None, "job cancelled through the internal route")
    s, body = fc.call(gw.base, "GET", "/v1/internal/federation/jobs/nope",
                      token=fc.FED_TOKEN)
    check(s == 404 and "error" in body, "unknown job: 404: %s" % s)
    s, body = fc.call(gw.base, "POST", "/v1/internal/federation/rl/jobs",
                      {"job": {}}, token=fc.FED_TOKEN)
    # The gateway runs RL jobs (issue 16): an empty experiment is a 400
    # naming the first required key.
    check(s == 400 and "prompts_path" in
          body.get("error", {}).get("message", ""),
          "rl: 400 naming the missing key: %s %s" % (s, body))


def no_token_gateway(cluster, hub):
    gw = cluster.gateway("gw-notoken", upstream="http://127.0.0.1:%d" %
                         hub.port, federation_token=False, enabled=False)
    for method, path in [
            ("POST", "/v1/internal/federation/training/jobs"),
            ("POST", "/v1/internal/federation/rl/jobs"),
            ("GET", "/v1/internal/federation/jobs/x"),
            ("POST", "/v1/internal/federation/jobs/x/cancel")]:
        s, body = fc.call(gw.base, method, path,
                          {} if method == "POST" else None,
                          token=fc.FED_TOKEN)
        check(s == 401 and "federation.token_env" in
              body.get("error", {}).get("message", ""),
              "%s %s without a configured token: 401: %s %s" %
              (method, path, s, body))
    s, body = gw.call("POST", "/v1/federation/connect")
    check(s == 409 and "federation.enabled" in json.dumps(body),
          "connect now on a disabled gateway: 409: %s %s" % (s, body))
    s, st = gw.call("GET", "/v1/federation/status")
    check(s == 200 and st.get("status") == "disabled" and
          st.get("connected") is False, "disabled federation: %s" % st)
    s, caps = gw.call("GET", "/v1/capabilities")
    names = caps.get("capabilities", [])
    check("federation.connect" not in names and
          "federation.training.jobs" not in names,
          "no federation capabilities claimed when off: %s" % names)
    # A disabled client never connects.
    seen = [c for c in hub.connects if b'"gw-notoken"' in c[2]]
    check(not seen, "a disabled gateway never connects")


def main():
    work = tempfile.mkdtemp(prefix="pcp-fedclient-")
    cluster = fc.Cluster(PCP, work, heartbeat_ms=HEARTBEAT_MS)
    hub = FakeHub()
    hub.start()
    try:
        gw = cluster.gateway("gw-a", workers=1,
                             upstream="http://127.0.0.1:%d/" % hub.port)
        connect_and_routes(hub, gw)
        capabilities(gw)
        internal_routes(gw)
        hub = backoff(hub, gw)
        no_token_gateway(cluster, hub)
        # POST /v1/federation/connect skips a backoff wait.
        hub.stop()
        fc.wait_until(lambda: gw.call("GET", "/v1/federation/status")[1]
                      .get("consecutive_failures", 0) >= 4, 10)
        # Catch the loop early in a wait of 1 s or more (the waits grow
        # to the 2.4 s cap), then bring the hub back and wake it.
        nxt = fc.wait_until(lambda: (lambda v: v if v and v > 900 else None)(
            gw.call("GET", "/v1/federation/status")[1].get(
                "next_attempt_in_ms")), 15, 0.02)
        port = hub.port
        hub = FakeHub()
        hub.port = port
        hub.start()
        t0 = time.time()
        s, body = gw.call("POST", "/v1/federation/connect")
        ok = fc.wait_until(lambda: gw.call("GET", "/v1/federation/status")
                           [1].get("connected"), 3, 0.02)
        took = time.time() - t0
        check(s == 202 and ok, "connect now: %s %s" % (s, body))
        print("connect now: connected after %.2f s, %s ms of backoff left" %
              (took, nxt))
        # After 4 failures the wait is 600..2400 ms; the wake ends it.
        check(nxt is not None and took * 1000 < nxt - 300,
              "connect now skips the backoff wait (%s ms left): connected "
              "after %.2f s" % (nxt, took))
        # 6. SIGTERM during a backoff wait.
        hub.stop()
        fc.wait_until(lambda: gw.call("GET", "/v1/federation/status")[1]
                      .get("consecutive_failures", 0) >= 4, 10)
        t0 = time.time()
        code = fc.Process.terminate(gw, 20)
        took = time.time() - t0
        check(code == 0 and took < 5,
              "SIGTERM in a backoff wait: exit %s after %.1f s" % (code, took))
        hub = None
    finally:
        cluster.stop()
        if hub:
            hub.stop()
    if FAILURES:
        print("federation_client_test: %d failures (logs in %s)" %
              (len(FAILURES), work))
        return 1
    print("federation_client_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
