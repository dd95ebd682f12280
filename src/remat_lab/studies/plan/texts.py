"""A plan as MaxText's knobs: its YAML and its command-line flags (the lab's `run`: config.cli_flags)."""

from __future__ import annotations

from remat_lab.config import RunConfig, mesh_parts
from remat_lab.config.catalog import NAMES


def maxtext_knobs(config: RunConfig) -> dict:
    """MaxText's knobs for ``config`` (its batch, mesh, remat plan, offload, accumulation)."""
    ici, dcn = mesh_parts(config.mesh)
    per_device = config.batch / config.microbatches / config.target_devices
    knobs: dict = {"per_device_batch_size": int(per_device) if per_device == int(per_device) else per_device,
                   "max_target_length": config.seq}
    if config.microbatches > 1:
        knobs["gradient_accumulation_steps"] = config.microbatches
    for axis in ("data", "fsdp", "tensor", "expert"):
        if ici.get(axis, 1) > 1:
            knobs[f"ici_{axis}_parallelism"] = ici[axis]
        if dcn.get(axis, 1) > 1:
            knobs[f"dcn_{axis}_parallelism"] = dcn[axis]
    knobs["remat_policy"] = config.policy
    if config.policy == "custom":
        for n in ("decoder_layer_input", *[n for n in NAMES["llm"] if n not in ("embed", "logits",
                                                                                "decoder_layer_input")]):
            knobs[n] = ("device" if n in config.save_names else "offload" if n in config.offload_names
                        else "remat")
    if config.optimizer_offload:
        knobs["optimizer_memory_host_offload"] = True
    knobs["attention"] = "flash" if config.attention == "flash" else "dot_product"
    knobs["scan_layers"] = config.stack == "scan"
    return knobs


def maxtext_yaml(config: RunConfig) -> str:
    return "\n".join(f"{k}: {_yaml_value(v)}" for k, v in maxtext_knobs(config).items())


def maxtext_flags(config: RunConfig) -> str:
    """The same knobs as ``train.py`` takes them on its command line (``key=value``)."""
    return " ".join(f"{k}={_yaml_value(v)}" for k, v in maxtext_knobs(config).items())


def _yaml_value(v: object) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return f"'{v}'" if isinstance(v, str) else str(v)
