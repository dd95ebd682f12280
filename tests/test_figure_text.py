"""One escaping path for Plotly: a name a user can influence never becomes markup in a figure."""

import json

import pandas as pd

from remat_lab.present import charts
from remat_lab.present.figure_text import plain

HOSTILE = "<a href='https://example.invalid'>x</a><b>bold</b><span style='color:red'>s</span>"


def test_every_builder_the_pages_call_takes_its_inputs_made_plain():
    builders = [n for n in dir(charts) if n.startswith("make_")]
    assert len(builders) >= 14 and set(builders) <= set(charts.__all__)
    assert all(hasattr(getattr(charts, n), "__wrapped__") for n in builders)


def _markup(fig) -> list[str]:
    text = json.dumps(fig.to_plotly_json(), default=str)
    return [tag for tag in ("<a ", "<b>", "<span style") if tag in text]


def test_a_hostile_policy_name_is_shown_as_written_not_rendered():
    probes = pd.DataFrame({"policy": [HOSTILE, HOSTILE], "batch": [1, 2], "peak_mib": [1.0, 2.0],
                           "fits": [True, False], "answer": [True, False]})
    peak = charts.make_advice_peak_figure(probes, 3.0)
    assert not _markup(peak) and any(t.name == plain(HOSTILE) for t in peak.data)
    rates = pd.DataFrame({"policy": [HOSTILE, "no_remat"], "max_batch": [8, 8],
                          "examples_per_s": [10.0, 9.0], "examples_per_s_low": [9.0, 8.0],
                          "examples_per_s_high": [11.0, 10.0]})
    bars = charts.make_advice_throughput_figure(rates, recommended=HOSTILE)
    assert not _markup(bars) and "&lt;b&gt;bold&lt;/b&gt;" in json.dumps(bars.to_plotly_json(), default=str)
    # ordinary names are untouched: colours and the tests' names still match
    assert charts.make_advice_peak_figure(probes.assign(policy="no_remat"), 3.0).data[0].name == "no_remat"
