#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 13, connections and error shapes, against a real `pcp --gateway`.

- 1,100 connections from one client that never finish their headers: /healthz
  still answers 200 within 1 s and a token-authenticated API request works;
- a slowloris (a header byte every 200 ms, so the idle timeout never fires)
  is answered 408 and closed at the configured header deadline (2 s here);
- 5,000 query parameters: 414 JSON within 1 s; 2,000 headers: 431 JSON;
  Content-Length -1 and 2^64: 400 JSON; a huge chunked body: 413 JSON.
Every wait polls an observable condition against a deadline; no outcome
hinges on a sleep.

Usage: http_flood_test.py PATH_TO_PCP
"""

import http.client
import json
import os
import resource
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PCP = sys.argv[1] if len(sys.argv) > 1 else "build/pcp"
TOKEN = "flood-test-token"
FLOOD = 1100
HEADER_TIMEOUT_MS = 2000
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)
    else:
        print("ok:", what)


def wait_io(read, write, timeout):
    """select() without its 1,024-descriptor ceiling: returns the readable
    and the writable sockets among |read| and |write|."""
    poller = select.poll()
    for s in read:
        poller.register(s, select.POLLIN)
    for s in write:
        poller.register(s, select.POLLOUT | (select.POLLIN if s in read
                                             else 0))
    by_fd = {s.fileno(): s for s in list(read) + list(write)}
    ready_r, ready_w = [], []
    for fd, ev in poller.poll(max(0, int(timeout * 1000))):
        s = by_fd[fd]
        if ev & (select.POLLIN | select.POLLHUP | select.POLLERR) and s in read:
            ready_r.append(s)
        if ev & select.POLLOUT and s in write:
            ready_w.append(s)
    return ready_r, ready_w


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_exchange(port, data, timeout=5.0, connect_only=False):
    """Sends |data| on a fresh connection and reads one response (headers
    plus Content-Length bytes) or until the server closes. Returns
    (status, headers_text, body_bytes, seconds)."""
    start = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except OSError:
            pass  # the server may answer (and close) before the end
        buf = b""
        deadline = start + timeout
        while time.monotonic() < deadline:
            r, _ = wait_io([s], [], deadline - time.monotonic())
            if not r:
                break
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            head, sep, body = buf.partition(b"\r\n\r\n")
            if sep:
                length = None
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                if length is not None and len(body) >= length:
                    break
    finally:
        s.close()
    took = time.monotonic() - start
    head, _, body = buf.partition(b"\r\n\r\n")
    status = 0
    if head.startswith(b"HTTP/1.1 "):
        status = int(head[9:12])
    return status, head.decode(errors="replace"), body, took


def is_json_error(status, head, body, want_status, want_code):
    if status != want_status:
        return False
    if "content-type: application/json" not in head.lower():
        return False
    try:
        doc = json.loads(body.decode())
    except ValueError:
        return False
    err = doc.get("error") if isinstance(doc, dict) else None
    return (isinstance(err, dict) and err.get("code") == want_code and
            isinstance(err.get("message"), str) and len(doc) == 1)


def api_get(port, path, token=TOKEN, timeout=5):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path))
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, http.client.HTTPException) as e:
        return 0, str(e).encode()  # no answer: a failed check, not a crash


def main():
    if not os.path.exists(PCP):
        print("pcp binary not found:", PCP, file=sys.stderr)
        return 1
    # The flood needs ~1,200 descriptors here; raise the soft limit to the
    # hard one (and fail clearly if even that is too small).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FLOOD + 256
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            print("RLIMIT_NOFILE hard limit %d < %d" % (hard, want),
                  file=sys.stderr)
            return 1
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    work = tempfile.mkdtemp(prefix="pcp-flood-")
    api_port, fabric_port = free_port(), free_port()
    config = os.path.join(work, "g.json")
    with open(config, "w") as f:
        json.dump({"gateway_id": "gw-flood", "lab_id": "lab",
                   "state_dir": os.path.join(work, "state"),
                   "api": {"token_env": "FLOOD_TEST_TOKEN"},
                   "worker_fabric": {"host": "127.0.0.1", "port": fabric_port,
                                     "join_token_env": "FLOOD_TEST_JOIN"},
                   "http": {"header_timeout_ms": HEADER_TIMEOUT_MS}}, f)
    env = dict(os.environ, FLOOD_TEST_TOKEN=TOKEN, FLOOD_TEST_JOIN="j")
    err = open(os.path.join(work, "gw.err"), "w")
    proc = subprocess.Popen([PCP, "--gateway", "--gateway-config", config,
                             "--api-port", str(api_port)], env=env,
                            stderr=err)
    flood = []
    try:
        deadline = time.monotonic() + 30
        up = False
        while time.monotonic() < deadline and not up:
            try:
                up = api_get(api_port, "/healthz", token=None)[0] == 200
            except OSError:
                time.sleep(0.05)
        if not up:
            print("gateway did not start", file=sys.stderr)
            return 1

        # 1. The flood: headers begun, never finished.
        for _ in range(FLOOD):
            s = socket.create_connection(("127.0.0.1", api_port), timeout=5)
            s.sendall(b"GET /v1/controller HTTP/1.1\r\nHost: x\r\n")
            flood.append(s)
        status, head, body, took = raw_exchange(
            api_port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        check(status == 200 and took < 1.0,
              "/healthz under a %d-connection flood: %d in %.3f s" %
              (FLOOD, status, took))
        start = time.monotonic()
        status, _ = api_get(api_port, "/v1/controller")
        check(status == 200,
              "API request with the token under the flood: %d in %.3f s" %
              (status, time.monotonic() - start))
        status, _ = api_get(api_port, "/v1/controller", token=None)
        check(status == 401, "API without the token still 401: %d" % status)

        # The flood's connections are answered 408 and closed once the
        # header deadline passes (poll until every one has seen EOF).
        deadline = time.monotonic() + HEADER_TIMEOUT_MS / 1000 + 10
        open_ones = list(flood)
        while open_ones and time.monotonic() < deadline:
            r, _ = wait_io(open_ones, [], 0.5)
            for s in r:
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    open_ones.remove(s)
        check(not open_ones, "every flood connection closed by the server "
              "(%d left open)" % len(open_ones))
        for s in flood:
            s.close()
        flood = []

        # 2. Slowloris: a header byte every 200 ms.
        s = socket.create_connection(("127.0.0.1", api_port), timeout=5)
        s.sendall(b"GET /v1/controller HTTP/1.1\r\nX-Slow: ")
        start = time.monotonic()
        got, closed = b"", False
        while not closed and time.monotonic() - start < 15:
            try:
                s.send(b"a")
            except OSError:
                pass
            r, _ = wait_io([s], [], 0.2)
            if r:
                try:
                    chunk = s.recv(65536)
                except OSError:
                    chunk = b""
                if chunk:
                    got += chunk
                else:
                    closed = True
        took = time.monotonic() - start
        s.close()
        head, _, body = got.partition(b"\r\n\r\n")
        status = int(head[9:12]) if head.startswith(b"HTTP/1.1 ") else 0
        check(closed and is_json_error(status, head.decode(), body, 408,
                                       "DEADLINE_EXCEEDED"),
              "slowloris answered 408 JSON and closed (%d)" % status)
        check(HEADER_TIMEOUT_MS / 1000 - 0.2 <= took <=
              HEADER_TIMEOUT_MS / 1000 + 3,
              "slowloris cut after %.2f s (header timeout %.1f s)" %
              (took, HEADER_TIMEOUT_MS / 1000))

        # 3. 5,000 query parameters: 414 at once.
        query = "&".join("p%d=%d" % (i, i) for i in range(5000))
        status, head, body, took = raw_exchange(
            api_port, ("GET /v1/controller?%s HTTP/1.1\r\nHost: x\r\n\r\n" %
                       query).encode())
        check(is_json_error(status, head, body, 414, "RESOURCE_EXHAUSTED") and
              took < 1.0, "5,000 query params: %d JSON in %.3f s" %
              (status, took))

        # 4. 2,000 headers: 431.
        headers = "".join("X-H-%d: v\r\n" % i for i in range(2000))
        status, head, body, _ = raw_exchange(
            api_port, ("GET /v1/controller HTTP/1.1\r\nHost: x\r\n%s\r\n" %
                       headers).encode())
        check(is_json_error(status, head, body, 431, "RESOURCE_EXHAUSTED"),
              "2,000 headers: %d JSON" % status)

        # 5. Content-Length -1 and 2^64: 400.
        for value in ("-1", str(2 ** 64)):
            status, head, body, _ = raw_exchange(
                api_port,
                ("POST /v1/services/register HTTP/1.1\r\nHost: x\r\n"
                 "Authorization: Bearer %s\r\nContent-Length: %s\r\n\r\n{}" %
                 (TOKEN, value)).encode())
            check(is_json_error(status, head, body, 400, "INVALID_ARGUMENT"),
                  "Content-Length %s: %d JSON" % (value, status))

        # 6. A huge chunked body: 413 while it is still being sent.
        s = socket.create_connection(("127.0.0.1", api_port), timeout=5)
        s.sendall(("POST /v1/services/register HTTP/1.1\r\nHost: x\r\n"
                   "Authorization: Bearer %s\r\nContent-Type: "
                   "application/json\r\nTransfer-Encoding: chunked\r\n\r\n" %
                   TOKEN).encode())
        chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
        sent, got = 0, b""
        s.setblocking(False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sent < (256 << 20):
            r, w = wait_io([s], [s], 1)
            if r:
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                got += data
                if not data or b"\r\n\r\n" in got:
                    break
            if w:
                try:
                    sent += s.send(chunk)
                except (BlockingIOError, OSError):
                    pass
        s.setblocking(True)
        s.settimeout(5)
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                got += data
                head, sep, body = got.partition(b"\r\n\r\n")
                if sep and b"}}" in body:
                    break
        except OSError:
            pass
        s.close()
        head, _, body = got.partition(b"\r\n\r\n")
        status = int(head[9:12]) if head.startswith(b"HTTP/1.1 ") else 0
        check(is_json_error(status, head.decode(), body, 413,
                            "RESOURCE_EXHAUSTED"),
              "huge chunked body: %d JSON after %d MiB sent" %
              (status, sent >> 20))

        # Still healthy afterwards, and a clean stop.
        check(api_get(api_port, "/healthz", token=None)[0] == 200,
              "/healthz after everything")
        proc.terminate()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        check(code == 0, "gateway exits 0 on SIGTERM (%s)" % code)
    finally:
        for s in flood:
            s.close()
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err.close()
        if FAILURES:
            with open(os.path.join(work, "gw.err")) as f:
                sys.stderr.write(f.read()[-4000:])
        shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print("%d failure(s)" % len(FAILURES), file=sys.stderr)
        return 1
    print("http_flood_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
