"""Each page's own settings in the URL: restored on a fresh session, written back, bad values warned."""

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Large enough that no page runs anything by itself (Compare waits for a click): only the controls.
SLOW = {"width": "2048", "batch": "1024", "depth": "1", "repeats": "3"}


def _app(page: str, **params) -> AppTest:
    at = AppTest.from_file(str(ROOT / "pages" / page), default_timeout=120)
    for key, value in {**SLOW, **params}.items():
        at.query_params[key] = value
    return at


def _warnings(at: AppTest) -> list[str]:
    return [w.value for w in at.warning]


def test_compare_restores_its_policies_and_writes_them_back():
    at = _app("compare.py", policies="no_remat,nothing_saveable").run()
    assert not at.exception, at.exception
    assert at.multiselect(key="compare_policies").value == ["no_remat", "nothing_saveable"]
    assert at.query_params["policies"] == "no_remat,nothing_saveable"
    assert at.query_params["width"] == "2048"  # the sidebar's keys stay beside the page's
    assert not _warnings(at)
    at.multiselect(key="compare_policies").set_value(["dots_saveable"]).run()
    assert at.query_params["policies"] == "dots_saveable"


def test_compare_bad_policies_warn_and_fall_back():
    at = _app("compare.py", policies="no_remat,rm -rf").run()
    assert not at.exception
    warnings = _warnings(at)
    assert len(warnings) == 1 and "`policies`" in warnings[0] and "rm -rf" in warnings[0]
    assert "no_remat" in at.multiselect(key="compare_policies").value
    assert len(at.multiselect(key="compare_policies").value) > 2  # the default set


def test_sweep_restores_any_grid_within_the_limits():
    at = _app("sweep.py", widths="40,16", batches="3,4", policies="no_remat,nothing_saveable").run()
    assert not at.exception, at.exception
    assert not _warnings(at)
    assert at.multiselect(key="sweep_widths").value == [16, 40]  # 40: not a power of two
    assert at.multiselect(key="sweep_batches").value == [3, 4]
    assert at.multiselect(key="sweep_policies").value == ["no_remat", "nothing_saveable"]
    assert "40" in at.multiselect(key="sweep_widths").options
    assert (at.query_params["widths"], at.query_params["batches"]) == ("16,40", "3,4")
    assert at.query_params["policies"] == "no_remat,nothing_saveable"
    at.multiselect(key="sweep_widths").set_value([16]).run()
    assert at.query_params["widths"] == "16"


@pytest.mark.parametrize("key,value", [("widths", "16,99999"), ("widths", "abc"), ("batches", "-1"),
                                       ("batches", ",".join(["2"] * 40)), ("policies", "bogus")])
def test_sweep_bad_grid_values_warn_and_fall_back(key, value):
    at = _app("sweep.py", **{key: value, **({"widths": "24"} if key != "widths" else {})}).run()
    assert not at.exception
    warnings = _warnings(at)
    assert len(warnings) == 1 and f"`{key}`" in warnings[0] and "Using the default" in warnings[0]
    defaults = {"widths": [64, 256], "batches": [16, 64],
                "policies": ["no_remat", "nothing_saveable", "dots_with_no_batch_dims_saveable"]}
    assert at.multiselect(key=f"sweep_{key}").value == defaults[key]
    if key != "widths":
        assert at.multiselect(key="sweep_widths").value == [24]  # the valid parameter is kept


def test_sweep_takes_a_typed_width_and_refuses_a_bad_one():
    at = _app("sweep.py", widths="16", batches="4", policies="no_remat").run()
    at.multiselect(key="sweep_widths").set_value([16, "48", "x9"]).run()
    assert not at.exception, at.exception
    assert at.multiselect(key="sweep_widths").value == [16, 48]
    assert any("left out" in w and "x9" in w for w in _warnings(at))
    assert at.query_params["widths"] == "16,48"


def test_advisor_restores_budget_policies_and_timing():
    at = _app("advisor.py", budget="96M", policies="no_remat,nothing_saveable", timed="0").run()
    assert not at.exception, at.exception
    assert not _warnings(at)
    assert at.text_input(key="advisor_budget").value == "96M"
    assert at.multiselect(key="advisor_policies").value == ["no_remat", "nothing_saveable"]
    assert at.toggle(key="advisor_timing").value is False
    assert {k: at.query_params[k] for k in ("budget", "policies", "timed")} == {
        "budget": "96M", "policies": "no_remat,nothing_saveable", "timed": "0"}
    at.toggle(key="advisor_timing").set_value(True).run()
    assert at.query_params["timed"] == "1"


@pytest.mark.parametrize("key,value,widget,check", [
    ("budget", "lots", "text_input", lambda v: v != "lots"),
    ("budget", "-5M", "text_input", lambda v: v != "-5M"),
    ("policies", "no_remat,__import__", "multiselect", lambda v: len(v) > 2),
    ("timed", "maybe", "toggle", lambda v: v is True),
])
def test_advisor_bad_values_warn_and_fall_back(key, value, widget, check):
    at = _app("advisor.py", **{key: value}).run()
    assert not at.exception
    warnings = _warnings(at)
    assert len(warnings) == 1 and f"`{key}`" in warnings[0] and "Using the default" in warnings[0]
    assert check(getattr(at, widget)(key=f"advisor_{'timing' if key == 'timed' else key}").value)


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    from remat_lab.store import history

    monkeypatch.setenv("REMAT_LAB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("REMAT_LAB_PUBLIC", "0")
    for width, policy, backend in ((64, "no_remat", "cpu"), (128, "nothing_saveable", "cpu"),
                                   (256, "nothing_saveable", "gpu")):
        history.record({"schema": 1, "config": {
            "model": "mlp", "width": width, "batch": 4, "seq": 16, "depth": 1, "stack": "scan",
            "dtype": "float32", "policy": policy, "objective": "value_and_grad"},
            "environment": {"backend": backend, "device_kind": backend, "device_count": 1, "jax": "0.10.2"},
            "step_time_s": {"median": 0.002}, "memory": {"peak_bytes": 1024 * width},
            "gradient_check": {"ok": True}}, source="cli")


def _history(**params) -> AppTest:
    at = AppTest.from_file(str(ROOT / "pages" / "history.py"), default_timeout=60)
    for key, value in params.items():
        at.query_params[key] = value
    return at.run()


def test_history_restores_its_filters(recorded):
    at = _history(policies="nothing_saveable", backends="cpu")
    assert not at.exception, at.exception
    assert not _warnings(at)
    assert at.multiselect(key="history_policies").value == ["nothing_saveable"]
    assert at.multiselect(key="history_backends").value == ["cpu"]
    assert at.multiselect(key="history_models").value == []
    assert at.dataframe[0].value["width"].tolist() == [128]
    assert at.query_params["policies"] == "nothing_saveable" and "models" not in at.query_params
    at.multiselect(key="history_backends").set_value([]).run()
    assert "backends" not in at.query_params and len(at.dataframe[0].value) == 2


def test_history_filter_without_runs_warns_and_is_left_off(recorded):
    at = _history(models="transformer", backends="cpu")
    assert not at.exception
    warnings = _warnings(at)
    assert len(warnings) == 1 and "`models`" in warnings[0] and "no filter" in warnings[0]
    assert at.multiselect(key="history_models").value == []
    assert at.multiselect(key="history_backends").value == ["cpu"]


def test_the_advisor_offers_maxtexts_recipes_by_default_for_an_llm():
    """Issue 32: for an llm (whose blocks name their tensors) the default list is JAX's policies and
    MaxText's recipes, as the CLI's ``advise`` has it; for the MLP JAX's only."""
    from remat_lab.model.policies import POLICIES
    from remat_lab.studies.advisor import _policy_list

    llm = _app("advisor.py", model="llm", preset="llama3.2-1b", width="64", heads="4", depth="2",
               seq="32", vocab="128").run()
    assert not llm.exception, llm.exception
    chosen = llm.multiselect(key="advisor_policies").value
    assert chosen == _policy_list(None, "llm")  # the CLI's default, in the same order
    assert {POLICIES[p].group for p in chosen} == {"jax", "maxtext"} and "qkv_proj_offloaded" in chosen
    mlp = _app("advisor.py", model="mlp").run()
    assert {POLICIES[p].group for p in mlp.multiselect(key="advisor_policies").value} == {"jax"}
