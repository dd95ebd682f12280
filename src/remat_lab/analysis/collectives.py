"""Collectives in a compiled sharded program: what the step communicates, by kind and phase.

**Collectives** are counted in the compiled (SPMD-partitioned, per-device) HLO: every all-gather,
reduce-scatter, all-reduce, all-to-all and collective-permute, times the runs of its computation
(a scanned body runs ``depth`` times), with its result bytes, by phase as the memory timeline
judges it: against the ``no_remat`` compile of the same mesh (``witness.Witness``: a collective is
recomputed only when the program has it more often than no_remat's; the rest take the pass their
no_remat twin's ``op_name`` names: ``transpose(`` = backward, else forward). ``op_name`` alone is
no witness (XLA CPU removes the remat barrier, CSE keeps either copy's name). The report also
gives each kind's count against that compile (``vs_no_remat``).
"""

from __future__ import annotations

import jax
import numpy as np

from remat_lab.analysis import hlo, hlotext
from remat_lab.analysis.witness import Witness
from remat_lab.config import parse_mesh
from remat_lab.program.mesh import RULES_TEXT, input_spec, shard_shape

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
PHASES = ("forward", "recomputed", "backward")


def _result_bytes(types: str, kind: str, start: bool) -> int:
    """Bytes of a collective's result type text: a tuple (several operands combined) sums its
    arrays. An asynchronous all-gather or collective-permute start returns (operands, results,
    scalar contexts): only the results count."""
    found = hlotext.arrays(types)
    if start and kind in ("all-gather", "collective-permute"):
        found = [(t, dims) for t, dims in found if dims]  # drop the scalar contexts
        found = found[len(found) // 2:]
    return sum(hlotext.array_bytes(t, dims) for t, dims in found)


def collectives(text: str, witness: str | None = None) -> dict:
    """``{kind: {phase: {"count", "bytes"}}}`` of compiled HLO ``text``: instructions times the
    runs of their computation (``hlo.executions``), result bytes per device. ``witness``: the
    no_remat compile's text, which decides the phases (without it, ``op_name`` alone)."""
    runs, _ = hlo.executions(text)
    judge = Witness(text, witness)
    out = {k: {p: {"count": 0, "bytes": 0} for p in PHASES} for k in KINDS}
    for comp, ins in hlotext.instructions(text):
        kind = ins.opcode.removesuffix("-start")
        if kind not in out:
            continue
        cell = out[kind][judge.phase(ins.name, hlotext.op_name(ins.rest), unnamed="forward")]
        times = max(runs.get(comp, 1), 1)
        cell["count"] += times
        cell["bytes"] += times * _result_bytes(ins.type, kind, ins.opcode != kind)
    return out


def totals(counts: dict) -> dict[str, int]:
    """``{kind: count}`` over all phases."""
    return {k: sum(c["count"] for c in phases.values()) for k, phases in counts.items()}


def report(problem, compiled_text: str, memory: dict | None, baseline_text: str | None) -> dict:
    """The ``sharding`` section of ``run --json`` for a compiled sharded step."""
    config, mesh = problem.config, problem.mesh
    counts = collectives(compiled_text, baseline_text)
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
                   "runs; phase against the no_remat compile on the same mesh: recomputed only "
                   "where the program has a collective more often than no_remat's, else the pass "
                   "its no_remat twin's op_name names (transpose = backward); vs_no_remat: the "
                   "same count minus the no_remat compile's"),
    }


