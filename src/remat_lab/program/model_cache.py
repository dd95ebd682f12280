"""The parameters and input of a configuration, cached per model, and their release from an accelerator."""

from __future__ import annotations

import functools
import gc

import jax
import jax.numpy as jnp
from flax import nnx

from remat_lab.config import RunConfig
from remat_lab.model.models import build_model, llm_options

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _path_name(path) -> str:
    """``(DictKey('l1'), DictKey('kernel'), GetAttrKey('value'))`` -> ``'l1.kernel'``."""
    parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    return ".".join(p for p in parts if p not in ("value", ""))


# Parameters and inputs depend on neither the policy nor the objective: a sweep over policies
# (or the app re-running a configuration) reuses them. They are initialised by one jitted program
# (bitwise the same values as eager initialisation) rather than op by op: eagerly, every op at a
# new shape is a separate compile (or persistent-cache lookup), which cost more than compiling the
# step itself. Arrays are immutable, so sharing them is safe.
def _llm_key(config: RunConfig) -> tuple:
    """The llm's build settings as a hashable key (param_dtype by name); () for other models."""
    opts = llm_options(config, DTYPES)
    return tuple(sorted({**opts, "param_dtype": config.param_dtype_used}.items())) if opts else ()


def _llm_kwargs(llm: tuple) -> dict:
    opts = dict(llm)
    return {**opts, "param_dtype": DTYPES[opts["param_dtype"]]} if opts else {}


@functools.lru_cache(maxsize=4)
def _parameters(model_name: str, width: int, depth: int, seed: int, dtype_name: str, stack: str,
                heads: int = 4, llm: tuple = ()):
    found = {}

    def init():
        graphdef, state = nnx.split(build_model(model_name, width, depth, seed=seed,
                                                dtype=DTYPES[dtype_name], stack=stack,
                                                heads=heads, **_llm_kwargs(llm)))
        found["graphdef"] = graphdef  # static structure, no arrays
        return state

    state = jax.jit(init)()
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    return (found["graphdef"], treedef, tuple(leaf for _, leaf in flat),
            tuple(_path_name(p) for p, _ in flat))


@functools.lru_cache(maxsize=4)
def _input(shape: tuple[int, ...], seed: int, dtype_name: str, vocab: int = 0) -> jax.Array:
    """The input from the seed: normal values in the dtype, or for the llm (``vocab`` > 0)
    uniform integer tokens in ``[0, vocab)``."""
    key = jax.random.key(seed + 1)
    if vocab:
        return jax.jit(lambda: jax.random.randint(key, shape, 0, vocab, dtype=jnp.int32))()
    dtype = DTYPES[dtype_name]
    return jax.jit(lambda: jax.random.normal(key, shape, dtype=dtype))()


_HELD: dict = {}  # the model whose parameters the caches last held for a study (release_other_models)


def release_other_models(config: RunConfig, on_device: bool | None = None) -> bool:
    """Before a study of ``config`` on an accelerator, drop the cached parameters and inputs of
    another model (``_parameters``, ``_input``: up to four each), so that they do not hold the
    device's memory; True when it dropped them. On a v5e an earlier llama3.2-1b run's 4.9 GB of
    parameters, kept by the cache in the same process, made gpt2-small's training step at batch
    115 (1.005x its compiled 15.0 GiB of 15.75) fail to allocate (2026-12-08). On a CPU host
    (``on_device`` False; default: the backend is not the CPU) the caches stay as they are."""
    on_device = jax.default_backend() != "cpu" if on_device is None else on_device
    key = (config.model, config.width, config.depth, config.seed, config.dtype, config.stack,
           config.heads, _llm_key(config))
    if not on_device or _HELD.get("key") in (None, key):
        _HELD["key"] = key
        return False
    _parameters.cache_clear()
    _input.cache_clear()
    gc.collect()
    _HELD["key"] = key
    return True
