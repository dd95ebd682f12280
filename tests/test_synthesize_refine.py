"""The refinement from the best named policy: named policies as plans, and the local search on synthetic
compiles (no XLA: a compile is the additive model plus an interaction the model does not know)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from remat_lab.studies.synthesize.refine import (
    descend,
    keeps_at_least,
    moves,
    named_plan,
    objective,
    refine,
    refine_note,
    start_from,
)
from remat_lab.studies.synthesize.solve import Model, Plan

LLM_NAMES = ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")


def test_named_policies_as_per_name_plans():
    assert named_plan("qkv_proj_offloaded", LLM_NAMES, 32) == Plan(
        (), ("query_proj", "key_proj", "value_proj"), 32)
    assert named_plan("save_qkv_proj", LLM_NAMES, 32) == Plan(
        ("query_proj", "key_proj", "value_proj"), (), 32)  # qkv_proj: a fused name the model lacks
    assert named_plan("minimal", LLM_NAMES, 32).save == tuple(n for n in LLM_NAMES if n != "context")
    for p in ("nothing_saveable", "nnx_remat_default", "full"):
        assert named_plan(p, LLM_NAMES, 32) == Plan((), (), 32)
    assert named_plan("no_remat", LLM_NAMES, 32) == Plan((), (), 0)
    for p in ("dots_saveable", "dots_with_no_batch_dims_saveable", "offload_dot_with_no_batch_dims",
              "everything_saveable"):
        assert named_plan(p, LLM_NAMES, 32) is None  # per primitive, not per name


def _row(policy: str, batch: int, flops: float, fits: bool = True) -> dict:
    return {"policy": policy, "max_batch": batch, "per_device_batch": batch, "peak_bytes": 100,
            "recomputed_flops": flops, "offloaded_bytes": 0.0, "fits": fits}


def test_the_start_is_the_best_named_policy_that_is_a_plan():
    named = [_row("dots_saveable", 4, 1.0), _row("save_qkv_proj", 4, 5.0), _row("full", 4, 9.0),
             _row("save_out_proj", 3, 0.0)]
    row, plan, why = start_from(named, LLM_NAMES, 2, "max-batch")
    assert row["policy"] == "save_qkv_proj" and "dots_saveable" in why  # the best is not a plan: said
    assert plan.save == ("query_proj", "key_proj", "value_proj")
    row, plan, why = start_from(named[:1] + named[3:], LLM_NAMES, 2, "max-batch")
    assert row is None and plan is None and "dots_saveable" in why  # none at its batch
    assert start_from(named, (), 2, "max-batch")[1] is None  # no names: nothing to refine


def _model(seed: int, k: int = 5, offload: bool = True) -> Model:
    rng = random.Random(seed)
    names = tuple(f"n{i}" for i in range(k))
    sizes, flops, host = {}, {}, {}
    for n in names:
        b, f = rng.randint(1, 40) * 1000.0, rng.randint(1, 90) * 1e6
        sizes[(n, "save")], flops[(n, "save")], host[(n, "save")] = b, f, 0.0
        sizes[(n, "offload")], flops[(n, "offload")], host[(n, "offload")] = rng.randint(0, 3) * 100.0, f, b
    return Model(names=names, layers=4, layer_counts=tuple(range(5)), intercept_full=2e6, slope_full=3e5,
                 intercept_base=2e6, slope_base=5e4, recompute=sum(f for (_, c), f in flops.items()
                                                                   if c == "save") + 5e7,
                 bytes=sizes, flops=flops, host=host, offload=offload)


class _Meter:
    def __init__(self):
        self.compiled = 0

    def own(self) -> int:
        return self.compiled


class _Run:
    """Compiles by the model plus ``extra`` bytes per example for each name kept beyond the first
    two (an interaction the additive model misses): what ``refine`` reads of a synthesis's run."""

    def __init__(self, model: Model, budget: float, extra: float):
        self.model, self.budget, self.extra, self.unit = model, budget, extra, 1
        self.candidates, self.meter, self.at = [], _Meter(), []

    def compile_at(self, plan: Plan, model: Model, b: int, source: str = "solve") -> dict:
        self.meter.compiled += 1
        self.at.append(plan)
        got = model.predict(plan, b)
        kept = len(plan.save) + len(plan.offload)
        peak = got["peak_bytes"] + self.extra * b * max(kept - 2, 0)
        row = {"plan": plan.as_dict(model.names), "batch": b, "max_batch": b, "peak_bytes": int(peak),
               "recomputed_flops": got["recomputed_flops"], "offloaded_bytes": got["offloaded_bytes"],
               "fits": peak <= self.budget, "source": source}
        self.candidates.append(row)
        return row


def _named(model: Model, plan: Plan, b: int, policy: str = "x") -> dict:
    got = model.predict(plan, b)
    return {"policy": policy, "max_batch": b, "per_device_batch": b, "peak_bytes": got["peak_bytes"],
            "recomputed_flops": got["recomputed_flops"], "offloaded_bytes": got["offloaded_bytes"],
            "fits": True}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("extra", [0.0, 4e4])
def test_never_worse_than_the_start_and_within_the_limit(seed, extra):
    model = _model(seed)
    b, start = 6, Plan((), (), 4)
    start_peak = model.predict(start, b)["peak_bytes"]
    budget = start_peak + random.Random(seed).uniform(0.05, 0.5) * b * 1e5
    run = _Run(model, budget, extra)
    limit = 7
    named = _named(model, start, b)
    rec = refine(run, model, named, start, b, "max-batch", limit)
    assert run.meter.own() <= limit and rec["compiles"] == run.meter.own()
    final = Plan(tuple(rec["plan"]["save"]), tuple(rec["plan"]["offload"]), rec["plan"]["remat_layers"])
    assert keeps_at_least(final, start, model.names)
    if rec["outcome"] == "equals":
        assert final == start and not any(s["kept"] for s in rec["steps"])
        return
    row = next(c for c in run.candidates if c["plan"] == rec["plan"])
    assert row["fits"] and objective(row, "max-batch") < objective({**named}, "max-batch")
    # each kept move compiled to fit and improved on the one before; a move keeping at least what a
    # plan that did not fit kept was never compiled
    kept = [s for s in rec["steps"] if s["kept"]]
    assert all(s["fits"] for s in kept)
    flops = [s["recomputed_flops"] for s in kept]
    assert flops == sorted(flops, reverse=True)
    failed = [p for p, c in zip(run.at, run.candidates, strict=True) if not c["fits"]]
    for i, p in enumerate(run.at):
        assert not any(keeps_at_least(p, f, model.names) for f in failed if run.at.index(f) < i)


def test_when_no_move_fits_the_answer_only_equals_the_named_policy():
    model = dataclasses.replace(_model(3, offload=False), layer_counts=(0, 4))  # moves: names only
    b, start = 6, Plan(("n0",), (), 4)
    run = _Run(model, model.predict(start, b)["peak_bytes"], 0.0)  # not a byte to spare
    # the model says nothing fits either: no compile at all
    rec = refine(run, model, _named(model, start, b), start, b, "max-batch", 10)
    assert rec["outcome"] == "equals" and rec["compiles"] == 0 and rec["plan"] == start.as_dict(model.names)
    # the model is optimistic (every move predicted to fit), the compiles say none does
    run = _Run(model, model.predict(start, b)["peak_bytes"] + 1e9, 1e12)
    start2 = Plan(("n0", "n1"), (), 4)
    run.budget = model.predict(start2, b)["peak_bytes"] + 1e6
    rec = refine(run, model, _named(model, start2, b), start2, b, "max-batch", 10)
    assert rec["outcome"] == "equals" and rec["steps"] and not any(s["fits"] for s in rec["steps"])


def test_moves_turn_one_name_up_or_remat_one_layer_fewer():
    model = _model(0, k=2)
    got = set(moves(Plan((), ("n1",), 3), model))
    assert got == {Plan(("n0",), ("n1",), 3), Plan((), ("n0", "n1"), 3), Plan(("n1",), (), 3),
                   Plan((), ("n1",), 2)}
    assert moves(Plan(("n0", "n1"), (), 1), model) == []  # everything kept, one layer: no move


def test_the_note_names_what_decided_a_tie_in_recomputed_flops():
    """A plan kept for less offload at equal recomputed flops is not said to recompute "0.0% fewer"."""
    record = {"from": "minimal_offloaded", "per_device_batch": 2, "outcome": "beats", "stopped": None,
              "steps": [{"kept": True}], "recomputed_flops": 1e14, "named_recomputed_flops": 1e14,
              "offloaded_bytes": 1 << 30, "named_offloaded_bytes": 3 << 30}
    note = refine_note(record)
    assert "same recomputed flops and 2.00 GiB less offloaded per step" in note and "0.0%" not in note
    fewer = refine_note({**record, "recomputed_flops": 0.75e14})
    assert "25.0% fewer recomputed flops" in fewer


@dataclasses.dataclass(frozen=True)
class _Cfg:
    """What ``largest_batch`` reads of a plan's configuration (``plan_config`` stubbed)."""

    plan: Plan
    batch: int = 1
    mesh: str = ""
    microbatches: int = 1
    policy: str = "custom"

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)


class _CountingMeter:
    """A synthesis's meter whose compiles are the model's figures (+ ``extra`` per kept name)."""

    def __init__(self, model: Model):
        self.model, self.compiles, self.forced, self.answer = model, 0, 0, 0

    def own(self) -> int:
        return self.compiles - self.forced - self.answer

    def should_stop(self) -> bool:
        return False

    def say(self, message: str) -> None:
        pass

    def plan(self, plan: Plan, b: int, written: bool = True) -> dict:
        self.compiles += 1
        got = self.model.predict(plan, b)
        flops = 1e9 * b + got["recomputed_flops"]
        return {"peak_bytes": int(got["peak_bytes"]), "flops": flops, "written_flops": flops,
                "host_bytes": got["offloaded_bytes"], "xla_remat": False}


@pytest.mark.parametrize("search", [5, 2])
def test_a_refined_answer_gets_its_own_largest_batch_at_the_compile_limit(monkeypatch, search):
    """Issue 45 (2): the refinement beat the named policy at its batch with the limit all but spent,
    and the answer stayed at the refinement's batch (the 3-name block: 62 where its plan fits 67).
    Now the plan's exact largest batch is searched with compiles of its own, outside the limit;
    a search those compiles cut short answers the largest batch it compiled to fit, and says so."""
    from remat_lab.config import RunConfig
    from remat_lab.studies import synthesize as synth

    model = _model(3, k=3)
    start = Plan((), (), 4)
    b = 6
    budget = model.predict(start, b)["peak_bytes"] + 12 * model.slope_base
    plain = lambda cfg: {"peak_bytes": int(model.predict(cfg.plan, cfg.batch)["peak_bytes"]),
                         "cached": False}
    monkeypatch.setattr(synth, "probe", plain)
    monkeypatch.setattr(synth, "plan_config", lambda base, plan, batch: _Cfg(plan, batch))
    monkeypatch.setattr(synth, "SEARCH", search)
    base = RunConfig(model="mlp", width=64, depth=4, batch=1)
    run = synth._Run(base, int(budget), _CountingMeter(model), 64)
    named = _named(model, start, b, "nothing_saveable")
    named["flops"] = 1e9 * b + named["recomputed_flops"]
    limit = 2  # the refinement's compiles leave no room for a search of SEARCH compiles
    rec = synth._refine(run, model, named, start, "max-batch", limit)
    assert rec["outcome"] == "beats" and run.meter.own() <= limit
    plan = Plan(tuple(rec["plan"]["save"]), tuple(rec["plan"]["offload"]), rec["plan"]["remat_layers"])
    truth = max(x for x in range(1, 65) if model.predict(plan, x)["peak_bytes"] <= int(budget))
    assert truth > b  # the plan fits more than the batch it was refined at
    assert rec["search_compiles"] > 0 and run.meter.answer == rec["search_compiles"]
    row = max((c for c in run.candidates if c["plan"] == rec["plan"] and c["fits"]),
              key=lambda c: c["max_batch"])
    assert rec["searched_max_batch"] == row["max_batch"]
    if search == 5:  # compiles enough: the exact answer, the batch after it refused
        assert row["max_batch"] == truth and row["max_batch_exact"] and rec["search_stopped"] is None
    else:  # cut short: a batch it compiled to fit, said
        assert b <= row["max_batch"] <= truth and not row["max_batch_exact"]
        assert "stopped at its 2 compiles" in rec["search_stopped"]


def _staged(model: Model, penalty: float):
    """The compiled peak of a plan: the model's, plus ``penalty`` bytes per example when two or more
    names are offloaded (staging the additive model prices at nothing: the 3-name SwiGLU block on
    the H100 fits 60 with gate and up offloaded, 70 with gate alone)."""
    return lambda plan, b: model.predict(plan, b)["peak_bytes"] + penalty * b * (len(plan.offload) >= 2)


def test_the_descent_compiles_lighter_plans_one_over_the_best_batch_until_one_fits():
    model = _model(1, k=3)
    truth = _staged(model, 6 * model.slope_base)
    heavy = Plan((), ("n0", "n1"), 4)
    b = 6
    run = _Run(model, truth(heavy, b) + 1, 0.0)
    run.compile_at = lambda plan, m, at, source="solve": _compiled(run, truth, plan, at, source)
    best = _compiled(run, truth, heavy, b, "solve")
    assert best["fits"] and truth(heavy, b + 1) > run.budget
    row, steps, stopped = descend(run, model, best, b + 1, limit=10)
    assert stopped is None and row is not None and row["fits"] and row["batch"] == b + 1
    assert {tuple(sorted(s["plan"]["offload"])) for s in steps} <= {("n0",), ("n1",)}
    # the fewest recomputed flops first (the model's), and nothing compiled after the first fit
    flops = [model.predict(Plan((), tuple(s["plan"]["offload"]), 4), b + 1)["recomputed_flops"]
             for s in steps]
    assert flops == sorted(flops) and [s["fits"] for s in steps] == [False] * (len(steps) - 1) + [True]
    # at the compile limit it stops, said
    run2 = _Run(model, run.budget, 0.0)
    run2.compile_at = lambda plan, m, at, source="solve": _compiled(run2, truth, plan, at, source)
    row, steps, stopped = descend(run2, model, best, b + 1, limit=0)
    assert row is None and steps == [] and "compile limit (0)" in stopped


def _compiled(run, truth, plan: Plan, b: int, source: str) -> dict:
    run.meter.compiled += 1
    got = run.model.predict(plan, b)
    peak = truth(plan, b)
    row = {"plan": plan.as_dict(run.model.names), "batch": b, "max_batch": b, "peak_bytes": int(peak),
           "recomputed_flops": got["recomputed_flops"], "offloaded_bytes": got["offloaded_bytes"],
           "fits": peak <= run.budget, "source": source}
    run.candidates.append(row)
    return row


def test_the_synthesis_descends_to_a_lighter_plan_and_answers_its_own_largest_batch(monkeypatch):
    """Issue 45: the 3-name block answered 60 with two names offloaded, where one offloaded fits 70
    (the model prices an offload at no device bytes, additively). The descent compiles the best
    plan's lighter moves one over its batch and searches the first that fits: the answer is the
    brute-force optimum of a synthetic block with that interaction, each figure compiled."""
    import itertools

    from remat_lab.config import RunConfig
    from remat_lab.studies import synthesize as synth

    model = _model(3, k=3)
    truth = _staged(model, model.slope_base)
    heavy = Plan((), ("n0", "n1"), 4)
    budget = int(truth(heavy, 12)) + 1  # the heavy plan fits 12 per device
    meter = _CountingMeter(model)
    meter.plan = lambda plan, b, written=True: _counted(meter, truth, plan, b)
    monkeypatch.setattr(synth, "probe", lambda cfg: {"peak_bytes": int(truth(cfg.plan, cfg.batch)),
                                                     "cached": False})
    monkeypatch.setattr(synth, "plan_config", lambda base, plan, batch: _Cfg(plan, batch))
    run = synth._Run(RunConfig(model="mlp", width=64, depth=4, batch=1), budget, meter, 64)
    run.compile_max(heavy, model, 12)
    assert max(c["max_batch"] for c in run.candidates if c["fits"]) == 12
    named = [{"policy": "nothing_saveable", "max_batch": 5, "fits": True}]
    rec = synth._descend(run, model, named, limit=10)
    assert rec["rounds"][0]["batch"] == 13 and rec["rounds"][0]["plan"] is not None
    plans = [Plan(tuple(n for n, c in zip(model.names, cs) if c == "save"),
                  tuple(n for n, c in zip(model.names, cs) if c == "offload"), 4)
             for cs in itertools.product(("save", "offload", "recompute"), repeat=3)]
    top = max(max((x for x in range(1, 65) if truth(p, x) <= budget), default=0) for p in plans)
    answer = min((c for c in run.candidates if c["fits"]), key=lambda r: objective(r, "max-batch"))
    assert answer["max_batch"] == top > 12 and answer["max_batch_exact"], (answer, top)
    assert rec["search_compiles"] == meter.answer > 0 and "descended" in synth.descend_note(rec)


def _counted(meter, truth, plan: Plan, b: int) -> dict:
    meter.compiles += 1
    got = meter.model.predict(plan, b)
    flops = 1e9 * b + got["recomputed_flops"]
    return {"peak_bytes": int(truth(plan, b)), "flops": flops, "written_flops": flops,
            "host_bytes": got["offloaded_bytes"], "xla_remat": False}
