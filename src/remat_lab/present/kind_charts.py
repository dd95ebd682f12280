"""What fills the memory at the compiled peak, by kind (parameters, optimizer state, ...): stacked bars."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from remat_lab.present.palette import empty, figure
from remat_lab.present.run_charts import legend_outside, titled

KIND_LABELS = {"parameters": "parameters", "optimizer_state": "optimizer state",
               "gradients": "gradients", "activations": "activations", "logits": "logits",
               "other": "other"}
BY_KIND_COLORS = {"parameters": "#0072B2", "optimizer_state": "#56B4E9", "gradients": "#009E73",
                  "activations": "#E69F00", "logits": "#D55E00", "other": "#BBBBBB"}


def _unit(largest: float) -> tuple[float, str]:
    return (float(1 << 30), "GiB") if largest >= (1 << 30) else (float(1 << 20), "MiB")


def make_memory_by_kind_figure(df: pd.DataFrame) -> go.Figure:
    """Horizontal stacked bars of ``df`` (columns ``run``, ``kind``, ``bytes``; one bar per run),
    in MiB or GiB by the largest bar, each segment labelled when wide enough, the legend between
    the title and the bars."""
    fig = titled(figure("", "", ""), "Memory by kind", "at the compiled peak")
    fig.update_layout(margin=dict(l=20, r=20, t=76), barmode="stack", legend=dict(traceorder="normal"))
    if df is None or df.empty or df["bytes"].sum() <= 0:
        fig.update_xaxes(title_text="bytes")
        return empty(fig)
    totals = df.groupby("run", sort=False)["bytes"].sum()
    scale, unit = _unit(float(totals.max()))
    runs = list(totals.index)
    for kind in [k for k in KIND_LABELS if k in set(df["kind"])]:
        part = df[df["kind"] == kind].set_index("run").reindex(runs)["bytes"].fillna(0) / scale
        share = part * scale / totals
        fig.add_bar(y=runs, x=part.values, orientation="h", name=KIND_LABELS[kind],
                    marker_color=BY_KIND_COLORS[kind],
                    text=[f"{v:,.2f}" if s >= 0.06 else "" for v, s in zip(part.values, share.values)],
                    textposition="inside", insidetextanchor="middle",
                    customdata=(share * 100).values,
                    hovertemplate=f"{KIND_LABELS[kind]}: %{{x:,.3f}} {unit} (%{{customdata:.1f}} %)"
                                  "<extra>%{y}</extra>")
    fig.update_xaxes(title_text=f"{unit} at the compiled peak")
    fig.update_yaxes(automargin=True, showticklabels=len(runs) > 1)
    fig.update_layout(height=230 + 50 * len(runs))
    # Under the bars, three entries a row (a legend above wrapped into the title at 1024 px).
    return legend_outside(fig, len(fig.data), "below", per_row=3)
