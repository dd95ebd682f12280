"""Charts of one run and of a comparison of policies: step times, memory, residuals, Pareto front, roofline.

DataFrame in (``tables``' frames), ``go.Figure`` out; an empty frame gives a "no data" figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from remat_lab.present.palette import MEMORY_COLORS, empty, figure, kind_colors, policy_color

ROW_PX = 22  # one row of a horizontal legend
LABEL_PX = 7.5  # about one character of a tick label (12 px font)


def titled(fig: go.Figure, main: str, sub: str | None = None) -> go.Figure:
    """``fig`` titled ``main``, with ``sub`` on a smaller second line: whole in a third of 1024 px.

    Plotly puts a two-line title's first baseline at ``pad.t`` below the top: 20 px keeps its
    capitals inside the figure (10 cut them, measured in Chromium)."""
    text = main if not sub else f"{main}<br><sup>{sub}</sup>"
    fig.update_layout(title=dict(text=text, y=1, yref="container", yanchor="top", pad=dict(t=20)))
    return fig


def legend_outside(fig: go.Figure, rows: int, where: str = "below", per_row: int = 1) -> go.Figure:
    """``fig``'s legend in rows outside the plot, so that the plot keeps the chart's width.

    ``rows``: lines of legend text (an entry may take two); ``per_row`` entries share a row, each
    a fixed fraction of the plot's width, so the layout is the same at any width (1: one entry a
    row, for long policy names). ``below``: at the figure's bottom edge under the axis title, the
    bottom margin and the height grown by its rows (numeric x axes: one line of tick labels).
    ``above``: under the title, the top margin grown (category axes, whose long labels may turn).
    """
    grow = ROW_PX * max(1, -(-rows // per_row))
    legend = dict(orientation="h", x=0, xanchor="left", font=dict(size=11),
                  **(dict(entrywidth=1 / per_row, entrywidthmode="fraction") if per_row > 1 else {}))
    height = (fig.layout.height or 400) + grow
    if where == "above":  # a list (a wide horizontal legend would push the right margin in)
        fig.update_layout(legend=dict(legend, orientation="v" if per_row == 1 else "h", y=1.02,
                                      yanchor="bottom"), margin=dict(t=76 + grow), height=height)
    else:  # one entry a row: a list (a horizontal legend would put two in a row and leave a gap)
        fig.update_layout(legend=dict(legend, yref="container", y=0, yanchor="bottom",
                                      orientation="v" if per_row == 1 else "h"),
                          margin=dict(b=64 + grow), height=height)
    return fig


def log_ticks(values, width_px: float = 200.0) -> list:
    """Among ``values`` (positive), the ones to label on a log axis about ``width_px`` wide so that
    no two labels touch: the smallest, then each one far enough from the last kept."""
    vals = sorted({float(v) for v in values if v and v > 0})
    if len(vals) < 2:
        return vals
    span = np.log10(vals[-1] / vals[0]) or 1.0
    kept = [vals[0]]
    for v in vals[1:]:
        gap = np.log10(v / kept[-1]) / span * width_px
        need = LABEL_PX * (len(f"{v:g}") + len(f"{kept[-1]:g}")) / 2 + 8
        if gap >= need:
            kept.append(v)
    return kept


TICK_GAP_PX = 20  # centre to centre: one line of 12 px tick text and a margin


def decades(fig: go.Figure, axis: str, lo: float, hi: float, length_px: float = 250.0) -> None:
    """A log ``axis`` ("x" or "y", from ``lo`` to ``hi``, about ``length_px`` long) labelled once per
    power of ten when it spans two or more; else at 1-2-5 steps at least ``TICK_GAP_PX`` apart
    (Plotly's own labels a short log axis at every digit, 2 to 9, and they run into each other)."""
    if not (lo > 0 and hi > lo):
        return
    update = getattr(fig, f"update_{axis}axes")
    if hi / lo >= 100:
        update(dtick=1)
        return
    k0, k1 = int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi)))
    steps = [m * 10.0 ** k for k in range(k0, k1 + 1) for m in (1, 2, 5) if lo <= m * 10.0 ** k <= hi]
    per_decade = length_px / max(np.log10(hi / lo), 1e-9)
    kept: list[float] = []
    for v in steps:
        if not kept or np.log10(v / kept[-1]) * per_decade >= TICK_GAP_PX:
            kept.append(v)
    if len(kept) < 2:  # within one 1-2-5 step: its two ends
        kept = [lo, hi] if np.log10(hi / lo) * per_decade >= TICK_GAP_PX else [lo]
    update(tickvals=kept, ticktext=[f"{v:.3g}" for v in kept])


BAR_ROW_PX = 40  # one policy's bar or box on a horizontal chart


def memory_unit(largest_mib: float) -> tuple[str, float]:
    """The unit for memory up to ``largest_mib`` MiB: GiB from 1 GiB up (no "60k MiB"), else MiB;
    (name, MiB per unit)."""
    return ("GiB", 1024.0) if largest_mib >= 1024 else ("MiB", 1.0)


def by_category(fig: go.Figure, names: list[str], value_title: str, what: str = "policy") -> bool:
    """Lay ``fig`` out for one bar or box per name of ``names`` (policies, layers), so that every
    name is whole at any width from a third of a wide page to a 1024 px window.

    One name: upright, the name as the x axis's title (a long policy name is whole there, where a
    tick label would be cut). Several: horizontal, the names down the y axis in their order, the
    left margin grown to hold them (``automargin``), the height ``BAR_ROW_PX`` a name (300 px at least).
    Returns True when horizontal (the traces then take the values on x)."""
    if len(names) <= 1:
        fig.update_xaxes(showticklabels=False, title_text=f"{what}: {names[0]}" if names else what)
        fig.update_yaxes(title_text=value_title, automargin=True)
        return False
    fig.update_yaxes(title_text="", automargin=True, autorange="reversed", type="category")
    fig.update_xaxes(title_text=value_title, automargin=True)
    fig.update_layout(height=max(300, 150 + BAR_ROW_PX * len(names)))
    return True


def _along(horizontal: bool, names, values) -> dict:
    """A trace's coordinates: ``names`` on the category axis, ``values`` on the value axis."""
    return dict(y=names, x=values, orientation="h") if horizontal else dict(x=names, y=values)


def make_step_time_figure(df: pd.DataFrame) -> go.Figure:
    """Distribution of timed runs: ``df`` columns policy, run, ms (one box per policy)."""
    fig = titled(figure("", "policy", "step time (ms)"), "Step time", "every timed run")
    if df is None or df.empty:
        return empty(fig)
    policies = [str(p) for p in dict.fromkeys(df["policy"])]
    flat = by_category(fig, policies, "step time (ms)")
    value = "x" if flat else "y"
    for policy, part in df.groupby("policy", sort=False):
        fig.add_trace(go.Box(
            **_along(flat, [str(policy)] * len(part), part["ms"]), name=str(policy), boxpoints="all",
            jitter=0.4, pointpos=0, marker_color=policy_color(policy), customdata=part["run"],
            hovertemplate=f"run %{{customdata}}: %{{{value}:.4f}} ms<extra>%{{fullData.name}}</extra>"))
    fig.update_layout(showlegend=False)
    return fig


def make_memory_figure(df: pd.DataFrame) -> go.Figure:
    """Stacked memory parts per policy with the peak marked, in MiB (GiB from 1 GiB up).

    ``df`` columns: policy, argument, output, temp, alias, generated_code, peak_mib (MiB). Alias
    is drawn below zero because peak = generated_code + argument + output - alias + temp. One
    policy: an upright bar, its peak's value written above it; several: a horizontal bar each.
    The legend under the plot, two or three entries a row.
    """
    fig = titled(figure("", "policy", "memory (MiB)"), "Compiled memory", "XLA memory analysis")
    if df is None or df.empty:
        return empty(fig)
    unit, per = memory_unit(float(df["peak_mib"].max()))
    policies = [str(p) for p in df["policy"]]
    flat = by_category(fig, policies, f"memory ({unit})")
    value = "x" if flat else "y"
    for part in ("argument", "output", "temp", "generated_code", "alias"):
        sign = -1 if part == "alias" else 1
        fig.add_trace(go.Bar(
            **_along(flat, policies, sign * df[part] / per), name=part.replace("_", " "),
            marker_color=MEMORY_COLORS[part], customdata=df[part] / per,
            hovertemplate=f"{part}: %{{customdata:.4f}} {unit}<extra>%{{{'y' if flat else 'x'}}}</extra>"))
    peak = df["peak_mib"] / per
    fig.add_trace(go.Scatter(
        **{k: v for k, v in _along(flat, policies, peak).items() if k != "orientation"},
        mode="markers" if flat else "markers+text", name="peak",
        marker=dict(symbol="line-ns-open" if flat else "line-ew-open", size=26 if flat else 40, color="#222",
                    line=dict(width=3, color="#222")),
        text=None if flat else [f"peak {v:.3f} {unit}" for v in peak], textposition="top center",
        hovertemplate=f"peak: %{{{value}:.4f}} {unit}<extra>%{{{'y' if flat else 'x'}}}</extra>"))
    if not flat:  # room above the bar for the peak's value, inside the plot
        low = float(min(0.0, -(df["alias"] / per).max()))
        fig.update_yaxes(range=[low * 1.1, float(peak.max()) * 1.25 or 1.0])
    fig.update_layout(barmode="relative")
    # Entries share the plot's width: beside a column of long policy names it is narrow, two a row.
    return legend_outside(fig, len(fig.data), "below", per_row=2 if flat else 3)


def make_residuals_figure(df: pd.DataFrame) -> go.Figure:
    """Residual bytes by layer, stacked by kind: ``df`` columns layer, kind, bytes, mib.

    A horizontal bar per layer (the names down the y axis, whole at any count), MiB or GiB by the
    largest layer; the kinds' legend under the plot."""
    fig = titled(figure("", "residual memory (MiB)", "layer"), "Residuals",
                 "kept for the backward pass")
    if df is None or df.empty:
        return empty(fig)
    layers = [str(v) for v in dict.fromkeys(df["layer"])]
    unit, per = memory_unit(float(df.groupby("layer")["mib"].sum().max()))
    colors = kind_colors(df["kind"].unique())  # no two kinds share a grey
    for kind, part in df.groupby("kind", sort=False):
        fig.add_trace(go.Bar(
            y=part["layer"].astype(str), x=part["mib"] / per, orientation="h", name=str(kind),
            marker_color=colors[kind], customdata=part["bytes"],
            hovertemplate=f"%{{customdata:,}} bytes (%{{x:.4f}} {unit})<extra>" + str(kind) + "</extra>"))
    fig.update_yaxes(title_text="", automargin=True, autorange="reversed", type="category",
                     categoryorder="array", categoryarray=layers)
    fig.update_xaxes(title_text=f"residual memory ({unit})", automargin=True)
    fig.update_layout(barmode="stack", height=max(300, 150 + 28 * len(layers)))
    return legend_outside(fig, len(fig.data), "below", per_row=2)


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
    the median; preferred) or p25_ms, p75_ms; optional same_program_as (shown on hover). Laid out
    by ``by_category``: several policies are horizontal bars (the error bars then on x).
    """
    band = _interval(df) if df is not None else None
    fig = titled(figure("", "policy", "step time (ms)"), "Step time per policy",
                 "median" + (f"; bars: {band[2]}" if band else ""))
    if df is None or df.empty:
        return empty(fig)
    flat = by_category(fig, [str(p) for p in df["policy"]], "step time (ms)")
    value, name = ("x", "y") if flat else ("y", "x")
    for _, row in df.iterrows():
        bar = dict(**_along(flat, [str(row["policy"])], [row["median_ms"]]), name=str(row["policy"]),
                   marker_color=policy_color(row["policy"]))
        if band:
            lo, hi, label = band
            bar[f"error_{value}"] = dict(type="data", symmetric=False, array=[row[hi] - row["median_ms"]],
                                         arrayminus=[row["median_ms"] - row[lo]])
            bar["customdata"] = [[row[lo], row[hi]]]
            bar["hovertemplate"] = (f"median %{{{value}:.4f}} ms<br>{label}: %{{customdata[0]:.4f}} to "
                                    f"%{{customdata[1]:.4f}} ms{_same_as(row)}<extra>%{{{name}}}</extra>")
        else:
            bar["hovertemplate"] = f"median %{{{value}:.4f}} ms{_same_as(row)}<extra>%{{{name}}}</extra>"
        fig.add_trace(go.Bar(**bar))
    once = df["policy"].is_unique  # a policy twice (History's runs): its bars side by side
    fig.update_layout(barmode="overlay" if flat and once else "group", showlegend=False)
    return fig


def _programs(df: pd.DataFrame) -> list[pd.DataFrame]:
    """``df``'s rows grouped by compiled program (``same_program_as`` names the group's first
    policy; without the column every row is a program of its own), in row order."""
    if "same_program_as" not in df.columns:
        return [df.iloc[[i]] for i in range(len(df))]
    keys = [other if isinstance(other, str) and other else policy
            for policy, other in zip(df["policy"], df["same_program_as"])]
    return [df[[k == key for k in keys]] for key in dict.fromkeys(keys)]


def make_pareto_figure(df: pd.DataFrame, front: pd.Series | None = None) -> go.Figure:
    """Step time vs peak memory, one point per compiled program; the Pareto front ringed.

    ``df`` columns policy, median_ms, peak_mib, optionally ci_low_ms and ci_high_ms (drawn as
    vertical error bars) and same_program_as (policies of one program are drawn as one point,
    named by all of them: the median of their medians, the union of their intervals, their
    smallest peak); ``front`` a boolean mask of the front's rows. The front's points get a black
    ring (trace "Pareto front"); with two or more of them a dashed staircase joins them in order
    of peak memory. Nothing else is drawn for the front.
    """
    fig = figure("Step time vs peak memory", "peak memory (MiB)", "step time (ms)")
    if df is None or df.empty:
        return empty(fig)
    unit, per = memory_unit(float(pd.to_numeric(df["peak_mib"], errors="coerce").max()))
    fig.update_xaxes(title_text=f"peak memory ({unit})", automargin=True)
    fig.update_yaxes(automargin=True)
    band = _interval(df)
    mask = (pd.Series(False, index=df.index) if front is None
            else pd.Series(front.to_numpy(dtype=bool), index=df.index))
    points = []
    for rows in _programs(df):
        first = rows["policy"].iloc[0]
        med = float(np.median(rows["median_ms"]))
        point = dict(x=[rows["peak_mib"].min() / per], y=[med], mode="markers",
                     name=" =<br>".join(map(str, rows["policy"])),  # one policy a legend line
                     marker=dict(size=12, color=policy_color(first), line=dict(width=1, color="#222")),
                     hovertemplate=f"%{{x:.4f}} {unit}, median %{{y:.4f}} ms"
                                   + ("<br>one compiled program" if len(rows) > 1 else "")
                                   + "<extra>%{fullData.name}</extra>")
        if band:
            lo, hi, _ = band
            point["error_y"] = dict(type="data", symmetric=False, array=[rows[hi].max() - med],
                                    arrayminus=[med - rows[lo].min()], color=policy_color(first))
        fig.add_trace(go.Scatter(**point))
        if mask[rows.index].any():
            points.append((point["x"][0], med))
    if points:
        xs, ys = zip(*sorted(points))
        fig.add_trace(go.Scatter(
            x=list(xs), y=list(ys), mode="lines+markers" if len(points) > 1 else "markers",
            name="Pareto front", line=dict(color="#222", dash="dash", shape="hv"),
            marker=dict(symbol="circle-open", size=22, color="#222", line=dict(width=2)),
            hoverinfo="skip"))
    peaks = pd.to_numeric(df["peak_mib"], errors="coerce").dropna() / per
    if not peaks.empty:  # equal peaks: a narrow range around them, not Plotly's -0.5..1
        pad = max(float(peaks.max() - peaks.min()) * 0.15, float(peaks.abs().max()) * 0.05, 1e-6)
        fig.update_xaxes(range=[float(peaks.min()) - pad, float(peaks.max()) + pad])
    return legend_outside(fig, sum(t.name.count("<br>") + 1 for t in fig.data))


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
    fig = titled(figure("", "arithmetic intensity (FLOP/byte, XLA bytes accessed)", f"achieved ({unit})"),
                 "Roofline", "achieved FLOP/s vs arithmetic intensity")
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
    decades(fig, "x", x_lo, x_hi, 400.0)
    ys = [*(rate / scale for rate in points["achieved_flops_per_s"].astype(float)),
          *([peak / scale] if peak else []), *([bw * x_lo / scale] if bw else [])]
    decades(fig, "y", min(ys), max(ys))
    fig.update_layout(height=440)
    return legend_outside(fig, len(fig.data))
