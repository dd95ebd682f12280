"""The synthesizer end to end on a small model: its plan against a plain jax.checkpoint compile."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from remat_lab.config import RunConfig
from remat_lab.model.models import build_model
from remat_lab.studies.synthesize import synthesize

# XLA's analysis-only options (LLVM's optimisation off; HLO passes, and so memory, unchanged)
OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
MLP = RunConfig(model="mlp", width=64, depth=2, stack="scan", batch=1)
BUDGET = 400 << 10


def _plain_peak(config: RunConfig, save: list[str], offload: list[str], remat_layers: int,
                batch: int) -> int:
    """The lab's model compiled without the lab's policies or stacks: the stacked blocks split by
    hand, a ``lax.scan`` over the first ``remat_layers`` under ``jax.checkpoint`` with
    ``save_and_offload_only_these_names``, the rest under a plain scan; the gradient of the
    output's float32 sum. XLA's compiled peak less its generated code."""
    model = build_model(config.model, config.width, config.depth, seed=0, dtype=jnp.float32,
                        stack=config.stack)
    graphdef, state = nnx.split(model.blocks)
    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=save, names_which_can_be_offloaded=offload,
        offload_src="device", offload_dst="pinned_host")

    def apply(st, h):
        return nnx.merge(graphdef, st)(h)

    remat = jax.checkpoint(apply, policy=policy)

    def loss(st, x):
        head = jax.tree.map(lambda a: a[:remat_layers], st)
        tail = jax.tree.map(lambda a: a[remat_layers:], st)
        x, _ = jax.lax.scan(lambda h, s: (remat(s, h), None), x, head)
        if config.depth > remat_layers:
            x, _ = jax.lax.scan(lambda h, s: (apply(s, h), None), x, tail)
        return jnp.sum(x, dtype=jnp.float32)

    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    x = jax.ShapeDtypeStruct((batch, config.width), jnp.float32)
    ma = jax.jit(jax.value_and_grad(loss)).lower(abstract, x).compile(
        compiler_options=OPTIONS).memory_analysis()
    return (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
            + ma.temp_size_in_bytes)


@pytest.fixture(scope="module")
def doc():
    return synthesize(MLP, BUDGET, policies=["nothing_saveable", "dots_saveable"], workers=1)


def test_the_answer_is_a_compiled_plan_that_a_plain_checkpoint_reproduces(doc):
    assert doc["kind"] == "synthesis" and doc["names"] == ["l1", "l2"]
    assert doc["offload"]["allowed"] is False  # XLA CPU: no host memory space, said so
    assert all(not c["plan"]["offload"] for c in doc["candidates"])
    best = next(c for c in doc["candidates"] if c["plan"] == doc["plan"] and c["fits"])
    p = best["plan"]
    assert set(p["save"]) | set(p["recompute"]) == {"l1", "l2"}
    b = best["max_batch"]
    lab = next(r for r in best["probes"] if r["batch"] == b)["peak_bytes"]
    # the plain compile of the same names: the same peak (generated code apart), within the budget,
    # and the next batch over it
    plain = _plain_peak(MLP, p["save"], p["offload"], p["remat_layers"], b)
    code = lab - plain
    assert 0 <= code < 64 << 10, (lab, plain)  # the lab's peak counts XLA's generated code too
    assert plain + code <= BUDGET
    assert _plain_peak(MLP, p["save"], p["offload"], p["remat_layers"], b + 1) + code > BUDGET


def test_never_worse_than_the_named_policies(doc):
    named = {r["policy"]: r for r in doc["named"]}
    assert set(named) == {"nothing_saveable", "dots_saveable"}
    best = max(r["max_batch"] for r in named.values())
    assert doc["max_batch"] >= best
    at_best = [r for r in named.values() if r["max_batch"] == doc["max_batch"]]
    for r in at_best:  # at the same batch, no more recomputation
        assert doc["recomputed_flops"] <= r["recomputed_flops"] * (1 + 1e-6)
    assert doc["compiles"] <= 3 * len(doc["names"]) + 12 + 4  # measure + candidates (+ flops)


def test_the_plan_as_code_flags_and_yaml(doc):
    p = doc["plan"]
    assert doc["custom"].startswith("--policy ")
    assert "save_and_offload_only_these_names" in doc["code"]
    for n in p["save"]:
        assert f'"{n}"' in doc["code"] and f"{n}: 'device'" in doc["maxtext_yaml"]
    for n in p["recompute"]:
        assert f"{n}: 'remat'" in doc["maxtext_yaml"]
    for c in doc["candidates"]:  # every compiled candidate reports the model's error
        assert c["error_bytes"] == c["peak_bytes"] - c["predicted_peak_bytes"]


def test_partial_remat_keeps_the_gradient():
    """remat_layers: the first N blocks remat'd, the rest plain: the same gradient as no remat."""
    from remat_lab.program.step import build_problem, make_step

    grads = {}
    for stack in ("scan", "loop"):
        for policy, layers in (("no_remat", 0), ("nothing_saveable", 1), ("nothing_saveable", 0)):
            cfg = RunConfig(model="mlp", width=16, depth=3, stack=stack, batch=4, policy=policy,
                            remat_layers=layers)
            problem = build_problem(cfg)
            _, g = jax.jit(make_step(problem))(*problem.args)
            grads[(stack, policy, layers)] = g
        ref = grads[(stack, "no_remat", 0)]
        for key in ((stack, "nothing_saveable", 1), (stack, "nothing_saveable", 0)):
            for a, b in zip(ref, grads[key], strict=True):
                np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_remat_layers_over_the_depth_is_refused():
    from remat_lab.config import ConfigError

    with pytest.raises(ConfigError, match="remat_layers 3 is more than the depth 2"):
        RunConfig(model="mlp", depth=2, remat_layers=3)


@pytest.mark.slow
def test_on_h100_offload_is_a_choice_and_the_plan_compiles_as_plain_checkpoint():
    """Compiled for an H100 without one: pinned host memory, so each name may be offloaded; the
    answer's plan compiled again as a plain jax.checkpoint on the same compile-only device."""
    from remat_lab.program.targets import target_devices

    cfg = MLP.replace(target="h100", width=256)
    budget = 4 << 20
    doc = synthesize(cfg, budget, policies=["nothing_saveable"], workers=1)
    assert doc["offload"]["allowed"] is True
    assert {c["choice"] for c in doc["costs"]["names"]} == {"save", "offload"}
    best = next(c for c in doc["candidates"] if c["plan"] == doc["plan"] and c["fits"])
    p, b = best["plan"], best["max_batch"]
    device = target_devices("h100", 1)[0]
    one = jax.sharding.SingleDeviceSharding(device)
    model = build_model("mlp", cfg.width, cfg.depth, seed=0, dtype=jnp.float32, stack="scan")
    graphdef, state = nnx.split(model.blocks)
    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=p["save"], names_which_can_be_offloaded=p["offload"],
        offload_src="device", offload_dst="pinned_host")
    remat = jax.checkpoint(lambda st, h: nnx.merge(graphdef, st)(h), policy=policy)

    def loss(st, x):
        x, _ = jax.lax.scan(lambda h, s: (remat(s, h), None), x,
                            jax.tree.map(lambda a: a[:p["remat_layers"]], st))
        if p["remat_layers"] < cfg.depth:
            x, _ = jax.lax.scan(lambda h, s: (nnx.merge(graphdef, s)(h), None), x,
                                jax.tree.map(lambda a: a[p["remat_layers"]:], st))
        return jnp.sum(x, dtype=jnp.float32)

    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), state)
    x = jax.ShapeDtypeStruct((b, cfg.width), jnp.float32, sharding=one)
    ma = jax.jit(jax.value_and_grad(loss)).lower(abstract, x).compile(
        compiler_options=OPTIONS).memory_analysis()
    plain = (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
             + ma.temp_size_in_bytes)
    lab = next(r for r in best["probes"] if r["batch"] == b)["peak_bytes"]
    assert 0 <= lab - plain < 1 << 20, (lab, plain)  # generated code apart
    assert doc["max_batch"] >= next(r["max_batch"] for r in doc["named"])
