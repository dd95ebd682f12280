"""NNX modules: the seed's MLP, a sequence mixer whose dots pair batch axes, and a depth stack.

Every layer call runs inside a ``jax.named_scope`` (``l1``, ``mix``, ``l2``; ``block{i}`` around
each block), so the jaxpr name stacks and the compiled HLO ``op_name`` metadata say which layer an
operation belongs to. Scopes change names only, never the math.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

MODELS = ("mlp", "seq_mixer")


class MLP(nnx.Module):
    """The seed's two-layer MLP: ``relu(l2(relu(l1(x))))`` on ``x: (..., features)``."""

    def __init__(self, features: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        # Both layers from the same Rngs stream, l1 then l2: fresh keys, separate parameters.
        self.l1 = nnx.Linear(features, features, rngs=rngs, dtype=dtype, param_dtype=dtype)
        self.l2 = nnx.Linear(features, features, rngs=rngs, dtype=dtype, param_dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        with jax.named_scope("l1"):
            x = jax.nn.relu(self.l1(x))
        with jax.named_scope("l2"):
            return jax.nn.relu(self.l2(x))


class SeqMixer(nnx.Module):
    """The MLP with a token-mixing step between its layers; ``x: (B, N, features)``.

    The mixing products ``(B,N,D)@(B,D,N)`` and ``(B,N,N)@(B,N,D)`` pair the B axes, so
    ``dots_with_no_batch_dims_saveable`` does not save them; l1 and l2 have no batch dims.
    """

    def __init__(self, features: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.l1 = nnx.Linear(features, features, rngs=rngs, dtype=dtype, param_dtype=dtype)
        self.l2 = nnx.Linear(features, features, rngs=rngs, dtype=dtype, param_dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        with jax.named_scope("l1"):
            h = jax.nn.relu(self.l1(x))
        with jax.named_scope("mix"):
            scores = jnp.einsum("bnd,bmd->bnm", h, h) / math.sqrt(h.shape[-1])
            p = jax.nn.softmax(scores, axis=-1)
            h = jnp.einsum("bnm,bmd->bnd", p, h)
        with jax.named_scope("l2"):
            return jax.nn.relu(self.l2(h))


class Stack(nnx.Module):
    """``depth`` blocks of one kind in sequence (used when depth > 1)."""

    def __init__(self, block: type[nnx.Module], features: int, depth: int, *, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        self.blocks = nnx.List([block(features, rngs=rngs, dtype=dtype) for _ in range(depth)])


def build_model(model: str, width: int, depth: int, *, seed: int, dtype) -> nnx.Module:
    """The model for a configuration: the bare block when depth is 1, else a ``Stack``."""
    block = {"mlp": MLP, "seq_mixer": SeqMixer}[model]
    rngs = nnx.Rngs(seed)
    if depth == 1:
        return block(width, rngs=rngs, dtype=dtype)
    return Stack(block, width, depth, rngs=rngs, dtype=dtype)


def blocks_of(model: nnx.Module) -> list[nnx.Module]:
    """The blocks of a model built by ``build_model``, in order."""
    return list(model.blocks) if isinstance(model, Stack) else [model]
