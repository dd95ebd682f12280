"""Code and command lines that reproduce a configuration: the Flax snippet and the CLI call.

Explore prints both; ``python -m remat_lab run --code`` prints the snippet. The snippet is made
from the model classes' own source, so it is the code the engine runs, in the idiom a user writes:
a Python loop of blocks, or Flax's scan over ``nnx.vmap``-stacked layers.
"""

from __future__ import annotations

import functools
import inspect

from remat_lab.config import ConfigError, RunConfig
from remat_lab.config.cli_flags import name_flags, run_command, shape_flags, target_flags
from remat_lab.model import models
from remat_lab.model.models import USER_MODEL
from remat_lab.model.policies import policy_code


def cli_command(cfg: RunConfig) -> str:
    """The ``python -m remat_lab run ... --json`` call that gives the same numbers as the app."""
    return run_command(cfg)


def advise_command(cfg: RunConfig, budget: str, policies: list[str], timing: bool = True,
                   max_batch: int | None = None) -> str:
    """The ``python -m remat_lab advise ... --json`` call behind the Advisor page's answer."""
    parts = ["python -m remat_lab advise", *shape_flags(cfg, batch=False),
             f"--objective {cfg.objective}", f"--repeats {cfg.repeats}", f"--budget {budget}",
             f"--policies {','.join(policies)}", *(name_flags(cfg) if "custom" in policies else []),
             *target_flags(cfg), *([f"--mesh {cfg.mesh}"] if cfg.mesh and cfg.target != "local" else []),
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
