"""Policies across targets: the grouped peak chart, the targets' labels and the ranking lesson in words.

DataFrame in (``tables.across_targets_frame``), ``go.Figure`` or text out; no Streamlit, no JAX.
"""

from __future__ import annotations

import itertools

import pandas as pd
import plotly.graph_objects as go

from remat_lab.config import LOCAL, get_target
from remat_lab.present.palette import MIB, empty, figure, policy_color

CLEAR = 0.01  # two peaks closer than 1 % of the larger are not called a ranking


def target_name(name: str) -> str:
    """``h100`` -> ``H100``, ``tpu-v5e`` -> ``TPU v5e``, ``a100-80g`` -> ``A100 80G``."""
    if name == LOCAL:
        return "local"
    return f"TPU {name[4:]}" if name.startswith("tpu-") else name.upper().replace("-", " ")


def target_label(name: str) -> str:
    """The sidebar's label: ``H100 (79 GiB, compile only)``; local is run and timed."""
    if name == LOCAL:
        return "local (this machine: run and timed)"
    return f"{target_name(name)} ({get_target(name).memory_bytes / 2**30:.0f} GiB, compile only)"


def make_targets_peak_figure(df: pd.DataFrame) -> go.Figure:
    """Compiled peak per policy, grouped by target: ``df`` columns target, policy, peak_mib
    (or peak_bytes); one colour per policy, the legend under the plot (long policy names)."""
    fig = figure("Compiled peak memory per target", "target", "compiled peak per device (MiB)")
    fig.update_layout(barmode="group", margin=dict(l=60, r=20, t=60, b=40), height=440,
                      legend=dict(orientation="h", yanchor="top", y=-0.16, x=0, xanchor="left",
                                  title_text="policy  "))
    if df is None or df.empty:
        return empty(fig)
    mib = df["peak_mib"] if "peak_mib" in df else df["peak_bytes"] / MIB
    df = df.assign(peak_mib=mib, label=df["target"].map(target_name))
    for policy, part in df.groupby("policy", sort=False):
        fig.add_trace(go.Bar(
            x=part["label"], y=part["peak_mib"], name=str(policy), marker_color=policy_color(policy),
            text=[f"{v:,.1f}" for v in part["peak_mib"]], textposition="outside", cliponaxis=False,
            hovertemplate="%{x}: %{y:,.2f} MiB<extra>%{fullData.name}</extra>"))
    return fig


def _orders(df: pd.DataFrame) -> dict[str, list[tuple[str, float]]]:
    """Per target (in the frame's order): (policy, peak bytes), smallest first."""
    df = df.dropna(subset=["peak_bytes"])
    return {t: sorted(zip(part["policy"], part["peak_bytes"]), key=lambda pb: (pb[1], pb[0]))
            for t, part in df.groupby("target", sort=False)}


def _flips(orders: dict) -> list[tuple]:
    """(a, b, t1, t2): a is clearly smaller than b on t1 and clearly larger on t2."""
    peaks = {t: dict(o) for t, o in orders.items()}
    out = []
    for t1, t2 in itertools.permutations(peaks, 2):
        for a, b in itertools.permutations(peaks[t1], 2):
            if b not in peaks[t2] or a not in peaks[t2]:
                continue
            x1, y1, x2, y2 = peaks[t1][a], peaks[t1][b], peaks[t2][a], peaks[t2][b]
            if y1 - x1 > CLEAR * max(x1, y1) and x2 - y2 > CLEAR * max(x2, y2):
                out.append((a, b, t1, t2))
    return out


def ranking_text(df: pd.DataFrame) -> str:
    """Each target's policies by compiled peak, smallest first: ``local: a < b ≈ c`` (≈: within 1 %)."""
    lines = []
    for t, order in _orders(df).items():
        text = order[0][0]
        for (_, p0), (name, p1) in zip(order, order[1:]):
            text += f" {'=' if p1 == p0 else '≈' if p1 - p0 <= CLEAR * p1 else '<'} {name}"
        lines.append(f"{target_name(t)}: {text}")
    return "; ".join(lines)


def ranking_lesson(df: pd.DataFrame) -> str | None:
    """The lesson when the policies' order by compiled peak differs between targets, else None."""
    if df is None or df.empty:
        return None
    flips = _flips(_orders(df))
    if not flips:
        return None
    a, b, t1, t2 = flips[0]
    peak = df.set_index(["target", "policy"])["peak_bytes"] / MIB
    return (f"**The ranking of policies by compiled peak changes between targets.** {a} needs less "
            f"than {b} on {target_name(t1)} ({peak[(t1, a)]:,.1f} vs {peak[(t1, b)]:,.1f} MiB) but "
            f"more on {target_name(t2)} ({peak[(t2, a)]:,.1f} vs {peak[(t2, b)]:,.1f} MiB): XLA "
            "schedules, fuses and lays out the same step differently for each backend, so the "
            "policy that saves the most memory on one machine need not on another. Compile for "
            "the accelerator you train on before choosing. Smallest peak first — "
            f"{ranking_text(df)}.")
