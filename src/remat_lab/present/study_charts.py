"""Charts of studies over many configurations: sweeps, the relative heatmap and the advisor's two charts.

DataFrame in (``tables``' frames), ``go.Figure`` out; an empty frame gives a "no data" figure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from remat_lab.present.palette import empty, figure, policy_color
from remat_lab.present.run_charts import legend_outside, log_ticks, titled

COLORBAR_GAP_PX = 20  # at least this far apart, the colour bar's 13 px labels never touch
OFF_SCALE = 3.0  # the advisor's chart shows peaks up to this many budgets; a probe above is marked


def make_sweep_figure(df: pd.DataFrame, x: str, y: str, y_title: str) -> go.Figure:
    """One line per policy (and per value of the other axis) of ``y`` against ``x``.

    ``x`` is "width" or "batch"; the other of the two picks the line dash. The legend, below the
    plot (one entry a row) so that the plot keeps the chart's width, has one entry per policy (its
    colour; a click hides all its lines) and, when there are several, one per value of the other
    axis (its dash). Log width/batch axes label only values whose labels do not touch.
    """
    other = "batch" if x == "width" else "width"
    fig = figure(f"{y_title} vs {x}", x, y_title)
    if df is None or df.empty:
        return empty(fig)
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
    if (df[x] > 0).all():  # every value labelled that leaves room for its neighbours' labels
        fig.update_xaxes(type="log", tickvals=log_ticks(df[x].unique()))
    fig.update_layout(font=dict(size=13), margin=dict(l=60, r=20, t=60))
    return legend_outside(fig, len(policies) + (len(others) if len(others) > 1 else 0))


def make_relative_heatmap_figure(df: pd.DataFrame, title: str, baseline: str = "no_remat",
                                 quiet_label: str = "within noise") -> go.Figure:
    """Each policy's metric relative to ``baseline``: ``df`` columns policy, config, ratio and
    optionally within_noise (see ``tables.relative_frame``: for step time, whether the 95 %
    intervals of the two medians overlap; without the column only a ratio of exactly 1 counts as no
    difference).

    Every cell is annotated with its ratio. Cells within the noise are grey, neutral whatever their
    ratio, and say ``quiet_label`` under it (e.g. "equal" for a deterministic metric); the others are
    coloured on log2(ratio), so 2x slower and 2x faster are equally strong, on a scale of at least
    0.67x..1.5x so that small differences stay pale. One row is 46 px high.
    """
    grey = "#E5E7EB"
    fig = figure(title, "configuration (width, batch)", "")
    if df is None or df.empty:
        return empty(fig)
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
    # Rows of 46 px (three at least, so the colour bar has room); the bar spans the plot's height
    # less its title and padding (about 42 px, measured in Chromium at 1024 px).
    rows_px = 46 * max(len(table.index), 3)
    ticks = _colorbar_ticks(bound, rows_px - 20)
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
        hoverongaps=False, hovertemplate=hover + f" ({quiet_label or 'within the noise'})<extra></extra>"))
    # One list set once: add_annotation per cell re-validates the layout each time (quadratic; a
    # 500-row upload took 80 s to draw).
    note = f"<br><span style='font-size:10px'>{quiet_label}</span>" if quiet_label else ""
    labels = [dict(x=config, y=policy, text=f"{ratios[i, j]:.2f}x"
                   + (note if quiet[i, j] and policy != baseline else ""),
                   showarrow=False,
                   font=dict(size=13, color="#6B7280" if quiet[i, j]
                             else ("white" if not quiet[i, j] and abs(z[i, j]) > 0.6 * bound
                                   else "#111827")))
              for i, policy in enumerate(ys) for j, config in enumerate(xs) if np.isfinite(ratios[i, j])]
    fig.update_layout(annotations=list(fig.layout.annotations) + labels, height=150 + rows_px,
                      margin=dict(l=20, r=20, t=60, b=60), font=dict(size=13))
    fig.update_yaxes(autorange="reversed", automargin=True, tickfont=dict(size=13), title_text="")
    # "w256 b512" on two lines (half as wide), or turned upright when there are many: apart at 1024 px.
    many = len(xs) > 6
    fig.update_xaxes(automargin=True, tickfont=dict(size=13), type="category", tickangle=-90 if many else 0,
                     tickvals=xs, ticktext=[str(c) if many else str(c).replace(" ", "<br>") for c in xs])
    return fig


def _colorbar_ticks(bound: float, length_px: float) -> list[float]:
    """Ratios to label on a colour bar of log2 ratios from -``bound`` to ``bound``, ``length_px``
    long: 1x first, then powers of two and 1.5x / 0.67x, each kept only at least
    ``COLORBAR_GAP_PX`` from every label already kept."""
    per_unit = length_px / (2 * bound)
    candidates = [1.0] + [r for k in range(1, 11) for r in (2.0 ** k, 2.0 ** -k)] + [1.5, 0.67]
    kept: list[float] = []
    for r in candidates:
        z = np.log2(r)
        if abs(z) <= bound + 1e-9 and all(abs(z - np.log2(k)) * per_unit >= COLORBAR_GAP_PX
                                          for k in kept):
            kept.append(r)
    return sorted(kept)


def make_advice_peak_figure(df: pd.DataFrame, budget_mib: float) -> go.Figure:
    """Compiled peak vs batch per policy, the budget as a line: the advisor's probes.

    ``df`` columns policy, batch, peak_mib, fits, answer (``tables.advice_probes_frame``). Each
    probe is a point (hollow where it did not fit); each policy's answer, its largest batch that
    fits, is a larger diamond. The batch axis is logarithmic when the probes span a wide range.
    """
    # GiB once the budget is GiB-scale (an H100's 60 GiB, not "60,723.2 MiB" and ticks of "60k")
    scale, unit = (1024.0, "GiB") if budget_mib >= 1024 else (1.0, "MiB")
    fig = titled(figure("", "batch", f"compiled peak ({unit})"), "Compiled peak memory vs batch",
                 "each point: one compile")
    if df is None or df.empty:
        return empty(fig)
    df = df.assign(peak_mib=df["peak_mib"] / scale)  # in ``unit`` from here on
    # The probes that matter are near the budget: one far above it (everything_saveable at 700 GiB
    # against 60) would squash the rest, so it is drawn at the top edge, a triangle, its peak in
    # its hover and the axis's note.
    cap = OFF_SCALE * budget_mib / scale
    off = df["peak_mib"] > cap
    for policy, part in df.sort_values("batch").groupby("policy", sort=False):
        color, above = policy_color(policy), part["peak_mib"] > cap
        fig.add_trace(go.Scatter(
            x=part["batch"], y=np.minimum(part["peak_mib"], cap), mode="lines+markers", name=str(policy),
            legendgroup=str(policy), line=dict(color=color, width=1.5),
            marker=dict(size=[12 if a else 8 for a in above], color=[
                color if f else "white" for f in part["fits"]], line=dict(width=1.5, color=color),
                symbol=["triangle-up" if a else "circle" for a in above]),
            customdata=np.stack([part["peak_mib"], np.where(
                part["fits"], "fits", np.where(above, "over the budget, off the scale", "over the budget"))],
                axis=-1),
            hovertemplate=(f"batch %{{x}}: %{{customdata[0]:.3f}} {unit}, %{{customdata[1]}}"
                           "<extra>%{fullData.name}</extra>")))
        best = part[part["answer"]]
        if not best.empty:
            fig.add_trace(go.Scatter(
                x=best["batch"], y=best["peak_mib"], mode="markers", legendgroup=str(policy),
                showlegend=False, name=f"{policy}: largest batch",
                marker=dict(symbol="diamond", size=14, color=color, line=dict(width=1, color="#222")),
                hovertemplate=f"largest batch %{{x}}: %{{y:.3f}} {unit}<extra>%{{fullData.name}}</extra>"))
    fig.add_hline(y=budget_mib / scale, line=dict(color="#B91C1C", dash="dash", width=2),
                  annotation_text=f"budget {budget_mib / scale:,.1f} {unit}", annotation_position="top left",
                  annotation_font=dict(color="#B91C1C"))
    if off.any():
        fig.update_yaxes(range=[0, cap * 1.06])
        fig.add_annotation(
            text=f"▲ {int(off.sum())} probe{'s' * (int(off.sum()) > 1)} off the scale, up to "
                 f"{df['peak_mib'].max():,.1f} {unit}", xref="paper", yref="paper", x=1, y=1,
            xanchor="right", yanchor="bottom", showarrow=False, font=dict(size=12, color="#444"))
    if df["batch"].max() > 16 * max(df["batch"].min(), 1):
        fig.update_xaxes(type="log", tickvals=log_ticks(df.loc[df["batch"] > 0, "batch"].unique()))
    return legend_outside(fig, df["policy"].nunique())


def make_advice_throughput_figure(df: pd.DataFrame, recommended: str | None = None) -> go.Figure:
    """Examples per second at each policy's largest batch, with the 95 % interval as error bars.

    ``df`` columns policy, max_batch, examples_per_s, examples_per_s_low, examples_per_s_high
    (``tables.advice_frame``); rows without a rate are left out. The recommended policy's bar is
    outlined and every bar is labelled with its batch (on a mesh per device and global, from the
    frame's ``per_device_batch`` and ``devices``).
    """
    fig = titled(figure("", "policy", "examples / s"), "Examples per second",
                 "at each policy's largest batch")
    if df is None or df.empty or df["examples_per_s"].isna().all():
        return empty(fig)
    for _, row in df.dropna(subset=["examples_per_s"]).iterrows():
        fig.add_trace(go.Bar(
            x=[row["policy"]], y=[row["examples_per_s"]], name=str(row["policy"]),
            marker=dict(color=policy_color(row["policy"]),
                        line=dict(width=3 if row["policy"] == recommended else 0, color="#111")),
            error_y=dict(type="data", symmetric=False,
                         array=[row["examples_per_s_high"] - row["examples_per_s"]],
                         arrayminus=[row["examples_per_s"] - row["examples_per_s_low"]]),
            text=[f"batch {int(row['max_batch'])}" if not row.get("devices", 1) > 1 else  # a mesh
                  f"{int(row['per_device_batch'])} per device ({int(row['max_batch'])} global)"],
            textposition="inside", insidetextanchor="start",
            customdata=[[row["examples_per_s_low"], row["examples_per_s_high"], row["max_batch"]]],
            hovertemplate="%{y:,.0f} examples/s (95 %: %{customdata[0]:,.0f} to %{customdata[1]:,.0f}) "
                          "at batch %{customdata[2]}<extra>%{x}</extra>"))
    fig.update_layout(showlegend=False)
    return fig
