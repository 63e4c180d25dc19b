# SPDX-License-Identifier: Apache-2.0
"""safetensors interop against the `safetensors` PyPI package.

1. Files written by the package (f32, bf16, f16, i64, bool, empty, scalar,
   metadata; one file and a sharded checkpoint with an index) are read by
   our reader bit-exactly: dtype, shape and the SHA-256 of every tensor's
   bytes match.
2. A file written by our writer is read by the package: the same values,
   the metadata, and the 8-byte header padding the format asks for.
3. A tiny random Qwen3 checkpoint with the Hugging Face names, written by
   the package in bf16 and in f32, loads into the built-in f32 and bf16
   tables: bf16 -> f32 widens exactly, f32 -> bf16 rounds to nearest even
   as ml_dtypes does; a tied checkpoint (no lm_head.weight) fills lm_head
   from the embedding only with tie_word_embeddings; a missing or
   mis-shaped tensor fails naming it.

Usage: safetensors_py_test.py DRIVER (the safetensors_driver binary).
"""

import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

DRIVER = sys.argv[1]
NAMES = {
    np.dtype(np.float32): "f32",
    np.dtype(ml_dtypes.bfloat16): "bf16",
    np.dtype(np.float16): "f16",
    np.dtype(np.int64): "i64",
    np.dtype(np.int32): "i32",
    np.dtype(np.bool_): "i1",
}


def dump(path):
    out = subprocess.run([DRIVER, "dump", path], check=True,
                         capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        name, dtype, shape, digest = line.split(" ")
        rows[name] = (dtype, shape, digest)
    return rows


def expect(tensors):
    return {
        name: (NAMES[a.dtype], "[" + ",".join(str(d) for d in a.shape) + "]",
               hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
        for name, a in tensors.items()
    }


def random_tensors(rng, prefix):
    return {
        prefix + "f32": rng.standard_normal((7, 5)).astype(np.float32),
        prefix + "bf16": rng.standard_normal((3, 4, 2)).astype(
            ml_dtypes.bfloat16),
        prefix + "f16": rng.standard_normal((9,)).astype(np.float16),
        prefix + "i64": rng.integers(-2**62, 2**62, size=(4, 3),
                                     dtype=np.int64),
        prefix + "i32": rng.integers(-2**31, 2**31, size=(5,),
                                     dtype=np.int32),
        prefix + "bool": rng.integers(0, 2, size=(6,)).astype(np.bool_),
        prefix + "empty": np.zeros((0, 4), dtype=np.float32),
        prefix + "scalar": np.array(3.5, dtype=np.float32),
    }


def sha(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def qwen3_load(path, dtype, tied, tie):
    return subprocess.run(
        [DRIVER, "qwen3-load", path, dtype, "1" if tied else "0",
         "1" if tie else "0"], capture_output=True, text=True)


def qwen3_checks(rng, tmp):
    failures = 0
    out = subprocess.run([DRIVER, "qwen3-params", "0"], check=True,
                         capture_output=True, text=True).stdout
    params = []
    for line in out.splitlines():
        name, shape = line.split(" ")
        params.append((name, tuple(int(d) for d in shape.split(","))))
    names = [n for n, _ in params]
    for expected in ("model.embed_tokens.weight",
                     "model.layers.1.self_attn.k_norm.weight",
                     "model.layers.0.mlp.down_proj.weight", "lm_head.weight"):
        if expected not in names:
            print("FAIL qwen3 table lacks", expected)
            failures += 1
    values = {n: rng.standard_normal(shape).astype(np.float32)
              for n, shape in params}
    bf16_path = os.path.join(tmp, "qwen3_bf16.safetensors")
    save_file({n: v.astype(ml_dtypes.bfloat16) for n, v in values.items()},
              bf16_path, metadata={"format": "pt"})
    f32_path = os.path.join(tmp, "qwen3_f32.safetensors")
    save_file(values, f32_path, metadata={"format": "pt"})
    cases = [
        (bf16_path, "f32", lambda v: v.astype(ml_dtypes.bfloat16).astype(
            np.float32)),
        (bf16_path, "bf16", lambda v: v.astype(ml_dtypes.bfloat16)),
        (f32_path, "f32", lambda v: v),
        (f32_path, "bf16", lambda v: v.astype(ml_dtypes.bfloat16)),
    ]
    for path, dtype, convert in cases:
        result = qwen3_load(path, dtype, False, False)
        got = dict(line.split(" ") for line in result.stdout.splitlines())
        want = {n: sha(convert(v)) for n, v in values.items()}
        if result.returncode != 0 or got != want:
            print("FAIL qwen3", os.path.basename(path), "->", dtype,
                  result.stderr)
            failures += 1
    # Tied checkpoint: no lm_head.weight.
    tied_path = os.path.join(tmp, "qwen3_tied.safetensors")
    tied = {n: v for n, v in values.items() if n != "lm_head.weight"}
    save_file(tied, tied_path)
    result = qwen3_load(tied_path, "f32", False, False)
    if result.returncode == 0 or "'lm_head.weight'" not in result.stderr:
        print("FAIL untied load of a tied checkpoint:", result.stderr)
        failures += 1
    result = qwen3_load(tied_path, "f32", False, True)
    got = dict(line.split(" ") for line in result.stdout.splitlines())
    if (result.returncode != 0 or
            got.get("lm_head.weight") !=
            sha(values["model.embed_tokens.weight"])):
        print("FAIL tie_word_embeddings load:", result.stderr)
        failures += 1
    result = qwen3_load(tied_path, "f32", True, False)
    if result.returncode != 0:
        print("FAIL tied table:", result.stderr)
        failures += 1
    # Missing and mis-shaped tensors.
    missing_path = os.path.join(tmp, "qwen3_missing.safetensors")
    missing = dict(values)
    del missing["model.layers.1.post_attention_layernorm.weight"]
    save_file(missing, missing_path)
    result = qwen3_load(missing_path, "f32", False, False)
    if (result.returncode == 0 or
            "'model.layers.1.post_attention_layernorm.weight'" not in
            result.stderr or "missing" not in result.stderr):
        print("FAIL missing tensor:", result.stderr)
        failures += 1
    wrong_path = os.path.join(tmp, "qwen3_wrong.safetensors")
    wrong = dict(values)
    wrong["model.layers.0.self_attn.q_proj.weight"] = np.zeros(
        (8, 32), np.float32)
    save_file(wrong, wrong_path)
    result = qwen3_load(wrong_path, "f32", False, False)
    if (result.returncode == 0 or
            "'model.layers.0.self_attn.q_proj.weight'" not in result.stderr or
            "[8, 32]" not in result.stderr):
        print("FAIL wrong shape:", result.stderr)
        failures += 1
    return failures


def main():
    rng = np.random.default_rng(20261202)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        # 1. One file written by the package.
        tensors = random_tensors(rng, "")
        path = os.path.join(tmp, "py.safetensors")
        save_file(tensors, path, metadata={"format": "np"})
        got, want = dump(path), expect(tensors)
        if got != want:
            print("FAIL single file:\n got ", got, "\n want", want)
            failures += 1

        # Sharded: two shards and an index, opened through the directory.
        shard_dir = os.path.join(tmp, "sharded")
        os.mkdir(shard_dir)
        a = random_tensors(rng, "model.a.")
        b = random_tensors(rng, "model.b.")
        save_file(a, os.path.join(shard_dir, "model-00001-of-00002.safetensors"))
        save_file(b, os.path.join(shard_dir, "model-00002-of-00002.safetensors"))
        weight_map = {k: "model-00001-of-00002.safetensors" for k in a}
        weight_map.update({k: "model-00002-of-00002.safetensors" for k in b})
        with open(os.path.join(shard_dir, "model.safetensors.index.json"),
                  "w") as f:
            json.dump({"metadata": {"total_size": 0},
                       "weight_map": weight_map}, f)
        got, want = dump(shard_dir), expect({**a, **b})
        if got != want:
            print("FAIL sharded:\n got ", got, "\n want", want)
            failures += 1

        # 2. Our writer, read by the package.
        ours = os.path.join(tmp, "ours.safetensors")
        subprocess.run([DRIVER, "write", ours], check=True)
        with open(ours, "rb") as f:
            raw = f.read()
        (header_length,) = struct.unpack("<Q", raw[:8])
        if header_length % 8 != 0:
            print("FAIL header length", header_length, "not a multiple of 8")
            failures += 1
        want = {
            "f32": np.arange(6, dtype=np.float32).reshape(2, 3) * 0.25 - 1.0,
            "bf16": (0x3F80 + np.arange(4, dtype=np.uint16)).view(
                ml_dtypes.bfloat16),
            "f16": (0x3C00 + 3 * np.arange(3, dtype=np.uint16)).view(
                np.float16),
            "i64": np.arange(5, dtype=np.int64) * 1000000007 - 5,
            "flags": np.array([True, False, True]),
            "empty": np.zeros((0, 3), dtype=np.float32),
            "scalar": np.array(0.25, dtype=np.float32),
        }
        with safe_open(ours, framework="numpy") as f:
            if f.metadata() != {"format": "pt", "producer": "pcp"}:
                print("FAIL metadata", f.metadata())
                failures += 1
            if sorted(f.keys()) != sorted(want):
                print("FAIL keys", sorted(f.keys()))
                failures += 1
            for name, expected in want.items():
                value = f.get_tensor(name)
                if (value.dtype != expected.dtype or
                        value.shape != expected.shape or
                        value.tobytes() != expected.astype(
                            expected.dtype).tobytes()):
                    print("FAIL", name, value.dtype, value.shape, value,
                          "want", expected.dtype, expected.shape, expected)
                    failures += 1
        failures += qwen3_checks(rng, tmp)
    if failures:
        print(f"safetensors_py_test: {failures} failure(s)")
        return 1
    print("safetensors_py_test: package files read bit-exactly (single and "
          "sharded); our file read by the package; Qwen3 checkpoints of "
          "the package load into the f32 and bf16 tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
