"""What a compiled program contains, read from its optimised HLO text: products, memory spaces, identity.

These readers do not trust ``op_name`` metadata to say what XLA did (XLA drops it on rewritten
products and CSE survivors inherit whichever copy's name it kept); they count instructions, and a
caller compares two compiles (a policy's and ``no_remat``'s) to learn what the policy changed.
"""

from __future__ import annotations

import hashlib
import re

_OP_NAME = re.compile(r'op_name="([^"]*)"')
# "%x = f32[64,256]{1,0} dot(...)" or, for a library call, "%x = (f32[64,256]{1,0}, s8[..]{0})
# custom-call(...), custom_call_target="__cublas$gemm"": the first array shape is the product's.
_HLO_MATMUL = re.compile(r"=\s*\(?(\w+)\[([\d,]*)\][^=]*?\s(dot|convolution|custom-call)\(")
_CALL_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_MATMUL_TARGETS = ("gemm", "matmul")  # __cublas$gemm, __cublas$lt$matmul, __onednn$matmul, ...
_OPERANDS = re.compile(r"\b(dot|convolution|custom-call)\((.*?)\)(?:,|$)")
_OPERAND_TYPE = re.compile(r"(\w+)\[[\d,]*\]")
# Host memory: layouts like {1,0:S(5)} (memory space 5 = pinned host on GPU/TPU), or explicit
# host transfers (MoveToHost / MoveToDevice annotations, send/recv to host).
_HOST_SPACE = re.compile(r"\{[^{}]*:[^{}]*S\(5\)[^{}]*\}")
_HOST_TRANSFER = re.compile(r'custom_call_target="(MoveToHost|MoveToDevice)"|is_host_transfer=true')
# What a fingerprint leaves out: metadata (op_name, source lines), instruction and computation
# names (renumbered by first appearance), the module name.
_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")
_FRONTEND = re.compile(r",?\s*frontend_attributes=\{[^{}]*\}")
_NAME = re.compile(r"%[\w.\-]+")
_MODULE = re.compile(r"^HloModule\s+\S+", re.M)
_SIGNATURE = re.compile(r"^(?:ENTRY )?%.*\) -> .*\{$", re.M)  # "%fused (param_0.4: f32[128]) -> ..."
_PARAM_NAME = re.compile(r"[\w.\-]+: ")
# The source-location tables XLA prints before the computations (FileNames, FunctionNames,
# FileLocations, StackFrames; one numbered entry a line): where the Python code was, not what the
# program does.
_SOURCE_TABLES = re.compile(r"^(?:(?:FileNames|FunctionNames|FileLocations|StackFrames)|\d+ .*)\n", re.M)


_DEF = re.compile(r"^\s*(?:ROOT\s+)?(%[\w.\-]+)\s*=\s*\(?(\w+)\[([\d,]*)\]")
_PARAM_DEF = re.compile(r"([\w.\-]+):\s*(\w+)\[([\d,]*)\]")
_DIMS = {k: re.compile(k + r"=\{([\d,]*)\}") for k in
         ("lhs_contracting_dims", "rhs_contracting_dims", "lhs_batch_dims", "rhs_batch_dims")}


def _ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s]


def _shapes(text: str) -> dict[str, list[int]]:
    """Instruction name -> result shape (first array of a tuple), over every computation."""
    shapes = {}
    for line in text.splitlines():
        m = _DEF.match(line)
        if m:
            shapes[m.group(1)] = _ints(m.group(3))
        elif _SIGNATURE.match(line):  # parameters named in a computation's signature
            for name, _, dims in _PARAM_DEF.findall(line):
                shapes.setdefault("%" + name, _ints(dims))
    return shapes


def _matmul_lines(text: str):
    comp = ""
    for line in text.splitlines():
        if _SIGNATURE.match(line):
            comp = _HEADER_NAME.match(line).group(1)
            continue
        m = _HLO_MATMUL.search(line)
        if not m:
            continue
        dtype, shape, opcode = m.groups()
        if opcode == "custom-call":
            target = _CALL_TARGET.search(line)
            if not target or not any(t in target.group(1).lower() for t in _MATMUL_TARGETS):
                continue
        yield comp, line, dtype, shape, opcode


_CALLED = re.compile(r"\b(calls|to_apply|body|condition)=(%[\w.\-]+)")
_CALLED_LIST = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_HEADER_NAME = re.compile(r"^(?:ENTRY\s+)?(%[\w.\-]+)")


def executions(text: str) -> tuple[dict[str, int], list[int]]:
    """How many times each computation runs per call of the program, and the while loops' trip counts.

    A ``while`` body runs its known trip count times (``scan`` lowers to one); fusions, calls and
    conditionals run as often as the instruction that calls them. XLA's cost analysis counts a loop
    body once; these multipliers are what it leaves out. Unknown trip counts count as 1.
    """
    comps: list[tuple[str, list[tuple[str, int]]]] = []
    trips: list[int] = []
    entry = None
    for line in text.splitlines():
        if _SIGNATURE.match(line):
            name = _HEADER_NAME.match(line).group(1)
            comps.append((name, []))
            if line.startswith("ENTRY"):
                entry = name
            continue
        if not comps or "=" not in line:
            continue
        trip = 1
        if " while(" in line:
            m = _TRIP.search(line)
            trip = int(m.group(1)) if m else 1
            trips.append(trip)
        for kind, callee in _CALLED.findall(line):
            comps[-1][1].append((callee, trip if kind in ("body", "condition") else 1))
        for group in _CALLED_LIST.findall(line):
            comps[-1][1].extend((c.strip(), 1) for c in group.split(",") if c.strip())
    runs = {name: 0 for name, _ in comps}
    if entry is None:
        return {name: 1 for name in runs}, trips
    runs[entry] = 1
    for name, calls in reversed(comps):  # HLO text prints callees before their callers
        for callee, times in calls:
            if callee in runs:
                runs[callee] += runs[name] * times
    return runs, trips


def matmuls(text: str) -> list[dict]:
    """Every matrix product instruction of compiled HLO text, whether or not it has metadata.

    A product is a ``dot`` (CPU, and inside GPU Triton fusions), a ``convolution`` or a library
    ``custom-call`` whose target is a GEMM (cuBLAS on GPU). Each row: ``dtype`` and ``shape`` of the
    result, ``operand_dtypes``, ``opcode``, ``op_name`` (``""`` when XLA dropped the metadata) and,
    for ``dot``, ``contracted`` (the product of the contracting dimensions' sizes, None when the
    operand shapes are unknown), ``batch`` (the product of the batch dimensions' sizes) and
    ``flops`` (2 x result elements x contracted), and ``executions``: how many times the instruction
    runs per step (the trip count of the while loops around it, see ``executions``).
    """
    shapes = None
    runs, _ = executions(text)
    rows = []
    for comp, line, dtype, shape, opcode in _matmul_lines(text):
        name = _OP_NAME.search(line)
        ops = _OPERANDS.search(line)
        operands = ops.group(2) if ops else ""
        out = _ints(shape)
        row = {"dtype": dtype, "shape": out, "operand_dtypes": _OPERAND_TYPE.findall(operands),
               "opcode": opcode, "op_name": name.group(1) if name else "",
               "contracted": None, "batch": 1, "flops": None, "executions": runs.get(comp, 1)}
        if opcode == "dot":
            shapes = shapes if shapes is not None else _shapes(text)
            lhs_name = _NAME.search(operands)
            lhs = shapes.get(lhs_name.group(0)) if lhs_name else None
            dims = {k: (_ints(m.group(1)) if (m := rx.search(line)) else []) for k, rx in _DIMS.items()}
            if lhs is not None:
                row["contracted"] = _prod(lhs[d] for d in dims["lhs_contracting_dims"])
                row["batch"] = _prod(lhs[d] for d in dims["lhs_batch_dims"])
                row["flops"] = 2 * _prod(out) * row["contracted"]
        rows.append(row)
    return rows


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def product_key(elements: int, contracted: int | None, batch: int) -> tuple:
    """What identifies a product across a jaxpr and compiled HLO: result elements, contracted size,
    batch size. Invariant under XLA's layout changes, operand swaps and folded batch axes."""
    return (int(elements), contracted, int(batch))


def product_keys(text: str) -> list[tuple]:
    """``product_key`` of every product the compiled program runs, once per execution (a product in
    a loop body of trip count n appears n times)."""
    return [product_key(_prod(r["shape"]), r["contracted"], r["batch"])
            for r in matmuls(text) for _ in range(r["executions"])]


def matmul_count(text: str) -> int:
    """How many matrix product instructions the compiled program has (each counted once)."""
    return len(matmuls(text))


def loop_flops_left_out(text: str) -> int:
    """The product flops XLA's cost analysis leaves out by counting each loop body once:
    sum over products in loops of (executions - 1) x flops."""
    return sum((r["executions"] - 1) * (r["flops"] or 0) for r in matmuls(text))


def uses_host_memory(text: str) -> bool:
    """True when the compiled program places a value in host memory or moves one to or from it."""
    return bool(_HOST_SPACE.search(text) or _HOST_TRANSFER.search(text))


def upcasts_bf16_matmuls(text: str) -> bool:
    """True when the program's products run in float32 on values that were bfloat16 (XLA CPU).

    XLA CPU has no bf16 GEMM: it converts bf16 operands to f32 around each product. Seen as a
    product whose operands and result are f32 in a program that holds bf16 values.
    """
    if "bf16[" not in text:
        return False
    rows = matmuls(text)
    return bool(rows) and all(r["dtype"] == "f32" for r in rows)


def canonical_text(text: str) -> str:
    """The program with metadata, frontend attributes and names removed (names renumbered)."""
    body = _SOURCE_TABLES.sub("", _MODULE.sub("HloModule m", text))
    body = _METADATA.sub("", body)
    body = _FRONTEND.sub("", body)
    body = _SIGNATURE.sub(lambda m: _PARAM_NAME.sub("", m.group(0)), body)
    names: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        return names.setdefault(m.group(0), f"%v{len(names)}")

    return _NAME.sub(rename, body)


def fingerprint(text: str) -> str:
    """A short hash of the compiled program that ignores names and metadata.

    Two compiles with the same fingerprint are the same program: the same instructions in the same
    order on the same shapes, whatever JAX named them or which source line they came from.
    """
    return hashlib.sha256(canonical_text(text).encode()).hexdigest()[:16]
