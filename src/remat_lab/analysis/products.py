"""The compiled program against the no_remat compile: the products it adds, and which jaxpr dots they are.

``op_name`` metadata is no witness of what XLA recomputed (it drops it on rewritten products, and a
CSE survivor keeps whichever copy's name it likes), so a policy's compiled program is compared with
a second compile, the ``no_remat`` program of the same configuration and objective: the extra
products, counted by instruction and identified by result size, contracted size and batch size
(``hlo.product_key``), are the recomputations that survived XLA.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from remat_lab.analysis import hlo
from remat_lab.analysis.jaxprs import Eqn, dot_dims, numel


def jaxpr_product_key(e: Eqn) -> tuple:
    """``hlo.product_key`` of a jaxpr ``dot_general``: result elements, contracted and batch sizes."""
    (lc, _), (lb, _) = dot_dims(e.eqn)
    lhs = e.eqn.invars[0].aval
    return hlo.product_key(numel(e.eqn.outvars[0].aval.shape),
                           int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64)),
                           int(np.prod([lhs.shape[d] for d in lb], dtype=np.int64)))


def compare_compiled(text: str, flops: float | None, baseline: dict | None) -> dict:
    """The policy's compiled program against the ``no_remat`` one (same configuration, objective).

    ``baseline``: ``{"text", "flops"}`` of the no_remat compile. Returns ``dot_count`` (products
    run per step: a product in a scan's loop body counts once per iteration), ``dot_instructions``
    (each instruction once), ``loop_trip_counts``, ``fingerprint``, ``excess_dots_vs_no_remat`` and
    ``excess_flops_vs_no_remat`` (None without a baseline), ``excess_by_key`` (product key -> extra
    count), ``identical_to`` ("no_remat" when the two programs are the same up to names and
    metadata), ``host_memory`` (the program places values in host memory) and ``bf16_upcast``
    (XLA computes bf16 products in float32).
    """
    keys = Counter(hlo.product_keys(text))
    out = {"dot_count": sum(keys.values()), "dot_instructions": hlo.matmul_count(text),
           "loop_trip_counts": hlo.executions(text)[1], "fingerprint": hlo.fingerprint(text),
           "excess_dots_vs_no_remat": None, "excess_flops_vs_no_remat": None,
           "excess_product_flops_vs_no_remat": None, "excess_by_key": {},
           "identical_to": None, "host_memory": hlo.uses_host_memory(text),
           "bf16_upcast": hlo.upcasts_bf16_matmuls(text)}
    if baseline is None:
        return out
    base_keys = Counter(hlo.product_keys(baseline["text"]))
    out["excess_dots_vs_no_remat"] = out["dot_count"] - sum(base_keys.values())
    if flops is not None and baseline.get("flops") is not None:
        out["excess_flops_vs_no_remat"] = flops - baseline["flops"]
    excess = {k: keys[k] - base_keys[k] for k in keys | base_keys if keys[k] != base_keys[k]}
    out["excess_by_key"] = excess
    out["excess_product_flops_vs_no_remat"] = sum(
        2 * k[0] * (k[1] or 0) * n for k, n in excess.items())
    if hlo.fingerprint(baseline["text"]) == out["fingerprint"]:
        out["identical_to"] = "no_remat"
    return out


def attribute(rows: list[dict], keys: list[tuple], excess_by_key: dict) -> None:
    """Set ``recomputed_in_compiled`` on each row: True / False, or None where not attributable.

    For each product key, the policy's compiled program has ``n`` more products than no_remat's;
    the rows the backward jaxpr recomputes with that key are the candidates. n <= 0: none of them
    survived; n == candidates: all did; otherwise which ones cannot be told apart (None). A row of
    a scanned body stands for ``layers`` executions.
    """
    candidates = defaultdict(list)
    for row, key in zip(rows, keys):
        row["recomputed_in_compiled"] = False
        if row["recomputed"]:
            candidates[key].append(row)
    for key, group in candidates.items():
        n = excess_by_key.get(key, 0)
        if n <= 0:
            continue
        for row in group:
            row["recomputed_in_compiled"] = True if n >= sum(r["layers"] for r in group) else None
