"""Chart builders: DataFrame in, Figure out; traces, axis titles and empty frames."""

import pandas as pd
import plotly.graph_objects as go
import pytest

from remat_lab.model.policies import POLICIES
from remat_lab.present import charts

BUILDERS = {
    "time": lambda df: charts.make_step_time_figure(df),
    "memory": lambda df: charts.make_memory_figure(df),
    "residuals": lambda df: charts.make_residuals_figure(df),
    "bars": lambda df: charts.make_time_bars_figure(df),
    "pareto": lambda df: charts.make_pareto_figure(df),
    "sweep": lambda df: charts.make_sweep_figure(df, "width", "median_ms", "step time (ms)"),
    "heatmap": lambda df: charts.make_relative_heatmap_figure(df, "t"),
}


def test_every_policy_has_its_own_colour():
    assert set(charts.POLICY_COLORS) == set(POLICIES)
    assert len(set(charts.POLICY_COLORS.values())) == len(POLICIES)
    assert charts.policy_color("no_remat") == charts.POLICY_COLORS["no_remat"]
    assert charts.policy_color("unknown") == charts.policy_color("unknown")


@pytest.mark.parametrize("name", BUILDERS)
def test_empty_frames_give_a_figure_with_a_note(name):
    fig = BUILDERS[name](pd.DataFrame())
    assert isinstance(fig, go.Figure)
    assert len(fig.data) == 0
    assert "no data" in fig.layout.annotations[0].text


def test_step_time_distribution():
    df = pd.DataFrame({"policy": ["no_remat"] * 3 + ["nothing_saveable"] * 2, "run": [1, 2, 3, 1, 2],
                       "ms": [1.0, 1.1, 0.9, 2.0, 2.1]})
    fig = charts.make_step_time_figure(df)
    assert [t.type for t in fig.data] == ["box", "box"]
    assert fig.data[1].marker.color == charts.POLICY_COLORS["nothing_saveable"]
    # two policies: horizontal boxes, the times along x, a policy a row
    assert [t.orientation for t in fig.data] == ["h", "h"] and list(fig.data[1].x) == [2.0, 2.1]
    assert set(fig.data[1].y) == {"nothing_saveable"}
    assert fig.layout.xaxis.title.text == "step time (ms)"


def test_memory_stacked_with_peak_and_negative_alias():
    df = pd.DataFrame({"policy": ["no_remat"], "argument": [1.0], "output": [0.5], "temp": [0.25],
                       "alias": [0.5], "generated_code": [0.0], "peak_mib": [1.25]})
    fig = charts.make_memory_figure(df)
    names = [t.name for t in fig.data]
    assert names == ["argument", "output", "temp", "generated code", "alias", "peak"]
    assert fig.data[4].y[0] == -0.5
    assert fig.data[-1].y[0] == 1.25
    assert fig.layout.barmode == "relative"
    assert fig.layout.yaxis.title.text == "memory (MiB)"


def test_residuals_by_layer_and_kind():
    df = pd.DataFrame({"layer": ["l1", "l2", "l1"], "kind": ["argument", "argument", "dot_general"],
                       "bytes": [1024, 1024, 2048], "mib": [1 / 1024, 1 / 1024, 2 / 1024]})
    fig = charts.make_residuals_figure(df)
    assert sorted(t.name for t in fig.data) == ["argument", "dot_general"]
    assert fig.layout.barmode == "stack"
    assert "MiB" in fig.layout.xaxis.title.text  # a horizontal bar per layer
    assert list(fig.layout.yaxis.categoryarray) == ["l1", "l2"]


def test_time_bars_have_p25_p75_error_bars():
    df = pd.DataFrame({"policy": ["no_remat", "dots_saveable"], "median_ms": [1.0, 2.0],
                       "p25_ms": [0.8, 1.5], "p75_ms": [1.5, 2.1]})
    fig = charts.make_time_bars_figure(df)
    assert len(fig.data) == 2 and all(t.orientation == "h" for t in fig.data)
    assert fig.data[0].error_x.array[0] == pytest.approx(0.5)
    assert fig.data[0].error_x.arrayminus[0] == pytest.approx(0.2)
    assert fig.data[1].marker.color == charts.POLICY_COLORS["dots_saveable"]
    assert fig.layout.xaxis.title.text == "step time (ms)"
    assert "p25-p75" in fig.layout.title.text


def test_time_bars_draw_the_interval_of_the_median_and_say_so():
    df = pd.DataFrame({"policy": ["no_remat", "everything_saveable"], "median_ms": [1.0, 2.0],
                       "ci_low_ms": [0.9, 1.2], "ci_high_ms": [1.3, 2.5],
                       "p25_ms": [0.1, 0.1], "p75_ms": [9.0, 9.0],
                       "same_program_as": [None, "no_remat"]})
    fig = charts.make_time_bars_figure(df)
    assert "95 % interval of the median" in fig.layout.title.text
    assert fig.data[1].error_x.array[0] == pytest.approx(0.5)
    assert fig.data[1].error_x.arrayminus[0] == pytest.approx(0.8)
    assert "same compiled program as no_remat" in fig.data[1].hovertemplate
    bare = charts.make_time_bars_figure(df[["policy", "median_ms"]])
    assert bare.data[0].error_x.array is None and "bars" not in bare.layout.title.text


def test_pareto_front_line():
    df = pd.DataFrame({"policy": ["a", "b", "c"], "median_ms": [1.0, 2.0, 3.0],
                       "peak_mib": [3.0, 1.0, 4.0]})
    fig = charts.make_pareto_figure(df, pd.Series([True, True, False]))
    assert [t.name for t in fig.data] == ["a", "b", "c", "Pareto front"]
    assert list(fig.data[-1].x) == [1.0, 3.0]
    assert fig.data[-1].mode == "lines+markers" and fig.data[-1].line.dash == "dash"
    assert fig.layout.xaxis.title.text == "peak memory (MiB)"
    assert len(charts.make_pareto_figure(df).data) == 3


def test_pareto_single_front_point_is_ringed_without_a_line():
    df = pd.DataFrame({"policy": ["a", "b"], "median_ms": [1.0, 2.0], "peak_mib": [1.0, 1.0],
                       "ci_low_ms": [0.9, 1.5], "ci_high_ms": [1.2, 2.5]})
    fig = charts.make_pareto_figure(df, pd.Series([True, False]))
    assert fig.data[-1].name == "Pareto front" and fig.data[-1].mode == "markers"
    assert fig.data[0].error_y.array[0] == pytest.approx(0.2)
    assert fig.data[1].error_y.arrayminus[0] == pytest.approx(0.5)


def test_sweep_lines_one_per_policy_and_batch():
    df = pd.DataFrame({"policy": ["no_remat"] * 4 + ["nothing_saveable"] * 4,
                       "width": [8, 16, 8, 16] * 2, "batch": [1, 1, 4, 4] * 2,
                       "median_ms": range(8)})
    fig = charts.make_sweep_figure(df, "width", "median_ms", "step time (ms)")
    lines = [t for t in fig.data if t.x[0] is not None]
    assert len(lines) == 4 and not any(t.showlegend for t in lines)
    assert {t.line.color for t in lines} == {charts.POLICY_COLORS["no_remat"],
                                            charts.POLICY_COLORS["nothing_saveable"]}
    # the legend: one entry per policy (colour) and one per batch (dash), below the plot
    keys = [t for t in fig.data if t.x[0] is None]
    assert [t.name for t in keys] == ["no_remat", "nothing_saveable", "batch 1", "batch 4"]
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.yanchor == "bottom"  # a list below
    assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0  # at the bottom edge
    assert fig.layout.xaxis.title.text == "width"
    assert fig.layout.yaxis.title.text == "step time (ms)"
    one = charts.make_sweep_figure(df[df.batch == 1], "batch", "median_ms", "t")
    assert len([t for t in one.data if t.x[0] is not None]) == 4  # one line per policy and width


def _heatmap_cells(fig):
    """{(policy, config): (annotation text, greyed)} of a relative heatmap."""
    colour, grey = fig.data[0], fig.data[1]
    out = {}
    for a in fig.layout.annotations:
        i, j = list(colour.y).index(a.y), list(colour.x).index(a.x)
        greyed = grey.z[i][j] == grey.z[i][j] and colour.z[i][j] != colour.z[i][j]  # not NaN / NaN
        out[(a.y, a.x)] = (a.text, greyed)
    return out


def test_relative_heatmap_annotates_every_cell():
    df = pd.DataFrame({"policy": ["no_remat", "nothing_saveable"], "config": ["w8 b1"] * 2,
                       "ratio": [1.0, 1.5]})
    fig = charts.make_relative_heatmap_figure(df, "Step time relative to no_remat")
    assert [t.type for t in fig.data] == ["heatmap", "heatmap"]
    assert list(fig.data[0].y) == ["no_remat", "nothing_saveable"]
    assert fig.data[0].z[1][0] == pytest.approx(0.5849625)  # log2(1.5)
    assert _heatmap_cells(fig) == {("no_remat", "w8 b1"): ("1.00x", True),  # no within_noise column:
                                   ("nothing_saveable", "w8 b1"): ("1.50x", False)}  # only 1.0 is grey
    assert fig.layout.height >= 150 + 46 * 2
    assert fig.layout.annotations[0].font.size >= 12


def test_relative_heatmap_greys_cells_within_the_noise():
    df = pd.DataFrame({"policy": ["nothing_saveable", "no_remat", "nothing_saveable", "no_remat"],
                       "config": ["w8 b1", "w8 b1", "w16 b1", "w16 b1"],
                       "ratio": [1.03, 1.0, 1.3, 1.0], "within_noise": [True, True, False, True]})
    fig = charts.make_relative_heatmap_figure(df, "t")
    assert list(fig.data[0].y) == ["no_remat", "nothing_saveable"]  # the baseline first
    cells = _heatmap_cells(fig)
    assert cells[("nothing_saveable", "w8 b1")][1]  # +3 % inside the spread: grey, and says so
    assert cells[("nothing_saveable", "w8 b1")][0].startswith("1.03x<br>") and "within noise" in \
        cells[("nothing_saveable", "w8 b1")][0]
    assert cells[("no_remat", "w8 b1")] == ("1.00x", True)  # the baseline itself: no label
    assert cells[("nothing_saveable", "w16 b1")] == ("1.30x", False)
    # +3 % of noise does not saturate the scale: it spans at least 0.67x..1.5x
    assert fig.data[0].zmax >= 0.58


def _timed(policy: str, median: float, ci: tuple[float, float] | None, config: str = "w8 b1") -> dict:
    """A sweep summary row in ms: p25-p75 of +-30 % (wide), and a 95 % interval when ``ci``."""
    w, b = (int(part[1:]) for part in config.split())
    return {"policy": policy, "width": w, "batch": b, "median_ms": median, "p25_ms": median * 0.7,
            "p75_ms": median * 1.3, "ci_low_ms": ci[0] if ci else None, "ci_high_ms": ci[1] if ci else None}


def test_sweep_heatmap_colours_only_cells_whose_intervals_separate():
    from remat_lab.present import tables

    df = pd.DataFrame([_timed("no_remat", 1.0, (0.98, 1.02)),
                       _timed("nothing_saveable", 1.10, (1.05, 1.15)),  # separate, p25-p75 overlap
                       _timed("dots_saveable", 1.01, (0.99, 1.03)),  # overlap: neutral
                       _timed("no_remat", 1.0, (0.9, 1.1), "w16 b1"),
                       _timed("nothing_saveable", 0.19, (0.18, 0.2), "w16 b1")])
    cells = _heatmap_cells(charts.make_relative_heatmap_figure(tables.relative_frame(df, "median_ms"), "t"))
    assert cells[("nothing_saveable", "w8 b1")] == ("1.10x", False)  # coloured: beyond the noise
    assert cells[("nothing_saveable", "w16 b1")] == ("0.19x", False)
    text, grey = cells[("dots_saveable", "w8 b1")]
    assert grey and text.startswith("1.01x") and "within noise" in text


def test_sweep_heatmap_of_old_rows_without_intervals_uses_p25_p75():
    from remat_lab.present import tables

    df = pd.DataFrame([_timed("no_remat", 1.0, None), _timed("nothing_saveable", 1.10, None),
                       _timed("dots_saveable", 2.0, None)])
    rel = tables.relative_frame(df, "median_ms").set_index("policy")
    assert rel["within_noise"].to_dict() == {"no_remat": True, "nothing_saveable": True,
                                             "dots_saveable": False}  # 0.7..1.3 vs 1.4..2.6
    cells = _heatmap_cells(charts.make_relative_heatmap_figure(rel.reset_index(), "t"))
    assert cells[("nothing_saveable", "w8 b1")][1] and not cells[("dots_saveable", "w8 b1")][1]


# ---------------------------------------------------------------- roofline


def _roofline_frame():
    return pd.DataFrame({"policy": ["no_remat", "nothing_saveable", "nothing_saveable"],
                         "arithmetic_intensity": [40.0, 50.0, 0.5],
                         "achieved_flops_per_s": [2e11, 1.5e11, 1e9]})


def test_roofline_empty_frame_gives_a_note():
    for df in (pd.DataFrame(), None, pd.DataFrame({"policy": ["no_remat"], "arithmetic_intensity": [0.0],
                                                   "achieved_flops_per_s": [None]})):
        fig = charts.make_roofline_figure(df, 5e11, 5e10)
        assert isinstance(fig, go.Figure) and len(fig.data) == 0
        assert "no data" in fig.layout.annotations[0].text


def test_roofline_log_log_with_both_roofs_and_policy_points():
    fig = charts.make_roofline_figure(_roofline_frame(), 5e11, 5e10)  # ridge at 10 FLOP/byte
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "FLOP/byte" in fig.layout.xaxis.title.text
    assert "GFLOP/s" in fig.layout.yaxis.title.text
    memory, compute, *points = fig.data
    assert memory.name.startswith("memory roof") and compute.name.startswith("compute roof")
    assert memory.x[1] == pytest.approx(10) and memory.y[1] == pytest.approx(500)  # slope meets ceiling
    assert compute.x[0] == pytest.approx(10) and list(compute.y) == pytest.approx([500, 500])
    assert memory.x[0] < 0.5 and compute.x[1] > 50  # the roofs span every point
    assert memory.y[0] == pytest.approx(5e10 * memory.x[0] / 1e9)
    assert [t.name for t in points] == ["no_remat", "nothing_saveable"]
    assert points[1].marker.color == charts.POLICY_COLORS["nothing_saveable"]
    assert list(points[1].y) == pytest.approx([150, 1])  # GFLOP/s
    assert points[0].customdata[0][0] == 2e11 and points[0].customdata[0][1] == pytest.approx(0.4)
    assert "FLOP/byte" in points[0].hovertemplate and "of peak" in points[0].hovertemplate


def test_roofline_units_and_missing_roofs():
    fig = charts.make_roofline_figure(_roofline_frame(), 4e14, 3e12)
    assert "TFLOP/s" in fig.layout.yaxis.title.text
    only_peak = charts.make_roofline_figure(_roofline_frame(), 5e11, None)
    assert [t.name for t in only_peak.data][:1] == ["compute roof 500 GFLOP/s"]
    assert len(only_peak.data) == 3
    no_roofs = charts.make_roofline_figure(_roofline_frame(), None, None)
    assert [t.name for t in no_roofs.data] == ["no_remat", "nothing_saveable"]
    assert "of peak" not in no_roofs.data[0].hovertemplate


def _timeline_frame():
    return pd.DataFrame({"index": [0, 10, 20] * 3,
                         "phase": ["parameter"] * 3 + ["forward"] * 3 + ["backward"] * 3,
                         "bytes": [1 << 20] * 3 + [0, 2 << 20, 0] + [0, 0, 1 << 20]})


@pytest.mark.parametrize("build", [lambda df: charts.make_timeline_figure(df, None, None),
                                   charts.make_timeline_overlay_figure])
def test_timeline_figures_with_empty_frames_say_so(build):
    fig = build(pd.DataFrame(columns=["index", "phase", "bytes"]))
    assert len(fig.data) == 0 and "no data" in fig.layout.annotations[0].text


def test_timeline_is_a_stacked_area_per_phase_with_the_peak_marked():
    fig = charts.make_timeline_figure(_timeline_frame(), 10, 3 << 20)
    assert [t.name for t in fig.data] == ["parameter", "forward", "backward"]
    assert {t.stackgroup for t in fig.data} == {"live"}  # one stack: the phases add up
    assert [t.fillcolor for t in fig.data] == [charts.PHASE_COLORS[p] for p in ("parameter", "forward",
                                                                                "backward")]
    assert list(fig.data[1].y) == [0, 2, 0]  # MiB
    assert fig.layout.yaxis.title.text == "live memory (MiB)"
    assert [s.x0 for s in fig.layout.shapes] == [10]  # the peak's vertical line
    assert any("peak 3.00 MiB at instruction 10" in a.text for a in fig.layout.annotations)
    assert "bytes" in fig.data[0].hovertemplate


def test_timeline_overlay_one_line_per_policy_in_its_colour():
    df = pd.DataFrame({"policy": ["no_remat"] * 3 + ["nothing_saveable"] * 3,
                       "fraction": [0, 0.5, 0.99] * 2,
                       "live_bytes": [1 << 20, 4 << 20, 0, 1 << 20, 2 << 20, 0]})
    fig = charts.make_timeline_overlay_figure(df)
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [t.name for t in lines] == ["no_remat", "nothing_saveable"]
    assert [t.line.color for t in lines] == [charts.policy_color("no_remat"),
                                             charts.policy_color("nothing_saveable")]
    peaks = [t for t in fig.data if t.mode == "markers"]
    assert [(t.x[0], t.y[0]) for t in peaks] == [(0.5, 4.0), (0.5, 2.0)]
    assert tuple(fig.layout.xaxis.range) == (0, 1)


def test_timeline_overlay_names_a_line_by_its_label_and_starts_at_zero():
    df = pd.DataFrame({"policy": ["dots_saveable"] * 2, "fraction": [0, 0.5],
                       "live_bytes": [4 << 20, 5 << 20],
                       "label": ["dots_saveable (= dots_with_no_batch_dims_saveable)"] * 2})
    fig = charts.make_timeline_overlay_figure(df)
    assert fig.data[0].name == "dots_saveable (= dots_with_no_batch_dims_saveable)"
    assert fig.data[0].line.color == charts.policy_color("dots_saveable")
    assert fig.layout.yaxis.rangemode == "tozero"


def test_advice_figures():
    probes = pd.DataFrame({"policy": ["a", "a", "a", "b"], "batch": [1, 64, 65, 64],
                           "peak_mib": [1.0, 3.0, 3.1, 2.0], "fits": [True, True, False, True],
                           "answer": [False, True, False, True]})
    fig = charts.make_advice_peak_figure(probes, 3.05)
    names = [t.name for t in fig.data]
    assert names.count("a") == 1 and "a: largest batch" in names and "b: largest batch" in names
    line = next(t for t in fig.data if t.name == "a")
    assert list(line.x) == [1, 64, 65] and list(line.marker.color)[-1] == "white"  # over: hollow
    assert any(s.y0 == 3.05 for s in fig.layout.shapes)  # the budget line
    assert fig.layout.xaxis.type == "log"
    rates = pd.DataFrame({"policy": ["a", "b"], "max_batch": [64, 64],
                          "examples_per_s": [100.0, None], "examples_per_s_low": [90.0, None],
                          "examples_per_s_high": [120.0, None]})
    bars = charts.make_advice_throughput_figure(rates, recommended="a")
    assert [t.name for t in bars.data] == ["a"] and bars.data[0].marker.line.width == 3
    assert list(bars.data[0].error_y.array) == [20.0] and list(bars.data[0].error_y.arrayminus) == [10.0]
    assert charts.make_advice_peak_figure(probes.iloc[:0], 1.0).layout.annotations
    # an H100's budget: the axis, the line, its label and the points in GiB, not "60k MiB"
    big = probes.assign(peak_mib=probes["peak_mib"] * 20_000)
    gib = charts.make_advice_peak_figure(big, 60_723.2)
    assert gib.layout.yaxis.title.text == "compiled peak (GiB)"
    assert any(abs(s.y0 - 60_723.2 / 1024) < 1e-9 for s in gib.layout.shapes)
    assert any("budget 59.3 GiB" in a.text for a in gib.layout.annotations)
    assert max(next(t for t in gib.data if t.name == "a").y) == 3.1 * 20_000 / 1024
