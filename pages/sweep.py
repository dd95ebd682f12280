"""Sweep: a grid of widths x batches x policies at the sidebar's other settings."""

import itertools
import sys
import time
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from pages import _shared  # noqa: E402
from remat_lab import charts, tables  # noqa: E402
from remat_lab.config import ConfigError  # noqa: E402
from remat_lab.experiment import ExecutionError  # noqa: E402
from remat_lab.policies import POLICIES  # noqa: E402

cfg = _shared.page_start("Sweep", "Widths × batches × policies; model, seq, depth, dtype, objective "
                                  "and repeats come from the sidebar.")
ss = st.session_state
c1, c2 = st.columns(2)
widths = c1.multiselect("Widths", _shared.POW2_WIDTHS, default=[64, 256], key="sweep_widths")
batch_opts = ([0] if cfg.model == "mlp" else []) + _shared.POW2_BATCHES
batches = c2.multiselect("Batches", batch_opts, default=[16, 64], key="sweep_batches",
                         format_func=lambda b: "single vector" if b == 0 else str(b))
policies = st.multiselect("Policies", list(POLICIES), key="sweep_policies",
                          default=["no_remat", "nothing_saveable", "dots_with_no_batch_dims_saveable"],
                          format_func=_shared.policy_label)
grid = [cfg.replace(width=w, batch=b, policy=p)
        for w, b, p in itertools.product(sorted(widths), sorted(batches), policies)]
a, b = st.columns([1, 4])
start = a.button(f"Run sweep ({len(grid)} runs)", key="sweep_run", type="primary", disabled=not grid)
if b.button("Clear results", key="sweep_clear"):
    ss["sweep_rows"], ss["sweep_total"] = [], 0

if start:
    ss["sweep_rows"], ss["sweep_total"], ss["sweep_errors"] = [], len(grid), []
    bar = st.progress(0.0, text=f"0 of {len(grid)} runs done")
    t0 = time.perf_counter()
    with st.status(f"Sweeping {len(grid)} configurations…", expanded=False) as status:
        for i, c in enumerate(grid, 1):
            try:
                result = _shared.run_config(c, status, prefix=f"{i}/{len(grid)} w{c.width} "
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
left, right = st.columns(2)
left.plotly_chart(charts.make_relative_heatmap_figure(tables.relative_frame(df, "median_ms"),
                                                      "Step time relative to no_remat"),
                  width="stretch")
right.plotly_chart(charts.make_relative_heatmap_figure(tables.relative_frame(df, "peak_bytes"),
                                                       "Peak memory relative to no_remat"),
                   width="stretch")
if "no_remat" not in set(df["policy"]):
    st.caption("Add no_remat to the policies to see the relative heatmaps.")

st.subheader("Sweep results")
MS = st.column_config.NumberColumn
st.dataframe(df, hide_index=True, width="stretch", column_config={
    "median_ms": MS("median (ms)", format="%.4f"), "p25_ms": MS("p25 (ms)", format="%.4f"),
    "p75_ms": MS("p75 (ms)", format="%.4f"), "peak_mib": MS("peak (MiB)", format="%.3f"),
    "temp_mib": MS("temp (MiB)", format="%.3f"), "residual_mib": MS("residuals (MiB)", format="%.3f"),
    "peak_bytes": MS("peak", format="bytes"), "temp_bytes": MS("temp", format="bytes"),
    "residual_bytes": MS("residuals", format="bytes"),
    "grad_ok": st.column_config.CheckboxColumn("grad check"),
    "compile_s": MS("compile (s)", format="%.2f")})
st.download_button("Download CSV", df.to_csv(index=False), "remat_lab_sweep.csv", "text/csv",
                   key="sweep_csv")
