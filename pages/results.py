"""Open results: uploaded run, sweep and comparison files, shown with the app's charts; no computing."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _views  # noqa: E402
from remat_lab.config import human_bytes  # noqa: E402
from remat_lab.present import tables  # noqa: E402
from remat_lab.store import results
from remat_lab.store.results import describe_environment  # noqa: E402

st.header("Open results")
st.caption("Files written elsewhere — `python -m remat_lab run --json`, `sweep --out`, `compare "
           "--json`, `advise --json`, or this app's JSON downloads — shown with the same charts and "
           "tables, without computing anything. Each view names the machine that measured it, so "
           "numbers from different machines are never mixed.")
files = st.file_uploader("Results files (.json, .jsonl)", type=["json", "jsonl"],
                         accept_multiple_files=True, key="results_files",
                         max_upload_size=results.MAX_BYTES // 2**20,
                         help=f"Up to {results.MAX_BYTES // 2**20} MiB each. Only read as JSON: "
                              "nothing in a file is executed.")
if not files:
    st.info("Upload one or more results files to see them here.", icon=":material/upload_file:")
    st.stop()

loaded = [results.load(f.name, f.getvalue()) for f in files]
for item in loaded:
    if item.problems:
        more = item.bad - len(item.problems)
        text = "\n".join(f"- {_views.md(p)}" for p in item.problems)
        (st.error if item.count == 0 else st.warning)(
            f"**{_views.md(item.name)}**: " + ("nothing could be read." if item.count == 0 else
                                              f"{item.bad} part{'' if item.bad == 1 else 's'} left out; "
                                              f"{item.count} shown below.")
            + f"\n\n{text}" + (f"\n- … and {more} more" if more > 0 else ""))

# One view per file and machine: numbers from different machines never share a chart.
runs: dict[tuple[str, str], list[dict]] = {}
for item in loaded:
    for doc in item.runs + item.errors:
        runs.setdefault((item.name, describe_environment(doc.get("environment"))), []).append(doc)
compares = [doc for item in loaded for doc in item.compares]
advice = [doc for item in loaded for doc in item.advice]
if not runs and not compares and not advice:
    st.stop()
machines = ({env for _, env in runs}
            | {describe_environment(d["environment"]) for d in compares + advice})
if len(machines) > 1:
    st.info(f"These results come from {len(machines)} machines ({_views.md('; '.join(sorted(machines)))}): "
            "each is shown on its own, never in one chart.", icon=":material/devices:")
st.sidebar.caption("The settings above are not used on this page: it shows the files' own.")


def _show_runs(docs: list[dict], n: int, name: str) -> None:
    done = [d for d in docs if "error" not in d]
    env = next((d.get("environment") for d in docs if d.get("environment")), None)
    if len(done) == 1 and len(docs) == 1:
        c = done[0]["config"]
        st.subheader(f"Run: {_views.md(c['policy'])} · {_views.md(c['model'])} width {c['width']} "
                     f"batch {c['batch']}")
        st.caption(f"From {_views.md(name)}")
        _views.environment_line(env)
        _views.run_view(done[0], key=f"run{n}")
        return
    st.subheader(f"Sweep: {len(docs)} configuration{'' if len(docs) == 1 else 's'}")
    st.caption(f"From {_views.md(name)}")
    _views.environment_line(env)
    _views.error_rows([d for d in docs if "error" in d])
    if done:
        _views.sweep_view(tables.summary_frame(done), key=f"sweep{n}")


def _show_compare(doc: dict, n: int, name: str) -> None:
    st.subheader(f"Comparison: {len(doc['rows'])} policies at {_views.md(doc['config'].get('model'))} "
                 f"width {doc['config'].get('width')} batch {doc['config'].get('batch')}")
    st.caption(f"From {_views.md(name)}")
    _views.environment_line(doc["environment"])
    _views.compare_view(doc, key=f"compare{n}")


def _show_advice(doc: dict, n: int, name: str) -> None:
    c = doc["config"]
    st.subheader(f"Advice: {len(doc['rows'])} policies at {_views.md(c.get('model'))} width "
                 f"{c.get('width')} depth {c.get('depth')} in {human_bytes(doc['budget_bytes'])}")
    st.caption(f"From {_views.md(name)}")
    _views.environment_line(doc["environment"])
    _views.advice_view(doc, key=f"advice{n}")


views = ([(_show_runs, docs, name) for (name, _), docs in runs.items()]
         + [(_show_compare, doc, item.name) for item in loaded for doc in item.compares]
         + [(_show_advice, doc, item.name) for item in loaded for doc in item.advice])
for n, (show, what, name) in enumerate(views):
    try:
        show(what, n, name)
    except Exception as err:  # noqa: BLE001 - a valid-looking document we still cannot draw
        st.error(f"This part of the upload passed the checks but could not be drawn "
                 f"({type(err).__name__}); the other parts are shown.")
