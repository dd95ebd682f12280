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
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import jax
import numpy as np
from jax._src import core as jcore  # jaxprs_in_params: walk nested jaxprs (pinned jax)
from jax._src import source_info_util
from jax._src.interpreters import partial_eval as pe

from remat_lab.analysis import hlo
from remat_lab.analysis.layers import layer_of, layer_of_path
from remat_lab.model.models import names_of
from remat_lab.model.policies import build_policy, get_policy, policy_names
from remat_lab.program.step import Problem, make_step

_PASS_THROUGH = {"reduce_precision", "device_put", "copy", "copy_p"}
# Values that cost no memory: built from literals alone (a broadcast zero, an iota).
_CONSTANT_BUILDERS = {"broadcast_in_dim", "convert_element_type", "reshape", "iota", "squeeze",
                      "expand_dims"}


@dataclass
class _Eqn:
    eqn: jcore.JaxprEqn
    stack: str  # name stack accumulated through enclosing equations


def _walk(jaxpr: jcore.Jaxpr, stack: str = ""):
    """Every equation in ``jaxpr`` and its sub-jaxprs, with accumulated name stacks."""
    for eqn in jaxpr.eqns:
        own = str(eqn.source_info.name_stack)
        full = "/".join(s for s in (stack, own) if s)
        yield _Eqn(eqn, full)
        for sub in jcore.jaxprs_in_params(eqn.params):
            yield from _walk(sub, full)


def _dims(eqn) -> tuple[tuple, tuple]:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    return (tuple(lc), tuple(rc)), (tuple(lb), tuple(rb))


def _dot_signature(e: _Eqn, depth: int) -> tuple:
    return (layer_of(e.stack, depth), tuple(v.aval.shape for v in e.eqn.invars),
            _dims(e.eqn))


def _verdict(policy, eqn) -> str:
    if policy is None:
        return "recompute"
    out = policy(eqn.primitive, *[v.aval for v in eqn.invars], **eqn.params)
    if isinstance(out, pe.Offloadable):
        return "offload"
    if out is pe.Recompute:
        return "recompute"
    return "save" if (out is pe.Saveable or bool(out)) else "recompute"


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _nbytes(aval) -> int:
    return int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize


def _memory_kind(aval) -> str:
    space = str(getattr(aval, "memory_space", "device")).lower()
    return "host" if "host" in space else "device"


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


def _residual_producers(jaxpr: jcore.Jaxpr, n_out: int):
    """For each residual outvar of the vjp jaxpr: (outvar, producing eqn or None, forwarded (a
    scanned layer's input), arg index)."""
    producer = {}
    for e in _walk_top(jaxpr):
        for v in e.eqn.outvars:
            producer[v] = e
    invar_index = {v: i for i, v in enumerate(jaxpr.invars)}
    found = []
    for v in jaxpr.outvars[n_out:]:
        if isinstance(v, jcore.Literal):
            found.append((v, None, False, None))
            continue
        src = v
        # Look through copies (reduce_precision, device_put to host) to the value they carry.
        while src in producer and producer[src].eqn.primitive.name in _PASS_THROUGH:
            src = producer[src].eqn.invars[0]
        if src in invar_index:
            found.append((v, None, False, invar_index[src]))
        else:
            found.append((v, *_resolve_call(producer.get(src), src), None))
    return found


def _walk_top(jaxpr: jcore.Jaxpr):
    for eqn in jaxpr.eqns:
        yield _Eqn(eqn, str(eqn.source_info.name_stack))


_CALLS = ("jit", "pjit", "closed_call", "remat", "remat2", "checkpoint", "scan")


def _resolve_call(e: _Eqn | None, var) -> tuple[_Eqn | None, bool]:
    """Descend through jit/remat/scan equations to the equation that computes ``var``.

    Returns ``(equation, forwarded)``: ``forwarded`` is True when the value is an input of the
    innermost body passed straight through, e.g. each scanned layer's input stacked by ``scan``.
    A scan's outputs are its body's outputs in the same order (carry, then the stacked ys).
    """
    while e is not None and e.eqn.primitive.name in _CALLS:
        subs = list(jcore.jaxprs_in_params(e.eqn.params))
        if len(subs) != 1:
            break
        sub = subs[0]
        inner = sub.outvars[e.eqn.outvars.index(var)]
        producer = {v: s for s in sub.eqns for v in s.outvars}
        while inner in producer and producer[inner].primitive.name in _PASS_THROUGH:
            inner = producer[inner].invars[0]
        if inner in sub.invars:
            return e, True
        s = producer.get(inner)
        if s is None:
            break
        e, var = _Eqn(s, "/".join(x for x in (e.stack, str(s.source_info.name_stack)) if x)), inner
    return e, False


def _kind(e: _Eqn) -> str:
    """The primitive that produced a residual; for wrapped functions (relu), their name."""
    name = e.eqn.primitive.name
    if name in ("jit", "pjit"):
        return str(e.eqn.params.get("name", name))
    if name in ("custom_jvp_call", "custom_vjp_call"):
        inner = [s.params.get("name") for s in e.eqn.params["call_jaxpr"].jaxpr.eqns]
        return next((str(n) for n in inner if n), name)
    return name


def _is_constant(e: _Eqn | None) -> bool:
    """True for a value built from literals alone (``broadcast_in_dim 0.0``): XLA folds it, no memory."""
    return (e is not None and e.eqn.primitive.name in _CONSTANT_BUILDERS
            and all(isinstance(v, jcore.Literal) for v in e.eqn.invars))


def _product_key(e: _Eqn) -> tuple:
    """``hlo.product_key`` of a jaxpr ``dot_general``: result elements, contracted and batch sizes."""
    (lc, _), (lb, _) = _dims(e.eqn)
    lhs = e.eqn.invars[0].aval
    return hlo.product_key(_numel(e.eqn.outvars[0].aval.shape),
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


def _attribute(rows: list[dict], keys: list[tuple], excess_by_key: dict) -> None:
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
    host_in_compiled = compiled["host_memory"]
    # Under a scan stack one body stands for every layer: its rows count ``depth`` times.
    scanned = depth > 1 and getattr(cfg, "stack", "loop") == "scan"

    def layers_of(stack: str) -> int:
        return depth if scanned and "layers" in stack.split("/") else 1

    # Forward dots, in program order, from the vjp jaxpr (the forward pass it runs).
    fwd_dots = [e for e in _walk(vjp_jaxpr) if e.eqn.primitive.name == "dot_general"]
    tags, tagged_dots = _name_tags(vjp_jaxpr)

    # Residuals.
    residuals, saved_by = [], {}
    for i, (var, prod, forwarded, arg_idx) in enumerate(_residual_producers(vjp_jaxpr, 1)):
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
            kind = _kind(prod)
            layer = layer_of(prod.stack, depth)
            where = source_info_util.summarize(prod.eqn.source_info)
            source = f"{kind} in {layer} ({where.split('/')[-1]})"
            role = "constant" if _is_constant(prod) else "activation"
            # Stacked by the scan: one more axis than the value the body computes. (A loop
            # invariant hoisted out of the scan keeps the body's shape and counts once.)
            stacked = len(aval.shape) == len(prod.eqn.outvars[0].aval.shape) + 1
            n_layers = layers_of(prod.stack) if stacked else 1
            if n_layers > 1:
                source += f", all {n_layers} layers (stacked by scan)"
            if prod.eqn.primitive.name == "dot_general":
                saved_by[id(prod.eqn)] = _memory_kind(aval)
        mem_kind = _memory_kind(aval)
        tag = tags.get(prod.eqn.outvars[0]) if prod is not None and not forwarded else None
        if tag is not None and id(tag.eqn) in tagged_dots:  # the named value is that dot's output
            saved_by[id(tagged_dots[id(tag.eqn)][1].eqn)] = mem_kind
        residuals.append({
            "index": i, "shape": list(aval.shape), "dtype": str(aval.dtype),
            "bytes": _nbytes(aval), "memory_kind": mem_kind,
            "memory_kind_in_compiled": mem_kind if host_in_compiled else "device",
            "role": role, "kind": kind, "layer": layer, "layers": n_layers, "source": source,
            "name": tag.eqn.params["name"] if tag is not None else None,
        })

    # Recomputed dots in the backward pass (under JAX's rematted_computation scope).
    recomputed = Counter(
        _dot_signature(e, depth) for e in _walk(step_closed.jaxpr)
        if e.eqn.primitive.name == "dot_general" and "rematted_computation" in e.stack)

    dots, keys, seen = [], [], Counter()
    for i, e in enumerate(fwd_dots):
        eqn = e.eqn
        sig = _dot_signature(e, depth)
        seen[sig] += 1
        (lc, rc), (lb, rb) = _dims(eqn)
        lhs, rhs = (v.aval for v in eqn.invars)
        out = eqn.outvars[0].aval
        contracted = int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64))
        mem = saved_by.get(id(eqn))
        n_layers = layers_of(e.stack)
        dots.append({
            "index": i, "layer": sig[0], "lhs_shape": list(lhs.shape), "rhs_shape": list(rhs.shape),
            "out_shape": list(out.shape), "contracting_dims": [list(lc), list(rc)],
            "batch_dims": [list(lb), list(rb)], "has_batch_dims": bool(lb or rb),
            "layers": n_layers, "flops": 2 * _numel(out.shape) * contracted * n_layers,
            "out_bytes": _nbytes(out) * n_layers,
            "policy_verdict": _verdict(policy, eqn) if policy_entry.remat else "save",
            "saved": mem is not None, "offloaded": mem == "host",
            "offloaded_in_compiled": mem == "host" and host_in_compiled,
            "recomputed": seen[sig] <= recomputed[sig], "recomputed_in_compiled": None,
        })
        keys.append(_product_key(e))
    _name_verdicts(dots, fwd_dots, tagged_dots, policy if policy_entry.remat else _SAVE_ALL)
    # On a device mesh the compiled program is one device's: its products are shards of the jaxpr's,
    # so rows cannot be matched to products by size (``recomputed_in_compiled`` stays None).
    sharded = getattr(problem, "mesh", None) is not None
    if baseline is not None and not sharded:
        _attribute(dots, keys, compiled["excess_by_key"])
    for row in dots:
        row["note"] = _note(row, cfg, compiled, baseline is not None, sharded)

    totals = _totals(residuals, dots, compiled)
    notes = _notes(cfg, dots, compiled, backend) + _name_notes(cfg, residuals)
    if sharded and baseline is not None and any(d["recomputed"] for d in dots):
        excess = compiled.get("excess_dots_vs_no_remat")
        notes.append(f"On the device mesh ({cfg.mesh}) the compiled program is one device's, its "
                     "products shards of the jaxpr's: which dots it recomputes cannot be told by "
                     f"size. In all it runs {excess} product(s) more than no_remat on the same mesh.")
    texts = {
        "forward_jaxpr": fwd_closed.pretty_print(name_stack=True),
        "vjp_jaxpr": vjp_closed.pretty_print(name_stack=True),
        "step_jaxpr": step_closed.pretty_print(name_stack=True),
        "compiled_hlo": compiled_text,
    }
    compiled = {k: v for k, v in compiled.items() if k != "excess_by_key"}
    return Dissection(residuals, dots, compiled, totals, notes, texts)


def _note(row: dict, cfg, compiled: dict, compared: bool, sharded: bool = False) -> str:
    verdict = row["policy_verdict"]
    if not get_policy(cfg.policy).remat:
        return ("no remat: autodiff keeps what the backward needs (here values derived from this "
                "dot), nothing is recomputed") if not row["saved"] else ""
    parts = []
    if row["recomputed"] and compared and sharded:
        parts.append("recomputed in the jaxpr; on a device mesh the compiled program's products are "
                     "per-device shards, so this dot cannot be matched to one by size (see the "
                     "program's total vs no_remat)")
    elif row["recomputed"] and compared and row["recomputed_in_compiled"] is False:
        parts.append("the backward jaxpr recomputes this dot, but the compiled program has no more "
                     "products of its size than no_remat's: XLA computes it once")
    elif row["recomputed"] and row["recomputed_in_compiled"] is None and compared:
        parts.append("recomputed in the jaxpr; the compiled program keeps some recomputations of "
                     "products of this size but not all, and which ones cannot be told apart")
    if verdict in ("save", "offload") and not row["saved"] and not row["recomputed"]:
        parts.append("saveable, but not stored: the backward needs only values derived from it, "
                     "which are kept instead")
    if verdict in ("save", "offload") and row["recomputed"]:
        parts.append("saveable, yet recomputed: JAX chose to recompute it")
    if verdict == "recompute" and not row["recomputed"] and not row["saved"]:
        parts.append("not needed by the backward pass: neither stored nor recomputed")
    if row["offloaded"] and not row["offloaded_in_compiled"]:
        parts.append("offloaded in the jaxpr only: the compiled program has no host memory space, "
                     "so the value stays in device memory")
    return "; ".join(parts)


# --- checkpoint names --------------------------------------------------------------------------

# What may sit between a dot and the name that tags it: a bias add, a transpose or reshape of an
# einsum's result, a dtype conversion, a copy.
_TAG_THROUGH = {"add", "transpose", "reshape", "convert_element_type", *_PASS_THROUGH}


def _SAVE_ALL(*_, **__) -> bool:
    """no_remat's verdict: autodiff may keep anything."""
    return True


def _name_tags(jaxpr: jcore.Jaxpr) -> tuple[dict, dict]:
    """The ``checkpoint_name`` equations (primitive ``name``) of ``jaxpr`` and its sub-jaxprs.

    Returns ``(tags, tagged_dots)``: ``tags`` maps each named value (the name equation's input and
    output, and the source of a copy it names) to its name equation; ``tagged_dots`` maps
    ``id(name equation)`` to ``(name equation, the dot_general whose output it names)`` (looking
    through ``_TAG_THROUGH`` and calls such as einsum's jit).
    """
    entries = list(_walk(jaxpr))
    producer = {v: e for e in entries for v in e.eqn.outvars}
    tags, tagged_dots = {}, {}
    for e in entries:
        if e.eqn.primitive.name != "name":
            continue
        tags[e.eqn.outvars[0]] = e
        v = e.eqn.invars[0]  # the named value, and through copies (reduce_precision) its source
        while not isinstance(v, jcore.Literal):
            tags[v] = e
            if v not in producer or producer[v].eqn.primitive.name not in _PASS_THROUGH:
                break
            v = producer[v].eqn.invars[0]
        dot = _dot_behind(e.eqn.invars[0], producer)
        if dot is not None:
            tagged_dots[id(e.eqn)] = (e, dot)
    return tags, tagged_dots


def _dot_behind(var, producer: dict, hops: int = 6) -> _Eqn | None:
    """The ``dot_general`` that computes ``var``, through a few ``_TAG_THROUGH`` steps and calls."""
    if hops == 0 or isinstance(var, jcore.Literal) or var not in producer:
        return None
    e = producer[var]
    prim = e.eqn.primitive.name
    if prim == "dot_general":
        return e
    if prim in ("jit", "pjit", "closed_call"):
        subs = list(jcore.jaxprs_in_params(e.eqn.params))
        inner = subs[0].outvars[e.eqn.outvars.index(var)] if len(subs) == 1 else None
        return None if inner is None else _dot_behind(inner, producer, hops - 1)
    if prim in _TAG_THROUGH:
        for v in e.eqn.invars:
            found = _dot_behind(v, producer, hops - 1)
            if found is not None:
                return found
    return None


def _name_verdicts(dots: list[dict], fwd_dots: list[_Eqn], tagged_dots: dict, policy) -> None:
    """Set ``name`` and ``name_verdict`` on each dot row: the name tagging its output and what the
    policy says about that name equation (name policies decide there, not on the dot). A dot the
    name policy saves or offloads gets that as its ``policy_verdict``."""
    tag_of = {id(dot.eqn): tag for tag, dot in tagged_dots.values()}
    for row, e in zip(dots, fwd_dots):
        tag = tag_of.get(id(e.eqn))
        row["name"] = tag.eqn.params["name"] if tag is not None else None
        row["name_verdict"] = _verdict(policy, tag.eqn) if tag is not None else None
        if row["name_verdict"] not in (None, "recompute") and row["policy_verdict"] == "recompute":
            row["policy_verdict"] = row["name_verdict"]


def _bytes_by_name(residuals: list[dict]) -> dict:
    by_name = defaultdict(int)
    for r in residuals:
        if r.get("name"):
            by_name[r["name"]] += r["bytes"]
    return dict(by_name)


def _name_notes(cfg, residuals: list[dict]) -> list[str]:
    """Notes on a name policy's names: those this model does not have, and those it has that the
    backward pass never needs (so nothing is saved for them)."""
    saved, offloaded = policy_names(cfg)
    named = list(dict.fromkeys((*saved, *offloaded)))
    model_names = names_of(cfg.model)
    present = [n for n in model_names if n in named]
    notes = []
    missing = [n for n in named if n not in model_names]
    if missing:
        notes.append(f"{cfg.policy} names {', '.join(missing)}, which the {cfg.model} model does not "
                     f"have (its names: {', '.join(model_names)}); "
                     + (f"only {', '.join(present)} apply." if present else
                        "none of its names apply, so it saves nothing inside the block, like full."))
    kept = {r["name"] for r in residuals if r.get("name")}
    unused = [n for n in present if n not in kept]
    if unused:
        notes.append(f"{', '.join(unused)}: saveable by {cfg.policy}, but no residual carries it: "
                     "the backward pass does not need the value itself (a block's last projection "
                     "only feeds the residual sum, whose gradient does not depend on it).")
    return notes


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


_BARRIER_CPU = (
    "Why: XLA CPU removes JAX's remat optimization barrier early (before fusion and scheduling), "
    "so common-subexpression elimination merges a recomputation with the forward product it "
    "repeats. In a stack of remat'd blocks written as a Python loop it keeps at most the last "
    "block's; even where it keeps one, the scheduler places it next to its forward twin, so the "
    "peak memory barely moves. Stacks scanned over layers (stack scan, how production code is "
    "written) are where the policy's effect on memory shows.")
_BARRIER_CPU_SCAN = (
    "Why: XLA CPU removes JAX's remat optimization barrier early, so common-subexpression "
    "elimination merges a recomputation with a forward product it repeats wherever both sit in the "
    "same computation; across the scan's forward and backward loops it cannot.")


def _notes(cfg, dots: list[dict], compiled: dict, backend: str) -> list[str]:
    notes = []
    jaxpr_rec = sum(d["layers"] for d in dots if d["recomputed"])
    excess = compiled.get("excess_dots_vs_no_remat")
    scanned = any(d["layers"] > 1 for d in dots)
    if compiled.get("identical_to"):
        notes.append(f"The compiled program is the same as {compiled['identical_to']}'s (same "
                     "instructions up to names and metadata): whatever the jaxpr says, this policy "
                     "changes nothing once compiled.")
    if jaxpr_rec and excess is not None and excess < jaxpr_rec:
        unattributed = sum(d["layers"] for d in dots
                           if d["recomputed"] and d["recomputed_in_compiled"] is None)
        said = (f"The backward jaxpr recomputes {jaxpr_rec} product(s) per step; the compiled program runs "
                f"{max(excess, 0)} more product(s) than no_remat's, so "
                f"{jaxpr_rec - max(excess, 0)} recomputation(s) do not happen.")
        if unattributed:
            said += (f" {max(excess, 0)} product(s) are recomputed, not attributable to rows: "
                     f"{unattributed} candidates have the same size.")
        if cfg.objective == "grad":
            said += (" With objective grad the loss is not returned: the forward products are "
                     "dead code and the backward's recomputed copies are the only ones left.")
        elif backend == "cpu":
            said += " " + (_BARRIER_CPU_SCAN if scanned else _BARRIER_CPU)
        notes.append(said)
    if any(d["offloaded"] for d in dots) and not compiled.get("host_memory"):
        notes.append(f"Offload is a no-op on this backend ({backend}): the jaxpr moves the saved "
                     "products to pinned host memory, but the compiled program has no host memory "
                     "space and no host transfers, so they stay in device memory. Any memory "
                     "difference from the device-saving twin (dots_with_no_batch_dims_saveable) "
                     "is not offload.")
    if compiled.get("bf16_upcast"):
        notes.append("bfloat16 on XLA CPU: every product is computed in float32 (XLA converts the "
                     "bf16 operands around each dot), so time and temp memory are not those of a "
                     "bf16 accelerator.")
    return notes
