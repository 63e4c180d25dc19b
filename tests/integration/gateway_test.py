#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`pcp --gateway` with real processes on 127.0.0.1 (issue 4 items 4-8):

  1. probes, auth failures (401 without/with a wrong token), JSON errors with
     the right status for bad input on every route family;
  2. services: register, get, list, heartbeat, TTL expiry, delete;
  3. graph: mutate, query, entity get;
  4. /openapi.json parses and names every route the gateway serves;
  5. an end-to-end job: StableHLO over HTTP, compiled by the gateway (child
     process), run by a real `pcp --worker` through IREE, result checked
     (raw and .npy), events in order; a .npy input; cancel;
  6. /v1/events SSE: live events, then resume with Last-Event-ID;
  7. /metrics passes `promtool check metrics`;
  8. restart: SIGKILL the gateway during a running job, restart on the same
     state dir: history kept, the job re-runs to success, finished jobs and
     results intact;
  9. SIGTERM: /readyz 503 while draining, exit 0;
 10. the dashboard in headless Chromium shows the joined worker (a missing
     chromium is a failure: `make setup` installs it).
Every wait is bounded.
"""
import base64
import io
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
TOKEN = "gw-test-token"
JOIN = "gw-join-token"
FAILURES = []


_ISSUED_PORTS = set()


def free_port():
    """A loopback port free now and not handed out before by this process:
    two unbound probes in a row can return the same port (callers take an
    API and a fabric port this way, and a gateway rightly refuses the same
    port twice)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ISSUED_PORTS:
            _ISSUED_PORTS.add(port)
            return port
    raise RuntimeError("free_port: no new loopback port in 100 probes")


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)


def need_tool(*names):
    """The path of the first of |names| on PATH; when none is there, a
    failure that says what to install (never a skip: `make setup` installs
    every tool the suite uses)."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    check(False, "%s is not installed (install it: `make setup` does)" %
          " or ".join(names))
    return None


class Gateway:
    def __init__(self, work, api_port, fabric_port):
        self.work, self.api_port, self.fabric_port = work, api_port, fabric_port
        self.config = os.path.join(work, "g.json")
        with open(self.config, "w") as f:
            json.dump({"gateway_id": "gw-test", "lab_id": "lab",
                       "state_dir": os.path.join(work, "state"),
                       "api": {"token_env": "GW_TEST_TOKEN"},
                       "worker_fabric": {"host": "127.0.0.1",
                                         "port": fabric_port,
                                         "join_token_env": "GW_TEST_JOIN",
                                         "heartbeat_ms": 200}}, f)
        self.proc = None
        self.starts = 0

    def start(self):
        env = dict(os.environ, GW_TEST_TOKEN=TOKEN, GW_TEST_JOIN=JOIN)
        self.starts += 1
        self.err = open(os.path.join(self.work, "gw%d.err" % self.starts), "w")
        self.proc = subprocess.Popen(
            [PCP, "--gateway", "--gateway-config", self.config,
             "--api-port", str(self.api_port)], env=env, stderr=self.err)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if request("GET", "/healthz", token=None)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("gateway did not start")


BASE = None


def request(method, path, body=None, token=TOKEN, headers=None,
            content_type="application/json", raw=False, timeout=30):
    data = None
    h = dict(headers or {})
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h["Content-Type"] = content_type
    if token:
        h["Authorization"] = "Bearer " + token
    req = urllib.request.Request(BASE + path, data=data, method=method,
                                 headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            payload = r.read()
            status, hdrs = r.status, r.headers
    except urllib.error.HTTPError as e:
        payload, status, hdrs = e.read(), e.code, e.headers
    if raw:
        return status, payload, hdrs
    try:
        return status, json.loads(payload.decode() or "null")
    except ValueError:
        return status, payload.decode(errors="replace")


def is_error(resp, status, code=None):
    s, body = resp
    ok = (s == status and isinstance(body, dict) and "error" in body and
          "code" in body["error"] and "message" in body["error"])
    if ok and code:
        ok = body["error"]["code"] == code
    return ok


def wait_for(pred, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    check(False, "timed out: " + what)
    return None


def start_worker(work, fabric_port, extra=()):
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN)
    err = open(os.path.join(work, "worker.err"), "a")
    return subprocess.Popen(
        [PCP, "--worker", "--connect", "127.0.0.1:%d" % fabric_port,
         "--cache-dir", os.path.join(work, "worker-cache")] + list(extra),
        env=env, stderr=err)


ADD_MLIR = """func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.add %a, %b : tensor<2x3xf32>
  %1 = stablehlo.multiply %0, %0 : tensor<2x3xf32>
  return %1 : tensor<2x3xf32>
}
"""


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def npy_bytes(values, shape):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % (
        "".join("%d," % d for d in shape))
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    return (b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) +
            header.encode() + f32(values))


def job_body(a, b, **extra):
    body = {"program": {"format": "stablehlo", "text": ADD_MLIR},
            "function": "main",
            "inputs": [
                {"dtype": "f32", "shape": [2, 3],
                 "data_base64": base64.b64encode(f32(a)).decode()},
                {"npy_base64": base64.b64encode(npy_bytes(b, (2, 3))).decode()},
            ],
            "placement": {"backend": "cpu", "workers": 1}}
    body.update(extra)
    return body


def job_state(job_id):
    s, j = request("GET", "/v1/jobs/" + job_id)
    return j.get("state") if s == 200 else None


def _sse_body(buf):
    """The event-stream bytes of a raw HTTP/1.1 response read so far: the
    headers dropped and a chunked body decoded (a 16 KiB chunk of the
    server's may end inside an event, so the chunk-size lines must not be
    read as part of it). An incomplete last chunk gives what has arrived."""
    head, sep, body = buf.partition(b"\r\n\r\n")
    if not sep:
        return b""
    if b"transfer-encoding: chunked" not in head.lower():
        return body
    out = b""
    while True:
        line, sep, rest = body.partition(b"\r\n")
        if not sep:
            return out
        try:
            size = int(line.split(b";")[0], 16)
        except ValueError:
            return out
        if size == 0:
            return out
        out += rest[:size]
        if len(rest) < size + 2:
            return out
        body = rest[size + 2:]


def sse_read(path, last_event_id=None, seconds=3.0, want=None, started=None):
    """Reads SSE events for up to |seconds| (or until |want| ids seen).
    |started| (a threading.Event) is set once the response headers came:
    the stream is subscribed from then on."""
    host, port = "127.0.0.1", int(BASE.rsplit(":", 1)[1])
    sock = socket.create_connection((host, port), timeout=seconds)
    lines = ["GET %s HTTP/1.1" % path, "Host: x",
             "Authorization: Bearer " + TOKEN, "Accept: text/event-stream"]
    if last_event_id is not None:
        lines.append("Last-Event-ID: %s" % last_event_id)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    buf = b""
    deadline = time.time() + seconds
    events = []
    sock.settimeout(0.2)
    while time.time() < deadline:
        try:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
        except socket.timeout:
            pass
        if started is not None and b"\r\n\r\n" in buf:
            started.set()
        text = _sse_body(buf).decode(errors="replace")
        events = []
        # Only blocks a blank line has ended are whole events: the last one
        # may still be arriving.
        for block in text.split("\n\n")[:-1]:
            ev = {}
            for line in block.split("\n"):
                line = line.rstrip("\r")
                if line.startswith("id: "):
                    ev["id"] = int(line[4:])
                elif line.startswith("event: "):
                    ev["event"] = line[7:]
                elif line.startswith("data: "):
                    ev["data"] = json.loads(line[6:])
            if "data" in ev:
                events.append(ev)
        if want and want(events):
            break
    sock.close()
    return buf.decode(errors="replace"), events


def tls_check():
    """A gateway with tls.cert/tls.key answers over HTTPS."""
    import ssl
    work = tempfile.mkdtemp(prefix="pcp-gw-tls-")
    proc = None
    try:
        cert, key = os.path.join(work, "c.pem"), os.path.join(work, "k.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "1",
                        "-subj", "/CN=127.0.0.1"], check=True,
                       capture_output=True)
        api_port, fabric_port = free_port(), free_port()
        config = os.path.join(work, "g.json")
        with open(config, "w") as f:
            json.dump({"gateway_id": "tls", "lab_id": "lab",
                       "state_dir": os.path.join(work, "state"),
                       "tls": {"cert": cert, "key": key},
                       "worker_fabric": {"host": "127.0.0.1",
                                         "port": fabric_port}}, f)
        env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN)
        proc = subprocess.Popen([PCP, "--gateway", "--gateway-config", config,
                                 "--api-port", str(api_port)], env=env,
                                stderr=subprocess.DEVNULL)
        context = ssl.create_default_context(cafile=cert)
        context.check_hostname = False
        body = None
        deadline = time.time() + 20
        while time.time() < deadline and body is None:
            try:
                with urllib.request.urlopen(
                        "https://127.0.0.1:%d/v1/controller" % api_port,
                        context=context, timeout=5) as r:
                    body = json.loads(r.read())
            except (OSError, urllib.error.URLError):
                time.sleep(0.1)
        check(body is not None and body.get("tls") is True,
              "HTTPS controller with tls configured: %s" % body)
    finally:
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            check(proc.wait(timeout=20) == 0, "TLS gateway exit 0")
        shutil.rmtree(work, ignore_errors=True)


def main():
    global BASE
    work = tempfile.mkdtemp(prefix="pcp-gw-")
    api_port, fabric_port = free_port(), free_port()
    BASE = "http://127.0.0.1:%d" % api_port
    gw = Gateway(work, api_port, fabric_port)
    procs = []
    try:
        gw.start()
        procs.append(gw.proc)
        # 1. Probes and auth.
        check(request("GET", "/healthz", token=None)[0] == 200, "healthz")
        s, ready = request("GET", "/readyz", token=None)
        check(s == 200 and ready["store_open"] and ready["fabric_listening"],
              "readyz ready: %s %s" % (s, ready))
        for method, path in [("GET", "/v1/controller"), ("GET", "/v1/workers"),
                             ("GET", "/v1/services"), ("GET", "/v1/jobs"),
                             ("POST", "/v1/jobs"), ("GET", "/v1/events"),
                             ("POST", "/v1/graph/query"),
                             ("GET", "/v1/graph/status")]:
            check(is_error(request(method, path, token=None), 401),
                  "401 without token: %s %s" % (method, path))
            check(is_error(request(method, path, token="wrong"), 401),
                  "401 with a wrong token: %s %s" % (method, path))
        s, c = request("GET", "/v1/controller")
        check(s == 200 and c["gateway_id"] == "gw-test" and c["auth_enabled"],
              "controller")
        check(is_error(request("GET", "/v1/nope"), 404), "404 JSON")
        check(is_error(request("DELETE", "/v1/jobs"), 405), "405 JSON")

        # 2. Services.
        check(is_error(request("POST", "/v1/services/register", b"{",
                               ), 400), "register: bad JSON 400")
        check(is_error(request("POST", "/v1/services/register",
                               {"service_id": "s"}), 400, "INVALID_ARGUMENT"),
              "register: missing type 400")
        check(is_error(request("POST", "/v1/services/register",
                               {"service_id": "s", "service_type": "training",
                                "base_url": "http://x", "ttl_ms": 5}), 400),
              "register: bad ttl 400")
        s, r = request("POST", "/v1/services/register",
                       {"service_id": "train-1", "service_type": "training",
                        "base_url": "http://127.0.0.1:1", "ttl_ms": 1000,
                        "workers_available": 2})
        check(s == 200 and r["accepted"], "register ok")
        ex = r["service"]["executor_id"]
        check(ex == "gw-test:training:train-1", "executor id default")
        check(request("GET", "/v1/services/" + ex)[0] == 200, "service get")
        hb_sent = time.monotonic()
        check(request("POST", "/v1/services/%s/heartbeat" % ex)[0] == 200,
              "heartbeat")
        s, lst = request("GET", "/v1/services?service_type=training")
        check(s == 200 and len(lst["services"]) == 1, "service list")
        # Polled, not slept: the entry goes once its 1000 ms TTL (counted
        # from the heartbeat) ran out, and not before.
        expired = None
        while time.monotonic() < hb_sent + 10:
            if is_error(request("GET", "/v1/services/" + ex), 404):
                expired = time.monotonic() - hb_sent
                break
            time.sleep(0.02)
        check(expired is not None and expired >= 1.0,
              "service expired after its TTL (%s s after the heartbeat)" %
              expired)
        check(request("GET", "/v1/services")[1]["services"] == [],
              "expired service not listed")
        check(is_error(request("POST", "/v1/services/%s/heartbeat" % ex), 409),
              "heartbeat after expiry 409")
        request("POST", "/v1/services/register",
                {"service_id": "inf", "service_type": "inference",
                 "base_url": "http://127.0.0.1:2"})
        check(request("DELETE", "/v1/services/gw-test:inference:inf")[0] == 200,
              "service delete")
        check(is_error(request("DELETE", "/v1/services/gw-test:inference:inf"),
                       404), "service delete twice 404")

        # 2b. Training API: the experiment is validated through the
        # workloads config table (400 naming the key), recorded as a job of
        # kind "training" with its progress at zero; the training service
        # (not the generic runner) takes it, and a cancel ends it
        # (training_e2e_test.py trains for real).
        data = os.path.abspath(os.path.join(os.path.dirname(__file__), "..",
                                            "..", "data",
                                            "tiny_shakespeare.txt"))
        exp = {"model": {"kind": "gpt", "layers": 1, "batch": 4},
               "data_path": data, "tokenizer": "char",
               "tau": 2, "outer_loop_steps": 3, "deltas_dtype": "bf16"}
        for bad, key in [(dict(exp, tau=0), "tau"),
                         (dict(exp, nesterov_momentum="x"),
                          "nesterov_momentum"),
                         ({"model_path": "m.mlir"}, "data_path")]:
            r = request("POST", "/v1/training/jobs", bad)
            check(is_error(r, 400, "INVALID_ARGUMENT") and
                  key in r[1]["error"]["message"],
                  "training: 400 naming %s: %s" % (key, r))
        s, t = request("POST", "/v1/training/jobs", exp)
        check(s == 202 and t["kind"] == "training" and
              t["state"] == "queued" and
              t["training"]["outer_loop_steps"] == 3 and
              t["training"]["tau"] == 2 and
              t["training"]["outer_step"] == 0 and
              t["training"]["deltas_dtype"] == "bf16",
              "training submit: %s" % t)
        s, t2 = request("GET", "/v1/training/jobs/" + t["job_id"])
        check(s == 200 and t2["training"] == t["training"] and
              t2["spec"]["experiment"]["data_path"] == exp["data_path"],
              "training get: %s" % t2)
        s, ev = request("GET", "/v1/jobs/%s/events" % t["job_id"])
        check(s == 200 and "training.accepted" in
              [e["type"] for e in ev["events"]], "training events: %s" % ev)
        # The training events reach /v1/events like any job event (replay
        # from the start, so nothing races the submission).
        _, sse = sse_read("/v1/events", last_event_id=0, seconds=5, want=(
            lambda evs: any(e["data"].get("type") == "training.accepted" and
                            e["data"].get("job_id") == t["job_id"]
                            for e in evs)))
        check(any(e["data"].get("type") == "training.accepted" and
                  e["data"].get("job_id") == t["job_id"] and
                  e["data"]["payload"]["tau"] == 2 for e in sse),
              "training.accepted on /v1/events")
        wait_for(lambda: job_state(t["job_id"]) == "running", 10,
                 "the training service runs the training job")
        s, _ = request("POST", "/v1/jobs/%s/cancel" % t["job_id"])
        check(s in (200, 202), "training job cancel")
        wait_for(lambda: job_state(t["job_id"]) == "cancelled", 20,
                 "training job cancelled")
        # `pcp submit train`: the client posts the file and follows the job
        # to its end (here a cancel, so exit code 1 naming the state).
        exp_path = os.path.join(work, "exp.json")
        with open(exp_path, "w") as f:
            json.dump(exp, f)
        env = dict(os.environ, GW_TEST_TOKEN=TOKEN)
        cli = [PCP, "submit", "train", exp_path, "--gateway", BASE,
               "--api-token-env", "GW_TEST_TOKEN"]
        r = subprocess.run(cli + ["--no-follow"], env=env, capture_output=True,
                           text=True, timeout=30)
        check(r.returncode == 0 and r.stdout.startswith("job train-"),
              "submit --no-follow: %s %s" % (r.stdout, r.stderr))
        with open(exp_path, "w") as f:
            json.dump(dict(exp, tau=0), f)
        r = subprocess.run(cli, env=env, capture_output=True, text=True,
                           timeout=30)
        check(r.returncode == 1 and "tau" in r.stderr and "400" in r.stderr,
              "submit of a bad experiment: %s %s" % (r.stdout, r.stderr))
        with open(exp_path, "w") as f:
            json.dump(exp, f)
        follower = subprocess.Popen(cli + ["--poll-ms", "50"], env=env,
                                    stdout=subprocess.PIPE, text=True)
        first = follower.stdout.readline()
        check(first.startswith("job train-"), "submit follow: " + first)
        followed = first.split()[1]
        wait_for(lambda: job_state(followed) == "running", 10, "followed job")
        request("POST", "/v1/jobs/%s/cancel" % followed)
        out, _ = follower.communicate(timeout=30)
        check(follower.returncode == 1 and "step 0/3 loss -" in out and
              ("job %s cancelled" % followed) in out,
              "submit follow ends with the job: %s" % out)

        # 3. Graph.
        s, m = request("POST", "/v1/graph/mutate", {"mutations": [
            {"mutation_type": "upsert_entity", "target_id": "e1",
             "payload": {"entity_type": "model", "display_name": "E one"}},
            {"mutation_type": "upsert_entity", "target_id": "e2",
             "payload": {"entity_type": "dataset"}},
            {"mutation_type": "upsert_relation", "target_id": "r1",
             "payload": {"relation_type": "trained_on",
                         "from_entity_id": "e1", "to_entity_id": "e2"}},
            {"mutation_type": "append_observation", "target_id": "o1",
             "payload": {"observation_type": "loss", "subject_entity_id": "e1",
                         "payload": {"loss": 1.5}}}]})
        check(s == 200 and len(m["mutation_ids"]) == 4, "graph mutate %s" % m)
        s, q = request("POST", "/v1/graph/query", {"entity_id": "e1"})
        check(s == 200 and len(q["entities"]) == 1 and
              len(q["relations"]) == 1 and len(q["observations"]) == 1,
              "graph query %s" % q)
        check(request("GET", "/v1/graph/entities/e1")[0] == 200, "entity get")
        check(is_error(request("GET", "/v1/graph/entities/none"), 404),
              "entity 404")
        check(is_error(request("POST", "/v1/graph/mutate", {"mutations": [
            {"mutation_type": "bogus", "target_id": "x"}]}), 400),
            "bad mutation type 400")
        check(is_error(request("POST", "/v1/graph/query",
                               {"query_mode": "global"}), 400),
              "global query without hub 400")
        for mode in ("global", "local_plus_global"):
            s, q = request("POST", "/v1/inference/query/chat/completions",
                           {"graph_query": {"query_mode": mode},
                            "inference": {"model": "m", "messages": [
                                {"role": "user", "content": "hi"}]}})
            check(s == 400 and q["error"]["param"] ==
                  "graph_query.query_mode" and "hub" in
                  q["error"]["message"],
                  "query-then-infer %s without hub 400: %s %s" % (mode, s, q))
        check(is_error(request("POST", "/v1/graph/query", b"[" * 100), 400),
              "too deep JSON 400")
        check(request("GET", "/v1/graph/status")[0] == 200, "graph status")

        # 4. OpenAPI.
        s, doc = request("GET", "/openapi.json", token=None)
        check(s == 200 and doc.get("openapi", "").startswith("3."), "openapi")
        for path in ["/healthz", "/readyz", "/metrics", "/v1/controller",
                     "/v1/workers", "/v1/services", "/v1/services/register",
                     "/v1/services/{id}", "/v1/services/{id}/heartbeat",
                     "/v1/jobs", "/v1/jobs/{id}", "/v1/jobs/{id}/cancel",
                     "/v1/jobs/{id}/results", "/v1/jobs/{id}/results/{name}",
                     "/v1/jobs/{id}/events", "/v1/events", "/v1/graph/query",
                     "/v1/graph/mutate", "/v1/graph/entities/{id}",
                     "/v1/graph/status", "/v1/training/jobs",
                     "/v1/training/jobs/{id}", "/v1/models",
                     "/v1/models/{id}", "/v1/chat/completions",
                     "/v1/completions", "/", "/openapi.json"]:
            check(path in doc.get("paths", {}), "openapi names " + path)

        # Limits: a body over the route's cap is 413 with the JSON error.
        # (Only the headers are sent: the server answers from Content-Length
        # before reading the body, and a client still sending would see
        # its pipe break.)
        with socket.create_connection(("127.0.0.1", api_port), 10) as sock:
            sock.sendall(("POST /v1/services/register HTTP/1.1\r\nHost: x\r\n"
                          "Authorization: Bearer %s\r\nContent-Type: "
                          "application/json\r\nContent-Length: %d\r\n\r\n"
                          % (TOKEN, 2 << 20)).encode())
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(
                    b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        head, _, payload = answer.partition(b"\r\n\r\n")
        check(head.startswith(b"HTTP/1.1 413") and
              b'"error"' in payload, "2 MiB body 413: %r" % answer[:200])

        # 5. Jobs: bad input first.
        for bad, what in [({}, "no program"),
                          ({"program": {"format": "onnx", "text": "x"}},
                           "bad format"),
                          ({"program": {"format": "vmfb", "base64": "!!"}},
                           "bad base64"),
                          (job_body([1] * 6, [1] * 6,
                                    placement={"backend": "tpu"}),
                           "bad backend"),
                          (job_body([1] * 5, [1] * 6), "short input"),
                          (job_body([1] * 6, [1] * 6,
                                    placement={"workers": 0}), "0 workers")]:
            check(is_error(request("POST", "/v1/jobs", bad), 400),
                  "job submit 400: " + what)
        check(is_error(request("GET", "/v1/jobs/job-none"), 404), "job 404")
        check(is_error(request("GET", "/v1/jobs?state=bogus"), 400),
              "job list bad state 400")
        _, start_events = sse_read("/v1/events", seconds=0.3)

        s, queued = request("POST", "/v1/jobs", job_body(
            [1, 2, 3, 4, 5, 6], [0.5] * 6))
        # The runner may already have picked it up: any live state is fine.
        check(s == 202 and queued["state"] in ("queued", "placing",
                                               "compiling", "running"),
              "job accepted: %s %s" % (s, queued))
        job1 = queued["job_id"]
        # Cancel while no worker exists: it is queued or waiting in running.
        s, victim = request("POST", "/v1/jobs", job_body([0] * 6, [0] * 6))
        s, cancel = request("POST", "/v1/jobs/%s/cancel" % victim["job_id"])
        check(s in (200, 202) and cancel["accepted"], "cancel accepted")
        wait_for(lambda: job_state(victim["job_id"]) == "cancelled", 10,
                 "cancelled job")

        worker = start_worker(work, fabric_port)
        procs.append(worker)
        wait_for(lambda: job_state(job1) in ("succeeded", "failed"), 90,
                 "job 1 finished")
        s, j = request("GET", "/v1/jobs/" + job1)
        check(j["state"] == "succeeded", "job 1 succeeded: %s" % j)
        s, res = request("GET", "/v1/jobs/%s/results" % job1)
        check(s == 200 and res["results"][0]["shape"] == [2, 3] and
              res["results"][0]["dtype"] == "f32", "results listed %s" % res)
        s, raw, _ = request("GET", "/v1/jobs/%s/results/out0" % job1, raw=True)
        got = struct.unpack("<6f", raw)
        want = [(a + 0.5) ** 2 for a in [1, 2, 3, 4, 5, 6]]
        check(s == 200 and all(abs(x - y) < 1e-5 for x, y in zip(got, want)),
              "raw result %s" % (got,))
        s, npy, _ = request("GET", "/v1/jobs/%s/results/out0?format=npy" % job1,
                            raw=True)
        check(s == 200 and npy.startswith(b"\x93NUMPY") and
              npy.endswith(raw), "npy result")
        check(is_error(request("GET", "/v1/jobs/%s/results/nope" % job1), 404),
              "result 404")
        s, ev = request("GET", "/v1/jobs/%s/events" % job1)
        states = [e["to"] for e in ev["events"] if e["type"] == "state"]
        check(states == ["queued", "placing", "compiling", "running",
                         "succeeded"], "job 1 event chain %s" % states)
        # Issue 18: events page on with ?after=; the dashboard's history
        # route answers training jobs only.
        first = ev["events"][0]["event_id"]
        s, rest = request("GET", "/v1/jobs/%s/events?after=%d" % (job1, first))
        check(s == 200 and rest["more"] is False and
              [e["event_id"] for e in rest["events"]] ==
              [e["event_id"] for e in ev["events"][1:]],
              "events after the first: %s" % rest)
        for bad in ("x", "-1", "", "99999999999999999999"):
            r = request("GET", "/v1/jobs/%s/events?after=%s" % (job1, bad))
            check(is_error(r, 400, "INVALID_ARGUMENT") and
                  "after" in r[1]["error"]["message"],
                  "events ?after=%s is 400 naming after: %s" % (bad, r))
        check(is_error(request("GET", "/v1/training/jobs/%s/history" % job1),
                       404), "history of a generic job is 404")
        check(is_error(request("GET", "/v1/training/jobs/nope/history"), 404),
              "history of an unknown job is 404")
        s, hist = request("GET", "/v1/training/jobs/%s/history" % t["job_id"])
        check(s == 200 and hist["points"] == len(hist["loss"]) ==
              len(hist["outer_step"]) and hist["outer_loop_steps"] == 3 and
              hist["state"] == "cancelled" and hist["truncated"] is False,
              "history of the cancelled training job: %s" % hist)
        s, w = request("GET", "/v1/workers")
        check(w["counts"]["connected"] == 1 and len(w["workers"]) == 1,
              "workers %s" % w)

        # 6. SSE: live events after the start cursor, then resume.
        text, events = sse_read("/v1/events?after=0", seconds=3,
                                want=lambda e: len(e) >= 5)
        job_events = [e for e in events if e.get("event") == "job"]
        check(len(job_events) >= 5, "SSE replay from 0: %d" % len(job_events))
        ids = [e["id"] for e in job_events]
        check(ids == sorted(ids), "SSE ids ascending")
        if len(ids) >= 3:
            _, resumed = sse_read("/v1/events", last_event_id=ids[1],
                                  seconds=2, want=lambda e: len(e) >= 3)
            rids = [e["id"] for e in resumed if "id" in e]
            check(rids and rids[0] == ids[2], "SSE resume after %d: %s" %
                  (ids[1], rids[:3]))
        check(is_error(request("GET", "/v1/events",
                               headers={"Last-Event-ID": "x"}), 400),
              "bad Last-Event-ID 400")
        # Past int64: refused, not clamped to the end of time (issue 13).
        check(is_error(request("GET", "/v1/events", headers={
            "Last-Event-ID": "99999999999999999999"}), 400),
              "Last-Event-ID past int64 400")

        # 7. promtool.
        s, metrics, _ = request("GET", "/metrics", token=None, raw=True)
        promtool = need_tool("promtool")  # Debian package prometheus
        if promtool:
            import promtool_lint  # vllm:* names: tests/integration
            found = promtool_lint.problems(promtool, metrics)
            check(found is None, "promtool: %s" % found)
        mt = metrics.decode()
        for name in ["pcp_http_request_duration_seconds_bucket",
                     "pcp_fabric_workers", "pcp_gateway_jobs",
                     "pcp_fabric_received_bytes_total",
                     "pcp_fabric_heartbeat_age_seconds"]:
            check(name in mt, "metric " + name)

        # 10. Dashboard.
        s, page, _ = request("GET", "/", token=None, raw=True)
        check(s == 200 and b"dashboard.js" in page, "dashboard served")
        for path, ctype in [("/", "text/html"), ("/dashboard.js",
                                                "text/javascript"),
                            ("/dashboard.css", "text/css")]:
            s, _, h = request("GET", path, token=None, raw=True)
            check(s == 200 and h.get("Content-Type", "").startswith(ctype) and
                  h.get("Cache-Control") == "no-cache",
                  "%s: %s, Cache-Control %s" % (path, h.get("Content-Type"),
                                                h.get("Cache-Control")))
        # Chromium comes with `make setup` (tools/setup/apt-packages.txt):
        # missing is a failure, never a skip.
        chromium = need_tool("chromium", "chromium-browser")
        if chromium:
            out = subprocess.run(
                [chromium, "--headless", "--no-sandbox", "--disable-gpu",
                 "--virtual-time-budget=5000", "--dump-dom",
                 BASE + "/?token=" + TOKEN],
                capture_output=True, timeout=60)
            dom = out.stdout.decode(errors="replace")
            check("connected: 1" in dom, "dashboard shows the worker: %s" %
                  dom[:300])

        # Type confusion and junk on every body-taking route: 4xx JSON, and
        # the gateway keeps serving.
        common = [b"", b"null", b"[]", b"\"x\"", b"\xff\xfe{",
                  b"{" * 70 + b"}" * 70, b"{\"a\": 1"]
        per_route = {
            "/v1/jobs": [
                b"{\"program\": 5}",
                b"{\"program\": {\"format\": \"vmfb\", \"base64\": 5}}",
                b"{\"program\": {\"format\": \"stablehlo\", \"text\": \"\"}}",
                json.dumps(job_body([1] * 6, [1] * 6, inputs=5)).encode(),
                json.dumps(job_body([1] * 6, [1] * 6, inputs=[5])).encode(),
                json.dumps(job_body([1] * 6, [1] * 6, inputs=[
                    {"dtype": "f32", "shape": [-1],
                     "data_base64": ""}])).encode(),
                json.dumps(job_body([1] * 6, [1] * 6, inputs=[
                    {"dtype": "f32", "shape": [1] * 17,
                     "data_base64": "AAAAAA=="}])).encode(),
                json.dumps(job_body([1] * 6, [1] * 6, inputs=[
                    {"npy_base64": base64.b64encode(b"not npy").decode()}]
                    )).encode(),
                json.dumps(job_body([1] * 6, [1] * 6, function=7)).encode(),
                json.dumps(job_body([1] * 6, [1] * 6,
                                    placement={"workers": "2"})).encode()],
            "/v1/services/register": [
                b"{\"service_id\": 5, \"service_type\": \"t\", "
                b"\"base_url\": \"u\"}",
                b"{\"service_id\": \"s\", \"service_type\": \"t\", "
                b"\"base_url\": \"u\", \"ttl_ms\": \"x\"}",
                json.dumps({"service_id": "s" * 300, "service_type": "t",
                            "base_url": "u"}).encode()],
            "/v1/training/jobs": [b"{\"model_path\": 5}",
                                  b"{\"model\": [], \"data_path\": \"d\"}",
                                  b"{\"model_path\": \"m\", \"data_path\": "
                                  b"\"d\", \"tau\": 1e40}"],
            "/v1/graph/mutate": [b"{\"mutations\": 5}",
                                 b"{\"mutations\": [5]}",
                                 b"{\"mutations\": [{\"mutation_type\": "
                                 b"\"upsert_entity\"}]}"],
            "/v1/graph/query": [b"{\"entity_id\": 5}", b"{\"limit\": \"x\"}",
                                b"{\"text\": []}"],
        }
        for route, bodies in per_route.items():
            for body in common + bodies:
                s, answer = request("POST", route, body)
                check(400 <= s < 500 and isinstance(answer, dict) and
                      "error" in answer,
                      "junk on %s -> %s %s (%r)" % (route, s, str(answer)[:200],
                                                    body[:60]))
        check(request("GET", "/healthz", token=None)[0] == 200,
              "alive after junk")

        # 8. Restart: SIGKILL during a running job. Worker events reach an
        # open event stream as the workers come and go.
        import threading
        seen = {}
        subscribed = threading.Event()

        def watch():
            seen["events"] = sse_read("/v1/events", seconds=6,
                                      want=lambda e: any(
                                          x.get("event") == "workers" and
                                          x["data"]["connected"] >= 1 and
                                          x["data"]["lost"] >= 1
                                          for x in e),
                                      started=subscribed)[1]
        watcher = threading.Thread(target=watch)
        watcher.start()
        check(subscribed.wait(10), "event stream open within 10 s")
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=20)
        slow = start_worker(work, fabric_port, ["--test-task-delay-ms", "3000"])
        procs.append(slow)
        watcher.join()
        worker_events = [e["data"] for e in seen.get("events", [])
                         if e.get("event") == "workers"]
        check(any(e["connected"] >= 1 for e in worker_events) and
              any(e["lost"] >= 1 for e in worker_events),
              "worker events on /v1/events: %s" % worker_events)
        s, long_job = request("POST", "/v1/jobs", job_body([2] * 6, [1] * 6))
        job2 = long_job["job_id"]
        # The state comes from the store, so "running" seen here is already
        # committed; the slow worker holds the task for 3 s.
        wait_for(lambda: job_state(job2) == "running", 60, "job 2 running")
        gw.proc.send_signal(signal.SIGKILL)
        gw.proc.wait(timeout=10)
        gw.start()
        procs.append(gw.proc)
        s, j1 = request("GET", "/v1/jobs/" + job1)
        check(s == 200 and j1["state"] == "succeeded",
              "finished job survives restart")
        s, raw2, _ = request("GET", "/v1/jobs/%s/results/out0" % job1,
                             raw=True)
        check(raw2 == raw, "result survives restart")
        wait_for(lambda: job_state(job2) == "succeeded", 90,
                 "job 2 re-ran after restart")
        s, ev = request("GET", "/v1/jobs/%s/events" % job2)
        states = [e["to"] for e in ev["events"] if e["type"] == "state"]
        check(states[:4] == ["queued", "placing", "compiling", "running"] and
              states[4] == "queued" and states[-1] == "succeeded",
              "job 2 history across restart %s" % states)
        s, r2, _ = request("GET", "/v1/jobs/%s/results/out0" % job2, raw=True)
        check(s == 200 and abs(struct.unpack("<6f", r2)[0] - 9.0) < 1e-5,
              "job 2 result")

        # Cancel of a running job reaches the worker: the slow worker checks
        # for cancellation after its delay and answers CANCELLED, which the
        # fabric counts as a cancelled task outcome.
        s, j3 = request("POST", "/v1/jobs", job_body([3] * 6, [1] * 6))
        job3 = j3["job_id"]
        wait_for(lambda: job_state(job3) == "running", 60, "job 3 running")
        s, cancel = request("POST", "/v1/jobs/%s/cancel" % job3)
        check(s == 202 and cancel["status"] == "cancelling",
              "cancel of a running job: 202 cancelling (%s %s)" % (s, cancel))
        wait_for(lambda: job_state(job3) == "cancelled", 30, "job 3 cancelled")
        s, metrics, _ = request("GET", "/metrics", token=None, raw=True)
        check('pcp_fabric_tasks_total{outcome="cancelled"} 1' in
              metrics.decode(), "the worker answered the cancel")
        check(request("GET", "/v1/jobs/%s/results" % job3)[1]["results"] == [],
              "no results for a cancelled job")

        # A raw body is the program; the query string carries the rest.
        s, rawjob = request("POST", "/v1/jobs?function=main&backend=cpu",
                            ADD_MLIR.encode(), content_type="text/plain")
        check(s == 202 and rawjob["spec"]["program"]["format"] == "stablehlo",
              "raw StableHLO body accepted: %s %s" % (s, rawjob))
        check(is_error(request("POST", "/v1/jobs?backend=tpu", b"\0asm",
                               content_type="application/octet-stream"), 400),
              "raw body with a bad backend 400")

        # 9. SIGTERM drains: /readyz 503, then exit 0.
        gw.proc.send_signal(signal.SIGTERM)
        def readyz_draining():
            try:
                s, body = request("GET", "/readyz", token=None)
                return s == 503 and body.get("draining")
            except OSError:
                return False
        check(wait_for(readyz_draining, 1, "readyz 503"),
              "readyz 503 while draining")
        rc = gw.proc.wait(timeout=20)
        check(rc == 0, "gateway exit code %s after SIGTERM" % rc)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if FAILURES:
            for name in sorted(os.listdir(work)):
                if name.endswith(".err"):
                    print("==", name, file=sys.stderr)
                    print(open(os.path.join(work, name)).read()[-3000:],
                          file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    tls_check()
    if FAILURES:
        print("%d failure(s)" % len(FAILURES), file=sys.stderr)
        return 1
    print("gateway_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
