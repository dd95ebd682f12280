"""The CLI's mixture-of-experts flags (``--experts`` and the rest), added to the llm's settings."""

from __future__ import annotations

import argparse

from remat_lab.config import CHOICES


def add_moe_args(p: argparse.ArgumentParser, d, int_arg, Given) -> None:
    """``--experts``, ``--experts-per-token``, ... with ``d``'s (``RunConfig()``'s) defaults."""
    p.add_argument("--experts", type=int_arg("experts"), default=d.experts, action=Given,
                   help="llm: a mixture of experts, this many routed gated MLPs per block (0 = dense)")
    p.add_argument("--experts-per-token", type=int_arg("experts_per_token"), default=d.experts_per_token,
                   action=Given, metavar="K", help="llm, --experts: the router's top k")
    p.add_argument("--expert-mlp-dim", type=int_arg("expert_mlp_dim"), default=d.expert_mlp_dim,
                   action=Given, help="llm, --experts: each expert's hidden size (0 = --mlp-dim)")
    p.add_argument("--shared-experts", type=int_arg("shared_experts"), default=d.shared_experts,
                   action=Given, help="llm, --experts: experts every token also goes through")
    p.add_argument("--router-gating", choices=CHOICES["router_gating"], default=d.router_gating,
                   action=Given, help="llm, --experts: softmax (Mixtral, Qwen3) or sigmoid (DeepSeek-V3)")
    p.add_argument("--moe-dispatch", choices=CHOICES["moe_dispatch"], default=d.moe_dispatch,
                   action=Given, help="llm, --experts: grouped (tokens sorted by expert, ragged_dot, "
                   "dropless: MaxText's sparse_matmul) or dense (einsums over each expert's capacity)")
    p.add_argument("--capacity-factor", type=float, default=d.capacity_factor,
                   help="llm, --experts --moe-dispatch dense: an expert's capacity, x tokens * k / "
                   "experts (0 = dropless)")
    p.add_argument("--load-balance-loss-weight", type=float, default=d.load_balance_loss_weight,
                   help="llm, --experts: the auxiliary load-balancing loss's coefficient (MaxText's 0)")
