"""What the compiled program recomputes, checked against ground truth from two independent compiles.

The test compiles the policy's step and the ``no_remat`` step itself, counts the product
instructions with its own pattern and reads XLA's flop counts; the engine's differential columns
must say the same, over both models, a single vector and batches, depths 1, 3, 4 and 5, both
objectives, both dtypes and every policy.
"""

from __future__ import annotations

import functools
import re

import jax
import pytest

from remat_lab.config import RunConfig
from remat_lab.model.policies import POLICIES
from remat_lab.program.step import build_problem, make_step

_DOT = re.compile(r"^\s*(?:ROOT )?%\S+ = \S+ dot\(", re.M)

# (model, width, batch, seq, depth, stack, objective, dtype): every value of every axis appears.
GRID = [
    ("mlp", 24, 0, 1, 1, "loop", "value_and_grad", "float32"),
    ("mlp", 16, 8, 1, 3, "loop", "grad", "bfloat16"),
    ("mlp", 16, 0, 1, 3, "scan", "grad", "float32"),
    ("mlp", 16, 8, 1, 4, "scan", "value_and_grad", "bfloat16"),
    ("seq_mixer", 16, 4, 6, 1, "loop", "value_and_grad", "bfloat16"),
    ("seq_mixer", 16, 2, 4, 5, "loop", "grad", "float32"),
    ("seq_mixer", 16, 2, 16, 3, "loop", "value_and_grad", "float32"),  # seq == width
    ("seq_mixer", 16, 2, 4, 3, "scan", "value_and_grad", "float32"),
]
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@functools.cache  # the no_remat baseline is every policy's
def _truth(cfg: RunConfig) -> tuple[int, float, list[int]]:
    """(product instructions, XLA flops, while-loop trip counts) of ``cfg``'s step, compiled here."""
    problem = build_problem(cfg)
    compiled = jax.jit(make_step(problem)).lower(*problem.args).compile()
    text = compiled.as_text()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return len(_DOT.findall(text)), float(cost["flops"]), [int(n) for n in _TRIP.findall(text)]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="counts XLA CPU dot instructions")
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("grid", GRID, ids=lambda g: "-".join(map(str, g)))
def test_compiled_recomputation_equals_the_differential_truth(run, grid, policy):
    model, width, batch, seq, depth, stack, objective, dtype = grid
    cfg = RunConfig(model=model, width=width, batch=batch, seq=seq, depth=depth, stack=stack,
                    objective=objective, dtype=dtype, policy=policy)
    result = run(cfg)
    dots, flops, trips = _truth(cfg)
    base_dots, base_flops, base_trips = _truth(cfg.replace(policy="no_remat"))
    h, t = result["hlo"], result["totals"]
    assert h["dot_instructions"] == dots
    if stack == "scan" and depth > 1:
        # Every product sits in the forward or the backward loop, each run ``depth`` times.
        assert trips == base_trips == [depth, depth] == h["loop_trip_counts"]
        dots, base_dots = dots * depth, base_dots * depth
    else:
        assert trips == []
        assert h["excess_flops_vs_no_remat"] == pytest.approx(flops - base_flops, abs=0.5)
    excess = dots - base_dots
    assert h["dot_count"] == dots
    assert h["excess_dots_vs_no_remat"] == excess
    assert t["dots_recomputed_in_compiled"] == max(excess, 0)
    rows = [d["recomputed_in_compiled"] for d in result["dots"]]
    # A row is claimed only when the jaxpr recomputes it, and never more rows than the truth.
    assert all(d["recomputed"] for d in result["dots"] if d["recomputed_in_compiled"] is not False)
    assert rows.count(True) <= max(excess, 0)
    if excess <= 0:
        assert rows.count(True) == 0 and rows.count(None) == 0
    if None not in rows:
        assert rows.count(True) == max(excess, 0) or excess > sum(d["recomputed"] for d in result["dots"])
    if h["identical_to"] == "no_remat":
        assert excess == 0 and flops == base_flops
    if policy == "no_remat":
        assert h["identical_to"] == "no_remat"
