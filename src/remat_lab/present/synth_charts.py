"""The synthesizer's frame and figure: every plan compiled, peak vs recomputed flops, named policies too."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from remat_lab.present.palette import MIB, empty, figure, policy_color
from remat_lab.present.run_charts import titled

PLAN_COLOR = "#D55E00"


def _gflop(flops) -> float | None:
    return None if flops is None else flops / 1e9


def _plan_label(plan: dict) -> str:
    parts = [f"save {','.join(plan['save'])}" if plan["save"] else "",
             f"offload {','.join(plan['offload'])}" if plan["offload"] else ""]
    return ("; ".join(p for p in parts if p) or "recompute all") + f"; {plan['remat_layers']} layers"


def synthesis_frame(doc: dict) -> pd.DataFrame:
    """One row per compiled plan and per named policy: ``source`` (plan, named), ``label``,
    ``batch`` (global), ``peak_mib``, ``predicted_mib`` (plans), ``error_pct``, ``recomputed_gflop``,
    ``fits``, ``answer`` (the synthesis's answer, one row). A plan compiled twice at one batch (the
    solver's and the refinement's) is one row."""
    rows, seen = [], set()
    answer = doc.get("answer")
    marked = answer != "plan"  # the answer's row is marked once, at the answer's batch if listed there
    at_batch = any(c["plan"] == doc.get("plan") and c["max_batch"] == doc.get("max_batch")
                   for c in doc.get("candidates") or [])
    for c in doc.get("candidates") or []:
        label = _plan_label(c["plan"])
        if (label, c["max_batch"], c["peak_bytes"]) in seen:  # the same program found twice
            continue
        seen.add((label, c["max_batch"], c["peak_bytes"]))
        is_answer = (not marked and c["plan"] == doc.get("plan") and bool(c["fits"])
                     and (c["max_batch"] == doc.get("max_batch") or not at_batch))
        marked = marked or is_answer
        rows.append({"source": "plan", "label": label, "batch": c["max_batch"],
                     "peak_mib": c["peak_bytes"] / MIB, "predicted_mib": c["predicted_peak_bytes"] / MIB,
                     "error_pct": 100 * c["error_share"],
                     "recomputed_gflop": _gflop(c["recomputed_flops"]),
                     "fits": bool(c["fits"]), "answer": is_answer})
    for r in doc.get("named") or []:
        rows.append({"source": "named", "label": r["policy"], "batch": r["max_batch"],
                     "peak_mib": None if r["peak_bytes"] is None else r["peak_bytes"] / MIB,
                     "predicted_mib": None, "error_pct": None,
                     "recomputed_gflop": _gflop(r["recomputed_flops"]),
                     "fits": bool(r["fits"]), "answer": answer == r["policy"]})
    return pd.DataFrame(rows, columns=["source", "label", "batch", "peak_mib", "predicted_mib", "error_pct",
                                       "recomputed_gflop", "fits", "answer"])


def make_synthesis_figure(df: pd.DataFrame, budget_mib: float) -> go.Figure:
    """Compiled peak vs recomputed flops of every plan compiled (at its batch) and every named
    policy (at its own), the budget as a line; the answer a larger diamond."""
    scale, unit = (1024.0, "GiB") if budget_mib >= 1024 else (1.0, "MiB")
    fig = titled(figure("", "recomputed flops (GFLOP, vs no_remat)", f"compiled peak ({unit})"),
                 "Every plan compiled", "each point: one compiled program at its batch")
    df = df.dropna(subset=["peak_mib", "recomputed_gflop"]) if df is not None and not df.empty else df
    if df is None or df.empty:
        return empty(fig)
    plans, named = df[df["source"] == "plan"], df[df["source"] == "named"]
    if not plans.empty:
        fig.add_trace(go.Scatter(
            x=plans["recomputed_gflop"], y=plans["peak_mib"] / scale, mode="markers",
            name="synthesized plans", marker=dict(size=10, color=PLAN_COLOR),
            customdata=list(zip(plans["label"], plans["batch"], plans["error_pct"], strict=True)),
            hovertemplate=("%{customdata[0]}<br>batch %{customdata[1]}: %{y:.3f} " + unit
                           + ", %{x:.4g} GFLOP recomputed<br>model error %{customdata[2]:+.1f} %"
                           "<extra></extra>")))
    for _, r in named.iterrows():
        fig.add_trace(go.Scatter(
            x=[r["recomputed_gflop"]], y=[r["peak_mib"] / scale], mode="markers", name=str(r["label"]),
            marker=dict(size=9, symbol="circle-open", color=policy_color(r["label"]), line=dict(width=2)),
            hovertemplate=(f"{r['label']}<br>batch {r['batch']}: %{{y:.3f}} {unit}, %{{x:.4g}} GFLOP "
                           "recomputed<extra></extra>")))
    best = df[df["answer"]]
    if not best.empty:
        fig.add_trace(go.Scatter(
            x=best["recomputed_gflop"], y=best["peak_mib"] / scale, mode="markers", name="the answer",
            marker=dict(symbol="diamond", size=16, color=PLAN_COLOR, line=dict(width=1, color="#222")),
            hovertemplate=f"the answer: %{{y:.3f}} {unit}, %{{x:.4g}} GFLOP<extra></extra>"))
    fig.add_hline(y=budget_mib / scale, line=dict(color="#B91C1C", dash="dash", width=2),
                  annotation_text=f"budget {budget_mib / scale:,.1f} {unit}",
                  annotation_position="top left", annotation_font=dict(color="#B91C1C"))
    return fig
