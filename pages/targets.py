"""Targets: the sidebar's configuration under chosen policies, compiled for several accelerators."""

import json
import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _mesh_link, _page_state, _progress, _running, _shared, _sidebar  # noqa: E402
from remat_lab.config import LOCAL, TARGET_NAMES, ConfigError, RunConfig  # noqa: E402
from remat_lab.model.policies import POLICIES  # noqa: E402
from remat_lab.present import charts, tables  # noqa: E402
from remat_lab.present.target_charts import (  # noqa: E402
    ranking_lesson,
    ranking_text,
    target_label,
    target_name,
)
from remat_lab.program.backend import ExecutionError  # noqa: E402
from remat_lab.serve import safe_text  # noqa: E402
from remat_lab.studies.across_targets import compare_across_targets  # noqa: E402

DEFAULT_TARGETS = ["h100", "a100-40g", "tpu-v5e"]  # what users rent; local is one click away
DEFAULT_POLICIES = ["no_remat", "nothing_saveable", "dots_with_no_batch_dims_saveable"]
MS = st.column_config.NumberColumn

cfg = _shared.page_start("Targets", "The sidebar's configuration under the chosen policies, compiled "
                                    "for each chosen accelerator without it (local: compiled and "
                                    "checked here, not timed), so every peak is XLA's compiled figure "
                                    "for that backend. The sidebar's policy and target are not used here.")
ss = st.session_state
url = _page_state.loaded("targets", ["targets", "policies"])  # a link's selections, first visit only
url_warnings = (_page_state.restore(url, "targets", _page_state.names(TARGET_NAMES), "_targets_chosen")
                + _page_state.restore(url, "policies", _page_state.names(POLICIES, len(POLICIES)),
                                      "_targets_policies"))
for key, default in (("targets_chosen", DEFAULT_TARGETS), ("targets_policies", DEFAULT_POLICIES)):
    if key not in ss or url:  # kept under a key of its own: Streamlit forgets a widget's state off its page
        ss[key] = list(ss.get(f"_{key}", default))
left, right = st.columns(2)
chosen = left.multiselect("Targets", TARGET_NAMES, key="targets_chosen", format_func=target_name,
                          help="local: this server's backend. " + "; ".join(
                              target_label(t) for t in TARGET_NAMES if t != LOCAL) + ".")
policies = right.multiselect("Policies", list(POLICIES), key="targets_policies",
                             format_func=_sidebar.policy_label)
ss["_targets_chosen"], ss["_targets_policies"] = list(chosen), list(policies)
_page_state.write({"targets": ",".join(chosen), "policies": ",".join(policies)})
_page_state.show(url_warnings)
if not chosen or not policies:
    st.info("Pick at least one target and one policy.")
    st.stop()
if _sidebar.over_budget(cfg):  # the sidebar shows the red flag with what to lower
    st.info("Nothing was compiled: the configuration in the sidebar is too large for this server.",
            icon=":material/arrow_back:")
    st.stop()
try:  # the targets come from this page
    base = cfg.replace(target=LOCAL, target_devices=1, network="")
except ConfigError:  # a mesh across hosts or slices (dcn axes) is one named target's, never local's
    base = cfg.replace(target=LOCAL, target_devices=1, network="", mesh="")
    st.warning(f"The sidebar's mesh `{cfg.mesh}` spans hosts or slices, which this page does not "
               "compare: each target is compiled on one device. Explore and Plan compile it for the "
               "sidebar's target.")
local_mesh = None  # a link's mesh this server has not the devices for: the named targets' only
if not cfg.mesh and (linked := ss.get(_mesh_link.FROM_LINK)):
    try:
        base, local_mesh = base.replace(mesh=linked), ""
        st.info(f"The link's mesh `{linked}` is applied to each named target's devices"
                + ("; local compiles on one device (this server has too few)." if LOCAL in chosen
                   else "."), icon=":material/link:")
    except ConfigError as err:
        st.warning(f"The link's mesh `{linked}` does not fit this configuration "
                   f"({safe_text.escape_markdown(err)}) Compiling on one device of each target.")
key = (base, tuple(chosen), tuple(policies))
clicked = st.button("Compile for these targets", key="targets_run", type="primary")
if not (clicked or ss.get("_targets_done") == key):
    mesh = f" on {base.mesh} (each named target's devices)" if base.mesh else ""
    st.info(f"{len(chosen) * len(policies)} compiles{mesh}: they run when you click **Compile for "
            "these targets** (measured on 2 cores: an H100 compile of an 8-block MLP 1–2 s, a TPU "
            "v5e one 5–20 s, an LLM preset on a mesh minutes); each one is kept, so a second visit, "
            "or Explore on the same target, is quick.")
    st.stop()

# Live: elapsed, compiles done of planned, time left, and each pair's row as it is compiled.
status, live = _progress.running(f"Compiling {len(policies)} policies for {len(chosen)} targets…",
                                 _progress.TARGETS, title="Compiled so far")
with status:
    def run(c: RunConfig) -> dict:
        """One pair through the app's worker pool and result caches: compile-only on a named target
        ("run" never times there), untimed on local ("programs": compiled and checked)."""
        return _running.run_config(c, status, prefix=f"{c.policy} on {c.target}: ",
                                   keep_texts=c.target == LOCAL, say=live)

    try:
        doc, error = compare_across_targets(base, list(policies), list(chosen), progress=live, run=run,
                                          local_mesh=local_mesh), None
    except (ConfigError, ExecutionError) as err:
        status.update(label="Compiling failed", state="error")
        error = err
    else:
        status.update(label=f"Done: {len(doc['rows'])} compiles of "
                            f"{_sidebar.describe(base).split(', ')[0]}", state="complete")
if error is not None:  # the pairs compiled before it stay in the live table
    _progress.stopped_with_rows(live, error, len(policies) * len(chosen), "compiles")
    st.stop()
live.clear()
ss["_targets_done"] = key
for f in doc["failed"]:
    st.error(f"XLA failed for **{f['policy']}** on **{f['target']}**: "
             f"{safe_text.escape_markdown(safe_text.strip_paths(f['error']))}")

frame = tables.across_targets_frame(doc)
lesson = ranking_lesson(frame)
if lesson:
    st.warning(lesson, icon=":material/swap_vert:")
elif len(chosen) > 1:
    st.success("No policy overtakes another by compiled peak between these targets (≈: within 1 %; "
               f"smallest first — {ranking_text(frame)}).", icon=":material/check:")
st.plotly_chart(charts.make_targets_peak_figure(frame), width="stretch")
st.caption("XLA's memory analysis of each compiled step (generated code + arguments + outputs − "
           "aliases + temp), for one device of the target. Local is this server's backend "
           "(a CPU computes bf16 products in float32, so its figures differ for more than the "
           "scheduler).")
shown = frame.assign(memory=frame["memory_bytes"].map(lambda v: "-" if v != v or v is None
                                                      else f"{v / 2**30:,.0f} GiB"))
st.dataframe(shown, hide_index=True, width="stretch", column_order=[
    "target", "policy", "peak_mib", "temp_mib", "fits", "memory", "predicted_ms", "estimate_ms",
    "excess_dots_vs_no_remat", "device_kind"], column_config={
    "peak_mib": MS("compiled peak (MiB)", format="%.2f"), "temp_mib": MS("temp (MiB)", format="%.2f"),
    "fits": st.column_config.CheckboxColumn("fits", help="peak within the memory JAX may use on it"),
    "memory": st.column_config.TextColumn("device memory"),
    "predicted_ms": MS("predicted step (ms)", format="%.3f",
                       help="the compiled kernels at rates measured on a Hopper GPU; none on a TPU "
                            "or on local"),
    "estimate_ms": MS("roofline bound (ms)", format="%.3f",
                      help="a lower bound from the target's spec figures; none on local"),
    "excess_dots_vs_no_remat": MS("products recomputed vs no_remat", format="%d"),
    "device_kind": "device"})
a, b = st.columns(2)
a.download_button("Download CSV", frame.to_csv(index=False), "remat_lab_targets.csv", "text/csv",
                  key="targets_csv")
b.download_button("Download JSON", json.dumps(doc, indent=1, default=str), "remat_lab_targets.json",
                  "application/json", key="targets_json")
st.caption(f"{safe_text.escape_markdown(doc['method'])} From a terminal: one row is Explore's "
           "command for that policy with `--target NAME` (Explore on that target prints it); "
           "`python -m remat_lab targets` lists the targets and their figures.")
