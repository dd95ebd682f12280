"""Memory by kind read from XLA's buffer assignment: what the buffers live at the peak hold.

For a compiled step (the gradient step or the whole training step), from its dump
(``timeline.Dump``: the buffer assignment, the live ranges and the optimized HLO):

* **parameters**, **optimizer_state**: the entry parameters' allocations, each whole (arguments
  are allocated for the whole program), by the argument the entry parameter is: JAX names it
  ``leaves[i]`` (a model parameter; with mixed precision the float32 master weights) or
  ``opt_state...`` (AdamW's ``mu``, ``nu`` and its step ``count``). Any other argument (the input
  ``x``) is ``other``.
* at the **peak**, the instruction of XLA's schedule where the other buffers (temporaries and
  outputs) hold the most bytes, each buffer slice by the value live in it
  (``timeline_names.live_value``): **gradients** (``gradient_values``: what the optimizer reads,
  or the gradient step's outputs, the accumulators it comes out of, the pieces written into them),
  **logits** (values named ``logits``), **activations** (other values with a source: a layer or a
  checkpoint name, ``timeline_names.label``).
* **other** is ``peak_bytes`` less the five: the input, values with no source (a layer's weights
  sliced out of a scan's stack, scalars, the optimizer's temporaries), constants, the gaps XLA's
  packing of the temporary memory leaves, generated code. ``other_parts`` names them, summing to
  it: each input argument by its name, a layer's parameters sliced out of the scan's stack (a
  value of a stacked parameter's shape less its layer axis), every other value live at the peak by
  its producer (the instruction's name without its number and the JAX operation, ``producer``),
  the generated code, and what no value holds at the peak (``GAPS``).

On a TPU only HBM's allocations count (those without a ``color``: colour 1 is the on-chip VMEM).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from remat_lab.analysis.gradient_values import Program, gradient_values
from remat_lab.analysis.timeline import compile_dumped, uncached
from remat_lab.analysis.timeline_names import Sources, label, live_value
from remat_lab.analysis.timeline_parse import _read_slices
from remat_lab.analysis.witness import Witness

METHOD = ("from XLA's buffer assignment: parameters and optimizer_state: the allocations of the "
          "entry parameters JAX names leaves[i] and opt_state (mu, nu, count); at the peak of the "
          "other buffers (the instruction where temporaries and outputs hold the most), each slice "
          "by the value live in it: gradients: what the optimizer's update reads (the gradient "
          "step: its outputs), the accumulators it comes out of and what is written into them; "
          "logits: values named logits; activations: other values with a source (a layer or a "
          "checkpoint name); other: the rest of peak_bytes (the input, values with no source, "
          "constants, the temporary memory's packing gaps, generated code), named part by part "
          "in memory.by_kind_other")
SOURCE = "buffers"
FALLBACK = "size split (fallback)"
KINDS = ("parameters", "optimizer_state", "gradients", "activations", "logits")

_ALLOC = re.compile(r"^allocation (\d+): size (\d+)(.*)$")
_PARAM = re.compile(r"\bparameter (\d+)\b")
_COLOR = re.compile(r"\bcolor (\d+)\b")


def _allocations(assignment: str) -> dict[int, tuple[int, int | None, int]]:
    """``{allocation: (size, entry parameter number or None, colour)}``."""
    out = {}
    for line in assignment.splitlines():
        if m := _ALLOC.match(line):
            param, color = _PARAM.search(m.group(3)), _COLOR.search(m.group(3))
            out[int(m.group(1))] = (int(m.group(2)), int(param.group(1)) if param else None,
                                    int(color.group(1)) if color else 0)
    return out


def _merged(values: list[tuple], last: int) -> list[list[int]]:
    """The instructions over which any of a slice's values is live, as merged spans."""
    merged: list[list[int]] = []
    for s, e in sorted((max(v[0], 0), min(v[1], last)) for v in values):
        if merged and s <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], e)
        elif s <= e:
            merged.append([s, e])
    return merged


def kinds_from_buffers(dump, memory: dict, *, depth: int = 1, names: Sequence[str] = ()) -> dict | None:
    """``{kind: bytes}`` summing to ``memory["peak_bytes"]``, and ``detail``: the peak's
    instruction index (``peak_index`` of ``instructions``), the bytes live there (``live_bytes``)
    and the input's (``input_bytes``); None when no entry parameter is named ``leaves[...]`` (not a
    step of this lab). ``depth`` and ``names`` (the checkpoint names) label the values."""
    sequence, slices, kinds = _read_slices(dump.live_range, dump.assignment)
    allocations = _allocations(dump.assignment)
    program = Program(dump.hlo)
    params = program.entry_parameters()
    if not any(op.startswith("leaves[") for op, _ in params.values()):
        return None
    out = dict.fromkeys(KINDS, 0)
    inputs, unnamed = 0, {}  # unnamed: other's parts, {part: bytes}
    for size, number, color in allocations.values():
        if number is None or color != 0:
            continue
        op = params.get(number, ("", None))[0]
        kind = ("parameters" if op.startswith("leaves[") else
                "optimizer_state" if op.startswith("opt_state") else None)
        if kind is None:
            inputs += size
            _add(unnamed, f"input: {op or f'argument {number}'}", size)
        else:
            out[kind] += size
    n, last = len(sequence), len(sequence) - 1
    others = {s: v for s, v in slices.items() if kinds[s[0]] in ("temp", "output")
              and allocations.get(s[0], (0, None, 0))[1:] == (None, 0)}
    live = np.zeros(n + 1, dtype=np.int64)
    for (_, _, size), values in others.items():
        for s, e in _merged(values, last):
            live[s] += size
            live[e + 1] -= size
    live = np.cumsum(live)[:n]
    peak = int(np.argmax(live)) if n else 0
    leaf_shapes = {shape for op, shape in params.values() if op.startswith("leaves[") and shape}
    grads = gradient_values(program, others, leaf_shapes)
    layer_shapes = {(dtype, dims[1:]) for dtype, dims in leaf_shapes if depth > 1 and dims[:1] == (depth,)}
    judge, sources = Witness(dump.hlo, None), Sources(dump.hlo)
    for (_, _, size), values in others.items():
        if not any(max(v[0], 0) <= peak <= min(v[1], last) for v in values):
            continue
        value, _ = live_value(values, peak)
        if value[2] in grads:
            out["gradients"] += size
            continue
        phase = judge.phase(value[3], program.get(value[3]).op)
        layer, name, _ = label(sources, value[3], phase, depth=depth, names=names, scanned=depth > 1)
        if name == "logits":
            out["logits"] += size
        elif name or layer != "other":
            out["activations"] += size
        elif program.get(value[3]).shape in layer_shapes:  # a layer's weights out of the stack
            _add(unnamed, LAYER_WEIGHTS, size)
        else:
            _add(unnamed, f"temporary: {producer(program, value[3])}", size)
    peak_bytes = left = int(memory["peak_bytes"])
    for kind in KINDS:  # never over the peak: each cut to what the kinds before it leave
        out[kind] = min(out[kind], max(left, 0))
        left -= out[kind]
    out["other"] = max(peak_bytes - sum(out.values()), 0)
    return {**out, "other_parts": other_parts(out["other"], unnamed, memory),
            "detail": {"peak_index": peak, "instructions": n,
                       "live_bytes": int(live[peak]) if n else 0, "input_bytes": inputs}}


def _add(parts: dict, key: str, size: int) -> None:
    parts[key] = parts.get(key, 0) + size


def producer(program: Program, instr: str) -> str:
    """What made a value, as XLA names it: the instruction's name without its number (a fusion's
    name says what it fuses: ``loop_add_fusion``), and the JAX operation it comes from."""
    me = program.get(instr)
    stem = re.sub(r"[.]\d+$", "", instr)
    jax_op = (me.op or "").rsplit("/", 1)[-1]
    return f"{stem} ({jax_op})" if jax_op and jax_op != stem else stem


LAYER_WEIGHTS = "a layer's parameters sliced out of the scan's stack"
GAPS = "not live at the peak (the temporary memory's packing gaps, buffers live elsewhere)"
CODE = "generated code"
SMALL = 0.01  # parts under this share of other are summed into one


def other_parts(other: int, unnamed: dict, memory: dict) -> dict:
    """``other`` by what it holds, largest first, summing to it: the input arguments and the
    values live at the peak with no source (each by its producer, ``producer``; those under
    ``SMALL`` of other together), the generated code, and what no live value holds at the peak
    (``GAPS``: the allocations' bytes free there). Each part cut to what the ones before leave."""
    parts, left = {}, other
    code = int(memory.get("generated_code_bytes") or 0)
    named = sorted(unnamed.items(), key=lambda kv: -kv[1])
    kept = lambda k, v: v >= SMALL * other or not k.startswith("temporary: ")  # noqa: E731
    small = sum(v for k, v in named if not kept(k, v))
    for key, size in [*((k, v) for k, v in named if kept(k, v)),
                      (f"temporaries under {SMALL:.0%} of other each", small), (CODE, code)]:
        if size and left > 0:
            parts[key] = min(size, left)
            left -= parts[key]
    if left > 0:
        parts[GAPS] = left
    return parts


def compile_with_dump(lowered):
    """``(compiled, Dump | None)`` of a program read and never run (``timeline.compile_dumped``);
    after a persistent-cache hit (which compiles and dumps nothing) compiled again uncached."""
    compiled, dump = compile_dumped(lowered, read_only=True)
    if dump is None:
        with uncached():
            compiled, dump = compile_dumped(lowered, read_only=True)
    return compiled, dump


def read_kinds(dump, memory: dict | None, *, depth: int = 1, names: Sequence[str] = ()) -> dict | None:
    """``kinds_from_buffers`` without its ``detail``; None where there is no dump, no memory, or a
    dump this reader cannot read (the size split is then used, and labelled)."""
    if dump is None or not memory or memory.get("peak_bytes") is None:
        return None
    try:
        found = kinds_from_buffers(dump, memory, depth=depth, names=names)
    except (ValueError, KeyError, IndexError, StopIteration, TypeError, AttributeError):
        return None  # a dump format this reader does not know
    return found and {k: v for k, v in found.items() if k != "detail"}
