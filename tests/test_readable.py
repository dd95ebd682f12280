"""Readable at any size: the advisor's chart scaled to the probes near the budget (an outlier drawn
at the top edge, marked, its peak in its hover and a note), a hand-typed llm's parameter count
shown as a preset's is."""

from pathlib import Path

import pandas as pd
import pytest

from remat_lab.config import PRESETS, RunConfig, llm_parameters
from remat_lab.present import charts
from remat_lab.present.study_charts import OFF_SCALE

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024.0  # MiB


def _probes(outlier_gib: float) -> pd.DataFrame:
    return pd.DataFrame({"policy": ["no_remat", "no_remat", "nothing_saveable", "everything_saveable"],
                         "batch": [8, 16, 32, 8],
                         "peak_mib": [30 * GIB, 62 * GIB, 55 * GIB, outlier_gib * GIB],
                         "fits": [True, False, True, False], "answer": [True, False, True, False]})


def test_an_outlier_probe_is_off_the_scale_and_marked():
    budget = 60 * GIB
    fig = charts.make_advice_peak_figure(_probes(700), budget)
    cap = OFF_SCALE * 60
    top = fig.layout.yaxis.range[1]
    assert cap <= top < 1.1 * cap  # the axis ends near 3 budgets, not at 700 GiB
    out = next(t for t in fig.data if t.name == "everything_saveable")
    assert list(out.y) == [cap] and list(out.marker.symbol) == ["triangle-up"]
    assert float(out.customdata[0][0]) == pytest.approx(700) and "off the scale" in out.customdata[0][1]
    assert any("1 probe off the scale, up to 700.0 GiB" in (a.text or "") for a in fig.layout.annotations)
    near = next(t for t in fig.data if t.name == "no_remat")
    assert list(near.y) == [30, 62] and set(near.marker.symbol) == {"circle"}  # the rest as they are


def test_without_an_outlier_the_axis_is_plotlys_own():
    fig = charts.make_advice_peak_figure(_probes(100), 60 * GIB)
    assert fig.layout.yaxis.range is None
    assert not any("off the scale" in (a.text or "") for a in fig.layout.annotations)


def _sidebar_captions(**params) -> str:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / "targets.py"), default_timeout=120)
    at.query_params.update(params)
    at.run()
    assert not at.exception
    return "\n".join(c.value for c in at.sidebar.caption)


def test_a_hand_typed_llm_shows_its_parameter_count():
    said = _sidebar_captions(model="llm", width="512", depth="4", heads="8", vocab="32000",
                             seq="64", batch="1")
    count = llm_parameters(RunConfig(model="llm", width=512, depth=4, heads=8, vocab=32000, seq=64))
    assert f"{count / 1e6:.2f} M parameters, counted from this shape." in said
    preset = _sidebar_captions(preset="llama3-8b", batch="1")
    assert "counted from this shape" not in preset  # the preset's label says its own count
    edited = _sidebar_captions(preset="llama3-8b", depth="16", batch="1")
    assert f"(llama3-8b publishes {PRESETS['llama3-8b']['parameters'] / 1e9:.2f} B)" in edited
