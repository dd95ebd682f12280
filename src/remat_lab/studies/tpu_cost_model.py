"""libtpu's own cost model of a layered step: the step at one and two unrolled layers, extrapolated by layer.

libtpu's cost analysis has an ``optimal_seconds`` figure (its model of the program's time on the
chip). For a program with a ``while`` loop (a ``scan`` over layers, microbatches) libtpu 0.0.52
gives a meaningless figure: a large negative whole number plus a fraction (-13.9993 for a two-layer
scanned llm on a v5e; the same program unrolled: 0.00061 s). Unrolled, the figure is linear in
the layers (that llm at 1, 2, 3, 4 layers: 0.327, 0.611, 0.897, 1.181 ms:
``tests/test_predict.py``). So the step's figure is read from two small compiles of the same
configuration with its layers unrolled, one and two layers deep: ``o1 + (depth - 1)(o2 - o1)``.
A Pallas kernel (splash attention) libtpu cannot price counts as -1 s in the figure (``decoded``):
the kernels' time is added by the prediction from their flops.
"""

from __future__ import annotations

from remat_lab.analysis.costs import cost_of
from remat_lab.config import RunConfig
from remat_lab.program.step import abstract_problem, jit_step
from remat_lab.program.tracing import trace_and_lower

_PALLAS = 'custom_call_target="tpu_custom_call"'
METHOD = ("libtpu's optimal_seconds of the step compiled with one and two layers unrolled, "
          "extrapolated by layer (o1 + (depth - 1) x (o2 - o1)), each read back from libtpu's "
          "-1 s for every Pallas kernel it cannot price; the full program's own figure is not "
          "meaningful with a loop in it (libtpu 0.0.52)")


def decoded(optimal_s: float | None, text: str) -> float | None:
    """libtpu's figure for the kernels it prices: libtpu 0.0.52 counts -1 s for each kernel it
    has no cost for (a Pallas ``tpu_custom_call``: the splash attention kernels), so a program with
    N of them reads ``t - N``; ``t`` back, or None where the figure does not decode (a loop)."""
    if optimal_s is None:
        return None
    value = optimal_s + text.count(_PALLAS)
    return value if 0 < value < 1e4 else None


def _optimal_seconds(config: RunConfig) -> float | None:
    problem = abstract_problem(config)
    _, lowered = trace_and_lower(jit_step(problem), *problem.args)
    compiled = lowered.compile()
    return decoded(cost_of(compiled)["optimal_seconds"], compiled.as_text())


def layered_optimal_seconds(config: RunConfig) -> dict:
    """``{"optimal_seconds", "per_layer_s", "method"}`` for ``config`` on its TPU target, or
    ``{"optimal_seconds": None, "why": ...}`` where the extrapolation does not apply (a single
    layer, microbatches or a partial remat, whose small programs keep a loop or change shape)."""
    if config.microbatches > 1:
        return {"optimal_seconds": None, "why": "microbatches keep a loop in every program"}
    if config.remat_layers:
        return {"optimal_seconds": None, "why": "a partial remat (--remat-layers) is not layer-uniform"}
    one = _optimal_seconds(config.replace(depth=1, stack="loop"))
    if config.depth == 1:
        return {"optimal_seconds": one, "per_layer_s": one, "method": METHOD}
    two = _optimal_seconds(config.replace(depth=2, stack="loop"))
    if one is None or two is None or one <= 0 or two <= one:
        return {"optimal_seconds": None,
                "why": f"libtpu's figure at one and two layers ({one}, {two}) does not extrapolate"}
    return {"optimal_seconds": one + (config.depth - 1) * (two - one), "per_layer_s": two - one,
            "method": METHOD}
