#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that a gateway serves a training job's FINAL export: its greedy
reply equals an offline decode of the exported weights.

The export is the newest <models-root>/*/model.json naming --model (or
--export DIR). The script
  1. checks the weights file against the size and SHA-256 model.json names;
  2. waits (at most --wait-s) until GET /v1/models/<model> reports that
     export's job_id and outer_step, status ready;
  3. unless --wait-only: asks the gateway for a greedy chat reply (one user
     message, temperature 0, --max-tokens) and decodes the same prompt
     offline with tests/models/jax_reference.py (an independent jax.numpy
     implementation of the architecture, f32, full forward per token) on
     the exported safetensors (read here from the raw bytes), then compares
     the two token for token. At every position the served token must be the
     reference's argmax given the served prefix; a different token is only
     accepted where the two top logits are within 1e-4 (a tie to float
     rounding), and such positions are reported.

Prints "served reply equals the offline decode of the final export (outer
step N)" and exits 0, or says what differs and exits 1 (2: could not check:
no export, gateway not serving it in time, unsupported tokenizer).

usage: check_served_weights.py --url URL --model NAME
           (--models-root DIR | --export DIR) [--wait-s S] [--wait-only]
           [--prompt TEXT --max-tokens N --pcp PATH/TO/pcp]
"""
import argparse
import glob
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIE_TOLERANCE = 1e-4


def fail(code, message):
    print("check_served_weights: " + message, file=sys.stderr, flush=True)
    sys.exit(code)


def find_export(args):
    if args.export:
        return args.export
    best, best_mtime = None, -1
    for path in glob.glob(os.path.join(args.models_root, "*", "model.json")):
        try:
            with open(path) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        mtime = os.stat(path).st_mtime_ns
        if meta.get("name") == args.model and mtime > best_mtime:
            best, best_mtime = os.path.dirname(path), mtime
    if not best:
        fail(2, "no model.json naming %r under %s" % (args.model,
                                                     args.models_root))
    return best


def read_safetensors(path):
    """{name: float32 ndarray} from the file's bytes (F32, BF16, F16)."""
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = data[base + b:base + e]
        if t["dtype"] == "F32":
            x = np.frombuffer(raw, "<f4")
        elif t["dtype"] == "BF16":
            x = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(
                np.float32)
        elif t["dtype"] == "F16":
            x = np.frombuffer(raw, "<f2").astype(np.float32)
        else:
            fail(2, "%s: tensor %s has dtype %s" % (path, name, t["dtype"]))
        out[name] = x.reshape(t["shape"]).astype(np.float32)
    return out


def served_info(url, model):
    try:
        with urllib.request.urlopen(url + "/v1/models/" + model,
                                    timeout=10) as r:
            return json.loads(r.read())
    except (OSError, ValueError, urllib.error.HTTPError):
        return {}


def wait_served(args, meta):
    deadline = time.time() + args.wait_s
    info = {}
    while time.time() < deadline:
        info = served_info(args.url, args.model)
        if info.get("status") == "ready" and \
                info.get("outer_step") == meta.get("outer_step") and \
                info.get("job_id") == meta.get("job_id"):
            return info
        time.sleep(0.25)
    fail(2, "after %ds %s still does not serve the final export (job %s, "
         "outer step %s): %s" % (args.wait_s, args.url, meta.get("job_id"),
                                 meta.get("outer_step"), info))


def spec_of(args, meta, work):
    """The model's spec as `pcp model` resolves it (defaults included)."""
    params = os.path.join(work, "params.json")
    cmd = [args.pcp, "model", meta["architecture"]]
    keys = ["layers", "heads", "width", "head_dim", "mlp_hidden", "vocab",
            "block_size"]
    if meta["architecture"] != "gpt":
        keys.append("kv_heads")
    for key in keys:
        if meta.get(key):
            cmd += ["--" + key.replace("_", "-"), str(meta[key])]
    cmd += ["--batch", "1", "-o", os.path.join(work, "m.mlir"),
            "--params-json", params]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    with open(params) as f:
        table = json.load(f)
    spec = dict(table["spec"])
    if "tie_embeddings" in meta:
        spec["tie_embeddings"] = bool(meta["tie_embeddings"])
    if "rope_theta" in meta:
        spec["rope_theta"] = meta["rope_theta"]
    return table["architecture"], spec


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--models-root")
    p.add_argument("--export")
    p.add_argument("--wait-s", type=int, default=120)
    p.add_argument("--wait-only", action="store_true")
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--pcp", default=os.path.join(ROOT, "build", "pcp"))
    args = p.parse_args()
    if not args.export and not args.models_root:
        fail(2, "--models-root or --export is required")
    export = find_export(args)
    with open(os.path.join(export, "model.json")) as f:
        meta = json.load(f)
    weights_path = os.path.join(export, meta.get("weights",
                                                 "model.safetensors"))
    with open(weights_path, "rb") as f:
        weights = f.read()
    if meta.get("weights_sha256") and \
            hashlib.sha256(weights).hexdigest() != meta["weights_sha256"]:
        fail(2, "%s does not match its model.json's weights_sha256 (the "
             "directory is being rewritten)" % weights_path)
    info = wait_served(args, meta)
    step = meta.get("outer_step")
    if args.wait_only:
        print("serving the final export of %s (outer step %s, version %s)" %
              (args.model, step, info.get("version")), flush=True)
        return

    tok = meta.get("tokenizer", {})
    if tok.get("kind") == "char":
        vocab = list(tok["vocab"])
        encode = lambda text: [vocab.index(c) for c in text]  # noqa: E731
        decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    elif tok.get("kind") == "byte":
        encode = lambda text: list(text.encode())  # noqa: E731
        decode = lambda ids: bytes(ids).decode(errors="replace")  # noqa: E731
    else:
        fail(2, "tokenizer kind %r: this check decodes char and byte models"
             % tok.get("kind"))
    if meta.get("chat_template", "plain") != "plain":
        fail(2, "chat_template %r: this check renders plain prompts" %
             meta.get("chat_template"))

    # The served reply: what `pcp chat --temperature 0 PROMPT` asks for.
    body = json.dumps({"model": args.model, "temperature": 0,
                       "max_tokens": args.max_tokens,
                       "messages": [{"role": "user",
                                     "content": args.prompt}]}).encode()
    req = urllib.request.Request(args.url + "/v1/chat/completions", data=body,
                                 method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        reply = json.loads(r.read())
    text = reply["choices"][0]["message"]["content"]
    after = served_info(args.url, args.model)
    if after.get("outer_step") != step or after.get("job_id") != meta.get(
            "job_id"):
        fail(2, "the served version changed during the check: %s" % after)
    served = encode(text)

    import jax
    import jax.numpy as jnp
    import numpy as np
    jax.config.update("jax_default_matmul_precision", "highest")
    sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
    import jax_reference as ref

    with tempfile.TemporaryDirectory() as work:
        arch, spec = spec_of(args, meta, work)
    params = {k: jnp.asarray(v) for k, v in read_safetensors(
        weights_path).items()}
    length = int(spec["block_size"])
    forward = jax.jit(lambda ids: ref.REFERENCES[arch](params, spec, ids))
    prompt = encode(args.prompt)
    max_length = int(meta.get("max_length", min(length, 1024)))
    expected = min(args.max_tokens, max_length - len(prompt))
    if len(served) != expected:
        fail(1, "the served reply has %d tokens; %d were asked for (%r)" %
             (len(served), expected, text))

    def next_logits(seq):
        ids = np.zeros((1, length), np.int32)
        ids[0, :len(seq)] = seq
        return np.asarray(forward(jnp.asarray(ids)))[0, len(seq) - 1]

    # Along the served tokens: each must be the reference's choice.
    seq, ties = list(prompt), []
    for i, token in enumerate(served):
        logits = next_logits(seq)
        best = int(np.argmax(logits))
        if token != best:
            gap = float(logits[best] - logits[token])
            if gap > TIE_TOLERANCE * max(1.0, abs(float(logits[best]))):
                fail(1, "token %d differs: served %r, the offline decode of "
                     "the final export %r (logit gap %.3g)\n  served:  %r\n"
                     "  offline: %r" % (i, decode([token]), decode([best]),
                                        gap, text,
                                        decode(served[:i] + [best])))
            ties.append(i)
        seq.append(token)
    if ties:
        print("served reply equals the offline decode of the final export "
              "(outer step %s) up to %d near-tie(s) at %s (top logits within "
              "%g)" % (step, len(ties), ties, TIE_TOLERANCE), flush=True)
    else:
        print("served reply equals the offline decode of the final export "
              "(outer step %s)" % step, flush=True)


if __name__ == "__main__":
    main()
