"""The CLI commands the app prints parse back to the configuration the app used."""

import shlex

import pytest

from remat_lab.cli import _config_from, build_parser
from remat_lab.config import RunConfig
from remat_lab.present.reproduce import advise_command, cli_command

CONFIGS = [
    RunConfig(),
    RunConfig(model="mlp", width=128, batch=0, depth=1, policy="nothing_saveable", objective="grad"),
    RunConfig(model="seq_mixer", width=64, batch=4, seq=32, depth=3, stack="loop", dtype="bfloat16"),
    RunConfig(model="transformer", width=64, batch=2, seq=8, heads=8, depth=2, policy="custom",
              save_names=("query_proj",), offload_names=("out_proj",), repeats=7),
    RunConfig(width=64, batch=8, depth=4, mesh="fsdp=4", policy="dots_saveable"),
    # an llm training step named without a preset: its dtypes, not the recipe's float32 read back
    RunConfig(model="llm", width=64, heads=4, kv_heads=2, head_dim=16, mlp_dim=96, vocab=128, seq=16,
              depth=2, batch=2, dtype="bfloat16", step="train", policy="nothing_saveable"),
]


def _used(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the dtypes it uses named ("" means the compute dtype's, or the parameters')."""
    return cfg.replace(param_dtype=cfg.param_dtype_used, optimizer_dtype=cfg.optimizer_dtype_used)


def _args(command: str):
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "remat_lab"]
    return build_parser().parse_args(words[3:])


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.model}-{c.policy}-{c.mesh or 'one'}")
def test_run_command_is_the_configuration(cfg):
    args = _args(cli_command(cfg))
    assert args.command == "run" and args.json
    same = cfg.replace(warmup=args.warmup, seed=args.seed)  # left at their defaults by the app
    assert _used(_config_from(args)) == _used(same)
    if cfg.mesh:
        assert args.host_devices == 4


@pytest.mark.parametrize("cfg", CONFIGS[:4], ids=lambda c: f"{c.model}-{c.policy}")
def test_advise_command_is_the_model_and_budget(cfg):
    policies = ["no_remat", "nothing_saveable"] + (["custom"] if cfg.policy == "custom" else [])
    args = _args(advise_command(cfg, "64M", policies, timing=False))
    assert args.command == "advise" and args.no_time and args.budget == "64M"
    assert args.policies == policies
    for key in ("model", "width", "seq", "heads", "depth", "stack", "dtype", "objective", "repeats"):
        if key in ("seq", "heads") and getattr(cfg, key) != getattr(args, key):
            assert cfg.model != "transformer" and (key == "heads" or cfg.model == "mlp")
            continue  # not printed where the model does not use it
        assert getattr(args, key) == getattr(cfg, key), key
    assert tuple(args.save_names) == (cfg.save_names if "custom" in policies else ())


SYNTH = [
    RunConfig(model="mlp", width=64, depth=2, stack="scan", batch=1),
    RunConfig(model="transformer", width=64, seq=8, heads=8, depth=2, batch=2, dtype="bfloat16", step="train",
              microbatches=2),
    RunConfig.from_preset("llama3-8b", seq=8192, step="train", target="h100", target_devices=8,
                          mesh="fsdp=8", attention="flash", loss_chunks=8, batch=8),
    RunConfig(model="llm", width=64, heads=4, kv_heads=2, head_dim=16, mlp_dim=96, vocab=128, seq=16,
              depth=2, batch=1, optimizer_dtype="bfloat16"),
]


@pytest.mark.parametrize("cfg", SYNTH, ids=lambda c: c.preset or c.model)
def test_synthesize_and_plan_commands_are_the_configuration(cfg):
    """The Synthesize answer's two commands parse back to the configuration it synthesized for."""
    from remat_lab.studies.synthesize.solve import Plan
    from remat_lab.studies.synthesize.text import command, run_command

    args = _args(command(cfg, 1 << 30, "max-batch", None, ["nothing_saveable"]))
    assert args.command == "synthesize" and args.policies == ["nothing_saveable"]
    args.policy, args.batch, args.warmup = "no_remat", cfg.batch, 0  # as cli/synthesize.main sets them
    keep = {k: getattr(cfg, k) for k in ("batch", "warmup", "seed", "repeats", "objective", "policy")}
    assert _config_from(args).replace(**keep) == cfg
    names = ("l1",) if cfg.model == "mlp" else ()
    plan = Plan(save=names, offload=(), remat_layers=cfg.depth)
    args = _args(run_command(cfg, plan, 4 * cfg.batch))
    assert args.command == "run" and args.batch == 4 * cfg.batch
    got = _config_from(args)
    assert got.replace(**{**keep, "policy": cfg.policy, "save_names": (), "offload_names": (),
                          "compile_only": cfg.compile_only}) == cfg
