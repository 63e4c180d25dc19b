#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`pcp chat` end to end (issue 6 item 5) against the real gateway and a real
CPU worker serving a random-weight toy Qwen3 with a locally trained BPE
tokenizer (tests/integration/inference_models.py, shared with the inference
service's own test). With `--temperature 0` every reply must equal the
independent JAX greedy reference token for token:

  1. one-shot, streamed, with --system, --max-tokens and --usage (the usage
     line's counts are the reference's);
  2. the same with --no-stream;
  3. an interactive session of two turns with --session: the second request
     carries the whole history, so its reply is the reference for
     [system, user, assistant, user];
  4. the service's errors reach the terminal: unknown model (404), a context
     overflow (400), no token (401).

CMake registers this test only where inference_models.py exists (it lands
with the inference service). Every wait is bounded.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inference_models as im  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
TOKEN = "chat-e2e-token"
JOIN = "chat-e2e-join"
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/readyz", timeout=5) as r:
                if r.status == 200:
                    return True
        except Exception:
            pass
        time.sleep(0.5)
    return False


def chat(base, args, stdin_text=None, token=TOKEN):
    env = dict(os.environ)
    env.pop("PCP_API_TOKEN", None)
    if token:
        env["CHAT_E2E_TOKEN"] = token
        args = ["--api-token-env", "CHAT_E2E_TOKEN"] + args
    p = subprocess.run([PCP, "chat", "--url", base] + args, input=stdin_text,
                       capture_output=True, text=True, timeout=180, env=env)
    return p.returncode, p.stdout, p.stderr


def main():
    work = tempfile.mkdtemp(prefix="pcp-chat-e2e-")
    tables = os.path.join(work, "tables")
    os.makedirs(tables)
    qwen = im.Model(PCP, tables, im.QWEN, 12)
    api, fabric = free_port(), free_port()
    base = "http://127.0.0.1:%d" % api
    config = os.path.join(work, "gateway.json")
    with open(config, "w") as f:
        json.dump({"gateway_id": "gw-chat", "lab_id": "lab",
                   "state_dir": os.path.join(work, "state"),
                   "api": {"token_env": "CHAT_E2E_API"},
                   "worker_fabric": {"host": "127.0.0.1", "port": fabric,
                                     "join_token_env": "CHAT_E2E_JOIN",
                                     "heartbeat_ms": 200}}, f)
    env = dict(os.environ, CHAT_E2E_API=TOKEN, CHAT_E2E_JOIN=JOIN,
               PCP_WORKER_JOIN_TOKEN=JOIN)
    procs = [
        subprocess.Popen([PCP, "--gateway", "--gateway-config", config,
                          "--api-port", str(api), "--model-dir", qwen.dir],
                         env=env,
                         stderr=open(os.path.join(work, "gateway.err"), "w")),
        subprocess.Popen([PCP, "--worker", "--connect",
                          "127.0.0.1:%d" % fabric, "--cache-dir",
                          os.path.join(work, "cache")], env=env,
                         stderr=open(os.path.join(work, "worker.err"), "w")),
    ]
    try:
        check(wait_ready(base, 400), "the gateway got ready")
        if FAILURES:
            return 1
        system = "you are a lazy dog"
        prompt = "hello world how are you"
        msgs = [{"role": "system", "content": system},
                {"role": "user", "content": prompt}]
        prompt_ids = qwen.encode_chat(msgs)
        want_ids, want_finish = qwen.greedy(prompt_ids, 24)
        want = qwen.decode(want_ids)
        common = ["--system", system, "--temperature", "0", "--max-tokens",
                  "24", "--usage"]
        # 1, 2: streamed and not, equal to the reference.
        for extra in ([], ["--no-stream"]):
            code, out, err = chat(base, common + extra + [prompt])
            completion = len(want_ids) + (want_finish == "stop")
            usage = ("[usage] prompt_tokens=%d completion_tokens=%d "
                     "total_tokens=%d" % (len(prompt_ids), completion,
                                          len(prompt_ids) + completion))
            check(code == 0 and out == want + "\n",
                  "%s reply equals the JAX reference: %d %r != %r (%r)" %
                  (extra or "streamed", code, out, want, err))
            check(usage in err, "usage line %r in %r" % (usage, err))
        # 3: two turns; the second reply continues the whole history.
        second = "fine thanks and you"
        code, out, err = chat(base, ["--system", system, "--temperature", "0",
                                     "--max-tokens", "12", "--session",
                                     "chat-e2e"],
                              stdin_text=prompt + "\n" + second + "\n/exit\n")
        first_ids, _ = qwen.greedy(prompt_ids, 12)
        first = qwen.decode(first_ids)
        history = msgs + [{"role": "assistant", "content": first},
                          {"role": "user", "content": second}]
        second_ids, _ = qwen.greedy(qwen.encode_chat(history), 12)
        want_session = first + "\n" + qwen.decode(second_ids) + "\n"
        check(code == 0 and out == want_session,
              "interactive session equals the reference: %d %r != %r (%r)" %
              (code, out, want_session, err))
        # 4: the service's errors, one line each, exit 1.
        code, out, err = chat(base, ["--model", "nope", "hi"])
        check(code == 1 and "HTTP 404" in err and "model_not_found" in err,
              "unknown model: %d %r" % (code, err))
        code, out, err = chat(base, ["--max-tokens", "100000", "hi"])
        check(code == 1 and "HTTP 400" in err and
              "context_length_exceeded" in err, "context overflow: %r" % err)
        code, out, err = chat(base, ["hi"], token=None)
        check(code == 1 and "HTTP 401" in err, "no token: %d %r" % (code, err))
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    if FAILURES:
        print("%d check(s) failed; logs in %s" % (len(FAILURES), work),
              file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)  # kept above when a check failed
    print("chat_gateway_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
