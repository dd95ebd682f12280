"""The NNX blocks: the seed's MLP, a sequence mixer and a pre-norm transformer decoder block; ``build_model``.

The sequence mixer's products pair batch axes; every block is built into a stack (``stacks.py``).
The decoder language model (``llm``) is in ``llm.py``; ``build_model`` builds every model.

Every layer call runs inside a ``jax.named_scope`` (``l1``, ``mix``, ``l2``; the transformer's
``attn_norm``, ``q_proj``, ``k_proj``, ``v_proj``, ``attn``, ``o_proj``, ``mlp_norm``, ``wi_0``, ``wi_1``,
``wo``; ``block{i}`` around each block), so the jaxpr name stacks and the compiled HLO ``op_name``
metadata say which layer an operation belongs to. Every named intermediate is also tagged with
``jax.ad_checkpoint.checkpoint_name`` (``names_of(model)``; MaxText's names for the transformer),
which the name policies (``save_only_these_names``...) decide on. Scopes and names change names only,
never the math.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from remat_lab.config.catalog import MODELS, NAMES, SEQ_MODELS, USER_MODEL, names_of  # noqa: F401
from remat_lab.model import user_block
from remat_lab.model.llm import LLM
from remat_lab.model.stacks import build_stack

MLP_RATIO = 4  # the transformer's gated MLP: hidden = 4 * width


class MLP(nnx.Module):
    """The seed's two-layer MLP: ``relu(l2(relu(l1(x))))`` on ``x: (..., features)``."""

    def __init__(self, features: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
        # Both layers from the same Rngs stream, l1 then l2: fresh keys, separate parameters.
        self.l1 = nnx.Linear(features, features, rngs=rngs, dtype=dtype, param_dtype=dtype)
        self.l2 = nnx.Linear(features, features, rngs=rngs, dtype=dtype, param_dtype=dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        with jax.named_scope("l1"):
            x = jax.nn.relu(checkpoint_name(self.l1(x), "l1"))
        with jax.named_scope("l2"):
            return jax.nn.relu(checkpoint_name(self.l2(x), "l2"))


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
            h = jax.nn.relu(checkpoint_name(self.l1(x), "l1"))
        with jax.named_scope("mix"):
            scores = checkpoint_name(jnp.einsum("bnd,bmd->bnm", h, h), "scores") / math.sqrt(h.shape[-1])
            p = jax.nn.softmax(scores, axis=-1)
            h = checkpoint_name(jnp.einsum("bnm,bmd->bnd", p, h), "mix")
        with jax.named_scope("l2"):
            return jax.nn.relu(checkpoint_name(self.l2(h), "l2"))


class Transformer(nnx.Module):
    """A pre-norm decoder block on ``x: (B, N, features)``: ``x + attn(norm(x))``, then ``+ mlp(norm(.))``.

    Causal multi-head self-attention (``heads`` heads of ``features // heads``; the products
    ``QKᵀ`` and ``AV`` pair the batch and head axes) and a gated MLP
    ``wo(silu(wi_0(h)) * wi_1(h))`` of hidden size ``4 * features``; RMSNorm, no biases.
    """

    def __init__(self, features: int, *, heads: int = 4, rngs: nnx.Rngs, dtype=jnp.float32):
        if features % heads:
            raise ValueError(f"width {features} is not divisible by heads {heads}")
        head_dim, hidden = features // heads, MLP_RATIO * features
        kw = dict(use_bias=False, rngs=rngs, dtype=dtype, param_dtype=dtype)
        self.attn_norm = nnx.RMSNorm(features, rngs=rngs, dtype=dtype, param_dtype=dtype)
        self.q_proj = nnx.LinearGeneral(features, (heads, head_dim), **kw)
        self.k_proj = nnx.LinearGeneral(features, (heads, head_dim), **kw)
        self.v_proj = nnx.LinearGeneral(features, (heads, head_dim), **kw)
        self.o_proj = nnx.LinearGeneral((heads, head_dim), features, axis=(-2, -1), **kw)
        self.mlp_norm = nnx.RMSNorm(features, rngs=rngs, dtype=dtype, param_dtype=dtype)
        self.wi_0 = nnx.Linear(features, hidden, **kw)
        self.wi_1 = nnx.Linear(features, hidden, **kw)
        self.wo = nnx.Linear(hidden, features, **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        with jax.named_scope("attn_norm"):
            h = self.attn_norm(x)
        with jax.named_scope("q_proj"):
            q = checkpoint_name(self.q_proj(h), "query_proj")  # (B, N, H, K)
        with jax.named_scope("k_proj"):
            k = checkpoint_name(self.k_proj(h), "key_proj")
        with jax.named_scope("v_proj"):
            v = checkpoint_name(self.v_proj(h), "value_proj")
        with jax.named_scope("attn"):
            n = x.shape[-2]
            scores = jnp.einsum("bnhk,bmhk->bhnm", q, k) / math.sqrt(q.shape[-1])
            causal = jnp.tril(jnp.ones((n, n), dtype=bool))
            scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
            p = jax.nn.softmax(scores, axis=-1)
            context = checkpoint_name(jnp.einsum("bhnm,bmhk->bnhk", p, v), "context")
        with jax.named_scope("o_proj"):
            x = x + checkpoint_name(self.o_proj(context), "out_proj")
        with jax.named_scope("mlp_norm"):
            h = self.mlp_norm(x)
        with jax.named_scope("wi_0"):
            gate = checkpoint_name(self.wi_0(h), "mlpwi_0")
        with jax.named_scope("wi_1"):
            up = checkpoint_name(self.wi_1(h), "mlpwi_1")
        with jax.named_scope("wo"):
            return x + checkpoint_name(self.wo(jax.nn.silu(gate) * up), "mlpwo")


def build_model(model: str, width: int, depth: int, *, seed: int, dtype,
                stack: str = "loop", heads: int = 4, **llm) -> nnx.Module:
    """The model for a configuration: the bare block when depth is 1, else a stack of ``depth``
    blocks built as ``stack`` (``"loop"`` or ``"scan"``, see ``stacks.py``). ``heads``: the
    transformer's attention heads (other models ignore it). ``llm``: the decoder LM's settings
    (``vocab``, ``kv_heads``, ``head_dim``, ``mlp_dim``, ``tie_embeddings``, ``param_dtype``; see
    ``llm_options``); for the user's block (model ``user``) ``module``, its factory (``user_block.py``)."""
    if model == USER_MODEL:
        return user_block.build_user_stack(llm["module"], depth, stack, seed=seed, dtype=dtype)
    if model == "llm":
        return LLM(width=width, depth=depth, heads=heads, stack=stack, rngs=nnx.Rngs(seed),
                   dtype=dtype, **llm)
    if model == "transformer":
        def make(rngs: nnx.Rngs) -> nnx.Module:
            return Transformer(width, heads=heads, rngs=rngs, dtype=dtype)
    else:
        block = {"mlp": MLP, "seq_mixer": SeqMixer}[model]

        def make(rngs: nnx.Rngs) -> nnx.Module:
            return block(width, rngs=rngs, dtype=dtype)
    return build_stack(make, depth, stack, rngs=nnx.Rngs(seed))


def llm_options(config, dtypes: dict) -> dict:
    """``build_model``'s llm settings for a ``RunConfig`` (``{}`` for other models); ``dtypes``
    maps dtype names to JAX dtypes. The user's block: its factory, once checked (``user_options``)."""
    if config.model == USER_MODEL:
        return user_block.user_options(config, dtypes[config.dtype])
    if config.model != "llm":
        return {}
    moe = {} if not config.experts else {"moe": (
        ("experts", config.experts), ("k", config.experts_per_token),
        ("mlp_dim", config.expert_mlp_dim_used), ("shared", config.shared_experts),
        ("capacity_factor", config.capacity_factor), ("gating", config.router_gating),
        ("aux_weight", config.load_balance_loss_weight),
        ("dispatch", config.moe_dispatch))}  # hashable: the step caches on it
    return {"vocab": config.vocab, "kv_heads": config.kv_heads_used,
            "head_dim": config.head_dim_used, "mlp_dim": config.mlp_dim_used,
            "tie_embeddings": config.tie_embeddings,
            "param_dtype": dtypes[config.param_dtype_used], **moe}


def block_names(config) -> tuple[str, ...]:
    """The ``checkpoint_name`` tags of ``config``'s model: the catalog's, or for the user's block
    those found by tracing it."""
    if config.model != USER_MODEL:
        return names_of(config.model, getattr(config, "experts", 0))
    return user_block.block_names(config, {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[config.dtype])
