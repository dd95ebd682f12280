"""Policy against policy at the memory peak: two timelines' diff as a frame, a run against no_remat."""

from __future__ import annotations

import pandas as pd

from remat_lab.analysis.peak_diff import peak_diff
from remat_lab.config import human_bytes

DIFF_COLUMNS = ["group", "kind", "phase", "bytes_a", "bytes_b", "difference", "buffers_a", "buffers_b"]


def peak_diff_frame(a: dict | None, b: dict | None) -> pd.DataFrame:
    """``analysis.peak_diff`` of two ``memory_timeline`` documents as a frame (``DIFF_COLUMNS``;
    difference = b - a, largest change first); empty when either has no buffers at its peak."""
    if not (a or {}).get("at_peak") or not (b or {}).get("at_peak"):
        return pd.DataFrame(columns=DIFF_COLUMNS)
    return pd.DataFrame(peak_diff(a, b), columns=DIFF_COLUMNS)


def _signed_bytes(n: int) -> str:
    return ("+" if n > 0 else "−" if n < 0 else "±") + human_bytes(abs(n))


def versus_no_remat(result: dict) -> dict[str, str | None]:
    """``{"peak", "flops"}``: the run's compiled peak and flops against the no_remat compile of
    the same configuration (``result["baseline"]``), e.g. ``"+512 KiB peak vs no_remat"``,
    ``"+33.3 % flops vs no_remat"``; None where either side is missing. A difference that rounds
    to zero at one decimal is written with the digits it needs, never as ``+0 %``."""
    base = result.get("baseline") or {}
    mem = result.get("memory") or {}
    out: dict[str, str | None] = {"peak": None, "flops": None}
    if mem.get("peak_bytes") is not None and base.get("peak_bytes") is not None:
        diff = int(mem["peak_bytes"]) - int(base["peak_bytes"])
        out["peak"] = ("same peak as no_remat" if diff == 0
                       else f"{_signed_bytes(diff)} peak vs no_remat")
    flops, base_flops = result.get("flops"), base.get("flops")
    if flops and base_flops:
        pct = 100 * (flops / base_flops - 1)
        if flops == base_flops:
            out["flops"] = "same flops as no_remat"
        else:
            digits = 1 if abs(pct) >= 0.05 else 4
            out["flops"] = f"{pct:+.{digits}f} % flops vs no_remat"
    return out
