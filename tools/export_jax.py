#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Export a JAX loss function to a StableHLO forward-loss module for PCP.

PCP's training programs start from `@main(params..., data...) -> loss`.
This writes that module for a JAX function: jax.jit(f).lower(*example
args).as_text() gives StableHLO text whose @main takes the flattened
arguments in order. `pcp compile --program grad|train` then derives the
gradient and training functions from it.

Usage:
  tools/export_jax.py --model mlp|transformer -o model.mlir [--seed N]
      [--params-npz params.npz]
      transformer only: [--vocab V] [--seq T] [--batch B] [--width W]
      [--heads H] [--token-dtype i32|i64]

As a library: `export(loss_fn, params, data) -> str`, and the two tiny
reference models (`mlp_model`, `transformer_model`) used by the autodiff
tests, each returning (loss_fn, params, data).
"""
import argparse
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np


def _iree_opt():
    import iree.compiler
    return os.path.join(os.path.dirname(iree.compiler.__file__), "_mlir_libs",
                        "iree-opt")


def export(loss_fn, params, data, inline=True):
    """StableHLO text of loss_fn(*params, *data) (a scalar).

    JAX emits private helper functions (`call @_where`, `@_one_hot`);
    PCP's autodiff differentiates one function and rejects func.call, so by
    default they are inlined with the wheel's iree-opt (--inline
    --symbol-dce).
    """
    args = [jnp.asarray(p) for p in params] + [jnp.asarray(d) for d in data]
    text = jax.jit(loss_fn).lower(*args).as_text()
    if inline:
        text = subprocess.run([_iree_opt(), "--inline", "--symbol-dce", "-"],
                              input=text, capture_output=True, text=True,
                              check=True).stdout
    return text


def _cross_entropy(logits, targets, vocab):
    # Mean token cross entropy through a one-hot (a compare with iota), so
    # the module needs no gather with batching dims.
    logits = logits - jax.lax.stop_gradient(logits.max(-1, keepdims=True))
    log_z = jnp.log(jnp.exp(logits).sum(-1))
    one_hot = jax.nn.one_hot(targets, vocab, dtype=logits.dtype)
    picked = (logits * one_hot).sum(-1)
    return (log_z - picked).mean()


def mlp_model(seed=0, batch=8, d_in=6, hidden=16, classes=5):
    """2-layer MLP classifier: params (w1, b1, w2, b2), data (x f32, y i32)."""
    rng = np.random.default_rng(seed)
    params = [
        (rng.standard_normal((d_in, hidden)) * 0.5).astype(np.float32),
        (rng.standard_normal((hidden,)) * 0.1).astype(np.float32),
        (rng.standard_normal((hidden, classes)) * 0.5).astype(np.float32),
        (rng.standard_normal((classes,)) * 0.1).astype(np.float32),
    ]
    data = [
        rng.standard_normal((batch, d_in)).astype(np.float32),
        rng.integers(0, classes, (batch,)).astype(np.int32),
    ]

    def loss_fn(w1, b1, w2, b2, x, y):
        h = jnp.tanh(x @ w1 + b1)
        return _cross_entropy(h @ w2 + b2, y, classes)

    return loss_fn, params, data


def transformer_model(seed=0, batch=2, seq=8, vocab=11, width=16, heads=2,
                      token_dtype=np.int32):
    """One-block causal transformer LM (learned positions, LayerNorm, GELU
    MLP, tied head): data (tokens, targets), i32 unless token_dtype says
    int64 (as torch-mlir exports have; needs jax_enable_x64)."""
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    params = [
        normal(vocab, width),            # token embedding (tied head)
        normal(seq, width),              # positions
        np.ones(width, np.float32),      # ln1 gain
        np.zeros(width, np.float32),     # ln1 bias
        normal(width, 3 * width),        # qkv
        normal(width, width),            # attention out
        np.ones(width, np.float32),      # ln2 gain
        np.zeros(width, np.float32),     # ln2 bias
        normal(width, 4 * width),        # mlp in
        normal(4 * width, width),        # mlp out
        np.ones(width, np.float32),      # final ln gain
    ]
    data = [
        rng.integers(0, vocab, (batch, seq)).astype(token_dtype),
        rng.integers(0, vocab, (batch, seq)).astype(token_dtype),
    ]

    def layer_norm(x, gain, bias=None):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + 1e-5) * gain
        return y if bias is None else y + bias

    def loss_fn(wte, wpe, g1, b1, wqkv, wo, g2, b2, w_in, w_out, gf, tokens,
                targets):
        x = wte[tokens] + wpe[None, :, :]
        h = layer_norm(x, g1, b1)
        q, k, v = jnp.split(h @ wqkv, 3, axis=-1)
        d = width // heads

        def split_heads(t):
            return t.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)

        q, k, v = split_heads(q), split_heads(k), split_heads(v)
        scores = (q @ k.transpose(0, 1, 3, 2)) / np.sqrt(d).astype(np.float32)
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        scores = jnp.where(mask, scores, jnp.float32(-1e9))
        scores = scores - scores.max(-1, keepdims=True)
        weights = jnp.exp(scores)
        weights = weights / weights.sum(-1, keepdims=True)
        attn = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, seq, width)
        x = x + attn @ wo
        h = layer_norm(x, g2, b2)
        x = x + jax.nn.gelu(h @ w_in, approximate=True) @ w_out
        logits = layer_norm(x, gf) @ wte.T
        return _cross_entropy(logits, targets, vocab)

    return loss_fn, params, data


MODELS = {"mlp": mlp_model, "transformer": transformer_model}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--params-npz",
                        help="also write the initial params and data here")
    sizes = parser.add_argument_group("transformer sizes")
    for name in ("vocab", "seq", "batch", "width", "heads"):
        sizes.add_argument("--" + name, type=int)
    sizes.add_argument("--token-dtype", choices=("i32", "i64"), default="i32")
    args = parser.parse_args(argv)
    kwargs = {"seed": args.seed}
    if args.model == "transformer":
        for name in ("vocab", "seq", "batch", "width", "heads"):
            value = getattr(args, name)
            if value is not None:
                if value < 1:
                    parser.error("--%s must be positive" % name)
                kwargs[name] = value
        if args.token_dtype == "i64":
            jax.config.update("jax_enable_x64", True)
            kwargs["token_dtype"] = np.int64
    elif any(getattr(args, n) is not None
             for n in ("vocab", "seq", "batch", "width", "heads")):
        parser.error("size flags are for --model transformer")
    loss_fn, params, data = MODELS[args.model](**kwargs)
    with open(args.output, "w") as f:
        f.write(export(loss_fn, params, data))
    if args.params_npz:
        np.savez(args.params_npz, *params, *data)
    print(f"wrote {args.output}: {len(params)} params, {len(data)} data "
          f"arguments", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
