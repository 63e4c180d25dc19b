#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Query-then-infer and the inference service proxy (issue 15 items 2 and 5)
with real processes on 127.0.0.1: gateway B serves a toy Qwen3 (random
weights, a locally trained BPE tokenizer; tests/integration/
inference_models.py) on one CPU worker; gateway A serves no model and has B
registered as its inference service.

  1. POST B/v1/inference/query/chat/completions: the graph context is a
     system message in front of the user's; the answer equals the JAX greedy
     reference for exactly that prompt; context and usage in the answer;
  2. a graph too large for the 128-token window is truncated (with a note
     and graph_context_truncated), the prompt fits the window;
  3. the same streamed: a first `graph_context` event, then the chunks
     (text equal to the reference), usage, [DONE];
  4. POST A/v1/inference/chat/completions streams B's answer through event
     by event (the same chunks, in order, as B's own stream), and not
     streamed; B's errors are relayed; query-then-infer on A goes to B;
  5. graph_query.query_mode through a real federation hub both gateways
     report to: B's query-then-infer with `global` has in its context A's
     replicated (global) entity and not A's local one, `local_plus_global`
     B's own item first, `local` B's only; an unknown mode is 400 naming
     the key; the hub SIGKILLed -> 502 JSON FederationHubQueryFailed (no
     completion), `local` still answers;
  6. B gone: 502 JSON; bad input: 400 JSON naming the key.
Every wait is bounded.
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
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inference_models as im  # noqa: E402
import federation_cluster as fc  # noqa: E402

PCP = sys.argv[1] if len(sys.argv) > 1 else os.environ["PCP_BINARY"]
TOKEN = "qti-token"
JOIN = "qti-join"
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, file=sys.stderr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, path, body, method="POST"):
    req = urllib.request.Request(
        base + path, data=json.dumps(body).encode() if body is not None
        else None, method=method,
        headers={"Content-Type": "application/json",
                 "Authorization": "Bearer " + TOKEN})
    try:
        with urllib.request.urlopen(req, timeout=180) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw.decode(errors="replace")


def sse(base, path, body):
    """(status, content type, [(event type, data)]) read event by event."""
    port = int(base.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
    conn.request("POST", path, json.dumps(body),
                 {"Content-Type": "application/json",
                  "Authorization": "Bearer " + TOKEN})
    resp = conn.getresponse()
    events, kind, data = [], None, []
    while True:
        line = resp.readline()  # chunked decoding; '' at the end
        if not line:
            break
        line = line.decode().rstrip("\r\n")
        if line == "":
            if data:
                events.append((kind, "\n".join(data)))
            kind, data = None, []
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
    conn.close()
    return resp.status, resp.getheader("Content-Type") or "", events


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


def wait_healthy(base, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=5):
                return True
        except Exception:
            time.sleep(0.2)
    return False


def gateway(work, name, extra_args, env, hub=None):
    api, fabric = free_port(), free_port()
    config = os.path.join(work, name + ".json")
    doc = {"gateway_id": "gw-" + name, "lab_id": "lab-" + name,
           "state_dir": os.path.join(work, name + "-state"),
           "api": {"token_env": "QTI_API"},
           "worker_fabric": {"host": "127.0.0.1", "port": fabric,
                             "join_token_env": "QTI_JOIN",
                             "heartbeat_ms": 200}}
    if hub:
        doc["federation"] = {"enabled": True, "upstream": hub.base,
                             "token_env": "QTI_FED",
                             "heartbeat_interval_ms": hub.heartbeat_ms}
    with open(config, "w") as f:
        json.dump(doc, f)
    proc = subprocess.Popen(
        [PCP, "--gateway", "--gateway-config", config, "--api-port",
         str(api)] + extra_args, env=env,
        stderr=open(os.path.join(work, name + ".err"), "w"))
    return proc, "http://127.0.0.1:%d" % api, fabric


def content_chunks(events):
    """The delta texts of chat chunks, the usage and whether [DONE] came."""
    parts, usage, done = [], None, False
    for kind, data in events:
        if data == "[DONE]":
            done = True
            continue
        if kind is not None:
            continue
        chunk = json.loads(data)
        if chunk.get("choices"):
            parts.append(chunk["choices"][0]["delta"].get("content") or "")
        if chunk.get("usage"):
            usage = chunk["usage"]
    return parts, usage, done


def main():
    work = tempfile.mkdtemp(prefix="pcp-qti-")
    tables = os.path.join(work, "tables")
    os.makedirs(tables)
    qwen = im.Model(PCP, tables, im.QWEN, 12)
    model = qwen.name
    window = im.QWEN["max_length"]
    env = dict(os.environ, QTI_API=TOKEN, QTI_JOIN=JOIN,
               PCP_WORKER_JOIN_TOKEN=JOIN, QTI_FED=fc.FED_TOKEN)
    # The federation hub both gateways report to (graph replication).
    hub = fc.Hub(fc.Cluster(PCP, work), 300)
    hub.start()
    b, b_base, b_fabric = gateway(work, "b", ["--model-dir", qwen.dir], env,
                                  hub)
    procs = [b]
    procs.append(subprocess.Popen(
        [PCP, "--worker", "--connect", "127.0.0.1:%d" % b_fabric,
         "--cache-dir", os.path.join(work, "cache")], env=env,
        stderr=open(os.path.join(work, "worker.err"), "w")))
    a, a_base, _ = gateway(work, "a", [], env, hub)
    procs.append(a)
    try:
        check(wait_ready(b_base, 500), "gateway B serves the model")
        check(wait_healthy(a_base, 60), "gateway A is up")
        if FAILURES:
            return 1
        user = [{"role": "user", "content": "hello world how are you"}]

        # 1. Query-then-infer on B's own model, small graph.
        code, out = call(b_base, "/v1/graph/mutate", {"mutations": [
            {"mutation_type": "upsert_entity", "target_id": "fox",
             "payload": {"entity_type": "animal", "display_name": "fox",
                         "properties": {"color": "brown"}}}]})
        check(code == 200, "mutate on B: %d %r" % (code, out))
        body = {"graph_query": {"entity_id": "fox"},
                "inference": {"model": model, "messages": user,
                              "max_tokens": 6, "temperature": 0}}
        code, out = call(b_base, "/v1/inference/query/chat/completions", body)
        prompt = out.get("graph_context_prompt", "") if code == 200 else ""
        msgs = [{"role": "system", "content": prompt}] + user
        ids = qwen.encode_chat(msgs)
        want_ids, want_finish = qwen.greedy(ids, 6)
        want = qwen.decode(want_ids)
        check(code == 200 and prompt.startswith("Graph context:\n") and
              'entity fox (animal) "fox" {"color":"brown"}' in prompt and
              out["graph_context_truncated"] is False and
              [e["entity_id"] for e in out["graph_query"]["entities"]] ==
              ["fox"] and out["graph_context"]["target"] == "local" and
              out["graph_context"]["prompt_tokens"] == len(ids) and
              out["graph_context"]["context_window"] == window,
              "query-then-infer context: %d %r" % (code, out))
        completion = out.get("completion", {}) if code == 200 else {}
        got = completion.get("choices", [{}])[0].get("message", {}) \
            .get("content") if completion else None
        check(got == want and out["usage"]["prompt_tokens"] == len(ids),
              "query-then-infer answer %r == reference %r; usage %r" %
              (got, want, out.get("usage") if code == 200 else None))

        # 2. A graph larger than the window: truncated with a note.
        many = [{"mutation_type": "upsert_entity", "target_id": "e%02d" % i,
                 "payload": {"entity_type": "thing",
                             "display_name": "the lazy dog number %d" % i}}
                for i in range(30)]
        code, out = call(b_base, "/v1/graph/mutate", {"mutations": many})
        body = {"graph_query": {"entity_type": "thing", "limit": 100},
                "inference": {"model": model, "messages": user,
                              "max_tokens": 8, "temperature": 0}}
        code, out = call(b_base, "/v1/inference/query/chat/completions", body)
        ok = code == 200
        prompt = out.get("graph_context_prompt", "") if ok else ""
        ids = qwen.encode_chat([{"role": "system", "content": prompt}] + user)
        stats = out.get("graph_context", {}) if ok else {}
        check(ok and out["graph_context_truncated"] is True and
              stats.get("items_total") == 30 and
              0 <= stats.get("items_included", -1) < 30 and
              ("[truncated: %d of 30 graph items]" %
               stats.get("items_included", -1)) in prompt and
              len(ids) + 8 <= window and stats["prompt_tokens"] == len(ids),
              "truncated to the window: %d %r (%d tokens)" %
              (code, stats, len(ids)))
        if ok:
            want_ids, _ = qwen.greedy(ids, 8)
            got = out["completion"]["choices"][0]["message"]["content"]
            check(got == qwen.decode(want_ids),
                  "truncated answer equals the reference: %r" % got)

        # 3. Streamed query-then-infer.
        body = {"graph_query": {"entity_id": "fox"},
                "inference": {"model": model, "messages": user,
                              "max_tokens": 6, "temperature": 0,
                              "stream": True}}
        code, ctype, events = sse(b_base,
                                  "/v1/inference/query/chat/completions", body)
        first = json.loads(events[0][1]) if events else {}
        parts, usage, done = content_chunks(events[1:])
        prompt = first.get("graph_context_prompt", "")
        ids = qwen.encode_chat([{"role": "system", "content": prompt}] + user)
        want = qwen.decode(qwen.greedy(ids, 6)[0])
        check(code == 200 and ctype.startswith("text/event-stream") and
              events and events[0][0] == "graph_context" and
              first.get("object") == "graph.context" and
              "entity fox" in prompt and "".join(parts) == want and
              usage is not None and usage["prompt_tokens"] == len(ids) and
              done, "streamed query-then-infer: %d %r %r %r" %
              (code, events[:2], "".join(parts), want))

        # 4. The proxy: B registered on A as its inference service.
        code, out = call(a_base, "/v1/services/register", {
            "service_id": "b-infer", "service_type": "inference",
            "base_url": b_base + "/"})
        check(code == 200, "register B on A: %d %r" % (code, out))
        chat = {"model": model, "messages": user, "max_tokens": 10,
                "temperature": 0, "stream": True}
        code_b, _, direct = sse(b_base, "/v1/chat/completions", chat)
        code, ctype, proxied = sse(a_base, "/v1/inference/chat/completions",
                                   chat)
        want = qwen.decode(qwen.greedy(qwen.encode_chat(user), 10)[0])
        d_parts = content_chunks(direct)[0]
        p_parts, _, p_done = content_chunks(proxied)
        check(code == 200 and ctype.startswith("text/event-stream") and
              p_parts == d_parts and len(p_parts) >= 3 and
              "".join(p_parts) == want and p_done and
              len(proxied) == len(direct),
              "streamed through A event by event: %d %r vs B %r (want %r)" %
              (code, p_parts, d_parts, want))
        code, out = call(a_base, "/v1/inference/chat/completions",
                         dict(chat, stream=False))
        check(code == 200 and
              out["choices"][0]["message"]["content"] == want,
              "proxied without streaming: %d %r" % (code, out))
        code, out = call(a_base, "/v1/inference/chat/completions",
                         dict(chat, stream=False, max_tokens=100000))
        check(code == 400 and out["error"]["code"] ==
              "context_length_exceeded", "B's 400 relayed: %d %r" %
              (code, out))
        # Query-then-infer on A: A does not serve the model; B answers.
        code, out = call(a_base, "/v1/inference/query/chat/completions",
                         {"inference": {"model": model, "messages": user,
                                        "max_tokens": 4, "temperature": 0}})
        prompt = out.get("graph_context_prompt", "") if code == 200 else ""
        ids = qwen.encode_chat([{"role": "system", "content": prompt}] + user)
        want = qwen.decode(qwen.greedy(ids, 4)[0])
        check(code == 200 and out["graph_context"]["target"] == "service" and
              out["completion"]["choices"][0]["message"]["content"] == want,
              "query-then-infer on A through B: %d %r" % (code, out))

        code, ctype, events = sse(
            a_base, "/v1/inference/query/chat/completions",
            {"inference": {"model": model, "messages": user, "max_tokens": 4,
                           "temperature": 0, "stream": True}})
        first = json.loads(events[0][1]) if events else {}
        parts, usage, done = content_chunks(events[1:])
        check(code == 200 and events[0][0] == "graph_context" and
              first["graph_context"]["target"] == "service" and
              "".join(parts) == want and usage is not None and done,
              "streamed query-then-infer on A through B: %d %r %r" %
              (code, events[:1], parts))

        # 5. query_mode through the hub: A replicates, B serves the model.
        ns = "lab-a/papers"
        code, out = call(a_base, "/v1/graph/policies/" + ns,
                         {"allow_global_replication": True,
                          "default_visibility": "global"}, method="PUT")
        check(code == 200, "policy on A: %d %r" % (code, out))

        def paper(eid, ns, visibility):
            return {"mutation_type": "upsert_entity", "namespace_id": ns,
                    "target_id": eid, "visibility": visibility,
                    "payload": {"entity_type": "paper",
                                "display_name": eid}}
        code, out = call(a_base, "/v1/graph/mutate", {"mutations": [
            paper("a-glob", ns, "global"), paper("a-loc", ns, "local")]})
        check(code == 200, "mutate on A: %d %r" % (code, out))
        code, out = call(b_base, "/v1/graph/mutate", {"mutations": [
            paper("b-paper", "lab-b/papers", "local")]})
        check(code == 200, "mutate on B: %d %r" % (code, out))
        check(fc.wait_until(lambda: [e["entity_id"] for e in hub.call(
            "POST", "/v1/global-graph/query", {"entity_type": "paper"})[1][
                "entities"]] == ["a-glob"], 30, 0.2),
            "A's global paper (only) reached the hub: %r" % (hub.call(
                "POST", "/v1/global-graph/query", {"entity_type": "paper"}),))

        def qti(mode, stream=False, max_tokens=4):
            body = {"graph_query": {"entity_type": "paper"},
                    "inference": {"model": model, "messages": user,
                                  "max_tokens": max_tokens,
                                  "temperature": 0}}
            if mode:
                body["graph_query"]["query_mode"] = mode
            if stream:
                body["inference"]["stream"] = True
                return sse(b_base, "/v1/inference/query/chat/completions",
                           body)
            return call(b_base, "/v1/inference/query/chat/completions", body)

        def entity_ids(out):
            return [e["entity_id"] for e in out["graph_query"]["entities"]]
        code, out = qti("global")
        ok = code == 200
        prompt = out.get("graph_context_prompt", "") if ok else ""
        ids = qwen.encode_chat([{"role": "system", "content": prompt}] + user)
        check(ok and 'entity a-glob (paper) "a-glob"' in prompt and
              "a-loc" not in prompt and "b-paper" not in prompt and
              entity_ids(out) == ["a-glob"] and
              out["graph_query"].get("query_mode") == "global" and
              out["graph_context"]["items_total"] == 1 and
              out["graph_context"]["items_included"] == 1 and
              out["graph_context"]["target"] == "local",
              "global query-then-infer on B: A's replicated item, not its "
              "local one: %d %r" % (code, out))
        if ok:
            want = qwen.decode(qwen.greedy(ids, 4)[0])
            got = out["completion"]["choices"][0]["message"]["content"]
            check(got == want and out["usage"]["prompt_tokens"] == len(ids),
                  "global answer %r == reference %r" % (got, want))
        code, out = qti("local_plus_global")
        prompt = out.get("graph_context_prompt", "") if code == 200 else ""
        check(code == 200 and entity_ids(out) == ["b-paper", "a-glob"] and
              "a-loc" not in prompt and
              0 <= prompt.find("entity b-paper") <
              prompt.find("entity a-glob"),
              "local_plus_global: B's item first, then A's global one: "
              "%d %r" % (code, out))
        code, out = qti("local")
        check(code == 200 and entity_ids(out) == ["b-paper"] and
              "a-glob" not in out["graph_context_prompt"],
              "local sees B's store only: %d %r" % (code, out))
        code, ctype, events = qti("global", stream=True)
        first = json.loads(events[0][1]) if events else {}
        parts, usage, done = content_chunks(events[1:])
        check(code == 200 and events[0][0] == "graph_context" and
              "entity a-glob" in first.get("graph_context_prompt", "") and
              "a-loc" not in first.get("graph_context_prompt", "x") and
              done, "streamed global query-then-infer: %d %r" %
              (code, events[:1]))
        code, out = qti("everywhere")
        check(code == 400 and out["error"]["param"] ==
              "graph_query.query_mode", "unknown query_mode -> 400 naming "
              "it: %d %r" % (code, out))
        hub.kill()
        for mode in ("global", "local_plus_global"):
            code, out = qti(mode)
            check(code == 502 and isinstance(out, dict) and
                  out["error"]["code"] == "FederationHubQueryFailed" and
                  out["error"]["param"] == "graph_query.query_mode" and
                  "completion" not in out,
                  "%s with the hub down -> 502 JSON: %d %r" %
                  (mode, code, out))
        code, ctype, events = qti("global", stream=True)
        check(code == 502 and not ctype.startswith("text/event-stream"),
              "streamed global with the hub down -> 502 before any event: "
              "%d %r" % (code, ctype))
        code, out = qti("local")
        check(code == 200 and entity_ids(out) == ["b-paper"],
              "local still answers with the hub down: %d %r" % (code, out))

        # 6. Bad input, then B gone.
        code, out = call(a_base, "/v1/inference/query/chat/completions",
                         {"inference": {"model": model}})
        check(code == 400 and out["error"]["param"] == "inference.messages",
              "missing messages -> 400: %d %r" % (code, out))
        code, out = call(a_base, "/v1/inference/query/chat/completions",
                         {"graph_query": {"limit": 0},
                          "inference": {"model": model, "messages": user}})
        check(code == 400 and out["error"]["param"] == "graph_query.limit",
              "bad limit -> 400: %d %r" % (code, out))
        b.send_signal(signal.SIGKILL)
        b.wait(20)
        code, out = call(a_base, "/v1/inference/chat/completions",
                         dict(chat, stream=False))
        check(code == 502 and isinstance(out, dict) and
              out["error"]["code"] == "service_proxy_failed",
              "B gone -> 502 JSON: %d %r" % (code, out))
    finally:
        hub.kill()
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    # Gateway A (proxy threads, streams) exits cleanly on SIGTERM.
    with open(os.path.join(work, "a.err")) as f:
        log = f.read()
    check(a.returncode == 0 and "Sanitizer" not in log,
          "gateway A exits cleanly: rc=%r %s" % (a.returncode, log[-1500:]))
    if FAILURES:
        print("%d check(s) failed; logs in %s" % (len(FAILURES), work),
              file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("query_infer_test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
