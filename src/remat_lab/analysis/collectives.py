"""Collectives in a compiled sharded program: what the step communicates, by kind and phase.

**Collectives** are counted in the compiled (SPMD-partitioned, per-device) HLO: every all-gather,
reduce-scatter, all-reduce, all-to-all and collective-permute, times the runs of its computation
(a scanned body runs ``depth`` times), with its result bytes, by phase from its ``op_name`` (as the
memory timeline: ``rematted_computation`` = recomputed, ``transpose(`` = backward, else forward).
``op_name`` is not a witness of what XLA did (XLA CPU removes the remat barrier, CSE keeps either
copy's name), so the report also gives each kind's count against the ``no_remat`` compile of the
same mesh (``vs_no_remat``): the collectives the policy adds or removes, whatever their names.
"""

from __future__ import annotations

import re

import jax
import numpy as np

from remat_lab.analysis import hlo
from remat_lab.config import parse_mesh
from remat_lab.program.mesh import RULES_TEXT, input_spec, shard_shape

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
PHASES = ("forward", "recomputed", "backward")

_COLLECTIVE = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*(.*?)\s("
                         + "|".join(KINDS) + r")(-start)?\(")
_ARRAY = re.compile(r"\b(pred|[a-z]+\d+)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
          "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SIGNATURE = re.compile(r"^(?:ENTRY )?(%[\w.\-]+).*\) -> .*\{$")


def _phase(op_name: str) -> str:
    if "rematted_computation" in op_name:
        return "recomputed"
    return "backward" if "transpose(" in op_name else "forward"


def _result_bytes(types: str, kind: str, start: bool) -> int:
    """Bytes of a collective's result type text: a tuple (several operands combined) sums its
    arrays. An asynchronous all-gather or collective-permute start returns (operands, results,
    scalar contexts): only the results count."""
    found = [(t, [int(d) for d in dims.split(",") if d]) for t, dims in _ARRAY.findall(types)]
    if start and kind in ("all-gather", "collective-permute"):
        found = [(t, dims) for t, dims in found if dims]  # drop the scalar contexts
        found = found[len(found) // 2:]
    return sum(_BYTES.get(t, 4) * int(np.prod(dims)) for t, dims in found)


def collectives(text: str) -> dict:
    """``{kind: {phase: {"count", "bytes"}}}`` of compiled HLO ``text``: instructions times the
    runs of their computation (``hlo.executions``), result bytes per device."""
    runs, _ = hlo.executions(text)
    out = {k: {p: {"count": 0, "bytes": 0} for p in PHASES} for k in KINDS}
    comp = None
    for line in text.splitlines():
        sig = _SIGNATURE.match(line)
        if sig:
            comp = sig.group(1)
            continue
        m = _COLLECTIVE.match(line)
        if not m or "-done(" in line:
            continue
        op = _OP_NAME.search(line)
        cell = out[m.group(2)][_phase(op.group(1) if op else "")]
        times = max(runs.get(comp, 1), 1)
        cell["count"] += times
        cell["bytes"] += times * _result_bytes(m.group(1), m.group(2), bool(m.group(3)))
    return out


def totals(counts: dict) -> dict[str, int]:
    """``{kind: count}`` over all phases."""
    return {k: sum(c["count"] for c in phases.values()) for k, phases in counts.items()}


def report(problem, compiled_text: str, memory: dict | None, baseline_text: str | None) -> dict:
    """The ``sharding`` section of ``run --json`` for a compiled sharded step."""
    config, mesh = problem.config, problem.mesh
    counts = collectives(compiled_text)
    mine = totals(counts)
    base = totals(collectives(baseline_text)) if baseline_text is not None else None
    per_device = sum(int(np.prod(shard_shape(leaf))) * leaf.dtype.itemsize for leaf in problem.leaves)
    total = sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in problem.leaves)
    return {
        "mesh": parse_mesh(config.mesh), "devices": int(mesh.devices.size),
        "processes": jax.process_count(), "process_index": jax.process_index(), "rules": RULES_TEXT,
        "per_device": memory, "param_bytes_per_device": per_device, "param_bytes_total": total,
        "input_spec": str(input_spec(config)),
        "param_specs": {p: str(s) for p, s in zip(problem.paths, problem.specs)},
        "collectives": counts, "collective_counts": mine,
        "vs_no_remat": None if base is None else {k: mine[k] - base[k] for k in KINDS},
        "method": ("static instructions of the compiled per-device HLO times their computation's "
                   "runs; phase from op_name (rematted_computation = recomputed, transpose = "
                   "backward); vs_no_remat: the same count minus the no_remat compile's on the "
                   "same mesh (op_name is not trusted to say what XLA recomputed)"),
    }


