"""The sidebar's model config box: a pasted config fills the llm's shape (no preset, the recipe's
dtypes) and lists what is not modelled; a file the lab cannot model is an error naming its keys."""

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "model_configs"


def _errors(at: AppTest) -> list[str]:
    """The page's errors but the over-budget flag (a published shape at full size is over it)."""
    return [e.value for e in at.error if e.icon != ":material/memory:"]


def _guide() -> AppTest:
    at = AppTest.from_file(str(ROOT / "pages" / "guide.py"), default_timeout=120)
    at.query_params.update(model="llm", preset="llama3-8b", seq="16", batch="1")
    return at.run()


def test_a_pasted_maxtext_yaml_fills_the_shape():
    at = _guide()
    assert not at.exception
    at.text_area(key="model_config_text").input((FIXTURES / "maxtext-llama2-70b.yml").read_text()).run()
    at.button(key="model_config_read").click().run()
    assert not at.exception and not _errors(at), _errors(at)
    assert at.selectbox(key="preset").value == ""  # a file is not a preset
    assert (at.number_input(key="width_exact").value, at.slider(key="depth").value,
            at.select_slider(key="heads").value, at.selectbox(key="kv_heads").value,
            at.number_input(key="mlp_dim").value, at.number_input(key="vocab").value) == (
        8192, 80, 64, 8, 28672, 32000)
    assert (at.session_state["dtype"], at.session_state["param_dtype"]) == ("bfloat16", "float32")
    said = " ".join(c.value for c in at.sidebar.caption)
    assert "From the pasted config (a MaxText model YAML (decoder_block llama2))" in said
    assert "logical_axis_rules" in said  # what the lab does not reproduce, listed


def test_a_pasted_config_the_lab_cannot_model_is_an_error():
    at = _guide()
    moe = {"model_type": "deepseek_v3", "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "intermediate_size": 14336, "vocab_size": 32000,
           "first_k_dense_replace": 3, "[a](b)": 1}
    at.text_area(key="model_config_text").input(json.dumps(moe)).run()
    at.button(key="model_config_read").click().run()
    assert not at.exception
    errors = _errors(at)
    assert len(errors) == 1 and "the lab cannot model" in errors[0]
    assert "first_k_dense_replace 3" in errors[0] and "model_type 'deepseek_v3'" in errors[0]
    assert "'\\[a\\](b)'" in errors[0]  # the file's own text escaped for Markdown
    assert at.selectbox(key="preset").value == "llama3-8b"  # nothing changed
    assert at.number_input(key="width_exact").value == 4096


def test_an_uploaded_config_fills_the_shape_and_the_uploader_starts_empty():
    at = _guide()
    data = json.dumps({"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16,
                       "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                       "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True,
                       "max_position_embeddings": 131072, "rope_theta": 500000.0}).encode()
    at.file_uploader(key="model_config_file_0").set_value(("config.json", data, "application/json")).run()
    assert not at.exception and not _errors(at), _errors(at)
    assert (at.number_input(key="width_exact").value, at.slider(key="depth").value,
            at.toggle(key="tie_embeddings").value) == (2048, 16, True)
    # the sequence the loaded model starts at fits this server (pages/_load_fit), at most its own
    assert at.session_state["seq"] in (8192, 4096, 2048, 1024, 512, 256, 128)
    assert [u.key for u in at.file_uploader if u.key.startswith("model_config")] == ["model_config_file_1"]
    said = " ".join(c.value for c in at.sidebar.caption)
    assert "From config.json (a Hugging Face config.json (model_type llama))" in said
    assert "seq 8192 of the 131,072 tokens" in said and "rope_theta 500000.0" in said
