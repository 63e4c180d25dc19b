#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Independent jax.numpy implementations of PCP's built-in models.

Written from the architecture descriptions (nanoGPT, nanochat, Hugging Face
Qwen3; docs/models.md), never from the emitted MLIR, so that comparing the
two checks the formulas. Parameters are addressed by their checkpoint names
(the names in `pcp model --params-json`). In bf16 the casts match the
emitter's: bf16 parameters, activations and matmuls; norms, RoPE, scores,
softmax, logits and loss in f32.

    import jax_reference as ref
    table = json.load(open("p.json"))          # pcp model ... --params-json
    f = ref.loss_fn(table)                     # f(params_list, ids, targets)
    grads = jax.grad(f)(params_list, ids, targets)

Used by models_jax_test.py (forward numerics) and meant for the autodiff
checks (jax.grad of the same loss).
"""
import jax
import jax.numpy as jnp
import numpy as np

F32 = jnp.float32


# ---------------------------------------------------------------------------
# Reference building blocks (plain jax.numpy)
# ---------------------------------------------------------------------------

def dense(x, w, b=None):
    # torch nn.Linear: weight is [out, in].
    y = jnp.einsum("...i,oi->...o", x, w)
    return y if b is None else y + b


def layer_norm(x, w, b, eps=1e-5):
    xf = x.astype(F32)
    mu = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
    y = (xf - mu) / jnp.sqrt(var + eps) * w.astype(F32) + b.astype(F32)
    return y.astype(x.dtype)


def rms_norm(x, w, eps):
    xf = x.astype(F32)
    y = xf / jnp.sqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * w.astype(F32)
    return y.astype(x.dtype)


def rope_angles(seq, head_dim, theta):
    inv = (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    inv = jnp.asarray(inv.astype(np.float32))
    pos = jnp.arange(seq, dtype=F32)
    return pos[:, None] * inv[None, :]  # [T, hd/2]


def rope_hf(x, theta):
    # Hugging Face: x * cos + rotate_half(x) * sin, rotate_half = (-x2, x1),
    # with cos/sin repeated over both halves.
    hd = x.shape[-1]
    ang = rope_angles(x.shape[1], hd, theta)
    cos = jnp.concatenate([jnp.cos(ang)] * 2, axis=-1)[None, :, None, :]
    sin = jnp.concatenate([jnp.sin(ang)] * 2, axis=-1)[None, :, None, :]
    xf = x.astype(F32)
    rotated = jnp.concatenate([-xf[..., hd // 2:], xf[..., : hd // 2]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


def rope_nanochat(x, theta):
    # nanochat apply_rotary_emb: y1 = x1 cos + x2 sin, y2 = -x1 sin + x2 cos.
    hd = x.shape[-1]
    ang = rope_angles(x.shape[1], hd, theta)
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    xf = x.astype(F32)
    x1, x2 = xf[..., : hd // 2], xf[..., hd // 2:]
    y = jnp.concatenate([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], axis=-1)
    return y.astype(x.dtype)


def causal_attention(q, k, v):
    # q [B,T,H,hd], k/v [B,T,KV,hd]; kv heads repeated (HF repeat_kv order).
    groups = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, groups, axis=2)
    v = jnp.repeat(v, groups, axis=2)
    t = q.shape[1]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(F32) / np.sqrt(q.shape[-1])
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    o = jnp.einsum("bhqk,bkhd->bqhd", p, v)
    return o.reshape(o.shape[0], t, -1)


def split_heads(x, heads):
    b, t, n = x.shape
    return x.reshape(b, t, heads, n // heads)


def cross_entropy(logits, targets):
    logp = jax.nn.log_softmax(logits.astype(F32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


# ---------------------------------------------------------------------------
# Architectures
# ---------------------------------------------------------------------------

def gpt_logits(p, spec, ids):
    h = spec["heads"]
    x = p["transformer.wte.weight"][ids] + p["transformer.wpe.weight"][None]
    for i in range(spec["layers"]):
        pre = "transformer.h.%d." % i
        a = layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"])
        qkv = dense(a, p[pre + "attn.c_attn.weight"], p[pre + "attn.c_attn.bias"])
        q, k, v = jnp.split(qkv, 3, axis=-1)
        o = causal_attention(split_heads(q, h), split_heads(k, h), split_heads(v, h))
        x = x + dense(o, p[pre + "attn.c_proj.weight"], p[pre + "attn.c_proj.bias"])
        m = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"])
        m = jax.nn.gelu(dense(m, p[pre + "mlp.c_fc.weight"], p[pre + "mlp.c_fc.bias"]),
                        approximate=True)
        x = x + dense(m, p[pre + "mlp.c_proj.weight"], p[pre + "mlp.c_proj.bias"])
    x = layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    return dense(x, p["transformer.wte.weight"]).astype(F32)  # tied head


def nanochat_logits(p, spec, ids):
    eps = float(np.finfo(np.float32).eps)
    h, kv, theta = spec["heads"], spec["kv_heads"], spec["rope_theta"]
    x = rms_norm(p["transformer.wte.weight"][ids], None, eps)
    for i in range(spec["layers"]):
        pre = "transformer.h.%d." % i
        a = rms_norm(x, None, eps)
        q = split_heads(dense(a, p[pre + "attn.c_q.weight"]), h)
        k = split_heads(dense(a, p[pre + "attn.c_k.weight"]), kv)
        v = split_heads(dense(a, p[pre + "attn.c_v.weight"]), kv)
        q = rms_norm(rope_nanochat(q, theta), None, eps)
        k = rms_norm(rope_nanochat(k, theta), None, eps)
        x = x + dense(causal_attention(q, k, v), p[pre + "attn.c_proj.weight"])
        m = jnp.square(jax.nn.relu(dense(rms_norm(x, None, eps), p[pre + "mlp.c_fc.weight"])))
        x = x + dense(m, p[pre + "mlp.c_proj.weight"])
    x = rms_norm(x, None, eps)
    logits = dense(x, p["lm_head.weight"]).astype(F32)
    return 15.0 * jnp.tanh(logits / 15.0)


def qwen3_logits(p, spec, ids):
    eps = 1e-6
    h, kv, theta = spec["heads"], spec["kv_heads"], spec["rope_theta"]
    x = p["model.embed_tokens.weight"][ids]
    for i in range(spec["layers"]):
        pre = "model.layers.%d." % i
        a = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = split_heads(dense(a, p[pre + "self_attn.q_proj.weight"]), h)
        k = split_heads(dense(a, p[pre + "self_attn.k_proj.weight"]), kv)
        v = split_heads(dense(a, p[pre + "self_attn.v_proj.weight"]), kv)
        q = rope_hf(rms_norm(q, p[pre + "self_attn.q_norm.weight"], eps), theta)
        k = rope_hf(rms_norm(k, p[pre + "self_attn.k_norm.weight"], eps), theta)
        x = x + dense(causal_attention(q, k, v), p[pre + "self_attn.o_proj.weight"])
        m = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        m = jax.nn.silu(dense(m, p[pre + "mlp.gate_proj.weight"])) * dense(
            m, p[pre + "mlp.up_proj.weight"])
        x = x + dense(m, p[pre + "mlp.down_proj.weight"])
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if spec["tie_embeddings"] else p["lm_head.weight"]
    return dense(x, head).astype(F32)


REFERENCES = {"gpt": gpt_logits, "nanochat": nanochat_logits, "qwen3": qwen3_logits}


def logits(table, params, ids):
    """Logits [B, T, V] in f32 for |params| (a list in table order or a dict
    by name) and |ids| [B, T]."""
    if not isinstance(params, dict):
        params = {e["name"]: p for e, p in zip(table["parameters"], params)}
    return REFERENCES[table["architecture"]](params, table["spec"], ids)


def loss_fn(table):
    """f(params_list, ids, targets) -> mean cross-entropy (f32 scalar)."""
    def f(params, ids, targets):
        return cross_entropy(logits(table, params, ids), targets)
    return f
