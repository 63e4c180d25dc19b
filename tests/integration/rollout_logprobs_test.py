#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per-token log-probabilities, seeds and tokenizer stop tokens through a
real `pcp --gateway` and real `pcp --worker`s (IREE on CPU): the rollout
side of issue 16 as the OpenAI API exposes it (the Stack of
inference_test.py: toy GPT with a char tokenizer, toy Qwen3 with a BPE
tokenizer.json).

  1. chat and completions with `logprobs` / `top_logprobs` (non-streamed
     and SSE): OpenAI's shapes (chat: logprobs.content[] {token, logprob,
     bytes, top_logprobs[]}; completions: the legacy {tokens,
     token_logprobs, top_logprobs, text_offset}), one entry per completion
     token, top entries sorted with sum(exp) <= 1, the streamed entries
     equal to the non-streamed ones for the same seed.
  2. each sampled token's logprob and its top entries equal a
     recomputation from the model's logits (the independent JAX forward
     of tests/models/jax_reference.py on prompt + sampled tokens) with the
     same temperature and top-p filtering (tolerance 2e-3: IREE vs JAX f32).
  3. four samples of one prompt with distinct seeds differ; each repeats
     exactly (text and logprobs) with its seed. Greedy: logprob 0.
  4. stop tokens come from the model (model.json eos_token_id; the Qwen
     tokenizer's <|im_end|> by default): a copy of the Qwen model whose
     eos_token_id is the 4th greedy token stops right there ("stop",
     completion_tokens 4, its last logprobs entry that token).
  5. 400 naming the key for a bad logprobs / top_logprobs.

usage: rollout_logprobs_test.py PCP
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inference_models as im  # noqa: E402
import inference_test as it  # noqa: E402

check = it.check
TOL = 2e-3


def forward_logits(model, seq):
    """Logits (len(seq) x vocab) of the JAX reference on |seq|."""
    import jax
    import jax.numpy as jnp
    import jax_reference as ref
    if model._forward is None:
        named = {k: jnp.asarray(v) for k, v in model.params.items()}
        spec = dict(model.table["spec"])
        arch = model.table["architecture"]
        model._forward = jax.jit(
            lambda ids: ref.REFERENCES[arch](named, spec, ids))
    ids = np.zeros((1, model.cfg["max_length"]), np.int32)
    ids[0, :len(seq)] = seq
    return np.asarray(model._forward(jnp.asarray(ids)))[0, :len(seq)]


def kept_logprobs(x, t, top_p):
    """{id: logprob} of softmax(x / t) restricted to the top-p set."""
    z = x.astype(np.float64) / t
    order = np.lexsort((np.arange(len(z)), -z))
    if top_p < 1.0:
        w = np.exp(z[order] - z[order].max())
        p = w / w.sum()
        before = np.concatenate([[0.0], np.cumsum(p)[:-1]])
        order = order[before < top_p]
    zk = z[order]
    lse = zk.max() + np.log(np.exp(zk - zk.max()).sum())
    return order, {int(i): float(z[i] - lse) for i in order}


def shape_ok(entries, top, what):
    ok = isinstance(entries, list) and len(entries) > 0
    for e in entries or []:
        tops = e.get("top_logprobs")
        ok = ok and isinstance(e.get("token"), str) and \
            isinstance(e.get("logprob"), float) and e["logprob"] <= 1e-6 and \
            isinstance(e.get("bytes"), list) and \
            all(isinstance(b, int) and 0 <= b < 256 for b in e["bytes"]) and \
            isinstance(tops, list) and 1 <= len(tops) <= top and \
            all(set(x) == {"token", "logprob", "bytes"} for x in tops) and \
            all(tops[i]["logprob"] >= tops[i + 1]["logprob"]
                for i in range(len(tops) - 1)) and \
            sum(np.exp(x["logprob"]) for x in tops) <= 1 + 1e-5
    check(ok, what + ": logprobs shape (%d entries)" % len(entries or []))
    return ok


def stream_entries(base, path, body):
    """(text, logprobs content entries, finish) of a streamed call."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1",
                                      int(base.rsplit(":", 1)[1]), timeout=60)
    conn.request("POST", path, json.dumps(dict(body, stream=True)),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    text, entries, finish = "", [], None
    for line in resp.read().decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line[6:])["choices"][0]
        if "delta" in choice:
            text += choice["delta"].get("content") or ""
            entries += (choice["logprobs"] or {}).get("content", [])
        else:
            text += choice["text"]
            lp = choice["logprobs"]
            for i, tok in enumerate(lp["tokens"] if lp else []):
                entries.append({"token": tok,
                                "logprob": lp["token_logprobs"][i]})
        finish = choice["finish_reason"] or finish
    conn.close()
    return text, entries, finish


def main():
    work = tempfile.mkdtemp(prefix="pcp-logprobs-")
    tables = os.path.join(work, "tables")
    os.makedirs(tables)
    gpt = im.Model(it.PCP, tables, im.GPT, 21)
    qwen = im.Model(it.PCP, tables, im.QWEN, 22)
    msgs = [{"role": "user", "content": "hello world how are you"}]
    greedy_ids, _ = qwen.greedy(qwen.encode_chat(msgs), 8)
    # The same Qwen whose model.json names its 4th greedy token as EOS
    # (a token that is not a special one: the default EOS would not stop).
    eos_dir = os.path.join(tables, "qwen3-eos")
    os.makedirs(eos_dir)
    for f in ("model.safetensors", "tokenizer.json"):
        shutil.copy(os.path.join(qwen.dir, f), eos_dir)
    with open(os.path.join(qwen.dir, "model.json")) as f:
        meta = json.load(f)
    eos_token = greedy_ids[3] if len(greedy_ids) >= 4 else None
    meta.update(name="qwen3-eos", eos_token_id=eos_token)
    with open(os.path.join(eos_dir, "model.json"), "w") as f:
        json.dump(meta, f)
    stack = it.Stack(work, [gpt.dir, qwen.dir, eos_dir])
    ok = False
    try:
        ready, body = it.wait_ready(stack.base, 600)
        check(ready, "ready: %s" % body[:300])
        if not ready:
            return
        base = stack.base
        prompt = "the quick brown fox"

        # 1 + 2. Completions (legacy shape) on the Qwen model, recomputed
        # (the toy GPT's distributions are too peaked to tell much).
        for t, top_p in ((1.0, 1.0), (0.7, 0.9), (1.3, 0.8)):
            body = {"model": "qwen3-bpe", "prompt": prompt, "max_tokens": 24,
                    "temperature": t, "top_p": top_p, "seed": 5,
                    "logprobs": 5}
            status, r = it.post(base, "/v1/completions", body)
            lp = r["choices"][0]["logprobs"] if status == 200 else None
            what = "completions T=%g top_p=%g" % (t, top_p)
            check(status == 200 and lp is not None and
                  set(lp) == {"tokens", "token_logprobs", "top_logprobs",
                              "text_offset"} and
                  len(lp["tokens"]) == r["usage"]["completion_tokens"] and
                  lp["text_offset"] == offsets(lp["tokens"]),
                  what + ": legacy shape %s" % str(r)[:300])
            if not lp:
                continue
            seq = qwen.encode_prompt(prompt)
            ids = [bpe_id(qwen, {"bytes": list(token_bytes(x))})
                   for x in lp["tokens"]]
            logits = forward_logits(qwen, seq + ids)
            worst, tops_ok, bad_top = 0.0, True, None
            for j, token in enumerate(ids):
                order, ref = kept_logprobs(logits[len(seq) - 1 + j], t, top_p)
                got = lp["token_logprobs"][j]
                worst = max(worst, abs(got - ref.get(token, -1e9)))
                want_top = [bpe_text(qwen, i) for i in order[:5]]
                tops_ok = tops_ok and list(lp["top_logprobs"][j]) == \
                    want_top and all(
                        abs(v - ref[bpe_id(qwen, {"bytes": list(
                            token_bytes(k))})]) <= TOL
                        for k, v in lp["top_logprobs"][j].items()) and \
                    sum(np.exp(v) for v in lp["top_logprobs"][j].values()) \
                    <= 1 + 1e-5
                if not tops_ok and bad_top is None:
                    bad_top = (j, lp["top_logprobs"][j], want_top,
                               [ref[i] for i in order[:5]])
            check(worst <= TOL, what + ": sampled tokens' logprobs equal the "
                  "JAX recomputation (max error %.2e)" % worst)
            check(tops_ok, what + ": top_logprobs equal the recomputation%s"
                  % ("" if tops_ok else " (first mismatch %s)" % (bad_top,)))
            text, entries, _ = stream_entries(base, "/v1/completions", body)
            check(text == r["choices"][0]["text"] and
                  [e["token"] for e in entries] == lp["tokens"] and
                  [e["logprob"] for e in entries] == lp["token_logprobs"],
                  what + ": streamed equals non-streamed")

        # Chat on the Qwen model (BPE bytes, EOS in the entries).
        body = {"model": "qwen3-bpe", "messages": msgs, "max_tokens": 16,
                "temperature": 1.0, "top_p": 0.95, "seed": 11,
                "logprobs": True, "top_logprobs": 4}
        status, r = it.post(base, "/v1/chat/completions", body)
        entries = r["choices"][0]["logprobs"]["content"] \
            if status == 200 else None
        if shape_ok(entries, 4, "chat qwen3"):
            check(len(entries) == r["usage"]["completion_tokens"],
                  "chat: one entry per completion token")
            seq = qwen.encode_chat(msgs)
            ids = [bpe_id(qwen, e) for e in entries]
            logits = forward_logits(qwen, seq + ids)
            worst = max(abs(e["logprob"] - kept_logprobs(
                logits[len(seq) - 1 + j], 1.0, 0.95)[1].get(ids[j], -1e9))
                for j, e in enumerate(entries))
            check(worst <= TOL, "chat qwen3: logprobs equal the JAX "
                  "recomputation (max error %.2e)" % worst)
            text, streamed, _ = stream_entries(base, "/v1/chat/completions",
                                               body)
            check(text == r["choices"][0]["message"]["content"] and
                  streamed == entries, "chat streamed equals non-streamed")

        # 3. Four seeds: distinct samples, each reproducible.
        samples = []
        for seed in range(100, 104):
            body = {"model": "qwen3-bpe", "prompt": prompt, "max_tokens": 32,
                    "temperature": 1.0, "seed": seed, "logprobs": True}
            runs = [it.post(base, "/v1/completions", body)[1]
                    for _ in range(2)]
            samples.append(runs[0]["choices"][0]["text"])
            check(runs[0]["choices"][0] == runs[1]["choices"][0],
                  "seed %d repeats (text and logprobs)" % seed)
        check(len(set(samples)) == 4, "4 seeds, 4 distinct samples: %s" %
              samples)
        status, r = it.post(base, "/v1/chat/completions", {
            "model": "gpt-char", "messages": msgs, "max_tokens": 8,
            "temperature": 0, "logprobs": True, "top_logprobs": 3})
        entries = r["choices"][0]["logprobs"]["content"]
        check(all(e["logprob"] == 0.0 and len(e["top_logprobs"]) == 1 and
                  e["top_logprobs"][0]["token"] == e["token"]
                  for e in entries) and len(entries) == 8,
              "greedy: logprob 0, one top entry (the point mass)")

        # 4. Stop token from model.json.
        if eos_token is None:
            check(False, "the greedy reference has 4 tokens")
        else:
            status, r = it.post(base, "/v1/chat/completions", {
                "model": "qwen3-eos", "messages": msgs, "max_tokens": 8,
                "temperature": 0, "logprobs": True})
            c = r["choices"][0] if status == 200 else {}
            last = c.get("logprobs", {}).get("content", [{}])[-1]
            check(c.get("finish_reason") == "stop" and
                  r["usage"]["completion_tokens"] == 4 and
                  c["message"]["content"] == qwen.decode(greedy_ids[:3]) and
                  bpe_id(qwen, last) == eos_token,
                  "eos_token_id from model.json stops: %s" % str(r)[:300])
            status, r = it.post(base, "/v1/chat/completions", {
                "model": "qwen3-bpe", "messages": msgs, "max_tokens": 8,
                "temperature": 0})
            check(status == 200 and r["usage"]["completion_tokens"] >= 4,
                  "the same weights without it go on past that token")

        # 5. Validation.
        for path, extra, param in [
                ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
                ("/v1/chat/completions", {"logprobs": True,
                                          "top_logprobs": 21},
                 "top_logprobs"),
                ("/v1/chat/completions", {"top_logprobs": 2},
                 "top_logprobs"),
                ("/v1/completions", {"logprobs": 21}, "logprobs"),
                ("/v1/completions", {"logprobs": "yes"}, "logprobs")]:
            body = dict({"model": "gpt-char"}, **extra)
            if "chat" in path:
                body["messages"] = msgs
            else:
                body["prompt"] = prompt
            status, got = it.post(base, path, body)
            e = got.get("error", {})
            check(status == 400 and e.get("param") == param,
                  "400 naming %s for %s: %s" % (param, extra, got))
        ok = True
    finally:
        stack.stop()
    # SIGTERM drains: exit 0, and no sanitizer report (ASan builds run this
    # test too: the logprobs JSON and the token callback's buffers).
    with open(os.path.join(work, "gateway.err")) as f:
        err = f.read()
    check(stack.gateway.returncode == 0 and "Sanitizer" not in err,
          "gateway exit %s, no sanitizer report%s" %
          (stack.gateway.returncode, "" if "Sanitizer" not in err else
           ": " + err[err.index("Sanitizer"):][:2000]))
    if ok and not it.FAILURES:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("logs kept in", work)
    if it.FAILURES or not ok:
        print("%d failure(s)" % len(it.FAILURES))
        sys.exit(1)


def bpe_id(model, entry):
    """The id of a BPE token from its logprobs entry's bytes."""
    raw = bytes(entry.get("bytes", []))
    if raw.decode("utf-8", "replace") in im.SPECIAL:
        return model.tokenizer.token_to_id(raw.decode())
    return model.tokenizer.token_to_id("".join(BYTE_TO_CHAR[b] for b in raw))


def token_bytes(text):
    """The bytes of a legacy `tokens` string ("bytes:\\xNN..." or text)."""
    if text.startswith("bytes:"):
        return bytes(int(h, 16) for h in text[6:].split("\\x")[1:])
    return text.encode()


def bpe_text(model, i):
    """A BPE id's `token` string as the server writes it."""
    name = model.tokenizer.id_to_token(int(i))
    if name in im.SPECIAL:
        return name
    raw = bytes(CHAR_TO_BYTE[c] for c in name)
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join("\\x%02x" % b for b in raw)


def offsets(tokens):
    out, at = [], 0
    for t in tokens:
        out.append(at)
        at += len(token_bytes(t))
    return out


def byte_to_char():
    """GPT-2's byte-level alphabet: byte -> the character in the vocab."""
    bs = list(range(ord("!"), ord("~") + 1)) + \
        list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_CHAR = byte_to_char()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}

if __name__ == "__main__":
    main()
