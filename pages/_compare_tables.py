"""Compare's tables, each in views narrow enough for a 1024 px window: what each policy holds at its
peak, and the policy table (time, memory, recomputation, verdicts).

A policy's name takes about 220 px; a view adds at most four short columns to it, so that no table
scrolls sideways in the 560 px a 1024 px window leaves beside the sidebar. The table's frame holds
every column (the CSV and the tests read it); a view is a column order.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from remat_lab.config import human_bytes
from remat_lab.present import tables

NUM, TEXT, CHECK = st.column_config.NumberColumn, st.column_config.TextColumn, st.column_config.CheckboxColumn
POLICY_VIEWS = {
    "time": ["policy", "median_ms", "ci_low_ms", "ci_high_ms"],
    "memory": ["policy", "peak", "temp", "residuals"],
    "recomputation": ["policy", "excess_dots_vs_no_remat", "excess_flops_vs_no_remat", "dots_recomputed",
                      "recompute_flops"],
    "verdicts": ["policy", "fastest", "pareto", "grad_ok", "same_program_as"],
}
HOLDING_VIEWS = ["largest buffers", "by phase"]


def size(value) -> str:
    return "-" if value is None or pd.isna(value) else human_bytes(value)


def holdings_table(held: pd.DataFrame) -> None:
    """What each policy holds at its timeline's peak: its largest buffers, or its bytes by phase (one
    row per policy and phase: six phases side by side would not fit)."""
    view = st.segmented_control("At each policy's peak", HOLDING_VIEWS, default=HOLDING_VIEWS[0],
                                key="compare_holdings_view") or HOLDING_VIEWS[0]
    if view == "by phase":
        long = held.melt(id_vars=["policy", "peak_live_bytes"], var_name="phase", value_name="bytes",
                         value_vars=[f"{p}_bytes" for p in tables.PHASES])
        long = long[long["bytes"] > 0].assign(phase=lambda d: d["phase"].str.removesuffix("_bytes"))
        long = long.assign(share=long["bytes"] / long["peak_live_bytes"], size=long["bytes"].map(size))
        order = {p: i for i, p in enumerate(held["policy"])}
        long = long.sort_values(["policy", "bytes"], key=lambda c: c.map(order) if c.name == "policy" else -c)
        st.dataframe(long[["policy", "phase", "size", "share"]], hide_index=True, width="stretch",
                     key="compare_holdings", column_config={
                         "share": NUM("of the peak", format="percent")})
        return
    phases = [f"{p}_bytes" for p in tables.PHASES if held[f"{p}_bytes"].any()]  # zero everywhere: left out
    shown = held[["policy", "peak_live_bytes", "peak_at", *phases, "largest"]]
    shown = shown.assign(**{c: shown[c].map(size) for c in ["peak_live_bytes", *phases]})
    st.dataframe(shown, hide_index=True, width="stretch", key="compare_holdings",
                 column_order=["policy", "peak_live_bytes", "peak_at", "largest"], column_config={
                     "peak_live_bytes": TEXT("peak (live)"),
                     "peak_at": NUM("peak at", format="percent", help="where in the program"),
                     "largest": TEXT("largest buffers", width=170,
                                     help="the three largest buffers at the peak: size, phase, where")})


def policy_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Compare's rows with the columns the policy table shows (sizes as text in binary units)."""
    return pd.DataFrame({
        "policy": frame["policy"], "same_program_as": frame["same_program_as"].fillna(""),
        "median_ms": frame["median_ms"], "ci_low_ms": frame["ci_low_ms"], "ci_high_ms": frame["ci_high_ms"],
        "fastest": frame["fastest"], "pareto": frame["pareto"],
        "peak": frame["peak_bytes"].map(size), "temp": frame["temp_bytes"].map(size),
        "residuals": frame["residual_bytes"].map(size),
        "excess_dots_vs_no_remat": frame["excess_dots_vs_no_remat"],
        "excess_flops_vs_no_remat": frame["excess_flops_vs_no_remat"],
        "dots_recomputed": frame["dots_recomputed"], "recompute_flops": frame["recompute_flops"],
        "grad_ok": frame["grad_ok"]})


def policy_table(frame: pd.DataFrame) -> None:
    """The policy table in one of ``POLICY_VIEWS``."""
    view = st.segmented_control("Columns", list(POLICY_VIEWS), default="time",
                                key="compare_table_view") or "time"
    st.dataframe(policy_frame(frame), hide_index=True, width="stretch", column_order=POLICY_VIEWS[view],
                 key="compare_table", column_config={
        "same_program_as": TEXT("same program as", width=110,
                                help="the same compiled program (equal fingerprints of the HLO)"),
        "median_ms": NUM("median (ms)", format="%.4f"),
        "ci_low_ms": NUM("95 % low", format="%.4f", help="the 95 % interval of the median, ms"),
        "ci_high_ms": NUM("95 % high", format="%.4f", help="the 95 % interval of the median, ms"),
        "fastest": CHECK("fastest"), "pareto": CHECK("Pareto"), "grad_ok": CHECK("grad check"),
        "peak": "peak", "temp": "temp", "residuals": "residuals",
        "excess_dots_vs_no_remat": NUM("XLA dots", format="%d", help="matrix products the compiled "
                                       "program has beyond no_remat's: what it really recomputes"),
        "excess_flops_vs_no_remat": NUM("XLA flops", format="compact",
                                        help="flops of the compiled program beyond no_remat's"),
        "dots_recomputed": NUM("jaxpr dots", format="%d",
                               help="dots the policy recomputes in the jaxpr, before XLA optimises"),
        "recompute_flops": NUM("jaxpr flops", format="compact",
                               help="flops of the dots recomputed in the jaxpr")})
