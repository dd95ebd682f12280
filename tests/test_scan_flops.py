"""Flops of a scanned step: each loop body scaled as a whole, checked against unrolled compiles.

XLA's cost analysis counts a ``while`` body once. ``costs.step_flops`` adds each body's own cost
(XLA's rules, parsed back from the compiled text) ``trip - 1`` more times. The truth is a second,
independent compile of the same computation unrolled, whose XLA count needs no scaling.
Tolerance: 0.5 % of the unrolled count. What remains between the two programs is loop
bookkeeping (counter, slice indices) and XLA's different simplification of the two shapes; the
old rule (products scaled, element-wise work counted once) misses by 2 to 3 % here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from remat_lab.analysis import hlo
from remat_lab.analysis.costs import body_costs, cost_of, step_flops
from remat_lab.config import RunConfig
from remat_lab.program.step import build_problem, make_step

TOL = 0.005
pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA CPU's cost analysis")


def _block(x, w):
    return jnp.tanh(x @ w[0]) * jax.nn.sigmoid(x @ w[1]) + x


def _scanned(ws, x):
    y, _ = jax.lax.scan(lambda h, w: (_block(h, w), None), x, ws)
    return jnp.sum(y * y)


def _looped(wl, x):
    for w in wl:
        x = _block(x, w)
    return jnp.sum(x * x)


def _compiled(f, params, x):
    return jax.jit(jax.grad(f, argnums=(0, 1))).lower(params, x).compile()


def test_a_scanned_gradient_counts_what_the_unrolled_one_does():
    # The gradient reaches x too, so the unrolled program computes every layer's input gradient,
    # as every iteration of the scan does. Float32: no dtype conversions around the products.
    ws, x = jnp.ones((3, 2, 32, 32), jnp.float32), jnp.ones((4, 32), jnp.float32)
    scan, loop = _compiled(_scanned, ws, x), _compiled(_looped, list(ws), x)
    xla, text = cost_of(scan)["flops"], scan.as_text()
    truth = cost_of(loop)["flops"]
    assert hlo.executions(text)[1] == [3, 3]  # forward and backward loops
    assert step_flops(xla, text) == pytest.approx(truth, rel=TOL)
    old = xla + hlo.loop_flops_left_out(text)  # products scaled, element-wise work once
    assert abs(old / truth - 1) > 2 * TOL  # the test tells the two rules apart


def _step_flops(cfg: RunConfig) -> tuple[float, float]:
    """(the engine's step flops, XLA's unscaled count) of ``cfg``'s step, compiled here."""
    problem = build_problem(cfg)
    compiled = jax.jit(make_step(problem)).lower(*problem.args).compile()
    xla = cost_of(compiled)["flops"]
    return step_flops(xla, compiled.as_text()), xla


def test_a_scanned_transformer_layer_costs_what_an_unrolled_layer_costs():
    # The unrolled step drops layer 0's input gradient (x is not differentiated) while every scan
    # iteration computes it, so the two totals differ by that fixed amount; one more layer (depth 3
    # minus depth 2) costs the same in both.
    cfg = RunConfig(model="transformer", width=32, batch=2, seq=4, heads=2, depth=2, stack="scan",
                    policy="no_remat")
    (scan2, _), (scan3, xla3) = _step_flops(cfg), _step_flops(cfg.replace(depth=3))
    loop2 = _step_flops(cfg.replace(stack="loop"))[0]
    loop3 = _step_flops(cfg.replace(stack="loop", depth=3))[0]
    assert scan3 > 2.5 * xla3  # both loops scaled
    assert scan3 - scan2 == pytest.approx(loop3 - loop2, rel=TOL)


def test_no_loop_no_scaling_and_a_text_that_does_not_parse_falls_back():
    ws, x = jnp.ones((2, 2, 16, 16), jnp.float32), jnp.ones((2, 16), jnp.float32)
    loop = _compiled(_looped, list(ws), x)
    xla = cost_of(loop)["flops"]
    assert body_costs(loop.as_text(), xla) == {} and step_flops(xla, loop.as_text()) == xla
    scan = _compiled(_scanned, ws, x)
    text = scan.as_text()
    # Analysed with other rules than the compile's (a count that disagrees): products only.
    assert body_costs(text, cost_of(scan)["flops"] + 1) is None
    assert step_flops(cost_of(scan)["flops"] + 1, text) == (
        cost_of(scan)["flops"] + 1 + hlo.loop_flops_left_out(text))


def test_excess_flops_scale_both_programs_the_same_way(run):
    # Both sides of excess_flops_vs_no_remat are whole-body-scaled step flops, each computed here
    # from its own compile.
    cfg = RunConfig(model="mlp", width=32, batch=4, depth=2, stack="scan", policy="nothing_saveable")
    result = run(cfg)
    flops, _ = _step_flops(cfg)
    base, _ = _step_flops(cfg.replace(policy="no_remat"))
    assert result["flops"] == pytest.approx(flops, rel=1e-9)
    assert result["baseline"]["flops"] == pytest.approx(base, rel=1e-9)
    assert result["hlo"]["excess_flops_vs_no_remat"] == pytest.approx(flops - base, rel=1e-9)



def test_a_scanned_steps_bytes_are_its_loop_bodies_own_bytes_times_their_runs():
    """Bytes accessed are scaled as the flops are: each loop body's own bytes (XLA's rules) by its
    further runs. The truth: the lab's own count of the same text (``traffic``: every top-level
    instruction's operands and result, times its computation's runs), independent of XLA's cost
    analysis. The old rule (the program's bytes times the flops' ratio) misses it by far more.
    (A scan moves more bytes than the same layers unrolled, its stacked buffers sliced and
    updated, so an unrolled compile is no truth for bytes.)"""
    from remat_lab.analysis import traffic
    from remat_lab.analysis.costs import step_costs

    cfg = RunConfig(model="transformer", width=64, batch=2, seq=32, heads=2, depth=3, stack="scan",
                    policy="no_remat")
    problem = build_problem(cfg)
    compiled = jax.jit(make_step(problem)).lower(*problem.args).compile()
    text, cost = compiled.as_text(), cost_of(compiled)
    got = step_costs(compiled, text)["bytes_accessed"]
    truth = traffic.traffic_of(text)["memory_bytes"]
    assert got == pytest.approx(truth, rel=0.01)
    by_ratio = cost["bytes_accessed"] * step_flops(cost["flops"], text) / cost["flops"]
    assert abs(by_ratio / truth - 1) > 0.05
