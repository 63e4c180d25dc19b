#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The RL rollout library (src/workloads/rl/rollout.c) with a real inference
service and a real worker: rollout_tool holds the gateway's side (fabric
endpoint, inference service, the library) in one process and a real
`pcp --worker` runs the toy Qwen3 of inference_models.py (BPE tokenizer)
on IREE's CPU backend.

  1. no worker yet: generate with no timeout fails at once (UNAVAILABLE);
     with a timeout it waits for the worker (and the compile) and succeeds.
  2. G = 4 samples x 3 prompts (at most 5 requests in flight): groups
     consecutive in prompt_indices order, sample indices 0..3; prompt ids
     equal the tokenizer's encoding of the prompt; completion ids decode to
     the completion text; one finite logprob <= 0 per completion token;
     finish "stop" exactly when the last token is an EOS, else "length" at
     max_tokens; the samples of a group pairwise differ (temperature 1);
     the same seed gives the same tokens and logprobs, another seed other
     ones; policy_version is model.json's outer_step (3).
  3. the logprobs against an independent recomputation: the JAX forward of
     tests/models/jax_reference.py on prompt + completion, softmax at the
     temperature over the top-p set (tolerance 2e-3, IREE vs JAX f32), at
     T = 1 and at T = 0.7, top_p 0.9.
  4. score: a built-in reward (contains "e") equals Python's check; an
     external verifier (Python's http.server on 127.0.0.1) gets the items in
     slices of max_batch with prompt, completion, answer, metadata and its
     rewards land on the right rollouts; a verifier answering 500 fails the
     call (UNAVAILABLE naming HTTP 500) and leaves the rewards as they were.
  5. model.json rewritten with outer_step 7 (a new version): once it
     serves, new rollouts carry 7 (same weights: the same tokens).
  6. stop(): generate with a stop() that turns true after 50 ms ends
     CANCELLED within a bound, with an empty set; all its 48 requests
     ended by the return and none after it (the service's count of ended requests is
     the same 1 s later: no callback ran after the return).

usage: rollout_test.py PCP ROLLOUT_TOOL
"""
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inference_models as im  # noqa: E402
import inference_test as it  # noqa: E402  (reads sys.argv[1]: PCP)
import rollout_logprobs_test as rlp  # noqa: E402

check = it.check
PCP = sys.argv[1]
TOOL = sys.argv[2]
JOIN = "rollout-join"
TOL = 2e-3
# Generous for a loaded CI machine: the tool compiles the model first.
READY_TIMEOUT_MS = 540000

PROMPTS = [
    {"prompt": "the quick brown fox", "answer": "dog"},
    {"prompt": "hello world how are you", "answer": "fine"},
    {"prompt": "seven wizards quietly hum", "answer": "songs",
     "metadata": {"k": 1}},
]

verifier_batches = []
verifier_lock = threading.Lock()


class Verifier(http.server.BaseHTTPRequestHandler):
    """/ok: reward = len(completion) + 100 when metadata is given;
    /fail: HTTP 500."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/fail":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"verifier broke")
            return
        items = body["items"]
        with verifier_lock:
            verifier_batches.append(items)
        rewards = [float(len(x["completion"])) +
                   (100.0 if x["metadata"] else 0.0) for x in items]
        data = json.dumps({"rewards": rewards}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Tool:
    def __init__(self, work, model_dir):
        self.err = open(os.path.join(work, "tool.err"), "w")
        self.proc = subprocess.Popen(
            [TOOL, PCP, model_dir, work], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.err,
            env=dict(os.environ, PCP_ROLLOUT_TOOL_JOIN=JOIN), text=True)
        self.port = json.loads(self.proc.stdout.readline())["port"]

    def call(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("rollout_tool died (see tool.err)")
        return json.loads(line)


def start_worker(work, port):
    env = dict(os.environ, PCP_WORKER_JOIN_TOKEN=JOIN)
    err = open(os.path.join(work, "worker.err"), "a")
    return subprocess.Popen(
        [PCP, "--worker", "--connect", "127.0.0.1:%d" % port, "--device-id",
         "0", "--cache-dir", os.path.join(work, "cache")], env=env,
        stderr=err)


def text_of(r):
    return bytes(r["text_bytes"]).decode("utf-8", "replace")


def check_set(reply, model, indices, group, max_tokens, version, what):
    rs = reply.get("rollouts", [])
    check(reply["status"] == "OK" and len(rs) == len(indices) * group and
          reply["group_size"] == group,
          "%s: %d rollouts (%s %s)" % (what, len(rs), reply["status"],
                                        reply.get("message", "")[:300]))
    if len(rs) != len(indices) * group:
        return False
    layout = all(r["prompt_index"] == indices[k // group] and
                 r["sample_index"] == k % group for k, r in enumerate(rs))
    check(layout, what + ": groups consecutive in prompt_indices order")
    prompt_ok = all(r["prompt_ids"] == model.encode_prompt(
        PROMPTS[r["prompt_index"]]["prompt"]) for r in rs)
    check(prompt_ok, what + ": prompt ids are the tokenizer's encoding")
    counts = all(len(r["completion_ids"]) == len(r["completion_logp"]) >= 1
                 for r in rs)
    check(counts and reply["completion_tokens"] ==
          sum(len(r["completion_ids"]) for r in rs),
          what + ": one logprob per completion token, completion_tokens sums")
    lp = [x for r in rs for x in r["completion_logp"]]
    check(all(np.isfinite(x) and x <= 1e-6 for x in lp),
          what + ": logprobs finite and <= 0 (max %g)" % max(lp))
    finish = all(
        (r["finish_reason"] == "stop") == (r["completion_ids"][-1] in
                                           model.eos) and
        (r["finish_reason"] == "stop" or
         len(r["completion_ids"]) == max_tokens) for r in rs)
    check(finish, what + ": finish stop at an EOS, else length at "
          "max_tokens (%s)" % [r["finish_reason"] for r in rs])
    bad = [(model.decode(r["completion_ids"]), text_of(r)) for r in rs
           if model.decode(r["completion_ids"]) != text_of(r)]
    check(not bad, what + ": ids decode to the completion text %s" % bad[:2])
    check(all(r["policy_version"] == version for r in rs),
          what + ": policy_version %d (%s)" % (
              version, sorted({r["policy_version"] for r in rs})))
    distinct = True
    for g in range(len(indices)):
        ids = [tuple(r["completion_ids"]) for r in rs[g * group:
                                                       (g + 1) * group]]
        distinct = distinct and len(set(ids)) == group
    check(distinct, what + ": the samples of each group differ")
    return True


def check_logprobs(model, reply, t, top_p, what, per_group=1):
    """The rollouts' logprobs against the JAX recomputation."""
    rs = reply["rollouts"]
    group = reply["group_size"]
    worst, n = 0.0, 0
    for k, r in enumerate(rs):
        if k % group >= per_group:
            continue
        seq = r["prompt_ids"] + r["completion_ids"]
        logits = rlp.forward_logits(model, seq)
        p = len(r["prompt_ids"])
        for j, token in enumerate(r["completion_ids"]):
            ref = rlp.kept_logprobs(logits[p - 1 + j], t, top_p)[1]
            worst = max(worst, abs(r["completion_logp"][j] -
                                   ref.get(token, -1e9)))
            n += 1
    check(n > 0 and worst <= TOL, "%s: %d logprobs equal the JAX "
          "recomputation (max error %.2e)" % (what, n, worst))


def main():
    work = tempfile.mkdtemp(prefix="pcp-rollout-")
    tables = os.path.join(work, "tables")
    os.makedirs(tables)
    qwen = im.Model(PCP, tables, im.QWEN, 22)
    meta_path = os.path.join(qwen.dir, "model.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta.update(job_id="rl-rollout-test", outer_step=3)
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    prompts_path = os.path.join(work, "prompts.jsonl")
    with open(prompts_path, "w") as f:
        for p in PROMPTS:
            f.write(json.dumps(p) + "\n")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Verifier)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    vport = server.server_address[1]

    tool = Tool(work, qwen.dir)
    worker = None
    ok = False
    try:
        indices = [2, 0, 1]
        base = dict(cmd="generate", model="qwen3-bpe", prompts=prompts_path,
                    indices=indices, group_size=4, temperature=1.0,
                    top_p=1.0, max_tokens=24, seed=11, max_in_flight=5,
                    timeout_ms=0)
        # 1. No worker: at once with no timeout.
        r = tool.call(**base)
        check(r["status"] == "UNAVAILABLE" and r["call_seconds"] < 5 and
              not r["rollouts"],
              "no worker, no timeout: UNAVAILABLE at once (%s, %.2f s): %s" %
              (r["status"], r["call_seconds"], r["message"][:200]))
        worker = start_worker(work, tool.port)
        first = tool.call(**dict(base, timeout_ms=READY_TIMEOUT_MS))
        check(first["status"] == "OK",
              "with a timeout the call waits for the worker (%.1f s)" %
              first["call_seconds"])
        if first["status"] != "OK":
            print(first["message"][:2000])
            return
        # 2. The set.
        check_set(first, qwen, indices, 4, 24, 3, "G=4 x 3")
        print("rollouts: %d tokens in %.2f s" % (first["completion_tokens"],
                                                 first["seconds"]))
        again = tool.call(**dict(base, timeout_ms=60000))
        same = [(r["completion_ids"], r["completion_logp"], r["text_bytes"])
                for r in first["rollouts"]]
        check(again["status"] == "OK" and same == [
            (r["completion_ids"], r["completion_logp"], r["text_bytes"])
            for r in again["rollouts"]],
            "the same seed: the same tokens, logprobs and text")
        other = tool.call(**dict(base, timeout_ms=60000, seed=12))
        check(other["status"] == "OK" and all(
            a["completion_ids"] != b["completion_ids"]
            for a, b in zip(first["rollouts"], other["rollouts"])),
            "another seed: other samples")
        # 3. Logprobs against JAX, at T = 1 and at T = 0.7 / top_p 0.9.
        check_logprobs(qwen, first, 1.0, 1.0, "T=1")
        cooler = tool.call(**dict(base, timeout_ms=60000, temperature=0.7,
                                  top_p=0.9, indices=[0], group_size=2))
        if check_set(cooler, qwen, [0], 2, 24, 3, "T=0.7 top_p=0.9"):
            check_logprobs(qwen, cooler, 0.7, 0.9, "T=0.7 top_p=0.9",
                           per_group=2)
        # The kept set for scoring: the first one again.
        tool.call(**dict(base, timeout_ms=60000))

        # 4. Score.
        texts = [text_of(x) for x in first["rollouts"]]
        s = tool.call(cmd="score", max_batch=5,
                      reward={"type": "contains", "text": "e"})
        check(s["status"] == "OK" and s["rewards"] ==
              [1.0 if "e" in t else 0.0 for t in texts],
              "built-in reward: contains 'e' equals Python's (%s)" %
              s["rewards"])
        url = "http://127.0.0.1:%d" % vport
        s = tool.call(cmd="score", max_batch=0, reward={
            "type": "verifier", "url": url + "/ok", "max_batch": 5,
            "timeout_ms": 10000, "max_retries": 0})
        want = [float(len(t)) + (100.0 if x["prompt_index"] == 2 else 0.0)
                for t, x in zip(texts, first["rollouts"])]
        check(s["status"] == "OK" and s["rewards"] == want,
              "external verifier: rewards on the right rollouts (%s vs %s)" %
              (s["rewards"], want))
        sent = [x for b in verifier_batches for x in b]
        check([len(b) for b in verifier_batches] == [5, 5, 2] and
              [x["completion"] for x in sent] == texts and
              [x["prompt"] for x in sent] ==
              [PROMPTS[x["prompt_index"]]["prompt"]
               for x in first["rollouts"]] and
              [x["answer"] for x in sent] ==
              [PROMPTS[x["prompt_index"]]["answer"]
               for x in first["rollouts"]] and
              [x["metadata"] for x in sent] ==
              [PROMPTS[x["prompt_index"]].get("metadata")
               for x in first["rollouts"]],
              "external verifier: slices of 5, each item's prompt, "
              "completion, answer and metadata (%s)" %
              [len(b) for b in verifier_batches])
        s = tool.call(cmd="score", max_batch=0, reward={
            "type": "verifier", "url": url + "/fail", "timeout_ms": 10000,
            "max_retries": 0})
        check(s["status"] == "UNAVAILABLE" and "500" in s["message"] and
              s["rewards"] == want,
              "a failing verifier fails the call, rewards untouched: %s %s" %
              (s["status"], s["message"][:200]))

        # 5. A new version with outer_step 7.
        meta.update(outer_step=7)
        tmp = meta_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, meta_path)
        tool.call(cmd="notify", dir=qwen.dir)
        deadline, served = time.time() + 300, None
        while time.time() < deadline:
            models = tool.call(cmd="models")["models"]
            served = models[0] if models else None
            if served and served["outer_step"] == 7 and \
                    served["workers"] >= 1 and served["state"] == 1:
                break
            time.sleep(0.2)
        check(served and served["outer_step"] == 7 and served["version"] == 2,
              "the rewritten model.json serves as version 2: %s" % served)
        seven = tool.call(**dict(base, timeout_ms=60000))
        check_set(seven, qwen, indices, 4, 24, 7, "after the new version")
        check(seven["status"] == "OK" and
              [r["completion_ids"] for r in seven["rollouts"]] ==
              [r["completion_ids"] for r in first["rollouts"]],
              "the same weights under version 2: the same tokens")

        # 6. stop().
        # 48 requests of 100 tokens on 4 slots: about 1 s of work on an idle
        # machine; stop() turns true at the first poll past 50 ms.
        before = tool.call(cmd="models")["models"][0]["requests"]
        stop = tool.call(**dict(base, timeout_ms=120000, group_size=16,
                                max_tokens=100, max_in_flight=64,
                                stop_after_ms=50))
        print("stop: returned %.1f ms after stop() turned true; call %.2f s" %
              (stop["return_after_stop_ms"], stop["call_seconds"]))
        check(stop["status"] == "CANCELLED" and not stop["rollouts"],
              "stop(): CANCELLED, no rollouts (%s: %s)" %
              (stop["status"], stop["message"][:200]))
        check(0 <= stop["return_after_stop_ms"] < 5000,
              "stop(): returned %.1f ms after stop() (bound 5000: a poll of "
              "100 ms plus the requests in flight ending at their next "
              "token)" % stop["return_after_stop_ms"])
        check(stop["requests_at_return"] - before == 48,
              "every request of the call ended before the return (%d of 48)"
              % (stop["requests_at_return"] - before))
        check(stop["requests_later"] == stop["requests_at_return"],
              "no request ended after the return (%d then %d)" %
              (stop["requests_at_return"], stop["requests_later"]))
        after = tool.call(**dict(base, timeout_ms=60000))
        check(after["status"] == "OK", "the service serves on after a stop")
        ok = True
    finally:
        try:
            tool.call(cmd="quit")
        except Exception:  # noqa: BLE001 (the tool may be gone already)
            pass
        try:
            tool.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            tool.proc.kill()
        if worker:
            worker.terminate()
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
        server.shutdown()
    tool.err.close()
    with open(os.path.join(work, "tool.err")) as f:
        err = f.read()
    check(tool.proc.returncode == 0 and "Sanitizer" not in err,
          "rollout_tool exit %s, no sanitizer report%s" %
          (tool.proc.returncode, "" if "Sanitizer" not in err else
           ": " + err[err.index("Sanitizer"):][:2000]))
    if ok and not it.FAILURES:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("logs kept in", work)
    if it.FAILURES or not ok:
        print("%d failure(s)" % len(it.FAILURES))
        sys.exit(1)


if __name__ == "__main__":
    main()
