#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Toy model directories for the inference tests and bench/gateway_overhead,
and their greedy references.

  gpt-char   random-weight GPT, char tokenizer (the shape the training
             service writes: model.json + model.safetensors, table names)
  qwen3-bpe  random-weight Qwen3 with a byte-level BPE tokenizer.json
             trained here by the `tokenizers` package, Qwen chat template

Weights are drawn so that activations are O(1) (as tests/models does), so
greedy choices have clear margins. The reference is tests/models/
jax_reference.py (an independent jax.numpy implementation), full forward
per generated token, f32.
"""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "models"))

CHAR_VOCAB = "\n !',.?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

GPT = dict(name="gpt-char", architecture="gpt", layers=2, heads=4, width=64,
           vocab=len(CHAR_VOCAB), block_size=96, max_length=96, slots=4,
           prefill_length=16)
QWEN = dict(name="qwen3-bpe", architecture="qwen3", layers=2, heads=4,
            kv_heads=2, width=64, block_size=128, max_length=128, slots=4,
            prefill_length=16)


def corpus():
    words = ("the quick brown fox jumps over a lazy dog while seven wizards "
             "quietly hum songs about rivers mountains and distant cities "
             "hello world how are you today fine thanks and you").split()
    rng = np.random.default_rng(3)
    return [" ".join(rng.choice(words, size=12)) for _ in range(400)]


def train_bpe(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, min_frequency=1, special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.save(path)
    return Tokenizer.from_file(path)


def param_table(pcp, work, cfg):
    args = [pcp, "model", cfg["architecture"], "--layers", str(cfg["layers"]),
            "--heads", str(cfg["heads"]), "--width", str(cfg["width"]),
            "--vocab", str(cfg["vocab"]), "--block-size",
            str(cfg["block_size"]), "--batch", "1", "-o",
            os.path.join(work, cfg["name"] + ".mlir"), "--params-json",
            os.path.join(work, cfg["name"] + ".params.json")]
    if "kv_heads" in cfg:
        args += ["--kv-heads", str(cfg["kv_heads"])]
    subprocess.run(args, check=True, capture_output=True, timeout=120)
    with open(os.path.join(work, cfg["name"] + ".params.json")) as f:
        return json.load(f)


def weights(table, seed):
    rng = np.random.default_rng(seed)
    out = {}
    for e in table["parameters"]:
        shape = tuple(e["shape"])
        name = e["name"]
        if e["init"] == "ones":
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        elif e["init"] == "zeros":
            x = 0.1 * rng.standard_normal(shape)
        elif "wte" in name or "embed" in name or "wpe" in name:
            x = rng.standard_normal(shape)
        else:
            x = rng.standard_normal(shape) / np.sqrt(shape[1])
        out[name] = x.astype(np.float32)
    return out


class Model:
    """A model directory plus what a test needs to predict its output."""

    def __init__(self, pcp, root, cfg, seed):
        from safetensors.numpy import save_file
        self.cfg = dict(cfg)
        self.name = cfg["name"]
        self.dir = os.path.join(root, self.name)
        os.makedirs(self.dir, exist_ok=True)
        meta = {k: v for k, v in cfg.items()}
        self.tokenizer = None
        if cfg["architecture"] == "qwen3":
            self.tokenizer = train_bpe(os.path.join(self.dir, "tokenizer.json"))
            meta["vocab"] = self.cfg["vocab"] = self.tokenizer.get_vocab_size()
            meta["tokenizer"] = {"kind": "bpe", "path": "tokenizer.json"}
            meta["chat_template"] = "qwen"
            self.eos = [self.tokenizer.token_to_id("<|im_end|>"),
                        self.tokenizer.token_to_id("<|endoftext|>")]
        else:
            meta["tokenizer"] = {"kind": "char", "vocab": CHAR_VOCAB}
            self.eos = []
        meta["dtype"] = "f32"
        meta["weights"] = "model.safetensors"
        self.table = param_table(pcp, root, self.cfg)
        self.params = weights(self.table, seed)
        save_file(self.params, os.path.join(self.dir, "model.safetensors"))
        with open(os.path.join(self.dir, "model.json"), "w") as f:
            json.dump(meta, f, indent=1)
        self._forward = None

    # Tokens ---------------------------------------------------------------
    def encode_prompt(self, text):
        if self.tokenizer:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        return [CHAR_VOCAB.index(c) for c in text]

    def encode_chat(self, messages):
        if self.tokenizer:
            text = "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"],
                                                                m["content"])
                           for m in messages) + "<|im_start|>assistant\n"
            return self.encode_prompt(text)
        return self.encode_prompt("\n".join(m["content"] for m in messages))

    def decode(self, ids):
        if self.tokenizer:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        return "".join(CHAR_VOCAB[i] for i in ids)

    # Reference --------------------------------------------------------------
    def greedy(self, prompt_ids, max_tokens):
        """(ids, finish_reason) of greedy generation by the JAX reference."""
        import jax
        import jax.numpy as jnp
        import jax_reference as ref
        if self._forward is None:
            named = {k: jnp.asarray(v) for k, v in self.params.items()}
            spec = dict(self.table["spec"])
            arch = self.table["architecture"]
            self._forward = jax.jit(
                lambda ids: ref.REFERENCES[arch](named, spec, ids))
        length = self.cfg["max_length"]
        seq = list(prompt_ids)
        out = []
        while len(out) < max_tokens:
            ids = np.zeros((1, length), np.int32)
            ids[0, :len(seq)] = seq
            logits = np.asarray(self._forward(jnp.asarray(ids)))[0, len(seq) - 1]
            token = int(np.argmax(logits))
            if token in self.eos:
                return out, "stop"
            out.append(token)
            seq.append(token)
            if len(seq) >= length:
                break
        return out, "length"
