"""What a compiled step moves and multiplies, read from its optimized HLO text, for the step-time estimate.

``traffic_of(text)`` counts, per call of the program (loop bodies times their trip counts,
``hlo.executions``):

* **products**: the flops of every ``dot``, ``convolution`` and library GEMM ``custom-call``
  (inside fusions too), by operand dtype and by the precision or dot algorithm XLA was asked for
  (``operand_precision={highest,highest}``, ``algorithm=dot_tf32_tf32_f32``, a cuBLAS call's
  ``precision_config`` in its ``backend_config``): what ``analysis/estimate.py`` prices at a rate;
* **memory bytes**: every top-level instruction of every computation that runs (the entry, while
  bodies and conditions, conditional branches, called computations; never the insides of a
  fusion) reads its operands and writes its result. A fusion's parameter that is only sliced
  (``dynamic-slice``, ``slice``, ``gather``) reads the slices; the buffer a ``dynamic-update-slice``
  updates in place is neither read nor written whole, only the update is written. An asynchronous
  pair (``X-start`` / ``X-done``) is counted once, at its done;
* **host transfers**: the same bytes where the array lives in host memory (layout memory space
  ``S(5)``, as ``hlo.uses_host_memory`` detects offload): device -> host when a result is in host
  memory, host -> device when an operand is; these leave the memory count;
* **collectives**: bytes per kind (``collectives.rows``) and each kind's largest group, within a slice
  or host and across them (``dcn_``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from remat_lab.analysis import collectives, hlo, hlotext

HOST_SPACE = "S(5)"  # pinned host memory on GPU and TPU
# An async op's opening halves: its work is counted once, at its ``-done`` (from the op the done
# reads: the start, or the last ``-update`` of a SparseCore gather, whose tuple result also holds
# its operands: counted at the update and again at the done, a gather's bytes were counted 2.5 times)
ASYNC_OPEN = ("-start", "-update")
# An array type with its layout, where printed: ``f32[8,4096]{1,0:S(5)}``, ``bf16[8]{0:T(128)}``.
_LAID_OUT = re.compile(hlotext.ARRAY.pattern + r"(\{[^{}]*\})?")
# Instructions that move no data of their own.
_FREE = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while",
                   "conditional", "call", "after-all", "add-dependency", "opt-barrier", "domain",
                   "partition-id", "replica-id"})
_SLICES = frozenset({"dynamic-slice", "slice", "gather"})
_PRECISION = re.compile(r"operand_precision=\{([^}]*)\}")
_ALGORITHM = re.compile(r"\balgorithm=(dot_[\w]+)")
_JSON_PRECISION = re.compile(r'"operand_precision":\[([^\]]*)\]')
_JSON_ALGORITHM = re.compile(r'"algorithm":"(ALG_DOT_[A-Z0-9_]+)"')
_JSON_LHS_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_DIM_LABELS_FULL = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_PRECISIONS = ("DEFAULT", "HIGH", "HIGHEST")
_COLLECTIVE = re.compile(r"\s(?:" + "|".join(collectives.KINDS) + r")(?:-start)?\(")

METHOD = ("top-level instructions of the computations that run (not the "
          "insides of fusions), operands read + result written, times their computation's runs; "
          "sliced fusion parameters read as slices, in-place dynamic-update-slice buffers count "
          "their update only; arrays in memory space S(5) are host transfers, not memory traffic")


class _Op(NamedTuple):
    name: str
    opcode: str
    type: str
    operands: list[str]
    rest: str


class _Module:
    """The text's instructions by computation, every value's type text, the entry's name."""

    def __init__(self, text: str):
        self.comps: dict[str, list[_Op]] = {}
        self.types: dict[str, str] = {}
        for comp, ins in hlotext.instructions(text):
            names = [n[1:] for n in hlotext.NAME.findall(ins.operands)]
            op = _Op(ins.name, ins.opcode, ins.type, names, ins.rest)
            self.comps.setdefault(comp, []).append(op)
            self.types[ins.name] = ins.type
        self.ops = {op.name: op for ops in self.comps.values() for op in ops}
        self.entry = next((m.group(1) for m in hlotext.SIGNATURE.finditer(text)
                           if m.group(0).startswith("ENTRY")), None)
        self._users: dict[str, dict[str, list[tuple[_Op, int]]]] = {}

    def running(self) -> list[str]:
        """The computations that run as programs: the entry and what while, conditional and call
        instructions run from it (fusions, reducers and async wrappers are kernels, not walked)."""
        seen: list[str] = []
        todo = [self.entry]
        while todo:
            comp = todo.pop()
            if comp in seen or comp not in self.comps:
                continue
            seen.append(comp)
            for op in self.comps[comp]:
                if op.opcode in ("while", "conditional", "call"):
                    todo.extend(callee for _, callee in hlotext.called(op.rest))
        return seen

    def root(self, comp: str) -> _Op | None:
        """A kernel's root: its last instruction that no other of its instructions reads."""
        used = self.users(comp)
        return next((op for op in reversed(self.comps.get(comp, []))
                     if op.name not in used and op.opcode != "parameter"), None)

    def users(self, comp: str) -> dict[str, list[tuple[_Op, int]]]:
        if comp not in self._users:
            found: dict[str, list[tuple[_Op, int]]] = {}
            for op in self.comps.get(comp, []):
                for i, name in enumerate(op.operands):
                    found.setdefault(name, []).append((op, i))
            self._users[comp] = found
        return self._users[comp]


def _bytes(types: str) -> int:
    return sum(hlotext.array_bytes(t, d) for t, d in hlotext.arrays(types))


def _host_share(types: str) -> float:
    """The share of a type's bytes that lives in host memory (``S(5)``)."""
    total = host = 0
    for dtype, dims, layout in _LAID_OUT.findall(types):
        n = hlotext.array_bytes(dtype, hlotext.dims(dims))
        total += n
        host += n if HOST_SPACE in layout else 0
    return host / total if total else 0.0


def _parameter_reads(module: _Module, comp: str, name: str) -> int | None:
    """Bytes a kernel reads of its value ``name``: the slices taken of it, 0 for a buffer updated in
    place, None when something reads it whole."""
    total = 0
    for user, position in module.users(comp).get(name, []):
        if user.opcode == "bitcast":
            part = _parameter_reads(module, comp, user.name)
        elif user.opcode in _SLICES and position == 0:
            part = _bytes(user.type)
        elif user.opcode == "dynamic-update-slice" and position == 0:
            part = 0
        else:
            return None
        if part is None:
            return None
        total += part
    return total


def _written(module: _Module, op: _Op) -> int:
    """Bytes an instruction (or a kernel's root) writes: an in-place update writes its update."""
    if op.opcode == "bitcast" and op.operands and op.operands[0] in module.ops:
        return _written(module, module.ops[op.operands[0]])
    if op.opcode == "dynamic-update-slice" and len(op.operands) > 1:
        return _bytes(module.types.get(op.operands[1], ""))
    if op.opcode == "tuple":
        return sum(_written(module, module.ops[n]) for n in op.operands if n in module.ops)
    return _bytes(op.type)


def _moves(module: _Module, op: _Op, base: str, operands: list[str], result: str) -> tuple[list, list]:
    """``(reads, writes)`` of one top-level instruction: ``[(bytes, host share)]`` each. ``base``:
    the opcode (an async pair's without ``-start``); ``operands``: its start's; ``result``: the
    type it leaves (its done's)."""
    kernel = (next((c for k, c in hlotext.called(op.rest) if k == "calls"), None)
              if "calls=" in op.rest else None)
    reads, host_out = [], _host_share(result)
    if kernel in module.comps:
        params = {int(p.rest.split(")")[0]): p.name for p in module.comps[kernel]
                  if p.opcode == "parameter" and p.rest.split(")")[0].isdigit()}
        for i, name in enumerate(operands):
            types = module.types.get(name, "")
            whole = _bytes(types)
            part = _parameter_reads(module, kernel, params[i]) if i in params else None
            reads.append((whole if part is None else min(part, whole), _host_share(types)))
        root = module.root(kernel)
        written = _written(module, root) if root is not None else _bytes(result)
        return reads, [(written, host_out)]
    if base in _SLICES and operands:
        source = module.types.get(operands[0], "")
        return [(_bytes(result), _host_share(source))], [(_bytes(result), host_out)]
    if base == "dynamic-update-slice" and len(operands) > 1:
        update = module.types.get(operands[1], "")
        return [(_bytes(update), _host_share(update))], [(_bytes(update), host_out)]
    reads = [(_bytes(module.types.get(n, "")), _host_share(module.types.get(n, ""))) for n in operands]
    if base == "custom-call" and _is_gemm(op):  # (result, workspace): the workspace is scratch
        first = _LAID_OUT.search(result)
        result = first.group(0) if first else result
    return reads, [(_bytes(result), host_out)]


def _is_gemm(op: _Op) -> bool:
    target = hlotext.call_target(op.rest).lower()
    return "gemm" in target or "matmul" in target


def _memory(module: _Module, runs: dict[str, int]) -> dict:
    """Device memory and host transfer bytes of the computations that run."""
    hbm = to_host = from_host = 0.0
    for comp in module.running():
        times = max(runs.get(comp, 1), 1)
        for op in module.comps[comp]:
            if op.opcode in _FREE or op.opcode.endswith(ASYNC_OPEN):
                continue
            if op.opcode == "custom-call" and hlotext.call_target(op.rest) == "AllocateBuffer":
                continue
            if op.opcode.endswith("-done"):
                start = module.ops.get(op.operands[0]) if op.operands else None
                if start is None:
                    continue
                reads, writes = _moves(module, start, start.opcode.removesuffix("-start"),
                                       start.operands, op.type)
            else:
                reads, writes = _moves(module, op, op.opcode, op.operands, op.type)
            for n, host in reads:
                hbm += times * n * (1 - host)
                from_host += times * n * host
            for n, host in writes:
                hbm += times * n * (1 - host)
                to_host += times * n * host
    return {"memory_bytes": hbm, "to_host_bytes": to_host, "from_host_bytes": from_host}


def _precision(op: _Op) -> str:
    """``DEFAULT``, ``HIGH`` or ``HIGHEST`` (the higher of the two operands'), or ``alg:<name>`` when
    a dot algorithm was asked for."""
    m = _ALGORITHM.search(op.rest)
    if m:
        return f"alg:{m.group(1)}"
    m = _JSON_ALGORITHM.search(op.rest)
    if m and m.group(1) != "ALG_UNSET":
        return f"alg:{m.group(1)[4:].lower()}"
    m = _PRECISION.search(op.rest) or _JSON_PRECISION.search(op.rest)
    if not m:
        return "DEFAULT"
    found = [p.strip().strip('"').upper() for p in m.group(1).split(",")]
    return max((p for p in found if p in _PRECISIONS), key=_PRECISIONS.index, default="DEFAULT")


def _taps(n: int, m: int, size: int, lo: int, stride: int, dilate: int = 1) -> int:
    """Window taps that land on an input element (not in the padding, nor in the holes an input
    dilation ``dilate`` puts between elements), summed over the ``m`` outputs of a window of
    ``size``, low padding ``lo`` and ``stride``, the input ``n`` long."""
    if dilate == 1:
        return sum(max(0, min(size, n + lo - o * stride) - max(0, lo - o * stride)) for o in range(m))
    if m * size > 20_000_000:
        return m * size  # too many to walk: every tap counted, as before
    at = np.arange(m)[:, None] * stride - lo + np.arange(size)[None, :]
    return int(np.count_nonzero((at >= 0) & (at <= (n - 1) * dilate) & (at % dilate == 0)))


def _convolution_flops(module: _Module, op: _Op, out_dims: list[int]) -> float | None:
    """2 x the multiply-adds a convolution does on its input, padding left out (XLA's own rule):
    per output feature and batch element, the input features times the window taps that land on
    the input. XLA writes some products as convolutions over a padded window (a weight gradient
    over attention heads: window 64, padding 63 on each side of a size-1 input, one tap an output)."""
    labels = _DIM_LABELS_FULL.search(op.rest)
    shapes = [hlotext.arrays(module.types.get(n, "")) for n in op.operands[:2]]
    if not labels or len(shapes) < 2 or not shapes[0] or not shapes[1] or "rhs_dilate" in op.rest:
        return None
    lhs_l, rhs_l, out_l = labels.groups()
    lhs, rhs = shapes[0][0][1], shapes[1][0][1]
    if len(lhs_l) != len(lhs) or len(rhs_l) != len(rhs) or len(out_l) != len(out_dims):
        return None
    spatial = [c for c in out_l if c.isdigit()]
    window = _WINDOW.search(op.rest)
    fields = dict(re.findall(r"(\w+)=([\w_x-]+)", window.group(1))) if window else {}
    pads = [p.split("_") for p in fields.get("pad", "").split("x")] if "pad" in fields else []
    strides = [int(v) for v in fields.get("stride", "").split("x")] if "stride" in fields else []
    dilates = [int(v) for v in fields["lhs_dilate"].split("x")] if "lhs_dilate" in fields else []
    flops = 2.0 * rhs[rhs_l.index("i")]
    for c in out_l:
        if not c.isdigit():
            flops *= out_dims[out_l.index(c)]
    for c in spatial:  # the window's fields are in spatial dimension order: 0, 1, ... (the label's digit)
        j = int(c)
        lo = int(pads[j][0]) if j < len(pads) else 0
        stride = strides[j] if j < len(strides) else 1
        dilate = dilates[j] if j < len(dilates) else 1
        flops *= _taps(lhs[lhs_l.index(c)], out_dims[out_l.index(c)], rhs[rhs_l.index(c)], lo, stride,
                       dilate)
    return flops


def _product_flops(module: _Module, op: _Op) -> float | None:
    """2 x result elements x the contracted size of a dot, a convolution or a GEMM call."""
    out = hlotext.arrays(op.type)
    if not out or not op.operands:
        return None
    elements = 1
    for d in out[0][1]:
        elements *= d
    if op.opcode == "convolution":
        return _convolution_flops(module, op, out[0][1])
    lhs = hlotext.arrays(module.types.get(op.operands[0], ""))
    if op.opcode == "dot":
        contracting = hlotext.attribute("lhs_contracting_dims", op.rest) or []
    else:
        m = _JSON_LHS_CONTRACTING.search(op.rest)
        contracting = [int(s.strip('"')) for s in m.group(1).split(",") if s.strip('"')] if m else None
    if not lhs or contracting is None:
        return None
    contracted = 1
    for d in contracting:
        contracted *= lhs[0][1][d]
    return 2.0 * elements * contracted


def _products(module: _Module, runs: dict[str, int]) -> list[dict]:
    """``[{"dtype", "precision", "flops"}]``: product flops per run of the program, by the operand
    dtype and the precision (or algorithm) of the products; ``flops`` None where some product's
    shape could not be read."""
    out: dict[tuple[str, str], float | None] = {}
    for comp, ops in module.comps.items():
        times = max(runs.get(comp, 1), 1)
        for op in ops:
            if op.opcode not in ("dot", "convolution") and not (op.opcode == "custom-call" and _is_gemm(op)):
                continue
            operand = hlotext.arrays(module.types.get(op.operands[0], "")) if op.operands else []
            dtype = (operand or hlotext.arrays(op.type) or [("f32", [])])[0][0]
            key = (dtype, _precision(op))
            flops = _product_flops(module, op)
            before = out.get(key, 0.0)
            out[key] = None if flops is None or before is None else before + times * flops
    return [{"dtype": d, "precision": p, "flops": f} for (d, p), f in sorted(out.items())]


def _collectives(text: str, devices: int, granules: list[int] | None) -> dict:
    """``{kind: {"count", "bytes", "ici_bytes", "group", "dcn_count", "dcn_bytes", "dcn_group"}}``
    of the kinds the program runs: count and result bytes per device (``collectives.rows``); what
    each link carries per device (``HIERARCHY``): ``ici_bytes`` over rings of ``group`` devices
    within a slice or host, ``dcn_bytes`` over rings of ``dcn_group`` slices or hosts."""
    if not _COLLECTIVE.search(text) and "_xla_megascale_transfer_type" not in text:
        return {}
    out: dict[str, dict] = {}
    for row in collectives.rows(text, granules=granules or [0] * devices):
        cell = out.setdefault(row["kind"], {"count": 0, "bytes": 0, "ici_bytes": 0, "group": 1,
                                            "dcn_count": 0, "dcn_bytes": 0, "dcn_group": 1})
        n, size = row["runs"], row["runs"] * row["bytes"]
        cell["count"] += n
        cell["bytes"] += size
        if row["link"] == "ici":
            cell["ici_bytes"] += size
            cell["group"] = max(cell["group"], row["group"])
            continue
        cell["dcn_count"] += n
        cell["dcn_group"] = max(cell["dcn_group"], row["spans"])
        if row["spans"] == row["group"]:  # one device a slice (a TPU transfer): all of it crosses
            cell["dcn_bytes"] += size
            continue
        per_slice = row["group"] // row["spans"]
        cell["ici_bytes"] += size
        cell["group"] = max(cell["group"], per_slice)
        cell["dcn_bytes"] += size / per_slice
    return {k: v for k, v in out.items() if v["count"]}


HIERARCHY = ("a collective whose group spans S slices or hosts of P devices each runs as NCCL's "
             "and XLA's hierarchical collectives do (within each host over P devices on the full "
             "bytes, across hosts over S on a P-th of them, each device's own NIC carrying its "
             "share): ring bytes over P at the interconnect figure plus ring bytes of a P-th over S "
             "at the cross-slice figure; a multi-slice TPU program's transfers are already its "
             "cross-slice part, their bytes as they are")


devices_of = hlotext.devices_of  # its home: hlotext
# The readers ``kernels.py`` prices one kernel at a time with (the same counts as the totals here).
FREE, Module, moves, product_flops, precision, is_gemm = (
    _FREE, _Module, _moves, _product_flops, _precision, _is_gemm)


def traffic_of(text: str, granules: list[int] | None = None) -> dict:
    """What the estimate needs from a compiled step's text (JSON-ready): ``products``,
    ``memory_bytes``, ``to_host_bytes``, ``from_host_bytes``, ``collectives``, ``devices`` and the
    counting ``method``. Bytes and flops per device, per call of the step. ``granules``: each
    logical device's slice or host (``mesh.granules``), which splits the collectives' bytes into
    in-slice and cross-slice (None: all in one)."""
    module = _Module(text)
    runs, _ = hlo.executions(text)
    devices = devices_of(text)
    return {"products": _products(module, runs), **_memory(module, runs),
            "collectives": _collectives(text, devices, granules), "devices": devices,
            "method": METHOD}
