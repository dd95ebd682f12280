"""Reading jaxprs: equations with their name stacks, where each residual comes from, which dot a name tags.

The walkers behind the dissection's tables (``dissect``): every equation of a jaxpr and its
sub-jaxprs with the name stack accumulated through the calls around it; the equation behind each
residual a vjp jaxpr hands to the backward pass (through copies, jit, remat and scan bodies); the
``checkpoint_name`` equations and the ``dot_general`` each one names; a policy's verdict on an
equation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from jax._src import core as jcore  # jaxprs_in_params: walk nested jaxprs (pinned jax)
from jax._src.interpreters import partial_eval as pe

from remat_lab.analysis.layers import layer_of

# Copies that carry a value unchanged (to host, at a lower precision): looked through.
PASS_THROUGH = {"reduce_precision", "device_put", "copy", "copy_p"}
# Values that cost no memory: built from literals alone (a broadcast zero, an iota).
_CONSTANT_BUILDERS = {"broadcast_in_dim", "convert_element_type", "reshape", "iota", "squeeze",
                      "expand_dims"}
_CALLS = ("jit", "pjit", "closed_call", "remat", "remat2", "checkpoint", "scan")
# What may sit between a dot and the name that tags it: a bias add, a transpose or reshape of an
# einsum's result, a dtype conversion, a copy.
_TAG_THROUGH = {"add", "transpose", "reshape", "convert_element_type", *PASS_THROUGH}


@dataclass
class Eqn:
    """A jaxpr equation and the name stack accumulated through its enclosing equations."""

    eqn: jcore.JaxprEqn
    stack: str


def walk(jaxpr: jcore.Jaxpr, stack: str = ""):
    """Every equation in ``jaxpr`` and its sub-jaxprs, with accumulated name stacks."""
    for eqn in jaxpr.eqns:
        own = str(eqn.source_info.name_stack)
        full = "/".join(s for s in (stack, own) if s)
        yield Eqn(eqn, full)
        for sub in jcore.jaxprs_in_params(eqn.params):
            yield from walk(sub, full)


def dot_dims(eqn) -> tuple[tuple, tuple]:
    """A ``dot_general``'s ``((lhs, rhs) contracting, (lhs, rhs) batch)`` dimensions, as tuples."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    return (tuple(lc), tuple(rc)), (tuple(lb), tuple(rb))


def dot_signature(e: Eqn, depth: int) -> tuple:
    """What matches a forward dot with its recomputation: layer, operand shapes, dimensions."""
    return (layer_of(e.stack, depth), tuple(v.aval.shape for v in e.eqn.invars), dot_dims(e.eqn))


def verdict(policy, eqn) -> str:
    """``save``, ``offload`` or ``recompute``: what ``policy`` says about ``eqn`` (None: recompute)."""
    if policy is None:
        return "recompute"
    out = policy(eqn.primitive, *[v.aval for v in eqn.invars], **eqn.params)
    if isinstance(out, pe.Offloadable):
        return "offload"
    if out is pe.Recompute:
        return "recompute"
    return "save" if (out is pe.Saveable or bool(out)) else "recompute"


def save_all(*_, **__) -> bool:
    """no_remat's verdict: autodiff may keep anything."""
    return True


def numel(shape) -> int:
    """Elements of an array of ``shape``."""
    return int(np.prod(shape, dtype=np.int64))


def nbytes(aval) -> int:
    """Bytes of an abstract value."""
    return numel(aval.shape) * np.dtype(aval.dtype).itemsize


def memory_kind(aval) -> str:
    """``host`` for a value in pinned host memory (offloaded), else ``device``."""
    space = str(getattr(aval, "memory_space", "device")).lower()
    return "host" if "host" in space else "device"


# --- residuals ----------------------------------------------------------------------------------

def residual_producers(jaxpr: jcore.Jaxpr, n_out: int):
    """For each residual outvar of the vjp jaxpr: (outvar, producing eqn or None, forwarded (a
    scanned layer's input), arg index)."""
    producer = {}
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            producer[v] = Eqn(eqn, str(eqn.source_info.name_stack))
    invar_index = {v: i for i, v in enumerate(jaxpr.invars)}
    found = []
    for v in jaxpr.outvars[n_out:]:
        if isinstance(v, jcore.Literal):
            found.append((v, None, False, None))
            continue
        src = v
        # Look through copies (reduce_precision, device_put to host) to the value they carry.
        while src in producer and producer[src].eqn.primitive.name in PASS_THROUGH:
            src = producer[src].eqn.invars[0]
        if src in invar_index:
            found.append((v, None, False, invar_index[src]))
        else:
            found.append((v, *_resolve_call(producer.get(src), src), None))
    return found


def _resolve_call(e: Eqn | None, var) -> tuple[Eqn | None, bool]:
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
        while inner in producer and producer[inner].primitive.name in PASS_THROUGH:
            inner = producer[inner].invars[0]
        if inner in sub.invars:
            return e, True
        s = producer.get(inner)
        if s is None:
            break
        e, var = Eqn(s, "/".join(x for x in (e.stack, str(s.source_info.name_stack)) if x)), inner
    return e, False


def producer_kind(e: Eqn) -> str:
    """The primitive that produced a residual; for wrapped functions (relu), their name."""
    name = e.eqn.primitive.name
    if name in ("jit", "pjit"):
        return str(e.eqn.params.get("name", name))
    if name in ("custom_jvp_call", "custom_vjp_call"):
        inner = [s.params.get("name") for s in e.eqn.params["call_jaxpr"].jaxpr.eqns]
        return next((str(n) for n in inner if n), name)
    return name


def is_constant(e: Eqn | None) -> bool:
    """True for a value built from literals alone (``broadcast_in_dim 0.0``): XLA folds it, no memory."""
    return (e is not None and e.eqn.primitive.name in _CONSTANT_BUILDERS
            and all(isinstance(v, jcore.Literal) for v in e.eqn.invars))


# --- checkpoint names ---------------------------------------------------------------------------

def name_tags(jaxpr: jcore.Jaxpr) -> tuple[dict, dict]:
    """The ``checkpoint_name`` equations (primitive ``name``) of ``jaxpr`` and its sub-jaxprs.

    Returns ``(tags, tagged_dots)``: ``tags`` maps each named value (the name equation's input and
    output, and the source of a copy it names) to its name equation; ``tagged_dots`` maps
    ``id(name equation)`` to ``(name equation, the dot_general whose output it names)`` (looking
    through ``_TAG_THROUGH`` and calls such as einsum's jit).
    """
    entries = list(walk(jaxpr))
    producer = {v: e for e in entries for v in e.eqn.outvars}
    tags, tagged_dots = {}, {}
    for e in entries:
        if e.eqn.primitive.name != "name":
            continue
        tags[e.eqn.outvars[0]] = e
        v = e.eqn.invars[0]  # the named value, and through copies (reduce_precision) its source
        while not isinstance(v, jcore.Literal):
            tags[v] = e
            if v not in producer or producer[v].eqn.primitive.name not in PASS_THROUGH:
                break
            v = producer[v].eqn.invars[0]
        dot = _dot_behind(e.eqn.invars[0], producer)
        if dot is not None:
            tagged_dots[id(e.eqn)] = (e, dot)
    return tags, tagged_dots


def _dot_behind(var, producer: dict, hops: int = 6) -> Eqn | None:
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


def name_verdicts(dots: list[dict], fwd_dots: list[Eqn], tagged_dots: dict, policy) -> None:
    """Set ``name`` and ``name_verdict`` on each dot row: the name tagging its output and what the
    policy says about that name equation (name policies decide there, not on the dot). A dot the
    name policy saves or offloads gets that as its ``policy_verdict``."""
    tag_of = {id(dot.eqn): tag for tag, dot in tagged_dots.values()}
    for row, e in zip(dots, fwd_dots):
        tag = tag_of.get(id(e.eqn))
        row["name"] = tag.eqn.params["name"] if tag is not None else None
        row["name_verdict"] = verdict(policy, tag.eqn) if tag is not None else None
        if row["name_verdict"] not in (None, "recompute") and row["policy_verdict"] == "recompute":
            row["policy_verdict"] = row["name_verdict"]
