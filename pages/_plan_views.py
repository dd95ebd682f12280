"""The Plan page's answer: the compiled plans and their cost, the published row, accelerators side by side."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from pages import _progress, _views
from remat_lab.config import get_target, human_bytes
from remat_lab.studies.plan.cost import cost, price_of

COLUMNS = [("what", "compiled", _progress._text), ("peak_bytes", "peak", _progress._bytes),
           ("predicted_s", "predicted step", _progress._seconds),
           ("estimate_peak_bytes", "estimate by hand (peak)", _progress._bytes),
           ("error", "note", _progress._text), ("note", "estimate's gap", _progress._text)]


def device_price(target: str, per_chip: float | None) -> tuple[float | None, str]:
    """Dollars per device-hour from a typed price per chip-hour (a v4 chip is two devices), else
    the target's default, with where it comes from."""
    if per_chip is None:
        return price_of(target, None)
    chips = int((get_target(target).price or {}).get("devices_per_chip", 1))
    return per_chip / chips, "typed"


def _table(rows: list[dict], devices: int, usd: float | None, budget: float | None) -> pd.DataFrame:
    out = []
    for r in rows:
        c = cost(r.get("predicted_tokens_per_s_per_device"), devices, usd, budget)
        out.append({
            "mesh": r["mesh"], "remat plan": r["plan_text"], "per-device batch": r["per_device_batch"],
            "accumulation steps": r["microbatches"], "optimizer on host": r["optimizer_offload"],
            "compiled peak": human_bytes(r["peak_bytes"]),
            "model's peak": human_bytes(r["predicted_peak_bytes"]) if r.get("predicted_peak_bytes") else "-",
            "predicted step (s)": r["predicted_s"] or r["bound_s"],
            "tokens/s/device": round(r["predicted_tokens_per_s_per_device"] or 0),
            "MFU (causal)": f"{r['predicted_mfu']:.1%}" if r.get("predicted_mfu") else "-",
            "MFU (full square)": f"{r['predicted_mfu_full_attention']:.1%}"
            if r.get("predicted_mfu_full_attention") else "-",
            "$ per M tokens": round(c["usd_per_million_tokens"], 4) if c["usd_per_million_tokens"] else None,
            "days for the budget": round(c["days"], 2) if c["days"] else None,
            "$ for the budget": round(c["usd"]) if c["usd"] else None,
            "limited by": r.get("limited_by") or "-", "same program as": r.get("same_as") or ""})
    return pd.DataFrame(out)


def answer(doc: dict, per_chip: float | None, budget: float | None, also: list) -> None:
    """The compiled answer, priced at ``per_chip`` (None: the default) for ``budget`` tokens."""
    md = _views.md
    usd, source = device_price(doc["target"], per_chip)
    if not doc["plans"]:
        st.warning("**No plan compiled fits** the chips' memory. Try a smaller global batch, more devices, "
                   "or the optimizer's state on the host.")
    else:
        best = doc["plans"][0]
        st.success(md(f"Best: {best['mesh']} · {best['plan_text']} · per-device batch "
                      f"{best['per_device_batch']:g} × {best['microbatches']} accumulation step(s)"
                      + (" · optimizer state on the host" if best["optimizer_offload"] else "")
                      + f": compiled peak {human_bytes(best['peak_bytes'])} of "
                      f"{human_bytes(doc['hbm_bytes'])}, "
                      f"predicted {best['predicted_tokens_per_s_per_device']:,.0f} tokens/s per device."))
        st.dataframe(_table(doc["plans"], doc["devices"], usd, budget), hide_index=True, width="stretch",
                     key="plan_table")
    st.caption(md(f"Price: ${usd:.4g} a device-hour ({source})." if usd else f"Price: {source}."))
    pub = doc.get("published_row")
    if pub:
        st.markdown(md(f"**The published configuration** ({pub['name']}, `{pub['source']}`), compiled the "
                       "same way:"))
        same = [i for i, r in enumerate(doc["plans"], 1)
                if r.get("same_as") == f"the published configuration {pub['name']}"]
        if same:  # one compile, listed once
            st.caption(f"It is plan {same[0]} above: the same program, compiled once.")
        else:
            st.dataframe(_table([pub], doc["devices"], usd, budget), hide_index=True, width="stretch",
                         key="plan_published")
        a = doc.get("against_published")
        if a:
            said = {"beats": "beats", "matches": "matches", "below": "is below"}[a["verdict"]]
            st.caption("The top plan is the published configuration itself (the same program): it matches it."
                       if a["same_program"] else
                       f"The top plan {said} "
                       f"the published configuration: {a['ratio']:.3f}x its predicted tokens/s per device, "
                       f"against the step prediction's stated error of {a['step_error']:.0%}.")
    err, hand = doc["memory_model_error"], doc.get("instant_error") or {}
    st.caption(md(f"{doc['candidates_predicted']} candidates predicted, {doc['candidates_compiled']} "
                  f"compiled in {doc['wall_s']:.0f} s. The memory model's error on "
                  f"{err['compiled_candidates']} compiles, "
                  "each against what it said before the compile: "
                  + (f"at most {err['max']:.1%} (mean {err['mean']:.1%})." if err["max"] is not None
                     else "none was compiled.")
                  + (f" The estimate by hand shown before any compile was off by up to {hand['max']:.1%} "
                     f"(median {hand['median']:.1%}) on {hand['compiled_candidates']} compiles."
                     if hand.get("max") is not None else "")
                  + " Step times are predictions (nothing runs here)."))
    gaps = [r for r in doc["compiled_rows"] if r.get("estimate_gap")]
    for r in gaps[:3]:
        st.caption(md(f"Estimate and compile over 2x apart at {r['mesh']} · {r['plan_text']} · "
                      f"b{r['per_device_batch']:g}: {r['estimate_gap']}."))
    if doc.get("across"):
        st.markdown("**Side by side** (each accelerator's best plan):")
        rows = []
        for i, a in enumerate(doc["across"]):
            typed = per_chip if i == 0 else next(
                (p for t, n, p in also if (t, n) == (a["target"], a["devices"])), None)
            each, _ = device_price(a["target"], typed)
            tps = a["predicted_tokens_per_s_per_device"]
            c = cost(tps, a["devices"], each, budget)
            b = a["best"] or {}
            rows.append({"accelerator": f"{a['devices']} x {a['target']}",
                         "best plan": b.get("plan_text", "none fits"),
                         "mesh": b.get("mesh", ""), "tokens/s/device": round(tps or 0),
                         "tokens/s in all": round(a["predicted_tokens_per_s"] or 0),
                         "$ per device-hour": each, "$ per M tokens": c["usd_per_million_tokens"],
                         "days for the budget": c["days"], "$ for the budget": c["usd"]})
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", key="plan_across")
    if doc["plans"]:
        left, right = st.columns(2)
        left.markdown("MaxText's knobs for the best plan:")
        left.code(doc["plans"][0]["maxtext_yaml"], language="yaml", wrap_lines=True)
        right.markdown("The lab's compile of it:")
        right.code(doc["plans"][0]["run_command"], language="bash", wrap_lines=True)
    uncompiled = sum(not e.get("compiled") for e in doc["estimates"])
    with st.expander(f"Every candidate the model predicted ({len(doc['estimates'])}; {uncompiled} never "
                     "compiled: the model's figures, never ranked among the compiled plans above)"):
        st.dataframe(pd.DataFrame(doc["estimates"]), hide_index=True, width="stretch")
    with st.expander("Method"):
        st.markdown(md(doc["method"]))
        for note in doc["left_out"]:
            st.caption(md(f"Left out: {note}"))
