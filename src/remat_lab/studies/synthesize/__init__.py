"""The policy synthesizer: the per-name save / offload / recompute plan that fits a budget, least recomputing.

Measure each name's costs with compiled probes (``synthesize_costs``), fit the additive model and
solve it exactly (``synthesize_solve``), then compile the best candidates and refine where the model
was wrong (for max-batch, descending from the best compiled plan to lighter ones where the
additive model misprices offload): the answer is always a compiled program's figures. The named
policies are sized by the same compiles (the Advisor's ``size_policies``); if no plan beats the
best of them, that policy is the answer, said so. The document is ``synthesize --json``'s, kind
``"synthesis"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from remat_lab.config import ConfigError, RunConfig
from remat_lab.model.policies import POLICIES, get_policy
from remat_lab.program.backend import ExecutionError, out_of_memory
from remat_lab.program.footprint import fit
from remat_lab.studies.advisor import advice_budget
from remat_lab.studies.advisor.batch_search import largest_batch
from remat_lab.studies.advisor.search import MAX_BATCH, batch_unit, probe, probed_flops
from remat_lab.studies.advisor.sizing import model_flops_at
from remat_lab.studies.synthesize.costs import (
    Meter,
    Stopped,
    choice_names,
    host_memory,
    measure,
    plan_config,
    planned_compiles,
)
from remat_lab.studies.synthesize.doc import document
from remat_lab.studies.synthesize.named import named_rows
from remat_lab.studies.synthesize.refine import descend, objective, refine, refine_note, start_from
from remat_lab.studies.synthesize.solve import Model, Plan, min_recompute, solve
from remat_lab.studies.synthesize.text import custom_flags

GOALS = ("max-batch", "min-recompute")
ROUNDS = 2  # solve, compile; once more with the budget moved by the model's error
TOP = 3  # candidates compiled per round
REFINE = 2  # compiles kept for the refinement beyond one per name (when a named policy is a plan)
SEARCH = 5  # a candidate's batch search: a bracket and the batch it predicts, and no_remat's flops


def named_policies(config: RunConfig) -> list[str]:
    """JAX's named policies, and MaxText's recipes where the model has their names."""
    groups = ("jax", "maxtext") if config.model in ("transformer", "llm") else ("jax",)
    return [p for p, spec in POLICIES.items() if spec.group in groups]


class OverCap(Exception):
    """A candidate's batch search would pass the compiles allowed it: the candidate is dropped."""


class _Run:
    """One synthesis: the meter, the no_remat flops by batch, the compiled candidates."""

    def __init__(self, base: RunConfig, budget: int, meter: Meter, max_batch: int):
        self.base, self.budget, self.meter, self.max_batch = base, budget, meter, max_batch
        self.unit = batch_unit(base)
        self.candidates: list[dict] = []
        self.notes: list[str] = []
        self.compiled: set[Plan] = set()
        self.flops: dict[int, float | None] = {}  # no_remat's, by per-device batch
        self.cap = 1 << 30  # a batch search stops at this many of the meter's own compiles

    def model_flops(self, b: int) -> float | None:
        """no_remat's flops at per-device batch ``b`` as it wrote them (XLA's pass left out)."""
        if b not in self.flops:
            self.flops[b] = self.meter.plan(Plan((), (), 0), b)["written_flops"]
        return self.flops[b]

    def prefill(self, batches: set[int]) -> int:
        """No_remat's flops at these per-device batches: compiled, or read on the line through its
        compiled counts where they lie on one (the Advisor's ``model_flops_at``). Returns the
        compiles it took (each new probe, and its recompile where XLA's own pass rewrote it)."""
        before = set(probed_flops(self.base))
        try:
            found, _ = model_flops_at(self.base, {b * self.unit for b in batches if b > 0})
        except ExecutionError as err:  # one of them over a TPU's HBM as written: each read alone
            if not out_of_memory(err):  # libtpu's refusal over the HBM
                raise
            found = {}
        self.flops.update({k // self.unit: v for k, v in found.items()})
        new = [b for b in probed_flops(self.base) if b not in before]
        return len(new) + sum(bool((probe(self.base.replace(batch=b)).get("xla_remat") or {}).get("applied"))
                              for b in new)

    def recomputed(self, flops: float | None, b: int) -> float | None:
        base = self.model_flops(b)
        return None if flops is None or base is None else max(flops - base, 0.0)

    def probe(self, cfg: RunConfig) -> dict:
        if self.meter.should_stop():
            raise Stopped("candidate")
        if self.meter.own() >= self.cap:
            raise OverCap(self.cap)
        found = probe(cfg)
        self.meter.compiles += not found["cached"]
        return found

    def compile_max(self, plan: Plan, model: Model, predicted_b: int, source: str = "solve",
                    partial: bool = False) -> dict:
        """``plan``'s exact largest batch (``largest_batch``, from the model's prediction);
        ``partial``: a search the compile cap stops (``OverCap``) answers the largest batch it
        compiled to fit, ``max_batch_exact`` False (else OverCap is raised)."""
        cfg = plan_config(self.base, plan, 1)
        seen: dict[int, int] = {}

        def measure(c: RunConfig) -> dict:
            found = self.probe(c)
            seen[c.batch] = found["peak_bytes"]
            return found

        try:
            found = largest_batch(cfg, self.budget, guess=max(predicted_b, 1) * self.unit,
                                  max_batch=self.max_batch, measure=measure,
                                  progress=lambda m: self.meter.say(f"candidate {m}"))
            found["max_batch_exact"] = True
        except OverCap:
            fit = max((k for k, v in seen.items() if v <= self.budget), default=0)
            if not partial or not fit:
                raise
            found = {"max_batch": fit, "per_device_batch": fit // self.unit * self.base.microbatches,
                     "probes": [{"batch": k, "per_device_batch": k // self.unit * self.base.microbatches,
                                 "peak_bytes": v, "fits": v <= self.budget} for k, v in sorted(seen.items())],
                     "max_batch_exact": False}
        b = found["max_batch"] // self.unit
        at = b or max(predicted_b, 1)
        figures = self.meter.plan(plan, at, written=False)
        row = self._row(plan, model, at, figures)
        row.update(max_batch=found["max_batch"], per_device_batch=found["per_device_batch"],
                   predicted_max_batch=predicted_b * self.unit, fits=b > 0, probes=found["probes"],
                   source=source, max_batch_exact=found["max_batch_exact"])
        return row

    def compile_at(self, plan: Plan, model: Model, b: int, source: str = "solve") -> dict:
        """``plan`` compiled at per-device batch ``b``: does it fit, what does it recompute."""
        row = self._row(plan, model, b, self.meter.plan(plan, b, written=False))
        row.update(max_batch=b * self.unit, per_device_batch=b * self.base.microbatches,
                   fits=row["peak_bytes"] <= self.budget, source=source, max_batch_exact=False)
        return row

    def _row(self, plan: Plan, model: Model, b: int, figures: dict) -> dict:
        predicted = model.predict(plan, b)
        error = figures["peak_bytes"] - predicted["peak_bytes"]
        self.compiled.add(plan)
        row = {"plan": plan.as_dict(model.names), "batch": b * self.unit,
               "predicted_peak_bytes": int(predicted["peak_bytes"]), "peak_bytes": figures["peak_bytes"],
               "error_bytes": int(error), "error_share": error / figures["peak_bytes"],
               "predicted_recomputed_flops": predicted["recomputed_flops"],
               "flops": figures["flops"], "recomputed_flops": self.recomputed(figures["flops"], b),
               "offloaded_bytes": figures["host_bytes"], "xla_remat": figures["xla_remat"],
               "custom": custom_flags(plan, self.base.depth)}
        self.candidates.append(row)
        return row


def _search(run: _Run, model: Model, goal: str, b: int | None, named_b: int = 0,
            cap: int = 1 << 30, limit: int = 1 << 30) -> None:
    """Solve, compile the best candidates, move the budget by the model's error, again; for
    max-batch, then the fewest recomputed flops at the largest batch anything compiled fits
    (``named_b``: the best named policy's, per device). A candidate is started only while the
    meter's own compiles leave room under ``cap`` for it (``SEARCH``; a compile at the batch: two,
    no_remat's flops there included); the solver's first candidate under ``limit``."""
    def room(need: int) -> bool:
        run.cap = cap if run.candidates else limit
        return run.meter.own() + need <= run.cap

    try:
        _rounds(run, model, goal, b, named_b, room)
    except OverCap:
        where = (f"the compile limit ({limit})" if run.cap >= limit else
                 f"{run.cap} of the limit {limit}, k + 2 kept for the refinement")
        run.notes.append(f"a candidate's batch search was stopped at {where}: it is left out")
    run.cap = 1 << 30


def _rounds(run: _Run, model: Model, goal: str, b: int | None, named_b: int, room) -> None:
    budget = float(run.budget)
    for _ in range(ROUNDS):
        solved = solve(model, budget, goal, b, top=TOP)
        fresh = [c for c in solved["candidates"] if c["plan"] not in run.compiled]
        rows = []
        for c in fresh:
            if not room(SEARCH if goal == "max-batch" else 2):
                break
            rows.append(run.compile_max(c["plan"], model, solved["batch"]) if goal == "max-batch"
                        else run.compile_at(c["plan"], model, b))
        if not rows:
            if fresh and not run.candidates:
                run.notes.append("no compiles left for the solver's candidates within the limit: the "
                                 "answer comes from the named policies and the refinement")
            break
        errors = [r["error_bytes"] for r in rows]
        if goal == "max-batch":
            if max(r["max_batch"] for r in rows) >= solved["batch"] * run.unit:
                break  # the model's batch is reached: no plan is predicted to fit more
        elif any(r["fits"] for r in rows):
            break
        budget -= max(errors) if max(errors) > 0 else min(errors)
    if goal != "max-batch":
        return
    top_b = max([c["max_batch"] // run.unit for c in run.candidates if c.get("fits")] + [named_b])
    if top_b <= 0:
        return
    errors = sorted(c["error_bytes"] for c in run.candidates)
    if errors:  # the model's typical error on what was compiled: its budget moved by it
        budget = run.budget - errors[len(errors) // 2]
    for c in min_recompute(model, budget, top_b, TOP):
        if c["plan"] not in run.compiled and room(SEARCH):
            run.compile_max(c["plan"], model, top_b)


def synthesize(config: RunConfig, budget: str | int | None = None, *, goal: str = "max-batch",
               batch: int | None = None, max_batch: int = MAX_BATCH,
               policies: Sequence[str] | None = None, progress: Callable[[str], None] | None = None,
               should_stop: Callable[[], bool] | None = None, workers: int = 2) -> dict:
    """The synthesis document (module docstring). ``config`` gives the model (its batch and policy
    are ignored); ``budget`` as the Advisor's (default: the device's or target's usable memory);
    ``goal`` max-batch, or min-recompute at the global ``batch``; ``policies``: the named policies
    to beat (default ``named_policies``); ``should_stop``: asked before every compile."""
    t0 = time.perf_counter()
    if goal not in GOALS:
        raise ConfigError(f"unknown goal {str(goal)[:40]!r}; choose one of: {', '.join(GOALS)}.")
    budget_bytes, budget_source = advice_budget(budget, target=config.target)
    base = config.replace(policy="no_remat", batch=batch_unit(config), remat_layers=0, repeats=1,
                          warmup=0)
    unit = batch_unit(base)
    b = None
    if goal == "min-recompute":
        if not batch or batch % unit:
            raise ConfigError(f"goal min-recompute needs --batch, a multiple of {unit} (data x fsdp "
                              "x microbatches: one example per device and microbatch).")
        b = batch // unit
    names = choice_names(base)
    offload, offload_why = host_memory(base)
    partial = base.depth > 1
    chosen = list(policies) if policies else named_policies(base)
    for p in chosen:
        get_policy(p)
    k = len(names)
    meter = Meter(base, progress, should_stop, planned=planned_compiles(k, offload) + 6)
    run = _Run(base, budget_bytes, meter, max_batch)
    notes = [offload_why]
    static = fit(base, budget_bytes)
    model = probes = record = descent = None
    stopped = None
    limit = 3 * k + 12
    named, named_compiles = [], 0
    try:
        if not static["fits"]:
            notes.append("the parameters, gradients and optimizer state alone exceed the budget: "
                         "no plan fits at any batch")
        else:
            if names:
                model, probes = measure(meter, names, offload, partial, budget_bytes, b)
            else:
                notes.append("the model has no checkpoint names: the space has no per-name choice, "
                             "so the answer is the best named policy")
            named, named_compiles = named_rows(run, chosen, goal, b, workers)
            if model is not None:
                named_b = max((r["max_batch"] // unit for r in named if r["fits"]), default=0)
                row, start, why = start_from(named, names, base.depth, goal)
                _search(run, model, goal, b, named_b, limit - (REFINE + k if start else 0), limit)
                notes += run.notes
                if why:
                    notes.append(why)
                if start is not None:
                    record = _refine(run, model, row, start, goal, limit)
                    notes.append(refine_note(record))
                if goal == "max-batch":
                    descent = _descend(run, model, named, limit)
                    if descent and descent["rounds"]:
                        notes.append(descend_note(descent))
    except Stopped as err:
        stopped = f"stopped before compiling {err}"
    doc = document(run, base, config, model, probes, named, goal, b, budget_bytes, budget_source,
                   offload, notes, static, chosen, named_policies(base))
    if meter.forced:
        notes.append(f"XLA's own rematerialization pass rewrote {meter.forced} of the probes; each was "
                     "compiled again with its limit lifted to read the program as the policy wrote it "
                     f"({meter.forced} more compiles, outside the 3k + 12 = {limit} count)")
    if record and record.get("search_compiles"):
        n = record["search_compiles"]
        notes.append(f"the refined plan's exact largest batch was searched with {n} "
                     f"compile{'s' * (n != 1)} of its own, outside the 3k + 12 = {limit}"
                     + (f" ({record['search_stopped']})" if record.get("search_stopped") else ""))
    if goal == "max-batch" and doc["answer"] and not doc["max_batch_exact"]:
        notes.append(f"the answer's batch {doc['max_batch']} is a compiled fit, not the plan's exact "
                     "largest batch: " + ((record or {}).get("search_stopped")
                                          or (descent or {}).get("stopped")
                                          or "the compile limit left no search for it"))
    doc.update(compiles=meter.compiles, xla_forced_compiles=meter.forced,
               answer_search_compiles=meter.answer,
               within_limit=meter.own() <= limit, refine=record, descend=descent,
               named_compiles=named_compiles,
               compile_limit=limit, wall_s=time.perf_counter() - t0,
               stopped_because=stopped or (record or {}).get("stopped") or (descent or {}).get("stopped"))
    return doc


def _refine(run: _Run, model: Model, row: dict, start: Plan, goal: str, limit: int) -> dict:
    """The refinement from the named ``row`` (``synthesize_refine.refine``) at its per-device batch;
    for max-batch, when it beat the named policy, its plan's exact largest batch searched from
    there (``_own_batch``): the answer's batch is its own."""
    b = row["max_batch"] // run.unit
    record = refine(run, model, row, start, b, goal, limit)
    record.update(searched_max_batch=None, search_compiles=0, search_stopped=None)
    user_stop = (record["stopped"] or "").startswith("stopped before")
    if goal == "max-batch" and record["outcome"] == "beats" and not user_stop:
        p = record["plan"]
        record["searched_max_batch"], record["search_compiles"], record["search_stopped"] = _own_batch(
            run, model, Plan(tuple(p["save"]), tuple(p["offload"]), p["remat_layers"]), b, "refine")
    return record


def _own_batch(run: _Run, model: Model, plan: Plan, b: int,
               source: str) -> tuple[int | None, int, str | None]:
    """``plan``'s exact largest batch, searched from per-device batch ``b`` (where it was compiled
    to fit) with up to ``SEARCH`` compiles of its own beyond the limit (``Meter.answer``, outside
    ``own()``): ``(max_batch, compiles, stopped)``. A search those compiles do not finish answers
    the largest batch it compiled to fit, said in ``stopped``; ``max_batch`` None: not searched (a
    stop), the plan fits at least ``b``."""
    before = run.meter.compiles, run.meter.forced
    run.cap = run.meter.own() + SEARCH - 1  # its probes; one left for no_remat's flops
    got, stopped = None, None
    try:
        found = run.compile_max(plan, model, b, source=source, partial=True)
        got = found["max_batch"]
        if not found["max_batch_exact"]:
            stopped = f"its batch search stopped at its {SEARCH} compiles: the plan fits at least {got}"
    except Stopped as err:
        stopped = f"stopped before compiling {err}"
    except OverCap:
        stopped = f"its batch search stopped at its {SEARCH} compiles with no batch above {b * run.unit}"
    run.cap = 1 << 30
    spent = run.meter.compiles - before[0] - (run.meter.forced - before[1])
    run.meter.answer += spent
    return got, spent, stopped


def _descend(run: _Run, model: Model, named: list[dict], limit: int) -> dict | None:
    """For max-batch, up to ``ROUNDS`` times: the best compiled plan's lighter moves compiled one
    over the best batch anything fits (``synthesize_refine.descend``), and the first that fits gets
    its own largest batch searched (``_own_batch``). The record the document keeps as ``descend``:
    ``rounds`` (each ``from``, ``batch``, ``steps``, ``plan``, ``searched_max_batch``), ``compiles``,
    ``search_compiles``, ``stopped``; None when nothing compiled fits."""
    record = {"rounds": [], "compiles": 0, "search_compiles": 0, "stopped": None}
    first = run.meter.own()
    for _ in range(ROUNDS):
        fits = [c for c in run.candidates if c.get("fits")]
        if not fits:
            return None
        best = min(fits, key=lambda r: objective(r, "max-batch"))
        top = max([best["max_batch"]] + [r["max_batch"] for r in named if r["fits"]]) // run.unit
        row, steps, stopped = descend(run, model, best, top + 1, limit)
        at = {"from": best["plan"], "batch": (top + 1) * run.unit, "steps": steps,
              "plan": row["plan"] if row else None, "searched_max_batch": None}
        record["rounds"].append(at)
        if row is None:
            record["stopped"] = stopped
            break
        p = row["plan"]
        at["searched_max_batch"], spent, record["stopped"] = _own_batch(
            run, model, Plan(tuple(p["save"]), tuple(p["offload"]), p["remat_layers"]), top + 1, "descend")
        record["search_compiles"] += spent
        if record["stopped"]:
            break
    record["compiles"] = run.meter.own() - first
    return record


def descend_note(record: dict) -> str:
    """The descent's outcome in one sentence."""
    said = []
    for r in record["rounds"]:
        tried = f"{len(r['steps'])} lighter plan{'s' * (len(r['steps']) != 1)} compiled at {r['batch']}"
        if r["plan"] is None:
            said.append(f"{tried}: none fits")
        else:
            what = ", ".join(f"{k} {'/'.join(r['plan'][k])}" for k in ("save", "offload", "recompute")
                             if r["plan"][k]) or "every name recomputed"
            said.append(f"{tried}: {what} fits, its largest batch "
                        f"{r['searched_max_batch'] or r['batch']}")
    return ("descended from the best compiled plan (the model prices offloaded names at no device "
            "bytes but the least one saves alone, so plans keeping less can fit more): " + "; ".join(said)
            + (f" ({record['stopped']})" if record["stopped"] else ""))
