#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Whole-model gradients, AdamW and fused steps of `pcp compile --program`.

- A 2-layer MLP and a one-block causal transformer exported from JAX by
  tools/export_jax.py: @compute_gradients against jax.grad (f32, relative
  error <= 1e-4 per parameter). The transformer keeps JAX's func.call
  helpers, which pcp's autodiff inlines.
- @apply_optimizer (AdamW, bias correction, global-norm clipping) over
  several steps against a NumPy implementation.
- @train_steps with k=4 and a different rate per step (lr vector) against
  4 separate @compute_gradients + @apply_optimizer calls with those rates;
  the step it returns is step + k.
- An op without a VJP rule: `pcp compile --program grad` exits 1 naming the
  op and its location.
Modules are compiled by `pcp compile` (artifact cache) and run on IREE's CPU
driver. Closes with 'N passed, M failed'.
"""
import os
import subprocess
import sys
import tempfile

import jax
import numpy as np
import iree.runtime as ireert

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
import export_jax  # noqa: E402

PCP = os.environ["PCP_BINARY"]
K = 4
ADAM = dict(beta1=0.9, beta2=0.95, epsilon=1e-8, weight_decay=0.1,
            max_grad_norm=0.5)
results = []


def check(name, ok, detail):
    results.append(ok)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")


def pcp(*args):
    return subprocess.run([PCP, *args], capture_output=True, text=True)


def build(tmp, name, text, program, inner_steps=0):
    src = os.path.join(tmp, f"{name}.mlir")
    with open(src, "w") as f:
        f.write(text)
    out = os.path.join(tmp, f"{name}.vmfb")
    args = ["compile", "--program", program, "--data-args", "2", src, "-o", out,
            "--emit-mlir", os.path.join(tmp, f"{name}.{program}.mlir")]
    if program == "train":
        args += ["--inner-steps", str(inner_steps), "--beta1",
                 str(ADAM["beta1"]), "--beta2", str(ADAM["beta2"]),
                 "--epsilon", str(ADAM["epsilon"]), "--weight-decay",
                 str(ADAM["weight_decay"]), "--max-grad-norm",
                 str(ADAM["max_grad_norm"])]
    r = pcp(*args)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit(f"pcp compile failed for {name}")
    with open(out, "rb") as f:
        return ireert.load_vm_flatbuffer(f.read(), driver="local-task")


def rel_err(got, ref):
    return float(np.max(np.abs(got - ref))) / max(float(np.max(np.abs(ref))),
                                                  1e-30)


def check_gradients(name, module, loss_fn, params, data):
    out = module.compute_gradients(*params, *data)
    loss = float(np.asarray(out[0]))
    grads = [np.asarray(g) for g in out[1:]]
    ref_loss = float(loss_fn(*params, *data))
    ref = jax.grad(loss_fn, argnums=tuple(range(len(params))))(*params, *data)
    worst = max(rel_err(g, np.asarray(r)) for g, r in zip(grads, ref))
    check(f"{name} loss", abs(loss - ref_loss) <= 1e-5 * abs(ref_loss),
          f"{loss:.6f} vs jax {ref_loss:.6f}")
    check(f"{name} gradients vs jax.grad", worst <= 1e-4,
          f"{len(grads)} params, max rel err {worst:.2e}")


def numpy_adamw(params, grads, m, v, step, lr):
    norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2))
                       for g in grads))
    c = ADAM["max_grad_norm"]
    scale = c / max(norm, c)
    b1, b2 = ADAM["beta1"], ADAM["beta2"]
    out_p, out_m, out_v = [], [], []
    for p, g, mi, vi in zip(params, grads, m, v):
        g = g * scale
        mi = b1 * mi + (1 - b1) * g
        vi = b2 * vi + (1 - b2) * g * g
        m_hat = mi / (1 - b1 ** step)
        v_hat = vi / (1 - b2 ** step)
        p = p - lr * (m_hat / (np.sqrt(v_hat) + ADAM["epsilon"]) +
                      ADAM["weight_decay"] * p)
        out_p.append(p)
        out_m.append(mi)
        out_v.append(vi)
    return out_p, out_m, out_v


def split3(out, n):
    arrays = [np.asarray(a) for a in out]
    return arrays[:n], arrays[n:2 * n], arrays[2 * n:3 * n]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        # MLP: gradients, AdamW, fused steps.
        loss_fn, params, data = export_jax.mlp_model(seed=1)
        n = len(params)
        mlp = build(tmp, "mlp", export_jax.export(loss_fn, params, data),
                    "train", inner_steps=K)
        check_gradients("mlp", mlp, loss_fn, params, data)

        rng = np.random.default_rng(3)
        p = [x.astype(np.float64) for x in params]
        m = [np.zeros_like(x) for x in p]
        v = [np.zeros_like(x) for x in p]
        dev_p = list(params)
        dev_m = [np.zeros_like(x) for x in params]
        dev_v = [np.zeros_like(x) for x in params]
        worst = 0.0
        for step in range(1, 4):
            # Large gradients on the first step so clipping engages.
            grads = [(rng.standard_normal(x.shape) * (3.0 if step == 1 else 0.05))
                     .astype(np.float32) for x in params]
            lr = 0.01
            p, m, v = numpy_adamw(p, [g.astype(np.float64) for g in grads],
                                  m, v, step, lr)
            out = mlp.apply_optimizer(*dev_p, *grads, *dev_m, *dev_v,
                                      np.float32(step), np.float32(lr))
            dev_p, dev_m, dev_v = split3(out, n)
            for a, b in zip(dev_p + dev_m + dev_v, p + m + v):
                worst = max(worst, float(np.max(np.abs(a - b))) /
                            max(float(np.max(np.abs(b))), 1e-12))
        check("apply_optimizer vs NumPy AdamW (3 steps, clipping)",
              worst <= 1e-5, f"max rel err {worst:.2e}")

        stacked = [np.stack([d] * K) for d in data]
        batches = []
        for s in range(K):
            x = rng.standard_normal(data[0].shape).astype(np.float32)
            y = rng.integers(0, 5, data[1].shape).astype(np.int32)
            batches.append((x, y))
        stacked = [np.stack([b[0] for b in batches]),
                   np.stack([b[1] for b in batches])]
        zeros = [np.zeros_like(x) for x in params]
        # Distinct rates, so a step that read another step's rate shows.
        rates = np.array([0.05, 0.01, 0.08, 0.03], np.float32)[:K]
        out = mlp.train_steps(*params, *zeros, *zeros, np.float32(1), rates,
                              *stacked)
        fused = [np.asarray(a) for a in out]
        sp, sm, sv = list(params), list(zeros), list(zeros)
        losses = []
        for s in range(K):
            g = mlp.compute_gradients(*sp, *batches[s])
            losses.append(float(np.asarray(g[0])))
            o = mlp.apply_optimizer(*sp, *[np.asarray(x) for x in g[1:]], *sm,
                                    *sv, np.float32(1 + s), rates[s])
            sp, sm, sv = split3(o, n)
        worst = max(rel_err(a, b) for a, b in zip(fused[:3 * n], sp + sm + sv))
        loss_err = float(np.max(np.abs(fused[3 * n + 1] - np.array(losses))))
        step_ok = float(fused[3 * n]) == 1.0 + K
        check(f"train_steps k={K} (lr {rates.tolist()}) vs {K} x "
              f"(grad + apply)",
              worst <= 1e-5 and loss_err <= 1e-6 and step_ok,
              f"state max rel err {worst:.2e}, step out {fused[3 * n]}, "
              f"losses {fused[3 * n + 1]}")

        # Transformer: gradients only. Exported without inlining, so JAX's
        # private helpers (@_where, @tril, @_one_hot) reach `pcp compile` as
        # func.call and its own inliner handles them.
        loss_fn, params, data = export_jax.transformer_model(seed=2)
        text = export_jax.export(loss_fn, params, data, inline=False)
        assert "call @" in text
        tr = build(tmp, "transformer", text, "grad")
        check_gradients("transformer", tr, loss_fn, params, data)

        # An op without a rule names itself and its location.
        src = os.path.join(tmp, "remainder.mlir")
        with open(src, "w") as f:
            f.write("func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<f32> {\n"
                    "  %z = stablehlo.constant dense<0.0> : tensor<f32>\n"
                    "  %0 = stablehlo.remainder %a, %b : tensor<3xf32>\n"
                    "  %1 = stablehlo.reduce(%0 init: %z) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>\n"
                    "  return %1 : tensor<f32>\n}\n")
        r = pcp("compile", "--program", "grad", src, "--emit-mlir",
                os.path.join(tmp, "remainder.grad.mlir"))
        ok = (r.returncode == 1 and "stablehlo.remainder" in r.stderr and
              "remainder.mlir:3:" in r.stderr)
        check("op without a rule is an error naming it", ok,
              r.stderr.strip().splitlines()[-1] if r.stderr else "no output")
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
