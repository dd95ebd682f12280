"""Run history: every completed run of the app or the CLI, kept in SQLite under ``REMAT_LAB_HOME``.

One table, ``runs``: when, what made it (``source`` app/cli, ``kind`` run/compare/sweep, the app
session), the configuration columns, the environment, the headline numbers and the whole JSON
document. WAL mode and a busy timeout let several app sessions and CLI processes write at once.
A file that is not a readable history raises ``HistoryError`` with a sentence saying what to do;
callers that must keep serving use ``try_record``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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
LOOPBACK = {"localhost", "127.0.0.1", "::1"}
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
"""


class HistoryError(RuntimeError):
    """The history file cannot be used; the message says where it is and what to do."""


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


def public_mode(address: str | None) -> bool:
    """Whether strangers share this server: ``$REMAT_LAB_PUBLIC`` if set, else unless the server
    listens on a loopback ``address`` only (Streamlit's ``server.address``; unset = every interface)."""
    forced = os.environ.get(PUBLIC_ENV, "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True
    if forced in ("0", "false", "no", "off"):
        return False
    return (address or "").strip().strip("[]").lower() not in LOOPBACK


def _explain(path: Path, err: Exception) -> HistoryError:
    return HistoryError(f"The run history {path} cannot be used ({err}). Move the file away or delete "
                        f"it to start a new history, or set {HOME_ENV} to another directory.")


@contextlib.contextmanager
def connect(path: str | os.PathLike | None = None) -> Iterator[sqlite3.Connection]:
    """A connection to the history (created on first use, WAL mode); commits on success."""
    p = Path(path) if path else db_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(p, timeout=30)
    except (OSError, sqlite3.Error) as err:
        raise _explain(p, err) from err
    try:
        try:
            con.execute("PRAGMA busy_timeout = 30000")
            if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                con.execute("PRAGMA journal_mode = WAL")
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version > VERSION:
                raise HistoryError(f"The run history {p} was written by a newer Remat Lab (version "
                                   f"{version}; this one reads {VERSION}). Set {HOME_ENV} to another "
                                   "directory or upgrade.")
            if version < VERSION:
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
           path: str | os.PathLike | None = None) -> int | None:
    """Store one document; its row id (None when this session already stored the same document).

    ``kind`` is run, sweep or compare; program texts are left out. Raises ``HistoryError``.
    """
    doc = {k: v for k, v in doc.items() if k != "texts"}
    text = json.dumps(doc, sort_keys=True, default=str)
    row = {"created": time.time(), "source": source, "kind": kind, "session_id": session_id,
           "host": socket.gethostname() if os.environ.get(HOST_ENV) == "1" else None,
           **_columns(doc, kind), "digest": hashlib.sha256(text.encode()).hexdigest(), "document": text}
    names = ", ".join(row)
    with connect(path) as con:
        cur = con.execute(f"INSERT OR IGNORE INTO runs ({names}) VALUES ({', '.join('?' * len(row))})",
                          list(row.values()))
        return cur.lastrowid if cur.rowcount else None


def try_record(doc: dict, **kwargs) -> str | None:
    """``record`` that never raises: None when stored (or history is off), else why not."""
    if not enabled():
        return None
    try:
        record(doc, **kwargs)
    except HistoryError as err:
        return str(err)
    return None


def _visible(session_id: str | None, public: bool) -> tuple[str, list]:
    if not public:
        return "1", []
    return "(shared = 1 OR session_id = ?)", [session_id or ""]


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


def delete(ids: list[int], path: str | os.PathLike | None = None) -> int:
    """Delete runs (never offered in public mode); how many were deleted."""
    with connect(path) as con:
        return con.execute(f"DELETE FROM runs WHERE id IN ({', '.join('?' * len(ids))})",
                           list(map(int, ids))).rowcount if ids else 0


def share(ids: list[int], shared: bool = True, path: str | os.PathLike | None = None) -> int:
    """Mark runs shared (shown to every visitor of a public deployment) or not; how many changed."""
    with connect(path) as con:
        return con.execute(f"UPDATE runs SET shared = ? WHERE id IN ({', '.join('?' * len(ids))})",
                           [int(shared), *map(int, ids)]).rowcount if ids else 0


def count(path: str | os.PathLike | None = None) -> int:
    with connect(path) as con:
        return con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
