"""XLA's own rematerialization, read from the compiled program: did its pass rewrite it, and at what cost.

When a program is over the device's memory, XLA's ``HloRematerialization`` pass (GPU and TPU)
recomputes values instead of keeping them, on its own, whatever the checkpoint policy said. Every
instruction the pass adds is a clone named with the suffix ``.remat`` (``.remat2``, ... on further
clones; XLA's hlo_rematerialization.cc), so the optimized HLO text itself says whether it ran.
What it cost is read from a second compile of the same program with the pass's limit lifted
(``program.analysis_compile.compile_unlimited``): the flops and the peak XLA's pass added.
"""

from __future__ import annotations

import re

from remat_lab.analysis import hlotext

_CLONE = re.compile(r"\.remat\d*$")  # XLA's pass: CloneWithNewOperands(..., suffix "remat")

METHOD = ("instructions named *.remat* in the optimized HLO (the clones XLA's rematerialization "
          "pass adds); what it added: this compile's flops and peak against a second compile with "
          "the pass's memory limit lifted")


def rematerialized(text: str) -> list[str]:
    """The names of the instructions XLA's rematerialization pass added to ``text``."""
    return [ins.name for _, ins in hlotext.instructions(text) if _CLONE.search(ins.name)]


def report(instructions: int, flops: float | None, peak_bytes: int | None,
           unlimited: dict | None = None, device_bytes: int | None = None) -> dict:
    """``{"applied", "instructions", "extra_flops", "from_bytes", "to_bytes", "failed",
    "device_bytes", "method"}`` of a compile in which XLA's pass added ``instructions``
    (``len(rematerialized(text))``).

    ``unlimited``: ``{"flops", "peak_bytes"}`` of the same program compiled with the limit lifted
    (needed only when the pass ran); ``from_bytes`` is that compile's peak (what the program needs
    as the policy wrote it), ``to_bytes`` this one's, ``extra_flops`` what XLA's recomputation
    adds (None when unknown). ``device_bytes``: the device's memory, the most the pass's limit can
    be (XLA's GPU limit is a share of it less the program's inputs and outputs; libtpu's a percent
    of HBM). ``failed``: the pass tried and failed, its peak not under its limit: it did not fall
    (or rose), or stayed over the device's memory (None when either peak is unknown)."""
    out = {"applied": instructions > 0, "instructions": instructions,
           "extra_flops": 0.0 if not instructions else None, "from_bytes": None, "to_bytes": None,
           "failed": False if not instructions else None, "device_bytes": device_bytes,
           "method": METHOD}
    if instructions and unlimited is not None:
        if flops is not None and unlimited.get("flops") is not None:
            out["extra_flops"] = max(float(flops) - float(unlimited["flops"]), 0.0)
        out["from_bytes"], out["to_bytes"] = unlimited.get("peak_bytes"), peak_bytes
    if instructions and out["from_bytes"] and out["to_bytes"]:
        out["failed"] = bool(out["to_bytes"] >= out["from_bytes"]
                             or (device_bytes and out["to_bytes"] > device_bytes))
    return out


def sentence(found: dict, human_flops) -> str | None:
    """What to say next to a number whose program XLA rematerialized, or None: "to fit" only when
    the pass's peak fell and stayed within the device's memory; "tried and failed to fit" else."""
    if not found or not found.get("applied"):
        return None
    extra = found.get("extra_flops")
    what = f"a further {human_flops(extra)} flops" if extra else "values"
    src, dst, device = found.get("from_bytes"), found.get("to_bytes"), found.get("device_bytes")
    if found.get("failed"):
        text = f"XLA recomputed {what}, tried and failed to fit: neither the policy nor XLA's rewrite fits"
    else:
        text = f"XLA recomputed {what} to fit: the policy alone does not fit"
    if src and dst:
        moved = "took the peak from" if dst < src else "did not lower the peak: from" if dst == src \
            else "raised the peak from"
        text += f" (XLA's pass {moved} {src / 2**30:.2f} GiB to {dst / 2**30:.2f} GiB"
        if found.get("failed") and device and dst > device:
            text += f", over the device's {device / 2**30:.2f} GiB"
        text += ")"
    return text
