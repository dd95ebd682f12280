"""The bottom layer: the frozen configuration, its names, budgets and the machine's memory limit.

Imports nothing of the package above it and no JAX. ``from remat_lab.config import X`` reaches every
public name of ``run`` (the configuration), ``budget`` (estimates, budgets, human units) and
``catalog`` (model, stack and policy names).
"""

from .budget import (
    COMPILE_WORKSPACE,
    PROCESS_FACTOR,
    budget_text,
    check_budget,
    check_compiled,
    default_budget_bytes,
    estimate_bytes,
    estimate_process_bytes,
    human_bytes,
    human_count,
    human_flops,
    human_seconds,
    llm_model_flops,
    llm_parameters,
    mfu_flops,
    mfu_model_flops,
    mfu_text,
    optimizer_state_bytes,
    parameter_counts,
    parameters_text,
    parse_bytes,
    resolve_budget,
)
from .catalog import (
    DEFAULT_POLICY,
    MODELS,
    NAMES,
    POLICY_IDS,
    PRESET_FIELDS,
    PRESET_NAMES,
    PRESETS,
    SEQ_MODELS,
    STACKS,
    names_of,
)
from .coerce import coerce_config
from .defaults import APP_DEFAULT, flag_defaults
from .mesh_text import (
    BATCH_AXES,
    DCN_AXES,
    batch_axes_text,
    batch_rows,
    canonical_mesh,
    mesh_dcn,
    mesh_parts,
    mesh_slices,
)
from .run import (
    BOOL_FIELDS,
    BUDGET_ENV,
    CHOICES,
    DTYPES,
    LIMITS,
    LLM_LIMITS,
    MAX_MESH_DEVICES,
    MESH_AXES,
    NAME_FIELDS,
    OBJECTIVES,
    PARAM_DTYPES,
    STEPS,
    ConfigError,
    MemoryBudgetError,
    RunConfig,
    format_mesh,
    mesh_devices,
    parse_mesh,
    preset_fields,
)
from .targets import COLLECTIVE_OVERLAPS, LOCAL, TARGET_NAMES, TARGETS, Target, get_target

__all__ = [
    "APP_DEFAULT", "flag_defaults",
    "BUDGET_ENV", "CHOICES", "COLLECTIVE_OVERLAPS",
    "COMPILE_WORKSPACE", "DEFAULT_POLICY", "DTYPES", "LIMITS", "LLM_LIMITS",
    "MAX_MESH_DEVICES", "MESH_AXES", "DCN_AXES", "BATCH_AXES", "batch_rows", "batch_axes_text",
    "canonical_mesh", "mesh_dcn", "mesh_parts",
    "mesh_slices", "MODELS", "NAMES", "NAME_FIELDS", "OBJECTIVES", "POLICY_IDS",
    "PROCESS_FACTOR", "SEQ_MODELS", "STACKS", "ConfigError", "MemoryBudgetError", "RunConfig",
    "check_budget", "check_compiled",
    "coerce_config", "default_budget_bytes", "estimate_bytes", "estimate_process_bytes",
    "budget_text", "format_mesh", "human_bytes", "human_flops", "human_seconds", "mesh_devices",
    "names_of", "parse_bytes", "parse_mesh",
    "resolve_budget", "BOOL_FIELDS", "PARAM_DTYPES", "PRESETS", "PRESET_FIELDS", "PRESET_NAMES",
    "STEPS", "llm_model_flops", "mfu_flops", "mfu_model_flops", "mfu_text", "llm_parameters",
    "optimizer_state_bytes", "parameter_counts", "parameters_text", "human_count",
    "preset_fields", "LOCAL",
    "TARGET_NAMES",
    "TARGETS", "Target", "get_target",
]
