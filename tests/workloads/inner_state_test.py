#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per-step learning rates and the DiLoCo round's inner state against an
independent reference: an AdamW loop in NumPy (float64) over gradients
from jax.grad of tests/models/jax_reference.py (written from the
architecture, not from the emitted MLIR; f32) or, for bf16, from the
module's own @compute_gradients at the reference's parameters.

usage: inner_state_test.py PCP_BINARY [f32] [bf16]   (default: both)

A 1-layer built-in GPT (`pcp model gpt`, seeded parameters), compiled with
`pcp compile --program diloco --inner-steps K` twice: `--inner-state keep`
and `--inner-state reset` (their artifact cache keys must differ). Checked
per element type, each with a different rate at every inner step:

(a) @train_steps(params, 0, 0, step 1, lr[K], data) of the keep module
    equals K NumPy AdamW steps at rates lr[0..K-1]: params, m, v, the
    returned step (1 + K) and the K losses.
(b) Two consecutive keep rounds equal one NumPy run of 2K AdamW steps
    whose moments and step number continue across the round boundary while
    the parameters restart from the global ones passed in (as DiLoCo does):
    round 1 from P0 with zero moments at step 1, round 2 from other global
    parameters P1 with round 1's m, v and step as the device returned them;
    deltas (params_in - params_out), m, v, step and losses of both rounds.
(c) One reset round from P1 at rates lr2 equals K NumPy steps from zero
    moments at step 1 (the stateless round of before, with the lr vector).

Each check also runs its reference with a plausible mistake (every step at
lr[0]; round 2 with fresh moments; the reset round with round 1's moments)
and requires the device result to be at least MISTAKE_FACTOR times further
from that than the tolerance, so the check could fail.

Tolerances. f32: REL_F32 relative to each tensor's largest magnitude (for
the parameters, of how far the run moved them; measured ~1e-5 there, the
device and JAX gradients differ by ~1e-6 relative). bf16: the bounds the
existing bf16 tests use (train_bf16_test.py: losses within 0.01 absolute;
accumulate_test.py: m and v within 5e-2 relative, parameters within one
bf16 ulp of the parameter plus 0.15 of the summed rates); the reference
rounds each new parameter to bf16 as the program does. Its gradients are
the module's: JAX's bf16 gradients round differently from IREE's (~1e-2 of
the largest gradient), and AdamW's first steps turn that into moves of a
fraction of lr on small-gradient weights of either sign: that took the
reset round to 0.98 of the bound above (measured), for reasons that have
nothing to do with what is under test here: the optimizer, the rates and
the state, whose reference stays independent (f32 checks the gradients against JAX, as do
tests/compile/autodiff_models_test.py and the bf16 models tests).

AdamW epsilon is 1e-3 (not 1e-8), as in accumulate_test.py: the key part
of the attention bias has a gradient that is zero in real arithmetic, the
device and JAX each compute different rounding noise of ~1e-9 there, and
epsilon 1e-8 turns noise into steps of +-lr of either sign.
"""

import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "models"))

K, B, T, V = 3, 2, 8, 11
MODEL = ["--layers", "1", "--heads", "2", "--width", "16", "--vocab", str(V),
         "--block-size", str(T), "--batch", str(B)]
# AdamW as compiled below (see the docstring for epsilon).
B1, B2, EPS, WD, CLIP = 0.9, 0.95, 1e-3, 0.1, 1.0
# Round 1's and round 2's rates: a warmup then a decay, all distinct.
LR1 = np.array([0.004, 0.012, 0.02], np.float32)
LR2 = np.array([0.016, 0.009, 0.003], np.float32)
REL_F32 = 1e-4
BF16_REL = 5e-2
BF16_LOSS_ABS = 1e-2
BF16_MOVE = 0.15
MISTAKE_FACTOR = 3.0


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr)
        raise SystemExit(f"failed: {' '.join(args[:6])}")
    return r


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
    """`pcp run` with inputs and outputs through files."""

    def __init__(self, pcp, tmp):
        self.pcp, self.tmp, self.count = pcp, tmp, 0

    def path(self, suffix):
        self.count += 1
        return os.path.join(self.tmp, f"x{self.count}{suffix}")

    def tensor(self, array, element):
        if element == "bf16":
            path = self.path(".bin")
            bf16_round(array).tofile(path)
            return "x".join(map(str, array.shape)) + "xbf16=@" + path
        path = self.path(".npy")
        np.save(path, array.astype({"f32": np.float32, "i32": np.int32}[
            element]))
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


def jax_gradients(table):
    """(loss, gradients) of the f32 model by jax.grad of the independent
    reference."""
    import jax
    import jax.numpy as jnp
    import jax_reference as ref
    value_and_grad = jax.jit(jax.value_and_grad(ref.loss_fn(table)))

    def gradients(params, ids, targets):
        jp = [jnp.asarray(p, dtype=jnp.float32) for p in params]
        loss, grads = value_and_grad(jp, jnp.asarray(ids),
                                     jnp.asarray(targets))
        return float(loss), [np.asarray(g).astype(np.float64) for g in grads]
    return gradients


def module_gradients(runner, vmfb, element):
    """(loss, gradients) by the module's own @compute_gradients at the
    reference's parameters (bf16: see the docstring)."""
    def gradients(params, ids, targets):
        out = runner.call(vmfb, "compute_gradients",
                          [runner.tensor(p, element) for p in params] +
                          [runner.tensor(ids, "i32"),
                           runner.tensor(targets, "i32")], len(params) + 1)
        return float(out[0]), out[1:]
    return gradients


class Reference:
    """NumPy AdamW in float64 over the gradients of |gradients|."""

    def __init__(self, gradients, element):
        self.gradients = gradients
        self.element = element

    def steps(self, params, m, v, step, rates, ids, targets):
        """len(rates) AdamW steps from (params, m, v) at step number |step|;
        returns params, m, v, the next step number and the losses."""
        p = [x.astype(np.float64) for x in params]
        m = [x.astype(np.float64) for x in m]
        v = [x.astype(np.float64) for x in v]
        losses = []
        for s, rate in enumerate(rates):
            loss, grads = self.gradients(p, ids[s], targets[s])
            losses.append(loss)
            t = step + s
            norm = np.sqrt(sum(np.sum(np.square(g)) for g in grads))
            scale = CLIP / max(norm, CLIP)
            rate = float(rate)
            for i, g in enumerate(grads):
                g = g * scale
                m[i] = B1 * m[i] + (1.0 - B1) * g
                v[i] = B2 * v[i] + (1.0 - B2) * np.square(g)
                m_hat = m[i] / (1.0 - B1 ** t)
                v_hat = v[i] / (1.0 - B2 ** t)
                p[i] = p[i] - rate * (m_hat / (np.sqrt(v_hat) + EPS) +
                                      WD * p[i])
                if self.element == "bf16":  # the program rounds p' to bf16
                    p[i] = bf16_value(bf16_round(p[i])).astype(np.float64)
        return p, m, v, step + len(rates), np.array(losses)


class Checker:
    def __init__(self, element):
        self.element = element
        self.failures = []
        self.lines = []

    def distance(self, kind, got, want, rates):
        """The error of |got| against |want| as a fraction of its tolerance
        (<= 1 passes). kind: params (bf16), moves (f32: the parameters'
        movements), moments or losses."""
        if kind == "losses":
            err = float(np.max(np.abs(got - want)))
            if self.element == "f32":
                return err / (REL_F32 * max(float(np.max(np.abs(want))),
                                            1e-30))
            return err / BF16_LOSS_ABS
        worst = 0.0
        for g, w in zip(got, want):
            if g.shape != w.shape:
                return float("inf")
            if self.element == "bf16" and kind == "params":
                bound = 2.0 ** -7 * np.abs(w) + BF16_MOVE * float(
                    np.sum(rates))
                worst = max(worst, float(np.max(np.abs(g - w) / bound)))
            else:
                rel = REL_F32 if self.element == "f32" else BF16_REL
                scale = max(float(np.max(np.abs(w))), 1e-30)
                worst = max(worst, float(np.max(np.abs(g - w))) /
                            (rel * scale))
        return worst

    def check(self, name, kind, got, want, rates, mistake=None):
        d = self.distance(kind, got, want, rates)
        line = f"{name}: {d:.2e} of the tolerance"
        ok = d <= 1.0  # also false for NaN
        if mistake is not None:
            dm = self.distance(kind, got, mistake, rates)
            line += f", {dm:.1f} x from the mistaken reference"
            if not dm >= MISTAKE_FACTOR:
                ok = False
                line += " (too close: the check could not fail)"
        self.lines.append(("ok   " if ok else "FAIL ") + line)
        if not ok:
            self.failures.append(name)

    def params(self, name, start, got, want, rates, mistake):
        """Parameters after a run from |start|: in f32 their movements
        (got - start against want - start, so the tolerance is relative to
        how far the run moved them, not to the parameters' size), in bf16
        the parameters under the bf16 bound."""
        if self.element == "f32":
            def moves(ps):
                return [x - s0 for x, s0 in zip(ps, start)]
            self.check(name, "moves", moves(got), moves(want), rates,
                       moves(mistake))
        else:
            self.check(name, "params", got, want, rates, mistake)

    def equal(self, name, got, want):
        ok = got == want
        self.lines.append(f"{'ok   ' if ok else 'FAIL '}{name}: {got} "
                          f"(want {want})")
        if not ok:
            self.failures.append(name)


def compile_module(pcp, tmp, mlir, element, inner_state):
    vmfb = os.path.join(tmp, f"{element}_{inner_state}.vmfb")
    r = run(pcp, "compile", "--program", "diloco", "--inner-steps", str(K),
            "--inner-state", inner_state, "--beta1", str(B1), "--beta2",
            str(B2), "--epsilon", str(EPS), "--weight-decay", str(WD),
            "--max-grad-norm", str(CLIP), "--cache-dir",
            os.path.join(tmp, "cache"), mlir, "-o", vmfb)
    key = re.search(r"key ([0-9a-f]+)", r.stderr)
    return vmfb, key.group(1) if key else None


def check(pcp, tmp, element, params0, table, ids, targets):
    c = Checker(element)
    mlir = os.path.join(tmp, f"{element}.mlir")
    run(pcp, "model", "gpt", *MODEL, "--dtype", element, "-o", mlir)
    keep, keep_key = compile_module(pcp, tmp, mlir, element, "keep")
    reset, reset_key = compile_module(pcp, tmp, mlir, element, "reset")
    c.equal("keep and reset have different artifact keys",
            keep_key is not None and reset_key is not None and
            keep_key != reset_key, True)
    runner = Runner(pcp, tmp)
    ref = Reference(jax_gradients(table) if element == "f32" else
                    module_gradients(runner, keep, element), element)
    n = len(params0)
    zeros = [np.zeros(p.shape) for p in params0]
    zero_inputs = ["x".join(map(str, p.shape)) + "xf32=0" for p in params0]

    def inputs(params):
        return [runner.tensor(p, element) for p in params]

    def data(r):
        return [runner.tensor(ids[r], "i32"), runner.tensor(targets[r], "i32")]

    def rates(lr):
        return runner.tensor(lr, "f32")

    # (a) @train_steps at K distinct rates.
    got = runner.call(keep, "train_steps",
                      inputs(params0) + zero_inputs * 2 +
                      ["f32=1", rates(LR1)] + data(0), 3 * n + 2)
    p, m, v, step, losses = ref.steps(params0, zeros, zeros, 1, LR1, ids[0],
                                      targets[0])
    flat = ref.steps(params0, zeros, zeros, 1, [LR1[0]] * K, ids[0],
                     targets[0])
    c.params("(a) train_steps params", params0, got[:n], p, LR1, flat[0])
    c.check("(a) train_steps m", "moments", got[n:2 * n], m, LR1)
    c.check("(a) train_steps v", "moments", got[2 * n:3 * n], v, LR1)
    c.equal("(a) train_steps step out", float(got[3 * n]), 1.0 + K)
    c.check("(a) train_steps losses", "losses", got[3 * n + 1], losses, LR1)

    # (b) Round 1 from P0, fresh state.
    r1 = runner.call(keep, "diloco_round",
                     inputs(params0) + zero_inputs * 2 +
                     ["f32=1", rates(LR1)] + data(0), 3 * n + 2)
    c.params("(b) round 1 deltas", params0,
             [x - d for x, d in zip(params0, r1[:n])], p, LR1, flat[0])
    c.check("(b) round 1 m", "moments", r1[n:2 * n], m, LR1)
    c.check("(b) round 1 v", "moments", r1[2 * n:3 * n], v, LR1)
    c.equal("(b) round 1 step out", float(r1[3 * n]), 1.0 + K)
    c.check("(b) round 1 losses", "losses", r1[3 * n + 1], losses, LR1)
    # The outer step's new global parameters: P0 moved against the deltas
    # (any parameters other than round 1's result would do).
    params1 = [x - 0.7 * d for x, d in zip(params0, r1[:n])]
    if element == "bf16":
        params1 = [bf16_value(bf16_round(x)).astype(np.float64)
                   for x in params1]
    # Round 2 from P1 with the state round 1 returned (as a worker keeps
    # it); the reference continues its own m, v and step.
    r2 = runner.call(keep, "diloco_round",
                     inputs(params1) +
                     [runner.tensor(x, "f32") for x in r1[n:3 * n]] +
                     [f"f32={float(r1[3 * n])}", rates(LR2)] + data(1),
                     3 * n + 2)
    p2, m2, v2, step2, losses2 = ref.steps(params1, m, v, step, LR2, ids[1],
                                           targets[1])
    fresh = ref.steps(params1, zeros, zeros, 1, LR2, ids[1], targets[1])
    c.params("(b) round 2 deltas", params1,
             [x - d for x, d in zip(params1, r2[:n])], p2, LR2, fresh[0])
    c.check("(b) round 2 m", "moments", r2[n:2 * n], m2, LR2, fresh[1])
    c.check("(b) round 2 v", "moments", r2[2 * n:3 * n], v2, LR2, fresh[2])
    c.equal("(b) round 2 step out", float(r2[3 * n]), 1.0 + 2 * K)
    c.check("(b) round 2 losses", "losses", r2[3 * n + 1], losses2, LR2)

    # (c) A reset round from P1: fresh moments whatever ran before.
    r3 = runner.call(reset, "diloco_round",
                     inputs(params1) + [rates(LR2)] + data(1), n + 1)
    c.params("(c) reset round deltas", params1,
             [x - d for x, d in zip(params1, r3[:n])], fresh[0], LR2, p2)
    c.check("(c) reset round losses", "losses", r3[n], fresh[4], LR2)

    print(f"{element}: {n} tensors, K={K}, lr {LR1.tolist()} then "
          f"{LR2.tolist()}, losses {np.round(r1[3 * n + 1], 4).tolist()} "
          f"then {np.round(r2[3 * n + 1], 4).tolist()}")
    for line in c.lines:
        print("  " + line)
    return not c.failures


def main():
    pcp = sys.argv[1]
    elements = sys.argv[2:] or ["f32", "bf16"]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        pjson = os.path.join(tmp, "p.json")
        run(pcp, "model", "gpt", *MODEL, "--init-dir", init, "--seed", "3",
            "--params-json", pjson, "-o", os.path.join(tmp, "init.mlir"))
        with open(pjson) as f:
            table = json.load(f)
        params = [np.load(f).astype(np.float64)
                  for f in sorted(glob.glob(os.path.join(init, "*.npy")))]
        rng = np.random.default_rng(5)
        ids = rng.integers(0, V, size=(2, K, B, T), dtype=np.int32)
        targets = rng.integers(0, V, size=(2, K, B, T), dtype=np.int32)
        for element in elements:
            start = params
            if element == "bf16":  # bf16-representable starting values
                start = [bf16_value(bf16_round(p)).astype(np.float64)
                         for p in params]
            ok = check(pcp, tmp, element, start, table, ids, targets) and ok
    print(f"inner_state_test: {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
