"""Which instructions a compiled program recomputes, judged against the no_remat witness compile.

``op_name`` is no witness of what XLA did: a program identical to no_remat's can still carry
JAX's ``rematted_computation`` scope on instructions that CSE merged with the forward pass. So
each instruction of both programs gets a **value number**: a hash of its opcode, result type,
attributes (names, metadata and backend configuration left out), its operands' value numbers and
its called computations' (a Merkle hash over the dataflow, as CSE sees it). The program's
instructions are matched to the witness's by value number, in schedule order; what is left over
is what the program does more than no_remat's:

* a left-over copy of a value the witness computes too is **recomputed**, whatever its name;
* a left-over value the witness has no copy of is recomputed when JAX put it under
  ``rematted_computation``, else it keeps the pass its ``op_name`` names;
* a matched instruction takes the pass of its witness twin (no_remat has no remat scope), so two
  identical programs get identical phases, and an identical program has nothing recomputed.

``passes`` gives every instruction the pass (forward or backward) of its place in the program:
the region (entry or loop body) that holds it, and where in that region's schedule.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict

from remat_lab.analysis import hlotext

REMAT_SCOPE = "rematted_computation"
_BACKEND_CONFIG = "backend_config="


def _without_backend_config(text: str) -> str:
    """``text`` less ``backend_config={...}`` (balanced braces; its JSON key order varies between
    XLA's dump and ``compiled.as_text()``) and ``backend_config="..."``."""
    out, i = [], 0
    while (j := text.find(_BACKEND_CONFIG, i)) >= 0:
        out.append(text[i:j])
        k = j + len(_BACKEND_CONFIG)
        if k < len(text) and text[k] == "{":
            depth = 0
            while k < len(text):
                depth += {"{": 1, "}": -1}.get(text[k], 0)
                k += 1
                if depth == 0:
                    break
        elif k < len(text) and text[k] == '"':
            k = text.find('"', k + 1) + 1 or len(text)
        i = k
    out.append(text[i:])
    return "".join(out)


def value_numbers(text: str) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    """``({instruction: value number}, [(name, value number, op_name)] of the instructions that
    own buffers)``, the latter in schedule order (fused computations' instructions left out)."""
    numbers: dict[str, str] = {}
    roots: dict[str, str] = {}
    fused: set[str] = set()
    rows: list[tuple[str, str, str, str]] = []  # (computation, name, number, op_name)
    for comp, ins in hlotext.instructions(text):
        operands = ins.operands
        attrs = hlotext.without_metadata(_without_backend_config(ins.rest[len(operands):]))
        if ins.opcode == "fusion":
            fused.update(c for k, c in hlotext.called(ins.rest) if k == "calls")
        attrs = hlotext.NAME.sub(lambda m: roots.get(m.group(0), "?"), attrs)
        args = ",".join(numbers.get(n, n) for n in hlotext.NAME.findall(operands)) or operands
        key = f"{ins.opcode}|{ins.type}|{args}|{attrs}"
        number = hashlib.sha1(key.encode()).hexdigest()[:16]
        numbers["%" + ins.name] = number
        rows.append((comp, ins.name, number, hlotext.op_name(ins.rest)))
        roots[comp] = number  # the last instruction printed is the ROOT: the computation's number
    return ({n.lstrip("%"): v for n, v in numbers.items()},
            [(name, number, op) for comp, name, number, op in rows if comp not in fused])


class Witness:
    """The phase of each instruction of ``text`` judged against ``witness`` (no_remat's compiled
    text of the same configuration); without a witness, by ``op_name`` alone."""

    def __init__(self, text: str, witness: str | None):
        self.differential = witness is not None
        self._phase_op: dict[str, str] = {}
        self.recomputed: set[str] = set()
        if witness is None:
            return
        _, mine = value_numbers(text)
        _, theirs = value_numbers(witness)
        twins: dict[str, list[str]] = defaultdict(list)
        for _, number, op in theirs:
            twins[number].append(op)
        mine_by: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for name, number, op in mine:
            mine_by[number].append((name, op))
        for number, group in mine_by.items():
            base = twins.get(number, [])
            # The copies beyond the witness's count are the extra ones: those JAX named as remat
            # first, then the latest in the schedule (a recomputation follows what it repeats).
            order = sorted(range(len(group)), key=lambda i: (REMAT_SCOPE in group[i][1], i))
            extra = set(order[len(base):]) if len(group) > len(base) else set()
            matched = [i for i in range(len(group)) if i not in extra]
            for i, twin_op in zip(matched, base):
                self._phase_op[group[i][0]] = twin_op
            for i in extra:
                name, op = group[i]
                if base or REMAT_SCOPE in op:
                    self.recomputed.add(name)
                else:
                    self._phase_op[name] = op

    def phase(self, name: str, op_name: str, unnamed: str = "other") -> str:
        """``recomputed``, ``backward`` or ``forward`` for instruction ``name`` (``unnamed`` when
        neither it nor its witness twin has an ``op_name``)."""
        if not self.differential:
            return hlotext.phase(op_name, unnamed)
        if name in self.recomputed:
            return "recomputed"
        op = self._phase_op.get(name, op_name)
        return hlotext.phase(_REMAT.sub("", op), unnamed)


_REMAT = re.compile(rf"/?{REMAT_SCOPE}")


# --- the passes of the program's regions ---------------------------------------------------------

_PASSES = ("forward", "backward")
_REGION_CALLS = ("body", "condition")


def passes(text: str, judge: Witness) -> dict[str, str]:
    """``{instruction: "forward" | "backward"}`` for every instruction of ``text``, by where the
    program puts it: the pass ``judge`` gives a named instruction (its own or its witness twin's
    ``op_name``; a recomputed one says nothing about its region), else its region's.

    A **region** is the entry computation or a while loop's body or condition (XLA schedules each
    on its own; ``is_scheduled=true``: the text's order is the execution order). A region whose
    named instructions are all of one pass is that pass (a scanned backward's body, where the
    gradients' reduce-scatters carry no name); one with none takes the pass of the ``while`` that
    runs it. A region that holds both passes (the entry; a microbatch loop's body) is forward up
    to its **seed**, the first backward instruction that reads the program's data (a hoisted
    constant or zero accumulator is none), and backward after it. Any other computation (a fusion,
    an asynchronous collective's wrapper, a reducer) takes the pass of the instruction calling it.
    """
    rows: dict[str, list[tuple[str, str, bool]]] = {}  # computation -> (name, named pass, reads data)
    data: set[str] = set()
    for comp, ins in hlotext.instructions(text):
        phase = judge.phase(ins.name, hlotext.op_name(ins.rest), unnamed="")
        reads = ins.opcode == "parameter" or any(
            n[1:] in data for n in hlotext.NAME.findall(ins.operands))
        if reads:  # a constant, an iota, a partition-id read none
            data.add(ins.name)
        rows.setdefault(comp, []).append((ins.name, phase if phase in _PASSES else "", reads))
    calls = hlotext.callers(text)
    out: dict[str, str] = {}
    for comp in reversed(rows):  # callees print before their callers: callers are judged first
        caller = calls.get(comp)
        inherited = out.get(caller[1], "forward") if caller else "forward"
        named = {p for _, p, _ in rows[comp] if p}
        if (caller and caller[2] not in _REGION_CALLS) or not named:
            fill = [inherited] * len(rows[comp])
        elif len(named) == 1:
            fill = [named.pop()] * len(rows[comp])
        else:
            seed = next((i for i, (_, p, reads) in enumerate(rows[comp]) if p == "backward" and reads),
                        len(rows[comp]))
            fill = ["forward" if i < seed else "backward" for i in range(len(rows[comp]))]
        for (name, phase, _), where in zip(rows[comp], fill):
            out[name] = phase or where
    return out
