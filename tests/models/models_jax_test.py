#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Whole-model numerics of `pcp model` against an independent JAX reference.

For each case: `pcp model ARCH ... -o m.mlir --params-json p.json` emits the
module; random parameters (named and shaped by p.json, generated here with
NumPy) and random token ids are written as .npy; `pcp run m.mlir --function
logits` and `--function main` run the module on IREE's CPU backend; the same
parameters go through the plain jax.numpy implementations in
jax_reference.py, written from the architecture descriptions (nanoGPT,
nanochat, Hugging Face Qwen3), not from the MLIR. For f32 cases the test also
takes jax.grad of the reference loss (what the autodiff checks compare
against) and requires every parameter's gradient to be finite and non-zero.

Tolerances (docs/models.md): f32 logits within 1e-4 relative (max abs error
over max |logit|) and loss within 1e-5 relative; bf16 (bf16 parameters and
activations on both sides, f32 norms/softmax/loss) within 5e-2 relative for
logits and 1e-2 for the loss: the two compilers round bf16 intermediates at
different places (XLA may keep fused bf16 elementwise chains in f32), which
is a few bf16 ulps (2^-8 each); measured up to 1.5e-2 and 9.4e-4. A wrong
formula (RoPE direction, norm placement, GQA order) gives errors of order 1.

Run by ctest with the project's .venv python; PCP_BINARY names the binary.
Prints one line per case with the measured errors and closes with
'N passed, M failed'.
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax_reference as ref  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

PCP = os.environ["PCP_BINARY"]


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------

def make_parameters(table, rng):
    """Random values that keep activations O(1) so every op matters:
    embeddings N(0, 1), matrices N(0, 1/in), norm weights 1 + N(0, 0.1^2),
    biases N(0, 0.1^2)."""
    values = []
    for entry in table["parameters"]:
        shape = tuple(entry["shape"])
        if entry["init"] == "ones":
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        elif entry["init"] == "zeros":
            x = 0.1 * rng.standard_normal(shape)
        elif "wte" in entry["name"] or "embed" in entry["name"] or "wpe" in entry["name"]:
            x = rng.standard_normal(shape)
        else:
            x = rng.standard_normal(shape) / np.sqrt(shape[1])
        values.append(x.astype(np.float32))
    return values


def run_pcp(args):
    proc = subprocess.run([PCP] + args, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError("pcp %s failed (%d): %s" % (args[0], proc.returncode,
                                                      proc.stderr.strip()))
    return proc.stdout


def run_case(tmp, name, arch, flags, dtype, seed):
    mlir = os.path.join(tmp, name + ".mlir")
    pjson = os.path.join(tmp, name + ".json")
    out = run_pcp(["model", arch] + flags + ["--dtype", dtype, "-o", mlir,
                                            "--params-json", pjson])
    with open(pjson) as f:
        table = json.load(f)
    spec = table["spec"]
    count = sum(int(np.prod(e["shape"])) for e in table["parameters"])
    m = re.search(r"(\d+) parameters", out)
    if not m or int(m.group(1)) != count or table["parameter_count"] != count:
        return "printed parameter count %s != %d" % (m and m.group(1), count)

    rng = np.random.default_rng(seed)
    params = make_parameters(table, rng)
    b, t, v = spec["batch"], spec["block_size"], spec["vocab"]
    ids = rng.integers(0, v, size=(b, t), dtype=np.int32)
    targets = rng.integers(0, v, size=(b, t), dtype=np.int32)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bf16" else np.float32
    inputs = []
    for i, x in enumerate(params):
        if dtype == "bf16":
            # bf16 has no NumPy descr; `pcp run` takes raw bytes with a type.
            path = os.path.join(tmp, "%s_p%d.bin" % (name, i))
            x.astype(np_dtype).tofile(path)
            shape = "x".join(str(d) for d in x.shape)
            inputs += ["--input", "%sxbf16=@%s" % (shape, path)]
        else:
            path = os.path.join(tmp, "%s_p%d.npy" % (name, i))
            np.save(path, x)
            inputs += ["--input", "@" + path]
    ids_path = os.path.join(tmp, name + "_ids.npy")
    tgt_path = os.path.join(tmp, name + "_targets.npy")
    np.save(ids_path, ids)
    np.save(tgt_path, targets)
    logits_path = os.path.join(tmp, name + "_logits.npy")
    loss_path = os.path.join(tmp, name + "_loss.npy")
    run_pcp(["run", mlir, "--function", "logits"] + inputs +
            ["--input", "@" + ids_path, "--output", "@" + logits_path])
    run_pcp(["run", mlir, "--function", "main"] + inputs +
            ["--input", "@" + ids_path, "--input", "@" + tgt_path,
             "--output", "@" + loss_path])
    got_logits = np.load(logits_path)
    got_loss = float(np.load(loss_path))

    named = {e["name"]: jnp.asarray(x.astype(np_dtype))
             for e, x in zip(table["parameters"], params)}
    ref_logits = np.asarray(ref.logits(table, named, jnp.asarray(ids)))
    ref_loss = float(ref.loss_fn(table)(named, jnp.asarray(ids), jnp.asarray(targets)))
    if got_logits.shape != ref_logits.shape or got_logits.dtype != np.float32:
        return "logits %s %s, expected %s f32" % (got_logits.shape, got_logits.dtype,
                                                  ref_logits.shape)
    logits_err = float(np.max(np.abs(got_logits.astype(np.float64) - ref_logits)) /
                       np.max(np.abs(ref_logits)))
    loss_err = abs(got_loss - ref_loss) / abs(ref_loss)
    logits_tol, loss_tol = (1e-4, 1e-5) if dtype == "f32" else (5e-2, 1e-2)
    detail = "logits rel err %.2e (tol %.0e), loss %.6f vs %.6f rel err %.2e (tol %.0e)" % (
        logits_err, logits_tol, got_loss, ref_loss, loss_err, loss_tol)
    if not (logits_err <= logits_tol and loss_err <= loss_tol):
        return "FAILED " + detail
    if dtype == "f32":
        grads = jax.grad(ref.loss_fn(table))(
            [named[e["name"]] for e in table["parameters"]], jnp.asarray(ids),
            jnp.asarray(targets))
        for e, g in zip(table["parameters"], grads):
            g = np.asarray(g)
            if not np.all(np.isfinite(g)) or not np.any(g):
                return "FAILED reference gradient of %s is %s" % (
                    e["name"], "zero" if np.all(np.isfinite(g)) else "not finite")
        detail += ", reference grads finite"
    return "ok " + detail


def run_init_case(tmp, name, arch, flags, dtype, seed):
    """`pcp model --init-dir`: the seeded initial parameters (N(0, 0.02^2)
    weights, unit norms, zero biases) load into `pcp run` and give a loss
    near ln(V) (near-uniform logits), equal to the reference's."""
    mlir = os.path.join(tmp, name + ".mlir")
    pjson = os.path.join(tmp, name + ".json")
    init = os.path.join(tmp, name + "_init")
    run_pcp(["model", arch] + flags + ["--dtype", dtype, "-o", mlir,
                                      "--params-json", pjson, "--init-dir", init,
                                      "--seed", str(seed)])
    with open(pjson) as f:
        table = json.load(f)
    spec = table["spec"]
    np_dtype = ml_dtypes.bfloat16 if dtype == "bf16" else np.float32
    inputs, named = [], {}
    for i, e in enumerate(table["parameters"]):
        shape = tuple(e["shape"])
        base = os.path.join(init, "%03d.%s" % (i, e["name"]))
        if dtype == "bf16":
            x = np.fromfile(base + ".bin", dtype=np_dtype).reshape(shape)
            inputs += ["--input", "%sxbf16=@%s.bin" % ("x".join(map(str, shape)), base)]
        else:
            x = np.load(base + ".npy")
            inputs += ["--input", "@%s.npy" % base]
        if x.shape != shape or x.dtype != np_dtype:
            return "FAILED %s: %s %s" % (base, x.shape, x.dtype)
        named[e["name"]] = jnp.asarray(x)
    rng = np.random.default_rng(seed)
    b, t, v = spec["batch"], spec["block_size"], spec["vocab"]
    ids = rng.integers(0, v, size=(b, t), dtype=np.int32)
    targets = rng.integers(0, v, size=(b, t), dtype=np.int32)
    ids_path = os.path.join(tmp, name + "_ids.npy")
    tgt_path = os.path.join(tmp, name + "_targets.npy")
    loss_path = os.path.join(tmp, name + "_loss.npy")
    np.save(ids_path, ids)
    np.save(tgt_path, targets)
    run_pcp(["run", mlir, "--function", "main"] + inputs +
            ["--input", "@" + ids_path, "--input", "@" + tgt_path,
             "--output", "@" + loss_path])
    got = float(np.load(loss_path))
    want = float(ref.loss_fn(table)(named, jnp.asarray(ids), jnp.asarray(targets)))
    tol = 1e-5 if dtype == "f32" else 1e-2
    err = abs(got - want) / abs(want)
    detail = "initial loss %.6f vs %.6f rel err %.2e (tol %.0e), ln(V) %.4f" % (
        got, want, err, tol, np.log(v))
    if err > tol or abs(got - np.log(v)) > 0.1:
        return "FAILED " + detail
    return "ok " + detail


# The base shapes are models_test's compiled ones (same flags, same text), so
# a sequential ctest run compiles each module once (shared PCP_CACHE_DIR).
BASE = ["--layers", "2", "--heads", "4", "--width", "32", "--vocab", "37",
        "--block-size", "8", "--batch", "2"]
CASES = [
    ("gpt", BASE),
    ("nanochat", BASE + ["--kv-heads", "2"]),
    ("qwen3", BASE + ["--kv-heads", "2"]),
]
# Second shapes, f32 only: multi-head nanochat with upstream's vocab, and
# Qwen3 with a head_dim not equal to width/heads, one kv head, a tied head,
# its own MLP size and RoPE base.
EXTRA = [
    ("nanochat", ["--layers", "1", "--heads", "2", "--width", "16", "--vocab", "65",
                  "--block-size", "16", "--batch", "3"]),
    ("qwen3", ["--layers", "1", "--heads", "4", "--kv-heads", "1", "--width", "24",
               "--head-dim", "8", "--mlp-hidden", "40", "--vocab", "29",
               "--block-size", "6", "--batch", "2", "--tie-embeddings",
               "--rope-theta", "10000"]),
]


def main():
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("PCP_CACHE_DIR", os.path.join(tmp, "cache"))
        jobs = []
        for arch, flags in CASES:
            for dtype in ("f32", "bf16"):
                jobs.append(("%s_%s" % (arch, dtype), arch, flags, dtype))
        for i, (arch, flags) in enumerate(EXTRA):
            jobs.append(("%s_extra%d_f32" % (arch, i), arch, flags, "f32"))

        for arch, dtype in (("gpt", "f32"), ("nanochat", "f32"), ("qwen3", "bf16")):
            flags = dict(CASES)[arch]
            jobs.append(("%s_init_%s" % (arch, dtype), arch, flags, dtype))

        def guarded(seed, job):
            name, arch, flags, dtype = job
            try:
                if "_init_" in name:
                    return run_init_case(tmp, name, arch, flags, dtype, seed + 1)
                return run_case(tmp, name, arch, flags, dtype, seed + 1)
            except Exception as e:  # a failed pcp call is a failed case
                return "FAILED %s" % e

        # Two at a time: each case is mostly `pcp run` start-up and compiles
        # in child processes (the machines running ctest have 2 cores).
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(guarded, range(len(jobs)), jobs))
        for (name, _, _, _), result in zip(jobs, results):
            ok = result.startswith("ok")
            passed += ok
            failed += not ok
            print("%-4s %s: %s" % ("ok" if ok else "FAIL", name,
                                    result[3:] if ok else result), flush=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
