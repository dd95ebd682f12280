"""Remat Lab: measure and dissect JAX rematerialization policies on a Flax NNX model.

The engine's layers (``docs/ARCHITECTURE.md``): ``config`` < ``model`` < ``program`` < ``analysis``
< ``studies`` / ``store`` < ``serve`` / ``present`` < ``cli``. Importing the package imports only the
configuration (no JAX).
"""

from remat_lab.config import DEFAULT_POLICY, ConfigError, MemoryBudgetError, RunConfig, coerce_config

__all__ = ["DEFAULT_POLICY", "ConfigError", "MemoryBudgetError", "RunConfig", "coerce_config"]
