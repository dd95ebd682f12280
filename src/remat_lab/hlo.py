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


def _matmul_lines(text: str):
    for line in text.splitlines():
        m = _HLO_MATMUL.search(line)
        if not m:
            continue
        dtype, shape, opcode = m.groups()
        if opcode == "custom-call":
            target = _CALL_TARGET.search(line)
            if not target or not any(t in target.group(1).lower() for t in _MATMUL_TARGETS):
                continue
        elif opcode == "convolution":
            # XLA CPU/GPU may express a product as a 1x1 convolution; a real convolution in these
            # models does not exist, so every convolution counts.
            pass
        yield line, dtype, shape, opcode


def matmuls(text: str) -> list[dict]:
    """Every matrix product instruction of compiled HLO text, whether or not it has metadata.

    A product is a ``dot`` (CPU, and inside GPU Triton fusions), a ``convolution`` or a library
    ``custom-call`` whose target is a GEMM (cuBLAS on GPU). Each row: ``dtype`` and ``shape`` of the
    result, ``operand_dtypes``, ``opcode``, ``op_name`` (``""`` when XLA dropped the metadata).
    """
    rows = []
    for line, dtype, shape, opcode in _matmul_lines(text):
        name = _OP_NAME.search(line)
        ops = _OPERANDS.search(line)
        operand_dtypes = _OPERAND_TYPE.findall(ops.group(2)) if ops else []
        rows.append({"dtype": dtype, "shape": [int(s) for s in shape.split(",") if s],
                     "operand_dtypes": operand_dtypes, "opcode": opcode,
                     "op_name": name.group(1) if name else ""})
    return rows


def matmul_count(text: str) -> int:
    """How many matrix product instructions the compiled program has (each counted once)."""
    return len(matmuls(text))


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
