"""The app's language model: preset and step controls from the URL, compile-only runs, memory by kind."""

from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from remat_lab.present import charts, tables  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _app(page: str, **params) -> AppTest:
    at = AppTest.from_file(str(ROOT / page), default_timeout=300)
    for key, value in params.items():
        at.query_params[key] = value
    return at


def test_preset_compile_only_shows_parameters_and_memory_by_kind():
    at = _app("pages/explore.py", model="llm", preset="gpt2-small", seq="16", batch="1", depth="2",
              step="train", compile_only="true", dtype="bfloat16").run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert at.selectbox(key="preset").value == "gpt2-small"
    assert at.number_input(key="vocab").value == 50257 and at.toggle(key="compile_only").value
    if any(b.key == "explore_run" for b in at.button):  # depth 2 at seq 16 may run at once
        at.button(key="explore_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    metric = {m.label: m.value for m in at.metric}
    # gpt2-small's shape at depth 2: 2 blocks of 4 x 768^2 + 3 x 768 x 2048 + 2 x 768, the tied
    # 50257 x 768 embedding, the final norm.
    assert metric["Parameters"] == "52.8 M"  # 2 x 7,079,424 + 38,597,376 + 768 = 52,756,992
    assert metric["Measured step time"] == "none" and metric["Gradient check"] == "not run"
    assert metric["Optimizer state"] != "none"
    assert any("Compiled only, nothing ran" in i.value for i in at.info)
    assert any("What fills the memory at the peak" in s.value for s in at.subheader)
    assert any("split by kind" in c.value for c in at.caption)
    assert at.query_params["preset"] == "gpt2-small" and at.query_params["compile_only"] == "True"


def test_a_bad_preset_warns_and_falls_back():
    at = _app("pages/guide.py", model="llm", preset="llama9-900b", seq="16").run()
    assert not at.exception
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1 and "`preset`" in warnings[0] and "llama3.2-1b" in warnings[0]
    assert at.selectbox(key="preset").value == ""
    assert "preset" not in at.query_params


@pytest.mark.parametrize("model", ["transformer", "llm"])
def test_heads_that_do_not_divide_the_width_warn(model):
    at = _app("pages/guide.py", model=model, width="64", heads="3", seq="16", batch="2").run()
    assert not at.exception
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1 and "`heads`" in warnings[0] and "divide the width 64" in warnings[0]
    assert at.select_slider(key="heads").value == 4 and at.query_params["heads"] == "4"


def test_over_budget_offers_compile_only(monkeypatch):
    monkeypatch.setenv("REMAT_LAB_MEMORY_BUDGET", "64M")
    at = _app("pages/guide.py", model="llm", preset="llama3.2-1b", seq="64", batch="1").run()
    flags = [e.value for e in at.sidebar.error]
    assert len(flags) == 1 and "compiled without running" in flags[0] and "no step time" in flags[0]
    at.toggle(key="compile_only").set_value(True).run()
    assert not at.error and any("Compiled only" in i.value for i in at.sidebar.info)


def test_memory_by_kind_figure():
    assert len(charts.make_memory_by_kind_figure(pd.DataFrame(columns=["run", "kind", "bytes"])).data) == 0
    doc = {"config": {"policy": "minimal"}, "memory": {"by_kind": {
        "parameters": 2 << 30, "optimizer_state": 4 << 30, "gradients": 2 << 30, "activations": 10 << 30,
        "logits": 1 << 29, "other": 0, "method": "by size"}}}
    frame = tables.memory_by_kind_frame([doc])
    assert list(frame["kind"]) == ["parameters", "optimizer_state", "gradients", "activations",
                                   "logits", "other"]
    fig = charts.make_memory_by_kind_figure(frame)
    assert [t.name for t in fig.data][:2] == ["parameters", "optimizer state"]
    assert "GiB" in fig.layout.xaxis.title.text
    assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0  # under the bars
