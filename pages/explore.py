"""Explore: one configuration in depth (metrics, charts, per-dot and residual tables, code)."""

import contextlib
import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402
from streamlit.errors import StreamlitPageNotFoundError  # noqa: E402

from pages import _compile_log, _llm_views, _mesh, _run_tables, _running, _shared, _sidebar  # noqa: E402
from remat_lab.config import LOCAL, human_bytes, human_seconds, mfu_text  # noqa: E402
from remat_lab.present import charts, dot_tables, reproduce, tables  # noqa: E402
from remat_lab.present.peak_diff import versus_no_remat  # noqa: E402
from remat_lab.present.target_charts import target_name  # noqa: E402
from remat_lab.present.timeline_charts import PHASES_CAPTION  # noqa: E402


def _sig3(value: float, units: list[tuple[float, str]]) -> str:
    """``value`` in the unit that keeps it under 1000, with 3 significant digits (cards are narrow)."""
    scale, unit = units[0]
    for s, u in units[1:]:
        if abs(value) / scale < 1000:
            break
        scale, unit = s, u
    v = value / scale
    text = f"{v:.2f}" if abs(v) < 1 else (f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}")
    return f"{text} {unit}".rstrip()


def short_bytes(n: float) -> str:
    return _sig3(n, [(1, "B"), (1 << 10, "KiB"), (1 << 20, "MiB"), (1 << 30, "GiB"), (1 << 40, "TiB")])


def short_seconds(s: float) -> str:
    return _sig3(s, [(1e-9, "ns"), (1e-6, "µs"), (1e-3, "ms"), (1, "s")])


def short_flops(f: float) -> str:
    return _sig3(f, [(1, ""), (1e3, "k"), (1e6, "M"), (1e9, "G"), (1e12, "T")])


cfg = _shared.page_start("Explore", "One configuration: how fast, how much memory, and which "
                                    "products the backward pass saves or recomputes.")
with contextlib.suppress(StreamlitPageNotFoundError):  # a page run alone has no Start page to link
    st.page_link("pages/begin.py", icon=":material/flag:", label="Training a published LLM on GPUs "
                 "or TPUs you rent? Start here: the model and the accelerators, then the policy and batch.")
ON = {"gpu": "h100", "tpu": "tpu-v5e"}  # one click to the same configuration compiled for each
others = [t for t in (LOCAL, *ON.values()) if t != cfg.target][:2]
with st.container(horizontal=True):
    for t in others if not _sidebar.over_budget(cfg) else []:  # over budget: the sidebar's flag only
        st.button(f"Compile this for {target_name(t)}" if t != LOCAL else "Run this locally",
                  key=f"explore_on_{t}", on_click=st.session_state.__setitem__, args=("target", t),
                  icon=":material/memory:" if t != LOCAL else ":material/play_arrow:")
result = _running.run_one(cfg, keep_texts=False, button_key="explore_run")
if result is None:
    st.stop()
tgt, timing, name = result.get("target") or {}, result.get("timing") or {}, target_name(cfg.target)
est = timing.get("estimate") or {}
if tgt:
    st.info(f"**Compiled for {name}** ({tgt['device_kind']}, {human_bytes(tgt['memory_bytes'])} per "
            "device) without the device: the memory, the per-dot table and the timeline are the "
            "compiled program's. Nothing ran, so no step time was measured and the gradients were not "
            "checked. " + (f"The step time shown is a **prediction** ({timing.get('prediction_basis')}), "
                           "with the roofline **bound** beside it."
                           if timing.get("predicted_s") else
                           f"The time shown is a roofline **bound**: {timing.get('estimate_basis')}."),
            icon=":material/memory:")
elif cfg.compile_only:
    st.info(_llm_views.COMPILE_ONLY_NUMBERS, icon=":material/memory:")
    name = "this machine (compile only)"  # nothing ran here either

st_ = result["step_time_s"]
mem = result["memory"] or {}
tot = result["totals"]
grad = result["gradient_check"]
roof = result.get("roofline") or {}
hlo = result.get("hlo") or {}
# Three cards a row: at a 1024 px window each card is about 180 px wide, enough for "157 µs".
row1, row2, row3 = st.columns(3), st.columns(3), st.columns(3)
if st_:
    row1[0].metric("Median step time", short_seconds(st_["median"]),
                   help=f"{st_['repeats']} timed runs of the compiled step after {st_['warmup']} warm-up")
    row1[0].caption(f"p25–p75: {human_seconds(st_['p25'])} – {human_seconds(st_['p75'])}")
else:
    row1[0].metric("Measured step time", "none", help=timing.get("reason"))
    row1[0].caption(("not measured: compile only, nothing ran" if cfg.compile_only and not tgt else
                     f"not measured: compiled for {name} without the device")
                    + (f" · predicted {short_seconds(timing['predicted_s'])}, see below"
                       if timing.get("predicted_s") else
                       f" · roofline bound {short_seconds(timing['estimate_s'])}, see below"
                       if timing.get("estimate_s") else ""))
row1[1].metric("Peak memory", short_bytes(mem["peak_bytes"]) if mem else "n/a",
               help="generated_code + argument + output − alias + temp (XLA memory analysis)")
versus_base = versus_no_remat(result)
row1[1].caption((f"temp {human_bytes(mem.get('temp_bytes', 0))}" if mem else "no memory analysis")
                + (f" · {versus_base['peak']}" if versus_base["peak"] else "")
                + (" · bf16 products run in float32 on CPU" if hlo.get("bf16_upcast") else ""))
if (measured := result.get("memory_measured") or {}).get("text"):  # an accelerator's allocator
    row1[1].caption(measured["text"])
row1[2].metric("Activation residuals", short_bytes(tot["activation_residual_bytes"]),
               help="Forward values kept for the backward pass, parameters, the input and zero "
                    "broadcasts (which XLA folds away) left out; those are in the caption")
offload_note = (" · offload is a no-op here" if tot["dots_offloaded"] and not
                tot["dots_offloaded_in_compiled"] else "")
row1[2].caption(f"plus parameters {human_bytes(tot['parameter_residual_bytes'])}, input "
                f"{human_bytes(tot['input_residual_bytes'])}, zero-cost "
                f"{human_bytes(tot['zero_cost_residual_bytes'])} · host in the compiled program "
                f"{human_bytes(tot['residual_host_bytes_in_compiled'])}{offload_note}")

excess = hlo.get("excess_dots_vs_no_remat")
if cfg.policy == "no_remat":
    versus = "this is the no_remat program"
elif hlo.get("identical_to"):
    versus = f"same compiled program as {hlo['identical_to']}"
elif excess is None:
    versus = "not compared with no_remat"
else:
    versus = f"{excess} more than no_remat" if excess >= 0 else f"{-excess} fewer than no_remat"
row2[0].metric("Compiled products", hlo.get("dot_count", "n/a"),
               help="Matrix products (dot, GEMM call) in the optimised program, forward and backward; "
                    "the difference to the no_remat compile is what the policy recomputes")
row2[0].caption(versus)
row2[1].metric("Saved / recomputed", f"{tot['dots_saved']} / {tot['dots_recomputed']}",
               help="Forward dot_generals whose result is saved vs recomputed in the backward jaxpr "
                    "(before XLA optimises; the compiled program may differ)")
row2[1].caption("forward dots, per the jaxpr")
if grad["ok"] is None:  # compiled for a target: nothing ran to check
    row2[2].metric("Gradient check", "skipped" if grad.get("skipped") else "not run",
                   help=grad.get("reason"))
    row2[2].caption(f"not run: {grad.get('reason')}")
else:
    row2[2].metric("Gradient check", "ok" if grad["ok"] else "MISMATCH",
                   help=f"Loss and every gradient leaf vs {grad['reference']}, with bounds from the "
                        f"dtype's precision (rtol {grad['rtol']:.2g}); and the step has remat exactly "
                        "when the policy asks for it. Checked: " + grad.get("scope", "the whole step"))
    loss_err = "no loss (grad)" if grad["loss_err"] is None else f"loss err {grad['loss_err']:.2g}"
    remat = "remat applied" if grad["remat_applied"] else "no remat"
    row2[2].caption(f"grad rel err {grad['grad_max_rel_err']:.2g} · {loss_err} · {remat}"
                    + (f" · checked at batch {c['batch']}, depth {c['depth']} (the whole step's "
                       "reference did not fit the device)" if (c := grad.get("checked")) else ""))

row3[0].metric("Compile time", short_seconds(result["compile"]["compile_s"]),
               help="XLA compile of the step (a persistent-cache hit is fast)")
row3[0].caption(f"lower {human_seconds(result['compile']['lower_s'])}")
_compile_log.compile_details(row3[0], result)  # XLA's own remat and its log lines, on request
flops, base_flops = result.get("flops"), (result.get("baseline") or {}).get("flops")
row3[1].metric("FLOPs per step", short_flops(flops) if flops else "n/a",
               help="XLA's flop count of the compiled step")
row3[1].caption(versus_base["flops"] or "no_remat not compared")
rate = result.get("achieved_flops_per_s")
if tgt:
    pred = timing.get("predicted_s")
    row3[2].metric("Predicted step time", short_seconds(pred) if pred else "none",
                   help=timing.get("prediction_basis"))
    row3[2].caption(("predicted, not measured; " if pred else "no prediction for this target; ")
                    + f"roofline bound {short_seconds(est['estimate_s']) if est.get('estimate_s') else 'n/a'}"
                    f" ({est.get('bound') or 'un'}-bound at {name}'s spec "
                    f"{short_flops(est.get('peak_flops_per_s') or 0)}FLOP/s, "
                    f"{short_bytes(est.get('bandwidth_bytes_per_s') or 0)}/s: "
                    + ("over the prediction: its memory term counts bytes the chip keeps on chip)"
                       if pred and (est.get("estimate_s") or 0) > pred else "at least this)"))
    if mfu := mfu_text(timing):  # both counts of attention, each named
        row3[2].caption(f"MFU: {mfu}")
else:
    row3[2].metric("Achieved FLOP/s", short_flops(rate) if rate else "n/a",
                   help="XLA's flop count of the step / median step time")
    row3[2].caption(f"{100 * roof['achieved_fraction']:.1f} % of the {roof['peak_source']} peak "
                    f"{short_flops(roof['peak_flops_per_s'])}FLOP/s" if roof.get("achieved_fraction")
                    else "peak unknown", help=roof.get("peak_note"))
if grad["ok"] is False:
    st.error("Gradient check failed: " + "; ".join(grad["failures"][:5]))
_llm_views.model_section(cfg, result)  # parameters, optimizer state, memory by kind at the peak

_mesh.explore_section(cfg, result)  # per-device memory and collectives, on a mesh
st.subheader("Per-dot table")
st.caption("Every dot_general of the forward pass: what the policy says, what the backward jaxpr "
           "does, and whether the compiled program still recomputes it; its operands' shapes in "
           "**shapes**, an llm's dozens of dots by **layer and name**.")
_run_tables.dots_table(result, "explore")
notes = dot_tables.note_lines(result) + result["notes"]  # a note of every block's same layer once
st.subheader("Discrepancy notes")
for note in notes:
    st.info(note)
if not notes:
    st.success("The policy's verdicts, the backward jaxpr and the compiled program agree on every dot.")

_run_tables.run_charts(result, "explore", no_time=f"No timed runs: compiled for {name} without running.")

st.subheader("Memory over the program")
timeline = result.get("memory_timeline") or {}
if not (timeline.get("points") or timeline.get("by_phase")):
    st.caption("No memory timeline for this run: " + (timeline.get("reason") or "the engine gave none."))
else:
    st.caption("Live bytes at each instruction of XLA's schedule of the step, stacked by what the "
               "live values are: parameters, outputs, forward activations, recomputed values and "
               "backward temporaries. Below: the buffers live at the peak, largest first. "
               + PHASES_CAPTION)
    st.plotly_chart(charts.make_timeline_figure(tables.timeline_frame(result), timeline.get("peak_index"),
                                                timeline.get("peak_live_bytes")), width="stretch")
    _run_tables.at_peak_table(result, "explore")
    if timeline.get("note"):
        st.caption(timeline["note"])

if roof.get("arithmetic_intensity") and roof.get("achieved_flops_per_s"):
    st.subheader("Roofline")
    st.caption(f"The step against this machine's measured roofs ({roof['peak_source']}: the best "
               "jitted float32 matmul and a jitted copy). Arithmetic intensity is XLA's flops over "
               f"its bytes accessed; this step is {roof['bound']}-bound.")
    point = pd.DataFrame([{"policy": cfg.policy, "arithmetic_intensity": roof["arithmetic_intensity"],
                           "achieved_flops_per_s": roof["achieved_flops_per_s"]}])
    st.plotly_chart(charts.make_roofline_figure(point, roof["peak_flops_per_s"],
                                                roof["bandwidth_bytes_per_s"]), width="stretch")

st.subheader("Residual table")
st.caption("What the forward pass keeps for the backward pass, and where (device or host memory).")
_run_tables.residuals_table(result, "explore")

st.subheader("Reproduce this configuration")
if cfg.model != "llm":  # reproduce.py knows no llm yet: its command line only
    st.code(reproduce.reproduce_code(cfg), language="python")
st.code(reproduce.cli_command(cfg),
        language="bash", wrap_lines=True)
