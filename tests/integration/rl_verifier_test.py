# SPDX-License-Identifier: Apache-2.0
"""The external RL reward verifier (src/services/verifier.c) against a
verifier written with Python's http.server on 127.0.0.1, a different HTTP
stack from the C test's (services_verifier_test uses PCP's own server).

usage: rl_verifier_test.py VERIFIER_SCORE_TOOL

The server checks the wire format of docs/rl.md "Rewards" on every request
(method, path, Content-Type, the bearer token, exactly the four item keys,
answer and metadata null or typed) and answers per path:
  /ok         rewards = len(completion) + 10 when it equals the answer
              + metadata["bonus"];
  /drop_once  the first request's connection is closed unanswered, the
              retry is scored;
  /busy_once  503 first, then scored;
  /gone       always 503 (fails after the retries);
  /wrong_len  one reward too few;
  /bool       a JSON true among the rewards.
Asserts the rewards, the slicing into max_batch, the number of requests per
path, and that every failure names what went wrong.
"""

import http.server
import json
import os
import subprocess
import sys
import threading

TOKEN = "python-verifier-token"
TOKEN_ENV = "PCP_RL_VERIFIER_PY_TOKEN"

requests = {}
batch_sizes = []
wire_errors = []
lock = threading.Lock()


def check_wire(handler, body):
    problems = []
    if handler.command != "POST":
        problems.append(f"method {handler.command}")
    if handler.headers.get("Content-Type") != "application/json":
        problems.append(f"content-type {handler.headers.get('Content-Type')}")
    if handler.headers.get("Authorization") != f"Bearer {TOKEN}":
        problems.append("authorization header")
    if set(body) != {"items"} or not isinstance(body["items"], list):
        problems.append(f"top-level keys {sorted(body)}")
        return problems
    for item in body["items"]:
        if set(item) != {"prompt", "completion", "answer", "metadata"}:
            problems.append(f"item keys {sorted(item)}")
        elif not (isinstance(item["prompt"], str) and
                  isinstance(item["completion"], str) and
                  (item["answer"] is None or isinstance(item["answer"], str))
                  and (item["metadata"] is None or
                       isinstance(item["metadata"], dict))):
            problems.append(f"item types {item!r}")
    return problems


def score(items):
    out = []
    for item in items:
        reward = float(len(item["completion"]))
        if item["answer"] is not None and item["answer"] == item["completion"]:
            reward += 10
        reward += (item["metadata"] or {}).get("bonus", 0)
        out.append(reward)
    return out


class Verifier(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, code, payload):
        data = payload if isinstance(payload, bytes) else json.dumps(
            payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        path = self.path.split("?")[0]
        with lock:
            seen = requests.get(path, 0)
            requests[path] = seen + 1
        body = json.loads(raw)
        problems = check_wire(self, body)
        items = body.get("items", [])
        with lock:
            batch_sizes.append(len(items))
            wire_errors.extend(problems)
        if path == "/drop_once" and seen == 0:
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if path in ("/busy_once", "/gone") and (seen == 0 or path == "/gone"):
            self.answer(503, b"overloaded, try later")
            return
        rewards = score(items)
        if path == "/wrong_len":
            rewards = rewards[:-1]
        if path == "/bool":
            rewards[0] = True
        self.answer(200, {"rewards": rewards, "verifier": "py"})


def run_tool(tool, config, batches):
    env = dict(os.environ, **{TOKEN_ENV: TOKEN})
    lines = "\n".join(json.dumps(b) for b in batches) + "\n"
    out = subprocess.run([tool, json.dumps(config)], input=lines,
                         capture_output=True, text=True, timeout=90, env=env)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def main():
    tool = sys.argv[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Verifier)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL", what)

    def config(path, **extra):
        c = {"type": "verifier", "url": base + path, "token_env": TOKEN_ENV,
             "backoff_ms": 20, "timeout_ms": 5000}
        c.update(extra)
        return c

    items = [{"prompt": "p", "completion": "x" * i,
              "answer": "xxx" if i == 3 else None} for i in range(7)]
    items[5]["metadata"] = {"bonus": 0.25}
    want = [float(i) + (10 if i == 3 else 0) + (0.25 if i == 5 else 0)
            for i in range(7)]
    text_items = [{"prompt": "q", "completion": "caf\u00e9 \u65e5\u672c"}]

    out = run_tool(tool, config("/ok", max_batch=3), [items, text_items])
    expect(out[0].get("rewards") == want, f"/ok rewards {out[0]}")
    expect(out[1].get("rewards") == [7.0], f"/ok unicode {out[1]}")
    expect(requests.get("/ok") == 4, f"/ok requests {requests.get('/ok')}")
    expect(max(batch_sizes) == 3, f"batch sizes {batch_sizes}")

    out = run_tool(tool, config("/drop_once", max_retries=1), [items[:2]])
    expect(out[0].get("rewards") == want[:2], f"/drop_once {out[0]}")
    expect(requests.get("/drop_once") == 2, "/drop_once retried once")

    out = run_tool(tool, config("/busy_once", max_retries=2), [items[:2]])
    expect(out[0].get("rewards") == want[:2], f"/busy_once {out[0]}")
    expect(requests.get("/busy_once") == 2, "/busy_once retried once")

    out = run_tool(tool, config("/gone", max_retries=2), [items[:2]])
    expect(out[0].get("error") == "UNAVAILABLE" and
           "HTTP 503: 'overloaded, try later'" in out[0].get("message", "")
           and "gave up after 3 attempts" in out[0].get("message", ""),
           f"/gone {out[0]}")
    expect(requests.get("/gone") == 3, f"/gone requests {requests.get('/gone')}")

    out = run_tool(tool, config("/wrong_len", max_retries=2), [items[:3]])
    expect(out[0].get("error") == "DATA_LOSS" and
           "returned 2 rewards for 3 items" in out[0].get("message", ""),
           f"/wrong_len {out[0]}")
    expect(requests.get("/wrong_len") == 1, "/wrong_len not retried")

    out = run_tool(tool, config("/bool"), [items[:2]])
    expect(out[0].get("error") == "DATA_LOSS" and
           "rewards[0] = true, not a finite number" in out[0].get("message", ""),
           f"/bool {out[0]}")

    expect(not wire_errors, f"wire format problems seen by the server: "
           f"{wire_errors[:5]}")
    server.shutdown()
    print(f"{len(batch_sizes)} requests served, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
