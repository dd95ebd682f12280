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


@pytest.mark.parametrize("dispatch", ["dense", "grouped"])
def test_the_memory_estimate_covers_the_compiled_step(dispatch):
    """budget.py's estimate (dense: the experts' slots, dispatch and combine masks; grouped: the
    routed pairs) is above what XLA allocates for the no-remat gradient of a dropless MoE llm
    whose expert buffers dominate."""
    from remat_lab.config import estimate_bytes
    from remat_lab.model.llm import next_token_loss

    cfg = RunConfig(model="llm", width=64, heads=4, seq=128, batch=4, vocab=128, depth=2, experts=8,
                    expert_mlp_dim=128, moe_dispatch=dispatch, policy="no_remat")
    graphdef, params = nnx.split(build_model(cfg.model, cfg.width, cfg.depth, seed=0, dtype=jnp.float32,
                                             stack=cfg.stack, heads=cfg.heads, **llm_options(cfg, DTYPES)))
    tokens = jnp.zeros((cfg.batch, cfg.seq), jnp.int32)
    grad = jax.jit(jax.grad(lambda p, t: next_token_loss(nnx.merge(graphdef, p)(t), t)))
    mem = grad.lower(params, tokens).compile().memory_analysis()
    compiled = mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
    slots = cfg.batch * cfg.seq * (cfg.experts if dispatch == "dense" else cfg.experts_per_token)
    assert compiled > slots * cfg.expert_mlp_dim * 4  # the experts' hidden values are really there
    assert estimate_bytes(cfg) >= compiled, (estimate_bytes(cfg), compiled)


def test_grouped_dispatch_equals_the_dense_at_a_capacity_no_token_exceeds():
    """The grouped dispatch (sorted tokens, ragged_dot: MaxText's sparse_matmul) against the dense
    einsums at capacity = the sequence (no token dropped): the output, and every gradient of the
    parameters and the input with the aux loss, allclose in float32."""
    h, r = _inputs()
    out, grads = {}, {}
    for dispatch in ("grouped", "dense"):
        graphdef, params = nnx.split(_module(dispatch=dispatch, aux_weight=0.1))
        lab = lambda p, x, g=graphdef: jnp.sum(nnx.merge(g, p)(x) * r)
        out[dispatch] = nnx.merge(graphdef, params)(h)
        grads[dispatch] = jax.grad(lab, argnums=(0, 1))(params, h)
    _close(out["grouped"], out["dense"], terms=F * K)
    _close(grads["grouped"][1], grads["dense"][1], terms=F * K)
    for name in ("gate", "wi_0", "wi_1", "wo"):
        _close(grads["grouped"][0][name][...], grads["dense"][0][name][...], terms=B * N * K)


def _backward_grouped(policy) -> int:
    """The grouped products (``ragged_dot``) of the grouped layer's backward pass under ``policy``:
    the recomputed forward ones and the transposes (two a projection)."""
    graphdef, params = nnx.split(_module(dispatch="grouped"))
    h, r = _inputs()

    def loss(p, x):
        return jnp.sum(nnx.remat(lambda m, y: m(y), policy=policy)(nnx.merge(graphdef, p), x) * r)

    _, backward = jax.vjp(loss, params, h)
    text = str(jax.make_jaxpr(backward)(jnp.float32(1.0)))
    return text.count("ragged_dot_general[")


def test_per_name_remat_reaches_the_grouped_experts():
    """Under nothing_saveable the grouped backward recomputes the three expert products (and
    transposes each twice: 9); saving moe_mlpwo (MaxText's name, tagged on ragged_dot's output)
    removes exactly its recomputation (wi_0's and wi_1's are still needed for wo's gradient);
    saving the three moe_ names removes all three; the dense names reach them too."""
    names = jax.checkpoint_policies.save_only_these_names
    nothing = _backward_grouped(jax.checkpoint_policies.nothing_saveable)
    assert nothing == 9, nothing
    assert _backward_grouped(names("moe_mlpwo")) == 8
    assert _backward_grouped(names("moe_mlpwi_0", "moe_mlpwi_1", "moe_mlpwo")) == 6
    assert _backward_grouped(names("mlpwi_0", "mlpwi_1", "mlpwo")) == 6


def test_grouped_flops_on_a_tpu_are_the_routed_work():
    """Compiled for a v5p (no device): the grouped llm's step flops (the lab's count: XLA's, each
    loop body scaled, libtpu's ragged-dot kernels by their cost estimates) within 5 % of the hand
    count of its routed products, 3 x the forward's (k of the E experts a token, not E); the dense
    dispatch, dropless, multiplies every expert over every slot: above twice that."""
    from remat_lab.analysis.costs import step_costs
    from remat_lab.analysis.kernels import kernels_of
    from remat_lab.program.step import jit_step, problem_for

    shape = dict(model="llm", width=128, heads=2, kv_heads=1, seq=128, batch=4, depth=2, vocab=256,
                 experts=4, experts_per_token=2, expert_mlp_dim=256, policy="no_remat",
                 target="tpu-v5p", dtype="bfloat16", param_dtype="float32")
    t, w, hd, f, n = 4 * 128, 128, 64, 256, 128
    layer = (2 * t * w * (2 + 2 * 1) * hd + 2 * t * 2 * hd * w + 2 * t * w * 4  # q k v, o, router
             + 2 * t * 2 * 3 * w * f + 2 * 2 * 4 * 2 * n * n * hd)  # k experts, attention
    hand = 3 * (2 * layer + 2 * t * w * 256)  # forward and backward (twice): the blocks, the head
    flops = {}
    for dispatch in ("grouped", "dense"):
        problem = problem_for(RunConfig(**shape, moe_dispatch=dispatch))
        compiled = jit_step(problem).lower(*problem.args).compile()
        flops[dispatch] = step_costs(compiled, compiled.as_text())["flops"]
        if dispatch == "grouped":  # libtpu's ragged-dot kernels: GEMMs of the routed pairs' products
            rows = [r for r in kernels_of(compiled.as_text())
                    if "ragged-dot" in r["name"] and r["flops"]]  # not the metadata kernels
            assert len(rows) == 9, rows  # 3 forward, 2 x 3 backward (no_remat: none recomputed)
            pairs = t * 2  # k = 2 copies of each token
            kinds = {(r["kind"], r["flops"], r["dtype"]) for r in rows}
            assert kinds == {("gemm", 2 * pairs * w * f, "bf16")}, kinds
    assert flops["grouped"] == pytest.approx(hand, rel=0.05), (flops, hand)
    assert flops["dense"] > 2 * hand
