""""Does not fit at any batch": the parameters, gradients and optimizer state per device against the
budget, answered from the configuration before anything compiles, with the fewest devices that hold
them and what else would; XLA's out-of-memory of a preset said in devices, never a smaller model."""

from __future__ import annotations

import json
import math

import pytest

from remat_lab.cli.advise import format_advice
from remat_lab.config import PRESETS, TARGETS, RunConfig
from remat_lab.present.advisor_tables import advice_display_frame, advice_frame
from remat_lab.present.study_charts import make_advice_throughput_figure
from remat_lab.program.backend import ExecutionError, xla_error
from remat_lab.program.footprint import fit
from remat_lab.program.step import abstract_problem, jit_step
from remat_lab.store.results import classify
from remat_lab.studies import advisor
from remat_lab.studies.advisor import search as advisor_search

GIB = 1 << 30


def _llama_on_v5e_x4() -> RunConfig:
    return RunConfig.from_preset("llama3-8b", step="train", batch=4, mesh="fsdp=4", target="tpu-v5e",
                                 target_devices=4)


def test_llama3_8b_training_on_four_v5e_does_not_fit_and_says_where_it_would(monkeypatch):
    def no_compiles(*args, **kwargs):
        raise AssertionError("the answer needs no compile")

    monkeypatch.setattr(advisor, "size_policies", no_compiles)
    monkeypatch.setattr(advisor_search, "compile_for_analysis", no_compiles)
    cfg = _llama_on_v5e_x4()
    assert (cfg.dtype, cfg.param_dtype, cfg.optimizer_dtype) == ("bfloat16", "float32", "float32")
    doc = advisor.advise(cfg, policies=["no_remat", "nothing_saveable", "minimal"], timing=False)

    # By hand from the published count: float32 weights (4 B) and gradients (4 B), two float32
    # moments (8 B) per parameter, split over fsdp=4, against 95 % of a v5e's 16 GiB.
    n = PRESETS["llama3-8b"]["parameters"]
    assert n == 8_030_261_248
    budget = int(16 * GIB * 0.95)
    per_device = n * (4 + 4 + 8) / 4  # 32.1 GB: about twice the 16.3 GB budget
    assert doc["budget_bytes"] == budget
    static = doc["static"]
    assert static["fits"] is False
    assert static["static_bytes_per_device"] == n * (4 + 4 + 8) // 4 + 4  # + AdamW's step count
    assert abs(static["static_bytes_per_device"] - per_device) <= 8
    min_devices = math.ceil(n * (4 + 4 + 8) / budget)  # 7.87 -> 8, and 4096 splits 8 ways
    assert min_devices == 8 == static["min_devices"] == static["min_fsdp"]
    assert static["min_mesh"] == "fsdp=8" and static["min_devices_bytes"] <= budget
    # bfloat16 moments: 4 + 4 + 4 bytes a parameter, still over
    assert static["bf16_moments"] == {"static_bytes_per_device": n * 12 // 4 + 4, "fits": False}
    want = sorted((t for t in TARGETS.values() if t.usable_bytes() >= per_device and t.name != "tpu-v5e"),
                  key=lambda t: t.usable_bytes())
    assert [t["target"] for t in static["targets_that_fit"]] == [t.name for t in want]
    assert "h100" in [t.name for t in want] and "a100-40g" not in [t.name for t in want]

    assert doc["recommended"] is None and all(r["max_batch"] == 0 and r["probes"] == [] for r in doc["rows"])
    decision = doc["decision"]
    assert decision["fits_at_any_batch"] is False and decision["min_devices"] == 8
    why = decision["why"]
    assert why.startswith("no policy fits: llama3-8b does not fit at any batch")
    assert "from 8 devices (fsdp=8" in why
    assert "Precision: float32 master weights and moments, bfloat16 compute" in why
    text = format_advice(doc)
    assert "answered from the configuration alone" in text
    for words in ("lower width", "or depth", "shrink the model"):
        assert words not in why and words not in doc["reason"] and words not in text
    assert classify(json.loads(json.dumps(doc))) == "advice"  # a results file reads it back
    assert list(advice_frame(doc)["per_device_batch"]) == [0, 0, 0]


def test_what_fits_answers_from_the_configuration_alone():
    ok = fit(RunConfig.from_preset("llama3-8b", step="train", batch=8, mesh="fsdp=8", target="h100",
                                   target_devices=8), TARGETS["h100"].usable_bytes())
    n = PRESETS["llama3-8b"]["parameters"]
    assert ok["fits"] and ok["static_bytes_per_device"] == n * 16 // 8 + 4
    grad = fit(RunConfig.from_preset("llama3-8b", batch=4, mesh="fsdp=4"), 16 * GIB)
    assert grad["optimizer_state_bytes"] == 0 and grad["static_bytes_per_device"] == n * 8 // 4
    assert grad["fits"]


@pytest.fixture(scope="module")
def hbm_error() -> Exception:
    """A real out-of-memory from XLA: a TPU v5e compile of a program over its HBM (raised at compile)."""
    cfg = RunConfig(model="mlp", width=16384, depth=16, batch=65536, policy="no_remat",
                    target="tpu-v5e")
    problem = abstract_problem(cfg)
    with pytest.raises(Exception, match="RESOURCE_EXHAUSTED") as caught:
        jit_step(problem).trace(*problem.args).lower().compile()
    return caught.value


def test_an_out_of_memory_of_a_preset_is_said_in_devices(hbm_error):
    generic = xla_error("compiling for tpu-v5e", hbm_error)
    assert "lower width, batch, seq or depth" in str(generic)  # a model of the user's own sizes
    over = xla_error("compiling for tpu-v5e", hbm_error, _llama_on_v5e_x4())
    assert isinstance(over, ExecutionError)
    text = str(over)
    assert "RESOURCE_EXHAUSTED" in text and "llama3-8b does not fit at any batch" in text
    assert "from 8 devices (fsdp=8" in text and "lower width" not in text and "or depth" not in text
    crowded = str(xla_error("compiling for tpu-v5e", hbm_error,
                            RunConfig.from_preset("llama3.2-1b", batch=16, target="tpu-v5e")))
    assert "the activations of batch 16 do not fit beside them" in crowded
    assert "lower width" not in crowded and "or depth" not in crowded


def test_the_advice_table_says_batches_per_device_and_global():
    rate = {"examples_per_s": 2.0, "examples_per_s_ci": [1.0, 3.0]}
    rows = [{"policy": "minimal", "max_batch": 8, "per_device_batch": 1, "devices": 8, "probes": [],
             **rate}, {"policy": "full", "max_batch": 3, "per_device_batch": 3, "devices": 1,
                       "probes": [], **rate}]
    shown = advice_display_frame({"rows": rows, "budget_bytes": 1})
    assert list(shown["largest batch"]) == ["1 per device (8 global)", "3"]
    frame = advice_frame({"rows": rows})
    assert list(frame["per_device_batch"]) == [1, 3]  # the CSV
    bars = make_advice_throughput_figure(frame, "minimal").data
    assert [b.text[0] for b in bars] == ["1 per device (8 global)", "batch 3"]  # the chart
