#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The GRPO objective (@grpo, @grpo_metrics) and its gradient derived by
PCP's autodiff, against an independent JAX implementation.

usage: grpo_jax_test.py PCP_BINARY RL_TOOL

For a tiny GPT and a tiny Qwen3: `rl_tool objective` writes the module
(pcp_workloads_rl_objective_module_emit) and the gradient module the C API derives
from it; `pcp compile --program grad --function grpo --data-args 11
--emit-mlir` must derive the same text from the CLI. Both modules are
compiled once for IREE's CPU backend and run by `pcp run` per case.

The reference is jax.value_and_grad of the objective written here from
the formulas of docs/rl.md over jax_reference.py's forward (nanoGPT / HF
Qwen3, not the MLIR), logp = log_softmax(logits / temperature)[target],
in the PPO "where" form: per token
    A >= 0: min(ratio, 1 + clip_high) A      A < 0: max(ratio, 1 - clip_low) A
which equals min(ratio A, clip(ratio) A) without using either min or clip
the way the module does, minus beta times the k3 KL, masked sum divided by
token_normalizer when > 0, else by the masked token count.

Cases (B = 4 is one group of G = 4; advantages come from `rl_tool
advantages` on the case's rewards): on-policy (ratio 1) with beta 0;
old_logp perturbed (ratio != 1) with beta 0.04; large perturbations where
the clip binds on both sides (the reference's clip fractions must both be
> 0); beta 0.1 with a distant reference policy; every token unmasked; an
all-equal reward group (A = 0) with beta 0 (loss and every gradient
exactly 0) and with beta 0.1 (the KL term alone); a given
token_normalizer. All of these run at temperature 1 (the results are those
from before the temperature argument existed: x / 1 is exact). Three more
run at temperature 0.7 and 1.3, drawn from their own generator so the
cases above keep their inputs: on-policy at T = 0.7 with old_logp from
the reference's logp at 0.7 (mean ratio must be 1 within 1e-5: a learner
at T = 1 would not give that), ratio != 1 with clipping on both sides at
T = 1.3, and beta 0.1 with a distant reference at T = 0.7. Each case masks
prompt
tokens (the first P_b of row b) and padding (the last tokens of some rows).
Ratios within 1e-3 of a clip bound are moved off it, so the two
implementations agree on which side each token is (their log-probs differ
by ~1e-6).

Accumulation (GPT): `--accumulate 2` over two micro-batches of 4 rows
with token_normalizer = (completion tokens of both) / 2 must give the
loss and gradient of the token mean over all 8 rows (the JAX objective on
the 8-row batch): what docs/rl.md says the update loop passes.

Tolerances (f32): loss and metrics within 1e-5 absolute + 1e-5 relative;
each gradient within 1e-4 of its tensor's largest reference magnitude (the
models JAX test's logits tolerance; measured at most 1.2e-5 for the GPT and
1.5e-6 for Qwen3). A wrong sign, a missing clip or KL term or a
sequence-level mean gives errors of order 1e-2 to 1.

Prints one line per case and 'N passed, M failed'.
"""
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax_reference as ref  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

PCP, TOOL = sys.argv[1], sys.argv[2]
B, T, V = 4, 16, 64
CLIP_LOW, CLIP_HIGH = 0.2, 0.28  # DAPO's asymmetric clip
LOSS_TOL = 1e-5
GRAD_TOL = 1e-4

# name, architecture, tool sizes (layers heads kv_heads width), pcp model
# flags, whether to check gradient accumulation
MODELS = [
    ("gpt", "gpt", ["2", "4", "0", "32"],
     ["--layers", "2", "--heads", "4", "--width", "32"], True),
    ("qwen3", "qwen3", ["1", "4", "2", "32"],
     ["--layers", "1", "--heads", "4", "--kv-heads", "2", "--width", "32"],
     False),
]


def run(args, timeout=900):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(args[:3]),
                                                   p.returncode,
                                                   (p.stdout + p.stderr).strip()))
    return p.stdout


def make_parameters(table, rng):
    # O(1) activations, as models_jax_test.py: every op matters.
    values = []
    for e in table["parameters"]:
        shape = tuple(e["shape"])
        if e["init"] == "ones":
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        elif e["init"] == "zeros":
            x = 0.1 * rng.standard_normal(shape)
        elif "wte" in e["name"] or "embed" in e["name"] or "wpe" in e["name"]:
            x = rng.standard_normal(shape)
        else:
            x = rng.standard_normal(shape) / np.sqrt(shape[1])
        values.append(x.astype(np.float32))
    return values


def objective(table):
    """The reference objective and its metrics (independent of the MLIR)."""
    def token_logp(params, ids, targets, temperature=1.0):
        logits = ref.logits(table, params, ids) / temperature
        logp = jax.nn.log_softmax(logits, axis=-1)
        return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]

    def terms(params, ids, targets, mask, old_logp, ref_logp, adv, lo, hi,
              beta, normalizer, temperature):
        logp = token_logp(params, ids, targets, temperature)
        ratio = jnp.exp(logp - old_logp)
        a = adv[:, None]
        surrogate = jnp.where(a >= 0, jnp.minimum(ratio, 1.0 + hi) * a,
                              jnp.maximum(ratio, 1.0 - lo) * a)
        d = ref_logp - logp
        kl = jnp.exp(d) - d - 1.0
        tokens = jnp.maximum(jnp.sum(mask), 1.0)
        divisor = jnp.where(normalizer > 0, normalizer, tokens)
        loss = -jnp.sum(mask * (surrogate - beta * kl)) / divisor
        low = jnp.where((ratio < 1.0 - lo) & (a < 0), 1.0, 0.0)
        high = jnp.where((ratio > 1.0 + hi) & (a > 0), 1.0, 0.0)
        metrics = [jnp.sum(mask * m) / tokens for m in (kl, low, high, ratio)]
        return loss, (metrics, logp)

    return token_logp, jax.value_and_grad(terms, has_aux=True)


def mask_for(rng, prompt_max=6):
    """Prompt tokens (the first P_b) and trailing padding on some rows."""
    mask = np.zeros((B, T), np.float32)
    for b in range(B):
        p = int(rng.integers(1, prompt_max + 1))
        end = T - (int(rng.integers(1, 5)) if b % 2 else 0)
        mask[b, p:end] = 1.0
    return mask


def advantages(tmp, rewards):
    src, dst = os.path.join(tmp, "r.f32"), os.path.join(tmp, "a.f32")
    np.asarray(rewards, "<f4").tofile(src)
    run([TOOL, "advantages", "4", "1e-4", "1", src, dst])
    return np.fromfile(dst, "<f4")


def away_from_bounds(logp, old):
    """Moves old_logp so no ratio sits within 1e-3 of a clip bound."""
    for _ in range(4):
        ratio = np.exp(logp - old)
        near = ((np.abs(ratio - (1 - CLIP_LOW)) < 1e-3) |
                (np.abs(ratio - (1 + CLIP_HIGH)) < 1e-3))
        if not near.any():
            break
        old = np.where(near, old + 0.01, old).astype(np.float32)
    return old


def cases(tmp, rng, logp):
    """(name, mask, old_logp, ref_logp, advantages, beta, normalizer,
    expect, temperature); normalizer 0 = the batch's token count. All at
    temperature 1, drawn as before the temperature argument existed."""
    rewards = rng.standard_normal(B)
    noise = lambda s: (s * rng.standard_normal((B, T))).astype(np.float32)
    out = []
    out.append(("on-policy beta=0", mask_for(rng), logp.copy(),
                logp + noise(0.3), advantages(tmp, rewards), 0.0, 0.0, None))
    out.append(("ratio!=1 beta=0.04", mask_for(rng),
                away_from_bounds(logp, logp + noise(0.1)), logp + noise(0.2),
                advantages(tmp, rng.standard_normal(B)), 0.04, 0.0, None))
    out.append(("clip both sides beta=0.02", mask_for(rng),
                away_from_bounds(logp, logp + noise(0.6)), logp + noise(0.2),
                advantages(tmp, [1.0, 0.0, 2.0, -1.5]), 0.02, 0.0, "clips"))
    out.append(("far reference beta=0.1", mask_for(rng),
                away_from_bounds(logp, logp + noise(0.1)), logp + noise(1.0),
                advantages(tmp, rng.standard_normal(B)), 0.1, 0.0, None))
    out.append(("no mask beta=0.04", np.ones((B, T), np.float32),
                away_from_bounds(logp, logp + noise(0.3)), logp + noise(0.2),
                advantages(tmp, rng.standard_normal(B)), 0.04, 0.0, None))
    equal = advantages(tmp, [0.5, 0.5, 0.5, 0.5])
    out.append(("all-equal group beta=0", mask_for(rng),
                away_from_bounds(logp, logp + noise(0.3)), logp + noise(0.2),
                equal, 0.0, 0.0, "zero"))
    out.append(("all-equal group beta=0.1", mask_for(rng),
                away_from_bounds(logp, logp + noise(0.3)), logp + noise(0.5),
                equal, 0.1, 0.0, "kl-only"))
    out.append(("token_normalizer 50 beta=0.04", mask_for(rng),
                away_from_bounds(logp, logp + noise(0.3)), logp + noise(0.2),
                advantages(tmp, rng.standard_normal(B)), 0.04, 50.0, None))
    return [c + (1.0,) for c in out]


def temperature_cases(tmp, rng, logp_at):
    """Cases at temperature != 1; logp_at(T) is the reference's logp of the
    targets at T (what a rollout sampled at T records as old_logp)."""
    noise = lambda s: (s * rng.standard_normal((B, T))).astype(np.float32)
    out = []
    cold, hot = logp_at(0.7), logp_at(1.3)
    out.append(("on-policy T=0.7 beta=0.04", mask_for(rng), cold.copy(),
                cold + noise(0.2), advantages(tmp, rng.standard_normal(B)),
                0.04, 0.0, "ratio-one", 0.7))
    out.append(("clip both sides T=1.3 beta=0.02", mask_for(rng),
                away_from_bounds(hot, hot + noise(0.6)), hot + noise(0.2),
                advantages(tmp, [1.0, 0.0, 2.0, -1.5]), 0.02, 0.0, "clips",
                1.3))
    out.append(("far reference T=0.7 beta=0.1", mask_for(rng),
                away_from_bounds(cold, cold + noise(0.1)), cold + noise(1.0),
                advantages(tmp, rng.standard_normal(B)), 0.1, 0.0, None, 0.7))
    return out


class Runner:
    def __init__(self, tmp):
        self.tmp, self.count = tmp, 0

    def save(self, array):
        self.count += 1
        path = os.path.join(self.tmp, "x%d.npy" % self.count)
        np.save(path, array)
        return "@" + path

    def call(self, vmfb, function, inputs, outputs):
        args = [PCP, "run", vmfb, "--function", function, "--cpu-threads", "1"]
        for x in inputs:
            args += ["--input", self.save(x)]
        paths = []
        for _ in range(outputs):
            self.count += 1
            paths.append(os.path.join(self.tmp, "o%d.npy" % self.count))
            args += ["--output", "@" + paths[-1]]
        run(args)
        return [np.load(p) for p in paths]


def close(got, want, tol=LOSS_TOL):
    return abs(float(got) - float(want)) <= tol * (1.0 + abs(float(want)))


def check_model(tmp, name, arch, sizes, flags, accumulate, seed):
    mlir = os.path.join(tmp, name + ".mlir")
    derived = os.path.join(tmp, name + ".grad.mlir")
    run([TOOL, "objective", arch] + sizes + [str(V), str(T), str(B), mlir,
                                             derived])
    cli = os.path.join(tmp, name + ".cli.mlir")
    run([PCP, "compile", "--program", "grad", mlir, "--function", "grpo",
         "--data-args", "11", "--emit-mlir", cli])
    results = []
    with open(derived) as f, open(cli) as g:
        same = f.read() == g.read()
    results.append(("%s: C API and `pcp compile` derive the same module"
                    % name, same, ""))
    pjson = os.path.join(tmp, name + ".json")
    run([PCP, "model", arch] + flags + ["--vocab", str(V), "--block-size",
                                        str(T), "--batch", str(B), "-o",
                                        os.path.join(tmp, name + ".m.mlir"),
                                        "--params-json", pjson])
    with open(pjson) as f:
        table = json.load(f)
    grad_vmfb = os.path.join(tmp, name + ".grad.vmfb")
    obj_vmfb = os.path.join(tmp, name + ".vmfb")
    run([PCP, "compile", derived, "-o", grad_vmfb])
    run([PCP, "compile", mlir, "-o", obj_vmfb])

    rng = np.random.default_rng(seed)
    params = make_parameters(table, rng)
    ids = rng.integers(0, V, size=(B, T), dtype=np.int32)
    targets = np.roll(ids, -1, axis=1)
    targets[:, -1] = rng.integers(0, V, size=B)
    jparams = [jnp.asarray(p) for p in params]
    token_logp, value_and_grad = objective(table)
    logp = np.asarray(token_logp(jparams, ids, targets), np.float32)
    runner = Runner(tmp)
    scalars = [np.float32(CLIP_LOW), np.float32(CLIP_HIGH)]
    logp_at = lambda temp: np.asarray(token_logp(jparams, ids, targets, temp),
                                      np.float32)
    all_cases = cases(tmp, rng, logp) + temperature_cases(
        tmp, np.random.default_rng(seed + 1000), logp_at)
    for case, mask, old, reflp, adv, beta, norm, expect, temp in all_cases:
        data = [ids, targets, mask, old.astype(np.float32),
                reflp.astype(np.float32), adv.astype(np.float32)] + scalars + [
                    np.float32(beta), np.float32(norm), np.float32(temp)]
        (loss, (metrics, ref_logp_out)), grads = value_and_grad(
            jparams, *[jnp.asarray(x) for x in data])
        got = runner.call(grad_vmfb, "compute_gradients",
                          [np.asarray(p) for p in params] + data,
                          1 + len(params))
        got_m = runner.call(obj_vmfb, "grpo_metrics",
                            [np.asarray(p) for p in params] + data, 6)
        problems = []
        if not close(got[0], loss):
            problems.append("loss %.7g vs %.7g" % (got[0], loss))
        if not close(got_m[0], loss):
            problems.append("metrics loss %.7g vs %.7g" % (got_m[0], loss))
        for label, g, w in zip(("mean_kl", "clip_low", "clip_high",
                                "mean_ratio"), got_m[1:5], metrics):
            if not close(g, w):
                problems.append("%s %.7g vs %.7g" % (label, g, w))
        logp_err = float(np.max(np.abs(got_m[5] - np.asarray(ref_logp_out))))
        if logp_err > 1e-4:
            problems.append("logp err %.2e" % logp_err)
        worst = 0.0
        for e, g, w in zip(table["parameters"], got[1:], grads):
            w = np.asarray(w)
            scale = float(np.max(np.abs(w)))
            err = float(np.max(np.abs(g - w)))
            if expect == "zero":
                if err != 0.0 or scale != 0.0:
                    problems.append("%s gradient not zero (%.2e)" % (e["name"],
                                                                    err))
                continue
            rel = err / scale if scale > 0 else err
            worst = max(worst, rel)
            if not (scale > 0 and rel <= GRAD_TOL):
                problems.append("d%s rel err %.2e (max %.2e)" % (e["name"],
                                                                rel, scale))
        if expect == "zero" and float(got[0]) != 0.0:
            problems.append("loss %.3g, want exactly 0" % got[0])
        if expect == "ratio-one" and not (abs(float(got_m[4]) - 1.0) <= 1e-5):
            problems.append("on-policy mean ratio %.7g, want 1" % got_m[4])
        if expect == "clips" and not (metrics[1] > 0 and metrics[2] > 0):
            problems.append("case does not clip both sides (%.3f, %.3f)" % (
                metrics[1], metrics[2]))
        detail = ("loss %.6f, kl %.4f, clip low %.3f high %.3f, ratio %.4f, "
                  "grad rel err %.2e (tol %.0e)" % (
                      loss, metrics[0], metrics[1], metrics[2], metrics[3],
                      worst, GRAD_TOL))
        if len(problems) > 4:  # a broken objective fails every tensor
            problems = problems[:4] + ["%d more" % (len(problems) - 4)]
        results.append(("%s: %s" % (name, case), not problems,
                        "; ".join(problems) if problems else detail))
    if accumulate:
        results.append(check_accumulation(tmp, name, mlir, table, params,
                                          value_and_grad, token_logp, rng))
    return results


def check_accumulation(tmp, name, mlir, table, params, value_and_grad,
                       token_logp, rng):
    """Two micro-batches of B rows with token_normalizer = total / 2 equal
    the token mean of the 2B-row batch."""
    acc_vmfb = os.path.join(tmp, name + ".acc.vmfb")
    run([PCP, "compile", "--program", "grad", "--accumulate", "2", mlir,
         "--function", "grpo", "--data-args", "11", "-o", acc_vmfb])
    ids = rng.integers(0, V, size=(2 * B, T), dtype=np.int32)
    targets = np.roll(ids, -1, axis=1)
    jparams = [jnp.asarray(p) for p in params]
    logp = np.asarray(token_logp(jparams, ids, targets), np.float32)
    # Micro-batch 0 gets many more completion tokens than micro-batch 1, so
    # a mean of the two micro-batch means would differ from the token mean.
    mask = np.zeros((2 * B, T), np.float32)
    mask[:B, 2:] = 1.0
    mask[B:, T - 3:] = 1.0
    old = away_from_bounds(logp, logp + (0.3 * rng.standard_normal(
        (2 * B, T))).astype(np.float32))
    reflp = logp + (0.2 * rng.standard_normal((2 * B, T))).astype(np.float32)
    adv = advantages(tmp, rng.standard_normal(2 * B))
    beta = np.float32(0.04)
    lo, hi = np.float32(CLIP_LOW), np.float32(CLIP_HIGH)
    total = float(mask.sum())
    (loss, _), grads = value_and_grad(
        jparams, *[jnp.asarray(x) for x in (ids, targets, mask, old, reflp,
                                            adv, lo, hi, beta,
                                            np.float32(0.0),
                                            np.float32(1.0))])
    split = lambda x: np.asarray(x).reshape((2, B) + np.asarray(x).shape[1:])
    stack = lambda x: np.full((2,), x, np.float32)
    data = [split(ids), split(targets), split(mask), split(old),
            split(reflp), split(adv), stack(lo), stack(hi), stack(beta),
            stack(total / 2.0), stack(1.0)]
    got = Runner(tmp).call(acc_vmfb, "compute_gradients_accumulated",
                           [np.asarray(p) for p in params] + data,
                           1 + len(params))
    problems, worst = [], 0.0
    if not close(got[0], loss):
        problems.append("loss %.7g vs %.7g" % (got[0], loss))
    for e, g, w in zip(table["parameters"], got[1:], grads):
        w = np.asarray(w)
        rel = float(np.max(np.abs(g - w))) / float(np.max(np.abs(w)))
        worst = max(worst, rel)
        if not rel <= GRAD_TOL:
            problems.append("d%s rel err %.2e" % (e["name"], rel))
    return ("%s: --accumulate 2 with token_normalizer = tokens / 2" % name,
            not problems, "; ".join(problems[:4]) if problems else
            "loss %.6f (%d + %d tokens), grad rel err %.2e (tol %.0e)" % (
                loss, int(mask[:B].sum()), int(mask[B:].sum()), worst,
                GRAD_TOL))


def main():
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("PCP_CACHE_DIR", os.path.join(tmp, "cache"))
        for i, (name, arch, sizes, flags, accumulate) in enumerate(MODELS):
            try:
                results = check_model(tmp, name, arch, sizes, flags,
                                      accumulate, 100 + i)
            except Exception as exc:  # a failed command fails the model
                results = [(name, False, str(exc))]
            for label, ok, detail in results:
                print("%s %s%s" % ("ok" if ok else "FAIL", label,
                                   (": " + detail) if detail else ""))
                passed += ok
                failed += not ok
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
