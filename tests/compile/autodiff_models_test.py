#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Gradients of the built-in models (`pcp model`) against jax.grad.

For GPT, nanochat and Qwen3 (f32, 2 layers): `pcp model` writes the forward
module and its parameter table, `pcp compile --program grad` derives and
compiles @compute_gradients, IREE's CPU driver runs it, and every
parameter's gradient is compared with jax.grad of the independent JAX
reference in tests/models/jax_reference.py (written from the architecture
descriptions, not from the MLIR). Pass: relative error (max abs error over
max |reference|) <= 1e-4 per parameter.
Prints one line per model and closes with 'N passed, M failed'.
"""
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import iree.runtime as ireert

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
import jax_reference as ref  # noqa: E402
from models_jax_test import make_parameters  # noqa: E402

PCP = os.environ["PCP_BINARY"]
TOL = 1e-4
BASE = ["--layers", "2", "--heads", "4", "--width", "32", "--vocab", "37",
        "--block-size", "8", "--batch", "2"]
CASES = [
    ("gpt", BASE),
    ("nanochat", BASE + ["--kv-heads", "2"]),
    ("qwen3", BASE + ["--kv-heads", "2"]),
]


def pcp(args):
    proc = subprocess.run([PCP] + args, capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        raise RuntimeError("pcp %s failed: %s" % (args[0], proc.stderr.strip()))


def run_case(tmp, arch, flags, seed):
    mlir = os.path.join(tmp, arch + ".mlir")
    pjson = os.path.join(tmp, arch + ".json")
    vmfb = os.path.join(tmp, arch + ".vmfb")
    pcp(["model", arch] + flags + ["--dtype", "f32", "-o", mlir,
                                   "--params-json", pjson])
    pcp(["compile", "--program", "grad", mlir, "-o", vmfb])
    with open(pjson) as f:
        table = json.load(f)
    spec = table["spec"]
    rng = np.random.default_rng(seed)
    params = make_parameters(table, rng)
    b, t, v = spec["batch"], spec["block_size"], spec["vocab"]
    ids = rng.integers(0, v, size=(b, t), dtype=np.int32)
    targets = rng.integers(0, v, size=(b, t), dtype=np.int32)
    with open(vmfb, "rb") as f:
        module = ireert.load_vm_flatbuffer(f.read(), driver="local-task")
    out = module.compute_gradients(*params, ids, targets)
    loss = float(np.asarray(out[0]))
    grads = [np.asarray(g) for g in out[1:]]
    f = ref.loss_fn(table)
    jparams = [jnp.asarray(p) for p in params]
    ref_loss = float(f(jparams, jnp.asarray(ids), jnp.asarray(targets)))
    ref_grads = jax.grad(f)(jparams, jnp.asarray(ids), jnp.asarray(targets))
    worst, worst_name = 0.0, ""
    for entry, g, r in zip(table["parameters"], grads, ref_grads):
        r = np.asarray(r, dtype=np.float64)
        err = float(np.max(np.abs(g - r))) / max(float(np.max(np.abs(r))), 1e-30)
        if err > worst:
            worst, worst_name = err, entry["name"]
    ok = worst <= TOL and abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    return ok, ("%d params, max grad rel err %.2e (%s), loss %.6f vs %.6f" %
                (len(grads), worst, worst_name, loss, ref_loss))


def main():
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed, (arch, flags) in enumerate(CASES):
            try:
                ok, detail = run_case(tmp, arch, flags, seed + 10)
            except Exception as e:  # report and continue with the next model
                ok, detail = False, str(e)
            passed += ok
            failed += not ok
            print("%s %s: %s" % ("ok  " if ok else "FAIL", arch, detail))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
