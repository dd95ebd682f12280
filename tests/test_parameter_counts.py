"""Total and active parameters (issue 65): the engine's counts, the run and plan documents and the
CLI's lines, the sidebar's MoE fields and count, Start's and a model loaded that fits or says why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remat_lab.config import (
    BUDGET_ENV,
    PRESETS,
    RunConfig,
    llm_parameters,
    parameter_counts,
    parameters_text,
)
from remat_lab.program.footprint import starting_shape

ROOT = Path(__file__).resolve().parents[1]


def test_a_mixture_of_experts_has_total_and_active_counts():
    qwen = RunConfig.from_preset("qwen3-30b-a3b")
    counts = parameter_counts(qwen)
    assert abs(counts["parameters"] - 30.5e9) <= 0.01 * 30.5e9  # 30,532,110,336
    # the model card's 3.3 B activated is truncated: the shape's 3,353,020,416 reads 3.3 to one decimal
    assert counts["active_parameters"] == 3_353_020_416 and int(counts["active_parameters"] / 1e8) == 33
    assert parameters_text(qwen) == "30.53 B parameters, 3.35 B active (8 of 128 experts a token)"
    mixtral = parameter_counts(RunConfig.from_preset("mixtral-8x7b"))
    assert abs(mixtral["active_parameters"] - 12.9e9) <= 0.01 * 12.9e9
    assert abs(mixtral["parameters"] - 46.7e9) <= 0.01 * 46.7e9
    dense = RunConfig.from_preset("qwen3-8b")
    assert parameter_counts(dense) == {"parameters": llm_parameters(dense)}
    assert parameters_text(dense) == "8.19 B parameters"
    assert parameter_counts(RunConfig()) == {} and parameters_text(RunConfig()) == ""


def test_the_run_document_and_the_cli_say_the_active_count():
    from remat_lab.cli.plan import format_plan
    from remat_lab.cli.run import _model_line
    from remat_lab.program.step import abstract_problem, model_report

    cfg = RunConfig(model="llm", width=64, depth=2, heads=4, vocab=128, seq=16, batch=2, experts=4,
                    experts_per_token=2, expert_mlp_dim=32, compile_only=True)
    m = model_report(abstract_problem(cfg))
    assert m["parameters"] == llm_parameters(cfg)
    assert m["active_parameters"] == llm_parameters(cfg, active=True)
    assert m["active_parameters"] < m["parameters"]
    assert _model_line(m)[0].startswith(f"model: {m['parameters']:,} parameters, "
                                        f"{m['active_parameters']:,} active a token (")
    assert "active_parameters" not in model_report(abstract_problem(cfg.replace(
        experts=0, experts_per_token=2, expert_mlp_dim=0)))
    doc = {"config": {"preset": "qwen3-30b-a3b"}, "devices": 64, "target": "tpu-v5p", "slices": 1,
           "global_batch_tokens": None, "hbm_bytes": 95 << 30, "plans": [], "published_rows": [],
           "beats_published": None, "candidates_predicted": 0, "candidates_compiled": 0, "wall_s": 0,
           "memory_model_error": {"compiled_candidates": 0, "max": None}, "left_out": [],
           **parameter_counts(RunConfig.from_preset("qwen3-30b-a3b"))}
    assert "model: 30.53 B parameters, 3.35 B active a token" in format_plan(doc).splitlines()
    json.dumps(doc)  # the plan document's counts are plain integers (--json)


def test_a_loaded_model_gets_a_batch_and_seq_that_fit_or_why_none_does():
    small = RunConfig.from_preset("gpt2-small", batch=128)
    found = starting_shape(small, 16 << 30)
    assert found["fits"] and not found["compile_only"] and found["seq"] == 1024 and 1 <= found["batch"] <= 8
    tight = starting_shape(small, 1700 << 20)  # a shorter seq where the model's does not fit
    assert tight["fits"] and tight["seq"] < 1024 and "does not fit" in tight["text"]
    big = starting_shape(RunConfig.from_preset("qwen3-8b", batch=128), 12 << 30)
    assert not big["fits"] and big["compile_only"] and (big["batch"], big["seq"]) == (1, 8192)
    assert big["text"].startswith("qwen3-8b cannot run on this server at any batch or seq: batch 1 at "
                                  "seq 128")
    on_tpu = starting_shape(RunConfig.from_preset("qwen3-8b", target="tpu-v5p", target_devices=8,
                                                  mesh="fsdp=8", batch=128), None)
    assert (on_tpu["batch"], on_tpu["seq"], on_tpu["fits"]) == (8, 8192, True)


pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

QWEN3_8B = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
            "max_position_embeddings": 40960, "model_type": "qwen3", "num_attention_heads": 32,
            "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "vocab_size": 151936}


@pytest.fixture(autouse=True)
def _budget(monkeypatch):
    """This server's budget pinned (12 GiB), so what fits does not depend on the machine."""
    monkeypatch.setenv(BUDGET_ENV, "12GiB")


def _guide() -> AppTest:
    at = AppTest.from_file(str(ROOT / "pages" / "guide.py"), default_timeout=300)
    at.run()
    return at


def test_the_sidebar_counts_a_mixture_of_experts_and_offers_its_fields():
    at = _guide()
    at.radio(key="model").set_value("llm").run()
    at.selectbox(key="preset").set_value("qwen3-30b-a3b").run()
    assert not at.exception
    said = [c.value for c in at.sidebar.caption]
    assert ("30.53 B parameters, 3.35 B active (8 of 128 experts a token), counted from this shape "
            "(qwen3-30b-a3b publishes 30.50 B, 3.30 B active).") in said
    assert at.number_input(key="experts").value == 128 and at.number_input(key="experts_per_token").value == 8
    assert at.number_input(key="expert_mlp_dim").value == 768
    assert at.selectbox(key="router_gating").value == "softmax"
    # loaded: nothing fits this server, so it is compiled only, said plainly; no "cannot run here"
    assert not any("cannot run here" in e.value for e in at.sidebar.error)
    assert at.toggle(key="compile_only").value is True
    assert any(i.value.startswith("qwen3-30b-a3b cannot run on this server at any batch or seq")
               for i in at.sidebar.info)
    at.selectbox(key="preset").set_value("llama3.2-1b").run()  # a dense model: no MoE fields
    assert not at.exception and "experts" not in [n.key for n in at.sidebar.number_input]


def test_an_imported_8b_shows_no_cannot_run_here_for_settings_never_chosen():
    at = _guide()
    assert at.session_state["batch"] == 128  # the mlp's
    at.radio(key="model").set_value("llm").run()
    at.text_area(key="model_config_text").set_value(json.dumps(QWEN3_8B)).run()
    at.button(key="model_config_read").click().run()
    assert not at.exception and not at.sidebar.error, [e.value for e in at.sidebar.error]
    assert (at.session_state["batch"], at.session_state["seq"]) == (1, 8192)
    assert any("8.19 B parameters, counted from this shape." == c.value for c in at.sidebar.caption)
    assert any("cannot run on this server at any batch or seq" in i.value for i in at.sidebar.info)


def test_start_keeps_the_models_length_for_a_bad_start_seq_and_counts_the_model():
    at = AppTest.from_file(str(ROOT / "pages" / "begin.py"), default_timeout=300)
    at.query_params.update(start_preset="qwen3-30b-a3b", start_seq="abc")
    at.run()
    assert not at.exception
    assert at.number_input(key="start_seq").value == PRESETS["qwen3-30b-a3b"]["seq"] == 4096
    assert any("`start_seq`" in w.value and "the model's own" in w.value for w in at.warning)
    assert any(c.value == "qwen3-30b-a3b: 30.53 B parameters, 3.35 B active (8 of 128 experts a token), "
               "counted from its shape." for c in at.caption)


def test_a_dense_model_after_a_mixture_of_experts_leaves_its_fields_at_rest():
    at = _guide()
    at.radio(key="model").set_value("llm").run()
    at.selectbox(key="preset").set_value("qwen3-30b-a3b").run()
    at.number_input(key="capacity_factor").set_value(1.25).run()
    at.selectbox(key="preset").set_value("gpt2-small").run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert (at.session_state["capacity_factor"], at.session_state["batch"], at.session_state["seq"]) == (
        0.0, 8, 1024)  # gpt2-small's batch 8 at seq 1024: about 9.0 GiB of the tests' 12 GiB


SECTION = """
import sys
sys.path.insert(0, {root!r})
from pages._llm_views import model_section
from remat_lab.config import RunConfig
cfg = RunConfig(model="llm", width=64, depth=2, heads=4, vocab=128, seq=16, batch=2, experts=4,
                experts_per_token=2, expert_mlp_dim=32)
model_section(cfg, {{"model": {{"parameters": 229824, "active_parameters": 131520,
                                "parameter_bytes": 919296, "optimizer_state_bytes": 0}}, "memory": {{}}}})
"""


def test_explores_model_section_says_the_active_count():
    at = AppTest.from_string(SECTION.format(root=str(ROOT)), default_timeout=60).run()
    assert not at.exception, at.exception
    assert at.metric[0].value == "230 k (132 k active)"
