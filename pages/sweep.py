"""Sweep: a grid of widths x batches x policies at the sidebar's other settings."""

import itertools
import sys
import time
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from pages import _running, _shared, _sidebar  # noqa: E402
from remat_lab import charts, tables  # noqa: E402
from remat_lab.config import ConfigError, human_bytes  # noqa: E402
from remat_lab.experiment import ExecutionError  # noqa: E402
from remat_lab.policies import POLICIES  # noqa: E402

cfg = _shared.page_start("Sweep", "Widths × batches × policies; model, seq, depth, dtype, objective "
                                  "and repeats come from the sidebar.")
ss = st.session_state
c1, c2 = st.columns(2)
widths = c1.multiselect("Widths", _sidebar.POW2_WIDTHS, default=[64, 256], key="sweep_widths")
batch_opts = ([0] if cfg.model == "mlp" else []) + _sidebar.POW2_BATCHES
batches = c2.multiselect("Batches", batch_opts, default=[16, 64], key="sweep_batches",
                         format_func=lambda b: "single vector" if b == 0 else str(b))
policies = st.multiselect("Policies", list(POLICIES), key="sweep_policies",
                          default=["no_remat", "nothing_saveable", "dots_with_no_batch_dims_saveable"],
                          format_func=_sidebar.policy_label)
grid = [cfg.replace(width=w, batch=b, policy=p)
        for w, b, p in itertools.product(sorted(widths), sorted(batches), policies)]
too_big = {(c.width, c.batch): over for c in grid if (over := _sidebar.over_budget(c))}
if too_big:  # refused before the button, so a click never ends in an error
    budget = human_bytes(next(iter(too_big.values()))[1])
    sizes = ", ".join(f"width {w} × batch {b} ({human_bytes(need)})" for (w, b), (need, _) in too_big.items())
    st.warning(f"**Left out of the sweep:** {sizes}: over the memory budget of {budget} on this "
               "server. Choose smaller widths or batches (or a lower seq or depth in the sidebar).",
               icon=":material/memory:")
    grid = [c for c in grid if (c.width, c.batch) not in too_big]
a, b = st.columns([1, 4])
start = a.button(f"Run sweep ({len(grid)} run{'' if len(grid) == 1 else 's'})", key="sweep_run",
                 type="primary", disabled=not grid)
if b.button("Clear results", key="sweep_clear"):
    ss["sweep_rows"], ss["sweep_total"] = [], 0

if start:
    ss["sweep_rows"], ss["sweep_total"], ss["sweep_errors"] = [], len(grid), []
    bar = st.progress(0.0, text=f"0 of {len(grid)} runs done")
    t0 = time.perf_counter()
    with st.status(f"Sweeping {len(grid)} configurations…", expanded=False) as status:
        for i, c in enumerate(grid, 1):
            try:
                result = _running.run_config(c, status, prefix=f"{i}/{len(grid)} w{c.width} "
                                                               f"b{c.batch} {c.policy}: ")
                ss["sweep_rows"].append(tables.summary_row(result))  # kept if interrupted
            except (ConfigError, ExecutionError) as err:
                ss["sweep_errors"].append(f"width {c.width}, batch {c.batch}, {c.policy}: {err}")
            spent = time.perf_counter() - t0
            bar.progress(i / len(grid), text=f"{i} of {len(grid)} runs done · about "
                                             f"{spent / i * (len(grid) - i):.0f} s left")
        status.update(label=f"Done: sweep of {len(grid)} configurations", state="complete")

rows = ss.get("sweep_rows", [])
for text in ss.get("sweep_errors", []):
    st.error(text)
if not rows:
    st.info("Choose the grid and click **Run sweep**. Completed rows appear here and stay "
            "if the sweep is interrupted.")
    st.stop()
if len(rows) < ss.get("sweep_total", 0):
    st.warning(f"Partial sweep: {len(rows)} of {ss['sweep_total']} runs completed.")
df = pd.DataFrame(rows, columns=tables.SUMMARY_COLUMNS)

for x in ("width", "batch"):
    left, right = st.columns(2)
    left.plotly_chart(charts.make_sweep_figure(df, x, "median_ms", "step time (ms)"), width="stretch")
    right.plotly_chart(charts.make_sweep_figure(df, x, "peak_mib", "peak memory (MiB)"),
                       width="stretch")
if "no_remat" in set(df["policy"]):
    st.subheader("Relative to no_remat")
    st.caption("Each cell: the policy's value divided by no_remat's at the same width and batch. "
               "Red is more, blue is less. **Grey cells are within the noise**: for step time the "
               "two p25–p75 ranges of the timed runs overlap; memory is deterministic, so only an "
               "identical value is grey.")
    st.plotly_chart(charts.make_relative_heatmap_figure(tables.relative_frame(df, "median_ms"),
                                                        "Step time relative to no_remat"),
                    width="stretch")
    st.plotly_chart(charts.make_relative_heatmap_figure(tables.relative_frame(df, "peak_bytes"),
                                                        "Peak memory relative to no_remat"),
                    width="stretch")
else:
    st.caption("Add no_remat to the policies to see each policy relative to it.")

st.subheader("Sweep results")
st.caption("Recomputation, compiled first: the products and GFLOP the compiled program has beyond "
           "the no_remat compile of the same configuration (what XLA really recomputes); then what "
           "the backward jaxpr recomputes before XLA optimises it.")
same = [f"{k} {df[k].iloc[0]}" if k in ("seq", "depth") else str(df[k].iloc[0])
        for k in ("model", "seq", "depth", "dtype", "objective") if df[k].nunique() == 1
        and not (k == "seq" and df["model"].iloc[0] == "mlp")]
if same:
    st.caption(f"Every row: {', '.join(same)}.")
MS = st.column_config.NumberColumn
SHOWN = ["policy", "width", "batch", "model", "seq", "depth", "dtype", "objective",
         "median_ms", "p25_ms", "p75_ms", "peak_mib", "temp_mib", "residual_mib",
         "compiled_recomputed_products", "compiled_recomputed_gflop", "dots_recomputed",
         "recompute_gflop", "dots_saved", "grad_ok", "compile_s"]
SHOWN = [c for c in SHOWN if c not in ("model", "seq", "depth", "dtype", "objective")
         or df[c].nunique() > 1]  # the settings every row shares are in the caption above
st.dataframe(df, hide_index=True, width="stretch", column_order=SHOWN, column_config={
    "median_ms": MS("median (ms)", format="%.4f"), "p25_ms": MS("p25 (ms)", format="%.4f"),
    "p75_ms": MS("p75 (ms)", format="%.4f"), "peak_mib": MS("peak (MiB)", format="%.3f"),
    "temp_mib": MS("temp (MiB)", format="%.3f"), "residual_mib": MS("residuals (MiB)", format="%.3f"),
    "compiled_recomputed_products": MS("recomputed products (compiled)", format="%d"),
    "compiled_recomputed_gflop": MS("recomputed GFLOP (compiled)", format="%.4f"),
    "dots_saved": MS("dots saved (jaxpr)", format="%d"),
    "dots_recomputed": MS("dots recomputed (jaxpr)", format="%d"),
    "recompute_gflop": MS("recomputed GFLOP (jaxpr)", format="%.4f"),
    "grad_ok": st.column_config.CheckboxColumn("grad check"),
    "compile_s": MS("compile (s)", format="%.2f")})
st.download_button("Download CSV", tables.export_frame(df).to_csv(index=False), "remat_lab_sweep.csv",
                   "text/csv", key="sweep_csv")
