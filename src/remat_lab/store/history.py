"""Run history: every completed run of the app or the CLI, kept in SQLite under ``REMAT_LAB_HOME``.

One table, ``runs``: when, what made it (``source`` app/cli, ``kind`` run/compare/sweep, the app
visitor), the configuration columns, the environment, the headline numbers and the whole JSON
document, each document once (a cached result shown again adds no row; ``visitors`` links it to
every visitor who saw it). WAL mode and a busy timeout let several app sessions and CLI processes
write at once; the file is held to ``$REMAT_LAB_HISTORY_MAX_BYTES`` (oldest runs out). A file that
is not a readable history raises ``HistoryError`` naming the file only (never its folder, which
visitors must not see); callers that must keep serving use ``try_record``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import socket
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HOME_ENV = "REMAT_LAB_HOME"
OFF_ENV = "REMAT_LAB_HISTORY"  # "off": record nothing
PUBLIC_ENV = "REMAT_LAB_PUBLIC"  # "1"/"0": force the public (shared by strangers) mode on or off
HOST_ENV = "REMAT_LAB_RECORD_HOST"  # "1": store the host name with each run
MAX_ENV = "REMAT_LAB_HISTORY_MAX_BYTES"  # the file's bound: 32M, 1G, bytes; 0 = none
MAX_BYTES = 32 << 20  # about 2,500 runs of 12.5 KB
WRITE_TIMEOUT_S = 30.0  # the CLI waits for a busy file; the app passes a short timeout
VERSION = 1  # PRAGMA user_version of the file
COLUMNS = ["id", "created", "source", "kind", "session_id", "shared", "model", "policy", "width",
           "batch", "seq", "depth", "stack", "dtype", "objective", "backend", "device_kind",
           "device_count", "jax", "host", "median_ms", "peak_bytes", "grad_ok", "error"]
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL, session_id TEXT,
    shared INTEGER NOT NULL DEFAULT 0,
    model TEXT, policy TEXT, width INTEGER, batch INTEGER, seq INTEGER, depth INTEGER, stack TEXT,
    dtype TEXT, objective TEXT,
    backend TEXT, device_kind TEXT, device_count INTEGER, jax TEXT, host TEXT,
    median_ms REAL, peak_bytes INTEGER, grad_ok INTEGER, error TEXT,
    digest TEXT NOT NULL, document TEXT NOT NULL,
    UNIQUE (digest, session_id)
);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created);
CREATE INDEX IF NOT EXISTS runs_digest ON runs (digest);
CREATE TABLE IF NOT EXISTS visitors (
    run_id INTEGER NOT NULL, visitor TEXT NOT NULL, PRIMARY KEY (run_id, visitor)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS visitors_visitor ON visitors (visitor);
"""


class HistoryError(RuntimeError):
    """The history file cannot be used; the message names the file (not its folder) and what to do."""


class HistoryBusy(HistoryError):
    """Another process held the history's write lock past the timeout: nothing was written."""


def home() -> Path:
    """``$REMAT_LAB_HOME``, else the user's data directory (``~/.local/share/remat_lab`` on Linux)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "remat_lab"


def db_path() -> Path:
    return home() / "history.sqlite3"


def enabled() -> bool:
    return os.environ.get(OFF_ENV, "").strip().lower() not in ("off", "0", "false", "no")


def public_mode() -> bool:
    """Whether strangers share this server (each visitor sees only their own and shared runs, and
    nothing can be deleted): yes unless ``$REMAT_LAB_PUBLIC`` is 0/false/no/off.

    The listen address cannot tell: behind a reverse proxy on loopback every visitor is local.
    """
    return os.environ.get(PUBLIC_ENV, "").strip().lower() not in ("0", "false", "no", "off")


def max_bytes() -> int | None:
    """The history's bound in bytes (``$REMAT_LAB_HISTORY_MAX_BYTES``, default 32 MiB); None: none."""
    from remat_lab.config import ConfigError, parse_bytes

    text = os.environ.get(MAX_ENV, "").strip().lower()
    if text in ("0", "off", "none", "unlimited"):
        return None
    try:
        return parse_bytes(text) if text else MAX_BYTES
    except ConfigError:
        return MAX_BYTES


def _explain(path: Path, err: Exception) -> HistoryError:
    if isinstance(err, sqlite3.OperationalError) and "locked" in str(err).lower():
        return HistoryBusy(f"The run history ({path.name}) is busy: another process holds its write "
                           "lock, so this run was not recorded.")
    reason = err.strerror if isinstance(err, OSError) and err.strerror else err  # no folder named
    return HistoryError(f"The run history ({path.name} in {HOME_ENV}) cannot be used ({reason}). Move "
                        f"the file away or delete it to start a new history, or set {HOME_ENV} to "
                        "another directory.")


@contextlib.contextmanager
def connect(path: str | os.PathLike | None = None,
            timeout: float = WRITE_TIMEOUT_S) -> Iterator[sqlite3.Connection]:
    """A connection to the history (created on first use, WAL mode); commits on success.

    ``timeout``: seconds to wait for another writer's lock before ``HistoryBusy``.
    """
    p = Path(path) if path else db_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(p, timeout=timeout)
    except (OSError, sqlite3.Error) as err:
        raise _explain(p, err) from err
    try:
        try:
            con.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
            if con.execute("PRAGMA page_count").fetchone()[0] == 0:  # a new file: before WAL writes
                con.execute("PRAGMA auto_vacuum = INCREMENTAL")  # its header, or it has no effect
            if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                con.execute("PRAGMA journal_mode = WAL")
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version > VERSION:
                raise HistoryError(f"The run history ({p.name} in {HOME_ENV}) was written by a newer "
                                   f"Remat Lab (version {version}; this one reads {VERSION}). Set "
                                   f"{HOME_ENV} to another directory or upgrade.")
            if version < VERSION or not con.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = 'visitors'").fetchone():
                con.executescript(_SCHEMA)
                con.execute(f"PRAGMA user_version = {VERSION}")
            con.execute("SELECT id FROM runs LIMIT 1").fetchall()  # a damaged table fails here
        except sqlite3.DatabaseError as err:
            raise _explain(p, err) from err
        try:
            yield con
            con.commit()
        except sqlite3.DatabaseError as err:
            raise _explain(p, err) from err
    finally:
        con.close()


def _columns(doc: dict, kind: str) -> dict:
    """The searchable columns of one document (a run, a sweep row or a comparison)."""
    c, env = doc.get("config") or {}, doc.get("environment") or {}
    st, mem = doc.get("step_time_s") or {}, doc.get("memory") or {}
    policy = c.get("policy")
    if kind == "compare":
        policy = ",".join(doc.get("policies") or [])
        peaks = [r["peak_bytes"] for r in doc.get("rows") or [] if r.get("peak_bytes") is not None]
        mem = {"peak_bytes": min(peaks)} if peaks else {}
    median = st.get("median")
    return {
        "model": c.get("model"), "policy": policy, "width": c.get("width"), "batch": c.get("batch"),
        "seq": c.get("seq"), "depth": c.get("depth"), "stack": c.get("stack"), "dtype": c.get("dtype"),
        "objective": c.get("objective"), "backend": env.get("backend"),
        "device_kind": env.get("device_kind"), "device_count": env.get("device_count"),
        "jax": env.get("jax"), "median_ms": median * 1e3 if median is not None else None,
        "peak_bytes": mem.get("peak_bytes"),
        "grad_ok": (doc.get("gradient_check") or {}).get("ok"),
        "error": (doc.get("error") or {}).get("message"),
    }


def record(doc: dict, *, kind: str = "run", source: str = "cli", session_id: str | None = None,
           path: str | os.PathLike | None = None, timeout: float = WRITE_TIMEOUT_S) -> int | None:
    """Store one document; its new row id, or None when the same document (configuration and
    results: a cached result shown again) is stored already, then only linked to ``session_id``
    (the visitor) so it shows in their history too.

    ``kind`` is run, sweep or compare; program texts are left out. After the write the file is held
    to ``max_bytes()``. Raises ``HistoryError`` (``HistoryBusy`` after ``timeout`` s of a held lock).
    """
    doc = {k: v for k, v in doc.items() if k != "texts"}
    text = json.dumps(doc, sort_keys=True, default=str)
    row = {"created": time.time(), "source": source, "kind": kind, "session_id": session_id,
           "host": socket.gethostname() if os.environ.get(HOST_ENV) == "1" else None,
           **_columns(doc, kind), "digest": hashlib.sha256(text.encode()).hexdigest(), "document": text}
    names = ", ".join(row)
    with connect(path, timeout) as con:
        con.execute("BEGIN IMMEDIATE")  # the look-up and the insert as one step among writers
        same = con.execute("SELECT id FROM runs WHERE digest = ? ORDER BY id LIMIT 1",
                           [row["digest"]]).fetchone()
        if same:
            if session_id:
                con.execute("INSERT OR IGNORE INTO visitors VALUES (?, ?)", [same[0], session_id])
            return None
        cur = con.execute(f"INSERT INTO runs ({names}) VALUES ({', '.join('?' * len(row))})",
                          list(row.values()))
        if session_id:
            con.execute("INSERT OR IGNORE INTO visitors VALUES (?, ?)", [cur.lastrowid, session_id])
        _hold_bound(con, max_bytes(), keep=cur.lastrowid)
        return cur.lastrowid


def used_bytes(con: sqlite3.Connection) -> int:
    """Bytes of the file in use (pages less free pages)."""
    pages, free, size = (con.execute(f"PRAGMA {p}").fetchone()[0]
                         for p in ("page_count", "freelist_count", "page_size"))
    return (pages - free) * size


def _hold_bound(con: sqlite3.Connection, limit: int | None, keep: int | None = None) -> int:
    """Delete the oldest runs (unshared first, never ``keep``, the one just written) until the
    file's used bytes are at most ``limit`` (aiming at 90 % of it, so not every write prunes); how
    many were deleted."""
    deleted = 0
    for _ in range(8):
        used = used_bytes(con)
        if not limit or used <= limit:
            break
        n = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        if n <= 1:
            break
        k = min(n - 1, max(1, math.ceil((used - 0.9 * limit) / (used / n))))
        ids = [r[0] for r in con.execute("SELECT id FROM runs WHERE id IS NOT ? ORDER BY shared, "
                                         "created, id LIMIT ?", [keep, k])]
        if not ids:
            break
        _delete(con, ids)
        deleted += len(ids)
    # Freed pages back to the file system, so the file itself stays under the bound. The pragma
    # frees one page per step: fetchall() steps it to the end (a bare execute() freed one page).
    if (con.execute("PRAGMA freelist_count").fetchone()[0]
            and con.execute("PRAGMA auto_vacuum").fetchone()[0] == 2):
        con.execute("PRAGMA incremental_vacuum").fetchall()
    return deleted


def try_record(doc: dict, **kwargs) -> str | None:
    """``record`` that never raises: None when stored (or history is off), else why not (the
    ``HistoryError``'s text; ``try_record_error`` gives the error itself)."""
    err = try_record_error(doc, **kwargs)
    return str(err) if err else None


def try_record_error(doc: dict, **kwargs) -> HistoryError | None:
    """``record`` that never raises: None when stored (or history is off), else the error."""
    if not enabled():
        return None
    try:
        record(doc, **kwargs)
    except HistoryError as err:
        return err
    return None


def _visible(session_id: str | None, public: bool) -> tuple[str, list]:
    if not public:
        return "1", []
    return ("(shared = 1 OR session_id = ? OR id IN (SELECT run_id FROM visitors WHERE visitor = ?))",
            [session_id or "", session_id or ""])


def list_runs(*, limit: int = 200, model: str | None = None, policy: str | None = None,
              backend: str | None = None, session_id: str | None = None, public: bool = False,
              path: str | os.PathLike | None = None) -> list[dict]:
    """The newest runs first, without documents. ``public``: only ``session_id``'s and shared ones."""
    where, args = _visible(session_id, public)
    for col, value in (("model", model), ("policy", policy), ("backend", backend)):
        if value:
            where, args = f"{where} AND {col} = ?", [*args, value]
    with connect(path) as con:
        cur = con.execute(f"SELECT {', '.join(COLUMNS)} FROM runs WHERE {where} "
                          "ORDER BY created DESC, id DESC LIMIT ?", [*args, int(limit)])
        return [dict(zip(COLUMNS, r)) for r in cur.fetchall()]


def documents(ids: list[int], *, session_id: str | None = None, public: bool = False,
              path: str | os.PathLike | None = None) -> dict[int, dict]:
    """The JSON documents of the visible runs among ``ids``."""
    if not ids:
        return {}
    where, args = _visible(session_id, public)
    with connect(path) as con:
        cur = con.execute(f"SELECT id, kind, document FROM runs WHERE {where} AND id IN "
                          f"({', '.join('?' * len(ids))})", [*args, *map(int, ids)])
        return {i: {**json.loads(d), "_history": {"id": i, "kind": k}} for i, k, d in cur.fetchall()}


def _delete(con: sqlite3.Connection, ids: list[int]) -> int:
    marks = ", ".join("?" * len(ids))
    con.execute(f"DELETE FROM visitors WHERE run_id IN ({marks})", list(map(int, ids)))
    return con.execute(f"DELETE FROM runs WHERE id IN ({marks})", list(map(int, ids))).rowcount


def delete(ids: list[int], path: str | os.PathLike | None = None) -> int:
    """Delete runs (never offered in public mode); how many were deleted."""
    with connect(path) as con:
        return _delete(con, ids) if ids else 0


def share(ids: list[int], shared: bool = True, path: str | os.PathLike | None = None) -> int:
    """Mark runs shared (shown to every visitor of a public deployment) or not; how many changed."""
    with connect(path) as con:
        return con.execute(f"UPDATE runs SET shared = ? WHERE id IN ({', '.join('?' * len(ids))})",
                           [int(shared), *map(int, ids)]).rowcount if ids else 0


def count(path: str | os.PathLike | None = None) -> int:
    with connect(path) as con:
        return con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
