"""The synthesizer's refinement: a local search from the best named policy, as a per-name plan, compiled.

MaxText's recipes, JAX's ``nothing_saveable`` and ``nnx.remat``'s default are per-name plans (save
these names, offload those, recompute the rest, every layer remat'd; no_remat: no layer remat'd);
JAX's ``dots_*`` and ``everything_saveable`` decide per primitive or save unnamed values, so they are
not, and the refinement starts from the best named policy that is one (among those at the best named
batch). At the per-device batch where that policy fits, each move turns one recomputed name into
saved or offloaded, an offloaded one into saved, or remats one layer fewer. The fitted model,
anchored at the last compiled plan's peak (a move's predicted peak is that compiled peak plus the
model's difference between the two plans), keeps the moves it predicts fit and that spare flops
(or offload traffic), best first; the best is compiled at that batch and kept when its compiled
program fits with a better objective (fewer recomputed flops, then fewer offloaded bytes), the
search going on from it. A move that keeps, name by name, at least what a plan that did not fit
keeps is not compiled (keeping more does not lower the peak). So the answer is never worse than the
named policy: its batch, and no more recomputed flops, each figure a compiled program's.
"""

from __future__ import annotations

from remat_lab.model.policies import get_policy
from remat_lab.studies.synthesize.costs import Stopped
from remat_lab.studies.synthesize.solve import Model, Plan

RANK = {"recompute": 0, "offload": 1, "save": 2}  # what a name keeps on the device, least first


def objective(row: dict, goal: str) -> tuple:
    """A compiled row's objective, smaller is better (no fit is worst). Recomputation is ranked by
    the program's own flops: at the same batch they differ from the recomputed flops (the program's
    less no_remat's there) by the same no_remat, so the order is the same and needs no no_remat
    (which a TPU refuses to compile over its HBM); across batches the batch decides first."""
    if not row.get("fits", True) or not row.get("max_batch", 1):
        return (1, 0, 0, 0, 0)
    flops = row.get("flops", row.get("recomputed_flops"))
    flops = float("inf") if flops is None else flops
    batch = -row["max_batch"] if goal == "max-batch" else 0
    return (0, batch, flops, row.get("offloaded_bytes") or 0.0, row.get("peak_bytes") or 0,
            not row.get("max_batch_exact", True))  # a tie: the row whose batch was searched


def named_plan(policy: str, names: tuple[str, ...], depth: int) -> Plan | None:
    """``policy`` as a per-name plan over ``names`` (the model's), or None when it decides by
    something else than checkpoint names (JAX's dots_* and everything_saveable)."""
    spec = get_policy(policy)
    if not spec.remat:
        return Plan((), (), 0)
    if spec.group != "maxtext" and policy not in ("nothing_saveable", "nnx_remat_default"):
        return None
    return Plan(tuple(n for n in names if n in spec.saves),
                tuple(n for n in names if n in spec.offloads and n not in spec.saves), depth)


def choice(plan: Plan, name: str) -> str:
    return "save" if name in plan.save else "offload" if name in plan.offload else "recompute"


def _with(plan: Plan, names: tuple[str, ...], name: str, to: str) -> Plan:
    picks = {n: choice(plan, n) for n in names} | {name: to}
    return Plan(tuple(n for n in names if picks[n] == "save"),
                tuple(n for n in names if picks[n] == "offload"), plan.remat_layers)


def moves(plan: Plan, model: Model) -> list[Plan]:
    """Every plan one move from ``plan``: a recomputed name saved (or offloaded, where the target
    has host memory), an offloaded one saved, one layer fewer remat'd (at least one left)."""
    out = []
    for n in model.names:
        now = choice(plan, n)
        for to in model.choices():
            if RANK[to] > RANK[now]:
                out.append(_with(plan, model.names, n, to))
    if plan.remat_layers > 1 and plan.remat_layers - 1 in model.layer_counts:
        out.append(Plan(plan.save, plan.offload, plan.remat_layers - 1))
    return out


def lighter(plan: Plan, model: Model) -> list[Plan]:
    """Every plan one move from ``plan`` that keeps less on the device: a saved name offloaded
    (where the target has host memory) or recomputed, an offloaded one recomputed, one layer more
    remat'd."""
    out = []
    for n in model.names:
        now = choice(plan, n)
        for to in model.choices():
            if RANK[to] < RANK[now]:
                out.append(_with(plan, model.names, n, to))
    if plan.remat_layers + 1 in model.layer_counts:
        out.append(Plan(plan.save, plan.offload, plan.remat_layers + 1))
    return out


def keeps_at_least(a: Plan, b: Plan, names: tuple[str, ...]) -> bool:
    """``a`` keeps on the device at least what ``b`` keeps: no more layers remat'd, every name's
    choice at least ``b``'s (recompute < offload < save)."""
    return a.remat_layers <= b.remat_layers and all(RANK[choice(a, n)] >= RANK[choice(b, n)] for n in names)


def start_from(named: list[dict], names: tuple[str, ...], depth: int,
               goal: str) -> tuple[dict | None, Plan | None, str]:
    """``(row, plan, why)``: the best fitting named policy that is a per-name plan, among those as
    good in batch as the best named one (max-batch; min-recompute: all at the goal's batch)."""
    fits = sorted((r for r in named if r["fits"]), key=lambda r: objective(r, goal))
    if not fits:
        return None, None, "no named policy fits: nothing to refine from"
    if not names:
        return None, None, "the model has no checkpoint names: no plan to refine"
    top = fits[0]["max_batch"]
    for r in fits:
        if goal == "max-batch" and r["max_batch"] < top:
            break
        plan = named_plan(r["policy"], names, depth)
        if plan is not None:
            why = "" if r is fits[0] else (f"the best named policy, {fits[0]['policy']}, decides per "
                                           f"primitive, not per name: refined from {r['policy']}, "
                                           "the best one that is a per-name plan")
            return r, plan, why
    return None, None, (f"the best named policy, {fits[0]['policy']}, decides per primitive, not per "
                        "name, and no per-name named policy fits its batch: nothing to refine from")


def _rows_at(run, b: int) -> tuple[dict[Plan, dict], list[Plan]]:
    """What the compiled candidates say at per-device batch ``b``: rows compiled at it, by plan,
    and the plans known not to fit it (a search's largest batch below it, or no fit at or below)."""
    at, over, want = {}, [], b * run.unit
    for row in run.candidates:
        p = row["plan"]
        plan = Plan(tuple(p["save"]), tuple(p["offload"]), p["remat_layers"])
        if row["batch"] == want:
            at[plan] = row
        if (row["max_batch"] < want) if "probes" in row else (not row["fits"] and row["batch"] <= want):
            over.append(plan)
    return at, over


def refine(run, model: Model, named_row: dict, start: Plan, b: int, goal: str, limit: int) -> dict:
    """The local search (module docstring) from ``start`` (``named_row``'s policy) at per-device
    batch ``b``, compiling while ``run.meter.own()`` is under ``limit``. ``run``: the synthesis's
    ``_Run`` (``compile_at``, ``candidates``, ``meter``, ``unit``, ``budget``). Returns the record
    the document keeps as ``refine``: ``from``, ``start``, ``plan``, ``per_device_batch``,
    ``outcome`` (``beats`` or ``equals``), ``steps`` (each move compiled or read), ``compiles``,
    ``stopped``."""
    names = model.names
    current, best = start, {**named_row, "fits": True}
    first = run.meter.own()
    steps, tried, stopped = [], {start}, None
    known, over = _rows_at(run, b)
    while True:
        mine = model.predict(current, b)
        ranked = []
        for q in moves(current, model):
            if q in tried or any(keeps_at_least(q, o, names) for o in over):
                continue
            got = model.predict(q, b)
            peak = best["peak_bytes"] + got["peak_bytes"] - mine["peak_bytes"]
            spared = mine["recomputed_flops"] - got["recomputed_flops"]
            host = got["offloaded_bytes"] - mine["offloaded_bytes"]
            if peak <= run.budget and (spared > 0 or host < 0):
                ranked.append(((-spared, host, peak), q, peak))
        if not ranked:
            break
        _, q, predicted = min(ranked, key=lambda t: t[0])
        tried.add(q)
        row = known.get(q)
        if row is None:
            if run.meter.own() >= limit:
                stopped = f"the compile limit ({limit}) reached"
                break
            try:
                row = run.compile_at(q, model, b, source="refine")
            except Stopped as err:
                stopped = f"stopped before compiling {err}"
                break
        kept = bool(row["fits"]) and objective(row, goal) < objective(best, goal)
        steps.append({"plan": q.as_dict(names), "anchored_peak_bytes": int(predicted),
                      "peak_bytes": row["peak_bytes"], "fits": bool(row["fits"]),
                      "recomputed_flops": row["recomputed_flops"], "kept": kept})
        if kept:
            current, best = q, row
        elif not row["fits"]:
            over.append(q)
    return {"from": named_row["policy"], "start": start.as_dict(names), "plan": current.as_dict(names),
            "per_device_batch": b, "max_batch": b * run.unit,
            "outcome": "beats" if current != start else "equals",
            "recomputed_flops": best.get("recomputed_flops"),
            "named_recomputed_flops": named_row.get("recomputed_flops"),
            "flops": best.get("flops"), "named_flops": named_row.get("flops"),
            "offloaded_bytes": best.get("offloaded_bytes"),
            "named_offloaded_bytes": named_row.get("offloaded_bytes"),
            "steps": steps, "compiles": run.meter.own() - first, "stopped": stopped}


def refine_note(record: dict) -> str:
    """The refinement's outcome in one sentence."""
    moved = sum(s["kept"] for s in record["steps"])
    head = (f"refined from {record['from']} at {record['per_device_batch']} per device: "
            f"{len(record['steps'])} moves compiled or read, {moved} kept")
    if record["outcome"] == "equals":
        return (head + f"; no move fitted with a better objective, so the answer only equals "
                f"{record['from']}" + (f" ({record['stopped']})" if record["stopped"] else ""))
    ours, theirs = record["recomputed_flops"], record["named_recomputed_flops"]
    mine, named = record.get("flops"), record.get("named_flops")
    if theirs and ours is not None and ours < theirs:
        share = f" with {1 - ours / theirs:.1%} fewer recomputed flops"
    elif (ours is None or theirs is None) and mine is not None and named is not None and mine < named:
        share = (f" with {(named - mine) / 1e9:.4g} GFLOP fewer per step (no_remat has no flop count "
                 "at this batch: recomputation measured against the named policy)")
    elif ours is not None and ours == theirs:  # the objective's next terms decided it
        saved = (record.get("named_offloaded_bytes") or 0) - (record.get("offloaded_bytes") or 0)
        share = (f" with the same recomputed flops and {saved / 2**30:.2f} GiB less offloaded per step"
                 if saved > 0 else " with the same recomputed flops and offload, and a lower peak")
    else:
        share = ""
    return head + f"; the plan beats {record['from']} at its batch{share}"


def descend(run, model: Model, best: dict, b: int, limit: int) -> tuple[dict | None, list[dict], str | None]:
    """For max-batch, from the best compiled plan (``best``, a candidate row) at per-device batch
    ``b`` (one over the best batch anything compiled fits): each lighter plan (``lighter``) compiled
    at ``b``, the fewest recomputed flops (by the model) first, until one fits; ``(row, steps,
    stopped)``, row None when none did. The additive model cannot rank these by memory: it prices
    an offloaded name at no device bytes, while a compiled program keeps its staging buffers, so an
    offload beside another can cost more than recomputing it (the 3-name SwiGLU block on the H100:
    gate and up offloaded fit 60, gate alone 70). Moves known not to fit at ``b`` (a compiled
    plan keeping at least as much) are skipped; compiles stop at ``limit`` (``run.meter.own()``)."""
    start = Plan(tuple(best["plan"]["save"]), tuple(best["plan"]["offload"]), best["plan"]["remat_layers"])
    known, over = _rows_at(run, b)
    ranked = sorted(lighter(start, model), key=lambda q: (model.predict(q, b)["recomputed_flops"],
                                                          model.predict(q, b)["peak_bytes"]))
    steps = []
    for q in ranked:
        if any(keeps_at_least(q, o, model.names) for o in over):
            continue
        row = known.get(q)
        if row is None:
            if run.meter.own() >= limit:
                return None, steps, f"the compile limit ({limit}) reached"
            try:
                row = run.compile_at(q, model, b, source="descend")
            except Stopped as err:
                return None, steps, f"stopped before compiling {err}"
        steps.append({"plan": q.as_dict(model.names), "batch": b * run.unit,
                      "peak_bytes": row["peak_bytes"], "fits": bool(row["fits"]),
                      "recomputed_flops": row["recomputed_flops"]})
        if row["fits"]:
            return row, steps, None
        over.append(q)
    return None, steps, None
