"""libtpu's own cost model of a layered step: the step at one and two unrolled layers, extrapolated by layer.

libtpu's cost analysis has an ``optimal_seconds`` figure (its model of the program's time on the
chip). For a program with a ``while`` loop (a ``scan`` over layers, microbatches), and for some
programs without one, libtpu 0.0.52 gives a meaningless figure: a negative whole number plus a
fraction (-13.9993 for a two-layer scanned llm on a v5e, whose unrolled twin reads 0.00061 s;
-3.998 for a one-layer llm with full attention at seq 1024, whose splash-attention twin reads
0.00146). Unrolled and positive, the figure is linear in the layers (an llm at 1, 2, 3, 4 layers:
0.327, 0.611, 0.897, 1.181 ms; ``tests/test_predict.py``). So a scanned step's figure is read from
two small compiles of the same configuration with its layers unrolled, one and two layers deep:
``o1 + (depth - 1)(o2 - o1)``. It is not the lab's prediction (``analysis/predict.py`` says why):
``benchmarks/libtpu_model.py`` holds it against MaxText's measured runs.
"""

from __future__ import annotations

from remat_lab.analysis.costs import cost_of
from remat_lab.config import RunConfig
from remat_lab.program.step import abstract_problem, jit_step
from remat_lab.program.tracing import trace_and_lower

METHOD = ("libtpu's optimal_seconds of the step compiled with one and two layers unrolled, "
          "extrapolated by layer (o1 + (depth - 1) x (o2 - o1)); the full program's own figure is "
          "not meaningful with a loop in it (libtpu 0.0.52)")


def optimal_seconds(config: RunConfig) -> float | None:
    """libtpu's figure for ``config``'s gradient step on its target (None: not given)."""
    problem = abstract_problem(config)
    _, lowered = trace_and_lower(jit_step(problem), *problem.args)
    return cost_of(lowered.compile())["optimal_seconds"]


def layered_optimal_seconds(config: RunConfig) -> dict:
    """``{"optimal_seconds", "per_layer_s", "method"}`` for ``config`` on its TPU target, or
    ``{"optimal_seconds": None, "why": ...}`` where the extrapolation does not apply (microbatches
    or a partial remat, whose small programs keep a loop or change shape; a figure that is not
    positive)."""
    if config.microbatches > 1:
        return {"optimal_seconds": None, "why": "microbatches keep a loop in every program"}
    if config.remat_layers:
        return {"optimal_seconds": None, "why": "a partial remat (--remat-layers) is not layer-uniform"}
    one = optimal_seconds(config.replace(depth=1, stack="loop"))
    two = one if config.depth == 1 else optimal_seconds(config.replace(depth=2, stack="loop"))
    if one is None or two is None or one <= 0 or two < one:
        return {"optimal_seconds": None,
                "why": f"libtpu's figure at one and two layers ({one}, {two}) is not meaningful"}
    return {"optimal_seconds": one + (config.depth - 1) * (two - one), "per_layer_s": two - one,
            "method": METHOD}
