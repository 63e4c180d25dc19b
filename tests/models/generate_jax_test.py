#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""KV-cache generation (@prefill / @decode) against the JAX reference.

For each case: `pcp model ARCH ... --generate` emits the generation module,
`pcp compile` builds it for CPU, random parameters (as models_jax_test.py
draws them) and two prompts of different lengths go to
models_generate_tool, which runs the C generation driver
(pcp_models_generator_*: weights and caches resident on pcp_backend_t):
each prompt prefilled into its own slot (the longer one in two chunks),
then 63 greedy decode steps of both slots in one batch, then each prompt
again alone. The reference is jax_reference.py's full-sequence forward
(no cache): its logits at the last position of the same token sequence.

Checked, per case:
  prefill logits        max rel err <= 1e-4 (max abs err / max |logit|)
  decode logits         every step, on the driver's own tokens, <= 1e-4
  greedy tokens (64)    identical to the reference's own greedy run
  batched vs alone      identical tokens (slots at different positions)
  KV bytes per session  measured device bytes / slots == analytic size

Usage (ctest): python generate_jax_test.py PCP_BINARY GENERATE_TOOL
Closes with 'N passed, M failed'.
"""
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax_reference as ref  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

PCP, TOOL = sys.argv[1], sys.argv[2]
NEW_TOKENS = 64
TOLERANCE = 1e-4

# (name, arch, layers, heads, kv_heads, width, vocab, block, slots,
#  max_length, prefill_length, prompt lengths)
CASES = [
    ("qwen3", "qwen3", 2, 4, 2, 64, 256, 80, 2, 80, 8, (11, 5)),
    ("gpt", "gpt", 2, 4, 4, 64, 256, 80, 2, 80, 16, (9, 3)),
    ("nanochat", "nanochat", 2, 4, 2, 64, 256, 80, 2, 80, 8, (7, 4)),
    # bf16 parameters, activations and cache; f32 norms, softmax, logits.
    ("qwen3_bf16", "qwen3", 2, 4, 2, 64, 256, 80, 2, 80, 8, (11, 5), "bf16"),
]
# bf16 logits: as models_jax_test.py (the two compilers round bf16
# intermediates at different places). Greedy tokens are then only compared
# for batched == alone: a near-tie may flip against the reference.
BF16_TOLERANCE = 5e-2


def make_parameters(table, rng):
    """As models_jax_test.py: activations O(1) so every op matters."""
    values = []
    for entry in table["parameters"]:
        shape = tuple(entry["shape"])
        name = entry["name"]
        if entry["init"] == "ones":
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        elif entry["init"] == "zeros":
            x = 0.1 * rng.standard_normal(shape)
        elif "wte" in name or "embed" in name or "wpe" in name:
            x = rng.standard_normal(shape)
        else:
            x = rng.standard_normal(shape) / np.sqrt(shape[1])
        values.append(x.astype(np.float32))
    return values


def run(args):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (os.path.basename(args[0]),
                                                  proc.returncode,
                                                  proc.stderr.strip()[-2000:]))
    return proc.stdout


def rel_err(got, want):
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def run_case(tmp, case, seed):
    (name, arch, layers, heads, kv, width, vocab, block, slots, max_len,
     prefill, prompt_lengths) = case[:12]
    dtype = case[12] if len(case) > 12 else "f32"
    tolerance = BF16_TOLERANCE if dtype == "bf16" else TOLERANCE
    mlir = os.path.join(tmp, name + ".mlir")
    vmfb = os.path.join(tmp, name + ".vmfb")
    pjson = os.path.join(tmp, name + ".json")
    flags = ["--layers", str(layers), "--heads", str(heads), "--width",
             str(width), "--vocab", str(vocab), "--block-size", str(block),
             "--batch", str(slots)]
    if arch != "gpt":
        flags += ["--kv-heads", str(kv)]
    flags += ["--dtype", dtype]
    run([PCP, "model", arch] + flags + ["--generate", "--max-length",
                                        str(max_len), "--prefill-length",
                                        str(prefill), "-o", mlir,
                                        "--params-json", pjson])
    run([PCP, "compile", mlir, "-o", vmfb])
    with open(pjson) as f:
        table = json.load(f)
    # The reference forward at T = max_len (GPT's position table is
    # block_size rows, so block_size == max_len for GPT).
    spec = dict(table["spec"])

    rng = np.random.default_rng(seed)
    params = make_parameters(table, rng)
    pdir = os.path.join(tmp, name + "_params")
    os.makedirs(pdir, exist_ok=True)
    for i, x in enumerate(params):
        np.save(os.path.join(pdir, "%03d.npy" % i), x)
    prompts = [rng.integers(0, vocab, size=(n,), dtype=np.int32)
               for n in prompt_lengths]
    prompt_paths = []
    for i, p in enumerate(prompts):
        path = os.path.join(tmp, "%s_prompt%d.npy" % (name, i))
        np.save(path, p)
        prompt_paths.append(path)
    out = os.path.join(tmp, name + "_out")
    os.makedirs(out, exist_ok=True)
    text = run([TOOL, vmfb, arch + (":bf16" if dtype == "bf16" else ""),
                str(layers), str(heads),
                str(kv if arch != "gpt" else 0), str(width), str(vocab),
                str(block), str(slots), str(max_len), str(prefill), pdir, out,
                str(NEW_TOKENS)] + prompt_paths)
    prefill_logits = np.load(os.path.join(out, "prefill_logits.npy"))
    decode_logits = np.load(os.path.join(out, "decode_logits.npy"))
    tokens = np.load(os.path.join(out, "tokens.npy"))
    alone = np.load(os.path.join(out, "tokens_alone.npy"))

    jdtype = jnp.bfloat16 if dtype == "bf16" else jnp.float32
    named = {e["name"]: jnp.asarray(p).astype(jdtype)
             for e, p in zip(table["parameters"], params)}
    forward = jax.jit(lambda ids: ref.REFERENCES[arch](named, spec, ids))

    def ref_logits(seq):
        ids = np.zeros((1, max_len), np.int32)
        ids[0, :len(seq)] = seq
        return np.asarray(forward(jnp.asarray(ids)))[0, len(seq) - 1]

    problems = []
    agree = NEW_TOKENS  # leading greedy tokens equal to the reference's
    worst_prefill = worst_decode = 0.0
    for i, prompt in enumerate(prompts):
        worst_prefill = max(worst_prefill,
                            rel_err(prefill_logits[i], ref_logits(prompt)))
        # Decode logits on the driver's own tokens (teacher forcing), so a
        # token mismatch does not hide a logits comparison.
        seq = list(prompt)
        for t in range(NEW_TOKENS - 1):
            seq.append(int(tokens[i, t]))
            worst_decode = max(worst_decode,
                               rel_err(decode_logits[t, i], ref_logits(seq)))
        # The reference's own greedy run.
        seq = list(prompt)
        want = []
        for t in range(NEW_TOKENS):
            nxt = int(np.argmax(ref_logits(seq)))
            want.append(nxt)
            seq.append(nxt)
        first = next((t for t in range(NEW_TOKENS) if tokens[i, t] != want[t]),
                     NEW_TOKENS)
        agree = min(agree, first)
        if first < NEW_TOKENS and dtype == "f32":
            problems.append("slot %d greedy differs from the reference at "
                            "token %d" % (i, first))
        if list(alone[i]) != list(tokens[i]):
            problems.append("slot %d batched tokens differ from alone" % i)
    if worst_prefill > tolerance:
        problems.append("prefill logits rel err %.3g" % worst_prefill)
    if worst_decode > tolerance:
        problems.append("decode logits rel err %.3g" % worst_decode)
    kv_line = text.strip().splitlines()[-1]
    parts = dict(p.split("=") for p in kv_line.split()[1:])
    if parts["measured"] != parts["analytic"]:
        problems.append("kv bytes " + kv_line)
    print("%s: prefill rel err %.2e, decode rel err %.2e (%d steps x %d "
          "slots), greedy %d/%d tokens as the reference, %s %s" % (
              name, worst_prefill, worst_decode, NEW_TOKENS - 1, len(prompts),
              agree, NEW_TOKENS, kv_line, "ok" if not problems else
              "FAIL: " + "; ".join(problems)))
    return problems


def main():
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed, case in enumerate(CASES):
            try:
                problems = run_case(tmp, case, seed + 1)
            except Exception as e:  # a failed tool call is a failed case
                print("%s: FAIL: %s" % (case[0], e))
                problems = [str(e)]
            failed += bool(problems)
    print("%d passed, %d failed" % (len(CASES) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
