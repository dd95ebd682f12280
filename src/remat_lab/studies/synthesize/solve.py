"""The synthesizer's exact solver: the best per-name save / offload / recompute plan under an additive model.

The model (``Model``, fitted by ``synthesize_costs.measure``): at a per-device batch ``b`` with
``r`` of the ``L`` layers remat'd, a plan's peak is ``a_r + b * s_r(plan)`` and its recomputed
flops ``b * (r / L) * (R - sum of what its saved or offloaded names spare)``, where ``s_r``
interpolates between the slope with every layer saved whole (no_remat) and the slope of the plan with
every layer remat'd (the recompute-everything slope plus each saved or offloaded name's bytes per example).

An offloaded name may also lower the peak below recompute-everything's (the layer's backward
reads it back instead of recomputing it): the plan's offloads save the least any of them saves alone
(``Model._offload_saving``), not additive, so the solver solves once per name that can set it
(``_witnesses``: that name offloaded, those saving less not) and once without, and keeps the best.

Solved exactly by meet in the middle over the names (for each layer count ``r``): the ``k`` names
are split into two halves, each half's ``3^(k/2)`` choices listed, one half sorted by bytes with a
running best, and every choice of the other half paired with the best that fits beside it by
binary search. Every one of the ``3^k`` plans is some pair, so the optimum is found, in
``O(3^(k/2) log 3^(k/2))`` per layer count instead of ``3^k`` (k = 16: 2 x 6,561 half-plans, not 43
million plans). Ties: fewer recomputed flops, then fewer offloaded bytes, then the smaller peak.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from dataclasses import dataclass, field

MAX_NAMES = 16  # 3^8 half-plans a side; beyond it the names are too many to solve exactly here
CHOICES = ("recompute", "save", "offload")


@dataclass(frozen=True)
class Plan:
    """Each name saved on the device, offloaded to pinned host memory or recomputed (the rest);
    ``remat_layers``: how many of the stack's layers are remat'd (the first ones; the rest saved
    whole)."""

    save: tuple[str, ...]
    offload: tuple[str, ...]
    remat_layers: int

    def recompute(self, names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in names if n not in self.save and n not in self.offload)

    def as_dict(self, names: tuple[str, ...]) -> dict:
        return {"save": list(self.save), "offload": list(self.offload),
                "recompute": list(self.recompute(names)), "remat_layers": self.remat_layers}


@dataclass(frozen=True)
class Model:
    """The additive cost model, per device and per example (see the module docstring).

    ``intercept_full``/``slope_full``: no_remat's peak line (bytes at batch 0, bytes per example);
    ``intercept_base``/``slope_base``: every layer remat'd, every name recomputed; ``recompute``:
    that program's recomputed flops per example; per name and choice (``save``, ``offload``):
    ``bytes`` added per example, ``flops`` spared per example, ``host`` bytes per example moved to
    the host. ``layers``: the stack's L; ``layer_counts``: the remat'd layer counts allowed."""

    names: tuple[str, ...]
    layers: int
    layer_counts: tuple[int, ...]
    intercept_full: float
    slope_full: float
    intercept_base: float
    slope_base: float
    recompute: float
    bytes: dict[tuple[str, str], float]
    flops: dict[tuple[str, str], float]
    host: dict[tuple[str, str], float]
    offload: bool  # the target has a host memory space
    recompute_basis: str = "no_remat"  # what ``recompute`` was measured against (measure says)
    # per name, how far offloading it alone lowers the peak below every name recomputed, per example
    # (<= 0: the layer's backward then reads it back instead of recomputing it; see ``_offload_saving``)
    offload_saving: dict[str, float] = field(default_factory=dict)

    def choices(self) -> tuple[str, ...]:
        return CHOICES if self.offload else CHOICES[:2]

    def _part(self, name: str, choice: str) -> tuple[float, float, float]:
        if choice == "recompute":
            return 0.0, 0.0, 0.0
        key = (name, choice)
        return self.bytes[key], self.flops[key], self.host[key]

    def _offload_saving(self, plan: Plan) -> float:
        """The plan's offloaded names' saving on the peak, per example (<= 0): the least any of them
        saves alone (read back together for a layer's backward, they are live at once: on the
        SwiGLU block gate alone saves 262 KB, up none, the two together none). Not additive: the
        solver takes it name by name (``_witnesses``)."""
        if not plan.offload:
            return 0.0
        return min(max(self.offload_saving.get(n, 0.0) for n in plan.offload), 0.0)

    def _line(self, r: int, extra_bytes: float) -> tuple[float, float]:
        """``(intercept, slope)`` of the peak with ``r`` layers remat'd and ``extra_bytes`` per
        example of saved or offloaded names."""
        share = r / self.layers
        return (self.intercept_full + share * (self.intercept_base - self.intercept_full),
                self.slope_full + share * (self.slope_base + extra_bytes - self.slope_full))

    def predict(self, plan: Plan, batch: int) -> dict:
        """``{"peak_bytes", "recomputed_flops", "offloaded_bytes"}`` of ``plan`` at per-device
        ``batch`` by the model."""
        parts = [self._part(n, "save" if n in plan.save else "offload" if n in plan.offload
                            else "recompute") for n in self.names]
        extra = sum(p[0] for p in parts) + self._offload_saving(plan)
        a, s = self._line(plan.remat_layers, extra)
        share = plan.remat_layers / self.layers
        return {"peak_bytes": a + s * batch,
                "recomputed_flops": max(batch * share * (self.recompute - sum(p[1] for p in parts)), 0.0),
                "offloaded_bytes": batch * share * sum(p[2] for p in parts)}

    def largest_batch(self, plan: Plan, budget: float) -> int:
        """The largest per-device batch whose predicted peak is within ``budget`` (0: none)."""
        a, s = self._line(plan.remat_layers, sum(
            self._part(n, "save" if n in plan.save else "offload" if n in plan.offload
                       else "recompute")[0] for n in self.names) + self._offload_saving(plan))
        if s <= 0:
            return 0 if a > budget else 1 << 30
        return max(int(math.floor((budget - a) / s + 1e-9)), 0)


def _half(model: Model, names: tuple[str, ...]) -> list[tuple[float, float, float, tuple[str, ...]]]:
    """Every choice for ``names``: ``(bytes, flops spared, host bytes, choices)`` per example."""
    out = []
    for picks in itertools.product(model.choices(), repeat=len(names)):
        parts = [model._part(n, c) for n, c in zip(names, picks, strict=True)]
        out.append((sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts),
                    picks))
    return out


def _plan(names: tuple[str, ...], picks: tuple[str, ...], r: int) -> Plan:
    return Plan(tuple(n for n, c in zip(names, picks, strict=True) if c == "save"),
                tuple(n for n, c in zip(names, picks, strict=True) if c == "offload"), r)


def best_under(model: Model, cap: float) -> tuple[float, float, float, tuple[str, ...]] | None:
    """The choice of every name whose added bytes per example are at most ``cap`` and that spares
    the most flops (then moves the fewest host bytes, then adds the fewest bytes): meet in the
    middle, exact. ``(bytes, flops spared, host bytes, choices in model.names order)``; None when
    even the cheapest choice exceeds ``cap``."""
    k = len(model.names)
    left_names, right_names = model.names[:k // 2], model.names[k // 2:]
    right = sorted(_half(model, right_names), key=lambda t: t[0])
    keys = [t[0] for t in right]
    # running best of the right half by bytes: the most flops spared, the fewest host bytes, bytes
    best_prefix, best = [], None
    for t in right:
        if best is None or (-t[1], t[2], t[0]) < (-best[1], best[2], best[0]):
            best = t
        best_prefix.append(best)
    found = None
    for lt in _half(model, left_names):
        i = bisect.bisect_right(keys, cap - lt[0] + 1e-9) - 1
        if i < 0:
            continue
        rt = best_prefix[i]
        total = (lt[0] + rt[0], lt[1] + rt[1], lt[2] + rt[2], lt[3] + rt[3])
        if found is None or (-total[1], total[2], total[0]) < (-found[1], found[2], found[0]):
            found = total
    return found


def _witnesses(model: Model) -> list[tuple[str | None, Model]]:
    """The ways a plan's offload saving can be set (``Model._offload_saving``): none (``None``, the
    additive model), or by name ``w`` offloaded, saving its own, every other name offloaded saving
    at least as much: ``(w, the model of the other names, those saving less than w not
    offloadable)``. Every plan is one of them, so the best over them is exact."""
    out: list[tuple[str | None, Model]] = [(None, model)]
    for w, t in model.offload_saving.items():
        if t < 0 and w in model.names:
            banned = {(n, "offload") for n in model.names if model.offload_saving.get(n, 0.0) > t}
            out.append((w, dataclasses.replace(model, names=tuple(n for n in model.names if n != w),
                                   bytes={k: math.inf if k in banned else v
                                          for k, v in model.bytes.items()})))
    return out


def _with(model: Model, w: str | None, picks: tuple[str, ...]) -> tuple[str, ...]:
    """``picks`` of the names less ``w`` with ``w`` offloaded, in ``model.names`` order."""
    if w is None:
        return picks
    rest = iter(picks)
    return tuple("offload" if n == w else next(rest) for n in model.names)


def min_recompute(model: Model, budget: float, batch: int, top: int = 3) -> list[dict]:
    """At per-device ``batch``, the best plan of each layer count that fits ``budget`` by the model,
    the best first (fewest recomputed flops, then offloaded bytes, then peak); up to ``top``.
    Each: ``{"plan", "predicted": Model.predict}``; with offload savings, the best of each way the
    saving can be set (``_witnesses``)."""
    out = []
    order = lambda c: (c["predicted"]["recomputed_flops"], c["predicted"]["offloaded_bytes"],  # noqa: E731
                       c["predicted"]["peak_bytes"])
    for r in model.layer_counts:
        plans = []
        if r == 0:
            plans.append(_plan(model.names, ("recompute",) * len(model.names), 0))
        else:
            share = r / model.layers
            a, s0 = model._line(r, 0.0)
            cap = (budget - a - s0 * batch) / (batch * share)
            for w, m in _witnesses(model):
                given = 0.0 if w is None else model.offload_saving[w] + model.bytes[(w, "offload")]
                if (found := best_under(m, cap - given)) is not None:
                    plans.append(_plan(model.names, _with(model, w, found[3]), r))
        fits = [c for plan in plans if (c := {"plan": plan, "predicted": model.predict(plan, batch)})
                ["predicted"]["peak_bytes"] <= budget + 1e-6]
        if fits:
            out.append(min(fits, key=order))
    out.sort(key=order)
    return out[:top]


def max_batch(model: Model, budget: float) -> int:
    """The largest per-device batch any plan fits by the model (0: none fits batch 1): the fewest
    bytes per example at each layer count, each name its cheapest choice (each way the offload
    saving can be set, ``_witnesses``)."""
    best = 0
    for r, (w, m) in itertools.product(model.layer_counts, _witnesses(model)):
        picks = tuple(min(m.choices(), key=lambda c, n=n: (m._part(n, c)[0], -m._part(n, c)[1]))
                      for n in m.names)
        best = max(best, model.largest_batch(_plan(model.names, _with(model, w, picks), r), budget))
    return best


def solve(model: Model, budget: float, goal: str, batch: int | None = None, top: int = 3) -> dict:
    """The model's best plans for ``goal`` (``max-batch``: the largest per-device batch, then the
    fewest recomputed flops there; ``min-recompute``: the fewest at per-device ``batch``):
    ``{"batch", "candidates": min_recompute(...)}``; no candidate when nothing fits."""
    if len(model.names) > MAX_NAMES:
        raise ValueError(f"{len(model.names)} checkpoint names; the exact solver takes at most {MAX_NAMES}.")
    b = max_batch(model, budget) if goal == "max-batch" else int(batch or 0)
    return {"batch": b, "candidates": min_recompute(model, budget, b, top) if b > 0 else []}


def brute_force(model: Model, budget: float, batch: int) -> dict | None:
    """Every plan enumerated (3^k x layer counts): the best by the same order as ``min_recompute``.
    For tests (small k)."""
    best = None
    for r in model.layer_counts:
        for picks in itertools.product(model.choices(), repeat=len(model.names)):
            if r == 0 and any(c != "recompute" for c in picks):
                continue
            plan = _plan(model.names, picks, r)
            p = model.predict(plan, batch)
            if p["peak_bytes"] > budget + 1e-6:
                continue
            key = (p["recomputed_flops"], p["offloaded_bytes"], p["peak_bytes"])
            if best is None or key < best[0]:
                best = (key, plan, p)
    return None if best is None else {"plan": best[1], "predicted": best[2]}
