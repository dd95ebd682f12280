"""Charts of one run and of a comparison of policies: step times, memory, residuals, Pareto front, roofline.

DataFrame in (``tables``' frames), ``go.Figure`` out; an empty frame gives a "no data" figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from remat_lab.present.palette import KIND_COLORS, MEMORY_COLORS, empty, figure, policy_color


def make_step_time_figure(df: pd.DataFrame) -> go.Figure:
    """Distribution of timed runs: ``df`` columns policy, run, ms (one box per policy)."""
    fig = figure("Step time of the timed runs", "policy", "step time (ms)")
    if df is None or df.empty:
        return empty(fig)
    for policy, part in df.groupby("policy", sort=False):
        fig.add_trace(go.Box(
            y=part["ms"], name=str(policy), boxpoints="all", jitter=0.4, pointpos=0,
            marker_color=policy_color(policy), customdata=part["run"],
            hovertemplate="run %{customdata}: %{y:.4f} ms<extra>%{fullData.name}</extra>"))
    fig.update_layout(showlegend=False)
    return fig


def make_memory_figure(df: pd.DataFrame) -> go.Figure:
    """Stacked memory parts per policy with the peak marked.

    ``df`` columns: policy, argument, output, temp, alias, generated_code, peak_mib (MiB). Alias
    is drawn below zero because peak = generated_code + argument + output - alias + temp.
    """
    fig = figure("Compiled memory (XLA memory analysis)", "policy", "memory (MiB)")
    if df is None or df.empty:
        return empty(fig)
    for part in ("argument", "output", "temp", "generated_code", "alias"):
        sign = -1 if part == "alias" else 1
        fig.add_trace(go.Bar(
            x=df["policy"], y=sign * df[part], name=part.replace("_", " "),
            marker_color=MEMORY_COLORS[part], customdata=df[part],
            hovertemplate=f"{part}: %{{customdata:.4f}} MiB<extra>%{{x}}</extra>"))
    fig.add_trace(go.Scatter(
        x=df["policy"], y=df["peak_mib"], mode="markers+text", name="peak",
        marker=dict(symbol="line-ew-open", size=40, line=dict(width=3, color="#222")),
        text=[f"peak {v:.3f} MiB" for v in df["peak_mib"]] if len(df) == 1 else None,
        textposition="top center",
        hovertemplate="peak: %{y:.4f} MiB<extra>%{x}</extra>"))
    fig.update_layout(barmode="relative")
    return fig


def make_residuals_figure(df: pd.DataFrame) -> go.Figure:
    """Residual bytes by layer, stacked by kind: ``df`` columns layer, kind, bytes, mib."""
    fig = figure("Residuals kept for the backward pass", "layer", "residual memory (MiB)")
    if df is None or df.empty:
        return empty(fig)
    for kind, part in df.groupby("kind", sort=False):
        fig.add_trace(go.Bar(
            x=part["layer"], y=part["mib"], name=str(kind),
            marker_color=KIND_COLORS.get(kind, "#999"), customdata=part["bytes"],
            hovertemplate="%{customdata:,} bytes (%{y:.4f} MiB)<extra>" + str(kind) + "</extra>"))
    fig.update_layout(barmode="stack")
    return fig


def _interval(df: pd.DataFrame) -> tuple[str, str, str] | None:
    """The interval columns of ``df`` and how to name them: the bootstrap interval, else p25-p75."""
    if {"ci_low_ms", "ci_high_ms"} <= set(df.columns):
        return "ci_low_ms", "ci_high_ms", "95 % interval of the median"
    if {"p25_ms", "p75_ms"} <= set(df.columns):
        return "p25_ms", "p75_ms", "p25-p75"
    return None


def _same_as(row: pd.Series) -> str:
    other = row.get("same_program_as")
    return f"<br>same compiled program as {other}" if isinstance(other, str) and other else ""


def make_time_bars_figure(df: pd.DataFrame) -> go.Figure:
    """Median step time per policy with error bars, named in the title.

    ``df`` columns: policy, median_ms and either ci_low_ms, ci_high_ms (the bootstrap interval of
    the median; preferred) or p25_ms, p75_ms; optional same_program_as (shown on hover).
    """
    band = _interval(df) if df is not None else None
    fig = figure("Step time per policy (median" + (f", bars: {band[2]})" if band else ")"),
                  "policy", "step time (ms)")
    if df is None or df.empty:
        return empty(fig)
    for _, row in df.iterrows():
        bar = dict(x=[row["policy"]], y=[row["median_ms"]], name=str(row["policy"]),
                   marker_color=policy_color(row["policy"]))
        if band:
            lo, hi, label = band
            bar["error_y"] = dict(type="data", symmetric=False, array=[row[hi] - row["median_ms"]],
                                  arrayminus=[row["median_ms"] - row[lo]])
            bar["customdata"] = [[row[lo], row[hi]]]
            bar["hovertemplate"] = (f"median %{{y:.4f}} ms<br>{label}: %{{customdata[0]:.4f}} to "
                                    f"%{{customdata[1]:.4f}} ms{_same_as(row)}<extra>%{{x}}</extra>")
        else:
            bar["hovertemplate"] = f"median %{{y:.4f}} ms{_same_as(row)}<extra>%{{x}}</extra>"
        fig.add_trace(go.Bar(**bar))
    fig.update_layout(barmode="group", showlegend=False)
    return fig


def make_pareto_figure(df: pd.DataFrame, front: pd.Series | None = None) -> go.Figure:
    """Step time vs peak memory, one point per policy; the Pareto front ringed.

    ``df`` columns policy, median_ms, peak_mib, optionally ci_low_ms and ci_high_ms (drawn as
    vertical error bars); ``front`` a boolean mask of the front's rows. The front's points get a
    black ring (trace "Pareto front"); with two or more of them a dashed staircase joins them in
    order of peak memory. Nothing else is drawn for the front.
    """
    fig = figure("Step time vs peak memory",
                  "peak memory (MiB)", "step time (ms)")
    if df is None or df.empty:
        return empty(fig)
    band = _interval(df)
    for _, row in df.iterrows():
        point = dict(x=[row["peak_mib"]], y=[row["median_ms"]], mode="markers", name=str(row["policy"]),
                     marker=dict(size=12, color=policy_color(row["policy"]),
                                 line=dict(width=1, color="#222")),
                     hovertemplate=f"%{{x:.4f}} MiB, median %{{y:.4f}} ms{_same_as(row)}"
                                   "<extra>%{fullData.name}</extra>")
        if band:
            lo, hi, _ = band
            point["error_y"] = dict(type="data", symmetric=False, array=[row[hi] - row["median_ms"]],
                                    arrayminus=[row["median_ms"] - row[lo]],
                                    color=policy_color(row["policy"]))
        fig.add_trace(go.Scatter(**point))
    if front is not None and front.any():
        pts = df[front.to_numpy()].sort_values(["peak_mib", "median_ms"])
        fig.add_trace(go.Scatter(
            x=pts["peak_mib"], y=pts["median_ms"], mode="lines+markers" if len(pts) > 1 else "markers",
            name="Pareto front", line=dict(color="#222", dash="dash", shape="hv"),
            marker=dict(symbol="circle-open", size=22, color="#222", line=dict(width=2)),
            hoverinfo="skip"))
    return fig


def _rate_unit(top: float) -> tuple[str, float]:
    """A FLOP/s unit for values up to ``top``: (name, divisor)."""
    for name, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if top >= scale:
            return name, scale
    return "FLOP/s", 1.0


def make_roofline_figure(df: pd.DataFrame, peak_flops_per_s: float,
                         bandwidth_bytes_per_s: float) -> go.Figure:
    """Achieved FLOP/s against arithmetic intensity under the device's two roofs (log-log).

    ``df`` columns: policy, arithmetic_intensity (FLOP/byte), achieved_flops_per_s. The roofs are
    the memory slope (bandwidth x intensity) up to the ridge and the compute ceiling (peak) after
    it; a roof whose figure is missing is not drawn. Rows without a positive intensity and rate
    cannot sit on log axes and are left out.
    """
    peak = peak_flops_per_s if peak_flops_per_s and peak_flops_per_s > 0 else None
    bw = bandwidth_bytes_per_s if bandwidth_bytes_per_s and bandwidth_bytes_per_s > 0 else None
    points = pd.DataFrame() if df is None or df.empty else df[
        (pd.to_numeric(df["arithmetic_intensity"], errors="coerce") > 0)
        & (pd.to_numeric(df["achieved_flops_per_s"], errors="coerce") > 0)]
    top = max([peak or 0.0, *([] if points.empty else points["achieved_flops_per_s"].tolist())])
    unit, scale = _rate_unit(top)
    fig = figure("Roofline: achieved FLOP/s vs arithmetic intensity",
                  "arithmetic intensity (FLOP/byte, XLA bytes accessed)", f"achieved ({unit})")
    if points.empty:
        return empty(fig)
    ridge = peak / bw if peak and bw else None
    xs = [*points["arithmetic_intensity"].astype(float), *([ridge] if ridge else [])]
    x_lo, x_hi = min(xs) / 10, max(xs) * 10
    if bw:
        x_end = ridge if ridge else x_hi
        fig.add_trace(go.Scatter(
            x=[x_lo, x_end], y=[bw * x_lo / scale, bw * x_end / scale], mode="lines",
            name=f"memory roof {bw / 1e9:.4g} GB/s", line=dict(color="#222", width=2),
            hovertemplate=f"{bw:,.0f} bytes/s x %{{x:.4g}} FLOP/byte = %{{y:.4g}} {unit}<extra></extra>"))
    if peak:
        x_start = ridge if ridge else x_lo
        fig.add_trace(go.Scatter(
            x=[x_start, x_hi], y=[peak / scale] * 2, mode="lines",
            name=f"compute roof {peak / scale:.4g} {unit}", line=dict(color="#222", width=2, dash="dash"),
            hovertemplate=f"peak {peak:,.0f} FLOP/s (%{{y:.4g}} {unit})<extra></extra>"))
    for policy, part in points.groupby("policy", sort=False):
        rate = part["achieved_flops_per_s"].astype(float)
        custom = np.column_stack([rate, rate / peak if peak else np.full(len(rate), np.nan)])
        fig.add_trace(go.Scatter(
            x=part["arithmetic_intensity"], y=rate / scale, mode="markers", name=str(policy),
            marker=dict(size=12, color=policy_color(policy), line=dict(width=1, color="#222")),
            customdata=custom,
            hovertemplate=("intensity %{x:.4g} FLOP/byte<br>achieved %{customdata[0]:,.0f} FLOP/s "
                           f"(%{{y:.4g}} {unit})" + ("<br>%{customdata[1]:.1%} of peak" if peak else "")
                           + "<extra>%{fullData.name}</extra>")))
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    fig.update_layout(height=440)
    return fig
