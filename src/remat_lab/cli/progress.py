"""A subcommand's progress on stderr: a bar on a terminal, one plain line per step otherwise.

Stdout stays the answer (text or JSON). A study's progress callback gets lines, some of them
``studies.progress.Step``s that also carry the items done and planned and the time left; a terminal
shows them as one bar (the line, done of planned, time elapsed and left), a file or a pipe gets one
line per step with the seconds since the start: ``[   12.3 s] 3/7 minimal: compiling batch 8 (2 of
7 policies sized · about 40 s left (estimated: 20 s per policy so far))``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from remat_lab.studies.progress import Step


class StderrProgress:
    """The callback (``progress(message)``) and ``line(text)``, a line kept above the bar."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr  # read now: the CLI points it past XLA's log capture
        self.t0, self._lock, self.bar = time.perf_counter(), threading.Lock(), None
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())

    def _stamp(self) -> str:
        return f"[{time.perf_counter() - self.t0:7.1f} s]"

    def __call__(self, message: str) -> None:
        counts = message.summary(elapsed=False) if isinstance(message, Step) else ""
        if self.bar is not None:
            fields = {"description": str(message)[:90], "left": counts}
            if isinstance(message, Step) and message.planned:
                fields.update(total=message.planned, completed=message.done or 0)
            self.bar.update(self._task, **fields)
            return
        with self._lock:
            print(f"{self._stamp()} {message}" + (f" ({counts})" if counts else ""), file=self.stream,
                  flush=True)

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.console.print(f"{self._stamp()} {text}", markup=False, highlight=False)
            return
        with self._lock:
            print(f"{self._stamp()} {text}", file=self.stream, flush=True)

    def start(self) -> None:
        if not self.terminal:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=self.stream, soft_wrap=True)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.fields[left]}"), console=console,
                            transient=True, redirect_stdout=False)  # stdout: the answer, untouched
        self.bar.start()
        self._task = self.bar.add_task("starting", total=None, left="")

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


@contextmanager
def stderr_progress(stream=None) -> Iterator[StderrProgress]:
    """A ``StderrProgress`` for the block: its bar (on a terminal) is gone when the block ends."""
    out = StderrProgress(stream)
    out.start()
    try:
        yield out
    finally:
        out.stop()
