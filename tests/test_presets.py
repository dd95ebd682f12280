"""Presets: published decoder shapes, their parameter counts against the model built with
jax.eval_shape (nothing allocated), and how a preset fills a configuration."""

from __future__ import annotations

import math

import jax
import pytest
from flax import nnx

from remat_lab.config import PRESETS, ConfigError, RunConfig, coerce_config, llm_parameters
from remat_lab.model.models import build_model, llm_options
from remat_lab.program.step import DTYPES

# gpt2-small is a Llama-style stand-in (gated MLP, RMSNorm, no biases, rotary positions): its
# count is 0.71 % under GPT-2's (no learned positions, no biases); see its "differences".
APPROXIMATE = {"gpt2-small": 0.01}


def built_parameters(cfg: RunConfig) -> int:
    """The parameter count of the NNX model for ``cfg``, from ``jax.eval_shape`` (no arrays)."""
    state = jax.eval_shape(lambda: nnx.state(build_model(
        cfg.model, cfg.width, cfg.depth, seed=0, dtype=DTYPES[cfg.dtype], stack=cfg.stack,
        heads=cfg.heads, **llm_options(cfg, DTYPES)), nnx.Param))
    return sum(math.prod(a.shape) for a in jax.tree_util.tree_leaves(state))


def test_the_brief_names_are_all_there():
    assert {"llama3-8b", "llama3.2-1b", "llama3.2-3b", "mistral-7b", "gemma2-2b", "qwen2.5-7b",
            "gpt2-small", "llama2-7b", "llama2-70b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b"
            } <= set(PRESETS)
    for name, p in PRESETS.items():
        assert p["source"].startswith("https://huggingface.co/"), name
        assert p["parameters"] > 0 and p["differences"], name
        if "maxtext" in p:  # the MaxText model YAML of the same shape, at a commit
            assert p["maxtext"].startswith("MaxText src/maxtext/configs/models/"), name


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_count_matches_the_published_one(name):
    cfg = RunConfig.from_preset(name, seq=16, batch=1, compile_only=True)
    built = built_parameters(cfg)
    assert built == llm_parameters(cfg)  # the analytic count (budget.py) is the model's
    published = PRESETS[name]["parameters"]
    assert abs(built - published) / published <= APPROXIMATE.get(name, 0.005), (built, published)


def test_exact_shapes_are_exact():
    """Llama 2 (7B, 70B), Llama 3 (8B, 3.1 8B, 70B and 405B, 3.2 1B and 3B) and Mistral 7B are
    exactly their published counts; Gemma 2 lacks two norms per block (0.005 %), Qwen 2.5 its q/k/v
    biases (0.002 %)."""
    for name in ("llama2-7b", "llama2-70b", "llama3-8b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b",
                 "llama3.2-1b", "llama3.2-3b", "mistral-7b"):
        assert llm_parameters(RunConfig.from_preset(name)) == PRESETS[name]["parameters"], name
    gemma = RunConfig.from_preset("gemma2-2b")
    assert PRESETS["gemma2-2b"]["parameters"] - llm_parameters(gemma) == 26 * 2 * 2304
    qwen = RunConfig.from_preset("qwen2.5-7b")
    assert PRESETS["qwen2.5-7b"]["parameters"] - llm_parameters(qwen) == 28 * (3584 + 2 * 512)


def test_a_preset_fills_the_fields_and_explicit_values_win():
    cfg = RunConfig.from_preset("llama3-8b")
    assert (cfg.model, cfg.width, cfg.depth, cfg.heads, cfg.kv_heads, cfg.mlp_dim, cfg.vocab,
            cfg.seq, cfg.tie_embeddings, cfg.preset) == (
        "llm", 4096, 32, 32, 8, 14336, 128256, 8192, False, "llama3-8b")
    small = RunConfig.from_preset("llama3-8b", depth=2, seq=64)
    assert small.depth == 2 and small.seq == 64 and small.width == 4096
    assert small.preset_overrides == {"depth": (32, 2), "seq": (8192, 64)}
    url = coerce_config({"preset": "gemma2-2b", "seq": "128", "tie_embeddings": "false"})
    assert url.width == 2304 and url.seq == 128 and url.tie_embeddings is False
    assert url.preset_overrides == {"seq": (8192, 128), "tie_embeddings": (True, False)}
    assert RunConfig(**url.as_dict()) == url  # a document's config reads back as it was


def test_bad_presets_are_refused():
    with pytest.raises(ConfigError, match="unknown preset"):
        RunConfig.from_preset("llama9")
    with pytest.raises(ConfigError, match="unknown preset"):
        RunConfig(model="llm", preset="llama9")
    with pytest.raises(ConfigError, match="decoder LM"):
        RunConfig(preset="llama3-8b")  # an mlp cannot claim to be llama


MOE_PRESETS = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b")


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_moe_presets_total_and_active_counts_match_the_published_ones(name):
    """Mixtral 8x7B 46.7B / 12.9B, 8x22B 141B / 39B, Qwen3-30B-A3B 30.5B / 3.3B (announced, rounded).
    Qwen3's 3.3B is truncated: its shape gives 3.353B, so the active count is held to the
    published digits (3.3 <= x < 3.4) rather than 0.5 %."""
    cfg = RunConfig.from_preset(name, seq=16, batch=1, compile_only=True)
    assert cfg.experts > 0
    total, active = llm_parameters(cfg), llm_parameters(cfg, active=True)
    assert built_parameters(cfg.replace(depth=1)) == llm_parameters(cfg.replace(depth=1))  # the model's
    published, published_active = PRESETS[name]["parameters"], PRESETS[name]["active_parameters"]
    assert abs(total - published) / published <= 0.005, (total, published)
    if name == "qwen3-30b-a3b":
        assert 3.3e9 <= active < 3.4e9
    else:
        assert abs(active - published_active) / published_active <= 0.005, (active, published_active)
    dense = cfg.replace(experts=0, experts_per_token=2, expert_mlp_dim=0)
    assert llm_parameters(dense) == llm_parameters(dense, active=True) < total
