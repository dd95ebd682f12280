"""A mixture of experts' configuration fields: their ranges, choices and the checks between them (no JAX)."""

from __future__ import annotations

from .errors import ConfigError

# A mixture of experts' router (llm, experts > 0): softmax over the experts (Mixtral, Qwen3-MoE) or
# an independent sigmoid per expert (DeepSeek-V3); either way the top k's weights are renormalised.
ROUTER_GATINGS = ("softmax", "sigmoid")
# name -> (lowest, highest) for the fractional fields (a whole number is accepted too).
FLOAT_LIMITS = {
    "capacity_factor": (0.0, 64.0),  # MoE: tokens an expert takes, x tokens * k / experts; 0 = dropless
    "load_balance_loss_weight": (0.0, 1.0),  # MoE: the auxiliary loss's coefficient (MaxText's, 0)
}
MOE_FIELDS = ("experts_per_token", "expert_mlp_dim", "shared_experts", "capacity_factor",
              "router_gating", "load_balance_loss_weight")  # only with experts > 0
MOE_DEFAULTS = {"experts_per_token": 2, "expert_mlp_dim": 0, "shared_experts": 0, "capacity_factor": 0.0,
                "router_gating": "softmax", "load_balance_loss_weight": 0.0}  # RunConfig's


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
        raise ConfigError(f"{name} must be a number from {lo:g} to {hi:g}, not {value!r:.40}.")
    return float(value)


def check_moe(config) -> None:
    """A mixture of experts: the llm's, k of at most its experts, on one device for now (the
    expert mesh axis is still to come); its other fields only with experts."""
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
    if config.mesh:
        raise ConfigError(f"mesh {config.mesh}: a mixture of experts runs on one device so far "
                          "(no expert axis or expert sharding yet); drop the mesh.")
