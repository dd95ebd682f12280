"""Compare policies: every (or the selected) policy at the current configuration."""

import json
import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from pages import _shared  # noqa: E402
from remat_lab import charts, tables  # noqa: E402
from remat_lab.config import ConfigError, human_bytes, human_seconds  # noqa: E402
from remat_lab.experiment import ExecutionError  # noqa: E402
from remat_lab.policies import POLICIES  # noqa: E402

cfg = _shared.page_start("Compare policies", "Every checkpoint policy at the sidebar's "
                                             "configuration (the sidebar's policy is ignored here).")
chosen = st.multiselect("Policies", list(POLICIES), default=list(POLICIES), key="compare_policies",
                        format_func=_shared.policy_label)
configs = [cfg.replace(policy=p) for p in chosen]
auto = all(_shared.is_quick(c) for c in configs)
clicked = st.button("Run comparison", key="compare_run", type="primary", disabled=not chosen)
if not chosen:
    st.info("Pick at least one policy.")
    st.stop()
if not (auto or clicked or st.session_state.get("_compare_done") == tuple(configs)):
    st.info("These configurations may take a while, so they run only when you click "
            "**Run comparison**.")
    st.stop()

results, errors = [], []
with st.status(f"Comparing {len(configs)} policies…", expanded=False) as status:
    for i, c in enumerate(configs, 1):
        try:
            results.append(_shared.run_config(c, status, prefix=f"{i}/{len(configs)} {c.policy}: "))
        except (ConfigError, ExecutionError) as err:
            errors.append((c.policy, err))
    status.update(label=f"Done: {len(results)} of {len(configs)} policies at "
                        f"{_shared.describe(cfg).split(', ')[0]}", state="complete")
st.session_state["_compare_done"] = tuple(configs)
for policy, err in errors:
    st.markdown(f"**{policy}**")
    _shared.show_error(err)
if not results:
    st.stop()

summary = tables.summary_frame(results)
front = tables.pareto_mask(summary, "median_ms", "peak_mib")
fastest = summary.loc[summary["median_ms"].idxmin()]
low = summary["peak_bytes"] == summary["peak_bytes"].min()
smallest = ("every policy compiles to the same peak" if low.all()
            else f"**{', '.join(summary.loc[low, 'policy'])}**")
st.info(f"Fastest: **{fastest['policy']}** ({human_seconds(fastest['median_ms'] / 1e3)}). "
        f"Smallest peak memory: {smallest} ({human_bytes(summary['peak_bytes'].min())}). "
        f"Not beaten on both by any other policy (the Pareto front): "
        f"{', '.join(summary.loc[front.to_numpy(), 'policy'])}.")
left, right = st.columns(2)
left.plotly_chart(charts.make_time_bars_figure(summary), width="stretch")
right.plotly_chart(charts.make_memory_figure(tables.memory_frame(results)), width="stretch")
left, right = st.columns(2)
left.plotly_chart(charts.make_pareto_figure(summary, front), width="stretch")
left.caption("The dashed line joins the policies that no other policy beats on both time and memory.")
samples = pd.concat([tables.samples_frame(r) for r in results], ignore_index=True)
right.plotly_chart(charts.make_step_time_figure(samples), width="stretch")

st.subheader("Policy table")
CHECK = st.column_config.CheckboxColumn
MS = st.column_config.NumberColumn
table = summary[["policy", "median_ms", "p25_ms", "p75_ms", "peak_bytes", "temp_bytes",
                 "residual_bytes", "dots_saved", "dots_recomputed", "recompute_flops", "grad_ok"]]
st.dataframe(table, hide_index=True, width="stretch", column_config={
    "median_ms": MS("median (ms)", format="%.4f"), "p25_ms": MS("p25 (ms)", format="%.4f"),
    "p75_ms": MS("p75 (ms)", format="%.4f"), "peak_bytes": MS("peak", format="bytes"),
    "temp_bytes": MS("temp", format="bytes"), "residual_bytes": MS("residuals", format="bytes"),
    "dots_saved": "dots saved", "dots_recomputed": "dots recomputed",
    "recompute_flops": MS("recompute flops", format="%d"), "grad_ok": CHECK("grad check")})
a, b = st.columns(2)
a.download_button("Download CSV", summary.to_csv(index=False), "remat_lab_compare.csv",
                  "text/csv", key="compare_csv")
b.download_button("Download JSON", json.dumps(results, indent=1), "remat_lab_compare.json",
                  "application/json", key="compare_json")
