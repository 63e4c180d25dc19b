#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The training service beyond the built-in f32 GPT (issue 5 item 3's keys
model_path, dtype and effective_batch_size), on a real gateway and a node
manager with two CPU workers, real IREE programs.

  1. model_path: a one-block transformer exported from JAX by
     tools/export_jax.py trains with classic DiLoCo; the loss falls, every
     outer step moves parameter_count x workers x (4 + 4) bytes, the trained
     weights land in the job's directory as safetensors (param_<i>), and
     JAX evaluating the ORIGINAL loss function with those weights on the
     text (an independent reference) agrees with the loss the service
     reported;
  2. the same module with i64 token ids (torch-mlir style): same first
     round loss as the i32 module (same seed: same initial weights and
     batches), token bytes twice as many;
  3. effective_batch_size = 2 x micro batch: every inner step accumulates
     two micro batches; its first round equals (to f32 rounding) a module
     exported with twice the batch and no accumulation;
  4. dtype bf16: a built-in GPT trains in bf16 (f32 masters on the
     gateway), bf16 parameters down and bf16 deltas up (2 + 2 bytes per
     parameter and worker), the export is a bf16 model the inference
     service can serve;
  5. max_epochs: on a 20 KB excerpt the job ends when the workers have
     trained max_epochs passes over its train split, before
     outer_loop_steps;
  6. streaming DiLoCo takes the same: the i64 module with
     effective_batch_size 16 follows the batch-16 module sync for sync;
     a bf16 GPT streams bf16 masters down and bf16 deltas up (2 + 2 bytes
     per fragment element and worker), and "resume": true on its
     checkpoint (bf16 local parameters, f32 moments uploaded) continues;
  7. 400s naming the key: a missing module, a module without token
     arguments, dtype disagreeing with the module, f16, an
     effective_batch_size that is not a multiple.
Every wait is bounded.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway_test as gt  # noqa: E402
import training_e2e_test as te  # noqa: E402

from gateway_test import check, is_error, request, wait_for  # noqa: E402

ROOT = te.ROOT
DATA = te.DATA
EXPORT = os.path.join(ROOT, "tools", "export_jax.py")
# The exported transformer: vocab 65 (tiny_shakespeare's characters),
# block 32, micro batch 8, width 64, 4 heads: 55,680 parameters.
SIZES = {"vocab": 65, "seq": 32, "batch": 8, "width": 64, "heads": 4}


def export_module(path, token_dtype="i32", **sizes):
    args = dict(SIZES, **sizes)
    cmd = [sys.executable, EXPORT, "--model", "transformer", "-o", path,
           "--token-dtype", token_dtype]
    for k, v in args.items():
        cmd += ["--" + k, str(v)]
    subprocess.run(cmd, check=True, capture_output=True)


def experiment(model_path=None, **extra):
    e = {"name": "module", "data_path": DATA, "tokenizer": "char",
         "learning_rate": 0.01, "tau": 10, "outer_loop_steps": 12,
         "nesterov_momentum": 0.0, "outer_learning_rate": 1.0,
         "checkpoint_every": 100, "seed": 3}
    if model_path:
        e["model_path"] = model_path
    e.update(extra)
    return e


def run_job(body, seconds=600):
    job = te.submit(body)
    te.wait_done(job, seconds)
    s, r = request("GET", "/v1/training/jobs/%s" % job)
    check(r.get("state") == "succeeded",
          "job %s succeeded: %s" % (body.get("name"), r.get("error", r)))
    return job, r, te.steps_of(job)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], raw[8 + n + a:8 + n + b])
    return out


def reference_loss(weights, batches=16, seed=0):
    """JAX: the exported module's own loss function (export_jax's
    transformer_model) with the trained weights, on random windows of the
    text under nanoGPT's char mapping (what `tokenizer: char` uses)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import export_jax
    loss_fn, params, _ = export_jax.transformer_model(**SIZES)
    with open(DATA) as f:
        text = f.read()
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text[:200000]], np.int32)
    trained = []
    for i, p in enumerate(params):
        dtype, shape, data = weights["param_%d" % i]
        check(dtype == "F32" and list(shape) == list(p.shape),
              "param_%d: %s %s, the module's %s" % (i, dtype, shape,
                                                   p.shape))
        trained.append(np.frombuffer(data, np.float32).reshape(p.shape))
    rng = np.random.default_rng(seed)
    import jax
    f = jax.jit(loss_fn)
    T, B = SIZES["seq"], SIZES["batch"]
    losses = []
    for _ in range(batches):
        starts = rng.integers(0, len(ids) - T - 1, B)
        x = np.stack([ids[s:s + T] for s in starts])
        y = np.stack([ids[s + 1:s + T + 1] for s in starts])
        losses.append(float(f(*trained, x, y)))
    return sum(losses) / len(losses)


def bad_requests(work, mlp_path, module_path):
    cases = [
        (experiment(os.path.join(work, "missing.mlir")), "model_path"),
        (experiment(mlp_path), "model_path"),
        (experiment(module_path, dtype="bf16"), "dtype"),
        (experiment(module_path, dtype="f16"), "dtype"),
        (experiment(module_path, effective_batch_size=12),
         "effective_batch_size"),
        (experiment(module_path, streaming={"num_fragments": 2},
                    effective_batch_size=20), "effective_batch_size"),
    ]
    for body, key in cases:
        resp = request("POST", "/v1/training/jobs", body)
        check(is_error(resp, 400, "INVALID_ARGUMENT") and
              key in resp[1]["error"]["message"],
              "400 naming %s: %s" % (key, resp))


def main():
    work = tempfile.mkdtemp(prefix="pcp-train-models-")
    modules = {}
    for name, dtype, sizes in (("i32", "i32", {}), ("i64", "i64", {}),
                               ("b16", "i32", {"batch": 16})):
        modules[name] = os.path.join(work, "transformer-%s.mlir" % name)
        export_module(modules[name], dtype, **sizes)
    mlp = os.path.join(work, "mlp.mlir")
    subprocess.run([sys.executable, EXPORT, "--model", "mlp", "-o", mlp],
                   check=True, capture_output=True)
    gw = nm = None
    try:
        gw, nm = te.start_cluster(work)
        if gt.FAILURES:
            return 1
        bad_requests(work, mlp, modules["i32"])

        # 1. model_path, i32 token ids.
        t0 = time.time()
        a, ra, steps = run_job(experiment(modules["i32"], name="i32"))
        losses = [steps[k]["loss_mean"] for k in sorted(steps)]
        n = ra["training"]["parameter_count"]
        print("model_path i32: %d params, %.1f s, loss_mean %s" % (
            n, time.time() - t0, " ".join("%.3f" % x for x in losses)))
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import export_jax
        want = sum(p.size for p in export_jax.transformer_model(**SIZES)[1])
        check(n == want, "parameter count from the module: %d (JAX: %d)" % (
            n, want))
        check(len(losses) == 12 and losses[0] > 3.3 and
              losses[-1] < losses[0] - 0.6,
              "loss falls: %.3f -> %.3f" % (losses[0], losses[-1]))
        check(all(p["step_wire_bytes"] == n * p["workers"] * 8 and
                  p["workers"] == 2 for p in steps.values()),
              "every step moves N x 2 workers x (4 + 4) bytes")
        weights_path = os.path.join(work, "state", "training", a,
                                    "model.safetensors")
        check(os.path.exists(weights_path), "weights in the job directory")
        check(not os.path.exists(os.path.join(work, "state", "models", a)),
              "a foreign module is not offered to the inference service")
        if os.path.exists(weights_path):
            ref = reference_loss(read_safetensors(weights_path))
            print("JAX loss of the exported weights %.4f; the service's last "
                  "round %.4f" % (ref, losses[-1]))
            check(abs(ref - losses[-1]) < 0.15,
                  "JAX on the trained weights agrees with the reported loss "
                  "(%.4f vs %.4f)" % (ref, losses[-1]))

        # 2. i64 token ids: the same function, so the same first round.
        b, rb, steps_b = run_job(experiment(modules["i64"], name="i64",
                                            outer_loop_steps=2))
        first_a, first_b = steps[1], steps_b.get(1, {})
        check(abs(first_b.get("loss_mean", 9) - first_a["loss_mean"]) < 1e-5,
              "i64 module's first round = the i32 module's: %s vs %s" % (
                  first_b.get("loss_mean"), first_a["loss_mean"]))
        check(first_b.get("token_bytes") == 2 * first_a["token_bytes"],
              "i64 ids: twice the token bytes (%s vs %s)" % (
                  first_b.get("token_bytes"), first_a["token_bytes"]))

        # 3. effective_batch_size 16 on the batch-8 module vs the batch-16
        # module: the same rows in the same order, one AdamW step per 16.
        c, rc, steps_c = run_job(experiment(
            modules["i32"], name="accumulate", effective_batch_size=16,
            outer_loop_steps=2))
        d, rd, steps_d = run_job(experiment(
            modules["b16"], name="batch16", outer_loop_steps=2))
        for k in (1, 2):
            lc = steps_c.get(k, {}).get("loss_mean", 9)
            ld = steps_d.get(k, {}).get("loss_mean", -9)
            print("step %d: accumulated 2 x 8 loss_mean %.6f, batch 16 "
                  "%.6f" % (k, lc, ld))
            check(abs(lc - ld) < 2e-4,
                  "step %d: 2 x 8 accumulated = batch 16 (%.6f vs %.6f)" % (
                      k, lc, ld))
        check(steps_c.get(1, {}).get("token_bytes") ==
              2 * first_a["token_bytes"],
              "accumulation: twice the tokens per round")

        # 5. max_epochs = 1 on a 20 KB excerpt: 2 workers x 10 x 8 x 32 =
        # 5,120 tokens per outer step, 18,432 train tokens: 4 steps.
        small = os.path.join(work, "small.txt")
        with open(DATA) as f:
            excerpt = f.read(20480)
        with open(small, "w") as f:
            f.write(excerpt)
        m, rm, steps_m = run_job(experiment(
            modules["i32"], name="epochs", data_path=small, max_epochs=1,
            outer_loop_steps=100))
        train_tokens = len(excerpt.encode()) * 9 // 10
        want = -(-train_tokens // 5120)
        last = steps_m.get(max(steps_m) if steps_m else 0, {})
        print("max_epochs=1: %d steps, epoch %s" % (
            len(steps_m), last.get("epoch")))
        check(sorted(steps_m) == list(range(1, want + 1)) and
              1.0 <= last.get("epoch", 0) < 1.0 + 5120 / train_tokens,
              "max_epochs=1 ends after %d steps: %s, epoch %s" % (
                  want, sorted(steps_m), last.get("epoch")))

        # 6. Streaming: i64 ids + accumulation vs the batch-16 module.
        stream = {"num_fragments": 2, "inner_steps": 5, "overlap_tau": 1,
                  "alpha": 0.5}
        sa, rsa, steps_sa = run_job(experiment(
            modules["i64"], name="stream-i64-acc", effective_batch_size=16,
            streaming=stream, max_epochs=4))
        sb, rsb, steps_sb = run_job(experiment(
            modules["b16"], name="stream-b16", streaming=stream,
            max_epochs=4))
        la = [steps_sa[k]["loss"] for k in sorted(steps_sa)]
        lb = [steps_sb[k]["loss"] for k in sorted(steps_sb)]
        print("streaming i64 + 2 x 8 accumulated: %s" % " ".join(
            "%.5f" % x for x in la))
        print("streaming batch 16:                %s" % " ".join(
            "%.5f" % x for x in lb))
        check(len(la) == 8 and len(lb) == 8 and
              all(abs(x - y) < 2e-3 for x, y in zip(la, lb)) and
              abs(la[0] - lb[0]) < 2e-4,
              "streaming: i64 ids with accumulation = the batch-16 module")
        check(la and la[-1] < la[0] - 0.2, "streaming loss falls: %s" % la)

        # 4. dtype bf16, bf16 deltas: a built-in GPT.
        gpt = {"kind": "gpt", "layers": 2, "heads": 4, "width": 64,
               "vocab": 65, "block_size": 32, "batch": 8}
        e, re_, steps_e = run_job(dict(
            experiment(name="bf16"), model=gpt, dtype="bf16",
            deltas_dtype="bf16"))
        ne = re_["training"]["parameter_count"]
        le = [steps_e[k]["loss_mean"] for k in sorted(steps_e)]
        print("bf16 GPT: %d params, loss_mean %s" % (
            ne, " ".join("%.3f" % x for x in le)))
        check(le and le[0] > 3.3 and le[-1] < le[0] - 0.6,
              "bf16 loss falls: %s" % le)
        check(all(p["step_wire_bytes"] == ne * p["workers"] * 4
                  for p in steps_e.values()),
              "bf16 both ways: N x workers x (2 + 2) bytes per step")
        check(re_["training"].get("wire_bytes_per_worker_outer_step") ==
              ne * 4, "analytic bytes at submit: %s" % re_["training"])
        meta_path = os.path.join(work, "state", "models", e, "model.json")
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
            check(meta.get("dtype") == "bf16", "exported as bf16: %s" %
                  meta.get("dtype"))
            tensors = read_safetensors(os.path.join(
                os.path.dirname(meta_path), "model.safetensors"))
            check(all(t[0] == "BF16" for t in tensors.values()),
                  "bf16 weights in the safetensors file")
        else:
            check(False, "bf16 model exported")

        # 6b. Streaming a bf16 GPT, then one more round with resume: true.
        ckpt = os.path.join(work, "state", "ckpt-stream-bf16")
        # lr 3e-3: at 1e-2 one run or the other spikes at some sync (a
        # one-batch loss of 3.98 against 3.45), which is not about bf16.
        body = dict(experiment(name="stream-bf16", learning_rate=0.003),
                    model=gpt, dtype="bf16",
                    deltas_dtype="bf16", streaming=stream, max_epochs=4,
                    checkpoint_dir=ckpt, checkpoint_every=4)
        sc, rsc, steps_sc = run_job(body)
        lc = [steps_sc[k]["loss"] for k in sorted(steps_sc)]
        # The same run in f32: bf16 must train like it.
        sf, rsf, steps_sf = run_job(dict(
            body, name="stream-f32", dtype="f32", deltas_dtype="f32",
            checkpoint_dir=os.path.join(work, "state", "ckpt-stream-f32")))
        lf = [steps_sf[k]["loss"] for k in sorted(steps_sf)]
        print("streaming bf16 GPT: %s" % " ".join("%.3f" % x for x in lc))
        print("streaming f32 GPT:  %s" % " ".join("%.3f" % x for x in lf))
        check(len(lc) == 8 and len(lf) == 8 and max(lc) < 3.8 and
              all(abs(x - y) < 0.1 for x, y in zip(lc, lf)),
              "bf16 streaming trains like f32 (from 4.17): %s vs %s" % (
                  lc, lf))
        frag = {}
        for p in steps_sc.values():
            if p["workers"] == 2:
                frag.setdefault(p["fragment"], set()).add(
                    p["step_wire_bytes"] // 2)
        check(len(frag) == 2 and all(len(v) == 1 for v in frag.values()) and
              sum(next(iter(v)) for v in frag.values()) == ne * 4,
              "bf16 streaming: fragment elements x (2 + 2) per worker, "
              "fragments summing to %d parameters: %s" % (ne, frag))
        sd, rsd, steps_sd = run_job(dict(body, name="stream-bf16-more",
                                         max_epochs=5, resume=True))
        check(sorted(steps_sd) == [9, 10] and
              all(steps_sd[k]["loss"] < 3.8 for k in (9, 10)),
              "resume: true continues at sync 9 from the bf16 state: %s" % {
                  k: v["loss"] for k, v in steps_sd.items()})
    finally:
        te.stop_all(nm, gw)
    if gt.FAILURES:
        print("training_models_test: %d failures (logs in %s)" % (
            len(gt.FAILURES), work))
        return 1
    print("training_models_test: all passed")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
