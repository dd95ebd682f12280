"""Uploads held before their parse ends: one file per session, a byte budget per session and in all.

The web server keeps an uploaded file's bytes in memory (Streamlit's upload manager) from the
moment it arrives until the page lets go of it; nothing there caps files per session or in total.
``bound_manager`` wraps such a manager (any object with ``add_file(session_id, file)``,
``remove_file(session_id, file_id)`` and ``remove_session_files(session_id)``; ``file`` has
``file_id``, ``name`` and ``data``) so that every file passes ``UploadBudget.admit`` first: a
session holds at most one file at a time and ``per_session`` bytes, all sessions together at most
``total`` bytes. A refused file is not stored (its bytes are dropped when its request ends) and the
session's next page run reads why (``take_refusals``: one sentence each, the file's name apart so
the page escapes it). The page removes a file from the manager as soon as it is parsed, which gives
its bytes back to the budget; a session that ends gives back everything it held (``on_end``).
A closed tab's session is never ended by the web server itself (it is kept for a reconnection, then
dropped without its files being removed): ``SessionReaper`` ends the sessions it has not seen
connected for that long.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
import time
from collections.abc import Callable, Hashable

from remat_lab.config import human_bytes
from remat_lab.store import results

PER_SESSION_BYTES = results.MAX_BYTES  # one file at a time, each at most the largest results file
TOTAL_BYTES = 2 * results.MAX_BYTES  # every session's uploads not yet parsed, together
MAX_REFUSALS = 4  # sentences kept per session until its page shows them
MAX_SESSIONS = 1024  # sessions with sentences not yet shown (the oldest are forgotten)


class UploadBudget:
    """Bytes of uploaded files held per session (``file_id`` -> bytes) and in all; thread-safe."""

    def __init__(self, per_session: int = PER_SESSION_BYTES, total: int = TOTAL_BYTES) -> None:
        self.per_session, self.total = int(per_session), int(total)
        self._held: dict[Hashable, dict[str, tuple[str, int]]] = {}  # session -> file_id -> (name, bytes)
        self._refused: dict[Hashable, list[tuple[str, str]]] = {}  # session -> (file name, sentence)
        self._lock = threading.Lock()

    def admit(self, session: Hashable, file_id: str, name: str, nbytes: int) -> str | None:
        """Hold ``nbytes`` for ``session``'s file; None when admitted, else the sentence why not (also
        kept for ``take_refusals``). The same file again (same id) replaces itself."""
        with self._lock:
            mine = self._held.get(session, {})
            other = next((n for fid, (n, _) in mine.items() if fid != file_id), None)
            in_all = self.in_flight_locked() - mine.get(file_id, ("", 0))[1]
            if other is not None:
                why = ("not read: one file at a time per visitor, and your previous file is still "
                       "being read; upload this one again when that one is shown.")
            elif nbytes > self.per_session:
                why = (f"not read: {human_bytes(nbytes)} is over the {human_bytes(self.per_session)} "
                       "a file may have.")
            elif in_all + nbytes > self.total:
                why = (f"not read now: this server is reading other visitors' uploads "
                       f"({human_bytes(in_all)} of the {human_bytes(self.total)} it reads at once); "
                       "upload it again in a minute.")
            else:
                self._held.setdefault(session, {})[file_id] = (name, int(nbytes))
                return None
            self._refuse_locked(session, name, why)
            return why

    def _refuse_locked(self, session: Hashable, name: str, why: str) -> None:
        said = self._refused.pop(session, [])  # re-inserted last: the dict's order is by recency
        self._refused[session] = (said + [(name, why)])[-MAX_REFUSALS:]
        while len(self._refused) > MAX_SESSIONS:
            del self._refused[next(iter(self._refused))]

    def release(self, session: Hashable, file_id: str) -> int:
        """Give back what ``session``'s file held; the bytes released (0 if it held none)."""
        with self._lock:
            mine = self._held.get(session, {})
            _, nbytes = mine.pop(file_id, ("", 0))
            if not mine:
                self._held.pop(session, None)
            return nbytes

    def on_end(self, session: Hashable) -> None:
        """The session ended: everything it held is given back and its unread sentences dropped."""
        with self._lock:
            self._held.pop(session, None)
            self._refused.pop(session, None)

    def held(self, session: Hashable) -> int:
        with self._lock:
            return sum(n for _, n in self._held.get(session, {}).values())

    def in_flight(self) -> int:
        """Bytes held by every session together."""
        with self._lock:
            return self.in_flight_locked()

    def in_flight_locked(self) -> int:
        return sum(n for files in self._held.values() for _, n in files.values())

    def take_refusals(self, session: Hashable) -> list[tuple[str, str]]:
        """``(file name, sentence)`` for each of ``session``'s files refused since its last call."""
        with self._lock:
            return self._refused.pop(session, [])


BUDGET = UploadBudget()  # the server's (one per process, like the parse cache)


def bound_manager(manager, budget: UploadBudget = BUDGET,
                  ended: Callable[[Hashable], None] | None = None):
    """``manager`` with every stored file admitted by ``budget`` first (idempotent: a manager
    already bound is returned as is). ``ended(session)`` runs when a session's files are removed
    (its end), after the budget has been given back. Returns ``manager``."""
    if getattr(manager, "_remat_lab_budget", None) is not None:
        return manager
    inner = (manager.add_file, manager.remove_file, manager.remove_session_files)  # Streamlit's own

    def add_file(session_id, file) -> None:
        if budget.admit(session_id, file.file_id, file.name, len(file.data)) is None:
            inner[0](session_id, file)

    def remove_file(session_id, file_id) -> None:
        inner[1](session_id, file_id)
        if budget.release(session_id, file_id):
            give_back_memory()

    def remove_session_files(session_id) -> None:
        inner[2](session_id)
        budget.on_end(session_id)
        if ended is not None:
            ended(session_id)
        give_back_memory()

    manager.add_file, manager.remove_file = add_file, remove_file
    manager.remove_session_files = remove_session_files
    manager._remat_lab_budget = budget
    return manager


class SessionReaper:
    """Ends the sessions the web server let go without ending them; thread-safe.

    Streamlit keeps a closed tab's session ``server.disconnectedSessionTTL`` seconds for a
    reconnection, then drops it from its storage without shutting it down, so nothing removes its
    files from the upload manager, gives back its upload budget or closes its open parses.
    ``seen(session)`` records a session (each script run); ``sweep`` ends, through ``end(session)``,
    each recorded session that ``alive`` has said is not connected for ``grace_s`` seconds on end
    (measured from the first sweep that found it gone: between ``grace_s`` and ``grace_s`` plus one
    sweep's period after the tab closed); ``start`` sweeps every ``period_s`` in a daemon thread.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._gone_since: dict[Hashable, float | None] = {}  # session -> first seen gone (None: alive)
        self._lock = threading.Lock()
        self._clock = clock
        self._thread: threading.Thread | None = None
        self.alive: Callable[[Hashable], bool] | None = None
        self.end: Callable[[Hashable], None] | None = None
        self.after: Callable[[], None] | None = None
        self.grace_s = 120.0

    def watch(self, alive: Callable[[Hashable], bool], end: Callable[[Hashable], None],
              grace_s: float, after: Callable[[], None] | None = None) -> None:
        """How to tell a session is connected, how to end one, how long it may be gone, and what to
        do once after a sweep that ended any (``after``: e.g. collect and give memory back)."""
        self.alive, self.end, self.grace_s, self.after = alive, end, float(grace_s), after

    def seen(self, session: Hashable) -> None:
        with self._lock:
            self._gone_since[session] = None

    def watched(self) -> int:
        """Sessions recorded and not ended yet."""
        with self._lock:
            return len(self._gone_since)

    def sweep(self) -> list[Hashable]:
        """End the sessions gone for ``grace_s``; those ended."""
        alive, end = self.alive, self.end
        if alive is None or end is None:
            return []
        now = self._clock()
        with self._lock:
            states = list(self._gone_since.items())
        over, marks = [], {}
        for session, since in states:
            if alive(session):
                marks[session] = None
            elif since is None:
                marks[session] = now
            elif now - since >= self.grace_s:
                over.append(session)
        with self._lock:
            for session, mark in marks.items():
                if session in self._gone_since:  # not ended meanwhile
                    self._gone_since[session] = mark
            for session in over:
                self._gone_since.pop(session, None)
        for session in over:
            try:
                end(session)
            except Exception:  # noqa: BLE001 - one session's clean-up must not stop the others'
                pass
        if over and self.after is not None:
            try:
                self.after()
            except Exception:  # noqa: BLE001 - the sweeper outlives a bad clean-up
                pass
        return over

    def start(self, period_s: float = 10.0) -> None:
        """Sweep every ``period_s`` seconds in a daemon thread (once per process)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._loop, args=(period_s,), daemon=True,
                                            name="remat-lab-session-reaper")
            self._thread.start()

    def _loop(self, period_s: float) -> None:
        while True:
            time.sleep(period_s)
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the sweeper outlives a bad sweep
                pass


REAPER = SessionReaper()  # the server's


_LIBC: list = []
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD = 128 << 10  # glibc's starting value, kept: blocks this large and larger are mmapped


def _libc():
    if not _LIBC:
        name = ctypes.util.find_library("c")
        lib = None
        try:
            lib = ctypes.CDLL(name) if name else None
        except OSError:
            pass
        _LIBC.append(lib if lib is not None and hasattr(lib, "malloc_trim") else None)
    return _LIBC[0]


def tune_allocator() -> bool:
    """For the long-lived web server (glibc; elsewhere a no-op, False): the mmap threshold fixed at
    ``MMAP_THRESHOLD``. glibc raises it each time a large mmapped block is freed, up to 32 MiB, so
    later large blocks (a figure's JSON, an upload's lines, a table's Arrow bytes) land on the heap
    and stay resident after they are freed; mmapped, they go back to the system when freed. (The
    number of malloc arenas, one per thread up to 8 per core, cannot be lowered once the server's
    threads run: that is the environment's ``MALLOC_ARENA_MAX``, set before it starts.) True when
    glibc took the setting."""
    lib = _libc()
    return lib is not None and hasattr(lib, "mallopt") and bool(lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def give_back_memory(collect: bool = False) -> None:
    """Ask the C allocator to return freed heap pages to the system (glibc's ``malloc_trim``), so
    the server's resident memory falls after an upload's bytes and parse are freed; elsewhere a
    no-op. (glibc keeps a freed block of a few MiB on its heap once its mmap threshold has grown.)
    ``collect``: first free what only reference cycles keep (an ended session's state is such: on
    an idle server nothing else would start Python's collector)."""
    if collect:
        gc.collect()
    lib = _libc()
    if lib is not None:
        lib.malloc_trim(0)
