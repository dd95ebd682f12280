"""Names for what the timeline holds: the value live in a buffer slice, its source, checkpoint name and layer.

A buffer slice holds several values over the program (a copy, a loop's carried value and the
loop body's update share one); the one that names it at an instruction is the value **live** there.
A loop-carried value (a ``phi``) is named after the loop body's update written into the same slice.
A value with no layer in its ``op_name`` (a ``dynamic-update-slice`` writing one layer into the
stack a ``scan`` keeps, a copy, a ``bitcast``) is named after what it was computed from: the
update it writes, the operand it copies. A value stacked by a scan stands for all its layers.
"""

from __future__ import annotations

from collections.abc import Sequence

from remat_lab.analysis import hlotext
from remat_lab.analysis.layers import layer_of

# MaxText's checkpoint names and the layer scope their value is computed in (model/llm.py,
# model/models.py); a name equal to its scope (mlp's l1, l2) needs no entry.
SCOPE_OF_NAME = {"query_proj": "q_proj", "key_proj": "k_proj", "value_proj": "v_proj",
                 "context": "attn", "out_proj": "o_proj", "mlpwi_0": "wi_0", "mlpwi_1": "wi_1",
                 "mlpwo": "wo"}
STACKED = "all layers"
_PASS_THROUGH = ("bitcast", "copy", "get-tuple-element", "reshape")
_MAX_HOPS = 8


def checkpoint_name(op_name: str, names: Sequence[str]) -> str | None:
    """The ``checkpoint_name`` tag whose scope directly holds the producing op (``.../l1/dot_general``,
    ``.../q_proj/dot_general`` for ``query_proj``)."""
    parts = op_name.split("/")
    if len(parts) < 2 or parts[-1].startswith("jit("):
        return None
    return next((n for n in names if SCOPE_OF_NAME.get(n, n) == parts[-2]), None)


def _is_update(opcode: str, name: str, op_name: str) -> bool:
    return (opcode == "dynamic-update-slice" or "dynamic-update-slice" in name
            or op_name.endswith("dynamic_update_slice"))


class Sources:
    """Each instruction of an HLO text, traced back to the instruction that names it."""

    def __init__(self, hlo: str):
        self._ins: dict[str, tuple[str, str, list[str], list[int] | None]] = {}
        for _, ins in hlotext.instructions(hlo):
            found = hlotext.arrays(ins.type)
            self._ins[ins.name] = (ins.opcode, hlotext.op_name(ins.rest),
                                   [n.lstrip("%") for n in hlotext.NAME.findall(ins.operands)],
                                   found[0][1] if len(found) == 1 else None)

    def op_name(self, name: str) -> str:
        """The ``op_name`` of instruction ``name`` (``""`` when XLA left none)."""
        return self._ins.get(name, ("", "", [], None))[1]

    def opcode(self, name: str) -> str:
        """The opcode of instruction ``name`` (``""`` when unknown)."""
        return self._ins.get(name, ("", "", [], None))[0]

    def source(self, name: str) -> tuple[str, str, bool]:
        """``(instruction, op_name, stacked)``: the instruction whose ``op_name`` names ``name``'s
        value (itself when its op_name has a layer), and whether a ``dynamic-update-slice`` on the
        way writes it into a stack."""
        stacked, seen = False, set()
        current = name
        for _ in range(_MAX_HOPS):
            if current in seen or current not in self._ins:
                break
            seen.add(current)
            opcode, op, operands, _dims = self._ins[current]
            if op and layer_of(op, 1) != "other" and not _is_update(opcode, current, op):
                return current, op, stacked
            if _is_update(opcode, current, op) and len(operands) > 1:
                stacked = True
                current = max(operands[1:], key=self._elements)  # the update, not the stack
            elif (opcode in _PASS_THROUGH or (opcode == "fusion" and not op)) and operands:
                current = max(operands, key=self._elements)
            else:
                break
        return (current, self.op_name(current), stacked) if current in self._ins else (name, "", stacked)

    def _elements(self, name: str) -> int:
        dims = self._ins.get(name, ("", "", [], None))[3]
        if not dims:
            return 0
        n = 1
        for d in dims:
            n *= d
        return n


def live_value(values: list[tuple], t: int) -> tuple[tuple, bool]:
    """The value of a slice live at instruction ``t`` and whether it is loop-carried.

    ``values``: ``(start, end, key, instruction, is_phi, shape)``. The latest-started value live at
    ``t`` that is no phi; where only a phi is live, the value the loop body writes into the slice
    after it (else the one written before it).
    """
    live = [v for v in values if v[0] <= t <= v[1]]
    real = sorted(v for v in values if not v[4])
    own = [v for v in live if not v[4]]
    if own:
        return max(own), False
    if live:
        phi_start = max(v[0] for v in live)
        after = [v for v in real if v[0] > phi_start]
        before = [v for v in real if v[0] <= phi_start]
        if after or before:
            return (after[0] if after else before[-1]), True
        return live[0], True
    return (real[-1] if real else values[0]), False


def label(sources: Sources, instr: str, phase: str, *, depth: int, names: Sequence[str],
          scanned: bool) -> tuple[str, str | None, str]:
    """``(layer, checkpoint name, source instruction)`` of a value: a tag names a forward value (or
    its recomputation), not its gradient; a value stacked by a scan is in ``all layers``."""
    src, op, stacked = sources.source(instr)
    layer = layer_of(op, depth) if op else "other"
    if stacked and scanned:  # the scan's body has no block scope: the value stands for every layer
        if sources.opcode(src) == "parameter":  # the loop's carry: each layer's input, stacked
            layer = "input"
        layer = STACKED if layer == "other" else f"{layer} ({STACKED})"

    name = checkpoint_name(op, names) if phase in ("forward", "recomputed") else None
    return layer, name, src
