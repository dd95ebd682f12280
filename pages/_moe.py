"""The sidebar's mixture-of-experts fields (an llm with experts): experts, top k, sizes, router, capacity."""

from __future__ import annotations

import streamlit as st

from remat_lab.config import LIMITS
from remat_lab.config.moe_config import FLOAT_LIMITS, MOE_DEFAULTS, MOE_FIELDS, ROUTER_GATINGS


def controls(sb) -> None:
    """The fields of ``moe_config`` in an expander when the model has experts; a dense model's
    left at their defaults (``check_moe`` refuses them otherwise)."""
    ss = st.session_state
    if not int(ss.get("experts") or 0):
        for key in MOE_FIELDS:
            if ss.get(key, MOE_DEFAULTS[key]) != MOE_DEFAULTS[key]:
                ss[key] = MOE_DEFAULTS[key]
        return
    ss["experts_per_token"] = min(int(ss["experts_per_token"]), int(ss["experts"]))
    for key in FLOAT_LIMITS:  # a number input keeps one numeric type: a link's "1" is 1.0 here
        ss[key] = float(ss[key])
    with sb.expander("Mixture of experts", expanded=True):
        left, right = st.columns(2)
        left.number_input("Experts", *LIMITS["experts"], step=1, key="experts",
                          help="Routed experts per block; 0 = the dense gated MLP.")
        right.number_input("Experts per token", 1, int(ss["experts"]), step=1, key="experts_per_token",
                           help="The router's top k: each token goes through k experts.")
        left.number_input("Expert MLP size", *LIMITS["expert_mlp_dim"], step=64, key="expert_mlp_dim",
                          help="Each expert's gated MLP hidden size; 0 = the MLP size.")
        right.number_input("Shared experts", *LIMITS["shared_experts"], step=1, key="shared_experts",
                           help="Experts every token also goes through (DeepSeek's).")
        st.selectbox("Router", ROUTER_GATINGS, key="router_gating",
                     help="softmax over the experts (Mixtral, Qwen3-MoE) or a sigmoid per expert "
                          "(DeepSeek-V3); the top k's weights renormalised either way.")
        left.number_input("Capacity factor", *(float(v) for v in FLOAT_LIMITS["capacity_factor"]),
                          step=0.25, key="capacity_factor",
                          help="Slots per expert, × tokens × k / experts; 0 = dropless (every token).")
        right.number_input("Load-balance loss", *(float(v) for v in FLOAT_LIMITS["load_balance_loss_weight"]),
                           step=0.001, format="%.4f", key="load_balance_loss_weight",
                           help="The auxiliary loss's coefficient (MaxText's default 0).")
