"""The web server imports no accelerator plugin: the CUDA plugin and libtpu are for the worker processes only.

Importing JAX imports the CUDA plugin's Python extensions and libtpu's package when they are
installed (``jax._src.lib``, ``cloud_tpu_init``, ``xla_bridge``): about 100 MiB of shared libraries
in a process that never compiles (the server's JAX work runs in workers, ``serve/pool.py``).
``keep_out`` makes those imports fail in this process before anything imports JAX, which JAX
takes as "not installed"; the spawned workers start from a fresh interpreter and load them. Only
when jobs run in workers (``$REMAT_LAB_WORKERS`` is not ``0``: with ``0`` the server runs them
itself, as the AppTest tests do). Nothing here imports the engine (its package imports JAX).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

BLOCKED = ("jax_plugins", "libtpu")  # the PJRT plugins' namespace; libtpu's package
BLOCKED_PREFIXES = ("jax_cuda", "jax_rocm")  # jax_cuda12_plugin, jax_cuda13_plugin, jax_rocm7_plugin


class _KeepOut(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the accelerator plugins' packages and fails to load them, as if they were not
    installed (a spec is found, so that asking whether one exists does not raise)."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in BLOCKED or top.startswith(BLOCKED_PREFIXES):
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        raise ModuleNotFoundError(f"{spec.name} is left to the worker processes", name=spec.name)

    def exec_module(self, module) -> None:  # never reached: create_module refuses
        raise ModuleNotFoundError(module.__name__)


def keep_out(environ=os.environ) -> bool:
    """Install the refusal in this process when jobs run in workers and JAX is not imported yet;
    whether it is in place."""
    if any(isinstance(f, _KeepOut) for f in sys.meta_path):
        return True
    if environ.get("REMAT_LAB_WORKERS", "1").strip() == "0" or "jax" in sys.modules:
        return False
    sys.meta_path.insert(0, _KeepOut())
    return True
