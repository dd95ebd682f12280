"""The llm's plain-jax.numpy reference for the gradient check: no NNX, no model code, no remat.

``llm_loss_and_abs(params, tokens, depth)`` re-implements ``model/llm.py`` from ``{path: array}``
parameters with the model's rounding points: embedding lookup; per block RMSNorm (statistics and
scaling in float32), the q/k/v products, the rotary embedding written as
``x * cos + rotate_half(x) * sin`` in float32, grouped-query attention by repeating each key/value
head over its query group (the model reshapes the queries instead), scores scaled in the dtype and
softmaxed in float32, the gated MLP; the final norm, the logits (``h @ E.T`` tied, else
``h @ W``) and the mean next-token cross-entropy in float32 with the labels picked by a one-hot
product (the model uses ``take_along_axis``). ``gradcheck.py`` differentiates it and bounds the step.
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


def llm_loss_and_abs(params: dict, tokens: jax.Array, depth: int):
    """The mean next-token cross-entropy (float32) and the mean ``|ce|`` (equal: ce >= 0)."""
    emb = params["embed.embedding"]
    h = emb[tokens]
    for i in range(depth):
        h = _block(h, layer(params, i, depth))
    h = _rms_norm(h, params["final_norm.scale"])
    logits = h @ (params["lm_head.kernel"] if "lm_head.kernel" in params else emb.T)
    lf = logits[:, :-1].astype(jnp.float32)
    top = jax.lax.stop_gradient(jnp.max(lf, axis=-1, keepdims=True))
    lse = jnp.log(jnp.sum(jnp.exp(lf - top), axis=-1)) + top[..., 0]
    ce = lse - jnp.sum(lf * jax.nn.one_hot(tokens[:, 1:], lf.shape[-1], dtype=jnp.float32), axis=-1)
    return jnp.mean(ce), jnp.mean(jnp.abs(ce))
