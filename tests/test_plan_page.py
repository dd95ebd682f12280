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


def _page(**params) -> AppTest:
    at = AppTest.from_file(str(ROOT / "pages/plan.py"), default_timeout=60)
    for key, value in params.items():
        at.query_params[key] = value
    return at.run()


def test_the_link_opens_its_question_and_every_field_is_in_it():
    at = _page(plan_preset="llama3.2-1b", plan_devices="8", plan_tokens="0", plan_tensor="1",
               plan_plans="full;minimal", plan_offload="0", plan_also="tpu-v5p:8", plan_budget="1T")
    assert not at.exception, at.exception
    assert at.selectbox(key="plan_preset").value == "llama3.2-1b"
    assert at.number_input(key="plan_devices").value == 8
    command = at.code[0].value
    assert "--preset llama3.2-1b" in command and "--target-devices 8" in command
    assert "--plans 'full;minimal'" in command and "--no-optimizer-offload" in command
    assert "--also tpu-v5p:8" in command and "--global-batch-tokens" not in command
    for key in ("plan_preset", "plan_seq", "plan_target", "plan_devices", "plan_slices", "plan_tokens",
                "plan_tensor", "plan_offload", "plan_plans", "plan_budget", "plan_also"):
        assert key in at.query_params, key
    assert at.query_params["plan_devices"] == "8" and at.query_params["plan_tensor"] == "1"


def test_a_bad_value_in_the_link_is_named_and_the_default_kept():
    at = _page(plan_devices="many", plan_plans="keep_everything", plan_price="-3")
    assert not at.exception, at.exception
    said = " ".join(w.value for w in at.warning)
    assert "`plan_devices`" in said and "`plan_plans`" in said and "`plan_price`" in said
    assert at.number_input(key="plan_devices").value == 256


def test_the_question_and_its_plan_survive_leaving_the_page(monkeypatch, tiny_doc):
    """Through the router, as a visit to another page leaves the session: the page's widgets
    forgotten by Streamlit, the question and the answer kept by the page."""
    from pages import _advisor_run

    monkeypatch.setattr(_advisor_run, "run", lambda kind, cache, key, payload, say, need: tiny_doc)
    at = _page(plan_preset="llama3.2-1b", plan_seq="2048")
    at.number_input(key="plan_devices").set_value(16).run()
    at.button(key="plan_run").click().run()
    answer = at.success[0].value
    kept = {k: at.session_state[k] for k in ("_plan_kept", "_plan_doc", "_page_url_plan")}
    back = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    back.run()
    for k, v in kept.items():
        back.session_state[k] = v
    back.switch_page("pages/guide.py").run()
    back.switch_page("pages/plan.py").run()
    assert not back.exception, back.exception
    assert back.selectbox(key="plan_preset").value == "llama3.2-1b"
    assert back.number_input(key="plan_seq").value == 2048
    assert back.number_input(key="plan_devices").value == 16
    assert back.success and back.success[0].value == answer


def test_a_running_plan_is_found_again(monkeypatch, tiny_doc):
    """A plan of this question in flight (another tab's, or this session's before it left) is
    waited on again without a click."""
    from pages import _advisor_run, _running

    asked = []
    monkeypatch.setattr(_advisor_run, "run", lambda kind, cache, key, payload, say, need: (
        asked.append(key), tiny_doc)[1])
    monkeypatch.setattr(type(_running.pool()), "running", lambda self, kind, key: kind == "plan")
    at = _page(plan_preset="llama3.2-1b", plan_devices="8")
    assert not at.exception, at.exception
    assert asked and at.success  # no click: the answer of the job found running


def test_a_config_file_is_planned_with_costs_side_by_side(monkeypatch, tiny_doc):
    """A config.json's model is planned; each accelerator's cost per million tokens and the
    days and dollars for the budget are shown, at the default price (sourced) or a typed one."""
    import json

    from pages import _advisor_run
    from remat_lab.studies.plan.cost import across_row, add_costs

    doc = json.loads(json.dumps(tiny_doc, default=str))
    add_costs(doc, None, 1e12)
    doc["across"] = [across_row("tpu-v6e", 8, doc), {**across_row("tpu-v6e", 8, doc), "target": "tpu-v5p"}]
    asked = []
    monkeypatch.setattr(_advisor_run, "run", lambda kind, cache, key, payload, say, need: (
        asked.append(payload), doc)[1])
    # Meta's Llama 3.1 8B config.json (the lab refuses Qwen 3's dense config: its per-head q/k
    # RMSNorm is an extra norm, config/model_config.py)
    llama = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
             "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
             "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
             "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
             "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256}
    at = _page(plan_devices="8", plan_also="tpu-v5p:8", plan_budget="1T")
    at.selectbox(key="plan_preset").set_value("(a config file)").run()
    assert any("config.json" in i.value for i in at.info)
    from remat_lab.config.model_config import parse_model_config

    read = parse_model_config(json.dumps(llama), "config.json")
    at.session_state["_plan_model_file"] = ("config.json", read)
    at.run()
    at.button(key="plan_run").click().run()
    assert not at.exception, at.exception
    assert asked and asked[0]["config"]["width"] == 4096 and asked[0]["also"] == [["tpu-v5p", 8, None]]
    across = next(df.value for df in at.dataframe if "accelerator" in df.value.columns)
    assert list(across["accelerator"]) == ["8 x tpu-v6e", "8 x tpu-v5p"]
    assert across["$ per M tokens"].notna().all() and across["$ for the budget"].notna().all()
    # a typed price per chip-hour: the cost scales with it
    at.text_input(key="plan_price").set_value("5.4").run()
    again = next(df.value for df in at.dataframe if "accelerator" in df.value.columns)
    assert again["$ per M tokens"][0] == pytest.approx(across["$ per M tokens"][0] * 5.4 / 2.70)


def test_a_stopped_plan_keeps_what_was_compiled(monkeypatch, tiny_doc):
    """After the Stop (its callback lets go of the job: the pool kills the worker), the page shows
    the rows finished before it, the estimate first, and no answer until the next click."""
    from pages import _advisor_run

    monkeypatch.setattr(_advisor_run, "run", lambda kind, cache, key, payload, say, need: tiny_doc)
    at = _page(plan_preset="llama3.2-1b", plan_devices="8")
    at.button(key="plan_run").click().run()
    key = at.session_state["_plan_doc"][0]
    del at.session_state["_plan_doc"]
    rows = ({"what": "estimate by hand (not compiled): fsdp=8 · full · b4x1", "peak_bytes": 1 << 30,
             "error": "an estimate: off by up to 10% (median 5%) on the 1 compile so far"},
            {"what": "fsdp=8 · full · b4x1", "peak_bytes": 1 << 30, "predicted_s": 1.5})
    at.session_state["_plan_stop"] = key
    at.session_state["_plan_rows"] = (key, rows)
    at.run()
    assert not at.exception, at.exception
    assert at.warning and at.warning[0].value.startswith("**Stopped.** The 2 rows")
    table = at.dataframe[0].value
    assert list(table["compiled"]) == [r["what"] for r in rows] and not at.success
