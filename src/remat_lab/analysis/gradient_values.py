"""Which values of a compiled step hold a gradient: read from the optimized HLO and its buffer assignment.

The **final** gradients are the values the optimizer's update reads (the training step: the entry
instructions JAX's ``optimizer`` scope names) or, in the gradient step, the entry's outputs; each
of a parameter's shape. A final gradient that comes out of a loop (the layers' ``scan``, the
microbatches' loop) was accumulated in the loop's carried value, which XLA keeps in one buffer
slice: the values of that slice of the same shape over a contiguous time (the initial zeros, the
carried value, each update) are its **accumulator** (``_chain``). What an update writes into it (a
layer's gradient, a microbatch's, the result and input of FSDP's reduce-scatter or data
parallelism's all-reduce) is a gradient too (``_pieces``); a piece that comes out of a loop brings
that loop's accumulator. Products are never followed: their operands are activations.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from remat_lab.analysis import hlotext

_ENTRY = re.compile(r"^ENTRY (%[\w.\-]+)", re.M)
_INDEX = re.compile(r"\bindex=(\d+)")
OPTIMIZER = "/optimizer/"  # program/step.make_train_step's named scope
_WRITES = ("dynamic-update-slice", "add", "copy", "bitcast", "fusion")
_PRODUCTS = ("dot", "convolution", "custom-call")
_REDUCTIONS = ("reduce-scatter", "all-reduce")


class Ins(NamedTuple):
    """One instruction: its computation, operands, ``(dtype, dims)`` of an array result (None for
    a tuple), ``op_name``, opcode and the rest of its line."""

    comp: str
    operands: list[str]
    shape: tuple | None
    op: str
    opcode: str
    rest: str


_NONE = Ins("", [], None, "", "", "")


class Program:
    """The optimized HLO as a graph: instructions, each computation's root, those holding a product."""

    def __init__(self, hlo: str):
        m = _ENTRY.search(hlo)
        self.entry = m.group(1) if m else ""
        self.ins: dict[str, Ins] = {}
        self.roots: dict[str, str] = {}
        self.products: set[str] = set()
        self._types: dict[str, str] = {}
        comp = ""
        for line in hlo.splitlines():
            if (name := hlotext.computation(line)) is not None:
                comp = name
            elif (ins := hlotext.instruction(line)) is not None:
                found = hlotext.arrays(ins.type)
                shape = ((found[0][0], tuple(found[0][1])) if len(found) == 1 and ins.type[:1] != "("
                         else None)
                operands = [n.lstrip("%") for n in hlotext.OPERAND.findall(ins.operands)]
                self._types[ins.name] = ins.type
                self.ins[ins.name] = Ins(comp, operands, shape, hlotext.op_name(ins.rest), ins.opcode,
                                         ins.rest)
                if line.lstrip().startswith("ROOT "):
                    self.roots[comp] = ins.name
                if ins.opcode in _PRODUCTS:
                    self.products.add(comp)

    def get(self, name: str) -> Ins:
        """Instruction ``name`` (an empty one when unknown); an operand ``%while.3#4`` (XLA 0.12's
        tuple element, ``hlotext.OPERAND``) as the get-tuple-element XLA 0.10 printed for it."""
        if name in self.ins or "#" not in name:
            return self.ins.get(name, _NONE)
        base, index = name.rsplit("#", 1)
        typed = self._element_type(name)
        found = hlotext.arrays(typed)
        shape = (found[0][0], tuple(found[0][1])) if len(found) == 1 and typed[:1] != "(" else None
        of = self.get(base)
        return Ins(of.comp, [base], shape, of.op, "get-tuple-element", f"index={index}")

    def _element_type(self, name: str) -> str:
        """The type text of a tuple element operand ``a#1#2``."""
        base, *indices = name.split("#")
        types = self._types.get(base, "")
        for i in indices:
            types = hlotext.element(types, int(i))
        return types

    def entry_parameters(self) -> dict[int, tuple[str, tuple | None]]:
        """``{number: (op_name, shape)}`` of the entry computation's parameters (JAX names each
        after its argument: ``leaves[0]``, ``opt_state[0].mu[1]``, ``x``)."""
        return {int(i.rest.split(")")[0]): (i.op or name, i.shape) for name, i in self.ins.items()
                if i.comp == self.entry and i.opcode == "parameter"}

    def resolve(self, name: str) -> tuple[str, list[str]]:
        """``(instruction, tuple index)`` whose result ``name`` is, through tuple elements and
        bitcasts."""
        index: list[str] = []
        for _ in range(16):
            me = self.get(name)
            if me.opcode == "get-tuple-element" and me.operands and (m := _INDEX.search(me.rest)):
                index.insert(0, m.group(1))
                name = me.operands[0]
            elif me.opcode == "bitcast" and me.operands and not index:
                name = me.operands[0]
            else:
                break
        return name, index

    def key(self, name: str) -> str:
        """The buffer assignment's key of the value ``name``'s result is (``while.3{2}``)."""
        base, index = self.resolve(name)
        return f"{base}{{{','.join(index)}}}"

    def called_root(self, name: str) -> str | None:
        """The root of the computation instruction ``name`` calls (``calls=``), or None."""
        called = [c for attr, c in hlotext.called(self.get(name).rest) if attr == "calls"]
        return self.roots.get(called[0]) if called else None

    def is_product(self, name: str) -> bool:
        """Whether ``name`` is a product or calls a computation holding one (a GEMM fusion)."""
        me = self.get(name)
        return me.opcode in _PRODUCTS or any(c in self.products for _, c in hlotext.called(me.rest))


def finals(program: Program, leaf_shapes: set) -> list[str]:
    """The value keys of the gradients as the step hands them on (see the module)."""
    entry = [i for i in program.ins.values() if i.comp == program.entry]
    update = [i for i in entry if OPTIMIZER in i.op and i.opcode not in ("parameter", "constant")]
    used = ([o for i in update for o in i.operands] if update
            else program.get(program.roots.get(program.entry, "")).operands)
    return [program.key(o) for o in used
            if program.get(o).opcode not in ("parameter", "constant") and OPTIMIZER not in program.get(o).op
            and program.get(o).shape in leaf_shapes]


def _chain(values: list[tuple], key: str) -> set[str]:
    """The values of one slice (``(start, end, key, instruction, is_phi, shape)``) that are
    ``key``'s accumulator: the same shape, live over one contiguous time with it."""
    mine = next(v for v in values if v[2] == key)
    lo, hi = mine[0], mine[1]
    same = [v for v in values if v[5] == mine[5]]
    chain, grew = {key}, True
    while grew:
        grew = False
        for v in same:
            if v[2] not in chain and v[0] <= hi + 1 and v[1] >= lo - 1:
                chain.add(v[2])
                lo, hi, grew = min(lo, v[0]), max(hi, v[1]), True
    return chain


def gradient_values(program: Program, slices: dict, leaf_shapes: set) -> set[str]:
    """The value keys that hold (part of) a gradient (see the module); ``slices``: the buffer
    assignment's ``{(allocation, offset, size): values}`` (``timeline_parse._read_slices``),
    ``leaf_shapes``: the parameters' ``(dtype, dims)``."""
    where = {v[2]: s for s, values in slices.items() for v in values}
    out: set[str] = set()
    todo = [k for k in finals(program, leaf_shapes) if k in where]
    while todo:
        key = todo.pop()
        if key in out:
            continue
        values = slices[where[key]]
        chain = _chain(values, key)
        out |= chain
        shape = next(v[5] for v in values if v[2] == key)
        for k in chain:
            for piece in _pieces(program, k.split("{")[0], shape):
                if piece in where and piece not in out:
                    if program.get(piece.split("{")[0]).opcode == "while":
                        todo.append(piece)
                    else:
                        out.add(piece)
    return out


def _pieces(program: Program, name: str, shape: str) -> list[str]:
    """The value keys ``name`` writes into a gradient of ``shape`` (``f32[2,64,64]``): where
    ``name`` is no product, its operands of that shape or of one layer's of it, and a reduction
    collective's result and input."""
    m = hlotext.ARRAY.match(shape)
    if program.get(name).opcode not in _WRITES or program.is_product(name) or not m:
        return []
    dtype, dims = m.group(1), tuple(hlotext.dims(m.group(2)))
    out = []
    for o in program.get(name).operands:
        found = _reduction(program, *program.resolve(o))
        if found is not None:
            out += [program.key(o), *found]
            continue
        me = program.get(o)
        if (me.shape is not None and me.opcode != "parameter" and me.shape[0] == dtype
                and me.shape[1] in (dims, dims[1:])):
            out.append(program.key(o))
    return out


def _reduction(program: Program, base: str, index: list[str]) -> list[str] | None:
    """Where ``base`` is a reduction collective (sync, or the ``done`` of an async one), the value
    keys of its element ``index`` (as the start and its called computation name it) and of its
    input; else None."""
    me = program.get(base)
    start = me.operands[0] if me.opcode.endswith("-done") and me.operands else None
    root = program.called_root(start) if start else None
    op = program.get(root).opcode if root else program.get(start).opcode if start else me.opcode
    if not op.startswith(_REDUCTIONS):
        return None
    i = index[0] if index else None
    keys = []
    if start:
        keys.append(f"{start}{{1{',' + i if i is not None else ''}}}")
        if root:
            keys.append(f"{root}{{{i if i is not None else ''}}}")
    inputs = program.get(start or base).operands
    chosen = [inputs[int(i)]] if i is not None and int(i) < len(inputs) else inputs
    return keys + [program.key(x) for x in chosen]
