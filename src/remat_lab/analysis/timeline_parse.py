"""XLA's live-range and buffer-assignment dumps read: live bytes by phase and the buffers at the peak.

``parse_dump`` is the reader; ``timeline.memory_timeline`` finds the dump (the step's own compile,
a kept copy, or an uncached compile) and calls it. Phases come from the no_remat witness where one
is given (``witness.Witness``), names from the value live in each slice (``timeline_names``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from remat_lab.analysis import hlotext
from remat_lab.analysis.layers import layer_of_path
from remat_lab.analysis.timeline_names import Sources, label, live_value
from remat_lab.analysis.witness import Witness

PHASES = ("parameter", "output", "forward", "recomputed", "backward", "other")
MAX_POINTS = 2000

_SEQ = re.compile(r"^\s+(\d+):(\S+)$")
_RANGE = re.compile(r"^\s+(\S+?)(\{[\d,]*\}):(-?\d+)-(-?\d+)$")
_ALLOC = re.compile(r"^allocation (\d+): size (\d+)(.*)$")
_VALUE = re.compile(r"^ value: <\d+ (\S+?)(\{[\d,]*\})?( \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")
_LEAF = re.compile(r"^leaves\[(\d+)\]$")
_XLA_PEAK = re.compile(r"Live ranges at (\d+) \(peak\)")
_XLA_PEAK_BYTES = re.compile(r"Stack trace breakdown for peak usage: ([\d ]+) bytes")


def _downsample(live: np.ndarray, max_points: int) -> np.ndarray:
    """Indices to plot: each bucket's maximum, so the peak (the first global maximum) is kept."""
    n = len(live)
    if n <= max_points:
        return np.arange(n)
    edges = np.linspace(0, n, max_points + 1).astype(int)
    picks = {int(a + np.argmax(live[a:b])) for a, b in zip(edges[:-1], edges[1:]) if b > a}
    picks.add(int(np.argmax(live)))
    return np.array(sorted(picks))


def _parameter_layer(op: str, depth: int, paths: Sequence[str]) -> str | None:
    """The layer of an argument: a parameter ``leaves[i]`` by its path, ``x`` the input."""
    if op == "x":
        return "input"
    if (m := _LEAF.match(op)) and int(m.group(1)) < len(paths):
        return layer_of_path(paths[int(m.group(1))], depth)
    return None


def _read_slices(live_range: str, assignment: str):
    """``(sequence, {slice: values}, {allocation: kind})`` from the two dumps; a value is
    ``(start, end, key, instruction, is_phi, shape text)``."""
    sequence = [m.group(2) for m in map(_SEQ.match, live_range.split("BufferLiveRange:")[0].splitlines())
                if m]
    ranges = {}
    for line in live_range.split("BufferLiveRange:")[-1].split("Live ranges at")[0].splitlines():
        m = _RANGE.match(line)
        if m:
            ranges[m.group(1) + m.group(2)] = (int(m.group(3)), int(m.group(4)))
    slices: dict[tuple, list] = {}
    kinds: dict[int, str] = {}
    alloc = None
    for line in assignment.splitlines():
        if m := _ALLOC.match(line):
            alloc, attrs = int(m.group(1)), m.group(3)
            kinds[alloc] = ("parameter" if " parameter " in attrs else "output" if "output shape" in attrs
                            or "maybe-live-out" in attrs else "constant" if "constant" in attrs
                            else "thread-local" if "thread-local" in attrs else "temp")
        elif (m := _VALUE.match(line)) and alloc is not None:
            instr, index, phi, size, offset, shape = m.groups()
            key = instr + (index or "{}")
            if key not in ranges:
                continue  # thread-local and fused values live inside one instruction
            start, end = ranges[key]
            slices.setdefault((alloc, int(offset), int(size)), []).append(
                (start, end, key, instr, bool(phi), shape.split("{")[0] if "[" in shape else shape))
        elif not line.startswith(" "):
            alloc = None
    return sequence, slices, kinds


def parse_dump(live_range: str, assignment: str, hlo: str, *, depth: int = 1, names: Sequence[str] = (),
               paths: Sequence[str] = (), max_points: int = MAX_POINTS, witness: str | None = None) -> dict:
    """The timeline document from XLA's ``*-live-range.txt``, ``*-buffer-assignment.txt`` and HLO text.

    Live bytes at instruction ``t`` count each buffer slice (allocation, offset, size) once while
    any value assigned to it is live, so a loop-carried value and its aliases are not counted twice.
    Each stretch of a slice is attributed to the value live in it (``timeline_names.live_value``).
    ``witness``: no_remat's compiled text of the same configuration; with it ``recomputed`` is what
    this program does more than no_remat's (``witness.Witness``), without it JAX's op_name scope.
    """
    sequence, slices, kinds = _read_slices(live_range, assignment)
    n = len(sequence)
    sources = Sources(hlo)
    judge = Witness(hlo, witness)
    scanned = depth > 1

    last = n - 1
    live = np.zeros(n + 1, dtype=np.int64)
    by_phase = {p: np.zeros(n + 1, dtype=np.int64) for p in PHASES}
    segments = []  # (start, end, allocation, size, value, phase, op_name)
    for (a, _offset, size), values in slices.items():
        spans = sorted((max(v[0], 0), min(v[1], last)) for v in values)
        merged = []
        for s, e in spans:
            if merged and s <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        bounds = {v[0] for v in values} | {v[1] + 1 for v in values}
        for s, e in merged:  # stretches over which the same values are live
            cuts = sorted({s, *(x for x in bounds if s < x <= e)})
            for i, cs in enumerate(cuts):
                ce = cuts[i + 1] - 1 if i + 1 < len(cuts) else e
                rep, carried = live_value(values, cs)
                op = sources.op_name(rep[3])
                if kinds[a] == "parameter":
                    phase = "parameter"
                elif kinds[a] == "output" and (ce == last or not op or carried):
                    phase = "output"
                else:
                    phase = judge.phase(rep[3], op)
                    if phase == "other":  # unnamed: the pass of the value it copies or writes
                        src, src_op, _ = sources.source(rep[3])
                        phase = judge.phase(src, src_op)
                live[cs] += size
                live[ce + 1] -= size
                by_phase[phase][cs] += size
                by_phase[phase][ce + 1] -= size
                segments.append((cs, ce, a, size, rep, phase, op))
    live = np.cumsum(live)[:n]
    phases = {p: np.cumsum(v)[:n] for p, v in by_phase.items()}
    peak = int(np.argmax(live)) if n else 0
    picks = _downsample(live, max_points)

    at_peak = []
    for cs, ce, a, size, rep, phase, op in segments:
        if cs <= peak <= ce:
            m = hlotext.ARRAY.match(rep[5])
            dims = hlotext.dims(m.group(2)) if m else None
            layer = _parameter_layer(op, depth, paths) if kinds[a] == "parameter" else None
            if layer is None:
                layer, name, src = label(sources, rep[3], phase, depth=depth, names=names,
                                         scanned=scanned)
            else:
                name, src = None, rep[3]
            at_peak.append({"bytes": size, "shape": dims, "dtype": m.group(1) if m else rep[5],
                            "kind": kinds[a], "phase": phase, "layer": layer, "name": name,
                            "instruction": rep[2], "op_name": op,
                            "source": src, "source_op_name": sources.op_name(src)})
    at_peak.sort(key=lambda b: (-b["bytes"], b["instruction"]))

    xla_at = _XLA_PEAK.search(live_range)
    xla_bytes = _XLA_PEAK_BYTES.search(live_range)
    return {
        "source": "xla live-range and buffer-assignment dump",
        "instructions": n,
        "points": [[int(i), int(live[i])] for i in picks],
        "by_phase": {p: [[int(i), int(v[i])] for i in picks] for p, v in phases.items()},
        "peak_index": peak,
        "peak_live_bytes": int(live[peak]) if n else 0,
        "at_peak": at_peak,
        "phases_from": "no_remat witness" if witness is not None else "op_name",
        "note": None,
        "_xla_live_range_peak": (int(xla_at.group(1)) if xla_at else None,
                                 int(xla_bytes.group(1).replace(" ", "")) if xla_bytes else None),
    }
