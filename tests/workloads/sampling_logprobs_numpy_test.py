#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Per-token log-probabilities (pcp_sampler_sample_logprobs, through
`sampling_logprobs_tool`) against an independent NumPy computation.

usage: sampling_logprobs_numpy_test.py SAMPLING_LOGPROBS_TOOL

Reference, per row of f32 logits x (float64 here):
    z = x / T
    kept = the top_k largest z (ties: lowest id) when top_k > 0, else all;
           then, when top_p < 1, the smallest prefix of kept sorted by
           descending probability (renormalised over kept) whose mass
           reaches top_p
    logprob(i) = z_i - logsumexp(z[kept])        for i in kept
i.e. log_softmax of the distribution the token was drawn from. Checks:
the drawn token is in the kept set, its logprob matches, the top entries
are the most likely kept tokens in order with matching values, and
sum(exp(top)) <= 1. The tool itself checks that the drawn tokens equal
pcp_sampler_sample's for the same seed. Greedy (T = 0): a point mass on the
argmax, logprob 0. Tolerance 2e-5 absolute (f64 in C, one f32 rounding).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

TOL = 2e-5
failures = 0


def check(ok, what):
    global failures
    if not ok:
        failures += 1
        print("FAIL:", what)


def kept_set(x, t, top_k, top_p):
    z = x.astype(np.float64) / t
    order = np.lexsort((np.arange(len(z)), -z))  # descending z, lowest id
    if 0 < top_k < len(z):
        order = order[:top_k]
    if top_p < 1.0:
        w = np.exp(z[order] - z[order].max())
        p = w / w.sum()
        before = np.concatenate([[0.0], np.cumsum(p)[:-1]])
        order = order[before < top_p]
    zk = z[order]
    m = zk.max()
    lse = m + np.log(np.exp(zk - m).sum())
    return {int(i): float(z[i] - lse) for i in order}, [int(i) for i in order]


def run(tool, logits, t, top_k, top_p, seed, top):
    rows, vocab = logits.shape
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "logits.f32")
        logits.astype("<f4").tofile(path)
        out = subprocess.run(
            [tool, str(vocab), str(rows), repr(t), str(top_k), repr(top_p),
             str(seed), str(top), path],
            capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("tool failed (%d): %s" % (out.returncode,
                                                    out.stderr))
    result = []
    for line in out.stdout.splitlines():
        parts = line.split()
        entries = [(int(a), float(b)) for a, b in
                   (p.split(":") for p in parts[3:])]
        check(len(entries) == int(parts[2]), "top count " + line)
        result.append((int(parts[0]), float(parts[1]), entries))
    return result


def main():
    tool = sys.argv[1]
    rng = np.random.default_rng(1234)
    cases = 0
    for vocab in (50, 4096):
        for scale in (1.0, 4.0):
            logits = (rng.standard_normal((24, vocab)) * scale).astype(
                np.float32)
            for t in (0.7, 1.0, 1.3):
                for top_k, top_p in ((0, 1.0), (0, 0.9), (0, 0.5), (20, 1.0),
                                     (40, 0.8)):
                    for top in (0, 5, 20):
                        got = run(tool, logits, t, top_k, top_p,
                                  seed=7 + cases, top=top)
                        cases += 1
                        check(len(got) == len(logits), "rows")
                        for row, (token, lp, entries) in enumerate(got):
                            ref, order = kept_set(logits[row], t, top_k,
                                                  top_p)
                            what = "V=%d s=%g T=%g k=%d p=%g row %d" % (
                                vocab, scale, t, top_k, top_p, row)
                            check(token in ref, what + ": token %d not kept"
                                  % token)
                            if token in ref:
                                check(abs(lp - ref[token]) <= TOL,
                                      what + ": logprob %r vs %r" %
                                      (lp, ref[token]))
                            want = min(top, len(order))
                            check(len(entries) == want,
                                  what + ": %d top entries, want %d" %
                                  (len(entries), want))
                            for j, (i, v) in enumerate(entries[:want]):
                                check(i == order[j], what +
                                      ": top[%d] id %d vs %d" %
                                      (j, i, order[j]))
                                check(abs(v - ref[order[j]]) <= TOL,
                                      what + ": top[%d] %r vs %r" %
                                      (j, v, ref[order[j]]))
                            check(sum(np.exp(v) for _, v in entries) <=
                                  1 + 1e-5, what + ": top mass > 1")
    # The draws follow the reported distribution: over many rows of the same
    # logits the empirical frequency of each token matches exp(logprob).
    logits = np.tile((rng.standard_normal(8) * 1.5).astype(np.float32),
                     (20000, 1))
    got = run(tool, logits, 1.0, 0, 0.9, seed=99, top=0)
    ref, _ = kept_set(logits[0], 1.0, 0, 0.9)
    counts = {}
    for token, lp, _ in got:
        counts[token] = counts.get(token, 0) + 1
        check(abs(lp - ref[token]) <= TOL, "repeated row logprob")
    for i, l in ref.items():
        p = np.exp(l)
        f = counts.get(i, 0) / len(got)
        check(abs(f - p) <= 4 * np.sqrt(p * (1 - p) / len(got)) + 1e-3,
              "token %d frequency %.4f vs probability %.4f" % (i, f, p))
    # Greedy: a point mass.
    logits = rng.standard_normal((6, 300)).astype(np.float32)
    for token, lp, entries in run(tool, logits, 0.0, 0, 1.0, seed=1, top=5):
        check(lp == 0.0 and len(entries) == 1 and entries[0] == (token, 0.0),
              "greedy: logprob 0, one top entry")
    check(list(t for t, _, _ in run(tool, logits, 0.0, 0, 1.0, 1, 0)) ==
          [int(np.argmax(r)) for r in logits], "greedy: the argmax")
    # top above the limit is refused.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "l.f32")
        logits[:1].astype("<f4").tofile(path)
        out = subprocess.run([tool, "300", "1", "1.0", "0", "1.0", "1", "21",
                              path], capture_output=True, text=True)
        check(out.returncode == 1 and "top_logprobs" in out.stderr,
              "top 21 refused: %r" % out.stderr)
    print("%d cases, %d failures" % (cases, failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
