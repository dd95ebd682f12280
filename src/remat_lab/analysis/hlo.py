"""What a compiled program contains, read from its optimised HLO text: products, memory spaces, identity.

These readers do not trust ``op_name`` metadata to say what XLA did (XLA drops it on rewritten
products and CSE survivors inherit whichever copy's name it kept); they count instructions, and a
caller compares two compiles (a policy's and ``no_remat``'s) to learn what the policy changed.
"""

from __future__ import annotations

import hashlib
import re

from remat_lab.analysis import hlotext, loop_trips

_PRODUCTS = ("dot", "convolution", "custom-call")
_MATMUL_TARGETS = ("gemm", "matmul")  # __cublas$gemm, __cublas$lt$matmul, __onednn$matmul, ...
# Host memory: layouts like {1,0:S(5)} (memory space 5 = pinned host on GPU/TPU), or explicit
# host transfers (MoveToHost / MoveToDevice annotations, send/recv to host).
_HOST_SPACE = re.compile(r"\{[^{}]*:[^{}]*S\(5\)[^{}]*\}")
_HOST_TRANSFER = re.compile(r'custom_call_target="(MoveToHost|MoveToDevice)"|is_host_transfer=true')
# What a fingerprint leaves out besides metadata and source tables: instruction and computation
# names (renumbered by first appearance), the module name, the signatures' parameter names.
_MODULE = re.compile(r"^HloModule\s+\S+", re.M)
_PARAM_NAME = re.compile(r"[\w.\-]+: ")


def _shapes(text: str) -> dict[str, list[int]]:
    """Instruction name (``%x``) -> result shape (first array of a tuple), over every computation."""
    shapes = {}
    for line in text.splitlines():
        ins = hlotext.instruction(line)
        if ins is not None:
            found = hlotext.arrays(ins.type)
            if found:
                shapes["%" + ins.name] = found[0][1]
        elif hlotext.computation(line) is not None:  # parameters named in a computation's signature
            for name, _, dims in hlotext.parameters(line):
                shapes.setdefault("%" + name, dims)
    return shapes


def _products(text: str):
    """``(computation, instruction, dtype, shape)`` of every product instruction."""
    for comp, ins in hlotext.instructions(text):
        if ins.opcode not in _PRODUCTS:
            continue
        found = hlotext.arrays(ins.type)
        if not found:
            continue
        if ins.opcode == "custom-call":
            target = hlotext.call_target(ins.rest).lower()
            if not any(t in target for t in _MATMUL_TARGETS):
                continue
        yield comp, ins, *found[0]


# cuBLAS's GEMM custom calls (XLA GPU) name their dimensions in the backend config.
_GEMM_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')
_S32_CONSTANT = re.compile(r"=\s*s32\[\][^=]*?\sconstant\((\d+)\)")


def executions(text: str) -> tuple[dict[str, int], list[int | float]]:
    """How many times each computation runs per call of the program, and the while loops' trip counts.

    A ``while`` body runs its known trip count times (``scan`` lowers to one); fusions, calls and
    conditionals run as often as the instruction that calls them. XLA's cost analysis counts a loop
    body once; these multipliers are what it leaves out. Where XLA does not annotate the count (TPU),
    a condition that compares the counter with one constant (``i < N``, as ``scan`` lowers) gives N.
    Other loops get the count ``loop_trips`` evaluates from the program's integer values: a bound
    set by the enclosing loop's counter (``fori_loop(0, i + 1)``) gives the mean over that loop's
    iterations, so the body's runs are the exact sum. Unknown trip counts count as 1.
    """
    comps: list[tuple[str, list[tuple[str, int]]]] = []
    trips: list = []  # ints, or a mean count (a Fraction) where the bound follows an outer counter
    bounds: dict[str, list] = {}  # computation -> [s32 constants, ends in ROOT compare LT]
    entry, evaluated = None, None
    for line in text.splitlines():
        name = hlotext.computation(line)
        if name is not None:
            comps.append((name, []))
            bounds[name] = [[], False]
            if line.startswith("ENTRY"):
                entry = name
            continue
        if not comps or "=" not in line:
            continue
        own = bounds[comps[-1][0]]
        if _S32_CONSTANT.search(line):
            own[0].append(int(_S32_CONSTANT.search(line).group(1)))
        elif line.lstrip().startswith("ROOT") and " compare(" in line and "direction=LT" in line:
            own[1] = True
        trip = 1
        if " while(" in line:
            known = hlotext.known_trip_count(line)
            if known is None:  # XLA TPU does not annotate scans: read the loop condition instead
                cond = next((c for k, c in hlotext.called(line) if k == "condition"), None)
                consts, less_than = bounds.get(cond, ([], False))
                known = consts[0] if less_than and len(consts) == 1 and consts[0] > 0 else None
            if known is None:
                evaluated = loop_trips.trip_counts(text) if evaluated is None else evaluated
                ins = hlotext.instruction(line)
                known = evaluated.get((comps[-1][0][1:], ins.name)) if ins else None
            trip = known if known is not None else 1
            trips.append(trip)
        for kind, callee in hlotext.called(line):
            comps[-1][1].append((callee, trip if kind in ("body", "condition") else 1))
    runs: dict = {name: 0 for name, _ in comps}
    if entry is None:
        return {name: 1 for name in runs}, trips
    runs[entry] = 1
    for name, calls in reversed(comps):  # HLO text prints callees before their callers
        for callee, times in calls:
            if callee in runs:
                runs[callee] += runs[name] * times
    whole = [t if isinstance(t, int) else float(t) for t in trips]  # a mean count: a float
    return {name: int(round(n)) for name, n in runs.items()}, whole


def matmuls(text: str) -> list[dict]:
    """Every matrix product instruction of compiled HLO text, whether or not it has metadata.

    A product is a ``dot`` (CPU, and inside GPU Triton fusions), a ``convolution`` or a library
    ``custom-call`` whose target is a GEMM (cuBLAS on GPU). Each row: ``dtype`` and ``shape`` of the
    result, ``operand_dtypes``, ``opcode``, ``op_name`` (``""`` when XLA dropped the metadata) and,
    for ``dot``, ``contracted`` (the product of the contracting dimensions' sizes, None when the
    operand shapes are unknown), ``batch`` (the product of the batch dimensions' sizes) and
    ``flops`` (2 x result elements x contracted; for a library GEMM custom call too, its contracting
    dimensions read from its ``gemm_backend_config``, ``contracted`` left None), and
    ``executions``: how many times the instruction runs per step (the trip count of the while loops
    around it, see ``executions``).
    """
    shapes = None
    runs, _ = executions(text)
    rows = []
    for comp, ins, dtype, out in _products(text):
        operands = ins.operands
        row = {"dtype": dtype, "shape": out,
               "operand_dtypes": [t for t, _ in hlotext.arrays(operands)],
               "opcode": ins.opcode, "op_name": hlotext.op_name(ins.rest),
               "contracted": None, "batch": 1, "flops": None, "executions": runs.get(comp, 1)}
        if ins.opcode == "dot":
            shapes = shapes if shapes is not None else _shapes(text)
            lhs_name = hlotext.NAME.search(operands)
            lhs = shapes.get(lhs_name.group(0)) if lhs_name else None
            if lhs is not None:
                contracting = hlotext.attribute("lhs_contracting_dims", ins.rest) or []
                batch = hlotext.attribute("lhs_batch_dims", ins.rest) or []
                row["contracted"] = _prod(lhs[d] for d in contracting)
                row["batch"] = _prod(lhs[d] for d in batch)
                row["flops"] = 2 * _prod(out) * row["contracted"]
        elif ins.opcode == "custom-call":  # a library GEMM: its dimensions in its backend config
            shapes = shapes if shapes is not None else _shapes(text)
            lhs_name = hlotext.NAME.search(operands)
            lhs = shapes.get(lhs_name.group(0)) if lhs_name else None
            contracting = _GEMM_CONTRACTING.search(ins.rest)
            if lhs is not None and contracting:
                dims = [int(d) for d in re.findall(r"\d+", contracting.group(1))]
                row["flops"] = 2 * _prod(out) * _prod(lhs[d] for d in dims)
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
    body = hlotext.without_source_tables(_MODULE.sub("HloModule m", text))
    body = hlotext.without_metadata(body)
    body = hlotext.SIGNATURE.sub(lambda m: _PARAM_NAME.sub("", m.group(0)), body)
    names: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        return names.setdefault(m.group(0), f"%v{len(names)}")

    return hlotext.NAME.sub(rename, body)


def fingerprint(text: str) -> str:
    """A short hash of the compiled program that ignores names and metadata.

    Two compiles with the same fingerprint are the same program: the same instructions in the same
    order on the same shapes, whatever JAX named them or which source line they came from.
    """
    return hashlib.sha256(canonical_text(text).encode()).hexdigest()[:16]
