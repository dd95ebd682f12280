"""Views of finished results shared by Sweep, History, Advisor and Open results: sweep, one run, a
comparison, an advice."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from pages import _run_tables
from pages._layout import chart_row
from remat_lab.config import RunConfig, human_bytes, human_seconds
from remat_lab.present import advisor_tables, charts, reproduce, tables
from remat_lab.serve import safe_text
from remat_lab.store.results import describe_environment

MS = st.column_config.NumberColumn
SWEEP_SHOWN = ["policy", "width", "batch", "model", "seq", "depth", "dtype", "objective",
               "median_ms", "ci_low_ms", "ci_high_ms", "p25_ms", "p75_ms",
               "peak_mib", "temp_mib", "residual_mib",
               "compiled_recomputed_products", "compiled_recomputed_gflop", "dots_recomputed",
               "recompute_gflop", "dots_saved", "grad_ok", "compile_s"]


def md(text: object) -> str:
    """``text`` from a file or a database, as plain text in Markdown (the one escaping path,
    ``safe_text.escape_markdown``: links, images, HTML, colour and maths shown as typed)."""
    return safe_text.escape_markdown(text)


def environment_line(env: dict | None, what: str = "Measured on") -> None:
    """Which machine made these numbers, in words, above every view of results made elsewhere."""
    st.markdown(f":material/memory: {what} **{md(describe_environment(env))}**"
                + (f" · backend {md(env.get('backend'))}" if env else ""))


def sweep_view(df: pd.DataFrame, key: str) -> None:
    """Lines vs width and batch (each axis the sweep varies: a user block's width is not its own),
    heatmaps relative to no_remat, the table and a CSV download."""
    for x in [x for x in ("width", "batch") if df[x].nunique() > 1] or ["batch"]:
        left, right = st.columns(2)
        left.plotly_chart(charts.make_sweep_figure(df, x, "median_ms", "step time (ms)"),
                          width="stretch", key=f"{key}_{x}_time")
        right.plotly_chart(charts.make_sweep_figure(df, x, "peak_mib", "peak memory (MiB)"),
                           width="stretch", key=f"{key}_{x}_peak")
    if "no_remat" in set(df["policy"]):
        st.subheader("Relative to no_remat")
        st.caption("Each cell: the policy's value divided by no_remat's at the same width and batch. "
                   "Red is more, blue is less, coloured only outside the noise. **Grey cells are within "
                   "the noise**: for step time the two 95 % intervals of the medians overlap (the "
                   "policies of one width and batch are timed interleaved; files without intervals: "
                   "the p25–p75 ranges); memory is deterministic, so only an identical value is grey.")
        for metric, title, quiet in (("median_ms", "Step time", "within noise"),
                                     ("peak_bytes", "Peak memory", "equal")):
            st.plotly_chart(charts.make_relative_heatmap_figure(tables.relative_frame(df, metric),
                                                                f"{title} relative to no_remat",
                                                                quiet_label=quiet),
                            width="stretch", key=f"{key}_{metric}_heat")
    else:
        st.caption("Add no_remat to the policies to see each policy relative to it.")
    st.subheader("Sweep results")
    st.caption("Recomputation, compiled first: the products and GFLOP the compiled program has beyond "
               "the no_remat compile of the same configuration (what XLA really recomputes); then what "
               "the backward jaxpr recomputes before XLA optimises it.")
    fixed = ("model", "seq", "depth", "dtype", "objective")
    same = [f"{k} {df[k].iloc[0]}" if k in ("seq", "depth") else str(df[k].iloc[0])
            for k in fixed if df[k].nunique() == 1 and not (k == "seq" and df["model"].iloc[0] == "mlp")]
    if same:
        st.caption(f"Every row: {', '.join(same)}.")
    shown = [c for c in SWEEP_SHOWN if c not in fixed or df[c].nunique() > 1]
    st.dataframe(df, hide_index=True, width="stretch", column_order=shown, key=f"{key}_table",
                 column_config={
        "median_ms": MS("median (ms)", format="%.4f"), "p25_ms": MS("p25 (ms)", format="%.4f"),
        "ci_low_ms": MS("95 % low (ms)", format="%.4f"), "ci_high_ms": MS("95 % high (ms)", format="%.4f"),
        "p75_ms": MS("p75 (ms)", format="%.4f"), "peak_mib": MS("peak (MiB)", format="%.3f"),
        "temp_mib": MS("temp (MiB)", format="%.3f"), "residual_mib": MS("residuals (MiB)", format="%.3f"),
        "compiled_recomputed_products": MS("recomputed products (compiled)", format="%d"),
        "compiled_recomputed_gflop": MS("recomputed GFLOP (compiled)", format="%.4f"),
        "dots_saved": MS("dots saved (jaxpr)", format="%d"),
        "dots_recomputed": MS("dots recomputed (jaxpr)", format="%d"),
        "recompute_gflop": MS("recomputed GFLOP (jaxpr)", format="%.4f"),
        "grad_ok": st.column_config.CheckboxColumn("grad check"),
        "compile_s": MS("compile (s)", format="%.2f")})
    st.download_button("Download CSV", tables.export_frame(df).to_csv(index=False),
                       "remat_lab_sweep.csv", "text/csv", key=f"{key}_csv")


def error_rows(rows: list[dict]) -> None:
    """Refused and failed configurations of a sweep, as one table."""
    if not rows:
        return
    st.warning(f"{len(rows)} configuration{'' if len(rows) == 1 else 's'} of this sweep "
               f"{'was' if len(rows) == 1 else 'were'} refused or failed; the others are shown.")
    st.dataframe(pd.DataFrame([{"policy": r["config"].get("policy"), "width": r["config"].get("width"),
                                "batch": r["config"].get("batch"), "model": r["config"].get("model"),
                                "what": r["error"]["kind"], "message": r["error"]["message"]}
                               for r in rows]), hide_index=True, width="stretch",
                 column_config={"message": st.column_config.TextColumn("message", width="large")})


def run_view(doc: dict, key: str) -> None:
    """One run as on Explore: headline numbers, its charts, the per-dot and residual tables."""
    stt, mem, tot = doc.get("step_time_s") or {}, doc.get("memory") or {}, doc.get("totals") or {}
    grad, hlo = doc.get("gradient_check") or {}, doc.get("hlo") or {}
    cols = st.columns(4)
    cols[0].metric("Median step time", human_seconds(stt["median"]) if stt else "not timed")
    cols[1].metric("Peak memory", human_bytes(mem["peak_bytes"]) if mem else "n/a")
    cols[2].metric("Saved / recomputed", f"{tot.get('dots_saved', '-')} / {tot.get('dots_recomputed', '-')}")
    cols[3].metric("Gradient check", {True: "ok", False: "MISMATCH"}.get(grad.get("ok"), "not run"))
    if isinstance(doc.get("target"), dict):  # compiled for a named target: nothing was run
        timing = doc.get("timing") or {}
        est, pred = timing.get("estimate_s"), timing.get("predicted_s")
        st.caption(f"Compiled for {md(doc['target'].get('name'))} without the device: no step time "
                   "was measured, no gradients checked"
                   + (f"; predicted step time {human_seconds(pred)}" if pred else "")
                   + (f"; roofline bound {human_seconds(est)} ("
                      + ("over the prediction: its memory term counts bytes the chip keeps on chip"
                         if pred and est > pred else "a lower bound, not a measurement") + ")."
                      if est else "."))
    if hlo.get("identical_to"):
        st.caption(f"Same compiled program as {safe_text.escape_markdown(hlo['identical_to'])}.")
    _run_tables.run_charts(doc, key)
    timeline = doc.get("memory_timeline") or {}
    if timeline.get("points") or timeline.get("by_phase"):
        try:
            fig = charts.make_timeline_figure(tables.timeline_frame(doc), timeline.get("peak_index"),
                                              timeline.get("peak_live_bytes"))
        except Exception:  # noqa: BLE001 - an uploaded timeline is nested data of any shape
            st.caption("The memory timeline in this document could not be read; the rest is shown.")
        else:
            st.plotly_chart(fig, width="stretch", key=f"{key}_timeline")
    st.subheader("Per-dot table")
    _run_tables.dots_table(doc, key)
    st.subheader("Residual table")
    _run_tables.residuals_table(doc, key)
    cfg = RunConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc["config"].items()})
    st.caption("Run it again here or on another machine:")
    st.code(reproduce.cli_command(cfg), language="bash", wrap_lines=True)


def compare_frame(rows: list[dict]) -> pd.DataFrame:
    """A comparison's rows with the columns the Compare charts read (ms, MiB)."""
    frame = pd.DataFrame(rows)
    for col in ("median", "ci_low", "ci_high"):
        frame[f"{col}_ms"] = frame[f"{col}_s"] * 1e3
    frame["peak_mib"] = frame["peak_bytes"] / tables.MIB
    return frame


def compare_view(doc: dict, key: str) -> None:
    """A comparison as on Compare policies: the verdict, time with intervals, memory, Pareto, table."""
    frame = compare_frame(doc["rows"])
    front = doc.get("pareto_reason") or f"Pareto front: {', '.join(map(str, doc['pareto'])) or '-'}."
    st.info(f"{md(doc['fastest_reason'])} {md(front)}")
    left, right, below = chart_row(f"{key}_charts", 3, min_px=420)
    left.plotly_chart(charts.make_time_bars_figure(frame), width="stretch", key=f"{key}_time")
    mem_docs = [{"config": {"policy": r["policy"]}, "memory": r} for r in doc["rows"]
                if all(isinstance(r.get(f"{p}_bytes"), int | float) for p in tables.MEMORY_PARTS)
                and r.get("peak_bytes") is not None]
    right.plotly_chart(charts.make_memory_figure(tables.memory_frame(mem_docs)), width="stretch",
                       key=f"{key}_memory")
    below.plotly_chart(charts.make_pareto_figure(frame, frame["pareto"].astype(bool)), width="stretch",
                       key=f"{key}_pareto")
    shown = ["policy", "median_ms", "ci_low_ms", "ci_high_ms", "peak_mib", "same_program_as",
             "fastest", "pareto"]
    st.dataframe(frame[[c for c in shown if c in frame]], hide_index=True, width="stretch",
                 key=f"{key}_table", column_config={
                     "median_ms": MS("median (ms)", format="%.4f"),
                     "ci_low_ms": MS("95 % low (ms)", format="%.4f"),
                     "ci_high_ms": MS("95 % high (ms)", format="%.4f"),
                     "peak_mib": MS("peak (MiB)", format="%.3f")})
    for f in doc.get("failed") or []:
        if isinstance(f, dict):
            st.error(f"XLA failed for {md(f.get('policy'))}: {md(f.get('error'))}")


def json_lines(docs: list[dict]) -> str:
    """Documents as a JSON-lines file (what ``sweep --out`` writes; Open results reads it)."""
    return "".join(json.dumps(d) + "\n" for d in docs)


def advice_view(doc: dict, key: str) -> None:
    """An advice as on the Advisor page: the recommendation, the notes, the probes against the budget,
    examples per second at each largest batch, and the policy table."""
    frame = tables.advice_frame(doc)
    lines = advisor_tables.decision_lines(doc)  # the decision summary, first (older files: none)
    if doc.get("recommended"):
        why = lines[0].removeprefix("Decision: ") if (doc.get("decision") or {}).get("pick") else ""
        st.success(f"**Recommended: {md(doc['recommended'])}.** {md(doc['reason'])}."
                   + (f"  \n{md(why)}" if why else ""), icon=":material/recommend:")
    else:
        st.warning(md(doc["reason"]) + ".")
    for line in lines[1:]:  # what this backend cannot show
        st.caption(md(line))
    said = set((doc.get("decision") or {}).get("cannot_show") or [])  # each sentence once
    for note in doc.get("notes") or []:
        if note not in said:
            st.caption(md(note))
    budget = doc["budget_bytes"]
    left, right = chart_row(f"{key}_charts", 2, min_px=420)
    left.plotly_chart(charts.make_advice_peak_figure(tables.advice_probes_frame(doc), budget / tables.MIB),
                      width="stretch", key=f"{key}_peaks")
    left.caption("Each point is one compile-only probe of a policy at a batch (hollow: over the budget); "
                 "the diamond is the policy's largest batch that fits. Peak = XLA's compiled memory "
                 "analysis (generated code + arguments + outputs − aliases + temp) of the device program.")
    if doc.get("timed"):
        right.plotly_chart(charts.make_advice_throughput_figure(frame, doc.get("recommended")),
                           width="stretch", key=f"{key}_rates")
        peak = doc.get("peak_flops_per_s")
        right.caption("Bars: the 95 % bootstrap interval of each policy's examples per second, timed "
                      "interleaved at its largest batch; the outlined bar is the recommendation."
                      + (f" MFU and HFU below are over this machine's peak of {peak / 1e9:,.0f} GFLOP/s "
                         f"({md(doc.get('peak_source'))})." if peak else ""))
    else:
        right.info("Not timed: sizes only (examples per second, MFU and HFU need timing).")
    st.subheader("Policy table")
    st.dataframe(advisor_tables.advice_display_frame(doc), hide_index=True, width="stretch",
                 key=f"{key}_table")
    st.caption("Each number to its precision (examples/s and milliseconds to three significant "
               "figures); blank where there is no number. MFU = model flops (the llm: MaxText's count, "
               "attention causal; other models: the no_remat program's) / step time / peak; HFU = this "
               "program's flops (recomputation included) / step time / peak; recompute overhead = "
               "hardware flops / model flops − 1.")
    search = (doc.get("method") or {}).get("search")
    st.caption(f"Budget {human_bytes(budget)} ({md(doc.get('budget_source', 'given'))})."
               + (f" The search: {md(search)}." if search else "")
               + " Sizes in binary units; the downloads have exact bytes.")
