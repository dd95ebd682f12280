"""Collectives in a compiled sharded program: what the step communicates, by kind and phase.

**Collectives** are counted in the compiled (SPMD-partitioned, per-device) HLO: every all-gather,
reduce-scatter, all-reduce, all-to-all and collective-permute, times the runs of its computation
(a scanned body runs ``depth`` times), with its result bytes, by phase. **Recomputed** is judged
against the ``no_remat`` compile of the same mesh (``witness.Witness``): a collective is recomputed
only when the program has it more often than no_remat's (``op_name`` alone is no witness: where CSE
merges two copies, it keeps either copy's name); one the witness finds no twin of is, when it
runs in the backward and the program runs its kind and size more often than no_remat's
(``_count_extras``). Otherwise its phase is the **pass of its
place in the program** (``witness.passes``): a named collective's own (its no_remat twin's
``op_name``: ``transpose(`` = backward); an unnamed one's (XLA names no gradient reduce-scatter
it creates inside a scanned backward) is its region's. A while loop's body whose named
instructions are all backward is backward, all forward is forward, none named takes its
``while``'s pass; the entry computation (it holds both) is forward up to the first backward
instruction that reads the program's data in its schedule (the compiled module is scheduled: the
text's order is the execution order) and backward after it; a fusion or an asynchronous
collective's wrapper takes the pass of the instruction that calls it. The report also gives each
kind's count against that compile (``vs_no_remat``).
"""

from __future__ import annotations

import jax
import numpy as np

from remat_lab.analysis import hlo, hlotext
from remat_lab.analysis.witness import Witness, passes
from remat_lab.config import mesh_slices, parse_mesh
from remat_lab.program.mesh import RULES_TEXT, granules, input_spec, shard_shape

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


# A multi-slice TPU transfer's kind (``hlotext.MEGASCALE_KIND``) as the collective it is.
_MEGASCALE = {"ALL_GATHER": "all-gather", "REDUCE_SCATTER": "reduce-scatter",
              "ALL_REDUCE": "all-reduce", "ALL_TO_ALL": "all-to-all"}
LINKS = ("ici", "dcn")
LINK_TEXT = ("ici: within a slice or host (ICI on TPU, NVLink on GPU); dcn: across slices or hosts "
             "(the data-centre network between TPU slices, the network between GPU hosts): a "
             "collective whose replica groups hold devices of two slices or hosts (each device's "
             "TPU slice_index or GPU process_index, by the program's device assignment), or a "
             "multi-slice TPU program's cross-slice transfer (libtpu's send/recv to the megascale "
             "runtime, counted at its recv)")


def _spans(groups: list[list[int]], granules: list[int] | None) -> int:
    """The most slices or hosts one group holds devices of (1: none crosses)."""
    if not granules:
        return 1
    return max((len({granules[i] for i in g if 0 <= i < len(granules)}) for g in groups), default=1)


def _row(comp, ins, kind, judge, where, runs, granules, devices) -> dict:
    megascale = hlotext.MEGASCALE_KIND.search(ins.rest)
    if megascale:  # a cross-slice transfer: its result is the recv's first array
        first = hlotext.arrays(ins.type)[:1]
        size = sum(hlotext.array_bytes(t, d) for t, d in first)
        group = hlotext.megascale_group(ins.rest) or 2
        link, spans = "dcn", group
    else:
        size = _result_bytes(ins.type, kind, ins.opcode != kind)
        groups = hlotext.replica_groups(ins.rest, devices)
        group = max((len(g) for g in groups), default=1)
        if kind == "collective-permute":
            group = 2
        spans = _spans(groups, granules)
        link = "dcn" if spans > 1 else "ici"
    phase = judge.phase(ins.name, hlotext.op_name(ins.rest), unnamed="") if judge else ""
    return {"computation": comp, "name": ins.name, "kind": kind,
            "phase": "recomputed" if phase == "recomputed" else where.get(ins.name, "forward"),
            "runs": max(runs.get(comp, 1), 1), "bytes": size, "group": group, "link": link,
            "spans": spans}


def rows(text: str, witness: str | None = None, granules: list[int] | None = None) -> list[dict]:
    """One row per collective instruction of compiled HLO ``text``, in order: ``computation``,
    ``name``, ``kind``, ``phase`` (recomputed against ``witness``, no_remat's compiled text; else
    the pass of its place in the program), ``runs`` (its computation's, ``hlo.executions``),
    ``bytes`` (its result's, per device, per run), ``group`` (its largest replica group),
    ``link`` (``LINKS``: ``dcn`` when it crosses slices or hosts; ``granules``: each logical
    device's slice or host, ``LINK_TEXT``) and ``spans`` (the most slices or hosts one of its
    groups holds; a TPU cross-slice transfer's slices)."""
    judge = Witness(text, witness)
    out = _found(text, granules, judge, passes(text, judge))
    if witness is not None:
        _count_extras(out, _found(witness))
    return out


def _found(text: str, granules: list[int] | None = None, judge: Witness | None = None,
           where: dict | None = None) -> list[dict]:
    """The collective instructions of ``text`` in order (``_row``); without ``judge``, no phases."""
    runs, _ = hlo.executions(text)
    devices = hlotext.devices_of(text)
    out = []
    for comp, ins in hlotext.instructions(text):
        kind = ins.opcode.removesuffix("-start")
        if kind == "recv" and hlotext.MEGASCALE_KIND.search(ins.rest):
            kind = _MEGASCALE.get(hlotext.MEGASCALE_KIND.search(ins.rest).group(1), "collective-permute")
        elif kind not in KINDS:
            continue
        out.append(_row(comp, ins, kind, judge, where or {}, runs, granules, devices))
    return out


def _count_extras(out: list[dict], witness: list[dict]) -> None:
    """Backward collectives the witness has no twin of, but of a kind and size the program runs
    more often than no_remat's, are recomputed: the latest in the schedule first, never more than
    the program's excess of that kind and size, nor of that kind. (XLA 0.12's partitioner names
    the parameter gathers of a remat'd scanned block after the ``remat2`` call, not JAX's
    ``rematted_computation`` scope, and gathers them from other slices: no name and no twin says
    what they are; their number against no_remat's does.)"""
    def excess(kind: str, size: int | None = None) -> int:
        same = lambda r: r["kind"] == kind and size in (None, r["bytes"])  # noqa: E731
        return (sum(r["runs"] for r in out if same(r)) - sum(r["runs"] for r in witness if same(r))
                - sum(r["runs"] for r in out if same(r) and r["phase"] == "recomputed"))

    for row in reversed(out):
        if row["phase"] != "backward":
            continue
        if min(excess(row["kind"], row["bytes"]), excess(row["kind"])) >= row["runs"]:
            row["phase"] = "recomputed"


def collectives(text: str, witness: str | None = None, granules: list[int] | None = None) -> dict:
    """``{kind: {phase: {"count", "bytes", "dcn_count", "dcn_bytes"}}}`` of compiled HLO ``text``:
    instructions times the runs of their computation, result bytes per device (``rows``); the
    ``dcn_`` share of them crosses slices or hosts (``granules``, ``LINK_TEXT``). ``witness``: the
    no_remat compile's text, which decides what is recomputed (without it, ``op_name`` alone)."""
    out = {k: {p: {"count": 0, "bytes": 0, "dcn_count": 0, "dcn_bytes": 0} for p in PHASES}
           for k in KINDS}
    for row in rows(text, witness, granules):
        cell = out[row["kind"]][row["phase"]]
        cell["count"] += row["runs"]
        cell["bytes"] += row["runs"] * row["bytes"]
        if row["link"] == "dcn":
            cell["dcn_count"] += row["runs"]
            cell["dcn_bytes"] += row["runs"] * row["bytes"]
    return out


def totals(counts: dict) -> dict[str, int]:
    """``{kind: count}`` over all phases."""
    return {k: sum(c["count"] for c in phases.values()) for k, phases in counts.items()}


def report(problem, compiled_text: str, memory: dict | None, baseline_text: str | None) -> dict:
    """The ``sharding`` section of ``run --json`` for a compiled sharded step."""
    config, mesh = problem.config, problem.mesh
    counts = collectives(compiled_text, baseline_text, granules(mesh))
    mine = totals(counts)
    base = totals(collectives(baseline_text)) if baseline_text is not None else None
    per_device = sum(int(np.prod(shard_shape(leaf))) * leaf.dtype.itemsize for leaf in problem.leaves)
    total = sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in problem.leaves)
    return {
        "mesh": parse_mesh(config.mesh), "mesh_text": config.mesh, "slices": mesh_slices(config.mesh),
        "devices": int(mesh.devices.size),
        "processes": jax.process_count(), "process_index": jax.process_index(), "rules": RULES_TEXT,
        "per_device": memory, "param_bytes_per_device": per_device, "param_bytes_total": total,
        "input_spec": str(input_spec(config)),
        "param_specs": {p: str(s) for p, s in zip(problem.paths, problem.specs)},
        "collectives": counts, "collective_counts": mine,
        "vs_no_remat": None if base is None else {k: mine[k] - base[k] for k in KINDS},
        "method": ("static instructions of the compiled per-device HLO times their computation's "
                   "runs; recomputed against the no_remat compile on the same mesh: only where the "
                   "program has a collective more often than no_remat's; else the pass of its place "
                   "in the program: a named one's own (its no_remat twin's op_name, transpose = "
                   "backward), an unnamed one's region's: a while loop body whose named "
                   "instructions are all backward (forward) is backward (forward), one with none "
                   "takes its while's pass, the entry is backward after its first backward "
                   "instruction that reads data in the schedule, a fusion takes its caller's pass; "
                   "vs_no_remat: the same count minus the no_remat compile's; " + LINK_TEXT),
    }


