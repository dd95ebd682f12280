"""Trip counts of ``while`` loops XLA did not annotate, read from the program's own integer values.

A ``fori_loop(0, i + 1)`` inside a loop over ``i`` (the chunked attention's key blocks up to the
diagonal) runs a different number of times on each outer iteration: XLA annotates no trip count
and its cost analysis counts the body once. Here the loop's counter and bound are read from its
condition (``counter < bound``, directly or through a fused compare), their initial values are
evaluated from the instructions that compute them (constants, the enclosing loop's counter,
slices of a constant or ``iota`` array, integer arithmetic, through fusions and loop-invariant
tuple elements), once per value of the enclosing loop's counter. The loop's count is then the mean
over the enclosing loop's iterations: the body runs ``sum_i trip(i)`` times per run of the
enclosing loop. Anything this reader does not follow leaves the count unknown (None).
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np

from remat_lab.analysis import hlotext

_PARAM = re.compile(r"^\s*(\d+)\)")
_INDEX = re.compile(r"\bindex=(\d+)")
_SIZES = re.compile(r"dynamic_slice_sizes=\{([\d,]*)\}")
_CONSTANT = re.compile(r"^([\s{}\d,-]*)\)")
_DIRECTION = re.compile(r"direction=(\w+)")
_COMPARE = {"LT": np.less, "LE": np.less_equal, "GT": np.greater, "GE": np.greater_equal,
            "EQ": np.equal, "NE": np.not_equal}
_BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
           "maximum": np.maximum, "minimum": np.minimum}
_SAME = ("copy", "copy-start", "copy-done", "bitcast", "reshape", "convert")
_LARGEST = 1 << 16  # arrays longer than this are not evaluated


class _Program:
    """The module's instructions by computation, each computation's root and parameters, and
    each loop computation's ``while`` (the instruction that calls it as body or condition)."""

    def __init__(self, text: str):
        self.ins: dict[str, dict[str, hlotext.Instruction]] = {}
        self.root: dict[str, str] = {}
        self.loop_of: dict[str, tuple[str, hlotext.Instruction]] = {}  # body/condition -> (comp, while)
        self.whiles: list[tuple[str, hlotext.Instruction]] = []
        self._runs: dict = {}
        comp = ""
        for line in text.splitlines():
            opened = hlotext.computation(line)
            if opened is not None:
                comp = opened[1:]
                continue
            ins = hlotext.instruction(line)
            if ins is None:
                continue
            self.ins.setdefault(comp, {})[ins.name] = ins
            if line.lstrip().startswith("ROOT "):
                self.root[comp] = ins.name
            if ins.opcode == "while":
                self.whiles.append((comp, ins))
                for kind, callee in hlotext.called(ins.rest):
                    if kind in ("body", "condition"):
                        self.loop_of[callee[1:]] = (comp, ins)

    def operands(self, ins: hlotext.Instruction) -> list[str]:
        return [n[1:] for n in hlotext.NAME.findall(ins.operands)]

    def callee(self, ins: hlotext.Instruction, kind: str) -> str | None:
        return next((c[1:] for k, c in hlotext.called(ins.rest) if k == kind), None)

    # --- values --------------------------------------------------------------------------------

    def value(self, comp: str, name: str, env: dict):
        """The integer value (a Python int, or a NumPy array, flattened) of ``comp``'s instruction
        ``name`` under ``env`` (``{computation: {("p", i) or ("t", k): value}}``); None when unknown."""
        ins = self.ins.get(comp, {}).get(name)
        if ins is None:
            return None
        op, args = ins.opcode, self.operands(ins)
        if op == "parameter":
            m = _PARAM.match(ins.rest)
            return env.get(comp, {}).get(("p", int(m.group(1)))) if m else None
        if op == "constant":
            return _constant(ins)
        if op == "iota":
            shape = hlotext.arrays(ins.type)
            one_d = shape and len(shape[0][1]) == 1 and shape[0][1][0] <= _LARGEST
            return np.arange(shape[0][1][0]) if one_d else None
        if op in _SAME and args:
            return _scalar_if(ins, self.value(comp, args[0], env))
        if op in _BINARY and len(args) == 2:
            a, b = (self.value(comp, x, env) for x in args)
            return None if a is None or b is None else _scalar_if(ins, _BINARY[op](a, b))
        if op == "compare" and len(args) == 2 and _DIRECTION.search(ins.rest):
            a, b = (self.value(comp, x, env) for x in args)
            if not (isinstance(a, int) and isinstance(b, int)):
                return None
            return int(_COMPARE[_DIRECTION.search(ins.rest).group(1)](a, b))
        if op == "dynamic-slice" and len(args) == 2:
            return self._slice(ins, *(self.value(comp, x, env) for x in args))
        if op == "fusion-done" and args:  # an asynchronous fusion (XLA GPU): its start's value
            return _scalar_if(ins, self.value(comp, args[0], env))
        if op in ("fusion", "fusion-start", "call") and self.callee(ins, "calls") in self.root:
            inner = self.callee(ins, "calls")
            bound = {("p", i): self.value(comp, x, env) for i, x in enumerate(args)}
            return self.value(inner, self.root[inner], {**env, inner: bound})
        if op == "broadcast" and args:
            shape = hlotext.arrays(ins.type)
            got = self.value(comp, args[0], env)
            if isinstance(got, int) and shape and len(shape[0][1]) == 1 and shape[0][1][0] <= _LARGEST:
                return np.full(shape[0][1][0], got)
            return None
        if op == "dynamic-update-slice" and len(args) == 3:
            array, update, start = (self.value(comp, x, env) for x in args)
            if array is None or update is None or not isinstance(start, int) or np.ndim(array) != 1:
                return None
            out, update = np.array(array), np.atleast_1d(update)
            start = min(max(start, 0), len(out) - len(update))
            out[start:start + len(update)] = update
            return out
        if op == "get-tuple-element" and args:
            source = self.ins[comp].get(args[0])
            k = _INDEX.search(ins.rest)
            if source is not None and k and source.opcode in ("while", "call"):
                return self._result(comp, source, int(k.group(1)), env)
            if source is not None and k and source.opcode == "fusion":  # a multi-output fusion
                inner = self.callee(source, "calls")
                root = self.ins.get(inner, {}).get(self.root.get(inner, ""))
                if root is None or root.opcode != "tuple" or int(k.group(1)) >= len(self.operands(root)):
                    return None
                bound = {("p", i): self.value(comp, x, env) for i, x in enumerate(self.operands(source))}
                return self.value(inner, self.operands(root)[int(k.group(1))], {**env, inner: bound})
            return self._element(comp, args[0], ins, env)
        return None

    def _result(self, comp: str, source, k: int, env: dict, init: tuple | None = None):
        """Element ``k`` of a ``call``'s or a ``while``'s result (the loop run here on its integer
        state, at most ``_LARGEST`` iterations); ``init``: ``(computation, tuple instruction)``
        holding the loop's initial state when it is not the loop's own operand."""
        if source.opcode == "call":
            inner = self.callee(source, "to_apply")
            root = self.ins.get(inner, {}).get(self.root.get(inner, ""))
            args = self.operands(source)
            if root is None or root.opcode != "while" or len(args) != 1:
                return None
            operand = self.ins[inner].get((self.operands(root) or [""])[0])
            if operand is None or operand.opcode != "parameter":
                return None
            return self._result(inner, root, k, env, (comp, args[0]))
        key = (comp, source.name, k)
        if key in self._runs:
            return self._runs[key]
        self._runs[key] = None  # a loop that reads its own result: unknown
        body, cond = self.callee(source, "body"), self.callee(source, "condition")
        where, name = init or (comp, (self.operands(source) or [""])[0])
        start = self.ins[where].get(name)
        if body is None or cond not in self.root or start is None or start.opcode != "tuple":
            return None
        state = [self.value(where, x, env) for x in self.operands(start)]
        for _ in range(_LARGEST):
            known = {("t", j): v for j, v in enumerate(state) if v is not None}
            go = self.value(cond, self.root[cond], {**env, cond: known})
            if go is None:
                return None
            if not go:
                self._runs[key] = state[k] if k < len(state) else None
                return self._runs[key]
            state = [self.value(body, self._passed(body, j), {**env, body: known})
                     if state[j] is not None and self._passed(body, j) else None for j in range(len(state))]
        return None

    def _slice(self, ins, array, start):
        m = _SIZES.search(ins.rest)
        if array is None or start is None or np.ndim(array) != 1 or not m:
            return None
        size = hlotext.dims(m.group(1))[0]
        start = int(min(max(int(start), 0), len(array) - size))  # XLA clamps the start
        return _scalar_if(ins, np.asarray(array[start:start + size]))

    def _element(self, comp: str, tuple_name: str, ins, env: dict):
        """Element ``index`` of a loop computation's state: bound in ``env``, else the loop's
        initial value where the body passes the element through unchanged."""
        k = int(_INDEX.search(ins.rest).group(1)) if _INDEX.search(ins.rest) else None
        source = self.ins[comp].get(tuple_name)
        if k is None or source is None or source.opcode != "parameter" or comp not in self.loop_of:
            return None
        if ("t", k) in env.get(comp, {}):
            return env[comp][("t", k)]
        caller, loop = self.loop_of[comp]
        if not self._invariant(self.callee(loop, "body"), k):
            return None
        return self._initial(caller, loop, k, env)

    def _initial(self, caller: str, loop, k: int, env: dict):
        """Element ``k`` of ``loop``'s initial state, evaluated in ``caller``."""
        init = self.ins[caller].get((self.operands(loop) or [""])[0])
        if init is None or init.opcode != "tuple" or k >= len(self.operands(init)):
            return None
        return self.value(caller, self.operands(init)[k], env)

    def _passed(self, body: str, k: int) -> str | None:
        """The instruction ``body``'s root tuple puts at element ``k``, copies followed."""
        root = self.ins.get(body, {}).get(self.root.get(body, ""))
        if root is None or root.opcode != "tuple" or k >= len(self.operands(root)):
            return None
        return self.operands(root)[k]

    def _invariant(self, body: str | None, k: int) -> bool:
        name = self._passed(body, k) if body else None
        while name is not None:
            ins = self.ins[body][name]
            if ins.opcode == "copy":
                name = self.operands(ins)[0]
                continue
            m = _INDEX.search(ins.rest)
            source = self.ins[body].get((self.operands(ins) or [""])[0])
            return (ins.opcode == "get-tuple-element" and m is not None and int(m.group(1)) == k
                    and source is not None and source.opcode == "parameter")
        return False

    # --- loops ---------------------------------------------------------------------------------

    def counter(self, loop):
        """``(counter index, bound)`` of a loop whose condition is ``state[c] < bound`` (directly or
        through a fused compare, the bound a state element or a constant, fused or not); ``bound``
        evaluates it under an ``env``. None for any other condition."""
        cond = self.callee(loop, "condition")
        root = self.ins.get(cond, {}).get(self.root.get(cond, ""))
        if root is None:
            return None
        where, compare = cond, root
        if root.opcode == "fusion":
            where = self.callee(root, "calls")
            compare = self.ins.get(where, {}).get(self.root.get(where, ""))
        m = _DIRECTION.search(compare.rest) if compare is not None else None
        if compare.opcode != "compare" or not m or m.group(1) not in ("LT", "GT"):
            return None
        pair = self.operands(compare)
        if len(pair) != 2:
            return None
        counter, bound = pair if m.group(1) == "LT" else pair[::-1]
        if where != cond:  # the counter enters the fused compare as a parameter
            ins = self.ins[where][counter]
            p = _PARAM.match(ins.rest) if ins.opcode == "parameter" else None
            args = self.operands(root)
            if p is None or int(p.group(1)) >= len(args):
                return None
            counter = args[int(p.group(1))]
        ins = self.ins[cond][counter]
        k = _INDEX.search(ins.rest)
        if ins.opcode != "get-tuple-element" or not k:
            return None

        def bound_value(env: dict):
            if where == cond:
                return self.value(cond, bound, env)
            args = {("p", i): self.value(cond, x, env) for i, x in enumerate(self.operands(root))}
            return self.value(where, bound, {**env, where: args})

        return int(k.group(1)), bound_value

    def trip(self, comp: str, loop, env: dict) -> int | None:
        """``loop``'s trip count (it lies in ``comp``) under ``env``; None when unknown."""
        found = self.counter(loop)
        body = self.callee(loop, "body")
        if found is None or body is None:
            return None
        c, bound_of = found
        start = self._initial(comp, loop, c, env)
        bound = bound_of(env)
        step = self._step(body, c)
        if not all(isinstance(x, int) for x in (start, bound)) or step is None:
            return None
        return max(0, -(-(bound - start) // step))

    def _step(self, body: str, c: int) -> int | None:
        """The counter's increment per iteration, where it is the same at two counter values."""
        name = self._passed(body, c)
        if name is None:
            return None
        got = [self.value(body, name, {body: {("t", c): x}}) for x in (0, 5)]
        if not all(isinstance(g, int) for g in got) or got[0] <= 0 or got[1] - 5 != got[0]:
            return None
        return got[0]


def _scalar_if(ins, value):
    """``value`` as a Python int where ``ins``'s result is a scalar, else a 1-D array."""
    if value is None:
        return None
    shape = hlotext.arrays(ins.type)
    if shape and not shape[0][1]:
        arr = np.asarray(value).ravel()
        return int(arr[0]) if arr.size == 1 else None
    arr = np.asarray(value).ravel()
    return arr if arr.size <= _LARGEST else None


def _constant(ins):
    shape = hlotext.arrays(ins.type)
    if not shape or shape[0][0] not in ("s32", "s64", "u32", "u64", "s16", "s8", "u8", "u16"):
        return None
    m = _CONSTANT.match(ins.rest)
    if not m:
        return None
    try:
        values = [int(v) for v in re.sub(r"[\s{}]", "", m.group(1)).split(",") if v]
    except ValueError:
        return None
    if not shape[0][1]:
        return values[0] if len(values) == 1 else None
    return np.asarray(values) if len(values) == int(np.prod(shape[0][1])) <= _LARGEST else None


def trip_counts(text: str) -> dict[tuple[str, str], Fraction]:
    """``{(computation, while instruction name): trip count}`` for the loops whose count this
    reader can evaluate: a bound fixed in the program, or one set by the counter of the loop whose
    body holds it (then the mean over that loop's iterations, a ``Fraction``). Names without ``%``."""
    program = _Program(text)
    out: dict[tuple[str, str], Fraction] = {}
    for comp, loop in program.whiles:
        fixed = program.trip(comp, loop, {})
        if fixed is not None:
            out[(comp, loop.name)] = Fraction(fixed)
            continue
        outer = program.loop_of.get(comp)
        if outer is None or program.callee(outer[1], "body") != comp:
            continue
        per = _per_outer_iteration(program, comp, loop, outer)
        if per:
            out[(comp, loop.name)] = Fraction(sum(per), len(per))
    return out


def _per_outer_iteration(program: _Program, body: str, loop, outer) -> list[int] | None:
    """``loop``'s trip count on each iteration of the loop whose body (``body``) holds it."""
    caller, outer_loop = outer
    found = program.counter(outer_loop)
    n = hlotext.known_trip_count(outer_loop.rest) or program.trip(caller, outer_loop, {})
    if found is None or not n:
        return None
    start, step = program._initial(caller, outer_loop, found[0], {}), program._step(body, found[0])
    if not isinstance(start, int) or step is None:
        return None
    trips = []
    for t in range(n):
        got = program.trip(body, loop, {body: {("t", found[0]): start + t * step}})
        if got is None:
            return None
        trips.append(got)
    return trips
