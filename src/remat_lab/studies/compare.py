"""Compare policies at one configuration: compile each, time them interleaved, rank only beyond noise."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np

from remat_lab.analysis import hlo
from remat_lab.config import ConfigError, RunConfig, check_budget, human_bytes, human_seconds, resolve_budget
from remat_lab.model.policies import POLICIES
from remat_lab.program.backend import ExecutionError, device_memory_limit, environment, xla_error
from remat_lab.program.step import build_problem, make_step, release_other_models
from remat_lab.program.timing import MIN_WARMUP_S, time_executable, timing_slot
from remat_lab.studies.experiment import run_experiment
from remat_lab.studies.progress import Tracker

BASELINE = "no_remat"
CALLS_PER_ROUND = 2
RESAMPLES = 2000
LEVEL = 0.95
SEED = 0

Message = Callable[[str], None]


# ---------------------------------------------------------------- statistics (no JAX)


def median_interval(samples, *, resamples: int = RESAMPLES, level: float = LEVEL,
                    seed: int = SEED) -> tuple[float, float, float]:
    """``(median, low, high)``: the median of all samples and a bootstrap interval of it.

    ``samples`` is one row per round (``(rounds, calls_per_round)``, or a flat array: one call a
    round). Calls of one round ran back to back and share the machine's load at that moment, so the
    bootstrap resamples whole rounds (a block bootstrap), takes the median of the calls of each
    resample and reports the central ``level`` percentile range. A fixed ``seed`` makes it
    reproducible. The interval is widened to include the median if the percentiles miss it.
    """
    data = np.asarray(samples, dtype=float)
    if data.ndim == 1:
        data = data[:, None]
    if data.size == 0:
        raise ValueError("no samples")
    med = float(np.median(data))
    rounds = data.shape[0]
    if rounds < 2:
        return med, float(data.min()), float(data.max())
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, rounds, size=(resamples, rounds))
    meds = np.median(data[picks].reshape(resamples, -1), axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(meds, [tail, 100 - tail])
    return med, min(float(low), med), max(float(high), med)


def _group_name(members: list[str]) -> str:
    return members[0] if len(members) == 1 else f"{members[0]} (= {', '.join(members[1:])})"


def _list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def rank(rows: Sequence[Mapping]) -> dict:
    """The fastest program and the Pareto front from intervals, never from single medians.

    Each row: ``policy``, ``median_s``, ``ci_low_s``, ``ci_high_s``, ``peak_bytes`` (None when the
    backend has no memory analysis) and ``fingerprint`` (None: a program of its own). Rows with
    the same fingerprint are one program: they form a group that is never ranked within itself;
    its time interval is the union of its members' intervals and its peak their smallest peak.

    * Time: group A is *faster* than B when A's interval lies entirely below B's (``A.high <
      B.low``); overlapping intervals mean *indistinguishable* (treated as equal).
    * Fastest: the group faster than every other group; otherwise none, and ``fastest_reason``
      names the groups whose intervals overlap the one with the lowest median.
    * Pareto: named only when at least two programs' time intervals separate (one is faster than
      the other); with one program, or every interval overlapping, there is no front (a front on
      memory alone would claim a trade-off the times cannot show) and ``pareto_reason`` names the
      smallest peak instead. A *dominates* B when A's peak is <= B's, A is faster than or
      indistinguishable from B, and A is strictly better in one of the two (a smaller peak, or
      faster). The front is every group no other group dominates. Peaks that are unknown for only
      one of A and B are incomparable (no domination); unknown for both count as equal.

    Returns ``fastest`` (the group's first policy or None), ``fastest_group`` (every policy of the
    winning program, [] without one), ``fastest_reason`` (one sentence), ``pareto`` (policies on
    the front, in row order; a program's policies are on it together), ``pareto_reason`` (one
    sentence) and ``groups`` (policies per program, in row order).
    """
    groups: dict[str, list[Mapping]] = {}
    for row in rows:
        key = row.get("fingerprint") or f"policy:{row['policy']}"
        groups.setdefault(key, []).append(row)
    stats = []
    for members in groups.values():
        peaks = [m.get("peak_bytes") for m in members]
        stats.append({
            "policies": [m["policy"] for m in members],
            "median": float(np.median([m["median_s"] for m in members])),
            "low": min(m["ci_low_s"] for m in members),
            "high": max(m["ci_high_s"] for m in members),
            "peak": None if any(p is None for p in peaks) else min(peaks),
        })
    out = {"fastest": None, "fastest_group": [], "pareto": [],
           "groups": [g["policies"] for g in stats]}
    if not stats:
        out["fastest_reason"] = "No policies to compare."
        out["pareto_reason"] = "No Pareto front: no policies to compare."
        return out

    def faster(a: dict, b: dict) -> bool:
        return a["high"] < b["low"]

    if len(stats) == 1:
        members = stats[0]["policies"]
        out["fastest_reason"] = (
            "No winner: only one policy was timed." if len(members) == 1 else
            f"No winner: all {len(members)} policies compile to the same program, so they are "
            "not ranked against each other.")
    else:
        best = min(stats, key=lambda g: g["median"])
        others = [g for g in stats if g is not best]
        interval = f"{human_seconds(best['low'])} to {human_seconds(best['high'])}"
        if all(faster(best, g) for g in others):
            out["fastest"], out["fastest_group"] = best["policies"][0], list(best["policies"])
            same = (f" (the same compiled program as {_list(best['policies'][1:])}, so they tie)"
                    if len(best["policies"]) > 1 else "")
            out["fastest_reason"] = (
                f"Fastest: {best['policies'][0]}{same}: the 95 % interval of its median step time "
                f"({interval}) lies below every other program's.")
        else:
            close = [g for g in stats if g is best or not faster(best, g)]
            out["fastest_reason"] = (
                f"No winner: the 95 % intervals of the median step time of "
                f"{_list([_group_name(g['policies']) for g in close])} overlap, so these cannot be "
                "told apart at this noise level.")

    def dominates(a: dict, b: dict) -> bool:
        if (a["peak"] is None) != (b["peak"] is None):
            return False
        no_more = a["peak"] is None or a["peak"] <= b["peak"]
        less = a["peak"] is not None and a["peak"] < b["peak"]
        not_slower = not faster(b, a)
        return no_more and not_slower and (less or faster(a, b))

    if not any(faster(a, b) for a in stats for b in stats if a is not b):
        out["pareto_reason"] = _no_front(stats)
        return out
    front_groups = [g for g in stats if not any(dominates(o, g) for o in stats if o is not g)]
    front = {p for g in front_groups for p in g["policies"]}
    out["pareto"] = [row["policy"] for row in rows if row["policy"] in front]
    out["pareto_reason"] = (
        f"Pareto front: {_list([_group_name(g['policies']) for g in front_groups])}: no other "
        "program has a peak as small and a step time that is not slower (95 % intervals) while "
        "being better in one of the two.")
    return out


def _no_front(stats: list[dict]) -> str:
    """Why there is no Pareto front (one program, or every time interval overlapping), and the
    smallest peak, which is then the only difference left to act on."""
    why = ("only one compiled program" if len(stats) == 1 else
           "the step times are indistinguishable (every 95 % interval overlaps every other)")
    known = [g for g in stats if g["peak"] is not None]
    if not known:
        return f"No Pareto front: {why}; the backend gives no peak memory."
    least = min(g["peak"] for g in known)
    names = _list([_group_name(g["policies"]) for g in known if g["peak"] == least])
    if len(stats) == 1:
        return f"No Pareto front: {why} (peak {human_bytes(least)})."
    return f"No Pareto front: {why}; the smallest peak is {human_bytes(least)}, of {names}."


# ---------------------------------------------------------------- compiling and timing


def _policy_list(policies: Sequence[str] | None) -> list[str]:
    if policies is None:
        return list(POLICIES)
    chosen = list(dict.fromkeys(policies))  # drop repeats, keep the order
    if not chosen:
        raise ConfigError("pick at least one policy to compare.")
    for p in chosen:
        if p not in POLICIES:
            raise ConfigError(f"unknown policy {str(p)[:40]!r}; choose from: {', '.join(POLICIES)}.")
    return chosen


def _compile(config: RunConfig):
    release_other_models(config)  # an earlier model's cached parameters off the device
    problem = build_problem(config)
    try:
        compiled = jax.jit(make_step(problem)).trace(*problem.args).lower().compile()
    except Exception as err:  # XlaRuntimeError and friends
        raise xla_error("compiling", err) from err
    return compiled, problem.args


def _same_program(order: list[str], prints: dict[str, str]) -> dict[str, str | None]:
    """Per policy, the policy its program is shared with: no_remat when in the group, else the
    group's first policy in ``order``; None for that reference policy itself."""
    ref: dict[str, str] = {}
    for p in sorted(order, key=lambda p: (p != BASELINE, order.index(p))):
        ref.setdefault(prints[p], p)
    return {p: (None if ref[prints[p]] == p else ref[prints[p]]) for p in order}


def interleaved(executables: dict[str, tuple], *, rounds: int, calls: int, warmup: int,
                 seed: int, progress: Callable[[int], None] | None = None) -> dict[str, np.ndarray]:
    """Seconds per call, ``(rounds, calls)`` per policy, timed round-robin in a shuffled order;
    ``progress(r)`` after each round ``r`` (from 1)."""
    clock = time.perf_counter
    for compiled, args in executables.values():  # each warmed up on its own first ...
        time_executable(compiled, args, warmup=warmup, repeats=0, min_warmup_s=MIN_WARMUP_S)
    names = list(executables)
    for name in names:  # ... then one untimed round in the timed pattern
        compiled, args = executables[name]
        for _ in range(calls):
            jax.block_until_ready(compiled(*args))
    out = {name: np.empty((rounds, calls)) for name in names}
    rng = np.random.default_rng(seed)
    for r in range(rounds):
        for i in rng.permutation(len(names)):
            compiled, args = executables[names[i]]
            row = out[names[i]][r]
            for c in range(calls):
                t0 = clock()
                jax.block_until_ready(compiled(*args))
                row[c] = clock() - t0
        if progress is not None:
            progress(r + 1)
    return out


def _excess(doc: dict, base: dict | None, key: str, value: Callable[[dict], float | None]):
    """``doc["hlo"][key]`` when the engine gives it; else this compile minus no_remat's."""
    h = doc.get("hlo") or {}
    if key in h:
        return h[key]
    if base is None:
        return None
    mine, theirs = value(doc), value(base)
    return None if mine is None or theirs is None else mine - theirs


def compare_policies(config: RunConfig, policies: Sequence[str] | None = None, *,
                     rounds: int | None = None, calls_per_round: int = CALLS_PER_ROUND,
                     budget: str | int | None = None, progress: Message | None = None,
                     results: Mapping[str, dict] | None = None, seed: int = SEED) -> dict:
    """Every policy of ``policies`` (default: all) at ``config``, timed interleaved and ranked.

    Each policy's step is compiled and dissected (``run_experiment(..., timing=False)``: memory,
    HLO, dots, gradient check) and compiled once more for timing; ``results`` may hold such
    untimed documents already computed (by policy), which are then not dissected again. After a
    warm-up, ``rounds`` rounds (default ``config.repeats``) each call every executable
    ``calls_per_round`` times, ended by ``block_until_ready``, in a shuffled order (seeded), all
    under the process-wide timing lock. Per policy: the median and a bootstrap 95 % interval of
    it (``median_interval``). ``rank`` names a fastest program and the Pareto front only beyond
    that noise; policies that compile to the same program (equal ``hlo.fingerprint``) are never
    ranked against each other; ``pareto_reason`` says why a front is named, or why none is.

    ``timelines`` maps each compared policy to its document's ``memory_timeline`` (None where the
    backend gives none). ``progress`` receives one short line per step. Raises ``ConfigError``
    (over the memory budget, unknown policy) before compiling anything; a policy XLA cannot
    compile or run is listed in ``failed``, and ``ExecutionError`` is raised only when every
    policy fails.
    """
    chosen = _policy_list(policies)
    # Each step also carries the counts and the policies compiled so far (the pages' partial table).
    say = Tracker(progress, planned=len(chosen), unit="policies compiled and checked", item="policy",
                  phase="compiling", after="then the timing rounds")
    configs = {p: config.replace(policy=p) for p in chosen}  # validated before anything runs
    rounds = config.repeats if rounds is None else rounds
    if not (isinstance(rounds, int) and 1 <= rounds <= 1000):
        raise ConfigError(f"rounds must be a whole number from 1 to 1000; got {rounds!r}.")
    if not (isinstance(calls_per_round, int) and 1 <= calls_per_round <= 100):
        raise ConfigError(f"calls_per_round must be from 1 to 100; got {calls_per_round!r}.")
    device_limit = device_memory_limit()
    budget_bytes = resolve_budget(budget, device_limit)
    if device_limit is None:  # on an accelerator each policy's compile answers it (run_experiment)
        check_budget(config, budget_bytes)  # the estimate does not depend on the policy

    docs, executables, prints, failed = {}, {}, {}, []
    n = len(chosen)
    for i, p in enumerate(chosen, 1):
        step = f"{i}/{n} {p}"
        try:
            doc = (results or {}).get(p)
            if doc is None:
                doc = run_experiment(configs[p], budget=budget_bytes, timing=False,
                                     progress=lambda stage, step=step: say(f"{step}: {stage}"))
            say(f"{step}: compiling for timing")
            compiled, args = _compile(configs[p])
        except ExecutionError as err:
            failed.append({"policy": p, "error": str(err)})
            say.finished({"policy": p, "error": str(err)}, f"{step}: failed")
            continue
        doc = {k: v for k, v in doc.items() if k != "texts"}
        docs[p], executables[p] = doc, (compiled, args)
        prints[p] = hlo.fingerprint(compiled.as_text())
        say.finished({"policy": p, "peak_bytes": (doc.get("memory") or {}).get("peak_bytes"),
                      "compile_s": (doc.get("compile") or {}).get("compile_s"),
                      "grad_ok": (doc.get("gradient_check") or {}).get("ok")}, f"{step}: compiled")
    if not executables:
        raise ExecutionError("XLA failed for every policy: " + failed[0]["error"])

    with timing_slot(lambda stage: say("waiting: another run is timing (one timing at a time)")):
        say.phase("timing", planned=rounds, unit="timing rounds", item="round")
        head = f"timing {len(executables)} policies interleaved: {rounds} rounds of {calls_per_round} calls"
        say(head)
        try:
            times = interleaved(executables, rounds=rounds, calls=calls_per_round,
                                 warmup=config.warmup, seed=seed,
                                 progress=lambda r: say.finished(None, f"{head}: round {r} done"))
        except Exception as err:
            raise xla_error("running", err) from err

    order = list(executables)
    same = _same_program(order, prints)
    base = docs.get(BASELINE)
    rows = []
    for p in order:
        doc = docs[p]
        med, low, high = median_interval(times[p], seed=seed)
        mem = doc.get("memory") or {}
        tot = doc.get("totals") or {}
        h = doc.get("hlo") or {}
        rows.append({
            "policy": p, "median_s": med, "ci_low_s": low, "ci_high_s": high,
            "samples": int(times[p].size), "samples_s": times[p].ravel().tolist(),
            **{k: v for k, v in mem.items() if not k.startswith("host_") or v},
            "peak_bytes": mem.get("peak_bytes"),
            "fingerprint": prints[p], "same_program_as": same[p],
            "excess_dots_vs_no_remat": _excess(doc, base, "excess_dots_vs_no_remat",
                                               lambda d: (d.get("hlo") or {}).get("dot_count")),
            "excess_flops_vs_no_remat": _excess(doc, base, "excess_flops_vs_no_remat",
                                                lambda d: d.get("flops")),
            "compiled_dots": h.get("dot_count"), "flops": doc.get("flops"),
            "residual_bytes": tot.get("residual_bytes"),
            "activation_residual_bytes": tot.get("activation_residual_bytes"),
            "dots_saved": tot.get("dots_saved"), "dots_recomputed": tot.get("dots_recomputed"),
            "recompute_flops": tot.get("recompute_flops"),
            "grad_ok": (doc.get("gradient_check") or {}).get("ok"),
            "compile_s": (doc.get("compile") or {}).get("compile_s"),
        })
    ranking = rank(rows)
    for row in rows:
        row["fastest"] = row["policy"] in ranking["fastest_group"]
        row["pareto"] = row["policy"] in ranking["pareto"]
    return {
        "schema": 1,  # the results schema (see results.py)
        "config": {k: v for k, v in config.as_dict().items() if k != "policy"},
        "policies": chosen,
        "rows": rows,
        "fastest": ranking["fastest"],
        "fastest_group": ranking["fastest_group"],
        "fastest_reason": ranking["fastest_reason"],
        "pareto": ranking["pareto"],
        "pareto_reason": ranking["pareto_reason"],
        "programs": ranking["groups"],
        # Each policy's memory over the program (its document's ``memory_timeline``; None without).
        "timelines": {p: docs[p].get("memory_timeline") for p in order},
        "failed": failed,
        "method": {
            "rounds": rounds, "calls_per_round": calls_per_round, "warmup": config.warmup,
            "min_warmup_s": MIN_WARMUP_S, "order": f"shuffled every round (seed {seed})",
            "interval": (f"bootstrap {LEVEL:.0%} of the median, {RESAMPLES} resamples of whole "
                         f"rounds (seed {seed})"),
            "same_program": "equal hlo.fingerprint of the compiled program",
            "excess_fallback": ("when the engine gives no excess figures: compiled dot count and "
                                "cost-analysis flops minus no_remat's"),
        },
        "environment": environment(),
    }
