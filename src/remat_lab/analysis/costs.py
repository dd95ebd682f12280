"""XLA's own accounting of a compiled program: its memory analysis and its cost (flops, bytes)."""

from __future__ import annotations

from remat_lab.analysis import hlo

MEMORY_FIELDS = ("argument", "output", "alias", "temp", "generated_code")

def memory_report(compiled) -> dict | None:
    """Every field of ``compiled.memory_analysis()`` plus the peak; None when unavailable.

    ``peak_bytes = generated_code + argument + output - alias + temp`` is XLA's own lower bound.
    ``xla_peak_memory_bytes`` is XLA's ``peak_memory_in_bytes`` field (on CPU it leaves out temp).
    """
    try:
        ma = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        return None
    if ma is None:
        return None
    out = {}
    for prefix in ("", "host_"):
        for name in MEMORY_FIELDS:
            out[f"{prefix}{name}_bytes"] = int(getattr(ma, f"{prefix}{name}_size_in_bytes", 0) or 0)
    out["peak_bytes"] = (out["generated_code_bytes"] + out["argument_bytes"] + out["output_bytes"]
                         - out["alias_bytes"] + out["temp_bytes"])
    peak = getattr(ma, "peak_memory_in_bytes", None)
    out["xla_peak_memory_bytes"] = None if peak is None else int(peak)
    return out


def cost_of(compiled) -> dict:
    """XLA's cost analysis of the compiled step: ``flops`` and ``bytes_accessed`` (None if absent).

    XLA counts a while loop's body once (a ``scan`` over layers): callers scale by the trip count.
    """
    try:
        cost = compiled.cost_analysis()
    except Exception:
        cost = None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    cost = cost or {}
    get = lambda key: float(cost[key]) if key in cost else None
    return {"flops": get("flops"), "bytes_accessed": get("bytes accessed")}


def step_flops(xla_flops: float | None, text: str) -> float | None:
    """The step's flops: XLA's count plus the products it leaves out by counting each while-loop
    (scan) body once. Element-wise work inside a loop body stays counted once (a few per cent)."""
    return None if xla_flops is None else xla_flops + hlo.loop_flops_left_out(text)


def flops_of(compiled) -> float | None:
    """XLA's cost-analysis flop count of the compiled step."""
    return cost_of(compiled)["flops"]


XLA_FLOPS = "XLA's cost analysis, loop bodies scaled by their trip counts"
PRODUCT_FLOPS = ("matrix products of the compiled HLO (2 x output elements x contracted size, times "
                 "their runs); XLA gives no cost analysis for this target, elementwise work left out")


def program_flops(compiled, text: str) -> tuple[float | None, float | None, str]:
    """``(flops, bytes accessed, where the flops come from)`` of a compiled step, loop bodies scaled
    by their trip counts. Deviceless GPU compiles carry no cost analysis: their flops are then the
    products counted in the HLO, and bytes accessed are unknown (None)."""
    cost = cost_of(compiled)
    flops = step_flops(cost["flops"], text)
    if flops is None:
        products = sum((m["flops"] or 0) * max(m["executions"], 1) for m in hlo.matmuls(text))
        return (products or None), None, PRODUCT_FLOPS
    scale = flops / cost["flops"] if cost["flops"] else 1.0
    return flops, (cost["bytes_accessed"] * scale if cost["bytes_accessed"] else None), XLA_FLOPS
