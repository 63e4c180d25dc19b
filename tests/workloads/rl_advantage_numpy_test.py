#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Group-normalised advantages (pcp_workloads_rl_advantages_compute, through
`rl_tool advantages`) against an independent NumPy implementation.

usage: rl_advantage_numpy_test.py RL_TOOL

Reference, per group of G rewards (float64):
    A = (r - mean) / (std(r, ddof=1) + eps)      (scaled, the default)
    A = r - mean                                 (unscaled, Dr. GRPO)
    A = 0 for a group whose rewards are all equal (counted as degenerate)
plus the overall mean and population std the tool prints.

Cases: random normal rewards, binary (0/1) rewards as a verifier gives
(many all-equal groups), rewards with a large offset (1e4 + small noise,
where a naive E[r^2] - E[r]^2 variance would cancel), G = 2 and G = 64,
epsilon 0 and 1e-4, and the error path (NaN reward). Tolerance: 1e-6
relative to max(1, |A|) per element (the C code computes in double and
rounds once to f32, so the error is about one f32 ulp).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

TOL = 1e-6


def reference(r, g, eps, scale):
    groups = r.astype(np.float64).reshape(-1, g)
    mean = groups.mean(axis=1, keepdims=True)
    a = groups - mean
    if scale:
        a = a / (groups.std(axis=1, ddof=1, keepdims=True) + eps)
    equal = np.all(groups == groups[:, :1], axis=1)
    a[equal] = 0.0
    return a.reshape(-1), int(equal.sum())


def run_tool(tool, tmp, r, g, eps, scale):
    src = os.path.join(tmp, "r.f32")
    dst = os.path.join(tmp, "a.f32")
    r.astype("<f4").tofile(src)
    p = subprocess.run([tool, "advantages", str(g), repr(eps),
                        "1" if scale else "0", src, dst],
                       capture_output=True, text=True, timeout=60)
    return p, (np.fromfile(dst, "<f4") if p.returncode == 0 else None)


def main():
    tool = sys.argv[1]
    rng = np.random.default_rng(16)
    cases = [
        ("normal G=8", rng.standard_normal(8 * 32), 8, 1e-4, True),
        ("normal G=8 unscaled", rng.standard_normal(8 * 32), 8, 1e-4, False),
        ("binary G=4", rng.integers(0, 2, 4 * 64).astype(np.float64), 4,
         1e-4, True),
        ("offset 1e4 G=16", 1e4 + 0.01 * rng.standard_normal(16 * 8), 16,
         1e-4, True),
        ("G=2 eps 0", rng.standard_normal(2 * 50), 2, 0.0, True),
        ("G=64", 3.0 * rng.standard_normal(64 * 4), 64, 1e-4, True),
    ]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, r, g, eps, scale in cases:
            r = r.astype(np.float32)
            p, got = run_tool(tool, tmp, r, g, eps, scale)
            if got is None:
                print("FAIL %s: tool exit %d: %s" % (name, p.returncode,
                                                   p.stderr.strip()))
                failures += 1
                continue
            want, degenerate = reference(r, g, eps, scale)
            err = np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want)))
            fields = dict(kv.split("=") for kv in p.stdout.split())
            mean_err = abs(float(fields["mean"]) - r.astype(np.float64).mean())
            std_err = abs(float(fields["std"]) - r.astype(np.float64).std())
            zero_ok = all(np.all(got.reshape(-1, g)[i] == 0.0)
                          for i in range(len(r) // g)
                          if np.all(r.reshape(-1, g)[i] == r.reshape(-1, g)[i][0]))
            ok = (err <= TOL and int(fields["degenerate"]) == degenerate and
                  int(fields["groups"]) == len(r) // g and zero_ok and
                  mean_err <= 1e-9 * max(1.0, abs(r.mean())) and
                  std_err <= 1e-6 * max(1.0, r.std()))
            print("%s %s: max rel err %.2e (tol %.0e), degenerate %s (want %d),"
                  " mean err %.1e, std err %.1e" % (
                      "ok" if ok else "FAIL", name, err, TOL,
                      fields["degenerate"], degenerate, mean_err, std_err))
            failures += 0 if ok else 1
        # The error path: a NaN reward is refused naming its index.
        r = np.ones(8, np.float32)
        r[5] = np.nan
        p, got = run_tool(tool, tmp, r, 4, 1e-4, True)
        ok = p.returncode == 1 and "reward 5 (group 1) is not finite" in p.stderr
        print("%s NaN reward refused: %s" % ("ok" if ok else "FAIL",
                                            p.stderr.strip()))
        failures += 0 if ok else 1
    print("%d passed, %d failed" % (len(cases) + 1 - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
