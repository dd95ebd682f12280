"""Explore: one configuration in depth (metrics, charts, per-dot and residual tables, code)."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _shared  # noqa: E402
from remat_lab import charts, tables  # noqa: E402
from remat_lab.config import human_bytes, human_seconds  # noqa: E402

cfg = _shared.page_start("Explore", "One configuration: how fast, how much memory, and which "
                                    "products the backward pass saves or recomputes.")
result = _shared.run_one(cfg, keep_texts=False, button_key="explore_run")
if result is None:
    st.stop()

st_ = result["step_time_s"]
mem = result["memory"] or {}
tot = result["totals"]
grad = result["gradient_check"]
roof = result.get("roofline") or {}
row1, row2 = st.columns(4), st.columns(4)
row1[0].metric("Median step time", human_seconds(st_["median"]),
               help=f"{st_['repeats']} timed runs of the compiled step after {st_['warmup']} warm-up")
row1[0].caption(f"p25–p75: {human_seconds(st_['p25'])} – {human_seconds(st_['p75'])}")
row1[1].metric("Peak memory", human_bytes(mem["peak_bytes"]) if mem else "n/a",
               help="generated_code + argument + output − alias + temp (XLA memory analysis)")
row1[1].caption(f"temp {human_bytes(mem.get('temp_bytes', 0))}" if mem else "no memory analysis")
row1[2].metric("Residual bytes", human_bytes(tot["residual_bytes"]),
               help="Values kept from the forward pass for the backward pass (arguments included)")
row1[2].caption(f"host {human_bytes(tot['residual_host_bytes'])}")
row1[3].metric("Dots saved / recomputed", f"{tot['dots_saved']} / {tot['dots_recomputed']}",
               help="Forward dot_generals whose result is saved vs recomputed in the backward jaxpr")
row1[3].caption(f"{tot['dots_recomputed_in_compiled']} recomputed in the compiled program")
row2[0].metric("Gradient check", "ok" if grad["ok"] else "MISMATCH",
               help=f"Loss and every gradient leaf vs {grad['reference']} (rtol {grad['rtol']:g})")
row2[0].caption(f"max rel err {grad['max_rel_err']:.2g}")
row2[1].metric("Compile time", human_seconds(result["compile"]["compile_s"]),
               help="XLA compile of the step (a persistent-cache hit is fast)")
row2[1].caption(f"lower {human_seconds(result['compile']['lower_s'])}")
rate = result.get("achieved_flops_per_s")
row2[2].metric("Achieved FLOP/s", f"{rate / 1e9:.1f} G" if rate else "n/a",
               help="XLA's flop count of the step / median step time")
row2[2].caption(f"{100 * roof['achieved_fraction']:.1f} % of peak" if roof.get("achieved_fraction")
                else "peak unknown", help=roof.get("peak_source"))
row2[3].metric("Compiled HLO dots", result["hlo"]["dot_count"],
               help="dot instructions in the optimised program: forward, recomputed, backward")
row2[3].caption(f"{result['hlo']['forward_dots']} forward · {result['hlo']['recomputed_dots']} "
                f"recomputed · {result['hlo']['backward_dots']} backward")

CHECK = st.column_config.CheckboxColumn
st.subheader("Per-dot table")
st.caption("Every dot_general of the forward pass: what the policy says, what the backward jaxpr "
           "does, and whether the compiled program still recomputes it.")
st.dataframe(tables.dots_frame(result), hide_index=True, width="stretch", column_config={
    "index": "dot", "has_batch_dims": CHECK("batch dims"), "saved": CHECK("saved"),
    "offloaded": CHECK("offloaded"), "recomputed": CHECK("recomputed"),
    "recomputed_in_compiled": CHECK("recomputed in HLO"),
    "policy_verdict": "policy verdict",
    "flops": st.column_config.NumberColumn("flops", format="%d"),
    "out_bytes": st.column_config.NumberColumn("output", format="bytes"),
    "note": st.column_config.TextColumn("note", width="large")})
notes = [f"Dot {d['index']} ({d['layer']}): {d['note']}" for d in result["dots"] if d["note"]]
notes += result["notes"]
st.subheader("Discrepancy notes")
for note in notes:
    st.info(note)
if not notes:
    st.success("The policy's verdicts, the backward jaxpr and the compiled program agree on every dot.")

left, mid, right = st.columns(3)
left.plotly_chart(charts.make_step_time_figure(tables.samples_frame(result)), width="stretch")
mid.plotly_chart(charts.make_memory_figure(tables.memory_frame([result])), width="stretch")
right.plotly_chart(charts.make_residuals_figure(tables.residual_layer_kind_frame(result)),
                   width="stretch")

st.subheader("Residual table")
st.caption("What the forward pass keeps for the backward pass, and where (device or host memory).")
st.dataframe(tables.residuals_frame(result), hide_index=True, width="stretch", column_config={
    "index": "#", "bytes": st.column_config.NumberColumn("bytes", format="bytes"),
    "memory_kind": "memory", "source": st.column_config.TextColumn("source", width="large")})

st.subheader("Reproduce this configuration")
st.code(_shared.reproduce_code(cfg), language="python")
st.code(_shared.cli_command(cfg), language="bash", wrap_lines=True)
