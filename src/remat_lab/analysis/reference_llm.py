"""The llm's plain-jax.numpy reference for the gradient check: no NNX, no model code, no remat.

``llm_loss_and_abs(params, tokens, depth)`` re-implements ``model/llm.py`` from ``{path: array}``
parameters with the model's rounding points: embedding lookup; per block RMSNorm (statistics and
scaling in float32), the q/k/v products, the rotary embedding written as
``x * cos + rotate_half(x) * sin`` in float32, grouped-query attention by repeating each key/value
head over its query group (the model reshapes the queries instead), scores scaled in the dtype and
softmaxed in float32, the gated MLP; the final norm, the logits (``h @ E.T`` tied, else
``h @ W``) and the mean next-token cross-entropy in float32 with the labels picked by a one-hot
product, differentiated by JAX (the model's is MaxText's ``cross_entropy_with_logits`` with its
own custom gradient), whole or in the model's ``loss_chunks`` slices. ``gradcheck.py``
differentiates it and bounds the step.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

ROPE_THETA = 10000.0  # the model's rotary base (model/llm.py)


def _rms_norm(h: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    """flax's RMSNorm rounding points: float32 statistics and scaling, the result in h's dtype."""
    var = jnp.mean(jax.lax.square(h.astype(jnp.float32)), axis=-1, keepdims=True)
    return (h.astype(jnp.float32) * (jax.lax.rsqrt(var + eps) * scale)).astype(h.dtype)


def _softmax(s: jax.Array) -> jax.Array:
    e = jnp.exp(s - jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True)))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def _rotate(x: jax.Array) -> jax.Array:
    """The rotary embedding of ``x: (B, N, H, K)``: ``x * cos + rotate_half(x) * sin`` in float32."""
    n, k = x.shape[1], x.shape[-1]
    freq = 1.0 / (ROPE_THETA ** (jnp.arange(k // 2, dtype=jnp.float32) * 2.0 / k))
    ang = jnp.outer(jnp.arange(n, dtype=jnp.float32), freq)
    cos = jnp.concatenate([jnp.cos(ang)] * 2, axis=-1)[None, :, None, :]
    sin = jnp.concatenate([jnp.sin(ang)] * 2, axis=-1)[None, :, None, :]
    xf = x.astype(jnp.float32)
    half = jnp.concatenate([-xf[..., k // 2:], xf[..., : k // 2]], axis=-1)
    return (xf * cos + half * sin).astype(x.dtype)


def _block(h: jax.Array, p: dict) -> jax.Array:
    """One decoder block: GQA by repeating the key/value heads, rotary q and k, gated MLP."""
    a = _rms_norm(h, p["attn_norm.scale"])
    q, k, v = (jnp.einsum("bnd,dhk->bnhk", a, p[f"{n}_proj.kernel"]) for n in "qkv")
    q, k = _rotate(q), _rotate(k)
    group = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    n = h.shape[-2]
    scores = (jnp.einsum("bnhk,bmhk->bhnm", q, k) / math.sqrt(q.shape[-1])).astype(jnp.float32)
    scores = jnp.where(jnp.tril(jnp.ones((n, n), dtype=bool)), scores, jnp.finfo(jnp.float32).min)
    context = jnp.einsum("bhnm,bmhk->bnhk", _softmax(scores).astype(v.dtype), v)
    h = h + jnp.einsum("bnhk,hkd->bnd", context, p["o_proj.kernel"])
    m = _rms_norm(h, p["mlp_norm.scale"])
    gate, up = m @ p["wi_0.kernel"], m @ p["wi_1.kernel"]
    return h + (gate * jax.lax.logistic(gate) * up) @ p["wo.kernel"]


def layer(params: dict, i: int, depth: int) -> dict:
    """Block ``i``'s parameters by in-block names from ``layers.``: the bare block (depth 1), a
    loop stack's ``layers.blocks.{i}.``, or slice ``i`` of a scan stack's ``layers.blocks.``."""
    inner = {k.removeprefix("layers."): v for k, v in params.items() if k.startswith("layers.")}
    if depth == 1:
        return inner
    pre = f"blocks.{i}."
    if any(k.startswith(pre) for k in inner):
        return {k.removeprefix(pre): v for k, v in inner.items() if k.startswith(pre)}
    return {k.removeprefix("blocks."): v[i] for k, v in inner.items()}


def _ce(lf: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-position cross-entropy of float32 logits ``lf`` against ``labels``."""
    top = jax.lax.stop_gradient(jnp.max(lf, axis=-1, keepdims=True))
    lse = jnp.log(jnp.sum(jnp.exp(lf - top), axis=-1)) + top[..., 0]
    return lse - jnp.sum(lf * jax.nn.one_hot(labels, lf.shape[-1], dtype=jnp.float32), axis=-1)


def llm_loss_and_abs(params: dict, tokens: jax.Array, depth: int, chunks: int = 1):
    """The mean next-token cross-entropy (float32) and the mean ``|ce|`` (equal: ce >= 0).

    ``chunks > 1``: the logits and their cross-entropy a slice of ``ceil(N / chunks)`` positions at
    a time, summed, as the model's ``loss_chunks`` does (a Python loop, no scan, no remat): the
    lm_head's gradient is then rounded per slice and the slices added in the dtype. In bfloat16
    that rounding point matters beyond the scale test's bound: the whole and the chunked
    evaluations of the same parameters differ in lm_head's scale by 0.6 % (llm vocab 512, width
    64, seq 32, 4 chunks; 0.9 % and 0.3 % from a float32 evaluation: the rounding is not
    independent across positions, which the scale test assumes; why, not established)."""
    emb = params["embed.embedding"]
    h = emb[tokens]
    for i in range(depth):
        h = _block(h, layer(params, i, depth))
    h = _rms_norm(h, params["final_norm.scale"])
    head = params["lm_head.kernel"] if "lm_head.kernel" in params else emb.T
    n = tokens.shape[1] - 1  # labelled positions per example
    if chunks <= 1:
        ce = _ce((h @ head)[:, :-1].astype(jnp.float32), tokens[:, 1:])
        return jnp.mean(ce), jnp.mean(jnp.abs(ce))
    size = -(-tokens.shape[1] // min(chunks, tokens.shape[1]))
    total = jnp.zeros((), jnp.float32)
    for start in range(0, n, size):  # the model's last slice may hold only the unlabelled position
        stop = min(start + size, n)
        total = total + jnp.sum(_ce((h[:, start:stop] @ head).astype(jnp.float32),
                                    tokens[:, start + 1:stop + 1]))
    loss = total / (tokens.shape[0] * n)
    return loss, loss
