"""The advisor's decision summary: the pick, why (batch, examples/s with interval, headroom), the runner-up.

``decide`` reads an advice document's rows and recommendation (``advisor.advise``) and returns the
``decision`` field: what to use and the numbers behind it, the runner-up and whether the two
separate, and what this backend cannot show. On a mesh a batch is said per device and globally
(``batch_words``: ``1 per device (8 global)``); the summary ends with the precision
(``precision_sentence``). ``sig`` writes a number to three significant figures (``14878.651`` ->
``14,900``, ``0.6`` -> ``0.600``); the CLI and the page use it too.
"""

from __future__ import annotations

from remat_lab.config.budget import human_bytes, sig  # noqa: F401 (sig re-exported)
from remat_lab.config.catalog import RECIPE

STOPPED = {
    "separated": "the best interval separated from the runner-up's",
    "time budget": "the time budget ended",
    "max rounds": "the round limit was reached",
    "stopped": "stopped on request",
    "deadline": "stopped before the server's time limit for a job",
    "one program": "only one program was timed",
    "nothing fits for timing": "no policy fit this process's memory for timing",
}


def ms(seconds: float | None) -> str:
    """Seconds as milliseconds to three significant figures: ``'14,900 ms'``; ``""`` for none."""
    return "" if seconds is None else f"{sig(seconds * 1e3)} ms"


def _rate(r: dict) -> str:
    ci = r.get("examples_per_s_ci")
    text = f"{sig(r['examples_per_s'])} examples/s"
    return text + (f" (95 % interval {sig(ci[0])}–{sig(ci[1])})" if ci else "")


def batch_words(r: dict) -> str:
    """A row's largest batch: ``8``, or on a mesh ``1 per device (8 global)``: examples per device
    per step (``per_device_batch``) and the step's."""
    per = r.get("per_device_batch")
    if (r.get("devices") or 1) > 1 and per is not None and r["max_batch"]:
        return f"{per} per device ({r['max_batch']} global)"
    return str(r["max_batch"])


def precision_words(p: dict) -> str:
    """``{"params", "compute", "optimizer"}`` in words: ``float32 master weights and moments,
    bfloat16 compute``."""
    if p["params"] == p["optimizer"]:
        return f"{p['params']} master weights and moments, {p['compute']} compute"
    return f"{p['params']} master weights, {p['optimizer']} moments, {p['compute']} compute"


def precision_sentence(p: dict | None) -> str:
    """An advice's or run's ``precision`` in one sentence, naming the common recipe."""
    if not p:
        return ""
    recipe = {"dtype": p["compute"], "param_dtype": p["params"], "optimizer_dtype": p["optimizer"]} == RECIPE
    return f"Precision: {precision_words(p)}" + (" (the common mixed-precision recipe)" if recipe else "")


def _runner_up(rows: list[dict], best: dict, timed: bool, estimate: bool = False) -> dict | None:
    """The next policy with another program: by examples/s when timed, by the estimated examples/s
    on a target (the order the pick was made in), else by batch."""
    same = {best["policy"], best.get("same_program_as")} - {None}
    rest = [r for r in rows if r["max_batch"] > 0 and r["policy"] not in same
            and r.get("same_program_as") not in same]
    key = "examples_per_s" if timed else "examples_per_s_estimate" if estimate else None
    if key is not None:
        rest = [r for r in rest if r.get(key)]
        return max(rest, key=lambda r: r[key], default=None)
    return max(rest, key=lambda r: r["max_batch"], default=None)


def decide(doc: dict, cannot_show: list[str]) -> dict:
    """The ``decision`` of an advice document: ``pick``, ``basis`` ("measured", "estimate" or
    "batch only"), ``batch`` (global) and on a mesh ``per_device_batch`` of ``devices``,
    ``fits_at_any_batch`` (False: the parameters, gradients and optimizer state alone exceed the
    budget; ``min_devices`` then hold them), ``examples_per_s`` and ``examples_per_s_ci``, ``peak_bytes``,
    ``headroom_bytes`` (budget - compiled peak at the pick) and ``headroom_fraction``,
    ``xla_decided`` (XLA's own rematerialization pass decided the pick's batch: ``largest_batch``),
    ``runner_up`` (policy, batch, examples/s and interval), ``separated`` (the pick's interval
    above the runner-up's; None untimed), ``rounds``, ``stopped_because``, ``why`` (one sentence,
    ending with the precision) and ``cannot_show`` (what this backend cannot show)."""
    rows, budget, timed = doc["rows"], doc["budget_bytes"], bool(doc.get("timed"))
    by_policy = {r["policy"]: r for r in rows}
    best = by_policy.get(doc.get("recommended"))
    static = doc.get("static") or {}
    out = {"pick": None, "basis": None, "batch": None, "per_device_batch": None, "devices": None,
           "fits_at_any_batch": static.get("fits"), "min_devices": static.get("min_devices"),
           "examples_per_s": None,
           "examples_per_s_ci": None, "peak_bytes": None, "headroom_bytes": None,
           "headroom_fraction": None, "xla_decided": None, "runner_up": None, "separated": None,
           "rounds": doc.get("rounds"), "stopped_because": doc.get("stopped_because"),
           "why": doc.get("reason", ""), "cannot_show": list(cannot_show)}
    words = precision_sentence(doc.get("precision"))
    if doc.get("attention"):  # the llm: which kernel the answer was compiled with
        words = (f"{words}. " if words else "") + f"Attention: {doc['attention']}"
    if best is None:
        out["why"] = " ".join(t.rstrip(".") + "." for t in (out["why"], words) if t)
        return out
    estimate = "target" in doc
    timed = timed and best.get("examples_per_s") is not None
    out.update(pick=best["policy"], batch=best["max_batch"], peak_bytes=best.get("peak_bytes"),
               per_device_batch=best.get("per_device_batch"), devices=best.get("devices"),
               basis="estimate" if estimate else "measured" if timed else "batch only")
    if best.get("peak_bytes") is not None:
        out["headroom_bytes"] = budget - best["peak_bytes"]
        out["headroom_fraction"] = out["headroom_bytes"] / budget
    why = f"{best['policy']} fits batch {batch_words(best)}"
    if out["headroom_bytes"] is not None:
        why += (f" (compiled peak {human_bytes(best['peak_bytes'])}, "
                f"{human_bytes(out['headroom_bytes'])} = {100 * out['headroom_fraction']:.1f} % "
                f"under the {human_bytes(budget)} budget)")
    out["xla_decided"] = bool(best.get("xla_decided"))
    if out["xla_decided"]:  # near the budget XLA's own pass decides: feasibility not monotone
        above = best.get("checked_above") or []
        why += ("; XLA's own rematerialization pass decided that batch (it rewrote the program "
                "there), and fitting is not monotone in the batch near the budget"
                + (f": batch{'es' * (len(above) > 1)} {', '.join(map(str, above))} above the first "
                   "refusal compiled too" if above else ""))
    runner = _runner_up(rows, best, timed, estimate and bool(best.get("examples_per_s_estimate")))
    if timed:
        out.update(examples_per_s=best["examples_per_s"], examples_per_s_ci=best["examples_per_s_ci"])
        why += f"; it processes {_rate(best)}"
        if doc.get("rounds"):
            why += f" over {doc['rounds']} interleaved rounds"
    elif estimate and best.get("examples_per_s_estimate"):
        out["examples_per_s"] = best["examples_per_s_estimate"]
        why += (f"; about {sig(best['examples_per_s_estimate'])} examples/s by the "
                f"{best.get('estimate_kind') or 'roofline bound'}")
    else:
        why += "; not timed, so chosen by batch alone"
    if runner is not None:
        out["runner_up"] = {k: runner.get(k) for k in ("policy", "max_batch", "per_device_batch",
                                                         "examples_per_s", "examples_per_s_ci",
                                                         "peak_bytes")}
        if timed:
            lo, hi = best["examples_per_s_ci"][0], runner["examples_per_s_ci"][1]
            out["separated"] = bool(lo > hi)
            why += (f". Runner-up {runner['policy']} at batch {batch_words(runner)}: {_rate(runner)}; "
                    + ("the intervals separate" if out["separated"] else
                       "the intervals overlap, a near-tie"))
        elif runner.get("examples_per_s_estimate") and estimate:
            why += (f". Runner-up {runner['policy']} at batch {batch_words(runner)}: about "
                    f"{sig(runner['examples_per_s_estimate'])} examples/s by the "
                    f"{runner.get('estimate_kind') or 'roofline bound'}")
        else:
            why += f". Runner-up {runner['policy']} fits batch {batch_words(runner)}"
    stop = doc.get("stopped_because")
    if timed and stop in STOPPED:
        why += f" (timing ended: {STOPPED[stop]})"
    untimed = [r["policy"] for r in rows if r.get("not_timed")]
    if untimed and not estimate:
        why += f". Not timed: {', '.join(untimed)} (each row's note says why)"
    out["why"] = why + "." + (f" {words}." if words else "")
    return out
