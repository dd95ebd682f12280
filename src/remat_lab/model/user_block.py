"""The user's own NNX block: its factory loaded from a module or a file, stacked, and traced for its names.

``RunConfig.model_module`` names a factory ``make_block(rngs) -> nnx.Module`` (``mypkg.blocks:make_block``
or ``path/to/file.py:make_block``; a factory with a ``dtype`` parameter also gets the compute dtype).
The lab stacks it (``stacks.py``, scan or loop), wraps each block in ``nnx.remat`` with the chosen policy
and sums its output as the loss, as for the built-in blocks. Its ``checkpoint_name`` tags are found by
tracing one block on the input (``block_names``) and offered to policy ``custom``. Its gradients are
checked against the same stack without remat (``analysis/gradcheck.py``: no plain-jnp copy of
the user's code exists, so the check is of what the policy changes).

This runs the user's Python code, so it is local only: refused when ``$REMAT_LAB_PUBLIC`` is on.
An error in their code (importing it, the factory, ``__call__``) is a ``UserCodeError`` whose message
says "your block raised ..." and shows the frames of their file only, never the lab's.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
from flax import nnx

from remat_lab.config.catalog import USER_MODEL
from remat_lab.config.errors import ConfigError, UserCodeError
from remat_lab.config.userblock import split_spec
from remat_lab.model.stacks import build_stack

PUBLIC_ENV = "REMAT_LAB_PUBLIC"  # the same switch as store.history.public_mode
MAX_MESSAGE = 2000  # characters of the user's exception text kept


def refuse_if_public() -> None:
    """``ConfigError`` when ``$REMAT_LAB_PUBLIC`` is on: a public server never runs a visitor's code."""
    if os.environ.get(PUBLIC_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        raise ConfigError("your own block (model_module) runs your Python code, so it is refused in "
                          f"public mode (${PUBLIC_ENV} is on); run it locally, e.g. python -m remat_lab "
                          "run --model-module path/to/file.py:make_block --input-shape 4,16,64.")


def theirs(what: str, err: BaseException, file: str) -> UserCodeError:
    """``err`` raised by the user's code while ``what``, with the frames of ``file`` only."""
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if f.filename and os.path.realpath(f.filename) == file]
    body = "".join(traceback.format_list(frames))
    if isinstance(err, SyntaxError) and err.filename and os.path.realpath(err.filename) == file:
        body += f'  File "{err.filename}", line {err.lineno}\n    {(err.text or "").strip()}\n'
    if not body:
        body = "  (no frame of your file: the error came from a library your code called)\n"
    text = f"{type(err).__name__}: {err}"[:MAX_MESSAGE]
    return UserCodeError(f"your block raised {text}\n(while {what})\n"
                         f"--- your traceback (frames from {file} only) ---\n{body}"
                         "--- end of your traceback ---")


@dataclass(frozen=True)
class Source:
    """Where the factory lives: the module's file (resolved) and a stamp that changes when it does."""

    where: str
    attr: str
    file: str
    stamp: int


def source_of(spec: str) -> Source:
    """The factory's file for ``spec`` (checked: public mode, the file or module exists)."""
    refuse_if_public()
    where, attr = split_spec(spec)
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if not path.is_file():
            raise ConfigError(f"model_module: there is no file {where!r} (relative paths start at "
                              f"{os.getcwd()}).")
        file = str(path.resolve())
    else:
        try:
            found = importlib.util.find_spec(where)
        except ModuleNotFoundError:
            found = None
        except Exception as err:  # a parent package's __init__ failed: the user's code
            raise theirs(f"importing {where}", err, "") from None
        if found is None or not found.origin or not os.path.isfile(found.origin):
            raise ConfigError(f"model_module: no module named {where!r} on the Python path "
                              "(or give a file: path/to/file.py:make_block).")
        file = os.path.realpath(found.origin)
    stat = os.stat(file)
    return Source(where, attr, file, stat.st_mtime_ns ^ stat.st_size)


@functools.lru_cache(maxsize=8)
def _module(source: Source):
    """The user's module, executed once per version of its file (``source.stamp``)."""
    try:
        if not source.where.endswith(".py"):
            return importlib.import_module(source.where)
        name = "remat_lab_user_" + hashlib.sha256(source.file.encode()).hexdigest()[:16]
        spec = importlib.util.spec_from_file_location(name, source.file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look their module up here
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module
    except Exception as err:
        raise theirs(f"importing {source.where}", err, source.file) from None


def factory_of(spec: str) -> tuple[Callable, Source]:
    """The user's factory and its source; a missing attribute is a clear ``ConfigError``."""
    source = source_of(spec)
    module = _module(source)
    factory = getattr(module, source.attr, None)
    if not callable(factory):
        found = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
        raise ConfigError(f"model_module: {source.where} has no function {source.attr!r}; it defines: "
                          f"{', '.join(found[:20]) or 'no functions'}.")
    return factory, source


def example_input_shape(spec: str) -> tuple[int, ...] | None:
    """The module's own ``example_input_shape`` (B, N, D), when it has one."""
    factory, source = factory_of(spec)
    shape = getattr(_module(source), "example_input_shape", None)
    return tuple(shape) if isinstance(shape, tuple | list) else None


def _maker(spec: str, dtype) -> Callable[[nnx.Rngs], nnx.Module]:
    """``rngs -> block``: the user's factory called as its signature asks, its errors theirs."""
    factory, source = factory_of(spec)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}

    def make(rngs: nnx.Rngs) -> nnx.Module:
        kwargs = {"dtype": dtype} if "dtype" in params else {}
        try:
            block = factory(rngs=rngs, **kwargs) if "rngs" in params else factory(rngs, **kwargs)
        except Exception as err:
            raise theirs(f"calling {source.attr}(rngs)", err, source.file) from None
        if not isinstance(block, nnx.Module):
            raise UserCodeError(f"your block's factory {source.attr} returned a "
                                f"{type(block).__name__}, not an nnx.Module; make_block(rngs) must "
                                "return the block (a flax.nnx.Module).")
        return block
    return make


def build_user_stack(spec: str, depth: int, stack: str, *, seed: int, dtype) -> nnx.Module:
    """The user's block, ``depth`` of them stacked as ``stack`` (``stacks.build_stack``)."""
    return build_stack(_maker(spec, dtype), depth, stack, rngs=nnx.Rngs(seed))


def _names(jaxpr, found: dict) -> None:
    """Every ``checkpoint_name`` tag in ``jaxpr`` and its sub-jaxprs, in program order."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "name":
            found.setdefault(eqn.params["name"], None)
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _names(inner, found)


@functools.lru_cache(maxsize=16)
def _traced(spec: str, stamp: int, shape: tuple[int, ...], dtype) -> tuple[tuple[str, ...], tuple]:
    """(names, output shape) of one block on an input of ``shape``: traced, nothing computed."""
    make, source = _maker(spec, dtype), source_of(spec)

    def forward(x):
        block = make(nnx.Rngs(0))
        try:
            return block(x)
        except UserCodeError:
            raise
        except Exception as err:
            raise theirs(f"calling your block on an input of shape {shape}", err, source.file) from None

    try:
        closed = jax.make_jaxpr(forward)(jax.ShapeDtypeStruct(shape, dtype))
    except UserCodeError as err:
        _refuse_other_shape(spec, shape, dtype, err)
        raise
    out = closed.out_avals
    if len(out) != 1:
        raise UserCodeError(f"your block returned {len(out)} arrays; the lab sums one output array "
                            "as the loss, so __call__ must return one array.")
    found: dict = {}
    _names(closed.jaxpr, found)
    return tuple(found), (tuple(out[0].shape), str(out[0].dtype))


def _refuse_other_shape(spec: str, shape: tuple[int, ...], dtype, err: UserCodeError) -> None:
    """A ``ConfigError`` naming both shapes when the block failed on ``shape`` but takes its module's
    ``example_input_shape``: the input's shape is wrong, not the user's code."""
    example = example_input_shape(spec)
    if not example or tuple(example) == shape or "while calling your block on" not in str(err):
        return
    try:
        _traced(spec, source_of(spec).stamp, tuple(example), dtype)
    except (ConfigError, UserCodeError):
        return  # it fails on its own example too: the code's error, as raised
    said = str(err).partition("\n")[0].removeprefix("your block raised ")
    raise ConfigError(f"your block does not take an input of shape {shape}: its module's "
                      f"example_input_shape is {tuple(example)}, which it takes. Give a shape like that "
                      "one (the batch first; the other axes as the block needs) or leave the input "
                      f"shape empty to use it. (On {shape} it raised {said[:300]})") from None


def block_names(config, dtype) -> tuple[str, ...]:
    """The ``checkpoint_name`` tags of ``config``'s user block, in program order."""
    spec = config.model_module
    return _traced(spec, source_of(spec).stamp, tuple(config.input_shape), dtype)[0]


def user_options(config, dtype) -> dict:
    """``build_model``'s settings for the user's block, after checking it: it traces on the input,
    keeps its shape when stacked, and has the names ``custom`` asks for."""
    if config.model != USER_MODEL:
        return {}
    spec, shape = config.model_module, tuple(config.input_shape)
    source = source_of(spec)
    names, (out_shape, out_dtype) = _traced(spec, source.stamp, shape, dtype)
    if config.depth > 1 and (out_shape != shape or out_dtype != jax.numpy.dtype(dtype).name):
        raise ConfigError(f"your block maps {shape} {jax.numpy.dtype(dtype).name} to {out_shape} "
                          f"{out_dtype}; a stack of depth {config.depth} feeds each block's output to "
                          "the next, so it must keep the shape and dtype (or use depth 1).")
    for field in ("save_names", "offload_names"):
        unknown = [n for n in getattr(config, field) if n not in names]
        if unknown:
            known = ", ".join(names) or ("none: tag values in __call__ with "
                                         "jax.ad_checkpoint.checkpoint_name(x, 'name')")
            raise ConfigError(f"{field}: {unknown[0][:40]!r} is not a checkpoint name of your block "
                              f"({source.attr}); its names: {known}.")
    return {"module": spec, "stamp": source.stamp}
