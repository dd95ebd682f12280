"""Flops of the fused attention kernels XLA's cost analysis counts as nothing: what each computes.

cuDNN's fused attention on a GPU (``custom-call`` to ``__cudnn$fmha*``) is counted from its query
and key shapes (``operand_layout_constraints``: ``[B, T, H, D]``): ``4 B H Tq Tk D`` forward
(``q k^T`` and ``p v``), half of it under a causal mask (``"mask_type": "CAUSAL"`` in the call's
config: the kernel skips the tiles above the diagonal), and 2.5 times that backward (``q k^T``
recomputed, ``dv``, ``dp``, ``dq``, ``dk``: five products to the forward's two).

A Pallas kernel is a ``custom-call`` (``tpu_custom_call``) whose body XLA does not see: its cost
analysis gives it 0 flops, and the splash kernels the lab runs carry no cost estimate. Their
products are counted here from the call's operand shapes (``operand_layout_constraints``), the
block sizes splash records in the call's ``xprof_metadata`` and the lab's mask, causal
(``model/attention.py``): the blocks at or below the diagonal are computed (the diagonal blocks
whole, masked inside), those above it skipped. Per computed ``bq x bkv`` block and query head, in
units of ``2 bq bkv D`` flops (D the head size): the forward kernel 2 (``q k^T``, ``p v``), the
``dq`` kernel 3 (``q k^T`` again, ``do v^T``, ``ds k``), the ``dkv`` kernel 4 (``q k^T``,
``do v^T``, ``p^T do``, ``ds^T q``). The block mask's values are an argument of the program,
not in its text, so the causal structure is the lab's own, not read. Element-wise work inside the
kernels (``exp``, the running max and sum) is left out: products only.
"""

from __future__ import annotations

import json
import re

from remat_lab.analysis import hlotext

_LAYOUTS = "operand_layout_constraints={"
_XPROF = re.compile(r'"xprof_metadata":"((?:[^"\\]|\\.)*)"')
# kernel (the pallas_call's name in the instruction's name or op_name) -> (units, metadata keys)
_SPLASH = {"splash_mha_fwd": (2, "block_q", "block_kv"),
           "splash_mha_dq": (3, "block_q_dq", "block_kv_dq"),
           "splash_mha_dkv": (4, "block_q_dkv", "block_kv_dkv")}
SOURCE = ("fused attention kernels (custom calls XLA counts as 0) counted as what they "
          "compute: Pallas splash kernels' products over the causal blocks at or below the "
          "diagonal, from the call's shapes and block sizes; cuDNN's from its shapes, causal half")
_CUDNN = re.compile(r"fmha", re.I)
# JAX 0.12's ``compiled.as_text()`` writes the call's config with a space after each colon, XLA's
# dump without one: both read (the space alone had every causal call counted as the full square).
_CAUSAL = re.compile(r'"mask_type":\s*"CAUSAL', re.I)
CUDNN_BACKWARD_FACTOR = 2.5


def causal_blocks(n_q: int, n_kv: int, bq: int, bkv: int) -> int:
    """How many ``bq x bkv`` blocks of an ``n_q x n_kv`` causal score matrix hold an unmasked
    entry (query ``i`` sees keys ``j <= i``): the blocks a causal block-sparse kernel computes."""
    blocks = 0
    for i in range(-(-n_q // bq)):
        last_key = min((i + 1) * bq, n_q) - 1
        blocks += min(-(-n_kv // bkv), last_key // bkv + 1)
    return blocks


def _braced(text: str, opening: str) -> str | None:
    """What follows ``opening`` (ending in ``{``) up to its matching ``}``; None without one."""
    start = text.find(opening)
    if start < 0:
        return None
    depth, i = 1, start + len(opening)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def _kernel(ins: hlotext.Instruction) -> str | None:
    where = ins.name + " " + hlotext.op_name(ins.rest)
    return next((k for k in _SPLASH if k in where), None)


def splash_kernel(ins) -> str | None:
    """Which splash kernel ``ins`` calls (``splash_mha_fwd``, ``_dq``, ``_dkv``), or None."""
    if ins.opcode != "custom-call" or hlotext.call_target(ins.rest) != "tpu_custom_call":
        return None
    return _kernel(ins)


def splash_flops(ins: hlotext.Instruction) -> float | None:
    """The products one splash kernel call computes; None when ``ins`` is not one, or its shapes
    or block sizes cannot be read."""
    kernel = splash_kernel(ins)
    layouts, xprof = _braced(ins.rest, _LAYOUTS), _XPROF.search(ins.rest)
    if kernel is None or layouts is None or xprof is None:
        return None
    try:
        meta = json.loads(json.loads('"' + xprof.group(1) + '"'))
    except ValueError:
        return None
    units, q_key, kv_key = _SPLASH[kernel]
    shapes = [dims for _, dims in hlotext.arrays(layouts)]
    if len(shapes) < 5 or q_key not in meta or kv_key not in meta:
        return None
    q, k = shapes[2], shapes[3]  # data_next, block_mask, q (..., H, N, D), k (..., G, N, D), v
    if len(q) < 3 or len(k) < 3:
        return None
    rows = 1
    for d in q[:-2]:
        rows *= d  # batch x query heads
    bq, bkv, d = int(meta[q_key]), int(meta[kv_key]), q[-1]
    return float(units * 2 * bq * bkv * d * rows * causal_blocks(q[-2], k[-2], bq, bkv))


# A Mosaic kernel's own cost estimate (``backend_config``'s ``cost_estimate``), which libtpu's cost
# analysis counts and the lab's re-analysis on this process's backend does not: the TPU's
# ``ragged_dot`` (model/moe.py's grouped experts) compiles to such kernels, ``ragged-dot-*``,
# each estimating its products (``2 x rows x contracted x columns``: the routed work).
_ESTIMATE = re.compile(r'"cost_estimate":\s*\{\s*"flops":\s*"?(\d+)')


def estimated_flops(text: str) -> float:
    """The flops of the ``tpu_custom_call`` kernels in ``text`` that carry a cost estimate (each
    call's line once; splash kernels carry none)."""
    return float(sum(int(m.group(1)) for line in text.splitlines()
                     if "tpu_custom_call" in line for m in _ESTIMATE.finditer(line)))


def estimated_gemm_flops(ins) -> float | None:
    """A ``tpu_custom_call`` that is a grouped matrix product (``ragged_dot``'s ``ragged-dot-*``
    kernel: its name or op_name), its cost estimate's flops; None otherwise."""
    if ins.opcode != "custom-call" or hlotext.call_target(ins.rest) != "tpu_custom_call":
        return None
    if "ragged-dot" not in ins.name + " " + hlotext.op_name(ins.rest):
        return None
    m = _ESTIMATE.search(ins.rest)
    return float(m.group(1)) if m else None


def is_cudnn_attention(ins) -> bool:
    """Whether ``ins`` (an instruction with ``opcode`` and ``rest``) calls cuDNN's attention."""
    return ins.opcode == "custom-call" and bool(_CUDNN.search(hlotext.call_target(ins.rest)))


def cudnn_flops(ins) -> float | None:
    """The products one cuDNN attention call computes (the module's docstring); None when ``ins``
    is not one or its shapes cannot be read."""
    if not is_cudnn_attention(ins):
        return None
    layouts = _braced(ins.rest, _LAYOUTS)
    shapes = [dims for _, dims in hlotext.arrays(layouts or "")]
    if len(shapes) < 2 or len(shapes[0]) != 4 or len(shapes[1]) != 4:
        return None
    (b, tq, h, d), tk = shapes[0], shapes[1][1]
    flops = 4.0 * b * h * tq * tk * d
    if _CAUSAL.search(ins.rest):
        flops /= 2
    if "backward" in hlotext.call_target(ins.rest).lower():
        flops *= CUDNN_BACKWARD_FACTOR
    return flops


def kernel_flops(text: str, runs: dict[str, int]) -> float:
    """The fused attention kernels' flops over one step: each call's ``splash_flops`` or
    ``cudnn_flops`` times the runs of its computation (``hlo.executions``). ``text``:
    instructions on one line (``hlotext.joined``)."""
    total = 0.0
    for comp, ins in hlotext.instructions(text):
        flops = splash_flops(ins) or cudnn_flops(ins)
        if flops:
            total += flops * runs.get(comp, 1)
    return total
