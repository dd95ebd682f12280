"""The user's own NNX block in a configuration: its factory's name and its input shape, checked (no JAX).

``model_module`` names a factory ``make_block(rngs) -> nnx.Module`` as ``mypkg.blocks:make_block``
(a module on the Python path) or ``path/to/file.py:make_block``; ``input_shape`` is the block's input,
its first axis the batch (``batch`` and ``input_shape[0]`` are the same number). For the built-in
models ``input_shape`` is derived from batch, seq and width (a value given is replaced). Loading the
module, tracing it and the public-mode refusal are ``model/user_block.py``'s.
"""

from __future__ import annotations

import math
import re

from .catalog import SEQ_MODELS, USER_MODEL
from .errors import ConfigError

MAX_SPEC = 400  # characters of model_module
MAX_RANK = 5
MAX_DIM = 65536
MAX_ELEMENTS = 1 << 30  # of one input
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SPEC_HELP = "module:factory or path/to/file.py:factory, e.g. mypkg.blocks:make_block"


def split_spec(spec: object) -> tuple[str, str]:
    """``'mypkg.blocks:make_block'`` -> ``('mypkg.blocks', 'make_block')``; a ``.py`` path likewise."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"model_module must be {SPEC_HELP}.")
    if len(spec) > MAX_SPEC or not spec.isprintable():
        raise ConfigError(f"model_module must be one line of at most {MAX_SPEC} characters: {SPEC_HELP}.")
    where, colon, attr = spec.strip().rpartition(":")
    dotted = all(_IDENT.fullmatch(p) for p in where.split("."))
    if not colon or not _IDENT.fullmatch(attr) or not (where.endswith(".py") or dotted):
        raise ConfigError(f"model_module {spec[:60]!r} is not {SPEC_HELP}.")
    return where, attr


def parse_input_shape(value: object) -> tuple[int, ...]:
    """``'4,16,64'``, ``'4x16x64'`` or a list/tuple of whole numbers -> a tuple; ``()`` when empty."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.replace("x", ",").split(",") if p.strip()]
        if not all(p.isascii() and p.isdigit() and len(p) < 7 for p in parts):
            raise ConfigError(f"input_shape must be whole numbers separated by commas (B,N,D, e.g. "
                              f"4,16,64), not {value[:40]!r}.")
        value = [int(p) for p in parts]
    if not isinstance(value, tuple | list) or not all(isinstance(n, int) and not isinstance(n, bool)
                                                      for n in value):
        raise ConfigError("input_shape must be whole numbers, its first the batch (e.g. 4,16,64).")
    shape = tuple(value)
    if shape and not (2 <= len(shape) <= MAX_RANK and all(1 <= n <= MAX_DIM for n in shape)):
        raise ConfigError(f"input_shape needs 2 to {MAX_RANK} axes (the first the batch), each from 1 "
                          f"to {MAX_DIM}; got {shape!r}."[:200])
    if math.prod(shape) > MAX_ELEMENTS:
        raise ConfigError(f"input_shape {shape!r} has more than {MAX_ELEMENTS:,} elements.")
    return shape


def builtin_input_shape(cfg) -> tuple[int, ...]:
    """The built-in models' input: llm tokens (B, N), (B, N, D) with seq, else (B, D) or (D,)."""
    if cfg.model == "llm":
        return (cfg.batch, cfg.seq)  # integer tokens
    if cfg.model in SEQ_MODELS:
        return (cfg.batch, cfg.seq, cfg.width)
    return (cfg.width,) if cfg.batch == 0 else (cfg.batch, cfg.width)


def checked_input_shape(cfg) -> tuple[int, ...]:
    """``cfg``'s input shape: derived for a built-in model; for the user's block ``input_shape``
    checked with ``model_module`` (one device, batch = its first axis). Raises ``ConfigError``."""
    if cfg.model != USER_MODEL:
        if cfg.model_module:
            raise ConfigError("model_module is the user's own block: use it with model user (the "
                              "command line's --model-module sets both).")
        return builtin_input_shape(cfg)
    if not cfg.model_module:
        raise ConfigError(f"model user is your own block: give model_module ({SPEC_HELP}).")
    split_spec(cfg.model_module)
    shape = parse_input_shape(cfg.input_shape)
    if not shape:
        raise ConfigError("your block needs input_shape B,N,D (the first axis the batch), e.g. 4,16,64, "
                          "or an example_input_shape in its module.")
    if shape[0] != cfg.batch:
        raise ConfigError(f"input_shape's first axis is the batch: {shape[0]} differs from batch "
                          f"{cfg.batch}; give the same number.")
    if cfg.mesh:
        raise ConfigError("your block runs on one device (the lab has no sharding rules for it); "
                          f"leave the mesh out (mesh {cfg.mesh!r} given).")
    return shape
