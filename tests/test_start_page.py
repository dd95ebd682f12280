"""The Start page: a published model on rented accelerators, the usual recipe, one link to the answer."""

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from pages._begin_link import RECIPE, start_params  # noqa: E402
from remat_lab.config import RunConfig, coerce_config  # noqa: E402
from remat_lab.config.run import preset_fields  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_the_llama_question_becomes_one_link_with_one_example_per_device():
    params = start_params("llama3-8b", 8192, "h100", 8)
    assert params["mesh"] == "fsdp=8" and params["batch"] == "8" and params["target"] == "h100"
    assert {k: params[k] for k in RECIPE} == RECIPE  # the AdamW step, fp32 master and moments, bf16
    cfg = coerce_config({**preset_fields("llama3-8b"), **params, "target_devices": "8"})
    assert cfg == RunConfig.from_preset("llama3-8b", **{k: v for k, v in cfg.as_dict().items()
                                                         if k not in ("model", "preset", "input_shape")})
    assert (cfg.width, cfg.depth, cfg.seq, cfg.step) == (4096, 32, 8192, "train")


def test_this_machine_without_the_recipe_keeps_the_preset_as_published():
    params = start_params("gpt2-small", 1024, "local", 1, recipe=False)
    assert "mesh" not in params and "step" not in params and params["batch"] == "1"


def test_the_page_offers_the_three_questions_and_nothing_fails():
    at = AppTest.from_file(str(ROOT / "pages" / "begin.py"), default_timeout=60).run()
    assert not at.exception and not at.error
    labels = [b.label for b in at.button]
    assert labels[0] == "Which policy, and how large a batch per device?" and len(labels) == 3
    assert at.selectbox(key="start_target").value == "h100"


def test_another_model_brings_its_own_sequence_length():
    """Picking gpt2-small after llama3-8b must not keep llama's 8192 (over gpt2's 1024 context)."""
    at = AppTest.from_file(str(ROOT / "pages" / "begin.py"), default_timeout=60).run()
    first = at.selectbox(key="start_preset").value
    assert at.number_input(key="start_seq").value == preset_fields(first)["seq"]
    at.selectbox(key="start_preset").set_value("gpt2-small").run()
    assert not at.exception
    assert at.number_input(key="start_seq").value == preset_fields("gpt2-small")["seq"] == 1024
