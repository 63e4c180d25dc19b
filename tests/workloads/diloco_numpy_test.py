# SPDX-License-Identifier: Apache-2.0
"""DiLoCo / streaming DiLoCo outer step against an independent NumPy model.

usage: diloco_numpy_test.py DRIVER

For several seeds, runs the C driver (src/workloads/train/diloco_npy_driver.c),
which executes the library's outer steps on seeded random data and writes
inputs and results as .npy, then recomputes every result here in float32
from the inputs alone:
  classic: delta = theta - local, bf16 round-to-nearest-even (ml_dtypes),
           mean over the workers that reported (a lost worker is absent),
           Nesterov v = mu v + g; theta -= lr (g + mu v), per outer step;
  streaming: fragment = tensor mod P, sends at phase(p) + H (r+1), receives
           tau later, alpha mixing, per-fragment Nesterov on the mean delta;
  lr schedules: constant, linear warmup + cosine to min_lr at the last
           step, warmup + constant, from the closed form in float64.
Prints the max abs error of each quantity; fails above 1e-6.
"""

import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np

F = np.float32
TOL = 1e-6
MU, LR = F(0.9), F(0.7)


def nesterov(theta, v, g):
    v = MU * v + g
    theta = theta - LR * (g + MU * v)
    return theta, v


def classic(d):
    theta = d["classic_theta0"].copy()
    v = np.zeros_like(theta)
    K, W, _ = d["classic_pert"].shape
    out = {"classic_wire": [], "classic_avg": [], "classic_theta": [],
           "classic_velocity": []}
    for k in range(K):
        total = np.zeros_like(theta)
        count = 0
        wires = []
        for w in range(W):
            local = theta + d["classic_pert"][k, w]
            delta = theta - local
            if d["classic_bf16"][k]:
                delta = delta.astype(ml_dtypes.bfloat16).astype(F)
            wires.append(delta)
            if d["classic_reported"][k, w]:
                total = total + delta
                count += 1
        avg = total / F(count)
        if count < W:
            # Negative control: averaging every worker, the lost one
            # included, gives a different result, so the mask is exercised.
            everyone = np.mean(np.stack(wires), axis=0, dtype=F)
            assert np.max(np.abs(everyone - avg)) > 1e-5, "lost worker"
        avg[~np.isfinite(avg)] = 0
        theta, v = nesterov(theta, v, avg)
        out["classic_wire"].append(np.stack(wires))
        out["classic_avg"].append(avg)
        out["classic_theta"].append(theta)
        out["classic_velocity"].append(v)
    return {k: np.stack(x) for k, x in out.items()}


def streaming(d, P=3, H=4, tau=1, R=3, alpha=F(0.5)):
    sizes = d["stream_sizes"]
    off = np.concatenate([[0], np.cumsum(sizes)])
    pert = d["stream_pert"]
    S, W, _ = pert.shape
    phase = [p * H // P for p in range(P)]
    assert S == R * H + phase[-1] + tau, "max_steps"
    sends = -np.ones((S, P), np.int32)
    recvs = -np.ones((S, P), np.int32)
    for p in range(P):
        for r in range(R):
            sends[phase[p] + H * (r + 1) - 1, p] = r
            recvs[phase[p] + H * (r + 1) + tau - 1, p] = r
    master = d["stream_master0"].copy()
    local = np.stack([master.copy() for _ in range(W)])
    snap = local.copy()
    v = np.zeros_like(master)
    frag = [[i for i in range(len(sizes)) if i % P == p] for p in range(P)]
    master_hist, local_hist = [], []
    for s in range(S):
        for p in range(P):
            if recvs[s, p] >= 0:
                for i in frag[p]:
                    sl = slice(off[i], off[i + 1])
                    mixed = alpha * local[:, sl] + (F(1) - alpha) * master[sl]
                    local[:, sl] = mixed
                    snap[:, sl] = mixed
        local = local + pert[s]
        for p in range(P):
            if sends[s, p] >= 0:
                for i in frag[p]:
                    sl = slice(off[i], off[i + 1])
                    total = np.zeros(sizes[i], F)
                    for w in range(W):
                        total = total + (snap[w, sl] - local[w, sl])
                        snap[w, sl] = local[w, sl]
                    avg = total / F(W)
                    master[sl], v[sl] = nesterov(master[sl], v[sl], avg)
        master_hist.append(master.copy())
        local_hist.append(local.copy())
    return {"stream_sends": sends, "stream_recvs": recvs,
            "stream_master": np.stack(master_hist),
            "stream_local": np.stack(local_hist), "stream_velocity": v}


def schedule(d):
    """The inner rate per step from the closed form (docs/training.md)."""
    cases = d["lr_cases"]
    steps = d["lr_rates"].shape[1]
    out = np.zeros((len(cases), steps), F)
    for c, (kind, base, min_lr, warmup, total) in enumerate(cases):
        kind, warmup, total = int(kind), int(warmup), int(total)
        for t in range(steps):
            if kind == 0:
                lr = base
            elif t < warmup:
                lr = base * (t + 1) / warmup
            elif kind == 2:
                lr = base
            else:
                span = total - 1 - warmup
                p = min(1.0, (t - warmup) / span) if span > 0 else 0.0
                lr = min_lr + 0.5 * (base - min_lr) * (1 + np.cos(np.pi * p))
            out[c, t] = F(lr)
    # Sanity of the reference itself: cosine ends at min_lr at the last
    # step, and warmup reaches base at step warmup-1.
    for c, (kind, base, min_lr, warmup, total) in enumerate(cases):
        if int(kind) == 1 and total > warmup + 1:
            assert abs(out[c, int(total) - 1] - F(min_lr)) <= 1e-9
        if int(kind) != 0 and warmup > 0:
            assert abs(out[c, int(warmup) - 1] - F(base)) <= 1e-9
    return {"lr_rates": out}


def main():
    driver = sys.argv[1]
    worst = {}
    for seed in (1, 2, 3, 12345):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([driver, tmp, str(seed)], check=True)
            names = ["classic_sizes", "classic_theta0", "classic_pert",
                     "classic_reported", "classic_bf16", "classic_wire",
                     "classic_avg", "classic_theta", "classic_velocity",
                     "stream_sizes", "stream_master0", "stream_pert",
                     "stream_sends", "stream_recvs", "stream_master",
                     "stream_local", "stream_velocity", "lr_cases",
                     "lr_rates"]
            d = {n: np.load(f"{tmp}/{n}.npy") for n in names}
        ref = classic(d)
        ref.update(streaming(d))
        ref.update(schedule(d))
        for name, want in ref.items():
            got = d[name]
            assert got.shape == want.shape, (name, got.shape, want.shape)
            err = float(np.max(np.abs(got.astype(np.float64) -
                                      want.astype(np.float64))))
            worst[name] = max(worst.get(name, 0.0), err)
    ok = True
    for name, err in worst.items():
        # The rates are ~1e-3: the absolute bound of the rest would hide a
        # wrong schedule; within an f32 ulp of the closed form.
        tol = 1e-9 if name == "lr_rates" else TOL
        status = "ok" if err <= tol else "FAIL"
        ok = ok and err <= tol
        print(f"{name}: max abs err {err:.3g} {status}")
    print("diloco_numpy_test", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
