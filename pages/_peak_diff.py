"""Compare's policy diff: two policies' buffers at their memory peaks side by side, and the difference."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from remat_lab.config import human_bytes
from remat_lab.present.peak_diff import peak_diff_frame

OTHER_CAPTION = ("Groups are the checkpoint name of the value a buffer holds at the peak, else its "
                 "layer (\"l1 (all layers)\": a scan's stacked buffer, every layer's value in one). "
                 "\"other\" is what has no source in the program's metadata: XLA's copies and "
                 "slices with no name, loop counters, constants. Phases: recomputed only where the "
                 "program does more than no_remat's compile (the witness), else the pass no_remat's "
                 "twin instruction belongs to.")


def _bytes(value) -> str:
    return "" if value is None or pd.isna(value) else human_bytes(value)


def section(timelines: dict, policies: list[str]) -> None:
    """Two selectors (keys ``diff_a``, ``diff_b``) and the diff table of their peaks' buffers."""
    have = [p for p in policies if (timelines.get(p) or {}).get("at_peak")]
    st.subheader("Policy diff at the peak")
    if len(have) < 2:
        st.caption("Two policies with memory timelines are needed for a diff.")
        return
    left, right = st.columns(2)
    a = left.selectbox("policy A", have, index=0, key="diff_a")
    b = right.selectbox("policy B", have, index=1 if have[0] == a else 0, key="diff_b")
    frame = peak_diff_frame(timelines[a], timelines[b])
    total_a, total_b = int(frame["bytes_a"].sum()), int(frame["bytes_b"].sum())
    shown = frame.assign(**{c: frame[c].map(_bytes) for c in ("bytes_a", "bytes_b")},
                         difference=frame["difference"].map(
                             lambda d: ("+" if d > 0 else "−" if d < 0 else "") + human_bytes(abs(d))),
                         buffers=[f"{x} → {y}" for x, y in zip(frame["buffers_a"], frame["buffers_b"])])
    # Headed A and B (named by the two pickers above): policy names as headers are too wide at 1024 px.
    text = st.column_config.TextColumn
    st.dataframe(shown, hide_index=True, width="stretch",
                 column_order=["group", "phase", "bytes_a", "bytes_b", "difference", "buffers"],
                 column_config={"group": text("group", width=110), "bytes_a": text("A", help=a),
                                "bytes_b": text("B", help=b), "difference": text("B − A", help=f"{b} − {a}"),
                                "buffers": text("buffers", help=f"buffers at the peak: {a} → {b}")})
    st.caption(f"Live bytes at each policy's timeline peak: {a} {human_bytes(total_a)}, "
               f"{b} {human_bytes(total_b)} ({'+' if total_b >= total_a else '−'}"
               f"{human_bytes(abs(total_b - total_a))}). " + OTHER_CAPTION)
