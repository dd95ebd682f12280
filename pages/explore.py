"""Explore: one configuration in depth (metrics, charts, per-dot and residual tables, code)."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _shared  # noqa: E402
from remat_lab import charts, tables  # noqa: E402
from remat_lab.config import human_bytes  # noqa: E402

cfg = _shared.page_start("Explore", "One configuration: how fast, how much memory, and which "
                                    "products the backward pass saves or recomputes.")
result = _shared.run_one(cfg, keep_texts=False, button_key="explore_run")
if result is None:
    st.stop()

st_ = result["step_time_s"]
mem = result["memory"] or {}
tot = result["totals"]
grad = result["gradient_check"]
cols = st.columns([1, 1, 1, 1.5, 1, 1])
cols[0].metric("Median step time", f"{st_['median'] * 1e3:.3f} ms",
               help=f"{st_['repeats']} timed runs after {st_['warmup']} warm-up")
cols[0].caption(f"p25–p75: {st_['p25'] * 1e3:.3f}–{st_['p75'] * 1e3:.3f} ms")
cols[1].metric("Peak memory", human_bytes(mem["peak_bytes"]) if mem else "n/a",
               help="generated_code + argument + output − alias + temp (XLA memory analysis)")
cols[1].caption(f"temp {human_bytes(mem.get('temp_bytes', 0))}" if mem else "no memory analysis")
cols[2].metric("Residual bytes", human_bytes(tot["residual_bytes"]),
               help="Values kept from the forward pass for the backward pass (arguments included)")
cols[2].caption(f"host {human_bytes(tot['residual_host_bytes'])}")
cols[3].metric("Dots saved / recomputed", f"{tot['dots_saved']} / {tot['dots_recomputed']}",
               help="Forward dot_generals whose result is saved vs recomputed in the backward jaxpr")
cols[3].caption(f"{tot['dots_recomputed_in_compiled']} recomputed in the compiled program")
cols[4].metric("Gradient check", "ok" if grad["ok"] else "MISMATCH",
               help=f"vs {grad['reference']}: max rel err {grad['max_rel_err']:.2g}")
cols[4].caption(f"max rel err {grad['max_rel_err']:.2g}")
cols[5].metric("Compile time", f"{result['compile']['compile_s']:.2f} s")
cols[5].caption(f"lower {result['compile']['lower_s']:.2f} s")

left, right = st.columns(2)
left.plotly_chart(charts.make_step_time_figure(tables.samples_frame(result)), width="stretch")
right.plotly_chart(charts.make_memory_figure(tables.memory_frame([result])), width="stretch")
left, right = st.columns(2)
left.plotly_chart(charts.make_residuals_figure(tables.residual_layer_kind_frame(result)),
                  width="stretch")
with right:
    st.subheader("Discrepancy notes")
    notes = [f"Dot {d['index']} ({d['layer']}): {d['note']}" for d in result["dots"] if d["note"]]
    notes += result["notes"]
    for note in notes:
        st.info(note)
    if not notes:
        st.success("The jaxpr and the compiled program agree on every dot.")

CHECK = st.column_config.CheckboxColumn
st.subheader("Per-dot table")
st.caption("Every dot_general of the forward pass and what the policy does with its result.")
st.dataframe(tables.dots_frame(result), hide_index=True, width="stretch", column_config={
    "index": "dot", "has_batch_dims": CHECK("batch dims"), "saved": CHECK("saved"),
    "offloaded": CHECK("offloaded"), "recomputed": CHECK("recomputed"),
    "recomputed_in_compiled": CHECK("recomputed in HLO"),
    "policy_verdict": "policy verdict",
    "flops": st.column_config.NumberColumn("flops", format="%d"),
    "out_bytes": st.column_config.NumberColumn("output", format="bytes"),
    "note": st.column_config.TextColumn("note", width="large")})

st.subheader("Residual table")
st.caption("What the forward pass keeps for the backward pass.")
st.dataframe(tables.residuals_frame(result), hide_index=True, width="stretch", column_config={
    "index": "#", "bytes": st.column_config.NumberColumn("bytes", format="bytes"),
    "memory_kind": "memory", "source": st.column_config.TextColumn("source", width="large")})

st.subheader("Reproduce this configuration")
st.code(_shared.reproduce_code(cfg), language="python")
st.code(_shared.cli_command(cfg), language="bash", wrap_lines=True)
