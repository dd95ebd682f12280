"""Your own block's gradient check: the remat'd stack against the same block without remat (no_remat,
same parameters, same input), with the built-ins' bounds; a remat that recomputes from a wrong saved
value is caught, the fixture's normal runs pass."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest
from flax import nnx

from remat_lab.analysis.gradcheck import USER_REFERENCE, check_gradients
from remat_lab.analysis.gradcheck_bounds import bound_parameters
from remat_lab.config import RunConfig
from remat_lab.model.policies import get_policy
from remat_lab.program import step as step_module
from remat_lab.program.step import build_problem, jit_step

FILE = str((Path(__file__).resolve().parents[1] / "tests/fixtures/user_block.py").resolve())
SHAPE = (2, 8, 64)  # the fixture's block is 64 features wide, 128 inside


def user(**kw) -> RunConfig:
    return RunConfig(**{"model": "user", "model_module": f"{FILE}:make_block", "input_shape": SHAPE,
                        "batch": SHAPE[0], "depth": 2, "repeats": 1, "warmup": 0, **kw})


def _checked(cfg: RunConfig) -> dict:
    problem = build_problem(cfg)
    step = jit_step(problem)
    loss, grads = step(*problem.args)
    return check_gradients(problem, grads, loss, step.trace(*problem.args).jaxpr)


def test_the_fixtures_run_has_its_gradients_checked(run):
    doc = run(user(policy="custom", save_names=("up_proj",)))
    check = doc["gradient_check"]
    assert check["ok"] is True, check["failures"]
    assert check["reference"] == USER_REFERENCE and check["independent"] is False
    assert check["remat_applied"] is True and check["loss_err"] is not None


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable", "no_remat"])
def test_every_policy_matches_the_block_without_remat(policy):
    check = _checked(user(policy=policy))
    assert check["ok"], check["failures"]
    assert check["remat_expected"] == get_policy(policy).remat == check["remat_applied"]


def test_the_bound_follows_the_input_and_the_widest_parameter():
    cfg = user()
    b = bound_parameters(cfg, widest=128)  # the fixture's up kernel is (64, 128)
    assert b["K"] == max(64, 128, SHAPE[0] * SHAPE[1]) and b["u"] == 2.0**-24


def _perturbed_remat(original):
    """``step._block_fn`` with a remat that is wrong on purpose: the backward pass recomputes each
    block from its input as saved times 1.01 (a wrongly saved residual), the forward is exact."""
    def block_fn(config, gather=None, constrain=None):
        good = original(config, gather, constrain)
        if not get_policy(config.policy).remat:
            return good

        def call(block, x):
            graphdef, state = nnx.split(block)
            leaves, tree = jax.tree_util.tree_flatten(state)

            def run(ls, h):
                return good(nnx.merge(graphdef, jax.tree_util.tree_unflatten(tree, ls)), h)

            @jax.custom_vjp
            def f(ls, h):
                return run(ls, h)

            def fwd(ls, h):
                return run(ls, h), (ls, h * 1.01)  # the saved input, off by 1 %

            def bwd(saved, ct):
                return jax.vjp(run, *saved)[1](ct)

            f.defvjp(fwd, bwd)
            return f(leaves, x)
        return call
    return block_fn


def test_a_remat_that_saves_a_perturbed_value_fails_the_check(monkeypatch):
    monkeypatch.setattr(step_module, "_block_fn", _perturbed_remat(step_module._block_fn))
    check = _checked(user(policy="nothing_saveable"))
    assert check["ok"] is False
    assert any("kernel" in f for f in check["failures"]), check["failures"]
    assert check["loss_err"] == 0.0  # the forward pass is right: only the gradients are wrong
    # the same injection leaves no_remat (no remat to get wrong) passing
    assert _checked(user(policy="no_remat"))["ok"]


def test_a_one_percent_gradient_error_fails():
    cfg = user(policy="dots_saveable")
    problem = build_problem(cfg)
    step = jit_step(problem)
    loss, grads = step(*problem.args)
    jaxpr = step.trace(*problem.args).jaxpr
    bad = [g * 1.01 if i == 0 else g for i, g in enumerate(grads)]
    check = check_gradients(problem, bad, loss, jaxpr)
    assert not check["ok"] and problem.paths[0] in " ".join(check["failures"])
