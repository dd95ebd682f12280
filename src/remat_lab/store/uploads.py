"""Uploaded results files parsed once: the sha256 of their bytes names the parse in a byte-bounded cache.

The Open results page reruns on every widget click; ``open_upload`` answers a rerun from the cache
(with the digest the page kept, without reading the file at all; with new bytes, after hashing them
in chunks), and parses (``results.load``, a stream) only bytes it has not seen. The limits of an
upload and of what is drawn are here so that the page states them and the tests check them.
``Opened`` keeps which parses each session has open (one file is uploaded at a time; a session keeps
up to ``MAX_FILES`` open): a parse leaves the cache when the last session holding it ends, so the
server's memory returns after its visitors leave. What an upload holds before its parse ends is
bounded in ``upload_budget``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Hashable
from typing import BinaryIO

from remat_lab.store import results
from remat_lab.store.bytecache import ByteCache, deep_size

MIB = 1 << 20
MAX_FILES = 5  # files a session has open at once (uploaded one at a time; the oldest closed first)
CACHE_BYTES = 96 * MIB  # parses kept for reruns, all sessions together
MAX_ROWS_DRAWN = 500  # sweep rows (and error rows) drawn in one view (its heatmap labels are set at once)
MAX_VIEWS = 8  # views (a file and machine's sweep, a comparison, an advice) drawn per upload
HASH_CHUNK = MIB

CACHE = ByteCache(CACHE_BYTES, "uploads")


def digest(f: BinaryIO) -> str:
    """The sha256 of the file's bytes, read in chunks; the file is left at its start."""
    f.seek(0)
    h = hashlib.sha256()
    while chunk := f.read(HASH_CHUNK):
        h.update(chunk)
    f.seek(0)
    return h.hexdigest()


def cached(name: str, sha: str | None, cache: ByteCache = CACHE) -> results.Loaded | None:
    """The parse of the bytes with digest ``sha`` uploaded as ``name``, if it is still cached."""
    return cache.get((sha, name)) if sha else None


def open_upload(name: str, f: BinaryIO, *, sha: str | None = None, cache: ByteCache = CACHE,
                guard=None) -> results.Loaded:
    """The parse of one uploaded file: from the cache when ``sha`` (the digest of these bytes, kept
    by the caller) or the digest of the bytes is known to it, else parsed as a stream and cached.

    A parse that stopped for lack of memory is not cached (a later try may have the memory).
    """
    hit = cached(name, sha, cache)
    if hit is not None:
        return hit
    sha = digest(f)
    hit = cached(name, sha, cache)
    if hit is not None:
        return hit
    loaded = results.load(name, f, guard=guard)
    loaded.sha256 = sha
    if not loaded.stopped or "most one file may give" in loaded.stopped:
        cache.put((sha, name), loaded, deep_size(loaded))
    return loaded


Key = tuple[str, str]  # (sha256 of the bytes, file name): a parse in the cache


class Opened:
    """The parses each session has open, in the order opened (at most ``most``); thread-safe.

    ``end(session)`` (the session's end) drops from ``cache`` every parse no other session has open.
    """

    def __init__(self, cache: ByteCache = CACHE, most: int = MAX_FILES) -> None:
        self.cache, self.most = cache, most
        self._open: dict[Hashable, list[Key]] = {}
        self._lock = threading.Lock()

    def add(self, session: Hashable, key: Key) -> list[Key]:
        """Open ``key`` for ``session`` (last; again: moved last); the keys closed to stay at ``most``."""
        with self._lock:
            keys = [k for k in self._open.get(session, []) if k != key] + [key]
            self._open[session], closed = keys[-self.most:], keys[:-self.most]
        self._drop_unheld(closed)
        return closed

    def keys(self, session: Hashable) -> list[Key]:
        with self._lock:
            return list(self._open.get(session, []))

    def end(self, session: Hashable) -> None:
        """Close every parse ``session`` has open (it ended, or closed them all)."""
        with self._lock:
            keys = self._open.pop(session, [])
        self._drop_unheld(keys)

    def _drop_unheld(self, keys: list[Key]) -> None:
        with self._lock:
            held = {k for ks in self._open.values() for k in ks}
        for key in keys:
            if key not in held:
                self.cache.discard(key)


OPENED = Opened()
