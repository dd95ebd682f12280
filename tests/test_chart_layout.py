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
