#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`pcp chat` (issue 6 item 5) against a scripted OpenAI-style server on
127.0.0.1: a unit test of the client's SSE and JSON handling and its
control flow, with the real binary and real HTTP. The server speaks the
public wire format (chunked text/event-stream, `data: {chunk}` lines,
`data: [DONE]`, OpenAI error bodies); the last user message picks the
script. Covered: streamed and non-streamed replies, every request field,
usage, CRLF and multi-line events with comments, an error event
mid-stream, HTTP 400 and 401 bodies, connection refused, a server that
closes mid-stream (chunked, and a clean close before [DONE]), an oversized
SSE line, malformed events, a non-SSE answer, a reply over the cap,
multi-turn history, Ctrl-C (one-shot and interactive: the server sees the
disconnect), an over-long stdin line, flag errors. Every wait is bounded.
The end-to-end check against the real gateway lives with the inference
service's tests.
"""
import http.server
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)


class State:
    def __init__(self):
        self.token = None
        self.requests = []  # (path, headers dict, body json or None)
        self.models = [{"id": "toy-model", "object": "model"}]
        self.disconnected_at = None
        self.lock = threading.Lock()


def reply_text(messages):
    last = messages[-1]["content"] if messages else ""
    return "echo[%d]: %s" % (len(messages), last)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    @property
    def state(self):
        return self.server.state

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, status, message, type_, code=None, param=None):
        self.send_json(status, {"error": {"message": message, "type": type_,
                                          "param": param, "code": code}})

    def authorized(self):
        if not self.state.token:
            return True
        if self.headers.get("Authorization") == "Bearer " + self.state.token:
            return True
        self.error(401, "Incorrect API key provided",
                   "invalid_request_error", "invalid_api_key")
        return False

    def do_GET(self):
        with self.state.lock:
            self.state.requests.append((self.path, dict(self.headers), None))
        if not self.authorized():
            return
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": self.state.models})
        else:
            self.error(404, "no route", "invalid_request_error")

    # -- streaming helpers --
    def start_stream(self, chunked=True, content_type="text/event-stream"):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.chunked = chunked

    def raw(self, data):
        if isinstance(data, str):
            data = data.encode()
        if self.chunked:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self.wfile.write(data)
        self.wfile.flush()

    def event(self, obj, eol="\n"):
        text = obj if isinstance(obj, str) else json.dumps(obj)
        self.raw("data: " + text + eol + eol)

    def end_stream(self):
        if self.chunked:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def chunk(self, content=None, finish=None, role=None):
        delta = {}
        if role:
            delta["role"] = role
        if content is not None:
            delta["content"] = content
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                "created": 1, "model": "toy-model",
                "choices": [{"index": 0, "delta": delta,
                             "finish_reason": finish}]}

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"null")
        with self.state.lock:
            self.state.requests.append((self.path, dict(self.headers), body))
        if not self.authorized():
            return
        if self.path != "/v1/chat/completions":
            return self.error(404, "no route", "invalid_request_error")
        messages = body.get("messages", [])
        last = messages[-1]["content"] if messages else ""
        script = last.split(" ")[0]
        text = reply_text(messages)
        usage = {"prompt_tokens": 11, "completion_tokens": 7,
                 "total_tokens": 18}
        if script == "mute":
            time.sleep(8)  # no answer at all (a stuck server)
            return self.error(503, "too late", "server_error")
        if script == "bad400":
            return self.error(400, "messages[0].role: unknown role 'robot'",
                              "invalid_request_error", None, "messages")
        if script == "hugeError":
            # A non-JSON error body far over the client's 64 KiB cap.
            data = b"z" * (2 << 20)
            self.send_response(500)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if not body.get("stream"):
            if script == "plainText":
                data = b"not json"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                return self.wfile.write(data)
            return self.send_json(200, {
                "id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                "model": body.get("model"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant",
                                         "content": text}}],
                "usage": usage})
        if script == "notSse":
            return self.send_json(200, {"choices": []})
        if script == "eofNoDone":
            self.start_stream(chunked=False)
            self.event(self.chunk("partial"))
            return
        self.start_stream()
        self.event(self.chunk("", role="assistant"))
        if script == "crlf":
            # CRLF line ends, comments, an id, and one chunk split over
            # three data lines (joined with '\n': JSON whitespace).
            self.raw(": keep-alive\r\n\r\n")
            self.raw("id: 7\r\nevent: message\r\n")
            self.raw('data: {"choices":\r\ndata: [{"index":0,"delta":'
                     '{"content":"multi"}\r\ndata: }]}\r\n\r\n')
            self.raw("data: " + json.dumps(self.chunk("-line")) + "\r")
            self.raw("\n\r\n")
            self.event(self.chunk(None, finish="stop"), eol="\r\n")
            self.event("[DONE]", eol="\r\n")
            return self.end_stream()
        if script == "slow":
            self.event(self.chunk("thinking"))
            deadline = time.time() + 20
            try:
                while time.time() < deadline:
                    time.sleep(0.05)
                    self.raw(": tick\n\n")
            except (BrokenPipeError, ConnectionResetError):
                with self.state.lock:
                    self.state.disconnected_at = time.time()
            return
        if script == "typedError":
            self.raw("event: error\ndata: {\"error\": {\"message\": "
                     "\"context length exceeded\", \"type\": "
                     "\"invalid_request_error\"}}\n\n")
            return self.end_stream()
        if script == "silent":
            # A long prefill: nothing at all on the wire for a while.
            self.event(self.chunk("wait"))
            time.sleep(8)
            return
        if script == "big":
            piece = "x" * 4096
            for _ in range(80):  # 320 KiB, over the 256 KiB reply cap
                self.event(self.chunk(piece))
            self.event("[DONE]")
            return self.end_stream()
        for i in range(0, len(text), 3):
            self.event(self.chunk(text[i:i + 3]))
            if script == "midError" and i >= 6:
                self.event({"error": {"message": "generation failed: worker "
                                      "lost", "type": "server_error",
                                      "param": None, "code": "worker_lost"}})
                return self.end_stream()
            if script == "closeMid" and i >= 6:
                # Abrupt close: the chunked body never gets its last chunk.
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if script == "oversized" and i >= 6:
                self.event(self.chunk("y" * (100 << 10)))
            if script == "malformed" and i >= 6:
                self.event('{"choices": [')
        self.event(self.chunk(None, finish="length" if script == "cut"
                              else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            u = self.chunk(None)
            u["choices"] = []
            u["usage"] = usage
            self.event(u)
        self.event("[DONE]")
        self.end_stream()


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # Clients that hang up are part of the script; anything else fails.
        if not isinstance(sys.exc_info()[1], (ConnectionError, OSError)):
            check(False, "server error: %r" % (sys.exc_info()[1],))


class Server:
    def __init__(self):
        self.state = State()
        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.state = self.state
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def posts(self):
        return [r for r in self.state.requests if r[0].endswith("/completions")]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def run(args, stdin_text=None, env=None, timeout=20):
    full_env = dict(os.environ)
    full_env.pop("PCP_API_TOKEN", None)
    full_env.update(env or {})
    p = subprocess.run([PCP, "chat"] + args, input=stdin_text,
                       capture_output=True, text=True, timeout=timeout,
                       env=full_env)
    return p.returncode, p.stdout, p.stderr


def read_until(proc, needle, timeout=10):
    """Reads proc.stdout (raw fd) until |needle| appears; returns the text."""
    seen = b""
    deadline = time.time() + timeout
    fd = proc.stdout.fileno()
    while needle.encode() not in seen and time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            data = os.read(fd, 65536)
            if not data:
                break
            seen += data
    return seen.decode(errors="replace")


# System call numbers (first field of /proc/PID/syscall) of a process
# blocked reading a file descriptor, and of one blocked waiting on several
# (poll, select, epoll; the HTTP client's wait).
SYSCALLS = {
    "x86_64": {"read": {0}, "wait": {7, 23, 232, 270, 271, 281, 441}},
    "aarch64": {"read": {63}, "wait": {22, 72, 73, 441}},
}


def wait_blocked(proc, kind, timeout=10):
    """Waits until |proc| is asleep in a system call of |kind|: "stdin" (a
    read of fd 0: back at the prompt) or "wait" (poll and friends: waiting
    for the server). Observed in /proc/PID/syscall, not guessed by a sleep.
    True when seen within |timeout| s."""
    table = SYSCALLS.get(os.uname().machine)
    if table is None:
        check(False, "no system call table for %s in chat_test.py" %
              os.uname().machine)
        return False
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open("/proc/%d/syscall" % proc.pid) as f:
                fields = f.read().split()
            with open("/proc/%d/stat" % proc.pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError as e:
            check(False, "reading /proc/%d: %s" % (proc.pid, e))
            return False
        if state == "S" and fields and fields[0].isdigit():
            nr = int(fields[0])
            if kind == "stdin" and nr in table["read"] and \
                    int(fields[1], 16) == 0:
                return True
            if kind == "wait" and nr in table["wait"]:
                return True
        time.sleep(0.01)
    check(False, "pcp chat (pid %d) never blocked in %s within %d s" %
          (proc.pid, kind, timeout))
    return False


def test_flags(srv):
    code, out, err = run(["--help"])
    check(code == 0 and "--api-token-env" in out and "--session" in out
          and "Exit codes" in out, "--help lists the flags: %r" % out[:200])
    code, out, err = run(["-h"])
    check(code == 0 and "usage: pcp chat" in out, "-h is --help")
    for args, what in ((["--bogus"], "unknown flag"),
                       (["--temperature", "3", "hi"], "temperature > 2"),
                       (["--temperature", "-0.5", "hi"], "temperature < 0"),
                       (["--top-p", "0", "hi"], "top-p 0"),
                       (["--max-tokens", "x", "hi"], "max-tokens not int"),
                       (["--url", "ftp://x", "hi"], "url scheme"),
                       (["--url", srv.url, " "], "empty prompt"),
                       (["--api-token-env", "PCP_CHAT_TEST_UNSET", "--url",
                         srv.url, "hi"], "unset key variable")):
        code, out, err = run(args)
        check(code == 2 and "pcp chat:" in err,
              "%s is a usage error (2): %d %r" % (what, code, err))
    check(not srv.posts(), "usage errors send nothing")


def test_one_shot(srv):
    code, out, err = run(["--url", srv.url, "hello", "there"])
    check(code == 0, "one-shot exits 0: %d %r" % (code, err))
    check(out == "echo[1]: hello there\n", "streamed reply + newline: %r" % out)
    path, headers, body = srv.posts()[-1]
    check(body == {"model": "toy-model", "stream": True,
                   "messages": [{"role": "user", "content": "hello there"}]},
          "minimal request (model from /v1/models): %r" % body)
    check(headers.get("Accept") == "text/event-stream", "Accept header")
    check("Authorization" not in headers, "no token, no Authorization")
    # Every flag lands in the request.
    code, out, err = run(["--url", srv.url + "/v1/", "--model", "m2",
                          "--system", "be brief", "--max-tokens", "7",
                          "--temperature", "0", "--top-p", "0.9", "--seed",
                          "42", "--session", "sess-1", "--usage", "hi"])
    check(code == 0 and out == "echo[2]: hi\n", "flags run: %d %r %r" %
          (code, out, err))
    body = srv.posts()[-1][2]
    check(body == {"model": "m2", "stream": True,
                   "stream_options": {"include_usage": True},
                   "messages": [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi"}],
                   "max_tokens": 7, "temperature": 0.0, "top_p": 0.9,
                   "seed": 42, "user": "sess-1"},
          "every flag in the request: %r" % body)
    check("[usage] prompt_tokens=11 completion_tokens=7 total_tokens=18"
          in err, "usage line on stderr: %r" % err)
    # --no-stream.
    code, out, err = run(["--url", srv.url, "--no-stream", "--usage", "hi"])
    body = srv.posts()[-1][2]
    check(code == 0 and out == "echo[1]: hi\n" and body["stream"] is False
          and "stream_options" not in body, "--no-stream: %d %r %r" %
          (code, out, body))
    check("[usage] prompt_tokens=11" in err, "--no-stream usage: %r" % err)
    # finish_reason "length" is noted.
    code, out, err = run(["--url", srv.url, "cut"])
    check(code == 0 and "token limit" in err, "finish_reason length: %r" % err)
    # CRLF, comments, multi-line data.
    code, out, err = run(["--url", srv.url, "crlf"])
    check(code == 0 and out == "multi-line\n", "crlf events: %d %r %r" %
          (code, out, err))


def test_errors(srv):
    cases = [
        (["midError"], "generation failed: worker lost", "error event"),
        (["bad400"], "HTTP 400: messages[0].role: unknown role 'robot'",
         "HTTP 400 body"),
        (["--no-stream", "bad400"], "HTTP 400: messages[0].role",
         "HTTP 400 body, no stream"),
        (["closeMid"], "the stream broke mid-reply", "close mid-stream"),
        (["eofNoDone"], "before 'data: [DONE]'", "clean close before DONE"),
        (["oversized"], "event-stream line over 65536 bytes", "long line"),
        (["malformed"], "malformed stream event", "malformed event"),
        (["notSse"], "expected a text/event-stream answer", "not SSE"),
        (["big"], "the reply passed 256 KiB", "reply cap"),
        (["typedError"], "server error mid-stream: context length exceeded "
         "(invalid_request_error)", "event: error"),
        (["--no-stream", "plainText"], "the answer is not JSON",
         "plain answer not JSON"),
    ]
    for args, needle, what in cases:
        code, out, err = run(["--url", srv.url] + args)
        check(code == 1 and needle in err and err.startswith("pcp chat: "),
              "%s: exit 1 with the message: %d %r" % (what, code, err))
        check("Traceback" not in err and "Segmentation" not in err, what)
    code, out, err = run(["--url", srv.url, "hugeError"])
    check(code == 1 and "HTTP 500: zzzz" in err and len(err) < 1024,
          "huge error body shown cut: %d %d" % (code, len(err)))
    code, out, err = run(["--url", srv.url, "midError"])
    check(out == "echo[1]: \n",
          "partial reply kept, line ended: %r" % out)
    # --timeout-s: a server that never answers, and one that goes quiet.
    for script, needle in (("mute", "no answer within --timeout-s"),
                           ("silent", "the stream broke mid-reply")):
        start = time.time()
        code, out, err = run(["--url", srv.url, "--timeout-s", "1", script])
        check(code == 1 and needle in err and time.time() - start < 5,
              "%s with --timeout-s 1: %d %r after %.1f s" %
              (script, code, err, time.time() - start))
    # Connection refused.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % s.getsockname()[1]
    code, out, err = run(["--url", dead, "hi"])
    check(code == 1 and "cannot reach the server" in err,
          "connection refused: %d %r" % (code, err))
    code, out, err = run(["--url", dead, "--model", "m", "hi"])
    check(code == 1 and "cannot reach the server" in err,
          "connection refused on the POST: %d %r" % (code, err))
    # No model listed.
    srv.state.models = []
    code, out, err = run(["--url", srv.url, "hi"])
    check(code == 1 and "lists no model" in err, "empty model list: %r" % err)
    srv.state.models = [{"id": "toy-model", "object": "model"}]


def test_auth(srv):
    srv.state.token = "sk-test"
    code, out, err = run(["--url", srv.url, "hi"])
    check(code == 1 and "HTTP 401: Incorrect API key provided" in err,
          "401 without a token: %d %r" % (code, err))
    code, out, err = run(["--url", srv.url, "--model", "m", "hi"],
                         env={"PCP_API_TOKEN": "wrong"})
    check(code == 1 and "HTTP 401" in err and "--api-token-env" in err,
          "401 with a wrong token: %r" % err)
    code, out, err = run(["--url", srv.url, "--api-token-env", "MY_KEY", "hi"],
                         env={"MY_KEY": "sk-test"})
    check(code == 0 and out == "echo[1]: hi\n", "token from --api-token-env")
    check(srv.posts()[-1][1].get("Authorization") == "Bearer sk-test",
          "bearer header sent")
    code, out, err = run(["--url", srv.url, "hi"],
                         env={"PCP_API_TOKEN": "sk-test"})
    check(code == 0, "token from PCP_API_TOKEN by default")
    srv.state.token = None


def test_interactive(srv):
    before = len(srv.posts())
    code, out, err = run(["--url", srv.url, "--system", "sys"],
                         stdin_text="first\n\n  second  \n/exit\nnever\n")
    check(code == 0, "interactive exits 0: %d %r" % (code, err))
    check(out == "echo[2]: first\necho[4]: second\n",
          "multi-turn replies: %r" % out)
    posts = srv.posts()[before:]
    check(len(posts) == 2, "two requests, /exit stops: %d" % len(posts))
    if len(posts) == 2:
        check(posts[1][2]["messages"] == [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "echo[2]: first"},
            {"role": "user", "content": "second"}],
            "history sent: %r" % posts[1][2]["messages"])
    # A failed turn leaves the history as it was; EOF ends; exit code 1.
    before = len(srv.posts())
    code, out, err = run(["--url", srv.url],
                         stdin_text="first\nbad400\nthird")
    posts = srv.posts()[before:]
    check(code == 1 and "HTTP 400" in err, "failed turn reported: %r" % err)
    check(out == "echo[1]: first\necho[3]: third\n",
          "conversation goes on after an error: %r" % out)
    check(len(posts) == 3 and [m["content"] for m in posts[2][2]["messages"]]
          == ["first", "echo[1]: first", "third"],
          "failed turn not in the history")
    # /reset forgets the conversation.
    code, out, err = run(["--url", srv.url], stdin_text="a\n/reset\nb\n")
    check(code == 0 and out == "echo[1]: a\necho[1]: b\n", "/reset: %r" % out)
    # Past 768 KiB of history the oldest turns go, in pairs, and the
    # session goes on: 60 KiB lines echoed back add ~120 KiB a turn.
    before = len(srv.posts())
    lines = ["%d %s" % (i, "h" * (60 << 10)) for i in range(9)]
    code, out, err = run(["--url", srv.url, "--system", "sys"],
                         stdin_text="\n".join(lines) + "\n")
    posts = srv.posts()[before:]
    check(code == 0 and len(posts) == 9 and "[history] dropped" in err,
          "history trimmed: %d %d %r" % (code, len(posts), err[:200]))
    if posts:
        last = posts[-1][2]["messages"]
        size = len(json.dumps(last, separators=(",", ":")))
        check(last[0] == {"role": "system", "content": "sys"} and
              last[1]["role"] == "user" and last[-1]["content"] == lines[-1]
              and size <= 768 << 10 and len(last) < 19,
              "trimmed history: system kept, starts with a user turn, "
              "%d bytes, %d messages" % (size, len(last)))
    # A stdin line over 64 KiB is refused; the session goes on.
    code, out, err = run(["--url", srv.url],
                         stdin_text="x" * (70 << 10) + "\nafter\n")
    check(code == 1 and "line over 64 KiB ignored" in err
          and out == "echo[1]: after\n", "long stdin line: %d %r %r" %
          (code, out[:80], err))


def spawn(args, **kwargs):
    env = dict(os.environ)
    env.pop("PCP_API_TOKEN", None)
    return subprocess.Popen([PCP, "chat"] + args, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, **kwargs)


def finish(proc):
    """The exit code, or None (and the process killed) after 5 s."""
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def interrupt(proc):
    """Sends SIGINT; returns (finish(proc), when the signal was sent)."""
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    return finish(proc), sent


def test_interrupt(srv):
    # One-shot: Ctrl-C mid-reply closes the stream (the server's write
    # fails) and exits 130.
    srv.state.disconnected_at = None
    proc = spawn(["--url", srv.url, "slow"], stdin=subprocess.DEVNULL)
    seen = read_until(proc, "thinking")
    check("thinking" in seen, "slow reply started: %r" % seen)
    code, sent = interrupt(proc)
    err = proc.stderr.read().decode()
    check(code == 130 and "[interrupted]" in err,
          "Ctrl-C one-shot exits 130: %r %r" % (code, err))
    deadline = time.time() + 5
    while srv.state.disconnected_at is None and time.time() < deadline:
        time.sleep(0.05)
    check(srv.state.disconnected_at is not None and
          srv.state.disconnected_at - sent < 3,
          "the server saw the disconnect")
    proc.stdout.close()
    proc.stderr.close()
    # A silent server (a long prefill): the signal itself wakes the wait.
    proc = spawn(["--url", srv.url, "silent"], stdin=subprocess.DEVNULL)
    seen = read_until(proc, "wait")
    check("wait" in seen, "silent reply started: %r" % seen)
    wait_blocked(proc, "wait")
    code, sent = interrupt(proc)
    check(code == 130 and time.time() - sent < 1.0,
          "Ctrl-C with a silent server: %r after %.3f s" %
          (code, time.time() - sent))
    proc.stdout.close()
    proc.stderr.close()
    # Interactive: Ctrl-C ends the reply, the session goes on, and the
    # partial reply stays in the history.
    srv.state.disconnected_at = None
    before = len(srv.posts())
    proc = spawn(["--url", srv.url], stdin=subprocess.PIPE)
    proc.stdin.write(b"slow\n")
    proc.stdin.flush()
    seen = read_until(proc, "thinking")
    proc.send_signal(signal.SIGINT)
    # The next line goes in once the reply was abandoned and the prompt
    # reads stdin again.
    wait_blocked(proc, "stdin")
    proc.stdin.write(b"after\n/exit\n")
    proc.stdin.flush()
    seen += read_until(proc, "after\n")
    code = finish(proc)
    err = proc.stderr.read().decode()
    posts = srv.posts()[before:]
    check(code == 0 and "[interrupted]" in err,
          "interactive Ctrl-C returns to the prompt: %r %r" % (code, err))
    check(seen == "thinking\necho[3]: after\n", "interactive output: %r" % seen)
    check(len(posts) == 2 and [m["content"] for m in posts[1][2]["messages"]]
          == ["slow", "thinking", "after"],
          "partial reply kept in the history")
    # The server notices on its next write (a tick every 50 ms).
    deadline = time.time() + 5
    while srv.state.disconnected_at is None and time.time() < deadline:
        time.sleep(0.05)
    check(srv.state.disconnected_at is not None, "interactive disconnect")
    for f in (proc.stdin, proc.stdout, proc.stderr):
        f.close()
    # Ctrl-C at the prompt ends the session (130).
    proc = spawn(["--url", srv.url], stdin=subprocess.PIPE)
    wait_blocked(proc, "stdin")  # at the prompt, its handler installed
    code, _ = interrupt(proc)
    check(code == 130, "Ctrl-C at the prompt exits 130: %r" % code)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        f.close()


def main():
    srv = Server()
    try:
        for test in (test_flags, test_one_shot, test_errors, test_auth,
                     test_interactive, test_interrupt):
            start = time.time()
            test(srv)
            print("%s: %.1f s" % (test.__name__, time.time() - start))
    finally:
        srv.close()
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES), file=sys.stderr)
        return 1
    print("chat_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
