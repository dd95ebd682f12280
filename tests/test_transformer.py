"""The transformer block: shapes and causality, MaxText's recipes by name (loop and scan), the
independent gradient check, and the CLI run that shows the named residuals."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from remat_lab.analysis.dissect import dissect
from remat_lab.cli import main
from remat_lab.config import ConfigError, RunConfig, estimate_bytes
from remat_lab.model.models import Transformer, build_model, names_of
from remat_lab.model.policies import POLICIES
from remat_lab.program.step import build_problem

SMALL = dict(model="transformer", width=64, heads=4, seq=16, batch=2, depth=2, stack="loop")
RECIPES = [pid for pid, p in POLICIES.items() if p.group == "maxtext"]
# The block's last projection only feeds the residual sum x + mlpwo, whose gradient does not depend
# on it: the backward pass never needs it, so a recipe that may save it has nothing to save.
NEVER_NEEDED = {"mlpwo"}


def _dissect(**changes):
    return dissect(build_problem(RunConfig(**{**SMALL, **changes})), "")


def test_shapes_parameters_and_causality():
    block = Transformer(32, heads=4, rngs=nnx.Rngs(0))
    assert block.q_proj.kernel.shape == (32, 4, 8) and block.o_proj.kernel.shape == (4, 8, 32)
    assert block.wi_0.kernel.shape == (32, 128) and block.wo.kernel.shape == (128, 32)
    x = jax.random.normal(jax.random.key(1), (2, 6, 32))
    y = block(x)
    assert y.shape == x.shape
    later = block(x.at[:, 4:].set(0.0))  # changing later tokens must not change earlier outputs
    np.testing.assert_allclose(later[:, :4], y[:, :4], rtol=1e-6, atol=1e-6)
    assert not np.allclose(later[:, 4:], y[:, 4:])


def test_width_must_divide_into_heads():
    with pytest.raises(ConfigError, match="not divisible by heads 3"):
        RunConfig(model="transformer", width=64, heads=3)
    with pytest.raises(ConfigError, match="heads must be from 1 to 256"):
        RunConfig(model="transformer", width=64, heads=0)
    RunConfig(model="mlp", width=64, heads=3)  # heads matters to the transformer only
    model = build_model("transformer", 48, 1, seed=0, dtype=jnp.float32, heads=6)
    assert model.q_proj.kernel.shape == (48, 6, 8)


@pytest.mark.parametrize("stack", ["loop", "scan"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_saves_exactly_its_names_in_every_layer(recipe, stack):
    entry = POLICIES[recipe]
    d = _dissect(policy=recipe, stack=stack)
    named = [r for r in d.residuals if r["name"]]
    kept = set(entry.saves) | set(entry.offloads)
    want = [n for n in names_of("transformer") if n in kept and n not in NEVER_NEEDED]
    assert sorted({r["name"] for r in named}) == sorted(want)
    for name in want:
        rows = [r for r in named if r["name"] == name]
        if stack == "loop":  # one residual per layer, attributed to that layer
            assert [r["layer"].split(".")[0] for r in rows] == ["0", "1"], rows
        else:  # one stacked residual with the layer axis in front
            assert len(rows) == 1 and rows[0]["shape"][0] == 2, rows
        kind = "host" if name in entry.offloads else "device"
        assert {r["memory_kind"] for r in rows} == {kind}
    assert d.totals["residual_bytes_by_name"] == {
        n: sum(r["bytes"] for r in named if r["name"] == n) for n in want}


def test_per_dot_rows_carry_the_name_and_its_verdict():
    d = _dissect(policy="save_qkv_proj")
    rows = {(r["layer"], r["name"]): r for r in d.dots}
    for proj, name in [("q_proj", "query_proj"), ("k_proj", "key_proj"), ("v_proj", "value_proj")]:
        row = rows[(f"0.{proj}", name)]
        assert row["name_verdict"] == row["policy_verdict"] == "save" and row["saved"]
        assert not row["recomputed"]
    ctx = rows[("0.attn", "context")]
    assert ctx["name_verdict"] == "recompute" and ctx["recomputed"] and not ctx["saved"]
    scores = [r for r in d.dots if r["layer"] == "0.attn" and r["name"] is None]
    assert len(scores) == 1 and scores[0]["has_batch_dims"]  # QK^T pairs batch and heads
    assert rows[("0.wi_0", "mlpwi_0")]["recomputed"]


def test_dot_policies_see_the_names_too():
    d = _dissect(policy="dots_with_no_batch_dims_saveable")
    names = {r["name"] for r in d.residuals if r["name"]}
    assert {"query_proj", "key_proj", "value_proj", "mlpwi_0", "mlpwi_1"} <= names
    assert "context" not in names  # AV pairs batch and heads: not saveable by this policy


def test_notes_name_what_the_model_lacks_and_what_is_never_saved():
    notes = " ".join(_dissect(policy="minimal").notes)
    assert "qkv_proj, mlpwi, which the transformer model does not have" in notes
    assert "mlpwo: saveable by minimal, but no residual carries it" in notes
    assert "does not have" not in " ".join(_dissect(policy="save_out_proj").notes)


@pytest.mark.parametrize("policy,dtype,stack", [
    ("no_remat", "float32", "loop"), ("save_qkv_proj", "float32", "loop"),
    ("minimal_offloaded", "float32", "scan"), ("custom", "float32", "scan"),
    ("no_remat", "bfloat16", "loop"),
    ("nothing_saveable", "bfloat16", "scan"), ("save_dot_with_context_except_mlp", "bfloat16", "loop"),
])
def test_gradients_pass_the_independent_check(run, policy, dtype, stack):
    names = dict(save_names=("context",), offload_names=("mlpwi_0",)) if policy == "custom" else {}
    result = run(RunConfig(**{**SMALL, "policy": policy, "dtype": dtype, "stack": stack, **names}))
    check = result["gradient_check"]
    assert check["ok"], check["failures"]
    assert check["remat_applied"] == (policy != "no_remat")


# A remat policy per dtype whose loop-stacked step the gradient check above already compiled (the
# persistent compile cache serves it): the error below is put into that step's gradients.
REMAT_STEP = {"bfloat16": "save_dot_with_context_except_mlp", "float32": "save_qkv_proj"}


@pytest.mark.parametrize("dtype,factor", [("bfloat16", 1.01), ("float32", 1 + 1e-4)])
def test_gradient_check_catches_a_small_error_on_a_transformer_leaf(dtype, factor):
    """The transformer's looser per-element allowance (bf16 rounding through attention) still
    fails a 1 % (bf16) or 1e-4 (f32) error on one leaf: the leaf-wide scale test catches it."""
    import jax

    from remat_lab.analysis.gradcheck import check_gradients
    from remat_lab.program.step import make_step

    problem = build_problem(RunConfig(**{**SMALL, "policy": REMAT_STEP[dtype], "dtype": dtype}))
    traced = jax.jit(make_step(problem)).trace(*problem.args)
    loss, grads = traced.lower().compile()(*problem.args)
    assert check_gradients(problem, grads, float(loss), traced.jaxpr)["ok"]
    i = problem.paths.index("blocks.0.q_proj.kernel")
    bad = [g * factor if j == i else g for j, g in enumerate(grads)]
    check = check_gradients(problem, bad, float(loss), traced.jaxpr)
    assert not check["ok"] and any("q_proj" in f for f in check["failures"])


def test_estimate_covers_the_compiled_program(run):
    cfg = RunConfig(**{**SMALL, "policy": "no_remat", "stack": "scan"})
    mem = run(cfg)["memory"]
    assert mem["argument_bytes"] + mem["temp_bytes"] <= estimate_bytes(cfg)


def test_cli_run_save_qkv_proj_shows_exactly_the_qkv_residuals(capsys):
    argv = ["run", "--model", "transformer", "--width", "128", "--heads", "4", "--seq", "64",
            "--batch", "4", "--depth", "2", "--policy", "save_qkv_proj", "--repeats", "1",
            "--warmup", "0", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    named = [r for r in result["residuals"] if r["name"]]
    assert {r["name"] for r in named} == {"query_proj", "key_proj", "value_proj"}
    assert all(r["shape"] == [2, 4, 64, 4, 32] for r in named)  # scan: layer axis in front
    assert result["gradient_check"]["ok"]
    assert any("qkv_proj" in n for n in result["notes"])
