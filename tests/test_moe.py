"""The mixture of experts (model/moe.py) against a plain jax.numpy reference of the same routing,
its capacity's drops, its load-balance loss in the gradient, and what a policy saving an expert
projection changes in the compiled backward pass."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from remat_lab.config import RunConfig, llm_parameters
from remat_lab.model.models import block_names, build_model, llm_options
from remat_lab.model.moe import MoeMlp, capacity
from remat_lab.program.step import DTYPES

B, N, D, E, K, F = 2, 16, 64, 4, 2, 128
EPS = float(jnp.finfo(jnp.float32).eps)
CHOICE_AT: list = [None, None]  # the (params, h) the reference routes by: concrete values


def _scores(params: dict, h, gating: str):
    logits = jnp.einsum("bnd,de->bne", h, params["gate"])
    return jnp.exp(logits) / jnp.exp(logits).sum(-1, keepdims=True) if gating == "softmax" else (
        1 / (1 + jnp.exp(-logits)))


def reference(params: dict, h, *, cap: int, gating: str = "softmax", aux_weight: float = 0.0):
    """The MoE written independently: per token, scores over the experts, the top k renormalised,
    each kept (token, expert) pair's expert output weighted; a pair is kept while its expert has
    had at most ``cap`` pairs of this sequence (sequence order, then the token's k in score order)."""
    scores = _scores(params, h, gating)
    # the choice is discrete (no gradient): made from the values, outside any trace
    order = np.argsort(-np.asarray(_scores(jax.tree.map(np.asarray, CHOICE_AT[0]), CHOICE_AT[1], gating)),
                       axis=-1)[..., :K]
    out = jnp.zeros_like(h)
    for b in range(B):
        count = [0] * E
        for n in range(N):
            chosen = scores[b, n, order[b, n]]
            weights = chosen / chosen.sum()
            for j, e in enumerate(order[b, n]):
                count[e] += 1
                if count[e] > cap:
                    continue
                x = h[b, n]
                a = x @ params["wi_0"][e]
                y = (a / (1 + jnp.exp(-a)) * (x @ params["wi_1"][e])) @ params["wo"][e]
                out = out.at[b, n].add(weights[j] * y)
    share = np.zeros(E)
    for e in order.reshape(-1):
        share[e] += 1 / (B * N)
    aux = E * jnp.sum(jnp.asarray(share) * scores.mean(axis=(0, 1)))
    return out, aux_weight * aux


def _module(**kw) -> MoeMlp:
    return MoeMlp(D, experts=E, k=K, mlp_dim=F, rngs=nnx.Rngs(0), **kw)


def _inputs():
    h = jax.random.normal(jax.random.key(1), (B, N, D), jnp.float32)
    r = jax.random.normal(jax.random.key(2), (B, N, D), jnp.float32)  # the loss: sum(y * r)
    return h, r


def _close(got, want, terms: int):
    """float32 sums of ``terms`` products: within ``terms * 8 eps`` of the largest value."""
    np.testing.assert_allclose(got, want, rtol=0, atol=terms * 8 * EPS * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize("gating,factor", [("softmax", 0.0), ("sigmoid", 0.0), ("softmax", 0.5)])
def test_loss_and_gradients_match_the_reference(gating, factor):
    """Dropless (capacity = every token) and with drops (factor 0.5: 4 slots an expert for 8
    pairs on average); softmax and sigmoid gating; the aux loss's gradient included."""
    aux_weight = 0.1
    moe = _module(gating=gating, capacity_factor=factor, aux_weight=aux_weight)
    graphdef, params = nnx.split(moe)
    h, r = _inputs()
    cap = capacity(N, E, K, factor)
    assert cap == (N if factor == 0 else 4)

    def lab(params, h):
        return jnp.sum(nnx.merge(graphdef, params)(h) * r)

    def ref(p, h):
        out, aux = reference(p, h, cap=cap, gating=gating, aux_weight=aux_weight)
        return jnp.sum(out * r) + aux, jnp.sum(out * r)

    plain = {k: v for k, v in nnx.to_pure_dict(params).items()}
    CHOICE_AT[:] = [plain, h]
    loss, grads = jax.value_and_grad(lab, argnums=(0, 1))(params, h)
    (_, ref_loss), ref_grads = jax.value_and_grad(ref, argnums=(0, 1), has_aux=True)(plain, h)
    _close(loss, ref_loss, terms=B * N * D)  # the reported loss: the model's, the aux term apart
    _close(grads[1], ref_grads[1], terms=F * K)
    for name in ("gate", "wi_0", "wi_1", "wo"):
        _close(grads[0][name][...], ref_grads[0][name], terms=B * N * K)
    if factor:  # some pairs were dropped, so the drop decided something
        full, _ = reference(plain, h, cap=N, gating=gating)
        assert float(jnp.max(jnp.abs(full - reference(plain, h, cap=cap, gating=gating)[0]))) > 1e-3


def test_the_aux_loss_changes_the_router_gradient_only():
    h, r = _inputs()
    grads = {}
    for w in (0.0, 0.1):
        graphdef, params = nnx.split(_module(aux_weight=w))
        grads[w] = jax.grad(lambda p, g=graphdef: jnp.sum(nnx.merge(g, p)(h) * r))(params)
    assert float(jnp.max(jnp.abs(grads[0.1]["gate"][...] - grads[0.0]["gate"][...]))) > 1e-4
    for name in ("wi_0", "wi_1", "wo"):
        np.testing.assert_array_equal(grads[0.1][name][...], grads[0.0][name][...])


def _count_dots(jaxpr) -> int:
    """The matrix products of ``jaxpr`` and every jaxpr inside it (remat's, the custom rules')."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == "dot_general"
        for value in eqn.params.values():
            for sub in value if isinstance(value, list | tuple) else [value]:
                n += _count_dots(getattr(sub, "jaxpr", sub)) if hasattr(sub, "eqns") or hasattr(
                    sub, "jaxpr") else 0
    return n


def _backward_dots(policy) -> int:
    """The products of the backward pass (the vjp's jaxpr: the recomputation and the transposes)."""
    graphdef, params = nnx.split(_module())
    h, r = _inputs()

    def loss(p, h):
        moe = nnx.merge(graphdef, p)
        return jnp.sum(nnx.remat(lambda m, x: m(x), policy=policy)(moe, h) * r)

    _, backward = jax.vjp(loss, params, h)
    return _count_dots(jax.make_jaxpr(backward)(jnp.float32(1.0)).jaxpr)


def test_saving_an_expert_projection_removes_its_recomputation():
    """nothing_saveable's backward recomputes the experts' down projection (the router's gradient
    through the combine needs it); saving moe_mlpwo removes exactly that product; everything
    saved recomputes none of the six forward products (router, dispatch, three projections, the
    combine's weights)."""
    nothing = _backward_dots(jax.checkpoint_policies.nothing_saveable)
    saved = _backward_dots(jax.checkpoint_policies.save_only_these_names("moe_mlpwo"))
    everything = _backward_dots(jax.checkpoint_policies.everything_saveable)
    assert (nothing - saved, saved - everything) == (1, 5), (nothing, saved, everything)


def test_the_llm_with_experts_builds_counts_and_names():
    cfg = RunConfig(model="llm", width=D, heads=4, seq=N, batch=B, vocab=128, depth=2, experts=E,
                    expert_mlp_dim=F, shared_experts=1, policy="custom", save_names="moe_mlpwo")
    names = block_names(cfg)
    assert {"moe_router_logits", "moe_dispatch", "moe_mlpwi_0", "moe_mlpwo", "moe_combine"} <= set(names)
    model = build_model(cfg.model, cfg.width, cfg.depth, seed=0, dtype=jnp.float32, stack=cfg.stack,
                        heads=cfg.heads, **llm_options(cfg, DTYPES))
    params = nnx.state(model, nnx.Param)
    assert sum(a.size for a in jax.tree.leaves(params)) == llm_parameters(cfg)
    tokens = jax.random.randint(jax.random.key(3), (B, N), 0, 128)
    assert model(tokens).shape == (B, N, 128)


def test_the_memory_estimate_covers_the_compiled_step():
    """budget.py's estimate (the experts' slots, dispatch and combine masks) is above what XLA
    allocates for the no-remat gradient of a dropless MoE llm whose dispatch buffers dominate."""
    from remat_lab.config import estimate_bytes
    from remat_lab.model.llm import next_token_loss

    cfg = RunConfig(model="llm", width=64, heads=4, seq=128, batch=4, vocab=128, depth=2, experts=8,
                    expert_mlp_dim=128)
    graphdef, params = nnx.split(build_model(cfg.model, cfg.width, cfg.depth, seed=0, dtype=jnp.float32,
                                             stack=cfg.stack, heads=cfg.heads, **llm_options(cfg, DTYPES)))
    tokens = jnp.zeros((cfg.batch, cfg.seq), jnp.int32)
    grad = jax.jit(jax.grad(lambda p, t: next_token_loss(nnx.merge(graphdef, p)(t), t)))
    mem = grad.lower(params, tokens).compile().memory_analysis()
    compiled = mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
    slots = cfg.batch * cfg.experts * cfg.seq  # dropless: every expert has a slot for every token
    assert compiled > slots * cfg.expert_mlp_dim * 4  # the experts' hidden values are really there
    assert estimate_bytes(cfg) >= compiled, (estimate_bytes(cfg), compiled)
