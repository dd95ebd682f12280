"""A mixture of experts' MLP: a float32 router, top-k, dense einsum dispatch with a capacity, E gated experts.

``MoeMlp`` replaces the decoder block's gated MLP when ``experts`` > 0 (``llm.DecoderBlock``), as
MaxText's ``RoutedMoE.dense_matmul`` does (its path with ``sparse_matmul: false``, and in early
2025, before that knob, with ``megablox: false``; its grouped ``ragged_dot`` / megablox path is not
here yet):

- **router**: ``logits = h @ gate`` in float32 (``moe_router_logits``); ``softmax`` (Mixtral,
  Qwen3-MoE) or ``sigmoid`` (DeepSeek-V3) scores; each token's top ``k`` experts, their scores
  renormalised to sum to 1 (Mixtral's softmax over the top k; Qwen3's ``norm_topk_prob``);
- **capacity**: an expert takes at most ``C = max(ceil(N * k / E) * factor, factor)`` tokens of a
  sequence (MaxText's ``generate_masks``), first come first served in the order of the sequence and,
  within a token, of its k choices; the rest are dropped (their weight 0, the residual carries
  them). ``capacity_factor`` 0 is dropless: ``C = N``, every token fits (as much work as MaxText's
  dropless dense path, every expert over every token's slot);
- **dispatch**: ``einsum("BNM,BNEC->EBCM")`` with the 0/1 dispatch mask (``moe_dispatch``);
- **experts**: stacked weights ``wi_0, wi_1: [E, M, F]``, ``wo: [E, F, M]``; ``silu(x wi_0) *
  (x wi_1)`` then ``wo``, named ``moe_mlpwi_0``, ``moe_mlpwi_1``, ``moe_mlpwo`` inside ``mlpwi_0``,
  ``mlpwi_1``, ``mlpwo`` (MaxText's double names, so its policies that name the MLP reach experts);
- **combine**: ``einsum("EBCM,BNEC->BNM")`` with the weights (``moe_combine``);
- **expert parallelism**: on a mesh with an ``expert`` axis the experts' weights are split over it
  (``program/mesh.py``); ``layout`` (set by the step: ``mesh.expert_layout``) lays the dispatched
  values out with their tokens, then with their experts, and the experts' output back: an
  all-to-all over the expert axis each way, as MaxText's dense dispatch constrains them;
- **shared experts**: a dense gated MLP of ``shared * F`` hidden units every token goes through
  (DeepSeek's shared experts, fused), added to the routed output;
- **load balance**: Switch's auxiliary loss ``E * sum_e f_e * P_e`` (``f_e`` the share of top-k
  slots routed to ``e``, ``P_e`` its mean softmax probability; MaxText's ``load_balance_loss``
  with the batch mean taken over all tokens), times ``weight``. It enters the gradient, not the
  reported loss: ``with_aux_gradient`` is the identity on the block's output whose backward gives
  the loss's weight to the auxiliary term, so the gradients are those of ``loss + weight * aux``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from remat_lab.config.moe_config import capacity

# A mesh's layout of the dispatched values: ``(x, "tokens" | "experts") -> x`` (program/mesh.py).
ExpertLayout = Callable[[jax.Array, str], jax.Array]


def route(logits: jax.Array, k: int, gating: str) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(weights (B, N, k), indices (B, N, k), probs (B, N, E))`` from float32 router logits: the
    scores (softmax or sigmoid), each token's top k, their weights renormalised over the k."""
    probs = jax.nn.softmax(logits, axis=-1) if gating == "softmax" else jax.nn.sigmoid(logits)
    top, idx = jax.lax.top_k(probs, k)
    return top / jnp.sum(top, axis=-1, keepdims=True), idx, probs


def masks(weights: jax.Array, idx: jax.Array, experts: int, cap: int) -> tuple[jax.Array, jax.Array]:
    """``(dispatch, combine)``, both ``(B, N, E, C)``: a slot per kept (token, expert) pair, in the
    order of the sequence and the k choices; combine carries the pair's weight, dispatch 1."""
    b, n, k = idx.shape
    onehot = jax.nn.one_hot(idx, experts, dtype=jnp.int32)  # (B, N, k, E)
    position = jnp.cumsum(onehot.reshape(b, n * k, experts), axis=1).reshape(b, n, k, experts)
    kept = onehot * (position <= cap)  # a pair past the expert's capacity is dropped
    slot = jnp.sum(position * kept, axis=2)  # (B, N, E): 1-based slot, 0 = not sent
    slots = jax.nn.one_hot(slot, cap + 1, dtype=weights.dtype)[..., 1:]  # (B, N, E, C)
    per_expert = jnp.einsum("bnk,bnke->bne", weights, kept.astype(weights.dtype))
    combine = per_expert[..., None] * slots
    return slots, combine


def load_balance(probs: jax.Array, idx: jax.Array, experts: int) -> jax.Array:
    """Switch's auxiliary loss over all tokens: ``E * sum_e f_e P_e``, ``f_e`` the share of the top-k
    slots sent to expert ``e`` (times k: MaxText's density), ``P_e`` its mean score."""
    density = jnp.mean(jnp.sum(jax.nn.one_hot(idx, experts, dtype=jnp.float32), axis=2), axis=(0, 1))
    return experts * jnp.sum(density * jnp.mean(probs, axis=(0, 1)))


@jax.custom_vjp
def with_aux_gradient(y: jax.Array, aux: jax.Array, weight: jax.Array) -> jax.Array:
    """``y``, unchanged; its backward adds ``weight * aux`` to the loss (aux's cotangent ``weight``)."""
    return y


def _aux_fwd(y, aux, weight):
    return y, weight


def _aux_bwd(weight, g):
    return g, jnp.asarray(weight, jnp.float32), jnp.zeros_like(weight)


with_aux_gradient.defvjp(_aux_fwd, _aux_bwd)


class MoeMlp(nnx.Module):
    """``experts`` routed gated MLPs (and ``shared`` fused shared experts) on ``h: (B, N, width)``."""

    def __init__(self, width: int, *, experts: int, k: int, mlp_dim: int, shared: int = 0,
                 capacity_factor: float = 0.0, gating: str = "softmax", aux_weight: float = 0.0,
                 rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32):
        init = nnx.initializers.lecun_normal()
        self.experts, self.k, self.factor, self.gating = experts, k, capacity_factor, gating
        self.aux_weight, self.dtype = aux_weight, dtype
        self.gate = nnx.Param(init(rngs.params(), (width, experts), param_dtype))
        stacked = nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                                    in_axis=-2, out_axis=-1, batch_axis=(0,))
        self.wi_0 = nnx.Param(stacked(rngs.params(), (experts, width, mlp_dim), param_dtype))
        self.wi_1 = nnx.Param(stacked(rngs.params(), (experts, width, mlp_dim), param_dtype))
        self.wo = nnx.Param(stacked(rngs.params(), (experts, mlp_dim, width), param_dtype))
        kw = dict(use_bias=False, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.layout: ExpertLayout | None = None  # set on a mesh with an expert axis
        self.shared = None if not shared else nnx.List([
            nnx.Linear(width, shared * mlp_dim, **kw), nnx.Linear(width, shared * mlp_dim, **kw),
            nnx.Linear(shared * mlp_dim, width, **kw)])

    def __call__(self, h: jax.Array) -> jax.Array:
        b, n, _ = h.shape
        with jax.named_scope("router"):
            logits = checkpoint_name(h.astype(jnp.float32) @ self.gate[...].astype(jnp.float32),
                                     "moe_router_logits")
            weights, idx, probs = route(logits, self.k, self.gating)
            dispatch, combine = masks(weights, idx, self.experts,
                                      capacity(n, self.experts, self.k, self.factor))
        with jax.named_scope("dispatch"):
            x = jnp.einsum("bnm,bnec->ebcm", h, dispatch.astype(h.dtype))
            if self.layout is not None:  # from the tokens' devices to the experts' (all-to-all)
                x = self.layout(self.layout(x, "tokens"), "experts")
            x = checkpoint_name(x, "moe_dispatch")
        with jax.named_scope("wi_0"):
            gate = checkpoint_name(checkpoint_name(jnp.einsum(
                "ebcm,emf->ebcf", x, self.wi_0[...].astype(self.dtype)), "mlpwi_0"), "moe_mlpwi_0")
        with jax.named_scope("wi_1"):
            up = checkpoint_name(checkpoint_name(jnp.einsum(
                "ebcm,emf->ebcf", x, self.wi_1[...].astype(self.dtype)), "mlpwi_1"), "moe_mlpwi_1")
        with jax.named_scope("wo"):
            out = checkpoint_name(checkpoint_name(jnp.einsum(
                "ebcf,efm->ebcm", jax.nn.silu(gate) * up, self.wo[...].astype(self.dtype)), "mlpwo"),
                "moe_mlpwo")
            if self.layout is not None:  # back to the tokens' devices (all-to-all)
                out = self.layout(self.layout(out, "experts"), "tokens")
        with jax.named_scope("combine"):
            y = checkpoint_name(jnp.einsum("ebcm,bnec->bnm", out, combine.astype(h.dtype)), "moe_combine")
        if self.shared is not None:
            with jax.named_scope("shared"):
                wi_0, wi_1, wo = self.shared
                y = y + wo(jax.nn.silu(wi_0(h)) * wi_1(h))
        if self.aux_weight:
            y = with_aux_gradient(y, load_balance(probs, idx, self.experts),
                                  jnp.asarray(self.aux_weight, jnp.float32))
        return y
