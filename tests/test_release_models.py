"""On an accelerator a study drops another model's cached parameters before it builds its own."""

from __future__ import annotations

import gc
import weakref

from remat_lab.config import RunConfig
from remat_lab.program import model_cache
from remat_lab.program.model_cache import release_other_models
from remat_lab.program.step import build_problem

A = RunConfig(model="mlp", width=32, depth=2, batch=4)
B = RunConfig(model="mlp", width=48, depth=2, batch=4)


def _held(config: RunConfig) -> list[weakref.ref]:
    """Weak references to ``config``'s cached parameter leaves (jax arrays)."""
    return [weakref.ref(leaf) for leaf in build_problem(config).leaves]


def test_another_models_parameters_leave_the_device_and_the_same_models_stay():
    model_cache._HELD.clear()
    release_other_models(A, on_device=True)
    a = _held(A)
    gc.collect()
    assert all(r() is not None for r in a)  # the cache holds A's parameters
    assert not release_other_models(A.replace(batch=8, policy="minimal"), on_device=True)
    assert all(r() is not None for r in a)  # the same model (another batch, policy): kept
    assert release_other_models(B, on_device=True)
    assert all(r() is None for r in a)  # B's study: A's parameters freed
    b = _held(B)
    assert not release_other_models(A, on_device=False)  # a CPU host keeps its caches
    assert all(r() is not None for r in b)
