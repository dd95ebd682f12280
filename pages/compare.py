"""Compare policies: every (or the selected) policy at the current configuration, timed interleaved."""

import json
import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from pages import _mesh, _page_state, _peak_diff, _progress, _record, _running, _shared, _sidebar  # noqa: E402
from pages._compare_tables import holdings_table, policy_table  # noqa: E402
from pages._layout import chart_row  # noqa: E402
from remat_lab.config import (  # noqa: E402
    LIMITS,
    ConfigError,
    RunConfig,
    estimate_bytes,
    estimate_process_bytes,
    human_bytes,
    resolve_budget,
)
from remat_lab.model.policies import POLICIES  # noqa: E402
from remat_lab.present import charts, tables  # noqa: E402
from remat_lab.program.backend import ExecutionError  # noqa: E402
from remat_lab.serve import safe_text
from remat_lab.store.bytecache import ByteCache  # noqa: E402
from remat_lab.studies import compare


# A comparison carries every policy's memory timeline (up to ~50 KB each, ~1 MiB in all): 16 MiB.
@st.cache_resource(show_spinner=False)
def _cached_compare() -> ByteCache:
    """Comparisons by (configuration, policies), bounded by bytes."""
    return ByteCache(16 << 20, "comparisons")


def _compare(cfg: RunConfig, policies: list[str], say) -> dict:
    """The engine's comparison of ``policies`` at ``cfg``, from the cache or the worker pool.

    Every policy's executable is alive during the interleaved timing: the need counts the
    device program once per policy on top of one run's process estimate.
    """
    on_device = _sidebar._device_limit() is not None  # the programs in the device's memory, not here
    need = estimate_process_bytes(cfg, on_device) + (0 if on_device else (len(policies) - 1)
                                                     * estimate_bytes(cfg))
    return _running.cached_call("compare", _cached_compare(),
                                (tuple(sorted(cfg.as_dict().items())), tuple(policies)),
                                {"config": cfg.as_dict(), "policies": list(policies)}, say, need=need)


def _too_large(cfg: RunConfig) -> str | None:
    """Advice a web user can act on when ``cfg`` is over this server's memory budget."""
    limit = _sidebar._device_limit()
    need, budget = estimate_bytes(cfg), resolve_budget(None, limit)
    if limit is not None or need <= budget:  # on an accelerator each compile answers
        return None
    return (f"**This configuration is too large for this server.** It needs about {human_bytes(need)} "
            f"of memory; this server runs configurations of up to {human_bytes(budget)}. Lower the "
            "width, batch, sequence length (seq_mixer) or depth in the sidebar and the comparison "
            "runs again.")


cfg = _shared.page_start("Compare policies", "Every checkpoint policy at the sidebar's configuration "
                                             "(the sidebar's policy is ignored here), timed "
                                             "interleaved so that all share the same machine load.")
# By default JAX's policies; MaxText's recipes too for the transformer, the model whose tensors they
# name (on the other models they compile like nothing_saveable and only lengthen the list).
default = [p for p, entry in POLICIES.items()
           if entry.group == "jax" or (entry.group == "maxtext" and cfg.model == "transformer")]
# The choice outlives the page: Streamlit forgets a widget's state once a page without it runs,
# so it is kept under a key of its own and given back when the page comes back.
ss = st.session_state
url_warnings = _page_state.restore(_page_state.loaded("compare", ["policies"]), "policies",
                                   _page_state.names(POLICIES, len(POLICIES)), "_compare_chosen")
if "compare_policies" not in ss:
    ss["compare_policies"] = [p for p in ss.get("_compare_chosen", default) if p in POLICIES]
chosen = st.multiselect("Policies", list(POLICIES), key="compare_policies",
                        format_func=_sidebar.policy_label)
ss["_compare_chosen"] = list(chosen)
_page_state.write({"policies": ",".join(chosen)})
_page_state.show(url_warnings)
if not chosen:
    st.info("Pick at least one policy.")
    st.stop()
if _sidebar.over_budget(cfg):
    # The sidebar already shows the one red flag with what to lower: do not repeat it.
    st.info("Nothing was run: the configuration in the sidebar is too large for this server.",
            icon=":material/arrow_back:")
    st.stop()
if refusal := _too_large(cfg):
    st.error(refusal)
    st.stop()
# Every policy is called repeats x calls_per_round times: judge "quick" on that much timed work.
timed = cfg.replace(repeats=min(LIMITS["repeats"][1], cfg.repeats * compare.CALLS_PER_ROUND))
key = (cfg, tuple(chosen))
clicked = st.button("Run comparison", key="compare_run", type="primary")
if not (_running.is_quick(timed) or clicked or st.session_state.get("_compare_done") == key):
    st.info("These configurations may take a while, so they run only when you click "
            "**Run comparison**.")
    st.stop()

status, live = _progress.running(f"Comparing {len(chosen)} policies…", _progress.COMPARE,  # live rows
                                 words=lambda m: _running.STAGE_TEXT.get(m, m), title="Compiled so far")
with status:
    try:
        result = _compare(cfg, chosen, live)
    except (ConfigError, ExecutionError) as err:
        status.update(label="Comparison failed", state="error")
        result, error = None, err
    else:
        error = None
        m = result["method"]
        status.update(label=f"Done: {len(result['rows'])} policies at "
                            f"{_sidebar.describe(cfg).split(', ')[0]}, {m['rounds']} interleaved rounds "
                            f"of {m['calls_per_round']} calls each", state="complete")
if error is not None:
    _progress.stopped_with_rows(live, error, len(chosen))
    st.stop()
live.clear()
st.session_state["_compare_done"] = key
_record.record(result, kind="compare")  # the run history (History page); once per session
if result["failed"]:
    st.error("XLA failed for " + "; ".join(
        f"**{f['policy']}** ({safe_text.escape_markdown(safe_text.strip_paths(f['error']))})"
        for f in result["failed"])
             + ". The other policies are compared below.")

rows = result["rows"]
frame = pd.DataFrame(rows)
frame["median_ms"] = frame["median_s"] * 1e3
frame["ci_low_ms"] = frame["ci_low_s"] * 1e3
frame["ci_high_ms"] = frame["ci_high_s"] * 1e3
frame["peak_mib"] = frame["peak_bytes"] / tables.MIB

# ---------------------------------------------------------------- verdict
peaks = frame["peak_bytes"].dropna()
if peaks.empty:
    smallest = "this backend gives no compiled memory analysis"
elif (peaks == peaks.min()).all():
    smallest = f"every policy compiles to the same peak ({human_bytes(peaks.min())})"
else:
    smallest = (f"**{', '.join(frame.loc[frame['peak_bytes'] == peaks.min(), 'policy'])}** "
                f"({human_bytes(peaks.min())})")
shared = [g for g in result["programs"] if len(g) > 1]
same_text = ("Same compiled program (never ranked against each other): "
             + "; ".join(" = ".join(g) for g in shared) + ". ") if shared else ""
reason = result["fastest_reason"]
if result["fastest"]:
    reason = reason.replace(result["fastest"], f"**{result['fastest']}**", 1)
pareto = result.get("pareto_reason")  # older documents: the front's names only
if not pareto:
    pareto = f"Pareto front: {', '.join(result['pareto']) or '-'}."
peak_text = "" if "smallest peak" in pareto else f"Smallest peak memory: {smallest}. "
st.info(f"{reason} {same_text}{peak_text}{pareto}")

# ---------------------------------------------------------------- charts
# Side by side on a wide page, stacked at 1024 px (a horizontal bar per policy needs the room).
time_cell, memory_cell, pareto_cell, samples_cell = chart_row("compare_charts", 4, min_px=420)
time_cell.plotly_chart(charts.make_time_bars_figure(frame), width="stretch")
time_cell.caption(f"Bars: the 95 % bootstrap interval of each median ({m['rounds']} rounds resampled). "
             "Two policies are told apart only when their intervals do not overlap.")
memory_docs = [{"config": {"policy": r["policy"]}, "memory": r} for r in rows if r["peak_bytes"] is not None]
memory_cell.plotly_chart(charts.make_memory_figure(tables.memory_frame(memory_docs)), width="stretch")
front = frame["pareto"].astype(bool)
pareto_cell.plotly_chart(charts.make_pareto_figure(frame, front), width="stretch")
pareto_cell.caption(
    "Each point is a compiled program at its peak memory and median step time (policies that compile "
    "to the same program share one point, named by all of them); the vertical bar is the 95 % "
    "interval of the median. "
    + ("Ringed points are the Pareto front: no other program has a peak as small or smaller and a "
       "time interval lower or overlapping, with one of the two strictly better"
       + (" (the dashed staircase joins them)." if front.sum() > 1 else ".") if front.any() else
       "Ringed points are the Pareto front; none here: a front is named only when at least two "
       "programs' time intervals separate."))
samples = pd.DataFrame([{"policy": r["policy"], "run": i, "ms": s * 1e3}
                        for r in rows for i, s in enumerate(r["samples_s"], 1)],
                       columns=["policy", "run", "ms"])
samples_cell.plotly_chart(charts.make_step_time_figure(samples), width="stretch")
samples_cell.caption("Every timed call, in the order they ran for each policy (rounds interleave policies "
              "in a shuffled order).")


# ---------------------------------------------------------------- memory over the program
st.subheader("Memory over the program")
timeline_docs = [{"config": {"policy": p}, "memory_timeline": t}
                 for p, t in (result.get("timelines") or {}).items()]
held = tables.peak_holdings_frame(timeline_docs)
if held.empty:
    st.caption("No memory timelines for these runs: the engine or this backend gave none.")
else:
    st.plotly_chart(charts.make_timeline_overlay_figure(tables.timeline_overlay_frame(timeline_docs)),
                    width="stretch")
    st.caption("Live bytes over each policy's compiled program (XLA's schedule; x is the fraction of "
               "the program, so programs of different lengths line up); policies with the same timeline "
               "share a line, named together; the diamond is the peak. Below: what each policy holds "
               "at its peak, by phase, and its largest buffers; then two policies' peaks side by side.")
    holdings_table(held)
    _peak_diff.section(result.get("timelines") or {}, list(result.get("policies") or []))

# ---------------------------------------------------------------- table
st.subheader("Policy table")
policy_table(frame)
st.caption(f"Timing: {m['rounds']} rounds; each round calls every policy {m['calls_per_round']} times "
           f"in a shuffled order, after a warm-up. Interval: {m['interval']}. Sizes in binary units "
           "(KiB, MiB); the CSV has exact bytes.")
csv = frame.drop(columns=["samples_s", "median_ms", "ci_low_ms", "ci_high_ms", "peak_mib"])
a, b = st.columns(2)
a.download_button("Download CSV", csv.to_csv(index=False), "remat_lab_compare.csv",
                  "text/csv", key="compare_csv")
b.download_button("Download JSON", json.dumps(result, indent=1), "remat_lab_compare.json",
                  "application/json", key="compare_json")
_mesh.compare_section(cfg, chosen)  # per-device peak and recomputed collectives, on a mesh
