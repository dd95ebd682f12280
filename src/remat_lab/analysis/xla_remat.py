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
           unlimited: dict | None = None) -> dict:
    """``{"applied", "instructions", "extra_flops", "from_bytes", "to_bytes", "method"}`` of a
    compile in which XLA's pass added ``instructions`` (``len(rematerialized(text))``).

    ``unlimited``: ``{"flops", "peak_bytes"}`` of the same program compiled with the limit lifted
    (needed only when the pass ran); ``from_bytes`` is that compile's peak (what the program needs
    as the policy wrote it), ``to_bytes`` this one's, ``extra_flops`` what XLA's recomputation
    adds (None when unknown)."""
    out = {"applied": instructions > 0, "instructions": instructions,
           "extra_flops": 0.0 if not instructions else None, "from_bytes": None, "to_bytes": None,
           "method": METHOD}
    if instructions and unlimited is not None:
        if flops is not None and unlimited.get("flops") is not None:
            out["extra_flops"] = max(float(flops) - float(unlimited["flops"]), 0.0)
        out["from_bytes"], out["to_bytes"] = unlimited.get("peak_bytes"), peak_bytes
    return out


def sentence(found: dict, human_flops) -> str | None:
    """What to say next to a number whose program XLA rematerialized, or None."""
    if not found or not found.get("applied"):
        return None
    extra = found.get("extra_flops")
    what = f"a further {human_flops(extra)} flops" if extra else "values"
    text = f"XLA recomputed {what} to fit: the policy alone does not fit"
    if found.get("from_bytes") and found.get("to_bytes"):
        text += (f" (XLA's pass took the peak from {found['from_bytes'] / 2**30:.2f} GiB to "
                 f"{found['to_bytes'] / 2**30:.2f} GiB)")
    return text
