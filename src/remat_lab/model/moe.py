"""A mixture of experts' MLP: a float32 router, top-k, grouped (dropless) or dense dispatch, E gated experts.

``MoeMlp`` replaces the decoder block's gated MLP when ``experts`` > 0 (``llm.DecoderBlock``), with
one of MaxText's two dispatches (``dispatch``; ``RunConfig.moe_dispatch``):

- **grouped** (MaxText's ``RoutedMoE.sparse_matmul``, ``sparse_matmul: true``): each token copied
  k times, the copies sorted by their expert (``permute``; the sort's gradient the inverse sort),
  the three projections ``jax.lax.ragged_dot`` over the sorted rows with each expert's row count
  (``group_sizes``): every expert multiplies only its own tokens, dropless, so the products are
  the routed work (``2 x tokens x k x width x expert_mlp_dim`` each). Then the rows sorted back and
  each token's k outputs summed with its router weights (``unpermute``). ``ragged_dot`` everywhere
  (MaxText's ``megablox: false``); the Pallas megablox kernel is not used. Names: the sorted rows
  ``moe_dispatch``, the projections as below, the combined output ``moe_combine``. On a mesh
  (``layout``, set by the step: ``mesh.expert_layout``) the grouped work runs per device on its
  own tokens (a ``shard_map`` over the batch axes, as MaxText's): the experts' weights gathered
  to every device as FSDP gathers a dense MLP's, the expert axis splitting them as fsdp does.
- **dense** (MaxText's ``RoutedMoE.dense_matmul``, ``sparse_matmul: false``, and in early 2025,
  before that knob, ``megablox: false``), described by the rest of this docstring:

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

# A mesh's layout (program/mesh.py): for the dense dispatch ``(x, "tokens" | "experts") -> x``, the
# dispatched values' layout; for the grouped, ``(fn, *args) -> fn(*args)`` run on each device's
# tokens (a shard_map; every argument's leading axis the batch, the last three the experts' weights).
ExpertLayout = Callable[..., jax.Array]


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


@jax.custom_vjp
def _sort_rows(x: jax.Array, order: jax.Array) -> jax.Array:
    """``x[order]`` for a permutation ``order``; its gradient the inverse sort (MaxText's
    ``_sort_activations`` with its custom vjp: a gather, not a scatter-add)."""
    return x[order]


def _sort_fwd(x, order):
    return x[order], order


def _sort_bwd(order, g):
    return g[jnp.argsort(order)], None


_sort_rows.defvjp(_sort_fwd, _sort_bwd)


def _expert(x: jax.Array, w: jax.Array, sizes: jax.Array, name: str) -> jax.Array:
    """``ragged_dot`` of the sorted rows ``x: (T, M)`` with the stacked ``w: (E, M, F)``: row block
    ``e`` (``sizes[e]`` rows) by ``w[e]``; named ``name`` inside its dense-MLP name (MaxText's)."""
    with jax.named_scope(name.removeprefix("moe_")):
        y = jax.lax.ragged_dot(x, w, sizes, preferred_element_type=x.dtype)
        return checkpoint_name(checkpoint_name(y, name.removeprefix("moe_")), name)


def grouped(h: jax.Array, weights: jax.Array, idx: jax.Array, wi_0: jax.Array, wi_1: jax.Array,
            wo: jax.Array) -> jax.Array:
    """The routed experts' output ``(B, N, M)`` of ``h: (B, N, M)`` by grouped matmuls (MaxText's
    ``sparse_matmul``): ``weights``, ``idx`` ``(B, N, k)`` the router's; ``wi_0``, ``wi_1``
    ``(E, M, F)``, ``wo`` ``(E, F, M)`` in the compute dtype. Every (token, choice) pair is computed
    (dropless)."""
    b, n, m = h.shape
    k, experts = idx.shape[-1], wi_0.shape[0]
    with jax.named_scope("dispatch"):
        flat = idx.reshape(-1)  # (B N k,): pair t * k + j is token t's j-th choice
        order = jnp.argsort(flat, stable=True)
        sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)
        x = checkpoint_name(_sort_rows(jnp.repeat(h.reshape(b * n, m), k, axis=0), order),
                            "moe_dispatch")
    gate = _expert(x, wi_0, sizes, "moe_mlpwi_0")
    up = _expert(x, wi_1, sizes, "moe_mlpwi_1")
    out = _expert(jax.nn.silu(gate) * up, wo, sizes, "moe_mlpwo")
    with jax.named_scope("combine"):
        pairs = _sort_rows(out, jnp.argsort(order)).reshape(b * n, k, m)
        y = jnp.einsum("tkm,tk->tm", pairs, weights.reshape(b * n, k).astype(h.dtype))
        return checkpoint_name(y.reshape(b, n, m), "moe_combine")


class MoeMlp(nnx.Module):
    """``experts`` routed gated MLPs (and ``shared`` fused shared experts) on ``h: (B, N, width)``."""

    def __init__(self, width: int, *, experts: int, k: int, mlp_dim: int, shared: int = 0,
                 capacity_factor: float = 0.0, gating: str = "softmax", aux_weight: float = 0.0,
                 dispatch: str = "dense", rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32):
        init = nnx.initializers.lecun_normal()
        self.experts, self.k, self.factor, self.gating = experts, k, capacity_factor, gating
        self.dispatch = dispatch  # "grouped" (ragged_dot, dropless) or "dense" (einsums, a capacity)
        self.aux_weight, self.dtype = aux_weight, dtype
        self.gate = nnx.Param(init(rngs.params(), (width, experts), param_dtype))
        stacked = nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                                    in_axis=-2, out_axis=-1, batch_axis=(0,))
        self.wi_0 = nnx.Param(stacked(rngs.params(), (experts, width, mlp_dim), param_dtype))
        self.wi_1 = nnx.Param(stacked(rngs.params(), (experts, width, mlp_dim), param_dtype))
        self.wo = nnx.Param(stacked(rngs.params(), (experts, mlp_dim, width), param_dtype))
        kw = dict(use_bias=False, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.layout: ExpertLayout | None = None  # set on a mesh (mesh.expert_layout)
        self.shared = None if not shared else nnx.List([
            nnx.Linear(width, shared * mlp_dim, **kw), nnx.Linear(width, shared * mlp_dim, **kw),
            nnx.Linear(shared * mlp_dim, width, **kw)])

    def __call__(self, h: jax.Array) -> jax.Array:
        with jax.named_scope("router"):
            logits = checkpoint_name(h.astype(jnp.float32) @ self.gate[...].astype(jnp.float32),
                                     "moe_router_logits")
            weights, idx, probs = route(logits, self.k, self.gating)
        if self.dispatch == "grouped":
            y = self._grouped(h, weights, idx)
        else:
            y = self._dense(h, weights, idx)
        if self.shared is not None:
            with jax.named_scope("shared"):
                wi_0, wi_1, wo = self.shared
                y = y + wo(jax.nn.silu(wi_0(h)) * wi_1(h))
        if self.aux_weight:
            y = with_aux_gradient(y, load_balance(probs, idx, self.experts),
                                  jnp.asarray(self.aux_weight, jnp.float32))
        return y

    def _grouped(self, h: jax.Array, weights: jax.Array, idx: jax.Array) -> jax.Array:
        """``grouped`` on the whole batch, or on a mesh on each device's tokens (``layout``)."""
        args = (h, weights, idx, *(w[...].astype(self.dtype) for w in (self.wi_0, self.wi_1, self.wo)))
        return grouped(*args) if self.layout is None else self.layout(grouped, *args)

    def _dense(self, h: jax.Array, weights: jax.Array, idx: jax.Array) -> jax.Array:
        """The dense einsum dispatch at the capacity (MaxText's ``dense_matmul``)."""
        n = h.shape[1]
        with jax.named_scope("router"):
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
            return checkpoint_name(jnp.einsum("ebcm,bnec->bnm", out, combine.astype(h.dtype)),
                                   "moe_combine")
