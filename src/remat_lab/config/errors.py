"""The configuration's errors: a setting that cannot run, an estimate over the budget, the user's own code."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run; the message is a sentence for the user."""


class MemoryBudgetError(ConfigError):
    """A configuration whose estimated memory exceeds the budget."""


class UserCodeError(ConfigError):
    """An error raised by the user's own block (importing it, its factory, its ``__call__``): the
    message starts "your block raised ..." and carries the frames of their file only."""
