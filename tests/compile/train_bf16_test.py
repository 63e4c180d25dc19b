#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bf16 training programs: `pcp compile --program train` on a bf16 built-in
GPT (`pcp model gpt --dtype bf16`), run through pcp_compute (`pcp run`).

AdamW keeps master-precision state (docs/autodiff.md, "AdamW and
clipping"): the moments are f32 whatever the parameter type, the update is
computed in f32 from the widened bf16 parameter and gradient, and only the
new parameter is rounded back to bf16. Two checks:

1. @apply_optimizer of the bf16 module over 3 steps (random bf16 gradients,
   the global clip engaged on step 1) against a float64 NumPy AdamW fed the
   same bf16 values: m and v must come back as f32 and match to 1e-5
   relative (a bf16 moment rounds with up to 2^-9 = 2e-3 relative error),
   and each new parameter must be the NumPy result rounded to bf16 on all
   but 1% of elements, the rest within one bf16 ulp plus 1e-5 of the
   update's operands (f32 vs f64 arithmetic before the rounding).
2. @train_steps (K=16 fused steps on tiny_shakespeare bytes) of the bf16
   module against the f32 module from the same (bf16-representable)
   initial parameters: every step's loss within LOSS_TOL of the f32 run's,
   and both runs' loss falls by at least MIN_DROP.

usage: train_bf16_test.py PCP_BINARY
"""

import glob
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = os.path.join(HERE, "..", "..", "data", "tiny_shakespeare.txt")
MODEL = ["--layers", "1", "--heads", "2", "--width", "32", "--vocab", "37",
         "--block-size", "16", "--batch", "4"]
K = 16
LR = 1e-2
# Compile-time AdamW constants (the defaults, spelled out for NumPy).
B1, B2, EPS, WD, CLIP = 0.9, 0.999, 1e-8, 0.01, 1.0
MOMENT_TOL = 1e-5
LOSS_TOL = 0.01     # absolute, per step, on losses of ~3.6 -> ~3.0 (measured 0.0021)
MIN_DROP = 0.3


def bf16_round(x):
    """float -> bf16 bits (uint16), round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (u >> np.uint32(16)).astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr)
        raise SystemExit(f"failed: {' '.join(args[:4])}")
    return r.stdout


def shape_text(shape, element):
    return "x".join(str(d) for d in shape) + "x" + element


def bf16_input(tmp, name, bits):
    path = os.path.join(tmp, name + ".bin")
    bits.tofile(path)
    return shape_text(bits.shape, "bf16") + "=@" + path


def npy_input(tmp, name, array):
    path = os.path.join(tmp, name + ".npy")
    np.save(path, array)
    return "@" + path


def load_output(path):
    a = np.load(path)
    if a.dtype.kind == "V":  # bf16 is written as '<V2'
        return bf16_value(a.view(np.uint16))
    return a


def numpy_adamw(params, grads, m, v, t, lr):
    norm = np.sqrt(sum(np.sum(np.square(g)) for g in grads))
    scale = CLIP / max(norm, CLIP)
    out = ([], [], [], [])
    for p, g, mi, vi in zip(params, grads, m, v):
        gc = g * scale
        mi = B1 * mi + (1.0 - B1) * gc
        vi = B2 * vi + (1.0 - B2) * np.square(gc)
        m_hat = mi / (1.0 - B1 ** t)
        v_hat = vi / (1.0 - B2 ** t)
        step = lr * (m_hat / (np.sqrt(v_hat) + EPS) + WD * p)
        out[0].append(p - step)
        out[1].append(mi)
        out[2].append(vi)
        out[3].append(np.abs(p) + np.abs(step))  # operand magnitude of p'
    return out, norm


def check_adamw(pcp, tmp, vmfb, init_bits):
    n = len(init_bits)
    p_bits = list(init_bits)
    ref_m = [np.zeros(b.shape) for b in p_bits]
    ref_v = [np.zeros(b.shape) for b in p_bits]
    dev_m = [np.zeros(b.shape, np.float32) for b in p_bits]
    dev_v = [np.zeros(b.shape, np.float32) for b in p_bits]
    rng = np.random.default_rng(7)
    ok = True
    for t in (1, 2, 3):
        scale = 3.0 if t == 1 else 0.005  # clipped, then not
        g_bits = [bf16_round(rng.standard_normal(b.shape) * scale)
                  for b in p_bits]
        inputs = []
        for i in range(n):
            inputs += ["--input", bf16_input(tmp, f"p{i}", p_bits[i])]
        for i in range(n):
            inputs += ["--input", bf16_input(tmp, f"g{i}", g_bits[i])]
        for kind, arrays in (("m", dev_m), ("v", dev_v)):
            for i, a in enumerate(arrays):
                inputs += ["--input", npy_input(tmp, f"{kind}{i}", a)]
        inputs += ["--input", f"f32={t}", "--input", f"f32={LR}"]
        outs = [os.path.join(tmp, f"out{i}.npy") for i in range(3 * n)]
        args = [pcp, "run", vmfb, "--function", "apply_optimizer",
                "--cpu-threads", "1", *inputs]
        for o in outs:
            args += ["--output", "@" + o]
        run(*args)
        raw = [np.load(o) for o in outs]
        kinds_ok = (all(a.dtype.kind == "V" for a in raw[:n]) and
                    all(a.dtype == np.float32 for a in raw[n:]))
        new_bits = [a.view(np.uint16) for a in raw[:n]]
        dev_m, dev_v = raw[n:2 * n], raw[2 * n:]
        (ref_p, ref_m, ref_v, magnitude), norm = numpy_adamw(
            [bf16_value(b).astype(np.float64) for b in p_bits],
            [bf16_value(g).astype(np.float64) for g in g_bits], ref_m, ref_v,
            t, LR)
        moment_err = 0.0
        for a, b in zip(dev_m + dev_v, ref_m + ref_v):
            err = float(np.max(np.abs(a - b))) / max(
                float(np.max(np.abs(b))), 1e-30)
            moment_err = max(moment_err, err)
        # p' = bf16(p - step) computed in f32: NumPy's value rounded to
        # bf16, except where the f32 result lies near a rounding boundary:
        # one bf16 ulp (2^-8 |p'|) plus the f32 update's own error, taken
        # as 1e-5 of the operands' magnitude (|p| + |step|; IREE's f32
        # divide and sqrt, the tolerance of the f32 AdamW test) -- that
        # term is what remains where p - step cancels to near zero.
        total = differ = bad = 0
        for got, want, mag in zip(new_bits, ref_p, magnitude):
            value = bf16_value(got).astype(np.float64)
            total += got.size
            differ += int(np.count_nonzero(got != bf16_round(want)))
            bound = 2.0 ** -8 * np.abs(want) + MOMENT_TOL * mag
            bad += int(np.count_nonzero(np.abs(value - want) > bound))
        step_ok = (kinds_ok and moment_err <= MOMENT_TOL and bad == 0
                   and differ <= 0.01 * total)
        ok = ok and step_ok
        print(f"{'ok  ' if step_ok else 'FAIL'} apply_optimizer step {t}: "
              f"grad norm {norm:.3f} (clip {CLIP}), params bf16 / moments "
              f"f32: {kinds_ok}, m/v max rel err {moment_err:.2e} "
              f"(tol {MOMENT_TOL:g}), params {differ}/{total} differ from "
              f"bf16(NumPy), {bad} outside the bound")
        p_bits = new_bits
    return ok


def train_losses(pcp, tmp, vmfb, tag, params, element, ids, targets):
    inputs = []
    for i, p in enumerate(params):
        if element == "bf16":
            inputs += ["--input", bf16_input(tmp, f"{tag}p{i}", bf16_round(p))]
        else:
            inputs += ["--input", npy_input(tmp, f"{tag}p{i}", p)]
    for kind in ("m", "v"):
        for i, p in enumerate(params):
            inputs += ["--input", shape_text(p.shape, "f32") + "=0"]
    inputs += ["--input", "f32=1", "--input", f"{K}xf32={LR}",
               "--input", npy_input(tmp, f"{tag}ids", ids),
               "--input", npy_input(tmp, f"{tag}targets", targets)]
    losses = os.path.join(tmp, f"{tag}losses.npy")
    args = [pcp, "run", vmfb, "--function", "train_steps", *inputs]
    # params, m, v and the next step number ignored; the K losses kept.
    args += ["--output", ""] * (3 * len(params) + 1) + ["--output",
                                                        "@" + losses]
    run(*args)
    return np.load(losses).astype(np.float64)


def main():
    pcp = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        modules = {}
        for element in ("f32", "bf16"):
            mlir = os.path.join(tmp, f"{element}.mlir")
            vmfb = os.path.join(tmp, f"{element}.vmfb")
            init = os.path.join(tmp, "init") if element == "f32" else None
            extra = ["--init-dir", init, "--seed", "3"] if init else []
            run(pcp, "model", "gpt", *MODEL, "--dtype", element, *extra,
                "-o", mlir)
            run(pcp, "compile", "--program", "train", "--inner-steps",
                str(K), mlir, "-o", vmfb)
            modules[element] = vmfb
        files = sorted(glob.glob(os.path.join(tmp, "init", "*.npy")))
        # Start both runs from the same bf16-representable values.
        params = [bf16_value(bf16_round(np.load(f))) for f in files]
        print(f"gpt: {len(params)} tensors, "
              f"{sum(p.size for p in params)} parameters")

        ok = check_adamw(pcp, tmp, modules["bf16"],
                         [bf16_round(p) for p in params])

        text = np.frombuffer(open(TEXT, "rb").read(), dtype=np.uint8)
        spec_b, spec_t = 4, 16
        rng = np.random.default_rng(1)
        starts = rng.integers(0, text.size - spec_t - 1, size=(K, spec_b))
        window = starts[..., None] + np.arange(spec_t + 1)
        tokens = (text[window] % 37).astype(np.int32)
        ids, targets = tokens[..., :-1], tokens[..., 1:]
        f32 = train_losses(pcp, tmp, modules["f32"], "f", params, "f32", ids,
                           targets)
        bf16 = train_losses(pcp, tmp, modules["bf16"], "b", params, "bf16",
                            ids, targets)
        gap = float(np.max(np.abs(bf16 - f32)))
        drop_f32, drop_bf16 = f32[0] - f32[-1], bf16[0] - bf16[-1]
        traj_ok = (np.all(np.isfinite(bf16)) and gap <= LOSS_TOL and
                   drop_f32 >= MIN_DROP and drop_bf16 >= MIN_DROP)
        ok = ok and traj_ok
        print(f"{'ok  ' if traj_ok else 'FAIL'} train_steps K={K}: f32 loss "
              f"{f32[0]:.4f} -> {f32[-1]:.4f}, bf16 {bf16[0]:.4f} -> "
              f"{bf16[-1]:.4f}, max |bf16 - f32| {gap:.4f} (tol {LOSS_TOL})")
        print("f32  losses: " + " ".join(f"{x:.3f}" for x in f32))
        print("bf16 losses: " + " ".join(f"{x:.3f}" for x in bf16))
    print(f"train_bf16_test: {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
