"""Two policies' buffers at their timelines' peaks side by side, grouped by name and kind."""

from __future__ import annotations

from collections import defaultdict


def group_of(buffer: dict) -> str:
    """What a buffer at the peak is grouped under: its checkpoint name, else its layer (``other``
    where it has no source)."""
    return buffer.get("name") or buffer.get("layer") or "other"


def peak_diff(a: dict, b: dict) -> list[dict]:
    """Rows ``{group, kind, phase, bytes_a, bytes_b, difference, buffers_a, buffers_b}`` (difference
    = b - a) over the buffers live at timeline ``a``'s and ``b``'s peaks (``memory_timeline``
    documents), largest change first. Each side's bytes sum to its ``peak_live_bytes``."""
    rows: dict[tuple, dict] = defaultdict(
        lambda: {"bytes_a": 0, "bytes_b": 0, "buffers_a": 0, "buffers_b": 0})
    for side, doc in (("a", a), ("b", b)):
        for buf in (doc or {}).get("at_peak") or []:
            row = rows[(group_of(buf), buf["kind"], buf["phase"])]
            row[f"bytes_{side}"] += int(buf["bytes"])
            row[f"buffers_{side}"] += 1
    out = [{"group": g, "kind": k, "phase": p, **r, "difference": r["bytes_b"] - r["bytes_a"]}
           for (g, k, p), r in rows.items()]
    out.sort(key=lambda r: (-abs(r["difference"]), -max(r["bytes_a"], r["bytes_b"]), r["group"], r["kind"]))
    return out
