"""What the policy decided and what XLA did: residual and per-dot tables from jaxprs and HLO.

Forward values cannot show a policy's effect (the seed says so); these tables read it from the
programs themselves:

* the **vjp jaxpr** (``make_jaxpr(vjp)``, as ``jax.ad_checkpoint.saved_residuals`` does) holds the
  forward pass and lists the residuals it hands to the backward pass;
* the **step jaxpr** (``make_jaxpr(value_and_grad)``) holds the backward pass; JAX puts every
  equation it recomputes under the ``rematted_computation`` name scope;
* the **compiled HLO** keeps those name scopes in each instruction's ``op_name`` metadata, so it
  says whether the recomputation survived XLA's optimisations (CSE can merge it away).

Layers are attributed by the ``jax.named_scope`` the models put around each layer (``l1``,
``mix``, ``l2``, inside ``block{i}``); for arguments, by the parameter path.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import jax
import numpy as np
from jax._src import core as jcore  # jaxprs_in_params: walk nested jaxprs (pinned jax)
from jax._src import source_info_util
from jax._src.interpreters import partial_eval as pe

from .policies import get_policy
from .step import Problem, make_step

_LAYER = re.compile(r"\b(l1|l2|mix)\b")
_BLOCK = re.compile(r"\bblock(\d+)\b")
_PATH_LAYER = re.compile(r"(?:blocks\.(\d+)\.)?(l1|l2|mix)\b")
_PASS_THROUGH = {"reduce_precision", "device_put", "copy", "copy_p"}
_OP_NAME = re.compile(r'op_name="([^"]*)"')
# "%x = f32[64,256]{1,0} dot(...)" or, for a library call, "%x = (f32[64,256]{1,0}, s8[..]{0})
# custom-call(...), custom_call_target="__cublas$gemm"": the first array shape is the product's.
_HLO_MATMUL = re.compile(r"=\s*\(?(\w+)\[([\d,]*)\][^=]*?\s(dot|convolution|custom-call)\(")
_CALL_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_MATMUL_TARGETS = ("gemm", "matmul")  # __cublas$gemm, __cublas$lt$matmul, __onednn$matmul, ...


def layer_of(name_stack: str, depth: int) -> str:
    """``'jvp(block1)/l2'`` -> ``'1.l2'`` when depth > 1, ``'l2'`` when depth is 1."""
    layers = _LAYER.findall(name_stack)
    blocks = _BLOCK.findall(name_stack)
    layer = layers[-1] if layers else "other"
    if depth > 1 and blocks:
        return f"{blocks[-1]}.{layer}"
    return layer


def _layer_of_path(path: str, depth: int) -> str:
    m = _PATH_LAYER.match(path)
    if not m:
        return "input" if path == "x" else "other"
    block, layer = m.groups()
    return f"{block}.{layer}" if depth > 1 and block is not None else layer


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
    """The tables and program texts of one configuration (plain data, JSON-ready)."""

    residuals: list[dict]
    dots: list[dict]
    hlo_forward_dots: int
    hlo_recomputed_dots: int
    hlo_backward_dots: int
    totals: dict
    notes: list[str]
    texts: dict = field(repr=False)


def _residual_producers(jaxpr: jcore.Jaxpr, n_out: int):
    """For each residual outvar of the vjp jaxpr: (outvar, producing eqn or None, arg index)."""
    producer = {}
    for e in _walk_top(jaxpr):
        for v in e.eqn.outvars:
            producer[v] = e
    invar_index = {v: i for i, v in enumerate(jaxpr.invars)}
    found = []
    for v in jaxpr.outvars[n_out:]:
        if isinstance(v, jcore.Literal):
            found.append((v, None, None))
            continue
        src = v
        # Look through copies (reduce_precision, device_put to host) to the value they carry.
        while src in producer and producer[src].eqn.primitive.name in _PASS_THROUGH:
            src = producer[src].eqn.invars[0]
        if src in invar_index:
            found.append((v, None, invar_index[src]))
        else:
            found.append((v, _resolve_call(producer.get(src), src), None))
    return found


def _walk_top(jaxpr: jcore.Jaxpr):
    for eqn in jaxpr.eqns:
        yield _Eqn(eqn, str(eqn.source_info.name_stack))


def _resolve_call(e: _Eqn | None, var) -> _Eqn | None:
    """Descend through jit/remat call equations to the equation that computes ``var``."""
    while e is not None and e.eqn.primitive.name in ("jit", "pjit", "closed_call", "remat",
                                                     "checkpoint"):
        subs = list(jcore.jaxprs_in_params(e.eqn.params))
        if len(subs) != 1:
            break
        sub = subs[0]
        idx = e.eqn.outvars.index(var)
        inner = sub.outvars[idx]
        hit = None
        for s in sub.eqns:
            if inner in s.outvars:
                hit = _Eqn(s, "/".join(x for x in (e.stack, str(s.source_info.name_stack)) if x))
        if hit is None:
            break
        e, var = hit, inner
    return e


def _kind(e: _Eqn) -> str:
    """The primitive that produced a residual; for wrapped functions (relu), their name."""
    name = e.eqn.primitive.name
    if name in ("jit", "pjit"):
        return str(e.eqn.params.get("name", name))
    if name in ("custom_jvp_call", "custom_vjp_call"):
        inner = [s.params.get("name") for s in e.eqn.params["call_jaxpr"].jaxpr.eqns]
        return next((str(n) for n in inner if n), name)
    return name


def dissect(problem: Problem, compiled_text: str, *,
            step_jaxpr: jcore.ClosedJaxpr | None = None) -> Dissection:
    """Residuals, per-dot decisions and their fate in the compiled program for ``problem``.

    ``step_jaxpr``: the step's jaxpr when the caller has already traced it (``jit(...).trace``),
    so it is not traced a second time.
    """
    cfg = problem.config
    depth = cfg.depth
    policy_entry = get_policy(cfg.policy)
    policy = policy_entry.build() if policy_entry.remat else None
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

    # Forward dots, in program order, from the vjp jaxpr (the forward pass it runs).
    fwd_dots = [e for e in _walk(vjp_jaxpr) if e.eqn.primitive.name == "dot_general"]

    # Residuals.
    residuals, saved_by = [], {}
    for i, (var, prod, arg_idx) in enumerate(_residual_producers(vjp_jaxpr, 1)):
        aval = var.aval
        if arg_idx is not None:
            name = arg_names[arg_idx]
            kind, layer, source = "argument", _layer_of_path(name, depth), f"argument {name}"
        elif prod is None:
            kind, layer, source = "literal", "other", "a literal"
        else:
            kind = _kind(prod)
            layer = layer_of(prod.stack, depth)
            where = source_info_util.summarize(prod.eqn.source_info)
            source = f"{kind} in {layer} ({where.split('/')[-1]})"
            if prod.eqn.primitive.name == "dot_general":
                saved_by[id(prod.eqn)] = _memory_kind(aval)
        residuals.append({
            "index": i, "shape": list(aval.shape), "dtype": str(aval.dtype),
            "bytes": _nbytes(aval), "memory_kind": _memory_kind(aval), "kind": kind,
            "layer": layer, "source": source,
        })

    # Recomputed dots in the backward pass (under JAX's rematted_computation scope).
    recomputed = Counter(
        _dot_signature(e, depth) for e in _walk(step_closed.jaxpr)
        if e.eqn.primitive.name == "dot_general" and "rematted_computation" in e.stack)

    hlo = parse_hlo_dots(compiled_text, depth)
    # HLO dots are matched to jaxpr dots by layer and output size: XLA may fold batch axes into
    # one ((4, 8, 64) -> (32, 64)), which changes the shape but not the number of elements.
    hlo_recomputed = Counter((d["layer"], _numel(d["shape"])) for d in hlo if d["role"] == "recomputed")
    hlo_dot_keys = {(d["layer"], _numel(d["shape"])) for d in hlo if d["role"] != "backward"}
    # XLA may rewrite a product into other instructions (vector x matrix -> multiply + reduce);
    # then only the op_name metadata of what it became says where it came from.
    remat_opname_layers = {layer_of(m, depth) for m in _OP_NAME.findall(compiled_text)
                           if "rematted_computation" in m and m.endswith("/dot_general")}

    dots, seen, seen_hlo = [], Counter(), Counter()
    for i, e in enumerate(fwd_dots):
        eqn = e.eqn
        sig = _dot_signature(e, depth)
        seen[sig] += 1
        is_recomputed = seen[sig] <= recomputed[sig]
        (lc, rc), (lb, rb) = _dims(eqn)
        lhs, rhs = (v.aval for v in eqn.invars)
        out = eqn.outvars[0].aval
        contracted = int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64))
        flops = 2 * int(np.prod(out.shape, dtype=np.int64)) * contracted
        hkey = (sig[0], _numel(out.shape))
        in_compiled = False
        rewritten = hkey not in hlo_dot_keys
        if is_recomputed and rewritten:
            in_compiled = sig[0] in remat_opname_layers
        elif is_recomputed:
            seen_hlo[hkey] += 1
            in_compiled = seen_hlo[hkey] <= hlo_recomputed[hkey]
        mem = saved_by.get(id(eqn))
        row = {
            "index": i, "layer": sig[0], "lhs_shape": list(lhs.shape), "rhs_shape": list(rhs.shape),
            "out_shape": list(out.shape), "contracting_dims": [list(lc), list(rc)],
            "batch_dims": [list(lb), list(rb)], "has_batch_dims": bool(lb or rb),
            "flops": flops, "out_bytes": _nbytes(out),
            "policy_verdict": _verdict(policy, eqn) if policy_entry.remat else "save",
            "saved": mem is not None, "offloaded": mem == "host",
            "recomputed": is_recomputed, "recomputed_in_compiled": in_compiled,
        }
        row["note"] = _note(row, cfg)
        if rewritten:
            row["note"] = "; ".join(filter(None, [row["note"], (
                "XLA rewrote this product without a dot instruction (e.g. multiply + reduce); "
                "the compiled verdict comes from op_name metadata")]))
        dots.append(row)

    n_fwd = sum(d["role"] == "forward" for d in hlo)
    n_rec = sum(d["role"] == "recomputed" for d in hlo)
    n_bwd = sum(d["role"] == "backward" for d in hlo)
    totals = _totals(residuals, dots)
    notes = _notes(cfg, dots, n_fwd, n_rec)
    texts = {
        "forward_jaxpr": fwd_closed.pretty_print(name_stack=True),
        "vjp_jaxpr": vjp_closed.pretty_print(name_stack=True),
        "step_jaxpr": step_closed.pretty_print(name_stack=True),
        "compiled_hlo": compiled_text,
    }
    return Dissection(residuals, dots, n_fwd, n_rec, n_bwd, totals, notes, texts)


def parse_hlo_dots(text: str, depth: int) -> list[dict]:
    """Every matrix product of compiled HLO text: dtype, shape, op_name, layer and role.

    A product is a ``dot`` (CPU, and inside GPU Triton fusions), a ``convolution`` or a library
    ``custom-call`` whose target is a GEMM (cuBLAS on GPU), carrying a ``dot_general`` op_name.
    role: ``recomputed`` (under ``rematted_computation``), ``backward`` (under ``transpose(``, the
    gradient products) or ``forward``.
    """
    rows = []
    for line in text.splitlines():
        m = _HLO_MATMUL.search(line)
        name = _OP_NAME.search(line)
        if not m or not name:
            continue
        dtype, shape, opcode = m.groups()
        op_name = name.group(1)
        if opcode == "custom-call":
            target = _CALL_TARGET.search(line)
            if not target or not any(t in target.group(1).lower() for t in _MATMUL_TARGETS):
                continue
        elif opcode == "convolution" and not op_name.endswith(("dot_general", "transpose")):
            continue
        role = ("recomputed" if "rematted_computation" in op_name
                else "backward" if "transpose(" in op_name else "forward")
        rows.append({"dtype": dtype, "shape": [int(s) for s in shape.split(",") if s],
                     "op_name": op_name, "layer": layer_of(op_name, depth), "role": role})
    return rows


def _note(row: dict, cfg) -> str:
    verdict = row["policy_verdict"]
    if not get_policy(cfg.policy).remat:
        return ("no remat: autodiff keeps what the backward needs (here values derived from this "
                "dot), nothing is recomputed") if not row["saved"] else ""
    if row["recomputed"] and not row["recomputed_in_compiled"]:
        return ("the backward jaxpr recomputes this dot, but the compiled program has no "
                "recomputed copy: XLA reuses the forward dot's result (e.g. by CSE)")
    if verdict in ("save", "offload") and not row["saved"] and not row["recomputed"]:
        return ("saveable, but not stored: the backward needs only values derived from it, "
                "which are kept instead")
    if verdict in ("save", "offload") and row["recomputed"]:
        return "saveable, yet recomputed: JAX chose to recompute it"
    if verdict == "recompute" and not row["recomputed"] and not row["saved"]:
        return "not needed by the backward pass: neither stored nor recomputed"
    return ""


def _totals(residuals: list[dict], dots: list[dict]) -> dict:
    by_kind, by_layer = defaultdict(int), defaultdict(int)
    for r in residuals:
        by_kind[r["kind"]] += r["bytes"]
        by_layer[r["layer"]] += r["bytes"]
    return {
        "residual_bytes": sum(r["bytes"] for r in residuals),
        "residual_device_bytes": sum(r["bytes"] for r in residuals if r["memory_kind"] == "device"),
        "residual_host_bytes": sum(r["bytes"] for r in residuals if r["memory_kind"] == "host"),
        "residual_bytes_by_kind": dict(by_kind),
        "residual_bytes_by_layer": dict(by_layer),
        "dots": len(dots),
        "dots_saved": sum(d["saved"] for d in dots),
        "dots_offloaded": sum(d["offloaded"] for d in dots),
        "dots_recomputed": sum(d["recomputed"] for d in dots),
        "dots_recomputed_in_compiled": sum(d["recomputed_in_compiled"] for d in dots),
        "recompute_flops": sum(d["flops"] for d in dots if d["recomputed"]),
        "recompute_flops_in_compiled": sum(d["flops"] for d in dots if d["recomputed_in_compiled"]),
    }


def _notes(cfg, dots: list[dict], n_fwd: int, n_rec: int) -> list[str]:
    notes = []
    jaxpr_rec = sum(d["recomputed"] for d in dots)
    compiled_rec = sum(d["recomputed_in_compiled"] for d in dots)
    if jaxpr_rec and compiled_rec < jaxpr_rec:
        notes.append(f"The backward jaxpr recomputes {jaxpr_rec} dot(s); the compiled program "
                     f"keeps {compiled_rec} of those recomputations: for the rest XLA reuses the "
                     "forward dots' results (common-subexpression elimination), so at this size "
                     "that part of the policy's recomputation does not happen.")
    if cfg.objective == "grad" and n_fwd == 0:
        notes.append("Objective grad: the loss value is not returned, so the forward pass is "
                     "dead code apart from what the backward needs; XLA removed the forward dots.")
    if cfg.objective == "grad" and cfg.depth == 1:
        notes.append("Objective grad at depth 1: whatever the policy saves, XLA can compute the "
                     "needed values once inside the backward pass, so policies tend to compile "
                     "to the same program.")
    return notes
