"""Live progress on a page: time elapsed, items done and planned, time left, and the finished rows as a table.

A study's progress callback gets lines; the engine's ``studies.progress.Step`` lines also carry
the counts and the rows finished so far. ``Live`` is such a callback: the status box's label is the
line, under it a bar says the time elapsed, done of planned and the time left (the engine's
estimate, labelled as one), and a table (``st.dataframe`` in an ``st.empty``, redrawn in place)
holds the finished rows. ``tick`` redraws the clock between lines (``_running.cached_call`` calls
it while it waits on the worker). The column lists say how each kind of row is shown.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pandas as pd
import streamlit as st

from pages import _running
from remat_lab.config import human_bytes, human_seconds
from remat_lab.serve import quotas, safe_text
from remat_lab.serve.jobs import TimeLimit
from remat_lab.studies.progress import Step, Tracker, duration

Format = Callable[[object, dict], str]


def _text(v, row) -> str:
    return "" if v is None else str(v)


def _bytes(v, row) -> str:
    return "" if v is None else human_bytes(v)


def _seconds(v, row) -> str:
    return "" if v is None else human_seconds(v)


def _batch(v, row) -> str:
    """A sized policy's largest batch: a lower bound at the search's limit, 0 said in words."""
    if v is None:
        return ""
    if row.get("limited_by") == "search_limit":
        return f"≥ {v} (the search's limit)"
    return "none (batch 1 does not fit)" if v == 0 else str(v)


def _error(v, row) -> str:
    """An error's text as a cell (plain text, never Markdown), folders cut as in the error boxes."""
    return "" if v is None else safe_text.strip_paths(str(v))[:200]


def _per_device(v, row) -> str:
    """The batch per device where it differs from the global one (on a mesh)."""
    return "" if v is None or v == row.get("max_batch") else str(v)


def _check(v, row) -> str:
    return {True: "ok", False: "MISMATCH"}.get(v, "")


def _fits(v, row) -> str:
    return {True: "yes", False: "no"}.get(v, "")


# (row key, column header, format): a column whose cells are all empty is left out.
ADVICE = [("policy", "policy", _text), ("max_batch", "largest batch", _batch),
          ("per_device_batch", "per device", _per_device),
          ("peak_bytes", "compiled peak (per device)", _bytes),
          ("next_batch", "next batch", _text), ("next_peak_bytes", "peak at the next batch", _bytes),
          ("compiles", "compiles", _text)]
COMPARE = [("policy", "policy", _text), ("peak_bytes", "compiled peak", _bytes),
           ("compile_s", "compile time", _seconds), ("grad_ok", "gradient check", _check),
           ("error", "failed", _error)]
TARGETS = [("target", "target", _text), ("policy", "policy", _text),
           ("peak_bytes", "compiled peak (per device)", _bytes), ("fits", "fits", _fits),
           ("predicted_s", "predicted step", _seconds),
           ("estimate_s", "roofline bound", _seconds), ("error", "failed", _error)]
SWEEP = [("width", "width", _text), ("batch", "batch", _text), ("policy", "policy", _text),
         ("median_s", "median step", _seconds), ("peak_bytes", "compiled peak", _bytes),
         ("error", "error", _error)]


def rows_frame(rows, columns: list[tuple[str, str, Format]]) -> pd.DataFrame:
    """``rows`` (dicts) as text columns, headed as ``columns`` say; all-empty columns left out."""
    data = {head: [fmt(r.get(key), r) for r in rows] for key, head, fmt in columns}
    return pd.DataFrame({h: v for h, v in data.items() if any(v)}, columns=[
        h for h, v in data.items() if any(v)])


class Live:
    """A study's progress callback drawn on the page (see the module docstring). Make it with
    ``running``: its bar and table sit under the status box."""

    def __init__(self, status, columns: list | None = None, words: Callable[[str], str] | None = None,
                 title: str = "Finished so far") -> None:
        self.status, self.columns, self.words, self.title = status, columns, words, title
        self._bar, self._table = st.empty(), st.empty()
        self.t0, self._drawn = time.time(), 0.0
        self.step: Step | None = None
        self.rows: tuple = ()
        self._shown: tuple = ()
        self._script = threading.get_ident()

    def __call__(self, message: str) -> None:
        if isinstance(message, Step):
            self.step, self.rows = message, message.rows
        if threading.get_ident() != self._script:
            return  # an engine thread (a pool of size 0 runs the study here): drawn by the script later
        text = self.words(message) if self.words else str(message)
        self.status.update(label=f"{text}…", state="running")
        self._draw()

    def tick(self) -> None:
        """Redraw the clock (at most once a second)."""
        if time.time() - self._drawn >= 1.0:
            self._draw()

    def summary(self) -> str:
        if self.step is None:
            return f"{duration(time.time() - self.t0)} elapsed"
        return self.step.summary()

    def _draw(self, text: str | None = None) -> None:
        self._drawn = time.time()
        text, fraction = text or self.summary(), self.step.fraction() if self.step else None
        if fraction is None:
            self._bar.caption(text)
        else:
            self._bar.progress(fraction, text=text)
        if self.rows != self._shown:
            self._draw_table()

    def _draw_table(self) -> None:
        self._shown = self.rows
        if self.columns is None or not self.rows:
            return
        with self._table.container():
            st.caption(f"{self.title} ({len(self.rows)}):")
            st.dataframe(rows_frame(self.rows, self.columns), hide_index=True, width="stretch")

    def clear(self) -> None:
        """The study finished: its answer is drawn below, the live parts go."""
        self._bar.empty()
        self._table.empty()

    def stopped(self) -> None:
        """The study stopped early: the clock stops, the finished rows stay."""
        step = self.step
        took = step.elapsed_s + time.time() - step.at if step else time.time() - self.t0
        self._draw(f"Stopped after {duration(took)}" + (f" · {step.counts()}" if step and step.counts()
                                                        else ""))


class Counted(Tracker):
    """A page's own count of its items (the Sweep's configurations) drawn by ``live``; ``tick``
    keeps its clock going while a configuration runs in the worker."""

    def __init__(self, live: Live, *, planned: int, unit: str, item: str) -> None:
        super().__init__(live, planned=planned, unit=unit, item=item, phase="running")
        self.tick = live.tick


def sweep_row(doc: dict) -> dict:
    """A sweep row (a run document or an error row) as the live table's row."""
    c, err = doc.get("config") or {}, doc.get("error")
    return {"width": c.get("width"), "batch": c.get("batch"), "policy": c.get("policy"),
            "median_s": (doc.get("step_time_s") or {}).get("median"),
            "peak_bytes": (doc.get("memory") or {}).get("peak_bytes"),
            "error": f"{err['kind']}: {err['message']}" if err else None}


def running(label: str, columns: list | None = None, words: Callable[[str], str] | None = None,
            title: str = "Finished so far"):
    """``(status, live)``: a collapsed status box labelled ``label`` and its ``Live`` under it
    (enter the status with ``with status:``)."""
    status = st.status(label, expanded=False)
    return status, Live(status, columns, words, title)


def stopped_with_rows(live: Live, error: Exception, planned: int, what: str = "policies") -> None:
    """A study that ended in ``error`` (a deadline, a lost worker, XLA): the error's box, and the
    rows finished before it kept on screen with a line that says so."""
    if live.rows or isinstance(error, TimeLimit):
        live.stopped()  # the clock stops where it was, and says how far the study got
    else:
        live.clear()
    _running.show_error(error)
    if live.rows:
        st.info(f"The {len(live.rows)} of {planned} {what} finished before the stop are in the table "
                "above. They are not kept by the server: a new click starts again.",
                icon=":material/table_rows:")


def deadline_note(kind: str, public: bool, rounds: int = 1) -> str:
    """Why a timed answer came from fewer rounds (or none): its job's deadline was near. A private
    server's owner is told the setting; a web visitor of a public one only that it is this server's
    limit."""
    limit = quotas.deadline_for(quotas.deadlines(), kind)
    text = (f"**Timing stopped {'early' if rounds else 'before its first round'}**, before this "
            "server's time limit for an advice" + (f" ({limit:.0f} s)" if limit else "")
            + (": the answer below is from the rounds finished by then." if rounds else
               ": the answer below is by the sizes alone.")
            + " Fewer policies or a smaller model leave more time for timing.")
    if not public:
        text += f" `${quotas.DEADLINE_ENV}` sets the limits (0 or off: none)."
    return text
