"""The start page's link: a published model on a target, with the usual training recipe, as URL parameters."""

from __future__ import annotations

from pages import _url
from remat_lab.config import coerce_config
from remat_lab.config.run import preset_fields

# The usual training recipe of a published LLM (MaxText: weight_dtype float32, dtype bfloat16):
# the whole AdamW step, float32 master weights and moments, bfloat16 compute, one example per device.
RECIPE = {"step": "train", "dtype": "bfloat16", "param_dtype": "float32", "optimizer_dtype": "float32"}
# Attention and the vocabulary loss as trained at long sequences, where the link can carry them.
LONG_SEQUENCE = {"attention": "flash", "loss_chunks": "8"}


def start_params(preset: str, seq: int, target: str, devices: int, recipe: bool = True) -> dict[str, str]:
    """The link's parameters for ``preset`` trained on ``devices`` of ``target`` (``local``: this
    machine), FSDP over all of them, one example per device; checked as the sidebar would
    (``ConfigError`` with what is allowed)."""
    params = {"model": "llm", "preset": preset, "seq": str(seq), "target": target,
              "batch": str(devices)}
    if devices > 1:
        params["mesh"] = f"fsdp={devices}"
    if recipe:
        params.update(RECIPE)
        known = set(_url.CONTROL_KEYS) | set(_url.LLM_KEYS)
        params.update({k: v for k, v in LONG_SEQUENCE.items() if k in known})
    coerce_config({**preset_fields(preset), **params, "target_devices": str(devices)})
    return params
