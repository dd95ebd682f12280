"""A mixture of experts' configuration: its fields, their checks and their text forms (no JAX)."""

from __future__ import annotations

import pytest

from remat_lab.config import ConfigError, RunConfig, coerce_config
from remat_lab.config.cli_flags import shape_flags

MOE = dict(model="llm", width=64, heads=4, seq=16, batch=2, vocab=128, experts=4)


def test_dense_is_the_default_and_moe_fields_need_experts():
    assert RunConfig(model="llm").experts == 0
    for field, value in (("capacity_factor", 1.25), ("shared_experts", 1), ("router_gating", "sigmoid"),
                         ("experts_per_token", 1), ("expert_mlp_dim", 32),
                         ("load_balance_loss_weight", 0.01), ("moe_dispatch", "dense")):
        with pytest.raises(ConfigError, match=f"{field} is for a mixture of experts"):
            RunConfig(model="llm", **{field: value})


def test_moe_fields_are_checked():
    assert RunConfig(**MOE).moe_dispatch == "grouped"  # dropless grouped matmuls, MaxText's default
    with pytest.raises(ConfigError, match="grouped dispatch .* is dropless; set moe_dispatch dense"):
        RunConfig(**MOE, capacity_factor=1.25)
    with pytest.raises(ConfigError, match="choose one of: grouped, dense"):
        RunConfig(**MOE, moe_dispatch="sparse")
    cfg = RunConfig(**MOE, capacity_factor=1, moe_dispatch="dense")
    assert cfg.capacity_factor == 1.0 and isinstance(cfg.capacity_factor, float)
    assert cfg.expert_mlp_dim_used == 4 * 64
    with pytest.raises(ConfigError, match="router picks k"):
        RunConfig(**{**MOE, "experts_per_token": 5})
    with pytest.raises(ConfigError, match="for the llm"):
        RunConfig(model="transformer", experts=4)
    with pytest.raises(ConfigError, match="choose one of: softmax, sigmoid"):
        RunConfig(**MOE, router_gating="relu")
    with pytest.raises(ConfigError, match="from 0 to 64"):
        RunConfig(**MOE, capacity_factor=-1.0)
    with pytest.raises(ConfigError, match="from 0 to 256"):
        RunConfig(**{**MOE, "experts": 300})
    assert RunConfig(**MOE, mesh="fsdp=2").mesh == "fsdp=2"  # split as the dense MLP (test_llm_mesh)
    assert RunConfig(**{**MOE, "batch": 4}, mesh="expert=2,fsdp=2").mesh == "fsdp=2,expert=2"
    with pytest.raises(ConfigError, match="4 experts cannot be split over expert = 8"):
        RunConfig(**{**MOE, "batch": 8}, mesh="expert=8")
    with pytest.raises(ConfigError, match="0 experts cannot be split over expert = 2"):
        RunConfig(**{k: v for k, v in MOE.items() if k != "experts"}, mesh="expert=2")
    with pytest.raises(ConfigError, match="batch 2 cannot be split over data x fsdp x expert = 4"):
        RunConfig(**{**MOE, "batch": 2}, mesh="fsdp=2,expert=2")


def test_moe_from_text_and_back():
    cfg = coerce_config({k: str(v) for k, v in {**MOE, "capacity_factor": "1.25", "moe_dispatch": "dense",
                                                 "router_gating": "sigmoid"}.items()})
    assert (cfg.experts, cfg.capacity_factor, cfg.router_gating) == (4, 1.25, "sigmoid")
    with pytest.raises(ConfigError, match="capacity_factor must be a number"):
        coerce_config({**MOE, "capacity_factor": "lots"})
    flags = " ".join(shape_flags(cfg))
    assert "--experts 4 --experts-per-token 2" in flags and "--capacity-factor 1.25" in flags
    assert "--moe-dispatch dense" in flags
    assert "--experts" not in " ".join(shape_flags(RunConfig(model="llm")))
    assert RunConfig(**cfg.as_dict()) == cfg


def test_model_flops_are_maxtexts_and_count_k_experts():
    """Dense: the same count as the published runs' (MaxText's formula in config/published.py); a
    mixture of experts: the router and k of the experts, so Mixtral 8x7B counts about its 12.9B
    active parameters per token, not its 46.7B."""
    from remat_lab.config import llm_model_flops, llm_parameters
    from remat_lab.config import published as pub

    run = pub.RUNS["llama3.1-8b-v6e-256"]
    k = run["knobs"]
    dense = RunConfig.from_preset("llama3.1-8b", batch=k["per_device_batch_size"], seq=k["max_target_length"])
    for causal in (True, False):
        assert llm_model_flops(dense, causal) == pytest.approx(pub.model_flops_per_device(run, causal=causal),
                                                               rel=1e-12)
    moe = RunConfig.from_preset("mixtral-8x7b", batch=1, seq=4096)
    attention = 4 * 4096 * 4096 * 32 * 128 / 2 * 32  # causal, a step of one sequence, all layers
    per_token_weights = (llm_model_flops(moe) / 3 - attention) / 2 / 4096
    embedding = 32000 * 4096  # the lookup is not a product; the vocabulary projection is
    assert per_token_weights == pytest.approx(llm_parameters(moe, active=True) - embedding
                                              - 32 * 2 * 4096 - 4096, rel=1e-12)
