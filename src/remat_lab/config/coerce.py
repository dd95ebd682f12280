"""A configuration from loosely typed values: strings from a URL or a form (no JAX)."""

from __future__ import annotations

from dataclasses import fields

from .catalog import PRESETS
from .errors import ConfigError
from .moe_config import FLOAT_LIMITS, parse_float
from .run import BOOL_FIELDS, LIMITS, NAME_FIELDS, RunConfig, _names_tuple


def coerce_config(raw: dict) -> RunConfig:
    """A ``RunConfig`` from loosely typed values (strings from a URL or a form).

    Unknown keys are refused; integers must be written as plain whole numbers.
    """
    known = {f.name for f in fields(RunConfig)}
    unknown = sorted(str(k) for k in set(raw) - known)
    if unknown:
        shown = "".join(c if c.isprintable() else "?" for c in unknown[0][:32])
        raise ConfigError(f"unknown setting {shown!r}; known: {', '.join(sorted(known))}.")
    values = {}
    for name, value in raw.items():
        if name in FLOAT_LIMITS and isinstance(value, str):
            value = parse_float(name, value)
        if name in LIMITS and isinstance(value, str):
            text = value.strip()
            lo, hi = LIMITS[name]
            if not (text.isascii() and text.removeprefix("-").isdigit()) or len(text) > 12:
                raise ConfigError(f"{name} must be a whole number from {lo} to {hi}, "
                                  f"not {value[:40]!r}.")
            value = int(text)
        if name in NAME_FIELDS:
            value = _names_tuple(name, value)
        if name in BOOL_FIELDS and isinstance(value, str):
            text = value.strip().lower()
            if text not in ("true", "false", "1", "0"):
                raise ConfigError(f"{name} must be true or false, not {value[:40]!r}.")
            value = text in ("true", "1")
        values[name] = value
    preset = values.get("preset")
    if isinstance(preset, str) and preset in PRESETS:  # the preset fills what is not given
        return RunConfig.from_preset(preset, **{k: v for k, v in values.items() if k != "preset"})
    return RunConfig(**values)
