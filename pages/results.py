"""Open results: uploaded run, sweep and comparison files, shown with the app's charts; no computing."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _uploads, _views  # noqa: E402
from remat_lab.config import human_bytes  # noqa: E402
from remat_lab.present import tables  # noqa: E402
from remat_lab.serve.safe_text import escape_markdown, strip_paths  # noqa: E402
from remat_lab.store import results, uploads  # noqa: E402
from remat_lab.store.results import describe_environment  # noqa: E402

CAP, ROWS = results.MAX_BYTES // 2**20, uploads.MAX_ROWS_DRAWN


def esc(text: object) -> str:
    """Uploaded text for Markdown: escaped, and no absolute paths."""
    return escape_markdown(strip_paths(str(text)))


st.header("Open results")
st.caption("Files written elsewhere — `python -m remat_lab run --json`, `sweep --out`, `compare "
           "--json`, `advise --json`, or this app's JSON downloads — shown with the same charts and "
           "tables, without computing anything. Each view names the machine that measured it, so "
           "numbers from different machines are never mixed.")
_uploads.bound()
for name, why in _uploads.refusals():
    st.error(f"**{esc(name)}**: {why}")
f = st.file_uploader("Results file (.json, .jsonl)", type=["json", "jsonl"], key=_uploads.uploader_key(),
                     max_upload_size=CAP,
                     help=f"One file at a time, up to {CAP} MB; up to {uploads.MAX_FILES} stay open. "
                          "Only read as JSON: nothing in a file is executed.")
st.caption(f"Limits: one file at a time, up to {CAP} MB (10⁶ bytes each, as the browser counts); the "
           f"last {uploads.MAX_FILES} files you open stay open; {results.MAX_KEPT:,} rows kept per file; "
           f"the first {results.MAX_PROBLEMS} problems of a file listed, then a count; the charts and "
           f"tables draw the first {ROWS} rows of a sweep (the CSV download has them all) and the "
           f"first {uploads.MAX_VIEWS} views. The server keeps a file's bytes only until it is read.")
if f is not None:
    _uploads.receive(f)  # parsed, its bytes let go, and the page run again with an empty uploader
loaded, gone = _uploads.opened()
if gone:
    st.info(f"No longer kept by the server, upload again to see: {esc(', '.join(gone))}.",
            icon=":material/history:")
if not loaded:
    st.info("Upload a results file to see it here.", icon=":material/upload_file:")
    st.stop()
st.button("Close these files", key="results_close", on_click=_uploads.close_all)
for item in loaded:
    if item.problems:
        more = item.bad - len(item.problems)
        text = "\n".join(f"- {esc(p)}" for p in item.problems)
        (st.error if item.count == 0 else st.warning)(
            f"**{esc(item.name)}**: " + ("nothing could be read." if item.count == 0 else
                                         f"{item.bad:,} part{'' if item.bad == 1 else 's'} left out; "
                                         f"{item.count:,} shown below.")
            + f"\n\n{text}" + (f"\n- … and {more:,} more" if more > 0 else ""))
    if item.stopped:
        st.error(f"**{esc(item.name)}**: {esc(item.stopped)}"
                 + (f" The {item.count:,} documents read before are shown." if item.count else ""))

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
    shown = sorted(machines)[:12]
    st.info(f"These results come from {len(machines)} machines ({esc('; '.join(shown))}"
            f"{' …' if len(machines) > len(shown) else ''}): each is shown on its own, never in one "
            "chart.", icon=":material/devices:")
st.sidebar.caption("The settings above are not used on this page: it shows the files' own.")


def _environment_line(env: dict | None) -> None:
    """Which machine made these numbers, in words (uploaded text, escaped)."""
    st.markdown(f":material/memory: Measured on **{esc(describe_environment(env))}**"
                + (f" · backend {esc(env.get('backend'))}" if env else ""))


def _show_runs(docs: list[dict], n: int, name: str) -> None:
    done = [d for d in docs if "error" not in d]
    env = next((d.get("environment") for d in docs if d.get("environment")), None)
    if len(done) == 1 and len(docs) == 1:
        c = done[0]["config"]
        st.subheader(f"Run: {esc(c['policy'])} · {esc(c['model'])} width {c['width']} batch {c['batch']}")
        st.caption(f"From {esc(name)}")
        _environment_line(env)
        if "dots" not in done[0]:
            st.caption("This run's per-dot, residual and timeline detail was too large to keep: its "
                       "tables are empty.")
        _views.run_view(done[0], key=f"run{n}")
        return
    st.subheader(f"Sweep: {len(docs):,} configuration{'' if len(docs) == 1 else 's'}")
    st.caption(f"From {esc(name)}")
    _environment_line(env)
    errors = [d for d in docs if "error" in d]
    if len(errors) > ROWS:
        st.caption(f"Showing the first {ROWS} of {len(errors):,} refused or failed configurations.")
    _views.error_rows(errors[:ROWS])
    if not done:
        return
    frame = tables.summary_frame(done)
    if len(frame) > ROWS:  # drawing thousands of rows takes minutes: the first ROWS, and a download
        st.info(f"Showing the first {ROWS} of {len(frame):,} rows in the charts and the table; "
                "download the table for all of them.", icon=":material/table_rows:")
        st.download_button(f"Download all {len(frame):,} rows (CSV)",
                           tables.export_frame(frame).to_csv(index=False), "remat_lab_sweep_all.csv",
                           "text/csv", key=f"sweep{n}_all_csv")
        frame = frame.head(ROWS)
    _views.sweep_view(frame, key=f"sweep{n}")


def _show_compare(doc: dict, n: int, name: str) -> None:
    st.subheader(f"Comparison: {len(doc['rows'])} policies at {esc(doc['config'].get('model'))} "
                 f"width {doc['config'].get('width')} batch {doc['config'].get('batch')}")
    st.caption(f"From {esc(name)}")
    _environment_line(doc["environment"])
    _views.compare_view(doc, key=f"compare{n}")


def _show_advice(doc: dict, n: int, name: str) -> None:
    c = doc["config"]
    st.subheader(f"Advice: {len(doc['rows'])} policies at {esc(c.get('model'))} width "
                 f"{c.get('width')} depth {c.get('depth')} in {human_bytes(doc['budget_bytes'])}")
    st.caption(f"From {esc(name)}")
    _environment_line(doc["environment"])
    _views.advice_view(doc, key=f"advice{n}")


views = ([(_show_runs, docs, name) for (name, _), docs in runs.items()]
         + [(_show_compare, doc, item.name) for item in loaded for doc in item.compares]
         + [(_show_advice, doc, item.name) for item in loaded for doc in item.advice])
if len(views) > uploads.MAX_VIEWS:
    st.info(f"Showing the first {uploads.MAX_VIEWS} of {len(views)} views (one per file and machine, "
            "comparison or advice); upload the others on their own.", icon=":material/filter_list:")
for n, (show, what, name) in enumerate(views[:uploads.MAX_VIEWS]):
    try:
        show(what, n, name)
    except Exception as err:  # noqa: BLE001 - a valid-looking document we still cannot draw
        st.error(f"This part of the upload passed the checks but could not be drawn "
                 f"({type(err).__name__}); the other parts are shown.")
