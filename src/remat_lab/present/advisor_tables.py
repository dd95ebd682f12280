"""Advice documents (``advisor.advise``) -> DataFrames and text: the numbers, the shown table, the decision.

``advice_frame`` keeps the exact numbers (CSV downloads, charts); ``advice_display_frame`` is the
table a person reads, every number to its precision (three significant figures for examples/s and
milliseconds) and empty cells blank; ``decision_lines`` is the decision summary as lines of text,
shown first by the CLI and the page. pandas only: no Streamlit, no JAX.
"""

from __future__ import annotations

import pandas as pd

from remat_lab.config import human_bytes
from remat_lab.studies.advisor.decision import batch_words, ms, sig

MIB = float(1 << 20)

ADVICE_COLUMNS = ["policy", "max_batch", "per_device_batch", "devices", "peak_bytes", "peak_mib",
                  "next_batch", "next_peak_bytes", "probes", "step_time_ms", "step_time_low_ms",
                  "step_time_high_ms", "examples_per_s",
                  "examples_per_s_low", "examples_per_s_high", "model_flops", "hardware_flops",
                  "mfu", "hfu", "recompute_overhead", "policy_recompute_overhead",
                  "xla_recompute_overhead", "rounds", "same_program_as", "note"]
PROBE_COLUMNS = ["policy", "batch", "peak_bytes", "peak_mib", "fits", "answer"]
DISPLAY_COLUMNS = ["policy", "largest batch", "peak at it", "next batch (over by)", "compiles",
                   "step time", "examples/s", "95 % interval", "MFU", "HFU", "recompute overhead",
                   "rounds", "note"]
KIND_COLUMNS = ["run", "kind", "bytes"]


def _note(r: dict) -> str:
    """A row's note: not timed (why), not fitting (why), its program shared, a calibration error."""
    parts = [r.get("not_timed") or ("" if r["max_batch"] else r.get("reason", "")),
             f"same program as {r['same_program_as']}" if r.get("same_program_as") else "",
             r.get("rate_error") or "", r.get("xla_remat_note") or "", r.get("race") or ""]
    return "; ".join(p for p in parts if p)


def advice_frame(doc: dict | None) -> pd.DataFrame:
    """One row per policy of an advice document, in its order: exact numbers (None where absent)."""
    rows = []
    for r in (doc or {}).get("rows", []):
        time_ci = r.get("step_time_ci_s") or [None, None]
        eps_ci = r.get("examples_per_s_ci") or [None, None]
        to_ms = lambda s: None if s is None else s * 1e3  # noqa: E731
        rows.append({
            "policy": r["policy"], "max_batch": r["max_batch"],
            "per_device_batch": r.get("per_device_batch"), "devices": r.get("devices"),
            "peak_bytes": r.get("peak_bytes"),
            "peak_mib": None if r.get("peak_bytes") is None else r["peak_bytes"] / MIB,
            "next_batch": r.get("next_batch"), "next_peak_bytes": r.get("next_peak_bytes"),
            "probes": len(r.get("probes") or []),
            "step_time_ms": to_ms(r.get("step_time_s")), "step_time_low_ms": to_ms(time_ci[0]),
            "step_time_high_ms": to_ms(time_ci[1]), "examples_per_s": r.get("examples_per_s"),
            "examples_per_s_low": eps_ci[0], "examples_per_s_high": eps_ci[1],
            "model_flops": r.get("model_flops"), "hardware_flops": r.get("hardware_flops"),
            "mfu": r.get("mfu"), "hfu": r.get("hfu"), "recompute_overhead": r.get("recompute_overhead"),
            "policy_recompute_overhead": r.get("policy_recompute_overhead"),
            "xla_recompute_overhead": r.get("xla_recompute_overhead"),
            "rounds": r.get("rounds"), "same_program_as": r.get("same_program_as") or "",
            "note": _note(r),
        })
    return pd.DataFrame(rows, columns=ADVICE_COLUMNS)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{sig(100 * x)} %"


def _batch(r: dict) -> str:
    """A row's largest batch (on a mesh per device and global, ``batch_words``); a search that
    stopped at its own limit says so (a lower bound)."""
    text = batch_words(r)
    return f"≥ {text} (the search's limit)" if r.get("limited_by") == "search_limit" else text


def _next(r: dict, budget: int) -> str:
    """The batch after the answer and what it is over the budget by; one the device refused when it
    ran (its compile fitted: ``batch_search``'s runtime check) says so instead."""
    nxt = r.get("next_batch")
    if nxt is None or r.get("next_peak_bytes") is None:
        return ""
    if r.get("limited_by") == "runtime":
        return f"{nxt} (compiles to {human_bytes(r['next_peak_bytes'])}; refused when run)"
    at_least = "≥ " if r.get("limited_by") == "static_bytes" else ""
    return f"{nxt} ({at_least}+{human_bytes(r['next_peak_bytes'] - budget)})"


def _overhead(r: dict) -> str:
    """The recomputation share; split into the policy's and XLA's own where XLA's pass added some."""
    total, xla = _pct(r.get("recompute_overhead")), r.get("xla_recompute_overhead")
    if not total or not xla:
        return total
    return f"{total} (policy {_pct(r.get('policy_recompute_overhead'))} + XLA {_pct(xla)})"


def _estimated(r: dict) -> tuple[str, str]:
    """A target's step and examples/s cells: the prediction with the bound beside it, or the bound."""
    if r.get("estimate_kind") == "prediction":
        bound = ""
        if r.get("bound_s"):  # the roofline's memory term can be over the prediction (predict.py)
            over = r["bound_s"] > r["estimate_s"]
            bound = f" ({ms(r['bound_s'])} roofline, over it)" if over else f" (≥ {ms(r['bound_s'])} bound)"
        return (f"~{ms(r['estimate_s'])} (pred.){bound}",
                f"~{sig(r.get('examples_per_s_estimate'))} (pred.)")
    return f"≥ {ms(r['estimate_s'])} (bound)", f"≤ {sig(r.get('examples_per_s_estimate'))} (bound)"


def advice_display_frame(doc: dict | None) -> pd.DataFrame:
    """The policy table as read: text cells, numbers to their precision, blank where absent.

    On a named target the step time and examples/s are the prediction, marked "(pred.)", with the
    roofline bound beside it ("≥ ... bound"), or the bound alone, marked so, where there is no
    prediction.
    """
    budget = (doc or {}).get("budget_bytes") or 0
    rows = []
    for r in (doc or {}).get("rows", []):
        ci = r.get("examples_per_s_ci")
        step, rate = ms(r.get("step_time_s")), sig(r.get("examples_per_s"))
        if not step and r.get("estimate_s"):
            step, rate = _estimated(r)
        rows.append({
            "policy": r["policy"], "largest batch": _batch(r),
            "peak at it": "" if r.get("peak_bytes") is None else human_bytes(r["peak_bytes"]),
            "next batch (over by)": _next(r, budget),
            "compiles": str(len(r.get("probes") or [])), "step time": step, "examples/s": rate,
            "95 % interval": f"{sig(ci[0])}–{sig(ci[1])}" if ci else "",
            "MFU": _pct(r.get("mfu")), "HFU": _pct(r.get("hfu")),
            "recompute overhead": _overhead(r),
            "rounds": "" if not r.get("rounds") else str(r["rounds"]), "note": _note(r),
        })
    return pd.DataFrame(rows, columns=DISPLAY_COLUMNS)


def advice_probes_frame(doc: dict | None) -> pd.DataFrame:
    """Every compile-only probe of an advice: policy, batch, compiled peak, whether it fit, and
    whether it is the policy's answer (its largest batch that fits)."""
    rows = [{"policy": r["policy"], "batch": p["batch"], "peak_bytes": p["peak_bytes"],
             "peak_mib": p["peak_bytes"] / MIB, "fits": bool(p["fits"]),
             "answer": p["batch"] == r["max_batch"]}
            for r in (doc or {}).get("rows", []) for p in r.get("probes") or []]
    return pd.DataFrame(rows, columns=PROBE_COLUMNS)


def advice_by_kind_frame(doc: dict | None) -> pd.DataFrame:
    """Columns run (the policy), kind, bytes: what fills each device's memory at each policy's
    largest batch, from rows that carry ``by_kind`` (per-device sizing on a mesh); else empty."""
    rows = [{"run": r["policy"], "kind": k, "bytes": v}
            for r in (doc or {}).get("rows", []) for k, v in (r.get("by_kind") or {}).items()
            if k != "method" and isinstance(v, int | float) and not isinstance(v, bool)]
    return pd.DataFrame(rows, columns=KIND_COLUMNS)


def decision_lines(doc: dict | None) -> list[str]:
    """The decision summary as text lines: the pick and why, then what this backend cannot show."""
    d = (doc or {}).get("decision") or {}
    if not d:
        return []
    if d.get("pick") is None:
        return [f"Decision: none. {d.get('why') or (doc or {}).get('reason', '')}"]
    basis = {"measured": "measured here",
             "estimate": "predicted (the roofline bound beside it), not measured",
             "batch only": "not timed: by batch alone"}.get(d.get("basis"), "")
    lines = [f"Decision: {d['pick']} ({basis}). {d['why']}"]
    lines += [f"This backend cannot show: {n}" for n in d.get("cannot_show") or []]
    return lines
