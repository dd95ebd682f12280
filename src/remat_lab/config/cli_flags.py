"""A configuration as the CLI's flags: its model and sizes, custom names, target (no JAX)."""

from __future__ import annotations

import shlex

from .catalog import SEQ_MODELS, USER_MODEL
from .mesh_text import mesh_devices
from .run import NAME_FIELDS, RunConfig


def shape_flags(cfg: RunConfig, batch: bool = True) -> list[str]:
    """``--model ... --dtype ...``: the flags of the model and its sizes (those that apply)."""
    if cfg.model == USER_MODEL:  # the user's block: its factory and input (the batch its first axis)
        parts = [f"--model-module {shlex.quote(cfg.model_module)}",
                 f"--input-shape {','.join(map(str, cfg.input_shape))}"]
    else:
        parts = [f"--model {cfg.model}", f"--width {cfg.width}"] + ([f"--batch {cfg.batch}"] if batch else [])
    if cfg.model in SEQ_MODELS:
        parts.append(f"--seq {cfg.seq}")
    if cfg.model in ("transformer", "llm"):
        parts.append(f"--heads {cfg.heads}")
    if cfg.model == "llm":  # every field, so a preset's later change cannot alter the command
        parts += [*([f"--preset {cfg.preset}"] if cfg.preset else []), f"--kv-heads {cfg.kv_heads}",
                  f"--head-dim {cfg.head_dim}", f"--mlp-dim {cfg.mlp_dim}", f"--vocab {cfg.vocab}",
                  "--tie-embeddings" if cfg.tie_embeddings else "--no-tie-embeddings",
                  # a training step without the flag reads the recipe's float32: name it always there
                  *([f"--param-dtype {cfg.param_dtype_used}"] if cfg.param_dtype or cfg.step == "train"
                    else [])]
    if cfg.model == "llm" and cfg.experts:  # a mixture of experts: every field of it
        parts += [f"--{k.replace('_', '-')} {getattr(cfg, k)}" for k in (
            "experts", "experts_per_token", "expert_mlp_dim", "shared_experts", "router_gating",
            "capacity_factor", "load_balance_loss_weight", "moe_dispatch")]
    if cfg.optimizer_dtype or (cfg.model == "llm" and cfg.step == "train"):  # AdamW's moments
        parts.append(f"--optimizer-dtype {cfg.optimizer_dtype_used}")
    if cfg.model == "llm":  # loss_chunks always (a preset field); the attention's when not default
        parts.append(f"--loss-chunks {cfg.loss_chunks}")
        parts += [f"--{k.replace('_', '-')} {getattr(cfg, k)}" for k in ("attention", "attention_block")
                  if getattr(cfg, k) != getattr(RunConfig, k)]
    parts.append(f"--depth {cfg.depth}")
    if cfg.depth > 1:
        parts.append(f"--stack {cfg.stack}")
    parts.append(f"--dtype {cfg.dtype}")
    if cfg.step != "grad":
        parts.append(f"--step {cfg.step}")
    if cfg.microbatches > 1:
        parts.append(f"--microbatches {cfg.microbatches}")
    if cfg.optimizer_offload:
        parts.append("--optimizer-offload")
    return parts + (["--compile-only"] if cfg.compile_only else [])


def name_flags(cfg: RunConfig) -> list[str]:
    """``--save-names``/``--offload-names``: the custom policy's choices, where given."""
    return [f"--{k.replace('_', '-')} {','.join(getattr(cfg, k))}" for k in NAME_FIELDS if getattr(cfg, k)]


def target_flags(cfg: RunConfig) -> list[str]:
    """``--target`` (and its devices) for a configuration compiled for a named accelerator."""
    if cfg.target == "local":
        return []
    return [f"--target {cfg.target}"] + ([f"--target-devices {cfg.target_devices}"]
                                          if cfg.target_devices > 1 else []) + (
        [f"--network {cfg.network}"] if cfg.network else []) + (
        [f"--collective-overlap {cfg.collective_overlap}"] if cfg.collective_overlap else [])


def run_command(cfg: RunConfig) -> str:
    """The ``python -m remat_lab run ... --json`` call that gives ``cfg``'s numbers (the app's and
    the planner's plans reproduced from a terminal)."""
    parts = ["python -m remat_lab run", *shape_flags(cfg), f"--policy {cfg.policy}", *name_flags(cfg),
             f"--objective {cfg.objective}", f"--repeats {cfg.repeats}"]
    parts += target_flags(cfg)
    if cfg.mesh and cfg.target == "local":  # emulated CPU devices where there are no accelerators
        parts += [f"--mesh {cfg.mesh}", f"--host-devices {mesh_devices(cfg.mesh)}"]
    elif cfg.mesh:  # a named target's devices: compiled for, no host devices needed
        parts += [f"--mesh {cfg.mesh}"]
    return " ".join(parts + ["--json"])
