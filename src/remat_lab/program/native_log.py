"""XLA's, libtpu's and JAX's log lines and warnings kept off the user's terminal: captured, then summarized.

XLA and libtpu write their C++ log lines (e.g. the rematerialization pass's "Can't reduce memory
use below ...") to the process's file descriptor 2, and JAX warns through Python's ``warnings``
(e.g. the compilation cache's ``UserWarning``). ``captured_logs`` points descriptor 2 at a
temporary file and records warnings for the block, while Python's own ``sys.stderr`` (the lab's
progress lines and errors) still reaches the terminal through a copy of the original descriptor.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

SHOW_ENV = "REMAT_LAB_SHOW_LOGS"  # "1": replay what was captured, raw, when the block ends
_NOISE = re.compile(r"All log messages before absl::InitializeLog|cudart_stub\.cc|"
                    r"Could not find cuda drivers")
_REMAT = re.compile(r"hlo_rematerialization\.cc")


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


def _writes_to_fd2(stream) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


@contextlib.contextmanager
def captured_logs() -> Iterator[Captured]:
    """Descriptor 2 to a temporary file and warnings recorded for the block (see the module)."""
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
        try:
            yield found
        finally:
            sys.stderr.flush()
            sys.stderr = old_stderr
            os.dup2(saved, 2)
            os.close(saved)
            terminal.close()
            tmp.seek(0)
            found.lines = tmp.read().decode(errors="replace").splitlines()
            found.warnings = [f"{w.category.__name__}: {w.message}" for w in caught]
            if os.environ.get(SHOW_ENV) == "1":
                for line in [*found.lines, *found.warnings]:
                    print(line, file=sys.stderr)
