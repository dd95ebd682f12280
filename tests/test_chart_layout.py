"""Chart layout at 1024 px, the parts a builder decides (the browser test measures the drawn boxes)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from remat_lab.present import charts
from remat_lab.present.palette import figure
from remat_lab.present.run_charts import TICK_GAP_PX, decades


@pytest.mark.parametrize(("lo", "hi"), [(1.3, 11.0), (0.8, 9.5), (3.1, 3.9), (12.0, 70.0)])
def test_a_short_log_axis_gets_labels_far_enough_apart(lo, hi):
    fig = figure("", "", "")
    decades(fig, "y", lo, hi, length_px=250.0)
    ticks = list(fig.layout.yaxis.tickvals)
    assert ticks and all(lo <= t <= hi for t in ticks)
    per_decade = 250.0 / np.log10(hi / lo)
    gaps = np.diff(np.log10(ticks)) * per_decade
    assert (gaps >= TICK_GAP_PX).all(), (ticks, gaps)
    assert list(fig.layout.yaxis.ticktext) == [f"{t:.3g}" for t in ticks]


def test_a_long_log_axis_is_labelled_per_decade():
    fig = figure("", "", "")
    decades(fig, "x", 0.01, 50.0)
    assert fig.layout.xaxis.dtick == 1 and fig.layout.xaxis.tickvals is None


def test_titles_sit_below_the_top_edge_and_step_time_fits_a_narrow_column():
    fig = charts.make_step_time_figure(pd.DataFrame({"policy": ["a"], "run": [1], "ms": [1.0]}))
    main = fig.layout.title.text.split("<br>")[0]
    assert len(main) <= 16  # about 130 px of 15 px text: whole in Explore's 177 px column
    assert fig.layout.title.pad.t >= 20 and fig.layout.title.yref == "container"


def _relative(configs: list[str]) -> pd.DataFrame:
    return pd.DataFrame([{"policy": p, "config": c, "ratio": r}
                         for c in configs for p, r in (("no_remat", 1.0), ("nothing_saveable", 1.3))])


def test_heatmap_column_labels_wrap_or_turn_upright():
    few = charts.make_relative_heatmap_figure(_relative(["w32 b4", "w256 b512"]), "t")
    assert list(few.layout.xaxis.ticktext) == ["w32<br>b4", "w256<br>b512"]
    assert few.layout.xaxis.tickangle == 0
    configs = [f"w{w} b{b}" for w in (32, 64, 128, 256) for b in (4, 8)]
    many = charts.make_relative_heatmap_figure(_relative(configs), "t")
    assert list(many.layout.xaxis.ticktext) == configs and many.layout.xaxis.tickangle == -90


LONG = "dots_with_no_batch_dims_saveable"  # about 220 px of tick text: cut in a narrow column


def _memory(policies: list[str], peak_mib: float = 1.25) -> pd.DataFrame:
    return pd.DataFrame([{"policy": p, "argument": 1.0, "output": 0.5, "temp": peak_mib - 1.0,
                          "alias": 0.5, "generated_code": 0.25, "peak_mib": peak_mib} for p in policies])


@pytest.mark.parametrize("build", [
    lambda ps: charts.make_memory_figure(_memory(ps)),
    lambda ps: charts.make_time_bars_figure(pd.DataFrame({"policy": ps, "median_ms": [1.0] * len(ps)})),
    lambda ps: charts.make_step_time_figure(pd.DataFrame({"policy": ps, "run": 1, "ms": 1.0})),
])
def test_a_policy_s_name_is_never_a_tick_label_that_a_narrow_chart_cuts(build):
    """One policy: upright, its name the x axis's title (no tick label). Several: horizontal, the
    names down the y axis (its margin grown to fit them, first on top), the chart taller per name."""
    one = build([LONG])
    assert one.layout.xaxis.showticklabels is False and LONG in one.layout.xaxis.title.text
    assert all(t.orientation != "h" for t in one.data)
    names = ["no_remat", "nothing_saveable", LONG]
    many = build(names)
    assert all(t.orientation == "h" for t in many.data if t.type in ("bar", "box"))
    assert many.layout.yaxis.automargin is True and many.layout.yaxis.autorange == "reversed"
    assert list(dict.fromkeys(c for t in many.data if t.type in ("bar", "box") for c in t.y)) == names
    assert many.layout.xaxis.automargin is True and many.layout.xaxis.title.text
    six = build([f"p{i}" for i in range(6)] + [LONG])
    assert six.layout.height > many.layout.height  # a row per policy, never squeezed


def test_the_peak_s_value_sits_inside_the_plot_and_the_legend_below_it():
    fig = charts.make_memory_figure(_memory([LONG], peak_mib=2.0))
    peak = fig.data[-1]
    assert peak.name == "peak" and peak.text == ("peak 2.000 MiB",) and peak.textposition == "top center"
    low, high = fig.layout.yaxis.range
    assert high >= 1.2 * 2.0 and low <= -0.5  # room above the bar for its label, the alias below zero
    legend = fig.layout.legend
    assert legend.orientation == "h" and legend.yref == "container" and legend.y == 0
    rows = -(-len(fig.data) // 3)
    assert fig.layout.margin.b >= 64 + rows * 22  # the legend's rows under the axis title, not on the plot


def test_memory_in_gib_from_one_gib():
    fig = charts.make_memory_figure(_memory(["a", "b"], peak_mib=60 * 1024.0))
    assert fig.layout.xaxis.title.text == "memory (GiB)"
    peak = fig.data[-1]
    assert peak.x[0] == pytest.approx(60.0)  # 61,440 MiB drawn as 60 GiB, not "60k"
    small = charts.make_memory_figure(_memory(["a"]))
    assert small.layout.yaxis.title.text == "memory (MiB)"
    pareto = charts.make_pareto_figure(pd.DataFrame({"policy": ["a", "b"], "median_ms": [1.0, 2.0],
                                                     "peak_mib": [2048.0, 3072.0]}))
    assert pareto.layout.xaxis.title.text == "peak memory (GiB)" and pareto.data[0].x[0] == 2.0


def test_residuals_of_many_blocks_are_drawn_by_layer():
    """An llm's blocks in a loop name dozens of layers ("3.q_proj"): the chart groups them by layer
    (q_proj), every byte kept; a few layers are drawn as they are."""
    from remat_lab.present import tables

    blocks, names = 9, ["q_proj", "k_proj", "wo"]  # 27 layers, over GROUP_ABOVE
    residuals = [{"index": i, "shape": [4], "dtype": "float32", "bytes": 16 * (b + 1), "layers": 1,
                  "role": "activation", "memory_kind": "device", "memory_kind_in_compiled": "device",
                  "kind": "name", "layer": f"{b}.{n}", "source": "", "name": n}
                 for i, (b, n) in enumerate((b, n) for b in range(blocks) for n in names)]
    doc = {"residuals": residuals}
    frame = tables.residual_layer_kind_frame(doc)
    assert list(frame["layer"]) == names
    assert frame["bytes"].sum() == sum(r["bytes"] for r in residuals)
    assert frame.set_index("layer")["bytes"]["wo"] == sum(16 * (b + 1) for b in range(blocks))
    few = tables.residual_layer_kind_frame({"residuals": residuals[:6]})
    assert list(few["layer"]) == ["0.q_proj", "0.k_proj", "0.wo", "1.q_proj", "1.k_proj", "1.wo"]
    fig = charts.make_residuals_figure(frame)
    assert list(fig.layout.yaxis.categoryarray) == names and fig.layout.yaxis.automargin is True
