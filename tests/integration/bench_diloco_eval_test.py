#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bench/diloco_comm's held-out evaluation (split_text, read_safetensors,
Evaluator) on an export laid out as the training service writes it
(state/models/<job>/model.json + model.safetensors) from the seeded initial
parameters of `pcp model gpt --init-dir`:

- the train / held-out split is the first 90% cut after a line end;
- the val loss is the JAX reference's loss on windows tokenized here
  independently (vocabulary index of each character), at the bench's fixed
  offsets, and an untrained model scores about ln(vocab);
- a bf16 export scores within bf16 rounding of the f32 one;
- characters outside the exported vocabulary drop exactly the windows that
  hold them (over half dropped is an error);
- decoupled's last merge step per fragment is the schedule's;
- a missing export, weights that do not match model.json's SHA-256, a
  model.json of another model and a truncated tensor give an error, not a
  figure.

argv: the pcp binary. Run with the project's venv (JAX).
"""
import hashlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import diloco_comm as dc  # noqa: E402

FAILURES = []


def check(ok, what):
    print("%s: %s" % ("ok" if ok else "FAIL", what), flush=True)
    if not ok:
        FAILURES.append(what)


MODEL = {"kind": "gpt", "layers": 1, "heads": 2, "kv_heads": 2, "width": 64,
         "vocab": 65, "block_size": 32, "batch": 8}


def write_export(state, job, arrays, names, vocab, dtype="F32", meta=None):
    """model.safetensors + model.json of |job| as the service lays them
    out."""
    header, body, offset = {}, b"", 0
    for name in names:
        a = arrays[name].astype(np.float32)
        if dtype == "BF16":
            raw = (a.view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raw = a.astype("<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        body += raw
        offset += len(raw)
    text = json.dumps(header).encode()
    blob = struct.pack("<Q", len(text)) + text + body
    d = os.path.join(state, "models", job)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(blob)
    m = dict(MODEL, architecture="gpt", weights="model.safetensors",
             weights_sha256=hashlib.sha256(blob).hexdigest(), outer_step=0,
             tokenizer={"kind": "char", "vocab": vocab})
    m.update(meta or {})
    with open(os.path.join(d, "model.json"), "w") as f:
        json.dump(m, f)
    return os.path.join(d, "model.safetensors")


def main():
    pcp = sys.argv[1]
    work = tempfile.mkdtemp(prefix="pcp-bench-eval-")
    try:
        run(pcp, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print("%d failed" % len(FAILURES))
        return 1
    print("all passed")
    return 0


def run(pcp, work):
    import jax
    import jax_reference as ref

    # The split: the first 90% of the file, cut after the last line end.
    train, held_out = dc.split_text(dc.DATA)
    with open(dc.DATA, "rb") as f:
        data = f.read()
    check(train + held_out == data and train.endswith(b"\n") and
          b"\n" not in data[len(train):int(len(data) * 0.9)] and
          0.89 < len(train) / len(data) <= 0.9,
          "split: %d + %d bytes, cut at the last line end before 90%%" % (
              len(train), len(held_out)))
    flat = os.path.join(work, "flat.txt")
    with open(flat, "wb") as f:
        f.write(b"x" * 1000 + b"\n")
    try:
        dc.split_text(flat)
        check(False, "a text with no line end before 90% is refused")
    except RuntimeError as e:
        check("no line end" in str(e), "no line end before 90%%: %s" % e)

    # Seeded initial parameters, exported as the service would.
    init = os.path.join(work, "init")
    subprocess.run(
        [pcp, "model", "gpt", "--layers", "1", "--heads", "2",
         "--kv-heads", "2", "--width", "64", "--vocab", "65",
         "--block-size", "32", "--batch", "8", "-o",
         os.path.join(work, "m.mlir"), "--params-json",
         os.path.join(work, "p.json"), "--init-dir", init, "--seed", "1"],
        check=True, capture_output=True, timeout=120)
    windows = 64
    ev = dc.Evaluator(pcp, work, MODEL, held_out, train, windows)
    names = [e["name"] for e in ev.table["parameters"]]
    files = sorted(os.listdir(init))
    p0 = {n: np.load(os.path.join(init, f)) for n, f in zip(names, files)}
    state = os.path.join(work, "state")
    # The service's vocabulary: sorted unique code points of the train file.
    vocab = "".join(sorted(set(train.decode())))
    check(len(vocab) == 65, "the train file holds %d symbols" % len(vocab))
    write_export(state, "f32", p0, names, vocab)
    r = {"state": state, "job": "f32"}
    ev.evaluate(r)
    check("val_error" not in r, "f32 export scored: %s" % r.get("val_error"))

    # Independent tokenization and the same offsets, straight into JAX.
    text = held_out.decode()
    t = MODEL["block_size"]
    rows = np.array([[vocab.index(c) for c in text[s:s + t + 1]]
                     for s in ev.starts["held-out"]], np.int32)
    want = float(jax.jit(ref.loss_fn(ev.table))(
        {k: np.asarray(v, np.float32) for k, v in p0.items()},
        rows[:, :t], rows[:, 1:]))
    check(abs(r["val"] - want) < 1e-5,
          "val loss %.6f = JAX on independently tokenized windows %.6f" % (
              r["val"], want))
    check(abs(r["val"] - math.log(65)) < 0.3,
          "an untrained model scores about ln(65) = %.3f: %.4f" % (
              math.log(65), r["val"]))
    check(r["val_dropped"] == 0 and abs(r["train_jax"] - math.log(65)) < 0.3,
          "no held-out window dropped; train-text loss %.4f" % r["train_jax"])
    check(len(set(ev.starts["held-out"].tolist())) > windows // 2 and
          ev.starts["held-out"].max() <= len(text) - t - 1,
          "the windows are spread over the held-out text and inside it")
    again = dc.Evaluator(pcp, work, MODEL, held_out, train,
                         windows)
    check((again.starts["held-out"] == ev.starts["held-out"]).all(),
          "the windows are the same in another evaluator (fixed seed)")

    # bf16 export: the same within bf16 rounding.
    write_export(state, "bf16", p0, names, vocab, dtype="BF16")
    rb = {"state": state, "job": "bf16"}
    ev.evaluate(rb)
    check("val_error" not in rb and abs(rb["val"] - r["val"]) < 2e-2 and
          rb["val"] != r["val"],
          "bf16 export %.5f vs f32 %.5f" % (rb.get("val", 0), r["val"]))

    # A character outside the vocabulary drops exactly its windows (the
    # ids after it shift: the vocabulary is what the job exported).
    missing = "k"
    write_export(state, "no-k", p0, names, vocab.replace(missing, ""))
    rm = {"state": state, "job": "no-k"}
    ev.evaluate(rm)
    want_dropped = sum(missing in text[s:s + t + 1]
                       for s in ev.starts["held-out"])
    check(rm.get("val_dropped") == want_dropped and
          0 < want_dropped < windows // 2 and math.isfinite(rm["val"]),
          "'k' outside the vocabulary: %s of %d windows dropped (want %d)"
          % (rm.get("val_dropped"), windows, want_dropped))
    # One that drops over half the windows is an error, not a figure.
    write_export(state, "no-e", p0, names, vocab.replace("e", ""))
    bad = {"state": state, "job": "no-e"}
    ev.evaluate(bad)
    check(math.isnan(bad["val"]) and "outside the vocabulary" in
          bad.get("val_error", ""), "'e' outside the vocabulary: %s" %
          bad.get("val_error"))

    # Decoupled's last merge per fragment: fragment r syncs at steps = r
    # mod H (decoupled_plan.c), counted here by brute force.
    for steps, frags in ((200, 2), (201, 2), (400, 4), (50, 2)):
        body = dc.experiment("decoupled_int4", MODEL, steps, 100, "x",
                             decoupled_extra={"num_fragments": frags})
        want = [max([s for s in range(1, steps + 1) if s % 100 == f] or [0])
                for f in range(frags)]
        check(dc.last_merges(body, steps) == want,
              "last merges at %d steps, P %d: %s" % (
                  steps, frags, dc.last_merges(body, steps)))

    # Errors, not figures.
    bad = {"state": state, "job": "absent"}
    ev.evaluate(bad)
    check(math.isnan(bad["val"]) and "no exported model" in
          bad.get("val_error", ""), "missing export: %s" %
          bad.get("val_error"))
    path = write_export(state, "tampered", p0, names, vocab)
    with open(path, "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x00\x80\x7f")
    bad = {"state": state, "job": "tampered"}
    ev.evaluate(bad)
    check("SHA-256" in bad.get("val_error", ""),
          "weights changed after model.json: %s" % bad.get("val_error"))
    write_export(state, "other", p0, names, vocab, meta={"width": 128})
    bad = {"state": state, "job": "other"}
    ev.evaluate(bad)
    check("width" in bad.get("val_error", ""),
          "another model's model.json: %s" % bad.get("val_error"))
    path = write_export(state, "short", p0, names, vocab)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    meta_path = os.path.join(state, "models", "short", "model.json")
    with open(meta_path) as f:
        m = json.load(f)
    m["weights_sha256"] = digest
    with open(meta_path, "w") as f:
        json.dump(m, f)
    bad = {"state": state, "job": "short"}
    ev.evaluate(bad)
    check("bytes" in bad.get("val_error", ""),
          "a truncated tensor: %s" % bad.get("val_error"))


if __name__ == "__main__":
    sys.exit(main())
