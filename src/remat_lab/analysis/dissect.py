"""What the policy decided and what XLA did: residual and per-dot tables from jaxprs and HLO.

Forward values cannot show a policy's effect (the seed says so); these tables read it from the
programs themselves:

* the **vjp jaxpr** (``make_jaxpr(vjp)``, as ``jax.ad_checkpoint.saved_residuals`` does) holds the
  forward pass and lists the residuals it hands to the backward pass;
* the **step jaxpr** (``make_jaxpr(value_and_grad)``) holds the backward pass; JAX puts every
  equation it recomputes under the ``rematted_computation`` name scope;
* the **compiled HLO** is compared with a second compile, the ``no_remat`` program of the same
  configuration and objective: the policy's extra products (counted by instruction, identified by
  result size, contracted size and batch size; see ``hlo.product_key``) are the recomputations
  that survived XLA. ``op_name`` metadata is not used as a witness: XLA drops it on rewritten
  products, and a CSE survivor keeps whichever copy's name it likes.

Layers are attributed by the ``jax.named_scope`` the models put around each layer (``l1``,
``mix``, ``l2``, inside ``block{i}``); for arguments, by the parameter path.

This module assembles the tables; the jaxpr walkers are in ``jaxprs``, the comparison of the two
compiles in ``products``, the explanations in ``notes``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import jax
import numpy as np
from jax._src import core as jcore  # ClosedJaxpr (pinned jax)
from jax._src import source_info_util

from remat_lab.analysis.jaxprs import (
    dot_dims,
    dot_signature,
    is_constant,
    memory_kind,
    name_tags,
    name_verdicts,
    nbytes,
    numel,
    producer_kind,
    residual_producers,
    save_all,
    verdict,
    walk,
)
from remat_lab.analysis.layers import layer_of, layer_of_path, named_layer
from remat_lab.analysis.notes import dot_note, mesh_note, name_notes, program_notes
from remat_lab.analysis.products import attribute, compare_compiled, jaxpr_product_key
from remat_lab.model.policies import build_policy, get_policy
from remat_lab.program.step import Problem, make_step

__all__ = ["Dissection", "compare_compiled", "dissect"]


@dataclass
class Dissection:
    """The tables and program texts of one configuration (plain data, JSON-ready).

    ``compiled``: what the compiled program shows against the ``no_remat`` compile (see
    ``compare_compiled``); empty when no baseline program was given.
    """

    residuals: list[dict]
    dots: list[dict]
    compiled: dict
    totals: dict
    notes: list[str]
    texts: dict = field(repr=False)


def dissect(problem: Problem, compiled_text: str, *,
            step_jaxpr: jcore.ClosedJaxpr | None = None, flops: float | None = None,
            baseline: dict | None = None, backend: str = "cpu") -> Dissection:
    """Residuals, per-dot decisions and their fate in the compiled program for ``problem``.

    ``step_jaxpr``: the step's jaxpr when the caller has already traced it (``jit(...).trace``),
    so it is not traced a second time. ``flops``: XLA's flop count of ``compiled_text``.
    ``baseline``: ``{"text", "flops"}`` of the ``no_remat`` compile with the same configuration and
    objective, the witness for what the compiled program recomputes (without it the compiled
    columns are None). ``backend``: ``jax.default_backend()``, for the notes.
    """
    cfg = problem.config
    depth = cfg.depth
    policy_entry = get_policy(cfg.policy)
    policy = build_policy(cfg) if policy_entry.remat else None
    leaves, x = problem.args
    n_leaves = len(leaves)

    def flat_loss(*args):
        return problem.loss(list(args[:n_leaves]), args[n_leaves])

    vjp_closed = jax.make_jaxpr(lambda *a: jax.vjp(flat_loss, *a))(*leaves, x)
    vjp_jaxpr = vjp_closed.jaxpr
    step_closed = (step_jaxpr if step_jaxpr is not None
                   else jax.make_jaxpr(make_step(problem))(leaves, x))
    fwd_closed = jax.make_jaxpr(problem.loss)(leaves, x)
    arg_names = [*problem.paths, "x"]
    compiled = compare_compiled(compiled_text, flops, baseline)
    compiled["bf16_upcast"] = compiled["bf16_upcast"] and backend == "cpu"  # XLA CPU's alone
    host_in_compiled = compiled["host_memory"]
    # Under a scan stack one body stands for every layer: its rows count ``depth`` times.
    scanned = depth > 1 and getattr(cfg, "stack", "loop") == "scan"

    def layers_of(stack: str) -> int:
        return depth if scanned and "layers" in stack.split("/") else 1

    # Forward dots, in program order, from the vjp jaxpr (the forward pass it runs).
    fwd_dots = [e for e in walk(vjp_jaxpr) if e.eqn.primitive.name == "dot_general"]
    tags, tagged_dots = name_tags(vjp_jaxpr)

    # Residuals.
    residuals, saved_by = [], {}
    for i, (var, prod, forwarded, arg_idx) in enumerate(residual_producers(vjp_jaxpr, 1)):
        aval = var.aval
        if arg_idx is not None:
            name = arg_names[arg_idx]
            kind, layer, source = "argument", layer_of_path(name, depth), f"argument {name}"
            role = "input" if name == "x" else "parameter"
            n_layers = depth if scanned and name.startswith("blocks.") else 1
        elif prod is None:
            kind, layer, source, role, n_layers = "literal", "other", "a literal", "constant", 1
        elif forwarded:
            kind, layer, role, n_layers = "layer input", "input", "activation", depth
            source = f"each scanned layer's input, stacked by scan (all {depth} layers)"
        else:
            kind = producer_kind(prod)
            layer = layer_of(prod.stack, depth)
            where = source_info_util.summarize(prod.eqn.source_info)
            source = f"{kind} in {layer} ({where.split('/')[-1]})"
            role = "constant" if is_constant(prod) else "activation"
            # Stacked by the scan: one more axis than the value the body computes. (A loop
            # invariant hoisted out of the scan keeps the body's shape and counts once.)
            stacked = len(aval.shape) == len(prod.eqn.outvars[0].aval.shape) + 1
            n_layers = layers_of(prod.stack) if stacked else 1
            if n_layers > 1:
                source += f", all {n_layers} layers (stacked by scan)"
            if prod.eqn.primitive.name == "dot_general":
                saved_by[id(prod.eqn)] = memory_kind(aval)
        mem_kind = memory_kind(aval)
        tag = tags.get(prod.eqn.outvars[0]) if prod is not None and not forwarded else None
        if tag is not None and id(tag.eqn) in tagged_dots:  # the named value is that dot's output
            saved_by[id(tagged_dots[id(tag.eqn)][1].eqn)] = mem_kind
        residuals.append({
            "index": i, "shape": list(aval.shape), "dtype": str(aval.dtype),
            "bytes": nbytes(aval), "memory_kind": mem_kind,
            "memory_kind_in_compiled": mem_kind if host_in_compiled else "device",
            "role": role, "kind": kind, "layers": n_layers, "source": source,
            "name": tag.eqn.params["name"] if tag is not None else None,
            "layer": named_layer(layer, tag.eqn.params["name"] if tag is not None else None),
        })

    # Recomputed dots in the backward pass (under JAX's rematted_computation scope).
    recomputed = Counter(
        dot_signature(e, depth) for e in walk(step_closed.jaxpr)
        if e.eqn.primitive.name == "dot_general" and "rematted_computation" in e.stack)

    dots, keys, seen = [], [], Counter()
    for i, e in enumerate(fwd_dots):
        eqn = e.eqn
        sig = dot_signature(e, depth)
        seen[sig] += 1
        (lc, rc), (lb, rb) = dot_dims(eqn)
        lhs, rhs = (v.aval for v in eqn.invars)
        out = eqn.outvars[0].aval
        contracted = int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64))
        mem = saved_by.get(id(eqn))
        n_layers = layers_of(e.stack)
        dots.append({
            "index": i, "layer": sig[0], "lhs_shape": list(lhs.shape), "rhs_shape": list(rhs.shape),
            "out_shape": list(out.shape), "contracting_dims": [list(lc), list(rc)],
            "batch_dims": [list(lb), list(rb)], "has_batch_dims": bool(lb or rb),
            "layers": n_layers, "flops": 2 * numel(out.shape) * contracted * n_layers,
            "out_bytes": nbytes(out) * n_layers,
            "policy_verdict": verdict(policy, eqn) if policy_entry.remat else "save",
            "saved": mem is not None, "offloaded": mem == "host",
            "offloaded_in_compiled": mem == "host" and host_in_compiled,
            "recomputed": seen[sig] <= recomputed[sig], "recomputed_in_compiled": None,
        })
        keys.append(jaxpr_product_key(e))
    name_verdicts(dots, fwd_dots, tagged_dots, policy if policy_entry.remat else save_all)
    # On a device mesh the compiled program is one device's: its products are shards of the jaxpr's,
    # so rows cannot be matched to products by size (``recomputed_in_compiled`` stays None).
    sharded = getattr(problem, "mesh", None) is not None
    if baseline is not None and not sharded:
        attribute(dots, keys, compiled["excess_by_key"])
    for row in dots:
        row["layer"] = named_layer(row["layer"], row.get("name"))  # a user block's by its tags
        row["note"] = dot_note(row, cfg, compiled, baseline is not None, sharded)

    totals = _totals(residuals, dots, compiled)
    notes = program_notes(cfg, dots, compiled, backend) + name_notes(cfg, residuals)
    if sharded and baseline is not None and any(d["recomputed"] for d in dots):
        notes.append(mesh_note(cfg, compiled))
    texts = {
        "forward_jaxpr": fwd_closed.pretty_print(name_stack=True),
        "vjp_jaxpr": vjp_closed.pretty_print(name_stack=True),
        "step_jaxpr": step_closed.pretty_print(name_stack=True),
        "compiled_hlo": compiled_text,
    }
    compiled = {k: v for k, v in compiled.items() if k != "excess_by_key"}
    return Dissection(residuals, dots, compiled, totals, notes, texts)


def _bytes_by_name(residuals: list[dict]) -> dict:
    by_name = defaultdict(int)
    for r in residuals:
        if r.get("name"):
            by_name[r["name"]] += r["bytes"]
    return dict(by_name)


def _totals(residuals: list[dict], dots: list[dict], compiled: dict) -> dict:
    by_kind, by_layer, by_role = defaultdict(int), defaultdict(int), defaultdict(int)
    for r in residuals:
        by_kind[r["kind"]] += r["bytes"]
        by_layer[r["layer"]] += r["bytes"]
        by_role[r["role"]] += r["bytes"]
    excess = compiled.get("excess_dots_vs_no_remat")
    return {
        "residual_bytes": sum(r["bytes"] for r in residuals),
        "activation_residual_bytes": by_role["activation"],
        "parameter_residual_bytes": by_role["parameter"],
        "input_residual_bytes": by_role["input"],
        "zero_cost_residual_bytes": by_role["constant"],
        "residual_device_bytes": sum(r["bytes"] for r in residuals if r["memory_kind"] == "device"),
        "residual_host_bytes": sum(r["bytes"] for r in residuals if r["memory_kind"] == "host"),
        "residual_host_bytes_in_compiled": sum(
            r["bytes"] for r in residuals if r["memory_kind_in_compiled"] == "host"),
        "residual_bytes_by_kind": dict(by_kind),
        "residual_bytes_by_layer": dict(by_layer),
        "residual_bytes_by_name": _bytes_by_name(residuals),
        # Counted per execution: a row of a scanned body counts once per layer.
        "dots": sum(d["layers"] for d in dots),
        "dots_saved": sum(d["layers"] for d in dots if d["saved"]),
        "dots_offloaded": sum(d["layers"] for d in dots if d["offloaded"]),
        "dots_offloaded_in_compiled": sum(d["layers"] for d in dots if d["offloaded_in_compiled"]),
        "dots_recomputed": sum(d["layers"] for d in dots if d["recomputed"]),
        # The differential truth: how many more products the compiled program has than no_remat's.
        "dots_recomputed_in_compiled": None if excess is None else max(excess, 0),
        "dots_recomputed_in_compiled_unattributed": sum(
            d["layers"] for d in dots if d["recomputed"] and d["recomputed_in_compiled"] is None),
        "recompute_flops": sum(d["flops"] for d in dots if d["recomputed"]),
        "recompute_flops_in_compiled": (None if excess is None
                                        else max(compiled["excess_product_flops_vs_no_remat"], 0)),
    }
