"""History: the runs the app and the CLI recorded; filter, pick, compare, download, delete (locally)."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from pages import _page_state, _record, _views  # noqa: E402
from remat_lab.config import human_bytes  # noqa: E402
from remat_lab.present import (
    charts,
    tables,  # noqa: E402
)
from remat_lab.store import history
from remat_lab.store.results import describe_environment  # noqa: E402

ss = st.session_state
public = history.public_mode()
session = _record.visitor_id()
_record.remember_visitor()
st.header("History")
st.caption("Every run this app or `python -m remat_lab run|compare|sweep` completed, kept in "
           f"{'this server' if public else f'`{history.db_path().name}` in `{history.HOME_ENV}`'} "
           "(SQLite). "
           + ("This is a shared server: you see the runs of this browser and those the operator "
              "shared, and nothing can be deleted here." if public else
              "Pick runs to compare them or download them; delete what you no longer need."))
st.sidebar.caption("The settings above are not used on this page: it shows the recorded runs' own.")
if not history.enabled():
    st.info(f"History is off (`{history.OFF_ENV}=off`): runs are not recorded.")
    st.stop()


def _off(err: history.HistoryError) -> None:
    st.warning(f"**History is off.** {_views.md(err)} The rest of the app keeps working.",
               icon=":material/history_toggle_off:")
    st.stop()


try:
    runs = history.list_runs(limit=1000, session_id=session, public=public)
except history.HistoryError as err:
    _off(err)
if not runs:
    st.info("No runs recorded yet: run a configuration on Explore, Compare or Sweep, or from the CLI.")
    st.stop()

frame = pd.DataFrame(runs)
frame["when"] = pd.to_datetime(frame["created"], unit="s").dt.strftime("%Y-%m-%d %H:%M:%S")
frame["environment"] = [describe_environment({"device_kind": d, "device_count": n, "jax": j, "backend": b})
                        for d, n, j, b in zip(frame["device_kind"], frame["device_count"],
                                              frame["jax"], frame["backend"])]
frame["peak"] = frame["peak_bytes"].map(lambda v: "-" if pd.isna(v) else human_bytes(v))
# The filters live in the URL (models=, policies=, backends=): a value this history has no run of
# is named in a warning and that filter is left off.
FILTERS = {"models": "model", "policies": "policy", "backends": "backend"}
offered = {p: sorted(frame[col].dropna().unique()) for p, col in FILTERS.items()}
url = _page_state.loaded("history", FILTERS)
_page_state.show([w for p in FILTERS for w in _page_state.restore(
    url, p, _page_state.names(offered[p], len(offered[p])), f"history_{p}",
    f"{FILTERS[p]} names with runs in this history, separated by commas", "no filter")])
picked_filters = {}
for column, (p, col) in zip(st.columns(3), FILTERS.items()):
    ss[f"history_{p}"] = [v for v in ss.get(f"history_{p}", []) if v in offered[p]]
    picked_filters[p] = column.multiselect(col.capitalize(), offered[p], key=f"history_{p}")
    if picked_filters[p]:
        frame = frame[frame[col].isin(picked_filters[p])]
_page_state.write({p: ",".join(map(str, v)) for p, v in picked_filters.items()})
frame = frame.reset_index(drop=True)
SHOWN = ["id", "when", "source", "kind", "model", "policy", "width", "batch", "depth", "dtype",
         "median_ms", "peak", "grad_ok", "environment", "shared"]
picked = st.dataframe(frame, hide_index=True, width="stretch", column_order=SHOWN, key="history_table",
                      on_select="rerun", selection_mode="multi-row", column_config={
                          "median_ms": st.column_config.NumberColumn("median (ms)", format="%.4f"),
                          "grad_ok": st.column_config.CheckboxColumn("grad check"),
                          "shared": st.column_config.CheckboxColumn("shared")})
rows = frame.iloc[picked.selection.rows] if picked and picked.selection.rows else frame.iloc[:0]
st.caption(f"{len(frame)} run{'' if len(frame) == 1 else 's'} shown; tick rows to compare them"
           + ("" if public else ", download or delete them") + ".")
if rows.empty:
    st.stop()

ids = [int(i) for i in rows["id"]]
try:
    docs = history.documents(ids, session_id=session, public=public)
except history.HistoryError as err:  # the file went bad since the list was read
    _off(err)
singles = [docs[i] for i in ids if i in docs and docs[i]["_history"]["kind"] != "compare"]
a, b = st.columns([1, 4])
a.download_button(f"Download {len(ids)} as JSON lines", _views.json_lines(
    [{k: v for k, v in docs[i].items() if k != "_history"} for i in ids if i in docs]),
    "remat_lab_history.jsonl", "application/jsonl", key="history_download")
if not public:
    with b.popover(f"Delete {len(ids)} run{'' if len(ids) == 1 else 's'}"):
        st.caption("Removes them from the history file for good.")
        if st.button("Delete permanently", key="history_delete", type="primary"):
            try:
                history.delete(ids)
            except history.HistoryError as err:
                _off(err)
            st.rerun()

envs = {describe_environment(d.get("environment")) for d in singles}
if len(envs) > 1:
    st.warning("The picked runs come from different machines (" + _views.md("; ".join(sorted(envs)))
               + "): their times are not comparable. Filter by backend to compare like with like.")
if singles:
    st.subheader("Picked runs")
    _views.environment_line(singles[0].get("environment") if len(envs) == 1 else None,
                            "Measured on" if len(envs) == 1 else "Mixed machines:")
    # One bar / point per run: "#id policy wW bB" names it, the policy keeps its colour family.
    summary = tables.summary_frame(singles)
    summary["policy"] = [f"#{d['_history']['id']} {s.policy} w{s.width} b{s.batch}"
                         for d, s in zip(singles, summary.itertuples())]
    left, right = st.columns(2)
    left.plotly_chart(charts.make_time_bars_figure(summary), width="stretch", key="history_time")
    named = [{**d, "config": {**d["config"], "policy": name}} for d, name in zip(singles, summary["policy"])]
    right.plotly_chart(charts.make_memory_figure(tables.memory_frame(named)), width="stretch",
                       key="history_memory")
    st.plotly_chart(charts.make_pareto_figure(summary.dropna(subset=["median_ms", "peak_mib"])),
                    width="stretch", key="history_pareto")
for i in ids:
    if i in docs and docs[i]["_history"]["kind"] == "compare":
        st.subheader(f"Comparison #{i}")
        _views.environment_line(docs[i].get("environment"))
        _views.compare_view(docs[i], key=f"history_compare{i}")
