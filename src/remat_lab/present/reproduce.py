"""Code and command lines that reproduce a configuration: the Flax snippet and the CLI call.

Explore prints both; ``python -m remat_lab run --code`` prints the snippet. The snippet is made
from the model classes' own source, so it is the code the engine runs, in the idiom a user writes:
a Python loop of blocks, or Flax's scan over ``nnx.vmap``-stacked layers.
"""

from __future__ import annotations

import functools
import inspect
import shlex

from remat_lab.config import NAME_FIELDS, ConfigError, RunConfig, mesh_devices
from remat_lab.model import models
from remat_lab.model.models import SEQ_MODELS, USER_MODEL
from remat_lab.model.policies import policy_code


def _shape_flags(cfg: RunConfig, batch: bool = True) -> list[str]:
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
                  *([f"--param-dtype {cfg.param_dtype}"] if cfg.param_dtype else [])]
    if cfg.optimizer_dtype:  # AdamW's moments, when not the parameters' dtype by default
        parts.append(f"--optimizer-dtype {cfg.optimizer_dtype}")
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
    return parts + (["--compile-only"] if cfg.compile_only else [])


def _name_flags(cfg: RunConfig) -> list[str]:
    return [f"--{k.replace('_', '-')} {','.join(getattr(cfg, k))}" for k in NAME_FIELDS if getattr(cfg, k)]


def cli_command(cfg: RunConfig) -> str:
    """The ``python -m remat_lab run ... --json`` call that gives the same numbers as the app."""
    parts = ["python -m remat_lab run", *_shape_flags(cfg), f"--policy {cfg.policy}", *_name_flags(cfg),
             f"--objective {cfg.objective}", f"--repeats {cfg.repeats}"]
    parts += _target_flags(cfg)
    if cfg.mesh and cfg.target == "local":  # emulated CPU devices where there are no accelerators
        parts += [f"--mesh {cfg.mesh}", f"--host-devices {mesh_devices(cfg.mesh)}"]
    elif cfg.mesh:  # a named target's devices: compiled for, no host devices needed
        parts += [f"--mesh {cfg.mesh}"]
    return " ".join(parts + ["--json"])


def _target_flags(cfg: RunConfig) -> list[str]:
    """``--target`` (and its devices) for a configuration compiled for a named accelerator."""
    if cfg.target == "local":
        return []
    return [f"--target {cfg.target}"] + ([f"--target-devices {cfg.target_devices}"]
                                          if cfg.target_devices > 1 else [])


def advise_command(cfg: RunConfig, budget: str, policies: list[str], timing: bool = True,
                   max_batch: int | None = None) -> str:
    """The ``python -m remat_lab advise ... --json`` call behind the Advisor page's answer."""
    parts = ["python -m remat_lab advise", *_shape_flags(cfg, batch=False),
             f"--objective {cfg.objective}", f"--repeats {cfg.repeats}", f"--budget {budget}",
             f"--policies {','.join(policies)}", *(_name_flags(cfg) if "custom" in policies else []),
             *_target_flags(cfg), *([f"--mesh {cfg.mesh}"] if cfg.mesh and cfg.target != "local" else []),
             *([f"--max-batch {max_batch}"] if max_batch else [])]
    return " ".join(parts + ([] if timing else ["--no-time"]) + ["--json"])


@functools.cache
def _source(block: type) -> str:
    """A block class's source, read (and parsed: ``inspect`` uses ``ast``) once per process."""
    return inspect.getsource(block)


def reproduce_code(cfg: RunConfig) -> str:
    """Self-contained code for the configuration: the model, the remat'd block and the step.
    ``ConfigError`` for the llm (its code is ``model/llm.py``; the snippet covers the blocks)."""
    if cfg.model == USER_MODEL:
        raise ConfigError("no code snippet for your own block: the code is yours (its factory "
                          f"{cfg.model_module}); the command line reproduces the run.")
    if cfg.model == "llm":
        raise ConfigError("the code snippet covers mlp, seq_mixer and transformer; the llm's code is "
                          "src/remat_lab/model/llm.py (run it with the command line instead).")
    block = {"mlp": models.MLP, "seq_mixer": models.SeqMixer, "transformer": models.Transformer}[cfg.model]
    src = _source(block)
    head = ("import math\n\nimport jax\nimport jax.numpy as jnp\nfrom flax import nnx\n"
            "from jax.ad_checkpoint import checkpoint_name\n\n"
            + (f"MLP_RATIO = {models.MLP_RATIO}\n" if cfg.model == "transformer" else "") + "\n")
    call = f"{policy_code(cfg)}\ndef call_block(block, x):\n    return block(x)\n"
    heads = f", heads={cfg.heads}" if cfg.model == "transformer" else ""
    dtype = f"jnp.{cfg.dtype}"
    shape = cfg.input_shape
    grad = "nnx.value_and_grad" if cfg.objective == "value_and_grad" else "nnx.grad"
    ret = f"{'(loss, grads)' if cfg.objective == 'value_and_grad' else 'grads'}"
    make = f"{block.__name__}({cfg.width}{heads}, rngs=rngs, dtype={dtype})"
    if cfg.depth > 1 and cfg.stack == "scan":  # Flax's scan-over-layers idiom
        build = (f"@nnx.split_rngs(splits={cfg.depth})\n@nnx.vmap(in_axes=(0,), out_axes=0)\n"
                 f"def create_blocks(rngs):\n    return {make}\n\n\n"
                 f"blocks = create_blocks(nnx.Rngs({cfg.seed}))  # parameters: a leading layer axis\n")
        loss = ("def loss_fn(blocks, x):\n"
                "    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)\n"
                "    def body(x, block):\n        return call_block(block, x)\n\n"
                "    return jnp.sum(body(x, blocks), dtype=jnp.float32)\n")
    else:
        build = (f"rngs = nnx.Rngs({cfg.seed})\n"
                 f"blocks = nnx.List([{make}\n                   for _ in range({cfg.depth})])\n")
        loss = ("def loss_fn(blocks, x):\n    for block in blocks:\n        x = call_block(block, x)\n"
                "    return jnp.sum(x, dtype=jnp.float32)\n")
    return (f"{head}{src}\n\n{call}\n\n{build}"
            f"x = jax.random.normal(jax.random.key({cfg.seed + 1}), {shape!r}, dtype={dtype})\n\n\n"
            f"{loss}\n\nstep = nnx.jit({grad}(loss_fn))\nout = step(blocks, x)  # {ret}\n")
