"""The bench's time to an answer on the issue's real task: the Advisor on a transformer, timed and not.

"I have a transformer (width 512, seq 256, 8 heads, 8 blocks); which policy, and what batch fits in
2 GiB?": ``advisor.advise`` over every named policy (custom needs names: left out), from an empty
persistent cache, probe cache and in-process compile caches, once compile-only
(``advise_transformer_no_time_s``) and once timed (``advise_transformer_s``), with the policies sized
in ``advisor_sizing.WORKERS`` threads; ``compiles`` counts the sizing's compiles (model flops apart).
"""

from __future__ import annotations

import time

from remat_lab.config import RunConfig
from remat_lab.model.policies import POLICIES
from remat_lab.studies.bench_env import clear_caches

ADVISE_TRANSFORMER = RunConfig(model="transformer", width=512, seq=256, heads=8, depth=8, stack="scan",
                               batch=1, repeats=3)
ADVISE_TRANSFORMER_BUDGET = 2 << 30
ALL_POLICIES = tuple(p for p in POLICIES if p != "custom")


def advise_transformer(config: RunConfig = ADVISE_TRANSFORMER, budget: int = ADVISE_TRANSFORMER_BUDGET,
                       policies: tuple[str, ...] = ALL_POLICIES, cache=None, timed: bool = True,
                       time_budget_s: float | None = None) -> dict:
    """Seconds to the advice without and (``timed``) with timing; ``cache``: a context manager
    factory giving an empty persistent cache directory (``bench.temporary_cache_dir``);
    ``time_budget_s``: the timed advice's budget (default: the Advisor's). The timed
    advice runs every fitting program at its largest batch: over 40 minutes on 2 CPU cores (the
    docs/performance.md says why), so ``bench --quick`` leaves it out."""
    from contextlib import nullcontext

    from remat_lab.studies import advisor
    from remat_lab.studies.advisor.sizing import WORKERS

    out = {"config": config.as_dict(), "budget_bytes": budget, "policies": list(policies),
           "workers": WORKERS}
    for key, timing in (("no_time", False), ("timed", True))[:2 if timed else 1]:
        with (cache() if cache else nullcontext()):
            clear_caches()
            advisor.clear_cache()
            t0 = time.perf_counter()
            budget_kw = {} if time_budget_s is None else {"time_budget_s": time_budget_s}
            doc = advisor.advise(config, budget, timing=timing, policies=list(policies), **budget_kw)
            rows = doc["rows"]
            out[key] = {"s": time.perf_counter() - t0, "search_s": doc["search_s"],
                        "recommended": doc["recommended"],
                        "max_batch": {r["policy"]: r["max_batch"] for r in rows},
                        "timed": sum(1 for r in rows if r.get("step_time_s") is not None),
                        "compiles": sum(r["compiles"] for r in rows)}
            if timing:
                out[key].update(timing_bound(doc, out["no_time"]["s"]))
    return out


def timing_bound(doc: dict, compile_only_s: float) -> dict:
    """The timed advice's target, term by term: the compile-only advice's seconds, plus the time
    budget, plus one step of each program timed (the race ends within the budget and one more
    call of each program still racing). ``timing_s``: the timed phase's own wall time."""
    one_step = sum(r["step_time_s"] for r in doc["rows"] if r.get("step_time_s") is not None)
    budget = doc["time_budget_s"] or 0.0
    return {"timing_s": doc["timing"].get("timing_s"), "time_budget_s": budget,
            "compile_only_s": compile_only_s, "one_step_each_s": one_step,
            "bound_s": compile_only_s + budget + one_step}
