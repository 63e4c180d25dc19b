#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""@decode updates the KV caches in place (docs/decisions.md, "@decode
updates the KV cache in place"): the generation module `pcp model
--generate` emits, compiled by `pcp compile`, called once through
iree.runtime's public API with random resident caches. Checks, for k and v:

- the caller's cache buffers hold the result after the call (the tie:
  results 1 and 2 written into the argument storage), and the result is
  not the input's old contents (rows were written);
- exactly rows (layer, slot, :, min(pos, L - 1)) changed; every other
  element is bit-identical to the input (no rewrite of the whole cache);
- a slot at pos = L (full) writes row L - 1, never outside its slot.

usage: decode_inplace_test.py PCP
"""

import json
import os
import subprocess
import sys
import tempfile

import iree.runtime as rt
import numpy as np

SLOTS, MAX_LEN = 3, 16
POSITIONS = np.array([0, 7, MAX_LEN], np.int32)  # slot 2 is full


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    pcp = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        mlir = os.path.join(tmp, "gen.mlir")
        vmfb = os.path.join(tmp, "gen.vmfb")
        pjson = os.path.join(tmp, "gen.json")
        subprocess.run(
            [pcp, "model", "qwen3", "--layers", "2", "--heads", "4",
             "--kv-heads", "2", "--width", "32", "--vocab", "64",
             "--block-size", str(MAX_LEN), "--batch", str(SLOTS),
             "--generate", "--max-length", str(MAX_LEN), "--prefill-length",
             "4", "-o", mlir, "--params-json", pjson], check=True,
            capture_output=True)
        subprocess.run([pcp, "compile", mlir, "-o", vmfb], check=True,
                       capture_output=True)
        with open(pjson) as f:
            table = json.load(f)
        with open(vmfb, "rb") as f:
            data = f.read()
    config = rt.Config("local-task")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, data))
    decode = ctx.modules.pcp_qwen3_generate.decode
    rng = np.random.default_rng(7)
    params = [rt.asdevicearray(config.device, (0.1 * rng.standard_normal(
        p["shape"])).astype(np.float32)) for p in table["parameters"]]
    spec = table["spec"]
    shape = (spec["layers"], SLOTS, spec["kv_heads"], MAX_LEN,
             spec["head_dim"])
    before = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    caches = [rt.asdevicearray(config.device, c) for c in before]
    ids = rng.integers(0, spec["vocab"], (SLOTS, 1)).astype(np.int32)
    outputs = decode(*params, ids, POSITIONS, caches[0], caches[1])
    problems = []
    rows = np.minimum(POSITIONS, MAX_LEN - 1)
    for name, old, arg, res in zip("kv", before, caches, outputs[1:]):
        after = res.to_host()
        if not np.array_equal(arg.to_host(), after):
            problems.append("%s: the argument buffer does not hold the result "
                            "(not updated in place)" % name)
        changed = old != after
        expect = np.zeros(shape, bool)
        for b in range(SLOTS):
            expect[:, b, :, rows[b], :] = True
        if np.any(changed & ~expect):
            where = np.argwhere(changed & ~expect)[0]
            problems.append("%s: element %s outside the written rows changed"
                            % (name, where.tolist()))
        for b in range(SLOTS):
            if not np.all(changed[:, b, :, rows[b], :]):
                problems.append("%s: slot %d row %d was not written" %
                                (name, b, rows[b]))
    logits = outputs[0].to_host()
    if logits.shape != (SLOTS, spec["vocab"]) or not np.all(
            np.isfinite(logits)):
        problems.append("logits: shape %s or non-finite values" %
                        (logits.shape,))
    for p in problems:
        print("FAIL: " + p)
    print("decode in place: %s" % ("ok" if not problems else
                                   "%d problems" % len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
