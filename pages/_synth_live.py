"""The synthesizer's progress on its page: its compile lines as counted steps, the compiles so far as a table.

``synthesize`` says one line as each compile starts (``compile 3/14: save l1, ...`` for the plan's,
``named 1/2 nothing_saveable: compiling batch 105`` for a named policy's), so a line also says
that the compile before it finished: ``Lines`` turns each into a ``Step`` for ``_progress.Live``
(elapsed, the plan's compiles done of at most its limit, an estimate of the time left from the
pace so far, labelled as one) with a row per finished compile, what it compiled and how long it took.
"""

from __future__ import annotations

import re
import threading
import time

from pages import _progress
from remat_lab.studies.progress import Step

_COUNT = re.compile(r"^compile (\d+)/(\d+): ")
COLUMNS = [("what", "compiled", _progress._text), ("took_s", "compile time", _progress._seconds)]


class Lines:
    """A ``synthesize`` progress callback drawn by ``live`` (see the module docstring)."""

    def __init__(self, live: _progress.Live, clock=time.time) -> None:
        self.live, self.tick, self._clock = live, live.tick, clock
        self.t0 = clock()
        self.rows: list[dict] = []
        self._current: tuple[str, float] | None = None
        self._count: tuple[int, int] | None = None
        self._lock = threading.Lock()

    def __call__(self, message: str) -> None:
        with self._lock:
            step = self._step(str(message), self._clock())
        self.live(step)

    def _step(self, text: str, now: float) -> Step:
        if self._current is not None:
            what, started = self._current
            self.rows.append({"what": what, "took_s": now - started})
        self._current = (text, now)
        m = _COUNT.match(text)
        if m:
            self._count = (int(m.group(1)), int(m.group(2)))
        elapsed = now - self.t0
        if self._count is None:
            return Step(text, phase="compiling", elapsed_s=elapsed, rows=tuple(self.rows), at=now)
        started, limit = self._count
        done = started - 1
        left = elapsed / done * max(limit - done, 0) if done else None
        return Step(text, phase="compiling", done=done, planned=limit, unit="compiles for the plan",
                    item="compile", at_most=True, elapsed_s=elapsed, phase_s=elapsed,
                    finished_s=elapsed, left_s=left,
                    left_why="at most (estimated from the pace so far, the named policies' "
                             "compiles besides)", rows=tuple(self.rows), at=now)

    def compiled(self) -> list[str]:
        """What was compiled or being compiled, in order (for a stopped synthesis's words)."""
        return [r["what"] for r in self.rows] + ([self._current[0]] if self._current else [])
