"""The Advisor on a named target: each fitting policy's predicted step, its roofline bound, the pick."""

from __future__ import annotations

from collections.abc import Callable

from remat_lab.analysis.estimate import estimate_step
from remat_lab.analysis.predict import basis, predict_step
from remat_lab.config import RunConfig, Target, get_target
from remat_lab.studies.advisor.decision import batch_words, sig


def estimate_rows(rows: list[dict], configs: dict[str, RunConfig], target: str,
                  probe: Callable[[RunConfig], dict]) -> None:
    """On a named target nothing runs: each fitting policy's step at its largest batch, two
    figures never mixed up: ``bound_s`` (the roofline, ``analysis/estimate.py``: a lower bound) and
    ``predicted_s`` (``analysis/predict.py``: the kernels at measured rates on a GPU; none on a
    TPU), with examples/s from each. ``estimate_s`` and ``examples_per_s_estimate`` are
    the figure the pick ranks by: the prediction where there is one, else the bound
    (``estimate_kind`` says which)."""
    for r in rows:
        r.update(estimate_s=None, examples_per_s_estimate=None, estimate_bound=None, bound_s=None,
                 predicted_s=None, examples_per_s_bound=None, estimate_kind=None)
        if r["max_batch"] == 0:
            continue
        config = configs[r["policy"]].replace(batch=r["max_batch"])
        t = get_target(config.target, config.network)
        found = probe(config)
        est = estimate_step(found["flops"], found.get("bytes_accessed"), t, config.dtype,
                            found.get("traffic"))
        pred = predict_step(t, est, kernels=found.get("kernels"),
                            events=found.get("schedule"), overlap=config.collective_overlap)
        r["estimate_bound"] = est["bound"]
        r["bound_s"], r["predicted_s"] = est["estimate_s"], pred["predicted_s"]
        if est["estimate_s"]:
            r["examples_per_s_bound"] = r["max_batch"] / est["estimate_s"]
        r["estimate_s"] = pred["predicted_s"] or est["estimate_s"]
        r["estimate_kind"] = "prediction" if pred["predicted_s"] else "roofline bound"
        if r["estimate_s"]:
            r["examples_per_s_estimate"] = r["max_batch"] / r["estimate_s"]


def recommend_by_estimate(rows: list[dict], target: str,
                          fallback: Callable) -> tuple[str | None, list[str], str]:
    """On a target: the most examples/s by the prediction (by the roofline bound where a policy
    has no prediction; not a measurement, so no interval); policies within 2 % of it are named as
    near-ties. ``fallback(rows, False)`` where nothing has a figure."""
    fits = [r for r in rows if r["max_batch"] > 0 and r.get("examples_per_s_estimate")]
    if not fits:
        return fallback(rows, False)
    top = max(r["examples_per_s_estimate"] for r in fits)
    # equal estimates (e.g. the same products and bytes): the most headroom, the smallest peak
    best = min((r for r in fits if r["examples_per_s_estimate"] >= top * (1 - 1e-9)),
               key=lambda r: (r.get("peak_bytes") or 0, rows.index(r)))
    ties = [r["policy"] for r in fits if r["examples_per_s_estimate"] >= 0.98 * top]
    kind = best.get("estimate_kind") or "roofline bound"
    why = (f"{best['policy']} fits batch {batch_words(best)} on the {target}; by the {kind} "
           f"(not measured: nothing runs on a target) it processes {sig(top)} examples/s")
    if best.get("examples_per_s_bound") and kind == "prediction":
        why += f" (roofline bound: at most {sig(best['examples_per_s_bound'])})"
    others = [p for p in ties if p != best["policy"]]
    if others:
        why += f"; {', '.join(others)} within 2 % of it by the same {kind}"
    return best["policy"], ties, why


def prediction_basis(target: Target) -> str:
    """What the rows' ``predicted_s`` is, for the document (``analysis/predict.py``'s words)."""
    return basis(target)
