"""Remat Lab: measure and dissect JAX rematerialization policies on a Flax NNX model.

The engine's layers (``docs/ARCHITECTURE.md``): ``config`` < ``model`` < ``program`` < ``analysis``
< ``studies`` / ``store`` < ``serve`` / ``present`` < ``cli``. Importing the package imports only the
configuration (and JAX, quietly, when the CUDA plugin is installed). It sets, before anything
imports JAX, what compiling for an accelerator that is not attached needs (``program/targets.py``):
the CUDA plugin skips its driver check (else it fails to load and no GPU target exists), and libtpu
may be loaded by several processes at once; without a local GPU, XLA's one-shot all-reduce kernel is
off (``XLA_FLAGS``), since its LLVM code kills a deviceless compile over 8 H100 hosts (exit 1).
"""

import glob as _glob
import os as _os
import sys as _sys
from importlib.util import find_spec as _find_spec

_ONE_SHOT = "xla_gpu_unsupported_use_all_reduce_one_shot_kernel"

_os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
if not (_glob.glob("/dev/accel[0-9]*") or _glob.glob("/dev/vfio/[0-9]*")):  # no TPU attached
    _os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
if not (_glob.glob("/dev/nvidia[0-9]*") or _glob.glob("/dev/accel[0-9]*")
        or _glob.glob("/dev/vfio/[0-9]*")):
    # No accelerator here: the local backend is the CPU, without probing CUDA and libtpu at start.
    _os.environ.setdefault("JAX_PLATFORMS", "cpu")
if not _glob.glob("/dev/nvidia[0-9]*") and _ONE_SHOT not in _os.environ.get("XLA_FLAGS", ""):
    # No GPU runs here, so the kernel's choice only shapes deviceless GPU programs, whose optimized
    # HLO and memory it leaves unchanged (tests/test_analysis_compile.py); only XLA_FLAGS, read once
    # at start, avoids the crash: the same option per compile does not.
    _os.environ["XLA_FLAGS"] = f"{_os.environ.get('XLA_FLAGS', '')} --{_ONE_SHOT}=false".strip()

if "jax" not in _sys.modules and _find_spec("jax_plugins"):
    # With the CUDA plugin and no driver, importing JAX prints "Could not find cuda drivers" from C++.
    from remat_lab.program.targets import quiet_native_stderr as _quiet

    with _quiet():
        import jax  # noqa: F401

from remat_lab.config import DEFAULT_POLICY, ConfigError, MemoryBudgetError, RunConfig, coerce_config  # noqa: E402

__all__ = ["DEFAULT_POLICY", "ConfigError", "MemoryBudgetError", "RunConfig", "coerce_config"]
