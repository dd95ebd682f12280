"""Uploaded results files parsed once: the sha256 of their bytes names the parse in a byte-bounded cache.

The Open results page reruns on every widget click; ``open_upload`` answers a rerun from the cache
(with the digest the page kept, without reading the file at all; with new bytes, after hashing them
in chunks), and parses (``results.load``, a stream) only bytes it has not seen. The limits of an
upload and of what is drawn are here so that the page states them and the tests check them.
"""

from __future__ import annotations

import hashlib
from typing import BinaryIO

from remat_lab.store import results
from remat_lab.store.bytecache import ByteCache, deep_size

MIB = 1 << 20
MAX_FILES = 5  # files read from one upload; the others are named and left out
MAX_TOTAL_BYTES = results.MAX_BYTES  # the files of one upload together (each is also at most this)
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


def over_total(sizes: list[int]) -> list[bool]:
    """For each file of an upload in order: whether it is left out (past ``MAX_FILES``, or its bytes
    would take the upload past ``MAX_TOTAL_BYTES``)."""
    out, total = [], 0
    for i, size in enumerate(sizes):
        left = i >= MAX_FILES or (total + size > MAX_TOTAL_BYTES and size <= results.MAX_BYTES)
        out.append(left)
        total += 0 if left else size
    return out
