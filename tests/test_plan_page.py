"""The Plan page with AppTest: its question as the CLI's command, the planner's answer drawn, no traceback."""

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from remat_lab.serve.in_worker import execute  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(model="llm", width=64, heads=4, depth=1, seq=64, vocab=256, mlp_dim=128, step="train",
            attention="flash", dtype="bfloat16", compile_only=True, target="tpu-v6e", target_devices=8,
            mesh="fsdp=8", batch=8)


@pytest.fixture(scope="module")
def tiny_doc():
    """A plan from the app's worker job (``in_worker.execute``), as the page would get it."""
    lines = []
    doc = execute("plan", {"config": TINY, "global_batch_tokens": 64 * 8 * 4, "slices": None,
                           "tensor": [1], "plans": ["full"], "offload": False, "top": 2}, lines.append)
    assert lines and doc["plans"]
    return doc


def test_the_page_shows_the_command_before_anything_compiles():
    at = AppTest.from_file(str(ROOT / "pages/plan.py"), default_timeout=60).run()
    assert not at.exception
    assert any(c.value.startswith("python -m remat_lab plan --preset ") for c in at.code)


def test_the_answer_is_drawn(monkeypatch, tiny_doc):
    from pages import _advisor_run

    asked = []
    monkeypatch.setattr(_advisor_run, "run", lambda kind, cache, key, payload, say, need: (
        asked.append((kind, payload)), tiny_doc)[1])
    at = AppTest.from_file(str(ROOT / "pages/plan.py"), default_timeout=60).run()
    at.button(key="plan_run").click().run()
    assert not at.exception, at.exception
    assert asked and asked[0][0] == "plan" and asked[0][1]["plans"]
    best = tiny_doc["plans"][0]
    assert at.success and f"per-device batch {best['per_device_batch']:g}" in at.success[0].value
    assert any(c.value == best["maxtext_yaml"] for c in at.code)
    table = at.dataframe[0].value
    assert list(table["tokens/s/device"]) == [round(p["predicted_tokens_per_s_per_device"])
                                             for p in tiny_doc["plans"]]


def test_an_h100_question_offers_the_hosts_network_and_its_command_keeps_it():
    """A GPU with a choice of host network (h100: A3 Mega by default, A3 High, a DGX) offers it; the
    default is not written, another is, in the command and the configuration the planner gets."""
    at = AppTest.from_file(str(ROOT / "pages/plan.py"), default_timeout=60).run()
    assert not at.exception
    assert not any(s.key == "plan_network" for s in at.selectbox)  # a v6e has none
    at.selectbox(key="plan_target").set_value("h100").run()
    at.number_input(key="plan_devices").set_value(16).run()
    assert at.selectbox(key="plan_network").value == "a3-mega"
    assert "--network" not in at.code[0].value
    at.selectbox(key="plan_network").set_value("a3-high").run()
    assert not at.exception, at.exception
    assert "--target h100 --target-devices 16 --network a3-high" in at.code[0].value
