"""Remat Lab: measure and dissect JAX rematerialization policies on a Flax NNX model."""

from .config import ConfigError, MemoryBudgetError, RunConfig, coerce_config
from .policies import DEFAULT_POLICY, POLICIES

__all__ = [
           "DEFAULT_POLICY",
           "POLICIES",
           "ConfigError",
           "MemoryBudgetError",
           "RunConfig",
           "coerce_config",
]
