"""The compiled program's kernels one by one: each launch's kind, its products' flops and its HBM bytes.

``kernels_of(text)`` walks the computations that run (``traffic``'s walk: the entry, loop bodies
times their trip counts) and gives one row per top-level instruction that launches work:

* ``kind``: ``gemm`` (a library GEMM call, or a fusion holding a ``dot`` / ``convolution``),
  ``attention`` (cuDNN's fused attention, ``__cudnn$fmha*``, or a Pallas splash kernel on a TPU:
  ``direction`` forward or backward),
  ``collective`` (its bytes are priced as collectives, not here), ``other`` (every other kernel:
  element-wise fusions, copies, reductions, slices);
* ``flops``: a GEMM's products (``2 x`` result elements ``x`` contracted size); an attention
  call's products as ``kernel_flops.cudnn_flops`` / ``splash_flops`` count them (causal: about
  half the square);
* ``bytes``: device bytes read and written (``traffic``'s count for the instruction); ``runs``:
  how often it runs per step; ``dtype`` and ``precision`` of a GEMM's products.
"""

from __future__ import annotations

from remat_lab.analysis import collectives, hlo, hlotext, kernel_flops, traffic

_FREE = traffic.FREE
_ASYNC_OPEN = traffic.ASYNC_OPEN


def _fusion_products(module, op) -> tuple[float | None, str, str]:
    """``(flops, dtype, precision)`` of the products inside a fusion (0.0 when none), those of the
    fusions nested in it too (libtpu fuses a product into the fusion of the product it feeds: a
    gated MLP's up projection inside the down projection's)."""
    kernel = (next((c for k, c in hlotext.called(op.rest) if k == "calls"), None)
              if "calls=" in op.rest else None)
    total, dtype, precision = 0.0, "", ""
    for inner in module.comps.get(kernel, []):
        if inner.opcode == "fusion":
            flops, inner_dtype, inner_precision = _fusion_products(module, inner)
            if flops is None:
                return None, dtype, precision
            if flops:
                total += flops
                dtype, precision = dtype or inner_dtype, precision or inner_precision
            continue
        if inner.opcode not in ("dot", "convolution"):
            continue
        flops = traffic.product_flops(module, inner)
        if flops is None:
            return None, dtype, precision
        total += flops
        operand = hlotext.arrays(module.types.get(inner.operands[0], "")) if inner.operands else []
        dtype = dtype or (operand or [("f32", [])])[0][0]
        precision = precision or traffic.precision(inner)
    return total, dtype, precision


def kernels_of(text: str) -> list[dict]:
    """One row per kernel launch site (see the module's docstring), in program order."""
    text = hlotext.joined(text)  # a Pallas kernel's metadata spans lines in libtpu's text
    module = traffic.Module(text)
    runs, _ = hlo.executions(text)
    rows = []
    for comp in module.running():
        times = max(runs.get(comp, 1), 1)
        for op in module.comps[comp]:
            if op.opcode in _FREE or op.opcode.endswith(_ASYNC_OPEN):
                continue
            target = hlotext.call_target(op.rest) if op.opcode == "custom-call" else ""
            if target == "AllocateBuffer":
                continue
            start = op
            if op.opcode.endswith("-done"):
                start = module.ops.get(op.operands[0]) if op.operands else None
                if start is None:
                    continue
            base = start.opcode.removesuffix("-start")
            reads, writes = traffic.moves(module, start, base, start.operands, op.type)
            nbytes = sum(n * (1 - host) for n, host in reads + writes)
            row = {"name": op.name, "runs": times, "bytes": nbytes, "flops": 0.0, "dtype": "",
                   "precision": "", "kind": "other", "direction": ""}
            if base in collectives.KINDS:
                row["kind"] = "collective"
            elif kernel_flops.is_cudnn_attention(op):
                row["kind"] = "attention"
                row["flops"] = kernel_flops.cudnn_flops(op)
                row["direction"] = "backward" if "backward" in target.lower() else "forward"
            elif (splash := kernel_flops.splash_kernel(op)) is not None:
                row.update(kind="attention", flops=kernel_flops.splash_flops(op),
                           direction="forward" if splash == "splash_mha_fwd" else "backward")
            elif (grouped := kernel_flops.estimated_gemm_flops(op)) is not None:
                operand = hlotext.arrays(module.types.get(op.operands[-1], "")) if op.operands else []
                row.update(kind="gemm", flops=grouped, dtype=(operand or [("f32", [])])[0][0],
                           precision="DEFAULT")  # a grouped product (ragged_dot's kernel)
            elif op.opcode == "custom-call" and traffic.is_gemm(op):
                row["kind"] = "gemm"
                row["flops"] = traffic.product_flops(module, op)
                operand = hlotext.arrays(module.types.get(op.operands[0], "")) if op.operands else []
                row["dtype"] = (operand or [("f32", [])])[0][0]
                row["precision"] = traffic.precision(op)
            elif op.opcode in ("fusion", "dot", "convolution"):
                if op.opcode == "fusion":
                    flops, dtype, precision = _fusion_products(module, op)
                else:
                    flops = traffic.product_flops(module, op)
                    operand = hlotext.arrays(module.types.get(op.operands[0], ""))
                    dtype, precision = (operand or [("f32", [])])[0][0], traffic.precision(op)
                if flops is None or flops > 0:
                    row.update(kind="gemm", flops=flops, dtype=dtype, precision=precision)
            rows.append(row)
    return rows
