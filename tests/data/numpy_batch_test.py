# SPDX-License-Identifier: Apache-2.0
"""Independent reference for src/data: NumPy reads the same files and
rebuilds each batch that data_batch_tool printed.

Checked per case: the vocabulary (char: sorted distinct code points, as
nanoGPT's shakespeare_char prepare.py builds it), the token count of the
range, every row of input_ids and targets from the printed row offsets, and
the offsets themselves: random offsets are recomputed from the seed with a
Python xoshiro256** (splitmix64 seeding, rejection sampling for the bound),
sequential ones from the window rule. Exit status 0 when all cases agree.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

MASK = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & MASK


class Xoshiro256ss:
    def __init__(self, seed):
        x = seed & MASK
        self.s = []
        for _ in range(4):
            x, v = splitmix64(x)
            self.s.append(v)

    def next_u64(self):
        s = self.s
        result = (rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def next_below(self, bound):
        threshold = ((1 << 64) - bound) % bound
        while True:
            r = self.next_u64()
            if r >= threshold:
                return r % bound


def run_tool(tool, path, fmt, sampling, b, t, seed, batches, rng=None):
    argv = [tool, path, fmt, sampling, str(b), str(t), str(seed), str(batches)]
    if rng is not None:
        argv += [str(rng[0]), str(rng[1])]
    out = subprocess.run(argv, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def reference_tokens(path, fmt, offset, length):
    raw = open(path, "rb").read()
    if fmt == "u16":
        ids = np.frombuffer(raw, dtype="<u2").astype(np.int64)
        return ids[offset // 2:(offset + length) // 2], None, int(ids.max()) + 1
    if fmt == "byte":
        ids = np.frombuffer(raw, dtype=np.uint8).astype(np.int64)
        return ids[offset:offset + length], None, 256
    text = raw.decode("utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    part = raw[offset:offset + length].decode("utf-8")
    ids = np.array([stoi[c] for c in part], dtype=np.int64)
    return ids, [ord(c) for c in chars], len(chars)


def check_case(tool, path, fmt, sampling, b, t, seed, batches, rng=None):
    got = run_tool(tool, path, fmt, sampling, b, t, seed, batches, rng)
    offset, length = got["offset"], got["length"]
    ids, symbols, vocab = reference_tokens(path, fmt, offset, length)
    name = f"{os.path.basename(path)} {fmt} {sampling} B={b} T={t} seed={seed}"
    assert got["vocab_size"] == vocab, (name, got["vocab_size"], vocab)
    if symbols is not None:
        assert got["symbols"] == symbols, name
    n = len(ids)
    assert got["tokens"] == n, (name, got["tokens"], n)
    prng = Xoshiro256ss(seed)
    position = 0
    for k, batch in enumerate(got["batches"]):
        rows = batch["rows"]
        if sampling == "random":
            expected_rows = [prng.next_below(n - t) for _ in range(b)]
        else:
            if position + b * t + 1 > n:
                position = 0
            expected_rows = [position + i * t for i in range(b)]
            position += b * t
        assert rows == expected_rows, (name, k, rows, expected_rows)
        x = np.stack([ids[s:s + t] for s in rows])
        y = np.stack([ids[s + 1:s + t + 1] for s in rows])
        gx = np.array(batch["inputs"], dtype=np.int64).reshape(b, t)
        gy = np.array(batch["targets"], dtype=np.int64).reshape(b, t)
        assert np.array_equal(gx, x), (name, k, "inputs")
        assert np.array_equal(gy, y), (name, k, "targets")
    print(f"ok  {name}: {len(got['batches'])} batches, {n} tokens")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", required=True)
    parser.add_argument("--shakespeare", required=True)
    parser.add_argument("--work-dir", required=True)
    args = parser.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    rs = np.random.default_rng(7)

    shakespeare = args.shakespeare
    size = os.path.getsize(shakespeare)
    # nanoGPT's split: the first int(n * 0.9) characters train (ASCII file).
    cut = int(size * 0.9)
    check_case(args.tool, shakespeare, "char", "random", 4, 64, 1337, 3)
    check_case(args.tool, shakespeare, "char", "random", 2, 16, 42, 2,
               (cut, size - cut))
    check_case(args.tool, shakespeare, "char", "sequential", 3, 32, 0, 4)
    check_case(args.tool, shakespeare, "byte", "random", 4, 32, 9, 2)

    # Multi-byte UTF-8: token offsets are code points, ranges are bytes.
    utf8_path = os.path.join(args.work_dir, "utf8.txt")
    alphabet = ["a", "b", " ", "\n", "é", "ö", "✓", "€", "🙂", "ß"]
    text = "".join(rs.choice(alphabet, size=5000))
    with open(utf8_path, "w", encoding="utf-8") as f:
        f.write(text)
    raw = text.encode("utf-8")
    # A range that starts and ends on code point boundaries inside the file.
    start = len(text[:1000].encode("utf-8"))
    end = len(text[:4000].encode("utf-8"))
    check_case(args.tool, utf8_path, "char", "random", 3, 24, 5, 3)
    check_case(args.tool, utf8_path, "char", "random", 3, 24, 6, 2,
               (start, end - start))
    assert len(raw) > len(text)

    # u16 tokens (nanochat-style ids), odd offsets never used.
    u16_path = os.path.join(args.work_dir, "tokens.u16")
    rs.integers(0, 50000, size=20000, dtype=np.uint16).astype("<u2").tofile(
        u16_path)
    check_case(args.tool, u16_path, "u16", "random", 4, 48, 123, 3)
    check_case(args.tool, u16_path, "u16", "sequential", 8, 100, 0, 30)
    check_case(args.tool, u16_path, "u16", "random", 2, 8, 77, 2,
               (2000, 6000))

    byte_path = os.path.join(args.work_dir, "bytes.bin")
    rs.integers(0, 256, size=4096, dtype=np.uint8).tofile(byte_path)
    check_case(args.tool, byte_path, "byte", "sequential", 2, 100, 0, 25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
