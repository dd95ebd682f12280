"""Plotly figures for the app: DataFrame in, ``go.Figure`` out.

No Streamlit and no JAX here. Every builder accepts an empty frame (it returns a figure with a
"no data" note). ``POLICY_COLORS`` gives every policy one colour used on every chart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

POLICY_COLORS = {
    "no_remat": "#4C566A",
    "nnx_remat_default": "#E69F00",
    "nothing_saveable": "#D55E00",
    "everything_saveable": "#56B4E9",
    "dots_saveable": "#009E73",
    "dots_with_no_batch_dims_saveable": "#0072B2",
    "offload_dot_with_no_batch_dims": "#CC79A7",
    # MaxText's recipes and custom: Plotly's Dark24 and Alphabet hues, distinct from the above.
    "full": "#2E91E5",
    "minimal": "#1CA71C",
    "minimal_with_context": "#FB0D0D",
    "save_dot_with_context_except_mlp": "#DA16FF",
    "save_dot_except_mlpwi": "#222A2A",
    "save_dot_except_mlp": "#B68100",
    "save_qkv_proj": "#750D86",
    "save_out_proj": "#EB663B",
    "qkv_proj_offloaded": "#511CFB",
    "minimal_offloaded": "#00A08B",
    "custom": "#FC0080",
}
MEMORY_COLORS = {"argument": "#0072B2", "output": "#56B4E9", "temp": "#E69F00",
                 "alias": "#999999", "generated_code": "#009E73"}
KIND_COLORS = {"argument": "#8FA9C7", "dot_general": "#0072B2"}
_FALLBACK = ["#F0E442", "#7F3C8D", "#11A579", "#3969AC", "#F2B701", "#E73F74"]
PAGE_LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=50),
                   legend=dict(orientation="v", yanchor="top", y=1, x=1.02, font=dict(size=11)),
                   title=dict(font=dict(size=15)), height=400)


def policy_color(policy: str) -> str:
    """The colour of ``policy`` (a stable fallback for unknown ids)."""
    return POLICY_COLORS.get(policy) or _FALLBACK[sum(map(ord, str(policy))) % len(_FALLBACK)]


def _figure(title: str, x_title: str, y_title: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(**PAGE_LAYOUT)
    fig.update_layout(title_text=title)
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title)
    return fig


def _empty(fig: go.Figure) -> go.Figure:
    fig.add_annotation(text="no data yet", showarrow=False, xref="paper", yref="paper",
                       x=0.5, y=0.5, font=dict(size=16, color="#888"))
    return fig


def make_step_time_figure(df: pd.DataFrame) -> go.Figure:
    """Distribution of timed runs: ``df`` columns policy, run, ms (one box per policy)."""
    fig = _figure("Step time of the timed runs", "policy", "step time (ms)")
    if df is None or df.empty:
        return _empty(fig)
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
    fig = _figure("Compiled memory (XLA memory analysis)", "policy", "memory (MiB)")
    if df is None or df.empty:
        return _empty(fig)
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
    fig = _figure("Residuals kept for the backward pass", "layer", "residual memory (MiB)")
    if df is None or df.empty:
        return _empty(fig)
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
    fig = _figure("Step time per policy (median" + (f", bars: {band[2]})" if band else ")"),
                  "policy", "step time (ms)")
    if df is None or df.empty:
        return _empty(fig)
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
    fig = _figure("Step time vs peak memory",
                  "peak memory (MiB)", "step time (ms)")
    if df is None or df.empty:
        return _empty(fig)
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


def make_sweep_figure(df: pd.DataFrame, x: str, y: str, y_title: str) -> go.Figure:
    """One line per policy (and per value of the other axis) of ``y`` against ``x``.

    ``x`` is "width" or "batch"; the other of the two picks the line dash. The legend, below the
    plot so that the plot keeps the chart's width, has one entry per policy (its colour; a click
    hides all its lines) and, when there are several, one per value of the other axis (its dash).
    """
    other = "batch" if x == "width" else "width"
    fig = _figure(f"{y_title} vs {x}", x, y_title)
    if df is None or df.empty:
        return _empty(fig)
    dashes = ["solid", "dot", "dash", "longdash", "dashdot", "longdashdot"]
    others = sorted(df[other].unique())
    policies = list(dict.fromkeys(df["policy"]))
    for policy, part in df.groupby("policy", sort=False):
        for i, val in enumerate(others):
            sub = part[part[other] == val].sort_values(x)
            if sub.empty:
                continue
            fig.add_trace(go.Scatter(
                x=sub[x], y=sub[y], mode="lines+markers", legendgroup=str(policy), showlegend=False,
                name=f"{policy}, {other} {val}" if len(others) > 1 else str(policy),
                line=dict(color=policy_color(policy), dash=dashes[i % len(dashes)], width=2.5),
                marker=dict(size=8),
                hovertemplate=f"{x} %{{x}}: %{{y:.4f}}<extra>%{{fullData.name}}</extra>"))
    for policy in policies:  # the legend: colour = policy
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines+markers", name=str(policy),
                                 legendgroup=str(policy), line=dict(color=policy_color(policy), width=2.5),
                                 hoverinfo="skip"))
    if len(others) > 1:  # and dash = the other axis
        for i, val in enumerate(others):
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"{other} {val}",
                                     legendgroup=f"{other} {val}", hoverinfo="skip",
                                     line=dict(color="#6B7280", dash=dashes[i % len(dashes)], width=2.5)))
    if (df[x] > 0).all():
        fig.update_xaxes(type="log", tickvals=sorted(df[x].unique()))
    entries = len(policies) + (len(others) if len(others) > 1 else 0)
    fig.update_layout(height=400 + 22 * ((entries + 1) // 2), font=dict(size=13),
                      legend=dict(orientation="h", x=0, xanchor="left", y=-0.18, yanchor="top",
                                  font=dict(size=12)),
                      margin=dict(l=60, r=20, t=60, b=40))
    return fig


def make_relative_heatmap_figure(df: pd.DataFrame, title: str, baseline: str = "no_remat") -> go.Figure:
    """Each policy's metric relative to ``baseline``: ``df`` columns policy, config, ratio and
    optionally within_noise (see ``tables.relative_frame``; without it only a ratio of exactly 1
    counts as no difference).

    Every cell is annotated with its ratio. Cells within the noise are grey; the others are
    coloured on log2(ratio), so 2x slower and 2x faster are equally strong, on a scale of at least
    0.67x..1.5x so that small differences stay pale. One row is 46 px high.
    """
    grey = "#E5E7EB"
    fig = _figure(title, "configuration (width, batch)", "")
    if df is None or df.empty:
        return _empty(fig)
    table = df.pivot_table(index="policy", columns="config", values="ratio", sort=False)
    if "within_noise" in df:
        flags = df.assign(within_noise=df["within_noise"].fillna(False).astype(int))
        noise = flags.pivot_table(index="policy", columns="config", values="within_noise",
                                  aggfunc="max", sort=False).reindex_like(table).fillna(0) > 0
    else:
        noise = table == 1.0
    order = [baseline] * (baseline in table.index) + [p for p in table.index if p != baseline]
    table, noise = table.loc[order], noise.loc[order]
    ratios = table.to_numpy(dtype=float)
    quiet = noise.to_numpy(dtype=bool) & np.isfinite(ratios)
    z = np.log2(np.where(ratios > 0, ratios, np.nan))
    loud = np.where(quiet, np.nan, z)
    bound = max(float(np.nanmax(np.abs(loud))) if np.isfinite(loud).any() else 0.0, np.log2(1.5))
    ticks = [r for r in (0.25, 0.5, 0.67, 1.0, 1.5, 2.0, 4.0) if abs(np.log2(r)) <= bound + 1e-9]
    xs, ys = list(table.columns), list(table.index)
    hover = "%{y} at %{x}: %{customdata:.3f}x " + baseline
    fig.add_trace(go.Heatmap(
        z=loud, x=xs, y=ys, colorscale="RdBu_r", zmid=0, zmin=-bound, zmax=bound, customdata=ratios,
        xgap=2, ygap=2, hoverongaps=False, hovertemplate=hover + "<extra></extra>",
        colorbar=dict(title=dict(text=f"x {baseline}", side="top"), tickvals=[np.log2(r) for r in ticks],
                      ticktext=[f"{r:g}x" for r in ticks], thickness=14, len=1.0)))
    fig.add_trace(go.Heatmap(
        z=np.where(quiet, 0.0, np.nan), x=xs, y=ys, customdata=ratios, name="within noise",
        colorscale=[[0, grey], [1, grey]], showscale=False, xgap=2, ygap=2,
        hoverongaps=False, hovertemplate=hover + " (within the noise)<extra></extra>"))
    for i, policy in enumerate(ys):
        for j, config in enumerate(xs):
            if not np.isfinite(ratios[i, j]):
                continue
            strong = not quiet[i, j] and abs(z[i, j]) > 0.6 * bound
            fig.add_annotation(x=config, y=policy, text=f"{ratios[i, j]:.2f}x", showarrow=False,
                               font=dict(size=13, color="#6B7280" if quiet[i, j]
                                         else ("white" if strong else "#111827")))
    fig.update_layout(height=150 + 46 * len(ys), margin=dict(l=20, r=20, t=60, b=60),
                      font=dict(size=13))
    fig.update_yaxes(autorange="reversed", automargin=True, tickfont=dict(size=13), title_text="")
    fig.update_xaxes(automargin=True, tickfont=dict(size=13), type="category")
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
    fig = _figure("Roofline: achieved FLOP/s vs arithmetic intensity",
                  "arithmetic intensity (FLOP/byte, XLA bytes accessed)", f"achieved ({unit})")
    if points.empty:
        return _empty(fig)
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


# ---------------------------------------------------------------- memory over the program

PHASE_COLORS = {"parameter": "#8FA9C7", "output": "#56B4E9", "forward": "#0072B2",
                "recomputed": "#D55E00", "backward": "#009E73", "other": "#BBBBBB"}
MIB = float(1 << 20)


def make_timeline_figure(df: pd.DataFrame, peak_index: int | None = None,
                         peak_bytes: float | None = None) -> go.Figure:
    """Live bytes over XLA's schedule, stacked by phase, the peak marked.

    ``df`` columns index (instruction index in the schedule), phase, bytes (see
    ``tables.timeline_frame``): one filled trace per phase, drawn as steps (a value holds until the
    next instruction). The peak gets a dashed vertical line at ``peak_index`` and a label with
    ``peak_bytes``. Hover names the instruction index and each phase's bytes.
    """
    fig = _figure("Memory over the program (live bytes by phase)", "instruction (XLA's schedule)",
                  "live memory (MiB)")
    if df is None or df.empty:
        return _empty(fig)
    for phase, part in df.groupby("phase", sort=False):
        color = PHASE_COLORS.get(phase, "#999")
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
    fig = _figure("Memory over the program, per policy", "fraction of the program (XLA's schedule)",
                  "live memory (MiB)")
    if df is None or df.empty:
        return _empty(fig)
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


def make_advice_peak_figure(df: pd.DataFrame, budget_mib: float) -> go.Figure:
    """Compiled peak vs batch per policy, the budget as a line: the advisor's probes.

    ``df`` columns policy, batch, peak_mib, fits, answer (``tables.advice_probes_frame``). Each
    probe is a point (hollow where it did not fit); each policy's answer, its largest batch that
    fits, is a larger diamond. The batch axis is logarithmic when the probes span a wide range.
    """
    fig = _figure("Compiled peak memory vs batch (each point: one compile)", "batch",
                  "compiled peak (MiB)")
    if df is None or df.empty:
        return _empty(fig)
    for policy, part in df.sort_values("batch").groupby("policy", sort=False):
        color = policy_color(policy)
        fig.add_trace(go.Scatter(
            x=part["batch"], y=part["peak_mib"], mode="lines+markers", name=str(policy),
            legendgroup=str(policy), line=dict(color=color, width=1.5),
            marker=dict(size=8, color=[color if f else "white" for f in part["fits"]],
                        line=dict(width=1.5, color=color)),
            customdata=np.where(part["fits"], "fits", "over the budget"),
            hovertemplate="batch %{x}: %{y:.3f} MiB, %{customdata}<extra>%{fullData.name}</extra>"))
        best = part[part["answer"]]
        if not best.empty:
            fig.add_trace(go.Scatter(
                x=best["batch"], y=best["peak_mib"], mode="markers", legendgroup=str(policy),
                showlegend=False, name=f"{policy}: largest batch",
                marker=dict(symbol="diamond", size=14, color=color, line=dict(width=1, color="#222")),
                hovertemplate="largest batch %{x}: %{y:.3f} MiB<extra>%{fullData.name}</extra>"))
    fig.add_hline(y=budget_mib, line=dict(color="#B91C1C", dash="dash", width=2),
                  annotation_text=f"budget {budget_mib:,.1f} MiB", annotation_position="top left",
                  annotation_font=dict(color="#B91C1C"))
    if df["batch"].max() > 16 * max(df["batch"].min(), 1):
        fig.update_xaxes(type="log")
    return fig


def make_advice_throughput_figure(df: pd.DataFrame, recommended: str | None = None) -> go.Figure:
    """Examples per second at each policy's largest batch, with the 95 % interval as error bars.

    ``df`` columns policy, max_batch, examples_per_s, examples_per_s_low, examples_per_s_high
    (``tables.advice_frame``); rows without a rate are left out. The recommended policy's bar is
    outlined and every bar is labelled with its batch.
    """
    fig = _figure("Examples per second at each policy's largest batch", "policy", "examples / s")
    if df is None or df.empty or df["examples_per_s"].isna().all():
        return _empty(fig)
    for _, row in df.dropna(subset=["examples_per_s"]).iterrows():
        fig.add_trace(go.Bar(
            x=[row["policy"]], y=[row["examples_per_s"]], name=str(row["policy"]),
            marker=dict(color=policy_color(row["policy"]),
                        line=dict(width=3 if row["policy"] == recommended else 0, color="#111")),
            error_y=dict(type="data", symmetric=False,
                         array=[row["examples_per_s_high"] - row["examples_per_s"]],
                         arrayminus=[row["examples_per_s"] - row["examples_per_s_low"]]),
            text=[f"batch {int(row['max_batch'])}"], textposition="inside", insidetextanchor="start",
            customdata=[[row["examples_per_s_low"], row["examples_per_s_high"], row["max_batch"]]],
            hovertemplate="%{y:,.0f} examples/s (95 %: %{customdata[0]:,.0f} to %{customdata[1]:,.0f}) "
                          "at batch %{customdata[2]}<extra>%{x}</extra>"))
    fig.update_layout(showlegend=False)
    return fig
