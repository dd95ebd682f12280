"""XLA's, libtpu's and JAX's log lines and warnings kept off the user's terminal: captured, then summarized.

XLA and libtpu write their C++ log lines (e.g. the rematerialization pass's "Can't reduce memory
use below ...") to the process's file descriptor 2, and JAX warns through Python's ``warnings``
(e.g. the compilation cache's ``UserWarning``). ``captured_logs`` points descriptor 2 at a
temporary file and records warnings for the block, while Python's own ``sys.stderr`` (the lab's
progress lines and errors) still reaches the terminal through a copy of the original descriptor.

Captures nest: an inner one (a run's or an advice's document, ``logged``, inside the CLI's) takes
what is written to the outermost one's file and warnings list while it lasts, so the document and
the command's one-line summary both count it. ``Captured.document`` is the summary a document
carries (``compile.log`` of a run, ``log`` of an advice): counts and the first few distinct lines,
never the raw stream.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

SHOW_ENV = "REMAT_LAB_SHOW_LOGS"  # "1": replay what was captured, raw, when the block ends
_NOISE = re.compile(r"All log messages before absl::InitializeLog|cudart_stub\.cc|"
                    r"Could not find cuda drivers")
_REMAT = re.compile(r"hlo_rematerialization\.cc")
# absl's prefix: severity and date, time, thread id (``W1201 12:00:00.123456   4242 ``)
_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ ")
KEPT = 5  # distinct lines of each kind a document keeps
KEPT_CHARS = 400
_LOCK = threading.Lock()
_OUTER: list = []  # the outermost capture's (file, recorded warnings), one entry per open capture


@dataclass
class Captured:
    """What a block wrote: native log ``lines`` and Python ``warnings`` (``category: message``)."""

    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str | None:
        """One sentence for the terminal, or None when nothing worth saying was written."""
        real = [ln for ln in self.lines if ln.strip() and not _NOISE.search(ln)]
        if not real and not self.warnings:
            return None
        remat = sum(bool(_REMAT.search(ln)) for ln in real)
        parts = [f"{len(real)} XLA log line{'s' * (len(real) != 1)}"] if real else []
        if self.warnings:
            parts.append(f"{len(self.warnings)} JAX warning{'s' * (len(self.warnings) != 1)}")
        text = " and ".join(parts) + " kept from this terminal"
        if remat:
            text += (f" ({remat} from XLA's own rematerialization pass: its programs were over the "
                     "device's memory; the documents' xla_remat fields say what it did)")
        return text + f"; {SHOW_ENV}=1 shows them."

    def document(self) -> dict:
        """The summary a document carries: ``lines`` (XLA's log lines, start-up noise left out),
        ``xla_remat_lines`` (its rematerialization pass's) and ``xla_lines`` (the others), the
        first ``KEPT`` distinct of each without absl's prefix; ``warnings`` likewise with
        ``warnings_total``; ``shown_with`` (how to see them raw)."""
        real = [_PREFIX.sub("", ln).strip() for ln in self.lines if ln.strip() and not _NOISE.search(ln)]
        return {"lines": len(real), "xla_remat_lines": _first([ln for ln in real if _REMAT.search(ln)]),
                "xla_lines": _first([ln for ln in real if not _REMAT.search(ln)]),
                "warnings": _first(self.warnings), "warnings_total": len(self.warnings),
                "shown_with": f"{SHOW_ENV}=1"}


def _first(lines: list[str]) -> list[str]:
    """The first ``KEPT`` distinct of ``lines``, each cut to ``KEPT_CHARS``."""
    out: list[str] = []
    for line in lines:
        line = line if len(line) <= KEPT_CHARS else line[:KEPT_CHARS - 1] + "…"
        if line not in out:
            out.append(line)
        if len(out) == KEPT:
            break
    return out


def _writes_to_fd2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


def _format(w) -> str:
    return f"{w.category.__name__}: {w.message}"


@contextlib.contextmanager
def _nested(outer: tuple, mark: tuple[int, int]) -> Iterator[Captured]:
    """What is written to the outermost capture's file and warnings after ``mark`` (the file's
    size and the warnings' count when the block began), while the block lasts."""
    (tmp, caught), (start, first) = outer, mark
    found = Captured()
    try:
        yield found
    finally:
        found.warnings = [_format(w) for w in caught[first:]]
        with _LOCK:
            if _OUTER:  # else the outermost ended first (another thread's): its file is gone
                _OUTER.pop()
                end = os.fstat(tmp.fileno()).st_size
                found.lines = os.pread(tmp.fileno(), end - start, start).decode(errors="replace").splitlines()


@contextlib.contextmanager
def captured_logs() -> Iterator[Captured]:
    """Descriptor 2 to a temporary file and warnings recorded for the block (see the module)."""
    with _LOCK:
        outer = _OUTER[0] if _OUTER else None
        if outer is not None:
            _OUTER.append(outer)
            mark = (os.fstat(outer[0].fileno()).st_size, len(outer[1]))
    if outer is not None:
        with _nested(outer, mark) as found:
            yield found
        return
    found = Captured()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, io.UnsupportedOperation):  # no real descriptor 2: nothing to keep
        yield found
        return
    old_stderr = sys.stderr
    with tempfile.TemporaryFile() as tmp, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        terminal = os.fdopen(os.dup(saved), "w", buffering=1, encoding="utf-8", errors="replace")
        os.dup2(tmp.fileno(), 2)
        if _writes_to_fd2(old_stderr):  # else (a test's capture, a pipe of its own) left as it is
            sys.stderr = terminal
        with _LOCK:
            _OUTER.append((tmp, caught))
        try:
            yield found
        finally:
            with _LOCK:
                _OUTER.clear()
            sys.stderr.flush()
            sys.stderr = old_stderr
            os.dup2(saved, 2)
            os.close(saved)
            terminal.close()
            tmp.seek(0)
            found.lines = tmp.read().decode(errors="replace").splitlines()
            found.warnings = [_format(w) for w in caught]
            if os.environ.get(SHOW_ENV) == "1":
                for line in [*found.lines, *found.warnings]:
                    print(line, file=sys.stderr)


def logged(key: str) -> Callable:
    """A decorator: the function's document (a dict) gets ``Captured.document`` of what it wrote at
    ``key`` (``"compile.log"``: under the document's ``compile``)."""
    def wrap(fn: Callable[..., dict]) -> Callable[..., dict]:
        @functools.wraps(fn)
        def inner(*args, **kwargs) -> dict:
            with captured_logs() as logs:
                doc = fn(*args, **kwargs)
            where = doc
            *path, last = key.split(".")
            for part in path:
                where = where.setdefault(part, {})
            where[last] = logs.document()
            return doc
        return inner
    return wrap
