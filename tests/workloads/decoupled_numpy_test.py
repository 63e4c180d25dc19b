# SPDX-License-Identifier: Apache-2.0
"""Decoupled DiLoCo merges, outer Nesterov, blending and int4 against NumPy.

usage: decoupled_numpy_test.py DRIVER

For several seeds, runs the C driver (src/workloads/train/decoupled_npy_driver.c),
which executes the library on seeded random data and writes inputs and
results as .npy, then recomputes every result here from the inputs alone,
with its own code (reference s.1.3):
  weights:   w = tokens^2 / max(steps, 1), 0 without tokens;
  merges:    delta = global - learner (float64, non-finite -> 0);
             weighted_average = sum w delta / sum w;
             rda = dir * mean_norm / |dir|, dir = sum_{n>0} (w/n) delta,
             mean_norm = sum w n / sum w; per tensor, embedding tensors
             switching between the two by strategy;
  fragments: balanced_tensor, recomputed here (bytes desc, index asc, to
             the lightest fragment, lowest id on ties);
  schedule + Nesterov: fragment = s mod H when < P; v = mu v + g,
             theta -= lr (g + mu v) in float32 on that fragment only;
  blend:     alpha local + (1 - alpha) global in float32;
  int4:      bytes parsed here (f32 scales, then nibbles low-first), the
             decoded values equal (nibble - 8) * scale exactly, every code
             is the nearest integer to x / scale (|x - dec| <= scale / 2),
             7 * scale >= max |x| of the block, and the size is
             4 ceil(n / B) + ceil(n / 2) bytes.
Prints the max abs error of each quantity; fails above the tolerance.
"""

import subprocess
import sys
import tempfile

import numpy as np

F = np.float32
TOL = 1e-6
MU, LR = F(0.9), F(0.7)
P, H = 2, 3
EMBEDDING = 1


def balanced(sizes):
    order = sorted(range(len(sizes)), key=lambda i: (-int(sizes[i]), i))
    load = [0] * P
    frag = [0] * len(sizes)
    for i in order:
        best = min(range(P), key=lambda f: (load[f], f))
        frag[i] = best
        load[best] += int(sizes[i]) * 4
    return np.array(frag)


def weights(tokens, steps):
    t = tokens.astype(np.float64)
    w = t * t / np.maximum(steps, 1).astype(np.float64)
    return np.where(tokens == 0, 0.0, w)


def merge_tensor(kind, g, learners, w):
    """kind 0 weighted_average, 1 rda; g [n] f32, learners [L, n] f32."""
    d = g.astype(np.float64)[None, :] - learners.astype(np.float64)
    d = np.where(np.isfinite(d), d, 0.0)
    use = np.isfinite(w) & (w > 0)
    if not use.any():
        return np.zeros_like(g)
    w, d = w[use], d[use]
    if kind == 0:
        return (np.sum(w[:, None] * d, axis=0) / np.sum(w)).astype(F)
    n = np.sqrt(np.sum(d * d, axis=1))
    mean_norm = np.sum(w * n) / np.sum(w)
    live = n > 0
    direction = np.sum((w[live] / n[live])[:, None] * d[live], axis=0)
    dn = np.sqrt(np.sum(direction * direction))
    if dn == 0 or not np.isfinite(dn):
        return np.zeros_like(g)
    return (direction * (mean_norm / dn)).astype(F)


def tensor_kind(strategy, role):
    embedding = role == 1
    if strategy == 2:
        return 0 if embedding else 1
    if strategy == 3:
        return 1 if embedding else 0
    return strategy


def merge_all(strategy, sizes, roles, g, learners, w, only=None):
    out = np.zeros_like(g)
    off = 0
    for t, size in enumerate(sizes):
        sl = slice(off, off + int(size))
        off += int(size)
        if only is not None and not only[t]:
            continue
        out[sl] = merge_tensor(tensor_kind(strategy, roles[t]), g[sl],
                               learners[:, sl], w)
    return out


def check_int4(d, block):
    x = d["int4_x"]
    raw = d[f"int4_bytes_{block}"]
    dec = d[f"int4_decoded_{block}"]
    n = x.size
    nb = -(-n // block)
    assert raw.size == 4 * nb + (n + 1) // 2, ("int4 size", raw.size)
    scales = raw[:4 * nb].view("<f4").astype(np.float64)
    codes = raw[4 * nb:]
    nib = np.empty(2 * codes.size, dtype=np.int64)
    nib[0::2] = codes & 0x0F
    nib[1::2] = codes >> 4
    q = nib[:n] - 8
    if n % 2:
        assert nib[n] == 0, "padding nibble not zero"
    s = np.repeat(scales, block)[:n]
    assert np.all((q >= -7) & (q <= 7)), "code out of range"
    # Decoding is exact: (nibble - 8) * scale needs no rounding in f32.
    want = (q * s).astype(F)
    assert np.array_equal(want.astype(np.float64), q * s), "inexact decode"
    dec_err = float(np.max(np.abs(dec.astype(np.float64) - q * s)))
    xs = x.astype(np.float64)
    bound = np.abs(xs - q * s) - s / 2
    assert float(np.max(bound)) <= 0.0, "int4 error above scale/2"
    # Nearest code (ties either way): |x/s - q| <= 1/2 where s > 0.
    pos = s > 0
    assert np.all(np.abs(xs[pos] / s[pos] - q[pos]) <= 0.5 + 1e-12)
    assert np.all(q[~pos] == 0) and np.all(xs[~pos] == 0)
    block_max = np.array([np.max(np.abs(xs[b * block:(b + 1) * block]))
                          for b in range(nb)])
    assert np.all(7 * scales >= block_max), "scale below max/7"
    # Not wasteful: within 2^-19 relative of max/7 (21-bit mantissa).
    nz = block_max > 0
    assert np.all(scales[nz] <= block_max[nz] / 7 * (1 + 2.0 ** -19))
    rel = float(np.max(np.abs(xs - dec) / np.where(s > 0, s, 1.0)))
    return dec_err, rel, (4 * n) / raw.size


def run(d):
    sizes, roles = d["sizes"], d["roles"]
    assert np.array_equal(d["fragment_of"], balanced(sizes)), "plan"
    assert roles[EMBEDDING] == 1 and (roles == 1).sum() == 1
    w = weights(d["tokens"], d["steps"])
    ref = {}
    ref["merged"] = np.stack([merge_all(s, sizes, roles, d["global"],
                                        d["learners"], w)
                              for s in range(4)])
    # Outer steps.
    theta = d["theta0"].copy()
    v = np.zeros_like(theta)
    frag_of = d["fragment_of"]
    th, vh = [], []
    for k, f in enumerate(d["step_fragment"]):
        s = k + 1
        want_f = s % H if s % H < P else -1
        assert f == want_f, ("schedule", s, f, want_f)
        if f >= 0:
            in_frag = frag_of == f
            learners = theta[None, :] + d["pert"][k]
            g = merge_all(2, sizes, roles, theta, learners, w, only=in_frag)
            mask = np.repeat(in_frag, sizes.astype(np.int64))
            v_new = MU * v + g
            step = g + MU * v_new
            theta = np.where(mask, theta - LR * step, theta).astype(F)
            v = np.where(mask, v_new, v).astype(F)
        th.append(theta.copy())
        vh.append(v.copy())
    ref["theta_hist"] = np.stack(th)
    ref["vel_hist"] = np.stack(vh)
    a = F(0.3)
    ref["blended"] = (a * d["blend_local"] + (F(1) - a) * theta).astype(F)
    return ref


def main():
    driver = sys.argv[1]
    worst = {}
    names = ["sizes", "fragment_of", "roles", "global", "learners", "tokens",
             "steps", "merged", "theta0", "pert", "step_fragment",
             "theta_hist", "vel_hist", "blend_local", "blended", "int4_x",
             "int4_bytes_64", "int4_decoded_64", "int4_bytes_7",
             "int4_decoded_7"]
    ok = True
    for seed in (1, 2, 3, 12345):
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([driver, tmp, str(seed)], check=True)
            d = {n: np.load(f"{tmp}/{n}.npy") for n in names}
        assert np.isnan(d["learners"][2, 3]), "the NaN input is missing"
        for name, want in run(d).items():
            got = d[name]
            assert got.shape == want.shape, (name, got.shape, want.shape)
            err = float(np.max(np.abs(got.astype(np.float64) -
                                      want.astype(np.float64))))
            worst[name] = max(worst.get(name, 0.0), err)
        for block in (64, 7):
            dec_err, rel, ratio = check_int4(d, block)
            key = f"int4_decode_{block}"
            worst[key] = max(worst.get(key, 0.0), dec_err)
            print(f"seed {seed} int4 block {block}: max |x-dec|/scale "
                  f"{rel:.4f} (<= 0.5), f32/int4 bytes {ratio:.3f}")
            if block == 64 and not ratio > 7.0:
                ok = False
                print(f"int4 ratio {ratio:.3f} <= 7 FAIL")
    # Negative control: the weighted average of the merge inputs is not the
    # RDA output, so the comparison above tells the strategies apart.
    assert np.max(np.abs(d["merged"][0] - d["merged"][1])) > 1e-4
    for name, err in worst.items():
        tol = 0.0 if name.startswith("int4") else TOL
        status = "ok" if err <= tol else "FAIL"
        ok = ok and err <= tol
        print(f"{name}: max abs err {err:.3g} {status}")
    print("decoupled_numpy_test", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
