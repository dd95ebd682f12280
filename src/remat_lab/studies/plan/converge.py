"""The planner's check phase converging: a refusal rules out what it dominates, a batch is bracketed."""

from __future__ import annotations

from remat_lab.studies.plan.fit import Line
from remat_lab.studies.plan.space import Family

# A refusal whose message names no bytes is filed at 2**60 (``advisor.search._over_the_device``).
UNNAMED = 1 << 59


def over(found: dict | None, hbm: int) -> bool:
    """A compile that does not fit: refused by the compiler, or its peak over the HBM."""
    return bool(found) and not found.get("error") and (found["refused"] or found["peak_bytes"] > hbm)


def fits(found: dict | None, hbm: int) -> bool:
    return bool(found) and not found.get("error") and not found["refused"] and found["peak_bytes"] <= hbm


def ruled_out(key: tuple, compiled: dict, hbm: int) -> bool:
    """Whether a compile already says ``key`` cannot fit: the same family over the HBM at no larger
    a per-device batch, with one step or where ``key`` accumulates too (a larger batch holds more
    activations; accumulating adds the float32 gradient sums)."""
    fam, b, m = key
    return any(f == fam and b >= b2 and (m2 == 1 or m > 1) and over(c, hbm)
               for (f, b2, m2), c in compiled.items())


def bracket(fam: Family, compiled: dict, hbm: int) -> tuple[int, float | None, int | None, float | None]:
    """``(lo, its peak, hi, the bytes its refusal named)``: the family's largest per-device batch of
    one step compiled to fit (0: none) and its smallest over the HBM (None: none yet)."""
    lo, plo, hi, need = 0, None, None, None
    for (f, b, m), c in compiled.items():
        if f != fam or m != 1:
            continue
        if fits(c, hbm) and b > lo:
            lo, plo = b, c["peak_bytes"]
        elif over(c, hbm) and (hi is None or b < hi):
            hi, need = b, c["peak_bytes"]  # a refusal's bytes: what libtpu said it needed
    return lo, plo, hi, need


def next_batch(fam: Family, line: Line | None, compiled: dict, hbm: int) -> int | None:
    """The next per-device batch to compile for ``fam`` when the question is as large as fits, kept
    strictly between its largest fit and its smallest refusal: where the straight line between the
    two (the fit's peak, the bytes the refusal named) reaches the HBM, the end that has stayed put
    through the last probes weighed half as much each time (regula falsi, Illinois: on a peak
    convex in the batch a plain secant creeps up from one side). With no refusal yet, where the
    fitted line from the largest fit reaches the HBM, at least one more. None when the bracket is
    closed (the largest fit one below the smallest refusal) or nothing brackets it yet."""
    lo, plo, hi, need = bracket(fam, compiled, hbm)
    if (hi is not None and hi - lo <= 1) or (hi is None and not lo):
        return None
    if hi is None:
        slope = line.slope if line else 0.0
        return lo + max(1, int((hbm - plo) // slope) if slope > 0 else lo)
    kept = _kept(fam, compiled, hbm)  # the last probes' side: +n fits in a row, -n refusals
    low = plo if lo else (line.a if line else 0.0)
    deficit, excess = hbm - low, need - hbm
    if kept > 1:
        excess /= 2 ** (kept - 1)  # the refusal end has stayed put: weigh it less
    elif kept < -1:
        deficit /= 2 ** (-kept - 1)
    # bisect where the bytes say nothing (a refusal that named none) or one end has stayed put
    # four probes running: never more than four probes a halving
    if deficit <= 0 or excess <= 0 or need >= UNNAMED or abs(kept) > 3:
        return (lo + hi) // 2
    return min(max(lo + int((hi - lo) * deficit / (deficit + excess)), lo + 1), hi - 1)


def _kept(fam: Family, compiled: dict, hbm: int) -> int:
    """The family's last compiles of one step that landed on the same side, signed: +n fits, -n over."""
    sides = [1 if fits(c, hbm) else -1 for (f, _, m), c in compiled.items()
             if f == fam and m == 1 and (fits(c, hbm) or over(c, hbm))]
    n = 0
    for side in reversed(sides):
        if n and (side > 0) != (n > 0):
            break
        n += side
    return n
