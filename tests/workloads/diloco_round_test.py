"""@diloco_round (`pcp compile --program diloco`) against its definition.

usage: diloco_round_test.py PCP_BINARY

A 1-layer built-in GPT with seeded parameters: one call of
@diloco_round(params, lr[K], ids[K,B,T], targets[K,B,T]) (lr: a different
rate per inner step) must equal params - p' where (p', m', v', step',
losses) = @train_steps(params, 0, 0, step 1, lr, ids, targets) of the same
program (the definition of a stateless round: fresh moments, step 1, K
fused steps), with the same losses; the bf16
variant must return that delta rounded to nearest even (NumPy). The same
for `--inner-state keep` as a second round: @diloco_round(params, m, v,
step K+1, lr, ...) with the m and v the first round's definition ended with
must equal params - p' of @train_steps(params, m, v, K+1, lr, ...) and
return its m', v' and next step (K+1+K) unchanged. The fused steps
themselves are checked against NumPy AdamW in adamw_numpy_test.py and
inner_state_test.py.
"""

import glob
import os
import subprocess
import sys
import tempfile

import numpy as np

K, B, T, V = 3, 2, 8, 11
LR = [0.01, 0.003, 0.02]  # one rate per inner step


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout + r.stderr)
        raise SystemExit(f"failed: {' '.join(args[:4])}")


def npy_u16(path):
    """The data of a 2-byte .npy whose dtype NumPy may not know (bf16)."""
    raw = open(path, "rb").read()
    major = raw[6]
    if major == 1:
        offset = 10 + int.from_bytes(raw[8:10], "little")
    else:
        offset = 12 + int.from_bytes(raw[8:12], "little")
    return np.frombuffer(raw[offset:], dtype=np.uint16)


def bf16_rne(x):
    """float32 -> bf16 bits (uint16), round to nearest even."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def main():
    pcp = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        mlir = os.path.join(tmp, "m.mlir")
        init = os.path.join(tmp, "init")
        run(pcp, "model", "gpt", "--layers", "1", "--heads", "2", "--width",
            "16", "--vocab", str(V), "--block-size", str(T), "--batch",
            str(B), "--init-dir", init, "--seed", "3", "-o", mlir)
        files = sorted(glob.glob(os.path.join(init, "*.npy")))
        params = [np.load(f).astype(np.float32) for f in files]
        n = len(params)
        rng = np.random.default_rng(7)
        ids = rng.integers(0, V, size=(K, B, T), dtype=np.int32)
        targets = rng.integers(0, V, size=(K, B, T), dtype=np.int32)
        paths = {}
        for name, a in [("ids", ids), ("targets", targets),
                        ("lr", np.array(LR, np.float32))] + [
                (f"p{i}", p) for i, p in enumerate(params)] + [
                (f"z{i}", np.zeros_like(p)) for i, p in enumerate(params)]:
            paths[name] = os.path.join(tmp, name + ".npy")
            np.save(paths[name], a)
        state = {}  # the m, v a reset round's definition ends with
        for dtype, inner in (("f32", "reset"), ("bf16", "reset"),
                             ("f32", "keep"), ("bf16", "keep")):
            keep = inner == "keep"
            tag = f"{dtype}_{inner}"
            vmfb = os.path.join(tmp, f"d_{tag}.vmfb")
            run(pcp, "compile", "--program", "diloco", "--inner-steps", str(K),
                "--delta-dtype", dtype, "--inner-state", inner, "--cache-dir",
                os.path.join(tmp, "cache"), mlir, "-o", vmfb)
            # reset: fresh state. keep: a second round, from the m and v
            # the first one ended with, at step K + 1.
            groups = ("p", "m", "v") if keep else ("p", "z", "z")
            step_in = 1 + K if keep else 1
            state_in = []
            for group in groups:
                state_in += [a for i in range(n) for a in
                             ("--input", "@" + paths[f"{group}{i}"])]
            tail = ["--input", "@" + paths["lr"], "--input",
                    "@" + paths["ids"], "--input", "@" + paths["targets"]]
            # The round.
            args = [pcp, "run", vmfb, "--function", "diloco_round",
                    "--cpu-threads", "1"]
            if keep:
                args += state_in + ["--input", f"f32={step_in}"] + tail
            else:
                args += state_in[:2 * n] + tail
            count = 3 * n + 2 if keep else n + 1
            outs = [os.path.join(tmp, f"r{i}.{tag}.npy") for i in range(count)]
            for o in outs:
                args += ["--output", "@" + o]
            run(*args)
            # The definition: train_steps of the same program from the same
            # state (reset: zero moments at step 1).
            args = [pcp, "run", vmfb, "--function", "train_steps",
                    "--cpu-threads", "1"]
            args += state_in + ["--input", f"f32={step_in}"] + tail
            ref_outs = [os.path.join(tmp, f"t{i}.{tag}.npy")
                        for i in range(3 * n + 2)]
            for o in ref_outs:
                args += ["--output", "@" + o]
            run(*args)
            if not keep and dtype == "f32":
                for i in range(n):
                    for g, o in (("m", ref_outs[n + i]),
                                 ("v", ref_outs[2 * n + i])):
                        paths[f"{g}{i}"] = o
            p_next = [np.load(o) for o in ref_outs[:n]]
            ref_losses = np.load(ref_outs[3 * n + 1])
            losses = np.load(outs[-1])
            worst = 0.0
            for i in range(n):
                want = params[i] - p_next[i]
                if dtype == "f32":
                    got = np.load(outs[i]).astype(np.float32)
                    scale = max(float(np.max(np.abs(want))), 1e-30)
                    worst = max(worst, float(np.max(np.abs(got - want))) /
                                scale)
                else:
                    got = npy_u16(outs[i])
                    exp = bf16_rne(want).reshape(-1)
                    # One bf16 ulp: the device delta may differ from the
                    # host's in its last f32 bits, which can flip a tie.
                    diff = np.abs(got.astype(np.int32) - exp.astype(np.int32))
                    worst = max(worst, float(np.max(diff)))
            loss_err = float(np.max(np.abs(losses - ref_losses)))
            limit = 1e-6 if dtype == "f32" else 1.0
            ok = worst <= limit and loss_err <= 1e-6 and losses.shape == (K,)
            extra = ""
            if keep:
                # m', v' and the next step are @train_steps' own, unchanged.
                state_err = max(
                    float(np.max(np.abs(np.load(a) - np.load(b))))
                    for a, b in zip(outs[n:3 * n + 1], ref_outs[n:3 * n + 1]))
                step_out = float(np.load(outs[3 * n]))
                ok = ok and state_err == 0.0 and step_out == step_in + K
                extra = (f", m/v/step max diff {state_err:.1e}, step "
                         f"{step_in} -> {step_out:g}")
            print(f"{tag}: {n} deltas, worst "
                  f"{'rel err' if dtype == 'f32' else 'bf16 ulps'} "
                  f"{worst:.2e}, losses {np.round(losses, 4).tolist()} "
                  f"(max err {loss_err:.1e}){extra} {'ok' if ok else 'FAILED'}")
            if not ok:
                failures.append(tag)
    print("diloco_round_test: " + ("PASSED" if not failures else
                                   "FAILED " + ",".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
