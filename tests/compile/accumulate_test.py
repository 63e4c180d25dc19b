#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Gradient accumulation (`pcp compile --accumulate A`) against the same
model emitted with an A-times larger batch.

The built-in GPT's loss is the mean over its B x T tokens, so the mean of
the A micro-batch losses (and gradients) of a [A, B, T] step equals the
loss (and gradient) of one [A*B, T] batch in real arithmetic. Reference:
`pcp model gpt --batch A*B` compiled without accumulation, fed the same
tokens reshaped [K, A, B, T] -> [K, A*B, T] (micro-batch a is rows
a*B .. a*B+B-1 of the big batch). Checked, for A = 2 and K = 3:

1. @compute_gradients_accumulated(params, ids[A,B,T], targets[A,B,T]) vs
   @compute_gradients of the big-batch module: loss and every gradient.
2. @train_steps from zero moments at step 1: params, m, v after K steps and
   the K losses.
3. @diloco_round: the deltas and the K losses.

f32: every tensor within REL_F32 of the reference, relative to the
tensor's largest magnitude (only the summation order differs); the deltas
through the parameters they imply (params - deltas).
bf16 (`--dtype bf16`, f32 master moments): see the BF16_* constants.

The modules use AdamW epsilon 1e-3 (not the default 1e-8): the key part of
the attention bias has a gradient that is exactly zero in real arithmetic
(softmax ignores a per-row shift), so both runs compute rounding noise of
~1e-9 there, and with epsilon 1e-8 AdamW turns that noise into steps of
+-lr of either sign (measured: 3e-4 relative error in f32, 0.6 in bf16).
The accumulation under test is the same with any epsilon; AdamW itself is
checked against NumPy in autodiff_jax_test and train_bf16_test. Clipping is
off (--max-grad-norm 0): these gradients' global norm is above 1, and the
clip would scale away exactly the error a missing 1/A makes, leaving only
checks 1's gradients and the losses to see it.

usage: accumulate_test.py PCP_BINARY [f32] [bf16]   (default: both)
"""

import glob
import os
import subprocess
import sys
import tempfile

import numpy as np

A, K, B, T, V = 2, 3, 2, 8, 11
MODEL = ["--layers", "1", "--heads", "2", "--width", "16", "--vocab", str(V),
         "--block-size", str(T)]
# One rate per fused step (the lr vector), distinct so that a step reading
# another step's rate would change the result; sum 0.03 = 0.01 x K.
LR = np.array([0.01, 0.005, 0.015], np.float32)
EPSILON = 1e-3
REL_F32 = 1e-5
# bf16: the micro-batch module sums its half-batch bf16 gradients in f32,
# the big-batch module reduces all rows inside its bf16 ops, and the bf16
# forward rounds differently with the batch shape: the gradients differ by
# about 1e-2 of the tensor's largest element (measured 1.5e-2; each is
# ~1e-2 from an f32 run on the same bf16 values). A bug (a missing 1/A, one
# micro-batch dropped) is an error of 0.5 or more.
BF16_REL = 5e-2        # gradients, m, v (relative, as for f32)
BF16_LOSS_ABS = 2e-3   # losses (f32 means of bf16 logits, ~2.4; measured 1.8e-4)
# Parameters and deltas after K steps, per element: one bf16 ulp of the
# parameter (<= 2^-7 |p|; an update of ~lr moves a weight of ~1 by about
# one ulp, so a rounding flip is expected) plus BF16_MOVE of the K steps'
# summed rates, about the most AdamW moves a parameter in K steps (worst
# element measured at 0.29 of this bound with a constant lr).
BF16_MOVE = 0.15


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr)
        raise SystemExit(f"failed: {' '.join(args[:6])}")
    return r.stdout


def bf16_round(x):
    """float -> bf16 bits (uint16), round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def load_output(path):
    a = np.load(path)
    if a.dtype.kind == "V":  # bf16 comes back as '<V2'
        return bf16_value(a.view(np.uint16))
    return a


class Runner:
    def __init__(self, pcp, tmp):
        self.pcp, self.tmp, self.count = pcp, tmp, 0

    def path(self, suffix):
        self.count += 1
        return os.path.join(self.tmp, f"x{self.count}{suffix}")

    def tensor(self, array, element):
        """An --input value holding |array| as |element| (f32, bf16, i32)."""
        if element == "bf16":
            path = self.path(".bin")
            bf16_round(array).tofile(path)
            return "x".join(map(str, array.shape)) + "xbf16=@" + path
        path = self.path(".npy")
        np.save(path, array)
        return "@" + path

    def call(self, vmfb, function, inputs, output_count):
        args = [self.pcp, "run", vmfb, "--function", function,
                "--cpu-threads", "1"]
        for value in inputs:
            args += ["--input", value]
        outs = [self.path(".npy") for _ in range(output_count)]
        for o in outs:
            args += ["--output", "@" + o]
        run(*args)
        return [load_output(o).astype(np.float64) for o in outs]


def compare(name, got, want, rel, failures, worst):
    """Max |got - want| over max |want|, per tensor; records the worst."""
    err, where = 0.0, ""
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape:
            failures.append(f"{name}: shape {g.shape} != {w.shape}")
            return
        scale = max(float(np.max(np.abs(w))), 1e-30)
        diff = np.abs(g - w)
        e = float(np.max(diff)) / scale
        if not e <= err:
            at = np.unravel_index(int(np.argmax(diff)), diff.shape)
            err, where = e, (f"tensor {i} {list(w.shape)} at {list(at)}: "
                             f"{float(g[at]):.6g} vs {float(w[at]):.6g}")
    worst[name] = err
    if not err <= rel:  # also catches NaN
        failures.append(f"{name}: rel err {err:.2e} > {rel:g} ({where})")


def check(pcp, tmp, element, params, ids, targets):
    failures, worst = [], {}
    runner = Runner(pcp, tmp)
    modules = {}
    for tag, batch, accumulate in (("micro", B, A), ("big", A * B, 1)):
        mlir = os.path.join(tmp, f"{element}_{tag}.mlir")
        vmfb = os.path.join(tmp, f"{element}_{tag}.vmfb")
        run(pcp, "model", "gpt", *MODEL, "--batch", str(batch), "--dtype",
            element, "-o", mlir)
        extra = ["--accumulate", str(accumulate)] if accumulate > 1 else []
        run(pcp, "compile", "--program", "diloco", "--inner-steps", str(K),
            "--epsilon", str(EPSILON), "--max-grad-norm", "0", *extra, mlir,
            "-o", vmfb)
        modules[tag] = vmfb
    n = len(params)
    big_ids = ids.reshape(K, A * B, T)
    big_targets = targets.reshape(K, A * B, T)
    p_in = [runner.tensor(p, element) for p in params]
    rel = REL_F32 if element == "f32" else BF16_REL
    loss_tol = None if element == "f32" else BF16_LOSS_ABS

    def losses(name, got, want):
        if loss_tol is None:
            compare(name, [got], [want], rel, failures, worst)
            return
        err = float(np.max(np.abs(got - want)))
        worst[name + " (abs)"] = err
        if not err <= loss_tol:
            failures.append(f"{name}: abs err {err:.2e} > {loss_tol:g}")

    def params_check(name, got, want):
        if element == "f32":
            compare(name, got, want, rel, failures, worst)
            return
        ratio = 0.0
        for g, w in zip(got, want):
            bound = 2.0 ** -7 * np.abs(w) + BF16_MOVE * float(np.sum(LR))
            ratio = max(ratio, float(np.max(np.abs(g - w) / bound)))
        worst[name + " (of the bound)"] = ratio
        if not ratio <= 1.0:
            failures.append(f"{name}: {ratio:.2f} x the bf16 bound")

    # 1. One step's gradients.
    got = runner.call(modules["micro"], "compute_gradients_accumulated",
                      p_in + [runner.tensor(ids[0], "i32"),
                              runner.tensor(targets[0], "i32")], n + 1)
    want = runner.call(modules["big"], "compute_gradients",
                       p_in + [runner.tensor(big_ids[0], "i32"),
                               runner.tensor(big_targets[0], "i32")], n + 1)
    losses("accumulated loss", got[0], want[0])
    compare("accumulated grads", got[1:], want[1:], rel, failures, worst)

    # 2. K fused AdamW steps from zero moments.
    zeros = ["x".join(map(str, p.shape)) + "xf32=0" for p in params] * 2
    rates = runner.tensor(LR, "f32")  # one rate per step
    common = p_in + zeros + ["f32=1", rates]
    got = runner.call(modules["micro"], "train_steps",
                      common + [runner.tensor(ids, "i32"),
                                runner.tensor(targets, "i32")], 3 * n + 2)
    want = runner.call(modules["big"], "train_steps",
                       common + [runner.tensor(big_ids, "i32"),
                                 runner.tensor(big_targets, "i32")],
                       3 * n + 2)
    params_check("train_steps params", got[:n], want[:n])
    for name, lo in (("m", n), ("v", 2 * n)):
        compare(f"train_steps {name}", got[lo:lo + n], want[lo:lo + n], rel,
                failures, worst)
    # After the state: the next step number, then the K losses.
    if float(got[3 * n]) != 1.0 + K:
        failures.append(f"train_steps step out {got[3 * n]} != {1 + K}")
    losses("train_steps losses", got[3 * n + 1], want[3 * n + 1])
    if got[3 * n + 1].shape != (K,):
        failures.append(f"train_steps losses shape {got[3 * n + 1].shape}")

    # 3. One DiLoCo round.
    tail = [rates]
    got = runner.call(modules["micro"], "diloco_round",
                      p_in + tail + [runner.tensor(ids, "i32"),
                                     runner.tensor(targets, "i32")], n + 1)
    want = runner.call(modules["big"], "diloco_round",
                       p_in + tail + [runner.tensor(big_ids, "i32"),
                                      runner.tensor(big_targets, "i32")],
                       n + 1)
    # The bound on the parameters the deltas imply (as for train_steps):
    # a delta p_in - p_out is exact, but p_out itself differs between the
    # two runs by an f32 ulp of p (1.2e-7 for the norm weights near 1),
    # which is ~1e-5 of those tensors' largest delta.
    params_check("diloco_round deltas",
                 [p - d for p, d in zip(params, got[:n])],
                 [p - d for p, d in zip(params, want[:n])])
    losses("diloco_round losses", got[n], want[n])
    # Not vacuous: the round did move the parameters (AdamW steps of ~lr).
    moved = max(float(np.max(np.abs(d))) for d in want[:n])
    if not moved > 0.5 * float(np.min(LR)):
        failures.append(f"the reference round moved nothing ({moved:.3g})")
    print(f"{element}: {n} tensors, A={A} x B={B} vs batch {A * B}, K={K}, "
          f"losses {np.round(want[n], 4).tolist()}")
    for name, err in worst.items():
        print(f"  {name}: {err:.2e}")
    for f in failures:
        print(f"  FAIL {f}")
    return not failures


def main():
    pcp = sys.argv[1]
    elements = sys.argv[2:] or ["f32", "bf16"]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        run(pcp, "model", "gpt", *MODEL, "--batch", str(B), "--init-dir",
            init, "--seed", "3", "-o", os.path.join(tmp, "init.mlir"))
        params = [np.load(f).astype(np.float32)
                  for f in sorted(glob.glob(os.path.join(init, "*.npy")))]
        rng = np.random.default_rng(5)
        ids = rng.integers(0, V, size=(K, A, B, T), dtype=np.int32)
        targets = rng.integers(0, V, size=(K, A, B, T), dtype=np.int32)
        for element in elements:
            if element == "bf16":  # bf16-representable starting values
                params = [bf16_value(bf16_round(p)) for p in params]
            ok = check(pcp, tmp, element, params, ids, targets) and ok
    print(f"accumulate_test: {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
