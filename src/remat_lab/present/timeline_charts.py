"""Charts of memory over the program: one run's live bytes by phase, and several policies overlaid.

DataFrame in (``tables.timeline_frame``, ``tables.timeline_overlay_frame``), ``go.Figure`` out.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from remat_lab.present.palette import MIB, PHASE_COLORS, empty, figure, policy_color

PHASES_CAPTION = ("Phases: parameter and output are the step's arguments and results; recomputed is "
                  "only what the program does more than no_remat's compile of the same "
                  "configuration (the witness; an identical program has none), forward and backward "
                  "the pass the value belongs to. The grey \"other\" band is memory whose value has "
                  "no source in the program's metadata: XLA's unnamed copies, loop counters, "
                  "constants.")


def make_timeline_figure(df: pd.DataFrame, peak_index: int | None = None,
                         peak_bytes: float | None = None) -> go.Figure:
    """Live bytes over XLA's schedule, stacked by phase, the peak marked.

    ``df`` columns index (instruction index in the schedule), phase, bytes (see
    ``tables.timeline_frame``): one filled trace per phase, drawn as steps (a value holds until the
    next instruction). The peak gets a dashed vertical line at ``peak_index`` and a label with
    ``peak_bytes``. Hover names the instruction index and each phase's bytes.
    """
    fig = figure("Memory over the program (live bytes by phase)", "instruction (XLA's schedule)",
                  "live memory (MiB)")
    if df is None or df.empty:
        return empty(fig)
    for phase, part in df.groupby("phase", sort=False):
        color = PHASE_COLORS.get(phase, PHASE_COLORS["other"])
        fig.add_trace(go.Scatter(
            x=part["index"], y=part["bytes"] / MIB, name=str(phase), mode="lines", stackgroup="live",
            line=dict(width=0.5, color=color, shape="hv"), fillcolor=color, customdata=part["bytes"],
            hovertemplate=f"{phase}: %{{customdata:,.0f}} bytes (%{{y:.3f}} MiB)<extra></extra>"))
    if peak_index is not None:
        label = "peak" + (f" {peak_bytes / MIB:.2f} MiB" if peak_bytes is not None else "")
        fig.add_vline(x=peak_index, line=dict(color="#222", width=1.5, dash="dash"))
        fig.add_annotation(x=peak_index, y=1, yref="paper", text=f"{label} at instruction {peak_index}",
                           showarrow=False, xanchor="right" if peak_index > df["index"].median() else "left",
                           yanchor="bottom", font=dict(size=12, color="#222"))
    fig.update_layout(hovermode="x unified")
    fig.update_xaxes(hoverformat="d")
    return fig


def make_timeline_overlay_figure(df: pd.DataFrame) -> go.Figure:
    """Total live bytes over the program, one line per policy, each policy's peak marked.

    ``df`` columns policy, fraction (instruction index / program length, 0 to 1), live_bytes (see
    ``tables.timeline_overlay_frame``), optionally label (the legend's name for the policy's line,
    e.g. the policies that share its compiled program); x is the fraction so that programs of
    different lengths line up.
    """
    fig = figure("Memory over the program, per policy", "fraction of the program (XLA's schedule)",
                  "live memory (MiB)")
    if df is None or df.empty:
        return empty(fig)
    for policy, part in df.groupby("policy", sort=False):
        color = policy_color(policy)
        name = str(part["label"].iloc[0]) if "label" in part else str(policy)
        fig.add_trace(go.Scatter(
            x=part["fraction"], y=part["live_bytes"] / MIB, name=name, mode="lines",
            legendgroup=str(policy), line=dict(color=color, width=2, shape="hv"),
            customdata=part["live_bytes"],
            hovertemplate="%{x:.1%} of the program: %{customdata:,.0f} bytes (%{y:.3f} MiB)"
                          "<extra>%{fullData.name}</extra>"))
        top = part.loc[part["live_bytes"].idxmax()]
        fig.add_trace(go.Scatter(
            x=[top["fraction"]], y=[top["live_bytes"] / MIB], mode="markers", name=f"{policy} peak",
            legendgroup=str(policy), showlegend=False,
            marker=dict(size=10, color=color, symbol="diamond", line=dict(width=1, color="#222")),
            hovertemplate="peak %{y:.3f} MiB at %{x:.1%} of the program<extra>" + str(policy) + "</extra>"))
    fig.update_xaxes(range=[0, 1], tickformat=".0%")
    fig.update_yaxes(rangemode="tozero")
    # The legend below the plot: a label naming several policies is long.
    fig.update_layout(legend=dict(orientation="h", x=0, xanchor="left", y=-0.2, yanchor="top"),
                      height=460, margin=dict(l=60, r=20, t=60, b=40))
    return fig
