"""Reading XLA's HLO text: instructions, computations, types, collectives' device groups, metadata.

The one place that knows the shapes of the text ``compiled.as_text()`` and XLA's
``*after_optimizations.txt`` dump print; ``hlo``, ``timeline`` and ``collectives`` read programs
through these readers and repeat none of these patterns (what they still match is their own: host
memory spaces, the dump's live-range and buffer-assignment files). A line looks like::

    %fused_computation (param_0: f32[8,8]) -> f32[8,8] {             <- a computation's signature
      ROOT %dot.1 = f32[8,8]{1,0} dot(%param_0, %param_0), lhs_contracting_dims={1}, ...,
          metadata={op_name="jit(f)/transpose(jvp())/dot_general" stack_frame_id=3}
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

# --- names and computations ---------------------------------------------------------------------

# An instruction or computation name as operands and ``calls=`` refer to it: ``%fusion.3``.
NAME = re.compile(r"%[\w.\-]+")
# An operand with the tuple elements it reads: XLA 0.12 prints no get-tuple-element instruction but
# its element as ``%while.3#4`` (element 4 of ``%while.3``; one ``#i`` per nesting level).
OPERAND = re.compile(r"%[\w.\-]+(?:#\d+)*")
# A computation's signature line: ``[ENTRY ]%name (param_0.4: f32[128], ...) -> f32[8] {``.
SIGNATURE = re.compile(r"^(?:ENTRY )?(%[\w.\-]+).*\) -> .*\{$", re.M)
# One parameter of a signature: ``param_0.4: f32[128]`` (name, dtype, dims).
_PARAMETER = re.compile(r"([\w.\-]+):\s*(\w+)\[([\d,]*)\]")


def computation(line: str) -> str | None:
    """The name (``%fused_computation.2``) of the computation ``line`` opens, or None."""
    m = SIGNATURE.match(line)
    return m.group(1) if m else None


_INSTRUCTION_START = re.compile(r"^\s+(?:ROOT\s+)?%")


def joined(text: str) -> str:
    """``text`` with each instruction on one line. libtpu prints a Pallas kernel's
    ``frontend_attributes={kernel_metadata={...}}`` over several lines (the metadata holds
    newlines): inside a computation, a line that neither starts an instruction nor closes the
    computation continues the instruction before it, and is joined to it with a space."""
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        if computation(line) is not None:
            inside = True
        elif line.rstrip() == "}":
            inside = False
        elif inside and out and line.strip() and not _INSTRUCTION_START.match(line):
            out[-1] += " " + line.strip()
            continue
        out.append(line)
    return "\n".join(out)


def parameters(signature: str) -> list[tuple[str, str, list[int]]]:
    """``(name, dtype, dims)`` of each array parameter of a signature line (names without ``%``)."""
    return [(name, dtype, dims(text)) for name, dtype, text in _PARAMETER.findall(signature)]


# --- instructions -------------------------------------------------------------------------------

# ``[ROOT ]%name = TYPE opcode(rest``: TYPE is an array (``f32[64,256]{1,0}``) or a tuple of them
# (``(f32[8,4]{1,0}, u32[])``), printed without a space followed by ``word(`` inside it.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_OPERANDS = re.compile(r"(.*?)\)(?:,|$)")


class Instruction(NamedTuple):
    """One instruction line: ``name`` (without ``%``), result ``type`` text, ``opcode`` and
    ``rest`` (what follows ``opcode(``: operands, then attributes and metadata)."""

    name: str
    type: str
    opcode: str
    rest: str

    @property
    def operands(self) -> str:
        """The operand list's text (``%a, %b``; on some backends with operand types)."""
        m = _OPERANDS.match(self.rest)
        return m.group(1) if m else ""


def instruction(line: str) -> Instruction | None:
    """The instruction ``line`` defines, or None (a signature, a closing brace, a table line)."""
    m = _INSTRUCTION.match(line)
    return Instruction(*m.groups()) if m else None


def instructions(text: str):
    """``(computation, Instruction)`` for every instruction of ``text``, in order (computation
    ``""`` before the first signature)."""
    comp = ""
    for line in text.splitlines():
        name = computation(line)
        if name is not None:
            comp = name
            continue
        ins = instruction(line)
        if ins is not None:
            yield comp, ins


_CALLED = re.compile(rf"\b(calls|to_apply|body|condition)=({NAME.pattern})")
_CALLED_LIST = re.compile(r"\b(branch_computations|called_computations)=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CALL_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def called(line: str) -> list[tuple[str, str]]:
    """``(attribute, computation)`` for each computation an instruction line calls: ``calls``,
    ``to_apply``, ``body``, ``condition``, then each of ``branch_computations`` and
    ``called_computations``."""
    out = _CALLED.findall(line)
    for attr, group in _CALLED_LIST.findall(line):
        out.extend((attr, c.strip()) for c in group.split(",") if c.strip())
    return out


def callers(text: str) -> dict[str, tuple[str, str, str]]:
    """``{computation: (caller's computation, calling instruction, attribute)}``: the first
    instruction of ``text`` that calls each computation, and how (``body`` or ``condition`` of a
    ``while``, ``calls`` of a fusion, ...). The entry computation has no caller."""
    out: dict[str, tuple[str, str, str]] = {}
    for comp, ins in instructions(text):
        for attr, callee in called(ins.rest):
            out.setdefault(callee, (comp, ins.name, attr))
    return out


def known_trip_count(line: str) -> int | None:
    """A ``while`` instruction's trip count, where XLA knows it (``scan`` lowers to one)."""
    m = _TRIP.search(line)
    return int(m.group(1)) if m else None


def call_target(line: str) -> str:
    """A ``custom-call``'s ``custom_call_target`` (``__cublas$gemm``), ``""`` where it has none."""
    m = _CALL_TARGET.search(line)
    return m.group(1) if m else ""


# --- types --------------------------------------------------------------------------------------

# An array type: dtype and dims, ``f32[64,256]`` (a layout ``{1,0}`` may follow); ``pred[]``.
ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")
# Bytes per element of each dtype; an unlisted one counts 4.
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
               "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16,
               **dict.fromkeys(("f8e4m3fn", "f8e5m2", "f8e4m3", "f8e3m4", "f8e4m3fnuz", "f8e5m2fnuz",
                                "f8e4m3b11fnuz"), 1)}


def dims(text: str) -> list[int]:
    """``"64,256"`` -> ``[64, 256]``; ``""`` (a scalar) -> ``[]``."""
    return [int(s) for s in text.split(",") if s]


def arrays(types: str) -> list[tuple[str, list[int]]]:
    """``(dtype, dims)`` of every array in a type text, in order (a tuple's elements)."""
    return [(dtype, dims(text)) for dtype, text in ARRAY.findall(types)]


def element(types: str, index: int) -> str:
    """The type text of element ``index`` of a tuple type text (``(s32[], f32[8]{0})``, 1 ->
    ``f32[8]{0}``); ``""`` when there is none."""
    inner = types.strip()
    if not inner.startswith("("):
        return ""
    parts, depth, start = [], 0, 1
    for i, ch in enumerate(inner):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if (ch == "," and depth == 1) or depth == 0:
            parts.append(re.sub(r"/\*.*?\*/", "", inner[start:i]).strip())
            start = i + 1
        if depth == 0:
            break
    return parts[index] if 0 <= index < len(parts) else ""


def array_bytes(dtype: str, shape: list[int]) -> int:
    """Bytes of an array of ``dtype`` and ``shape``."""
    n = DTYPE_BYTES.get(dtype, 4)
    for d in shape:
        n *= int(d)
    return n


# --- the devices of a collective ---------------------------------------------------------------

_GROUPS_LIST = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]*)\](?:T\(([\d,]*)\))?")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:<=\[([\d,]*)\](?:T\(([\d,]*)\))?)?"
                          r"\s*\{([^}]*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_INNER = re.compile(r"\{([\d,]*)\}")
# A cross-slice transfer on a multi-slice TPU: libtpu's per-slice program sends and receives it
# through the data-centre network (``send`` / ``recv`` to the ``xla_megascale_runtime``), its
# kind in ``_xla_megascale_transfer_type``, its slices in ``_xla_megascale_target``: the groups of
# global device ids (slice x 100000 + id) ``{{100000,200000},...}``, or ``"{1,2}x{0:3}"`` (those
# slices, those devices in each).
MEGASCALE_KIND = re.compile(r'_xla_megascale_transfer_type="([A-Z_]+)"')
_MEGASCALE_GROUPS = re.compile(r"_xla_megascale_target=\{\{([\d,]*)\}")
_MEGASCALE_SLICES = re.compile(r'_xla_megascale_target="\{([\d,]*)\}x')


_PARTITIONS = re.compile(r"\bnum_partitions=(\d+)")
_REPLICAS = re.compile(r"\breplica_count=(\d+)")


def devices_of(text: str) -> int:
    """The devices a compiled SPMD program runs on: ``num_partitions x replica_count`` (1 unstated;
    on a multi-slice TPU, one slice's)."""
    head = text[:4096]
    parts, replicas = _PARTITIONS.search(head), _REPLICAS.search(head)
    return (int(parts.group(1)) if parts else 1) * (int(replicas.group(1)) if replicas else 1)


def _iota(shape: list[int], perm: str | None) -> list[int]:
    """``[0, n)`` laid out as ``shape``, transposed by ``perm`` (HLO's ``<=[dims]T(perm)``), flat."""
    ids = np.arange(int(np.prod(shape)) if shape else 1).reshape(shape or [1])
    if perm:
        ids = ids.transpose(dims(perm))
    return ids.reshape(-1).tolist()


def replica_groups(line: str, devices: int) -> list[list[int]]:
    """The device groups (logical ids, the program's partitions) a collective instruction runs over:
    the list form ``{{0,1},{2,3}}``, the iota form ``[2,2]<=[4]`` (with ``T(...)``), the mesh form
    ``mesh['data'=2,'fsdp'=4] {'fsdp'}`` (the listed axes vary within a group), a permute's
    ``source_target_pairs`` (each pair a group); unstated: one group of all ``devices``."""
    m = _GROUPS_MESH.search(line)
    if m:
        axes = [(k.strip().strip("'"), int(v)) for k, v in
                (part.split("=") for part in m.group(1).split(",") if "=" in part)]
        shape = [n for _, n in axes]
        ids = np.array(_iota(dims(m.group(2)) if m.group(2) else shape, m.group(3))).reshape(shape)
        inside = [a.strip().strip("'") for a in m.group(4).split(",") if a.strip()]
        names = [a for a, _ in axes]
        keep = [names.index(a) for a in inside if a in names]
        rest = [i for i in range(len(names)) if i not in keep]
        size = int(np.prod([shape[i] for i in keep])) if keep else 1
        return ids.transpose(rest + keep).reshape(-1, size).tolist()
    m = _GROUPS_IOTA.search(line)
    if m:
        return np.array(_iota(dims(m.group(3)), m.group(4))).reshape(
            int(m.group(1)), int(m.group(2))).tolist()
    m = _GROUPS_LIST.search(line)
    if m and m.group(1):
        return [dims(g) for g in _INNER.findall(m.group(1))]
    m = _PAIRS.search(line)
    if m and m.group(1):
        return [dims(g) for g in _INNER.findall(m.group(1))]
    return [list(range(devices))]


def megascale_group(line: str) -> int | None:
    """How many slices a multi-slice TPU transfer (``MEGASCALE_KIND``) spans; None when unstated."""
    m = _MEGASCALE_GROUPS.search(line)
    if m:
        return len(dims(m.group(1)))
    m = _MEGASCALE_SLICES.search(line)
    return len(dims(m.group(1))) if m else None


# --- attributes and metadata --------------------------------------------------------------------

_OP_NAME = re.compile(r'op_name="([^"]*)"')
_METADATA = re.compile(r",?\s*metadata=\{[^{}]*\}")
_FRONTEND = re.compile(r",?\s*frontend_attributes=\{[^{}]*\}")
_STACK_FRAME = re.compile(r"\s*stack_frame_id=\d+")
# The source-location tables XLA prints before the computations (FileNames, FunctionNames,
# FileLocations, StackFrames; one numbered entry a line): where the Python code was, not what the
# program does.
_SOURCE_TABLES = re.compile(r"^(?:(?:FileNames|FunctionNames|FileLocations|StackFrames)|\d+ .*)\n", re.M)


def attribute(name: str, line: str) -> list[int] | None:
    """A ``name={1,2}`` integer-list attribute of an instruction line, or None where it has none."""
    m = re.search(re.escape(name) + r"=\{([\d,]*)\}", line)
    return dims(m.group(1)) if m else None


def op_name(line: str) -> str:
    """The ``op_name`` metadata of an instruction line (JAX's name stack), ``""`` where XLA has none."""
    m = _OP_NAME.search(line)
    return m.group(1) if m else ""


def phase(op_name: str, unnamed: str = "other") -> str:
    """The pass an ``op_name`` belongs to: ``recomputed`` (JAX's ``rematted_computation`` scope),
    ``backward`` (under ``transpose(``), else ``forward``; ``unnamed`` for an empty op_name."""
    if "rematted_computation" in op_name:
        return "recomputed"
    if "transpose(" in op_name:
        return "backward"
    return "forward" if op_name else unnamed


def without_metadata(text: str) -> str:
    """``text`` less its ``metadata={...}`` and ``frontend_attributes={...}``."""
    return _FRONTEND.sub("", _METADATA.sub("", text))


def without_source_tables(text: str) -> str:
    """``text`` less the source-location tables XLA prints before the computations."""
    return _SOURCE_TABLES.sub("", text)


def without_stack_frames(text: str) -> str:
    """``text`` less the ``stack_frame_id=N`` references into those tables (op_names kept)."""
    return _STACK_FRAME.sub("", text)
