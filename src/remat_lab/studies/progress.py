"""A study's progress as it runs: each line also carries its counts, the time spent and the finished rows.

Studies report progress to a callback of one string (``Callable[[str], None]``: the CLI prints it,
the app's status box shows it). ``Step`` is such a string that also carries numbers: ``done`` of
``planned`` ``unit`` in the current ``phase``, the seconds since the study started (``elapsed_s``),
since its phase started (``phase_s``) and from then to its last finish (``finished_s``), a known
time left (``left_s``, e.g. a time budget) and the rows of the items finished so far (``rows``:
JSON-ready dicts, the partial table). A callback that only knows strings sees the plain line;
``summary`` words the numbers the same way for the CLI (``cli/progress``) and the pages
(``pages/_progress``). ``Tracker`` makes the steps of one study and is thread-safe (the advisor
sizes two policies at once). No JAX here: a step crosses the worker's reply queue pickled, and the
server unpickles it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

FIELDS = ("phase", "done", "planned", "unit", "item", "at_most", "elapsed_s", "phase_s", "finished_s",
          "left_s", "left_why", "after", "rows", "at")


def _rebuild(text: str, fields: dict) -> Step:
    return Step(text, **fields)


class Step(str):
    """One progress line with its numbers (see the module docstring). ``at``: the wall-clock time it
    was made (``time.time()``), so a reader later can add the time since; ``at_most``: ``planned``
    is an upper bound (timing rounds end early once the answer is clear); ``after``: what follows
    this phase, said with the time left (e.g. "then up to 30 s of timing")."""

    def __new__(cls, text: str, *, phase: str = "", done: int | None = None, planned: int | None = None,
                unit: str = "", item: str = "item", at_most: bool = False, elapsed_s: float = 0.0,
                phase_s: float = 0.0, finished_s: float | None = None, left_s: float | None = None,
                left_why: str = "", after: str = "",
                rows: tuple[dict, ...] = (), at: float | None = None) -> Step:
        self = super().__new__(cls, text)
        self.phase, self.done, self.planned, self.unit, self.at_most = phase, done, planned, unit, at_most
        self.item = item
        self.elapsed_s, self.phase_s, self.left_s, self.left_why = elapsed_s, phase_s, left_s, left_why
        self.finished_s = phase_s if finished_s is None else finished_s
        self.after, self.rows = after, tuple(rows)
        self.at = time.time() if at is None else at
        return self

    def __reduce__(self):
        return _rebuild, (str(self), self.fields())

    def fields(self) -> dict:
        return {k: getattr(self, k) for k in FIELDS}

    def per_item_s(self) -> float | None:
        """The phase's seconds per finished item, up to the last finish (None before the first)."""
        return self.finished_s / self.done if self.done else None

    def eta_s(self, since: float = 0.0) -> float | None:
        """Seconds left in this phase ``since`` seconds after the step was made: the known
        ``left_s``, else estimated from the finished items (seconds per finished item times the
        items left, less the time already spent on the next one); None before the first item
        finishes or without a plan."""
        if self.left_s is not None:
            return max(self.left_s - since, 0.0)
        if not self.done or self.planned is None or self.done > self.planned or self.at_most:
            return None
        spent = self.phase_s - self.finished_s + since  # on the items not finished yet
        return max(self.per_item_s() * (self.planned - self.done) - spent, 0.0)

    def summary(self, now: float | None = None, elapsed: bool = True) -> str:
        """``41 s elapsed · 2 of 7 policies sized · about 1 min 40 s left (estimated: 20 s per
        policy so far)``; ``now`` (``time.time()``) adds the time since the step was made;
        ``elapsed=False`` leaves the elapsed time out (a line that says it already)."""
        since = max((time.time() if now is None else now) - self.at, 0.0)
        parts = [f"{duration(self.elapsed_s + since)} elapsed"] if elapsed else []
        if self.counts():
            parts.append(self.counts())
        eta = self.eta_s(since)
        if eta is not None and self.left_s is not None:
            parts.append(f"{duration(eta)} left{' ' + self.left_why if self.left_why else ''}")
        elif eta is not None:
            pace = duration(self.per_item_s(), precise=True)
            running = self.phase_s - self.finished_s + since  # on the items not finished yet
            if eta < 1 and self.done < self.planned and running >= 1:  # the estimate is overrun
                parts.append(f"past the estimate: {duration(running)} on the next {self.item} so "
                             f"far, {pace} per {self.item} before it")
            else:
                left = f"about {duration(eta)} left" if eta >= 1 else "about to finish"
                parts.append(f"{left} (estimated: {pace} per {self.item} so far)")
        elif self.planned is not None and not self.done and not self.at_most:
            parts.append("time left estimated once the first finishes")
        if self.after:
            parts.append(self.after)
        return " · ".join(parts)

    def counts(self) -> str:
        """``2 of 7 policies sized`` (``""`` without a plan)."""
        if self.planned is None or self.done is None:
            return ""
        return f"{self.done} of {'≤' if self.at_most else ''}{self.planned} {self.unit}".rstrip()

    def fraction(self) -> float | None:
        """How much of the phase is done, 0 to 1 (None without a plan)."""
        if self.planned and self.done is not None:
            return min(max(self.done / self.planned, 0.0), 1.0)
        return None


def duration(s: float, precise: bool = False) -> str:
    """``7`` -> ``'7 s'``, ``100`` -> ``'1 min 40 s'``, ``4000`` -> ``'1 h 06 min'``; ``precise``
    keeps what is under 10 s: ``0.25`` -> ``'250 ms'``, ``3.14`` -> ``'3.1 s'`` (a time per item)."""
    if precise and s < 10:
        return f"{s * 1e3:.0f} ms" if s < 1 else f"{s:.1f} s"
    s = max(int(round(s)), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Tracker:
    """The steps of one study: ``tracker(message)`` reports a line with the current counts,
    ``finished(row, message)`` counts one more item done and keeps its row, ``phase(...)`` starts
    the next phase (counts from zero, rows kept). ``unit`` names the items with what was done
    to them ("policies sized"), ``item`` one of them ("policy", for "20 s per policy"). A ``Step``
    given to ``tracker(...)`` keeps its own counts (e.g. timing rounds) and their pace (``phase_s``)
    and gets the elapsed time and rows. ``say`` gets every step."""

    def __init__(self, say: Callable[[str], None] | None = None, *, planned: int | None = None,
                 unit: str = "", item: str = "item", phase: str = "", after: str = "",
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._say, self._clock, self._lock = say or (lambda message: None), clock, threading.Lock()
        self.t0 = self._p0 = clock()
        self._finished = 0.0  # the phase's time at its last finish
        self.rows: list[dict] = []
        self._state = {"phase": phase, "done": 0 if planned is not None else None, "planned": planned,
                       "unit": unit, "item": item, "after": after}

    def _step(self, message: str) -> Step:
        now = self._clock()
        fields = {**self._state, "elapsed_s": now - self.t0, "phase_s": now - self._p0,
                  "finished_s": self._finished, "rows": tuple(self.rows)}
        if isinstance(message, Step) and message.done is not None:  # its own counts, and their pace
            fields.update({k: getattr(message, k) for k in ("done", "planned", "unit", "item", "at_most",
                                                             "phase_s", "finished_s", "left_s", "left_why",
                                                             "after")})
        return Step(str(message), **fields)

    def __call__(self, message: str) -> None:
        with self._lock:
            step = self._step(message)
        self._say(step)

    def finished(self, row: dict | None, message: str) -> None:
        """One more item of this phase done; ``row`` (if any) joins the finished rows."""
        with self._lock:
            if self._state["done"] is not None:
                self._state["done"] += 1
            if row is not None:
                self.rows.append(row)
            self._finished = self._clock() - self._p0
            step = self._step(message)
        self._say(step)

    def phase(self, name: str, *, planned: int | None = None, unit: str = "", item: str = "item",
              after: str = "") -> None:
        with self._lock:
            self._p0, self._finished = self._clock(), 0.0
            self._state = {"phase": name, "done": 0 if planned is not None else None,
                           "planned": planned, "unit": unit, "item": item, "after": after}
