"""The step time a named target's roofline predicts from the compiled program's flops and bytes.

``estimate_s = max(flops / peak_flops[dtype], bytes_accessed / bandwidth)``: the time the step
would take if it ran at the target's dense peak for its dtype or streamed its bytes at full memory
bandwidth, whichever is slower. A lower bound: real steps also pay kernel launches, communication
and imperfect overlap. Flops and bytes are XLA's, scaled by each loop body's trip count.
"""

from __future__ import annotations

from remat_lab.config import Target

BASIS = ("roofline estimate, not a measurement: max(flops / peak FLOP/s for the dtype, bytes accessed "
         "/ memory bandwidth) with the target's spec figures and XLA's counts for the compiled step")


def estimate_step(flops: float | None, bytes_accessed: float | None, target: Target,
                  dtype: str) -> dict:
    """``{"estimate_s", "compute_s", "memory_s", "bound", "peak_flops_per_s", "bandwidth_bytes_per_s",
    "basis"}``; ``estimate_s`` None when XLA gave no flop count."""
    peak = target.peak_flops.get(dtype)
    compute = flops / peak if flops and peak else None
    memory = bytes_accessed / target.bandwidth_bytes_per_s if bytes_accessed else None
    known = [t for t in (compute, memory) if t is not None]
    estimate = max(known) if known else None
    bound = None if estimate is None else ("compute" if estimate == compute else "memory")
    return {"estimate_s": estimate, "compute_s": compute, "memory_s": memory, "bound": bound,
            "peak_flops_per_s": peak, "bandwidth_bytes_per_s": target.bandwidth_bytes_per_s,
            "basis": BASIS}
