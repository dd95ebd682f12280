"""Sweep: widths x batches x policies, each cell's policies timed interleaved; kept and resumable."""

import sys
import time
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _page_state, _progress, _record, _running, _shared, _sidebar, _views  # noqa: E402
from remat_lab.config import LIMITS, RunConfig, estimate_bytes, estimate_process_bytes, human_bytes  # noqa: E402
from remat_lab.config.catalog import USER_MODEL  # noqa: E402
from remat_lab.model.policies import POLICIES  # noqa: E402
from remat_lab.present import tables  # noqa: E402
from remat_lab.serve.quotas import PUBLIC_SWEEP_MAX_RUNS  # noqa: E402
from remat_lab.serve.safe_text import code_span  # noqa: E402
from remat_lab.store import history  # noqa: E402
from remat_lab.studies import sweep

ss = st.session_state


def _kept(key: str, default: list, valid) -> list:
    """Seed a widget with what it held when the user left the page (Streamlit drops the state of
    widgets not on the page), else ``default``; values ``valid`` refuses are dropped."""
    value = ss[key] if key in ss else ss.get(f"_kept_{key}", default)
    ss[key] = [v for v in value if valid(v)]
    return ss[key]


def _typed(key: str, lo: int, hi: int) -> None:
    """A typed width or batch (any whole number from ``lo`` to ``hi``) as a number; others dropped."""
    good, bad = [], []
    for v in ss[key]:
        text = str(v).strip()
        ok = text.isascii() and text.isdigit() and len(text) <= 9 and lo <= int(text) <= hi
        (good if ok else bad).append(int(text) if ok else text[:20])
    ss[key] = sorted(set(good))
    if bad:
        ss["_sweep_typed_bad"] = (f"{', '.join(map(code_span, bad))} left out: {key[6:]} are whole "
                                  f"numbers from {lo} to {hi}.")


cfg = _shared.page_start("Sweep", "Widths × batches × policies; model, seq, depth, dtype, objective "
                                  "and repeats come from the sidebar. The policies of one width and "
                                  "batch are timed together, interleaved (repeats rounds of 2 calls "
                                  "each, shuffled), each median with its 95 % interval.")
url = _page_state.loaded("sweep", ("policies", "widths", "batches"))
b_lo = 0 if cfg.model == "mlp" else 1
_page_state.show(
    _page_state.restore(url, "widths", _page_state.numbers(*LIMITS["width"]), "_kept_sweep_widths",
                        "whole numbers from {} to {}, separated by commas".format(*LIMITS["width"]),
                        "64, 256")
    + _page_state.restore(url, "batches", _page_state.numbers(b_lo, LIMITS["batch"][1]),
                          "_kept_sweep_batches", f"whole numbers from {b_lo} to {LIMITS['batch'][1]}, "
                          "separated by commas", "16, 64")
    + _page_state.restore(url, "policies", _page_state.names(POLICIES, len(POLICIES)),
                          "_kept_sweep_policies"))
c1, c2 = st.columns(2)
in_range = lambda lo, hi: lambda v: isinstance(v, int) and lo <= v <= hi  # noqa: E731
chosen_w = _kept("sweep_widths", [64, 256], in_range(*LIMITS["width"]))
chosen_b = _kept("sweep_batches", [16, 64], in_range(b_lo, LIMITS["batch"][1]))
_kept("sweep_policies", ["no_remat", "nothing_saveable", "dots_with_no_batch_dims_saveable"],
      POLICIES.__contains__)
own_block = cfg.model == USER_MODEL  # its input shape sets its sizes: batches only
if own_block:
    c1.caption(f"Your block: its input {'×'.join(map(str, cfg.input_shape))} sets its sizes, so only "
               "batches (the first axis) and policies are swept.")
    widths = [cfg.width]
else:
    widths = c1.multiselect("Widths", sorted({*_sidebar.POW2_WIDTHS, *chosen_w}), key="sweep_widths",
                            accept_new_options=True, on_change=_typed,
                            args=("sweep_widths", *LIMITS["width"]),
                            help="Pick powers of two or type any width, then Enter.")
batches = c2.multiselect("Batches", sorted({*([0] if b_lo == 0 else []), *_sidebar.POW2_BATCHES, *chosen_b}),
                         key="sweep_batches", format_func=lambda b: "single vector" if b == 0 else str(b),
                         accept_new_options=True, on_change=_typed,
                         args=("sweep_batches", b_lo, LIMITS["batch"][1]),
                         help="Pick powers of two or type any batch, then Enter.")
policies = st.multiselect("Policies", list(POLICIES), key="sweep_policies", format_func=_sidebar.policy_label)
if typed_bad := ss.pop("_sweep_typed_bad", None):
    st.warning(typed_bad)
shown_w = chosen_w if own_block else widths  # kept (and in the link) for the built-in models
for key, value in (("sweep_widths", shown_w), ("sweep_batches", batches), ("sweep_policies", policies)):
    ss[f"_kept_{key}"] = value
_page_state.write({"widths": ",".join(map(str, sorted(shown_w))),
                   "batches": ",".join(map(str, sorted(batches))), "policies": ",".join(policies)})
axes = {"width": sorted(widths), "batch": sorted(batches), "policy": policies}
grid = [cfg.replace(**c) for c in sweep.build_grid(cfg, **axes)] if all(axes.values()) else []
too_big = {(c.width, c.batch): over for c in grid if (over := _sidebar.over_budget(c))}
if too_big:  # refused before the button, so a click never ends in an error
    budget = human_bytes(next(iter(too_big.values()))[1])
    sizes = ", ".join(f"width {w} × batch {b} ({human_bytes(need)})" for (w, b), (need, _) in too_big.items())
    st.warning(f"**Left out of the sweep:** {sizes}: over the memory budget of {budget} on this "
               "server. Choose smaller widths or batches (or a lower seq or depth in the sidebar).",
               icon=":material/memory:")
    grid = [c for c in grid if (c.width, c.batch) not in too_big]
# Rows are kept per configuration for the session: leaving the page, an interruption or another
# click never loses them, and a click runs only the configurations that have no row yet.
rows = ss.setdefault("sweep_docs", {})
keys = [sweep.config_key(c.as_dict()) for c in grid]
todo = [c for c, k in zip(grid, keys) if "error" in rows.get(k, {"error": None})]
done = len(grid) - len(todo)
# On a public server one click runs at most PUBLIC_SWEEP_MAX_RUNS configurations (a 1,872-run grid
# would hold the worker ~1.6 h); Resume runs the next ones. Said before the click.
cap = PUBLIC_SWEEP_MAX_RUNS if history.public_mode() else None
batch = todo[:cap] if cap else todo
runs = f"{len(grid)} run{'' if len(grid) == 1 else 's'}"
label = (f"Run sweep ({runs})" if not done else
         f"Resume sweep ({len(todo)} of {len(grid)} left)" if todo else f"Sweep done ({runs})")
if len(batch) < len(todo):
    label = (f"Run the first {len(batch)} of {runs}" if not done else
             f"Resume sweep (next {len(batch)} of {len(todo)} left)")
    st.info(f"This server is shared: one click runs at most {cap} configurations, so other visitors' "
            f"runs are not held up. This grid has {len(todo)} left to run: **{label}** now, then "
            "click again for the next ones (completed rows are kept).", icon=":material/group:")
a, b = st.columns([1, 4])
start = a.button(label, key="sweep_run", type="primary", disabled=not todo)
if b.button("Clear results", key="sweep_clear"):
    rows.clear()
    st.rerun()


def _time_cell(cfgs: list[RunConfig], docs: list[dict], say) -> None:
    """One cell's policies timed together in the worker, interleaved, each median with its 95 %
    interval written into its row (``sweep.time_interleaved``); ExecutionError when it fails."""
    say(f"w{cfgs[0].width} b{cfgs[0].batch}: timing {len(cfgs)} "
        f"polic{'y' if len(cfgs) == 1 else 'ies'} interleaved")
    on_device = _sidebar._device_limit() is not None  # the programs in the device's memory, not here
    need = estimate_process_bytes(cfgs[0], on_device) + (0 if on_device else (len(cfgs) - 1)
                                                         * estimate_bytes(cfgs[0]))
    payload = {"config": cfgs[0].as_dict(), "configs": [c.as_dict() for c in cfgs],
               "flops": [d.get("flops") for d in docs]}
    timed = _running.pool().call("sweep_time", payload, need=need, progress=lambda m: say(str(m)),
                                 session=_running._session_id())  # in this visitor's lane, like its runs
    for doc, fields in zip(docs, timed):
        doc.update(fields)


if start:
    t0 = time.perf_counter()
    # Live: elapsed, configurations done of planned, time left, and each row as its cell is timed.
    status, live = _progress.running(f"Sweeping {len(batch)} configurations…", _progress.SWEEP,
                                     title="Finished in this click")
    track = _progress.Counted(live, planned=len(batch), unit="configurations", item="configuration")
    with status:
        # Untimed here: each cell's policies are timed together afterwards (as the CLI's sweep).
        run = lambda c: _running.run_config(c, status, prefix=f"w{c.width} b{c.batch} {c.policy}: ",
                                            timed=False, say=track)
        time_cell = lambda cfgs, docs: _time_cell(cfgs, docs, track)
        outcomes = sweep.run_grid([c.as_dict() for c in batch], run, time_cell=time_cell)
        for outcome in outcomes:
            rows[sweep.config_key(outcome.row["config"])] = outcome.row  # kept if interrupted
            if "error" not in outcome.row:
                _record.record(outcome.row, kind="sweep")
            c = outcome.row["config"]
            track.finished(_progress.sweep_row(outcome.row),
                           f"w{c['width']} b{c['batch']} {c['policy']}: done")
        status.update(label=f"Done: sweep of {len(grid)} configurations", state="complete")
    ss["sweep_note"] = (f"Swept {len(batch)} configurations in {time.perf_counter() - t0:.1f} s."
                        + (f" {len(todo) - len(batch)} left: click **Resume sweep** for the next ones."
                           if len(batch) < len(todo) else ""))
    st.rerun()  # the button and the rows as they are now

if note := ss.pop("sweep_note", None):
    st.success(note, icon=":material/check:")

docs = [rows[k] for k in keys if k in rows]
for doc in docs:
    if "error" in doc:
        c = doc["config"]
        st.error(f"width {c['width']}, batch {c['batch']}, {c['policy']}: "
                 f"{_views.md(doc['error']['message'])}")
done_docs = [d for d in docs if "error" not in d]
others = len(rows) - len(docs)
if others:
    st.caption(f"{others} row{'' if others == 1 else 's'} from other selections kept for this session "
               "(choose them again to see them; **Clear results** drops them).")
if not done_docs:
    st.info("Choose the grid and click **Run sweep**. Completed rows appear here and stay if the sweep "
            "is interrupted or you leave the page; **Resume sweep** runs only the missing ones.")
    st.stop()
if len(done_docs) < len(grid):
    st.warning(f"Partial sweep: {len(done_docs)} of {len(grid)} runs completed. **Resume sweep** runs "
               "the others; the completed rows are kept.")
_views.sweep_view(tables.summary_frame(done_docs), key="sweep")
st.download_button("Download JSON lines", _views.json_lines(done_docs), "remat_lab_sweep.jsonl",
                   "application/jsonl", key="sweep_jsonl",
                   help="The whole documents, as `python -m remat_lab sweep --out` writes them: "
                        "open them again on the Open results page.")
