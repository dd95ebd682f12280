"""A mixture of experts' configuration fields: their ranges, choices and the checks between them (no JAX)."""

from __future__ import annotations

import math

from .errors import ConfigError
from .mesh_text import _show

# A mixture of experts' router (llm, experts > 0): softmax over the experts (Mixtral, Qwen3-MoE) or
# an independent sigmoid per expert (DeepSeek-V3); either way the top k's weights are renormalised.
ROUTER_GATINGS = ("softmax", "sigmoid")
# How the tokens reach their experts (model/moe.py): "grouped", sorted by expert and multiplied by
# jax.lax.ragged_dot, dropless (MaxText's sparse_matmul: true, its default); "dense", MaxText's
# einsum dispatch over every expert's capacity slots (sparse_matmul: false; capacity_factor).
MOE_DISPATCHES = ("grouped", "dense")
MOE_CHOICES = {"router_gating": ROUTER_GATINGS, "moe_dispatch": MOE_DISPATCHES}  # RunConfig's CHOICES
# name -> (lowest, highest) for the fractional fields (a whole number is accepted too).
FLOAT_LIMITS = {
    "capacity_factor": (0.0, 64.0),  # MoE: tokens an expert takes, x tokens * k / experts; 0 = dropless
    "load_balance_loss_weight": (0.0, 1.0),  # MoE: the auxiliary loss's coefficient (MaxText's, 0)
}
MOE_FIELDS = ("experts_per_token", "expert_mlp_dim", "shared_experts", "capacity_factor",
              "router_gating", "load_balance_loss_weight", "moe_dispatch")  # only with experts > 0
MOE_DEFAULTS = {"experts_per_token": 2, "expert_mlp_dim": 0, "shared_experts": 0, "capacity_factor": 0.0,
                "router_gating": "softmax", "load_balance_loss_weight": 0.0,
                "moe_dispatch": "grouped"}  # RunConfig's

# A published config's mixture-of-experts keys (config/model_config.py): Hugging Face's (Mixtral's
# num_local_experts, Qwen3-MoE's num_experts and moe_intermediate_size) and MaxText's.
HF_MOE_FIELDS = {"num_local_experts": "experts", "num_experts": "experts",
                 "num_experts_per_tok": "experts_per_token", "moe_intermediate_size": "expert_mlp_dim"}
MT_MOE_FIELDS = {"num_experts": "experts", "num_experts_per_tok": "experts_per_token",
                 "base_moe_mlp_dim": "expert_mlp_dim"}
MOE_FAMILIES = {"mixtral": False, "qwen3_moe": False}  # model_type -> tied embeddings by default
# No shape: the aux loss's coefficient (load_balance_loss_weight is the lab's), router outputs and
# noise, Qwen3's norm_topk_prob (the lab always renormalises the top k's weights).
MOE_UNUSED = {"router_aux_loss_coef", "output_router_logits", "router_jitter_noise", "norm_topk_prob"}


def capacity(tokens: int, experts: int, k: int, factor: float) -> int:
    """Each expert's slots per sequence: MaxText's ``max(ceil(N k / E) * factor, factor)``, at most
    ``N``; ``factor`` 0 (dropless): ``N``."""
    if factor <= 0:
        return tokens
    return max(1, min(tokens, int(max(math.ceil(tokens * k / experts) * factor, factor))))


def dense_if_single(fields: dict) -> dict:
    """``fields`` without the experts' when there is one expert (MaxText's num_experts 1: dense)."""
    if fields.get("experts") != 1:
        return fields
    return {k: v for k, v in fields.items() if k not in ("experts", "experts_per_token", "expert_mlp_dim")}


def parse_float(name: str, text: str) -> float:
    """A fractional field's value from text (a URL, a form), or a ConfigError saying its range."""
    lo, hi = FLOAT_LIMITS[name]
    try:
        value = float(text.strip()) if len(text) <= 12 else float("nan")
    except ValueError:
        value = float("nan")
    if value != value:
        raise ConfigError(f"{name} must be a number from {lo:g} to {hi:g}, not {text[:40]!r}.")
    return value


def checked_float(name: str, value: object) -> float:
    """``value`` as a float within ``FLOAT_LIMITS[name]``, or a ConfigError."""
    lo, hi = FLOAT_LIMITS[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be a number from {lo:g} to {hi:g}, not {_show(value)}.")
    return float(value)


def check_moe(config) -> None:
    """A mixture of experts: the llm's, k of at most its experts; its other fields only with
    experts. On a mesh its experts are split as the dense MLP (``program/mesh.py``)."""
    if not config.experts:
        changed = [k for k in MOE_FIELDS if getattr(config, k) != MOE_DEFAULTS[k]]
        if changed:
            raise ConfigError(f"{changed[0]} is for a mixture of experts: set experts (the routed "
                              "experts per block) above 0, or leave it at its default.")
        return
    if config.model != "llm":
        raise ConfigError(f"experts (a mixture of experts) is for the llm, not {config.model}.")
    if config.experts_per_token > config.experts:
        raise ConfigError(f"experts_per_token {config.experts_per_token} is more than the "
                          f"{config.experts} experts; the router picks k of them (k <= experts).")
    if config.capacity_factor and config.moe_dispatch == "grouped":
        raise ConfigError(f"capacity_factor {config.capacity_factor:g} is the dense dispatch's: the "
                          "grouped dispatch (moe_dispatch grouped, the default) is dropless; set "
                          "moe_dispatch dense (--moe-dispatch dense) to give the experts a capacity, "
                          "or leave capacity_factor at 0.")


def check_expert_axis(config, expert: int) -> None:
    """A mesh's ``expert`` axis (size ``expert``) splits the experts: only with experts, a multiple of it."""
    if expert > 1 and (not config.experts or config.experts % expert):
        raise ConfigError(f"the expert axis splits a mixture of experts' experts: {config.experts} "
                          f"experts cannot be split over expert = {expert} devices; use a number "
                          f"of experts that is a multiple of {expert}, or no expert axis.")


def moe_activation_bytes(config, rows: int, item: int) -> int:
    """A mixture of experts' activations in one block of ``rows`` tokens (``budget.py``'s estimate):
    the dispatched tokens, the experts' three hidden values and output over every slot
    (grouped: the ``rows x k`` routed pairs; dense: experts x capacity a sequence, and the float32
    dispatch and combine masks), the router's float32 logits and scores, and the shared experts'
    hidden values."""
    e, f, seqs = config.experts, config.expert_mlp_dim_used, rows // config.seq
    if config.moe_dispatch == "grouped":
        pairs = rows * config.experts_per_token
        return (pairs * (2 * config.width + 3 * f) * item + pairs * 8 + rows * e * 8
                + rows * 4 * config.shared_experts * f * item)
    slots = seqs * e * capacity(config.seq, e, config.experts_per_token, config.capacity_factor)
    return (slots * (2 * config.width + 3 * f) * item + 2 * rows * slots // seqs * 4 + rows * e * 8
            + rows * 4 * config.shared_experts * f * item)
