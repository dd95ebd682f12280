"""Answers and settings survive links and navigation: Start's fields in its link, every dropped
mesh value said, the Targets page applying a link's mesh to the targets' devices, a finished
synthesis still there after a visit to another page."""

import re
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from remat_lab.config import RunConfig, budget_text, parse_bytes  # noqa: E402
from remat_lab.studies.experiment import run_experiment  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = {"width": "64", "batch": "8", "depth": "1", "repeats": "3"}
SLOW = {"width": "2048", "batch": "1024", "depth": "1", "repeats": "3"}  # nothing runs by itself


def _page(page: str, **params) -> AppTest:
    at = AppTest.from_file(str(ROOT / "pages" / page), default_timeout=300)
    at.query_params.update(params)
    return at


def _app(**params) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.query_params.update({**SLOW, **params})
    return at.run()


def _warnings(at: AppTest) -> str:
    return "\n".join(w.value for w in at.warning)


def test_start_restores_its_fields_from_its_link_and_writes_them_back():
    at = _page("begin.py", start_preset="gpt2-small", start_seq="512", start_target="tpu-v5e",
               start_devices="16", start_recipe="0").run()
    assert not at.exception and not at.error and not at.warning, _warnings(at)
    assert at.selectbox(key="start_preset").value == "gpt2-small"
    assert at.number_input(key="start_seq").value == 512  # the link's, not gpt2's own 1024
    assert at.selectbox(key="start_target").value == "tpu-v5e"
    assert at.number_input(key="start_devices").value == 16 and at.toggle(key="start_recipe").value is False
    at.number_input(key="start_devices").set_value(32).run()
    assert at.query_params["start_devices"] == "32" and at.query_params["start_preset"] == "gpt2-small"
    bad = _page("begin.py", start_preset="gpt9", start_devices="0").run()
    said = _warnings(bad)
    assert "`start_preset`" in said and "gpt9" in said and "`start_devices`" in said
    assert bad.selectbox(key="start_target").value == "h100"  # the defaults stand


def test_start_keeps_its_fields_when_you_leave_and_return():
    at = _app()
    at.switch_page("pages/begin.py").run()
    at.selectbox(key="start_preset").set_value("gpt2-small").run()
    at.number_input(key="start_devices").set_value(4).run()
    at.switch_page("pages/guide.py").run()
    at.switch_page("pages/begin.py").run()
    assert not at.exception
    assert at.selectbox(key="start_preset").value == "gpt2-small"
    assert at.number_input(key="start_devices").value == 4
    assert at.number_input(key="start_seq").value == 1024


@pytest.mark.parametrize("params,said", [
    ({"mesh": "fsdp=8"}, "`mesh` = `fsdp=8` uses 8 devices, which does not divide the 1"),
    ({"mesh": "fsdp=3"}, "`mesh` = `fsdp=3` uses 3 devices, which does not divide the 1"),
    ({"mesh": "fsdp=3", "target": "h100"}, "`mesh` = `fsdp=3`: fsdp=3 is not offered here"),
    ({"mesh": "fsdp=eight"}, "URL parameter `mesh` is not valid"),
], ids=["no-devices", "does-not-divide", "not-offered-on-a-target", "not-a-mesh"])
def test_every_dropped_mesh_of_a_link_is_said(params, said):
    at = _page("targets.py", **SLOW, **params).run()
    assert not at.exception
    assert said in _warnings(at), _warnings(at)


def test_a_link_mesh_on_the_targets_page_compiles_on_the_targets_devices():
    """``mesh=fsdp=8`` on a one-device server: said as not usable here, then applied by Targets to
    the H100's devices; the page's peak is the 8-device program's (compiled here again, apart)."""
    at = _page("targets.py", **TINY, mesh="fsdp=8", targets="h100", policies="no_remat").run()
    assert not at.exception and "uses 8 devices" in _warnings(at)
    assert any("`fsdp=8` is applied to each named target's devices" in i.value for i in at.info)
    at.button(key="targets_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.session_state["_targets_done"][0].mesh == "fsdp=8"
    table = next(df.value for df in at.dataframe if "peak_mib" in df.value.columns)
    cfg = RunConfig(model="mlp", width=64, batch=8, depth=1, policy="no_remat", target="h100")
    eight = run_experiment(cfg.replace(mesh="fsdp=8", target_devices=8), timing=False)
    one = run_experiment(cfg, timing=False)
    shown = table["peak_mib"].iloc[0] * 2**20
    assert shown == pytest.approx(eight["memory"]["peak_bytes"], rel=1e-6)
    assert shown != pytest.approx(one["memory"]["peak_bytes"], rel=1e-3)


def test_synthesize_keeps_its_settings_when_you_leave_and_return():
    at = _app(model="mlp", width="64", depth="2")
    at.switch_page("pages/synthesize.py").run()
    default = at.text_input(key="synth_budget").value  # readable: never "12341832K"
    assert re.fullmatch(r"\d{1,4}(\.\d{1,2})?[GMK]?", default), default
    at.text_input(key="synth_budget").set_value("400K").run()
    at.multiselect(key="synth_named").set_value(["nothing_saveable", "dots_saveable"]).run()
    at.switch_page("pages/guide.py").run()
    assert "synth_budget" not in at.session_state  # Streamlit dropped the widgets' own state ...
    at.switch_page("pages/synthesize.py").run()
    assert not at.exception
    assert at.text_input(key="synth_budget").value == "400K"  # ... and the page restored it
    assert at.multiselect(key="synth_named").value == ["nothing_saveable", "dots_saveable"]


def test_a_finished_synthesis_stays_when_you_leave_and_return():
    """The answer is computed on the page (AppTest clicks buttons only in a page run alone); the
    session's state then goes through the router, as a visit to another page leaves it: the
    page's widgets forgotten (the test above sees Streamlit drop them), what the page kept."""
    link = {"model": "mlp", "width": "64", "depth": "2", "stack": "scan", "batch": "8", "repeats": "3"}
    at = _page("synthesize.py", **link, budget="400K", policies="nothing_saveable,dots_saveable").run()
    at.button(key="synth_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    answer = at.success[0].value
    assert answer.startswith("Answer:")
    kept = {k: at.session_state[k] for k in ("_synth_done", "_synth_doc", "_synth_kept")}
    back = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    back.query_params.update(link)
    back.run()
    for k, v in kept.items():
        back.session_state[k] = v
    back.switch_page("pages/guide.py").run()
    back.switch_page("pages/synthesize.py").run()
    assert not back.exception and not back.error
    assert back.text_input(key="synth_budget").value == "400K"
    assert back.success and back.success[0].value == answer  # the answer, not "click to synthesize"
    assert not [b for b in back.button if b.key == "synth_stop"]


def test_a_default_budget_is_written_readably():
    assert budget_text(12341832 << 10) == "11.77G"  # not 12341832K
    assert parse_bytes("11.77G") <= 12341832 << 10  # never above the budget it stands for
    assert budget_text(16 << 30) == "16G" and budget_text(400 << 10) == "400K" and budget_text(100) == "100"


def test_a_finished_advice_stays_when_you_leave_and_return():
    """As the synthesis above: the advice computed on the page, then its session through the router."""
    link = {"model": "mlp", "width": "64", "depth": "2", "stack": "scan", "batch": "8", "repeats": "3"}
    at = _page("advisor.py", **link, budget="400K", policies="no_remat,nothing_saveable", timed="0").run()
    at.button(key="advisor_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    said = [s.value for s in at.success]
    assert said and "Recommended" in said[0]
    kept = {k: at.session_state[k] for k in ("_advisor_done", "_advisor_doc", "_advisor_kept")}
    back = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    back.query_params.update(link)
    back.run()
    for k, v in kept.items():
        back.session_state[k] = v
    back.switch_page("pages/guide.py").run()
    back.switch_page("pages/advisor.py").run()
    assert not back.exception and not back.error
    assert back.text_input(key="advisor_budget").value == "400K"
    assert back.multiselect(key="advisor_policies").value == ["no_remat", "nothing_saveable"]
    assert [s.value for s in back.success] == said  # the answer, not "click to advise"
