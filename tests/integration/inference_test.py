#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The OpenAI-compatible inference API end to end: a real `pcp --gateway`
serving two toy models (--model-dir) on a real `pcp --worker` (IREE on CPU),
driven by the official `openai` Python client and by raw HTTP.

  1. /readyz passes only after the one-token probe (gateway -> worker ->
     prefill + decode) has passed; /v1/models lists both models.
  2. chat and completions, streamed and not, equal the greedy reference
     (tests/models/jax_reference.py, independent JAX); usage counts; the
     streamed chunks (role first, finish_reason, usage chunk, [DONE]).
     `pcp chat --url ... --model M "prompt"` prints the greedy reply.
  3. 32 concurrent streams all complete, each equal to its own greedy
     reference (continuous batching over 4 slots per worker, two workers:
     the least loaded one takes each request, so both run some).
  4. a session (`user`) follow-up goes to the worker holding the session
     and reuses its KV prefix (cached_tokens > 0), still equal to the
     reference; a seeded sampled request repeats exactly.
  5. a client that disconnects mid-stream (or while waiting for an answer
     that is not streamed) stops its generation within a
     decode step (vllm:generation_tokens_total stops growing,
     vllm:num_requests_running back to 0).
  6. OpenAI error bodies: more requests without streaming at once than the
     cap 429 (the rest answered), unknown model 404, malformed messages 400,
     context length 400 context_length_exceeded, bad JSON 400, n=2 400.
  7. /metrics passes promtool and has the inference families.
  8. a model directory written under <state_dir>/models later is served
     without a restart.
  9. /readyz stays ready with one of the two workers killed and fails when
     the last one is killed.

usage: inference_test.py PCP
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
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inference_models as im  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
JOIN = "inference-join"
FAILURES = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    def __init__(self, work, model_dirs):
        self.work = work
        self.api = free_port()
        self.fabric = free_port()
        self.base = "http://127.0.0.1:%d" % self.api
        config = os.path.join(work, "gateway.json")
        with open(config, "w") as f:
            json.dump({"gateway_id": "gw-infer", "lab_id": "lab",
                       "state_dir": os.path.join(work, "state"),
                       "worker_fabric": {"host": "127.0.0.1",
                                         "port": self.fabric,
                                         "join_token_env": "INFER_JOIN",
                                         "heartbeat_ms": 200}}, f)
        # The cap on requests that are not streamed, lowered from 24 so the
        # test fills it whatever the machine's speed.
        env = dict(os.environ, INFER_JOIN=JOIN,
                   PCP_GATEWAY_TEST_INFER_MAX_BLOCKING="4")
        self.gw_err = open(os.path.join(work, "gateway.err"), "w")
        self.gateway = subprocess.Popen(
            [PCP, "--gateway", "--gateway-config", config, "--api-port",
             str(self.api), "--model-dir", ",".join(model_dirs)],
            env=env, stderr=self.gw_err)
        # Two workers on one host differ by --device-id (their ids).
        self.workers = [self.start_worker(d) for d in (0, 1)]

    def start_worker(self, device):
        # debug: the per-task "task done" lines tasks_done() counts.
        env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN,
                   PCP_LOG_LEVEL="debug")
        err = open(os.path.join(self.work, "worker%d.err" % device), "a")
        return subprocess.Popen(
            [PCP, "--worker", "--connect", "127.0.0.1:%d" % self.fabric,
             "--device-id", str(device),
             "--cache-dir", os.path.join(self.work, "cache%d" % device)],
            env=env, stderr=err)

    def tasks_done(self, device):
        with open(os.path.join(self.work, "worker%d.err" % device)) as f:
            return f.read().count("task done")

    def stop(self):
        procs = self.workers + [self.gateway]
        for p in procs:
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            if p:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()


def get(base, path, timeout=10):
    try:
        with urllib.request.urlopen(base + path, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def post(base, path, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def wait_ready(base, timeout_s):
    deadline = time.time() + timeout_s
    status, body = 0, ""
    while time.time() < deadline:
        try:
            status, body = get(base, "/readyz")
            if status == 200:
                return True, body
        except OSError:
            pass
        time.sleep(0.5)
    return False, body


def generation_after_disconnect(base, before):
    """After a client closed: waits (20 s at most) until nothing runs, then
    returns (tokens generated since |before|, whether the count still grew
    a second later, requests running)."""
    deadline = time.time() + 20
    while time.time() < deadline and \
            metric(base, "vllm:num_requests_running") > 0:
        time.sleep(0.05)
    after = metric(base, "vllm:generation_tokens_total")
    time.sleep(1.0)
    later = metric(base, "vllm:generation_tokens_total")
    return (after - before, later != after,
            metric(base, "vllm:num_requests_running"))


def metric(base, name, labels=""):
    _, text = get(base, "/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{" + labels) or line == name or \
                line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sse_events(base, body):
    """Raw SSE: the list of data payloads (strings) of a streamed call."""
    conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]),
                                      timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = []
    for line in resp.read().decode().splitlines():
        if line.startswith("data: "):
            out.append(line[6:])
    conn.close()
    return resp.status, resp.getheader("Content-Type"), out


def main():
    import openai
    work = tempfile.mkdtemp(prefix="pcp-infer-")
    models_root = os.path.join(work, "models")
    tables = os.path.join(work, "tables")
    os.makedirs(tables)
    gpt = im.Model(PCP, tables, im.GPT, 11)
    qwen = im.Model(PCP, tables, im.QWEN, 12)
    # The GPT's weights served in bf16 (converted at load).
    bf16_dir = os.path.join(tables, "gpt-bf16")
    os.makedirs(bf16_dir)
    shutil.copy(os.path.join(gpt.dir, "model.safetensors"), bf16_dir)
    with open(os.path.join(gpt.dir, "model.json")) as f:
        meta = json.load(f)
    meta.update(name="gpt-bf16", dtype="bf16")
    with open(os.path.join(bf16_dir, "model.json"), "w") as f:
        json.dump(meta, f)
    stack = Stack(work, [gpt.dir, qwen.dir, bf16_dir])
    ok = False
    try:
        # 1. Not ready before the probe; ready after it.
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if get(stack.base, "/healthz")[0] == 200:
                    break
            except OSError:
                time.sleep(0.05)
        status, body = get(stack.base, "/readyz")
        check(status == 503 and "inference probe" in body,
              "readyz 503 before the inference probe: %s" % body[:200])
        ready, body = wait_ready(stack.base, 600)
        check(ready, "readyz 200 once the probe passed: %s" % body[:300])
        if not ready:
            return
        client = openai.OpenAI(base_url=stack.base + "/v1", api_key="unused",
                               max_retries=0, timeout=120)
        ids = sorted(m.id for m in client.models.list().data)
        check(ids == ["gpt-bf16", "gpt-char", "qwen3-bpe"],
              "models listed: %s" % ids)
        r = client.completions.create(model="gpt-bf16", prompt="hello",
                                      max_tokens=8, temperature=0)
        want = gpt.decode(gpt.greedy(gpt.encode_prompt("hello"), 8)[0])
        check(r.usage.completion_tokens == 8 and len(r.choices[0].text) == 8,
              "bf16 model serves (%r; f32 reference %r)" %
              (r.choices[0].text, want))

        # 2. Chat and completions against the reference.
        msgs = [{"role": "system", "content": "you are a lazy dog"},
                {"role": "user", "content": "hello world how are you"}]
        want_ids, want_finish = qwen.greedy(qwen.encode_chat(msgs), 24)
        want = qwen.decode(want_ids)
        r = client.chat.completions.create(model="qwen3-bpe", messages=msgs,
                                           max_tokens=24, temperature=0)
        check(r.choices[0].message.content == want and
              r.choices[0].finish_reason == want_finish and
              r.object == "chat.completion" and
              r.usage.prompt_tokens == len(qwen.encode_chat(msgs)) and
              r.usage.completion_tokens == len(want_ids) +
              (want_finish == "stop"),
              "chat (qwen3, bpe): %r == reference %r, usage %s" %
              (r.choices[0].message.content, want, r.usage))
        stream = client.chat.completions.create(
            model="qwen3-bpe", messages=msgs, max_tokens=24, temperature=0,
            stream=True, stream_options={"include_usage": True})
        parts, finish, usage, first_role = [], None, None, None
        for chunk in stream:
            if chunk.choices:
                if first_role is None:
                    first_role = chunk.choices[0].delta.role
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        check("".join(parts) == want and finish == want_finish and
              first_role == "assistant" and usage is not None and
              usage.prompt_tokens == len(qwen.encode_chat(msgs)),
              "chat streamed: text, role first, finish %s, usage %s" %
              (finish, usage))
        status, ctype, events = sse_events(stack.base, {
            "model": "qwen3-bpe", "messages": msgs, "max_tokens": 5,
            "temperature": 0, "stream": True})
        chunks = [json.loads(e) for e in events[:-1]]
        check(status == 200 and ctype.startswith("text/event-stream") and
              events[-1] == "[DONE]" and
              all(c["object"] == "chat.completion.chunk" for c in chunks) and
              chunks[-1]["choices"][0]["finish_reason"] is not None and
              all(c["choices"][0]["finish_reason"] is None
                  for c in chunks[:-1]),
              "raw SSE: chunks, one final chunk with finish_reason, [DONE]")

        prompt = "the quick brown fox"
        want_ids, _ = gpt.greedy(gpt.encode_prompt(prompt), 20)
        want = gpt.decode(want_ids)
        r = client.completions.create(model="gpt-char", prompt=prompt,
                                      max_tokens=20, temperature=0)
        check(r.choices[0].text == want and r.object == "text_completion" and
              r.choices[0].finish_reason == "length" and
              r.usage.prompt_tokens == len(prompt),
              "completion (gpt, char): %r == reference %r" %
              (r.choices[0].text, want))
        text = "".join(c.choices[0].text for c in client.completions.create(
            model="gpt-char", prompt=prompt, max_tokens=20, temperature=0,
            stream=True))
        check(text == want, "completion streamed: %r" % text)
        cmsgs = [{"role": "user", "content": "hello"},
                 {"role": "user", "content": "how are you"}]
        want_ids, _ = gpt.greedy(gpt.encode_chat(cmsgs), 12)
        r = client.chat.completions.create(model="gpt-char", messages=cmsgs,
                                           max_tokens=12, temperature=0)
        check(r.choices[0].message.content == gpt.decode(want_ids),
              "chat on a char model ('plain': contents joined by newlines)")

        # 2b. The terminal client (`pcp chat`, one prompt) prints the greedy
        # reply (the char model: its replies hold no control characters).
        cmsg = [{"role": "user", "content": "how are you today"}]
        want = gpt.decode(gpt.greedy(gpt.encode_chat(cmsg), 16)[0])
        p = subprocess.run([PCP, "chat", "--url", stack.base, "--model",
                            "gpt-char", "--temperature", "0",
                            "--max-tokens", "16", "how are you today"],
                           capture_output=True, timeout=120)
        check(p.returncode == 0 and p.stdout.decode() == want + "\n",
              "pcp chat prints the greedy reply: %r vs %r (%s)" %
              (p.stdout[:120], want, p.stderr[-200:]))
        # The toy Qwen3's reply here holds a U+0000 ("\u0000" in the JSON
        # chunks), which the client must take as text like any other.
        want = qwen.decode(qwen.greedy(qwen.encode_chat(cmsg), 16)[0])
        p = subprocess.run([PCP, "chat", "--url", stack.base, "--model",
                            "qwen3-bpe", "--temperature", "0",
                            "--max-tokens", "16", "how are you today"],
                           capture_output=True, timeout=120)
        check(p.returncode == 0 and "\x00" in want and
              p.stdout.decode(errors="replace") == want + "\n",
              "pcp chat with a NUL in the reply: %r vs %r (%s)" %
              (p.stdout[:120], want, p.stderr[-200:]))

        # 3. 32 concurrent streams, each equal to its own reference (the
        # Qwen3 toy: its greedy texts differ from prompt to prompt).
        words = ("the quick brown fox jumps over a lazy dog while seven "
                 "wizards hum songs about rivers and cities").split()
        prompts = [" ".join(words[(i * 7 + k * 3) % len(words)]
                            for k in range(1 + i % 4)) for i in range(32)]
        refs = [qwen.decode(qwen.greedy(qwen.encode_prompt(p), 16)[0])
                for p in prompts]
        results = [None] * len(prompts)

        def one(i):
            try:
                c = openai.OpenAI(base_url=stack.base + "/v1",
                                  api_key="unused", max_retries=0,
                                  timeout=300)
                results[i] = "".join(
                    ch.choices[0].text for ch in c.completions.create(
                        model="qwen3-bpe", prompt=prompts[i], max_tokens=16,
                        temperature=0, stream=True))
            except Exception as e:  # noqa: BLE001 (reported below)
                results[i] = "error: %r" % e
        threads = [threading.Thread(target=one, args=(i,))
                   for i in range(len(prompts))]
        started = time.time()
        done_before = [stack.tasks_done(0), stack.tasks_done(1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        bad = [(prompts[i], results[i], refs[i]) for i in range(len(prompts))
               if results[i] != refs[i]]
        ran = [stack.tasks_done(d) - done_before[d] for d in (0, 1)]
        check(min(ran) > 0, "both workers ran the streams (tasks %s)" % ran)
        check(not bad and len(set(refs)) >= 8,
              "32 concurrent streams in %.1f s, each equal to its "
              "single-stream reference (%d distinct texts; %d wrong: %s)" %
              (time.time() - started, len(set(refs)), len(bad), bad[:3]))

        # 4. Session prefix reuse.
        turn = [{"role": "user", "content": "hello world"}]
        r1 = client.chat.completions.create(model="qwen3-bpe", messages=turn,
                                            max_tokens=6, temperature=0,
                                            user="session-a")
        turn2 = turn + [{"role": "assistant",
                         "content": r1.choices[0].message.content},
                        {"role": "user", "content": "and the dog"}]
        want_ids, _ = qwen.greedy(qwen.encode_chat(turn2), 8)
        r2 = client.chat.completions.create(model="qwen3-bpe", messages=turn2,
                                            max_tokens=8, temperature=0,
                                            user="session-a")
        cached = r2.usage.prompt_tokens_details.cached_tokens
        check(cached > 0 and r2.choices[0].message.content ==
              qwen.decode(want_ids),
              "session follow-up reuses %d cached prompt tokens and equals "
              "the reference" % cached)
        sampled = [client.completions.create(
            model="qwen3-bpe", prompt="the lazy dog", max_tokens=12,
            temperature=0.9, top_p=0.95, seed=1234).choices[0].text
            for _ in range(2)]
        check(sampled[0] == sampled[1], "seeded sampling repeats: %r" %
              sampled)

        # 5. Disconnect mid-stream.
        before = metric(stack.base, "vllm:generation_tokens_total")
        conn = http.client.HTTPConnection("127.0.0.1", stack.api, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({
            "model": "gpt-char", "prompt": "hello", "max_tokens": 90,
            "temperature": 0, "stream": True}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        seen = 0
        while seen < 3:
            line = resp.fp.readline()
            if line.startswith(b"data: "):
                seen += 1
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        tokens, grew, running = generation_after_disconnect(stack.base, before)
        check(not grew and running == 0 and tokens < 90,
              "disconnect: generation stopped after %d of 90 tokens "
              "(%d chunks read), running %d" % (tokens, seen, running))

        # 5a. A client that gives up on a request that is NOT streamed
        # (closes while the answer is being generated) stops it too: the
        # handler looks at the connection every 20 ms.
        before = metric(stack.base, "vllm:generation_tokens_total")
        conn = http.client.HTTPConnection("127.0.0.1", stack.api, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({
            "model": "gpt-char", "prompt": "hello", "max_tokens": 90,
            "temperature": 0}), {"Content-Type": "application/json"})
        deadline = time.time() + 20
        while time.time() < deadline and metric(
                stack.base, "vllm:generation_tokens_total") - before < 3:
            time.sleep(0.005)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        tokens, grew, running = generation_after_disconnect(stack.base, before)
        check(not grew and running == 0 and tokens < 90,
              "non-streamed disconnect: generation stopped after %d of 90 "
              "tokens, running %d" % (tokens, running))

        # 5b. Requests that are not streamed are capped (24; 4 here through
        # the test hook) since each holds a server thread: 40 at once get
        # some 429s with OpenAI's rate-limit body, the rest their answer.
        want = gpt.decode(gpt.greedy(gpt.encode_prompt("hello"), 80)[0])
        answers = [None] * 40
        barrier = threading.Barrier(40)

        def blocking(i):
            barrier.wait(60)
            answers[i] = post(stack.base, "/v1/completions", {
                "model": "gpt-char", "prompt": "hello", "max_tokens": 80,
                "temperature": 0})
        threads = [threading.Thread(target=blocking, args=(i,))
                   for i in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        limited = [a for a in answers if a and a[0] == 429]
        served = [a for a in answers if a and a[0] == 200]
        check(limited and len(limited) + len(served) == 40 and
              all(a[1]["error"]["type"] == "rate_limit_error" and
                  a[1]["error"]["code"] == "rate_limit_exceeded"
                  for a in limited) and
              all(a[1]["choices"][0]["text"] == want for a in served),
              "40 requests without streaming at once: %d answered, %d got "
              "429 rate_limit_exceeded" % (len(served), len(limited)))

        # 6. Error bodies.
        try:
            client.chat.completions.create(model="nope", messages=msgs)
            check(False, "unknown model raises")
        except openai.NotFoundError as e:
            check(e.status_code == 404 and e.body.get("code") ==
                  "model_not_found" and e.body.get("param") == "model",
                  "unknown model: 404 model_not_found %s" % e.body)
        for body, param in [
                ({"model": "qwen3-bpe", "messages": [{"content": "x"}]},
                 "messages[0].role"),
                ({"model": "qwen3-bpe", "messages": [{"role": "user"}]},
                 "messages[0].content"),
                ({"model": "qwen3-bpe", "messages": "hi"}, "messages"),
                ({"model": "qwen3-bpe", "messages": [{"role": "wizard",
                                                      "content": "x"}]},
                 "messages[0].role"),
                ({"model": "qwen3-bpe", "messages": msgs, "n": 2}, "n"),
                ({"model": "qwen3-bpe", "messages": msgs,
                  "temperature": 5}, "temperature"),
                ({"messages": msgs}, "model")]:
            status, got = post(stack.base, "/v1/chat/completions", body)
            e = got.get("error", {})
            check(status == 400 and e.get("type") == "invalid_request_error"
                  and e.get("param") == param and "message" in e and
                  "code" in e,
                  "400 for %s: %s" % (param, got))
        status, got = post(stack.base, "/v1/chat/completions", None,
                           raw=b"{not json")
        check(status == 400 and got["error"]["type"] ==
              "invalid_request_error", "malformed JSON: 400 %s" % got)
        status, got = post(stack.base, "/v1/completions", {
            "model": "gpt-char", "prompt": "a" * 200})
        check(status == 400 and got["error"]["code"] ==
              "context_length_exceeded",
              "context length: 400 context_length_exceeded %s" % got)
        status, got = post(stack.base, "/v1/completions", {
            "model": "gpt-char", "prompt": "hello", "max_tokens": 95})
        check(status == 400 and got["error"]["code"] ==
              "context_length_exceeded",
              "prompt + max_tokens over the context: 400")
        status, got = post(stack.base, "/v1/completions", {
            "model": "gpt-char", "prompt": "h\u00e9llo"})
        check(status == 400 and got["error"]["param"] == "prompt",
              "a character outside a char vocabulary: 400 %s" % got)

        # 7. Metrics.
        _, text = get(stack.base, "/metrics")
        for name in ("vllm:time_to_first_token_seconds_bucket",
                     "vllm:time_per_output_token_seconds_bucket",
                     "vllm:e2e_request_latency_seconds_count",
                     "vllm:request_queue_time_seconds_sum",
                     "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                     "vllm:num_requests_running", "vllm:num_requests_waiting"):
            check(name in text, "metric %s" % name)
        promtool = shutil.which("promtool")
        check(promtool is not None, "promtool is installed (install it: "
              "`make setup` does, Debian package prometheus)")
        if promtool:
            import promtool_lint  # vllm:* names: docs/decisions.md
            found = promtool_lint.problems(promtool, text)
            check(found is None, "promtool check metrics: %s" % found)

        # 8. A model directory that appears under <state_dir>/models (as a
        # training job writes it) is served without a restart; model.json
        # goes in last, by rename.
        fresh = os.path.join(work, "state", "models", "job-1")
        os.makedirs(fresh)
        shutil.copy(os.path.join(gpt.dir, "model.safetensors"), fresh)
        with open(os.path.join(gpt.dir, "model.json")) as f:
            meta = json.load(f)
        meta["name"] = "trained-job-1"
        with open(os.path.join(fresh, "model.json.tmp"), "w") as f:
            json.dump(meta, f)
        os.rename(os.path.join(fresh, "model.json.tmp"),
                  os.path.join(fresh, "model.json"))
        deadline = time.time() + 120
        served = None
        while time.time() < deadline and served is None:
            try:
                served = client.completions.create(
                    model="trained-job-1", prompt="hello", max_tokens=6,
                    temperature=0)
            except (openai.NotFoundError, openai.InternalServerError,
                    openai.APIStatusError):
                time.sleep(0.5)
        check(served is not None and served.choices[0].text ==
              gpt.decode(gpt.greedy(gpt.encode_prompt("hello"), 6)[0]),
              "a model dir written under state/models is served without a "
              "restart")

        # 9. Readiness: one worker left still serves; none left does not.
        stack.workers[0].kill()
        stack.workers[0].wait()
        # A probe in flight on the killed worker fails; the next one (on
        # the other worker) passes.
        deadline = time.time() + 20
        status = 0
        while time.time() < deadline and status != 200:
            time.sleep(0.5)
            status, body = get(stack.base, "/readyz")
        r = client.completions.create(model="gpt-char", prompt="hello",
                                      max_tokens=4, temperature=0)
        check(status == 200 and r.choices[0].text ==
              gpt.decode(gpt.greedy(gpt.encode_prompt("hello"), 4)[0]),
              "one worker killed: still ready and serving: %s" % body[:200])
        # The last worker dies in the middle of a stream: the stream gets
        # OpenAI's error event (the client raises it), not a silent end.
        conn = http.client.HTTPConnection("127.0.0.1", stack.api, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({
            "model": "gpt-char", "prompt": "hello", "max_tokens": 90,
            "temperature": 0, "stream": True}),
            {"Content-Type": "application/json"})
        resp = conn.getresponse()
        while not resp.fp.readline().startswith(b"data: "):
            pass
        stack.workers[1].kill()
        stack.workers[1].wait()
        # Raw lines (chunk sizes and data), until [DONE], an error or EOF.
        events = []
        while True:
            line = resp.fp.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                events.append(line[6:].decode().strip())
                if events[-1] == "[DONE]" or '"error"' in events[-1]:
                    break
        conn.close()
        last = json.loads(events[-1]) if events and events[-1] != "[DONE]" \
            else {}
        check("error" in last and last["error"]["type"] ==
              "service_unavailable_error" and len(events) < 90,
              "worker killed mid-stream: an error event after %d chunks: %s" %
              (len(events), events[-1:] if events else events))
        deadline = time.time() + 10
        status = 200
        while time.time() < deadline and status == 200:
            status, body = get(stack.base, "/readyz")
            time.sleep(0.2)
        check(status == 503, "readyz 503 after the last worker was killed: "
              "%s" % body[:200])
        status, got = post(stack.base, "/v1/completions", {
            "model": "gpt-char", "prompt": "hello", "max_tokens": 2})
        check(status == 503, "completion without a worker: 503 %s" % got)
        ok = True
    finally:
        stack.stop()
    # The gateway drains and exits 0 on SIGTERM, with no sanitizer report
    # (ASan builds run this test too).
    with open(os.path.join(work, "gateway.err")) as f:
        err = f.read()
    check(stack.gateway.returncode == 0 and "Sanitizer" not in err,
          "gateway exit %s after SIGTERM, no sanitizer report%s" %
          (stack.gateway.returncode,
           "" if "Sanitizer" not in err else ": " +
           err[max(0, err.index("Sanitizer") - 200):][:3000]))
    if ok and not FAILURES:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("logs kept in", work)
    if FAILURES or not ok:
        print("%d failure(s)" % len(FAILURES))
        sys.exit(1)


if __name__ == "__main__":
    main()
