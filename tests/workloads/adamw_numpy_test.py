# SPDX-License-Identifier: Apache-2.0
"""In-graph AdamW (@apply_optimizer of `pcp compile --program train`) run
through pcp_compute (`pcp run`) against an independent NumPy AdamW.

usage: adamw_numpy_test.py PCP_BINARY

A 1-layer built-in GPT gives the parameter shapes and seeded initial values
(`pcp model gpt --init-dir`). Three optimizer steps with random gradients
(large on step 1, so the global-norm clip engages) are run by the program
and by `numpy_adamw` below (float64), which follows the update as specified
(reference/upstream-workloads.md s.2.6 with the global norm of
docs/autodiff.md):
    n  = sqrt(sum over every gradient of g^2);  g' = g * c / max(n, c)
    m  = b1 m + (1-b1) g' ;  v = b2 v + (1-b2) g'^2
    p  = p - lr * ( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd p )
Fails when a parameter, m or v differs by more than 1e-5 relative to the
largest magnitude of that tensor. NumPy only; no JAX.
"""

import glob
import os
import subprocess
import sys
import tempfile

import numpy as np

B1, B2, EPS, WD, CLIP = 0.9, 0.95, 1e-8, 0.1, 0.5
LR = 0.01
TOL = 1e-5


def numpy_adamw(params, grads, m, v, t, lr):
    norm = np.sqrt(sum(np.sum(np.square(g)) for g in grads))
    scale = CLIP / max(norm, CLIP)
    out = ([], [], [])
    for p, g, mi, vi in zip(params, grads, m, v):
        gc = g * scale
        mi = B1 * mi + (1.0 - B1) * gc
        vi = B2 * vi + (1.0 - B2) * np.square(gc)
        m_hat = mi / (1.0 - B1 ** t)
        v_hat = vi / (1.0 - B2 ** t)
        p = p - lr * (m_hat / (np.sqrt(v_hat) + EPS) + WD * p)
        out[0].append(p)
        out[1].append(mi)
        out[2].append(vi)
    return out, norm


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr)
        raise SystemExit(f"failed: {' '.join(args[:3])}")


def main():
    pcp = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        mlir = os.path.join(tmp, "m.mlir")
        vmfb = os.path.join(tmp, "m.vmfb")
        init = os.path.join(tmp, "init")
        run(pcp, "model", "gpt", "--layers", "1", "--heads", "2", "--width",
            "16", "--vocab", "11", "--block-size", "8", "--batch", "2",
            "--init-dir", init, "--seed", "5", "-o", mlir)
        run(pcp, "compile", "--program", "train", "--data-args", "2",
            "--inner-steps", "1", "--beta1", str(B1), "--beta2", str(B2),
            "--epsilon", str(EPS), "--weight-decay", str(WD),
            "--max-grad-norm", str(CLIP), "--cache-dir",
            os.path.join(tmp, "cache"), mlir, "-o", vmfb)
        files = sorted(glob.glob(os.path.join(init, "*.npy")))
        params = [np.load(f) for f in files]
        n = len(params)
        dev = [p.astype(np.float32) for p in params]
        dev_m = [np.zeros_like(p) for p in dev]
        dev_v = [np.zeros_like(p) for p in dev]
        ref = [p.astype(np.float64) for p in params]
        ref_m = [np.zeros_like(p) for p in ref]
        ref_v = [np.zeros_like(p) for p in ref]
        rng = np.random.default_rng(11)
        worst = 0.0
        for t in (1, 2, 3):
            scale = 3.0 if t == 1 else 0.005  # clipped, then not
            grads = [(rng.standard_normal(p.shape) * scale).astype(np.float32)
                     for p in params]
            inputs = []
            for kind, arrays in (("p", dev), ("g", grads), ("m", dev_m),
                                 ("v", dev_v)):
                for i, a in enumerate(arrays):
                    path = os.path.join(tmp, f"in_{kind}{i}.npy")
                    np.save(path, a)
                    inputs += ["--input", "@" + path]
            inputs += ["--input", f"f32={t}", "--input", f"f32={LR}"]
            outs = [os.path.join(tmp, f"out{i}.npy") for i in range(3 * n)]
            args = [pcp, "run", vmfb, "--function", "apply_optimizer",
                    "--cpu-threads", "1", *inputs]
            for o in outs:
                args += ["--output", "@" + o]
            run(*args)
            got = [np.load(o) for o in outs]
            dev, dev_m, dev_v = got[:n], got[n:2 * n], got[2 * n:]
            (ref, ref_m, ref_v), norm = numpy_adamw(
                ref, [g.astype(np.float64) for g in grads], ref_m, ref_v, t,
                LR)
            step_worst = 0.0
            for a, b in zip(dev + dev_m + dev_v, ref + ref_m + ref_v):
                err = float(np.max(np.abs(a - b))) / max(
                    float(np.max(np.abs(b))), 1e-30)
                step_worst = max(step_worst, err)
            print(f"step {t}: grad norm {norm:.3f} (clip {CLIP}), "
                  f"max rel err {step_worst:.2e}")
            worst = max(worst, step_worst)
    ok = worst <= TOL
    print(f"adamw_numpy_test: {n} tensors, 3 steps, max rel err {worst:.2e} "
          f"{'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
