"""A step's place under given roofs: XLA's flop and byte counts, arithmetic intensity, the bound."""

from __future__ import annotations

import math


def positive(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def xla_cost(compiled) -> dict:
    """XLA's cost analysis of a compiled program: ``{"flops", "bytes_accessed"}`` (None if absent).

    XLA counts a while loop's body once, whatever its trip count: scale both by the trip count
    (or use an unrolled program) before passing them to ``roofline_report``.
    """
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        cost = None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    cost = cost or {}
    return {"flops": positive(cost.get("flops")), "bytes_accessed": positive(cost.get("bytes accessed"))}


def place(roofs: dict, flops, bytes_accessed, median_s) -> dict:
    peak = positive(roofs.get("peak_flops_per_s"))
    bandwidth = positive(roofs.get("bandwidth_bytes_per_s"))
    flops, nbytes, median_s = positive(flops), positive(bytes_accessed), positive(median_s)
    achieved = flops / median_s if flops and median_s else None
    intensity = flops / nbytes if flops and nbytes else None
    memory_roof = intensity * bandwidth if intensity and bandwidth else None
    attainable = (min(peak, memory_roof) if peak and memory_roof else peak if peak and bandwidth
                  is None else None)
    bound = None
    if peak and memory_roof:
        bound = "memory" if memory_roof < peak else "compute"
    return {
        "peak_flops_per_s": peak, "peak_source": roofs.get("peak_source"),
        "peak_note": roofs.get("peak_note"), "bandwidth_bytes_per_s": bandwidth,
        "ridge_intensity": peak / bandwidth if peak and bandwidth else None,
        "flops": flops, "bytes_accessed": nbytes, "median_s": median_s,
        "arithmetic_intensity": intensity, "achieved_flops_per_s": achieved,
        "attainable_flops_per_s": attainable, "bound": bound,
        "achieved_fraction": achieved / peak if achieved and peak else None,
        "fraction_of_attainable": achieved / attainable if achieved and attainable else None,
        "calibrated_at": roofs.get("measured_at"),
    }
