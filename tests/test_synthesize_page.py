"""The Synthesize page with AppTest: its link's settings restored, a bad budget refused, the plan drawn."""

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from remat_lab.present.synth_charts import make_synthesis_figure, synthesis_frame  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LINK = {"model": "mlp", "width": "64", "depth": "2", "stack": "scan", "budget": "400K",
        "policies": "nothing_saveable,dots_saveable"}  # two named policies to beat: fewer compiles


def _app(**params) -> AppTest:
    at = AppTest.from_file(str(ROOT / "pages/synthesize.py"), default_timeout=300)
    for key, value in params.items():
        at.query_params[key] = value
    return at


def test_a_bad_budget_from_the_link_is_said_and_nothing_runs():
    at = _app(**{**LINK, "budget": "[x](https://evil.example)", "goal": "most"}).run()
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    assert "budget" in warnings and "goal" in warnings
    bad = _app(**{**LINK, "policies": "nothing_saveable,<img src=x>"}).run()
    assert any("URL parameter `policies`" in w.value for w in bad.warning)
    assert len(bad.multiselect(key="synth_named").value) > 2  # the default list, not the link's
    assert at.text_input(key="synth_budget").value != "[x](https://evil.example)"


def test_the_plan_is_drawn_from_the_link():
    at = _app(**LINK).run()
    assert not at.exception and at.text_input(key="synth_budget").value == "400K"
    assert at.multiselect(key="synth_named").value == ["nothing_saveable", "dots_saveable"]
    at.button(key="synth_run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.success and at.success[0].value.startswith("Answer:")
    plan = next(df.value for df in at.dataframe if "choice" in df.value.columns)
    assert set(plan["checkpoint name"]) == {"l1", "l2"}
    codes = " ".join(c.value for c in at.code)
    assert "save_and_offload_only_these_names" in codes and "--budget 409600" in codes
    assert "--policies nothing_saveable,dots_saveable" in codes  # the CLI call gives the same answer
    assert [r["policy"] for r in at.session_state["_synth_doc"][1]["named"]] == [
        "nothing_saveable", "dots_saveable"]


def test_the_chart_takes_an_empty_frame_and_a_document():
    empty = synthesis_frame({})
    assert empty.empty and make_synthesis_figure(empty, 64.0).layout.annotations
    doc = {"answer": "plan", "plan": {"save": ["a"], "offload": [], "recompute": [], "remat_layers": 2},
           "candidates": [{"plan": {"save": ["a"], "offload": [], "recompute": [], "remat_layers": 2},
                           "max_batch": 4, "peak_bytes": 3 << 20, "predicted_peak_bytes": 2 << 20,
                           "error_share": 1 / 3, "recomputed_flops": 2e9, "fits": True}],
           "named": [{"policy": "<b>x</b>", "max_batch": 2, "peak_bytes": 1 << 20,
                      "recomputed_flops": 5e9, "fits": True}]}
    df = synthesis_frame(doc)
    assert df["answer"].tolist() == [True, False]
    from remat_lab.present import charts

    fig = charts.make_synthesis_figure(df, 4.0)
    names = [t.name for t in fig.data]
    assert "the answer" in names and "&lt;b&gt;x&lt;/b&gt;" in names  # escaped, never markup
