"""The documents of a results file read as a stream: one line or list item parsed at a time, memory checked.

Only ``json`` touches the bytes (nothing is executed or unpickled), one document at a time: a line of
JSON lines, an item of a JSON list (decoded from a sliding buffer of ``CHUNK`` reads), or the one
document of a ``.json`` file of at most ``MAX_DOC_BYTES``. The whole text is never held. ``NaN``,
``Infinity`` and numbers too large for a float are refused (Python's ``json`` accepts them). Before a
document is parsed its parsed size is estimated from its bytes (``estimate``); one over
``MAX_PARSE_BYTES`` is refused, and ``Guard`` stops the reading when the process's resident memory
plus that estimate would pass its limit less a reserve.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Callable, Iterator
from typing import BinaryIO

from remat_lab.config import human_bytes, limits

MIB = 1 << 20
MAX_DOC_BYTES = 8 * MIB  # one document (a line, a list item, a whole .json document) at most
MAX_PARSE_BYTES = 64 * MIB  # the estimated memory one document's parse may take (about twice the real)
CHUNK = 512 * 1024  # bytes read at a time from a JSON list
CHECK_EVERY = 2 * MIB  # bytes read between two checks of the resident memory
RESERVE = 0.15  # of the process's memory limit, never parsed into (the server needs it)

Refuse = Callable[[str, str], None]


class NonFinite(ValueError):
    """A number JSON does not allow (NaN, Infinity) or too large for a float."""


class OverBudget(Exception):
    """Reading on would pass the process's memory budget; the message says so in words."""


def _constant(name: str):
    raise NonFinite(f"{name} is not a finite number (NaN and Infinity are refused)")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NonFinite(f"{text[:20]}{'…' if len(text) > 20 else ''} is too large for a number")
    return value


STRICT = json.JSONDecoder(parse_constant=_constant, parse_float=_float)
LENIENT = json.JSONDecoder()  # only to find where a refused list item ends


def estimate(data: bytes | str) -> int:
    """An upper estimate of the bytes ``json`` needs for the objects parsed from ``data``: each
    container and each separated element costs far more than its characters."""
    if isinstance(data, bytes):
        containers, items = data.count(b"[") + data.count(b"{"), data.count(b",") + data.count(b":")
    else:
        containers, items = data.count("[") + data.count("{"), data.count(",") + data.count(":")
    return len(data) + 96 * containers + 40 * items


class Guard:
    """The memory check: resident memory plus what is about to be parsed stays under the limit."""

    def __init__(self, limit: int | None = None, reserve: float = RESERVE) -> None:
        self.limit = limits.memory_limit() if limit is None else int(limit)
        self.budget = int(self.limit * (1 - reserve))

    def check(self, extra: int = 0) -> None:
        rss = limits.rss_bytes() or 0
        if rss + extra > self.budget:
            raise OverBudget(f"reading stopped here: the server has too little memory free "
                             f"({human_bytes(rss)} in use of {human_bytes(self.limit)}, about "
                             f"{human_bytes(extra)} more needed). Try a smaller file, or again later.")


def why(err: Exception, text: str = "", last: bool = True) -> str:
    """A parse failure in words: cut off when JSON ran out before the document ended."""
    if isinstance(err, RecursionError):
        return "nested too deeply to read"
    if isinstance(err, NonFinite):
        return str(err)
    if isinstance(err, json.JSONDecodeError) and last and (
            err.pos >= len(text.rstrip()) - 1 or err.msg.startswith("Unterminated string")):
        return "cut off (the file ends in the middle of a document)"
    return f"not valid JSON ({str(err).split(':')[0][:80]})"


def _too_big(what: str, size: int) -> str:
    return f"{what} of {size:,} bytes: over the {MAX_DOC_BYTES // MIB} MiB one document may take"


def _parse_cost(size_est: int) -> str:
    return (f"would take about {human_bytes(size_est)} of memory to read: over the "
            f"{human_bytes(MAX_PARSE_BYTES)} one document may use")


def _first_byte(f: BinaryIO) -> bytes:
    """The first byte that is not white space (or a byte-order mark); b"" for a blank file."""
    f.seek(0)
    head = True
    while chunk := f.read(CHUNK):
        if head:
            chunk, head = chunk.removeprefix(codecs.BOM_UTF8), False
        stripped = chunk.lstrip()
        if stripped:
            f.seek(0)
            return stripped[:1]
    f.seek(0)
    return b""


def documents(f: BinaryIO, name: str, size: int, refuse: Refuse,
              guard: Guard) -> Iterator[tuple[str, object]]:
    """(where, value) for each document of the file ``f`` (seekable, ``size`` bytes); every part
    that cannot be read goes to ``refuse(where, why)``. Raises ``OverBudget``."""
    f.seek(0)
    if b"\x00" in f.read(4096):
        refuse(name, "not a text file (binary data); expected .json or .jsonl")
        return
    first = _first_byte(f)
    if not first:
        refuse(name, "the file is empty")
    elif name.lower().endswith(".jsonl"):
        yield from _lines(f, size, refuse, guard)
    elif first == b"[":
        yield from _items(f, refuse, guard)
    elif size > MAX_DOC_BYTES:  # not one document: JSON lines in a .json file, or too big
        yield from _lines(f, size, refuse, guard)
    else:
        yield from _whole(f, name, size, refuse, guard)


def _whole(f: BinaryIO, name: str, size: int, refuse: Refuse, guard: Guard):
    """The one document of a small ``.json`` file; JSON lines when it is not one document."""
    data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        refuse(name, "not UTF-8 text; expected .json or .jsonl")
        return
    cost = estimate(data)
    del data
    if cost > MAX_PARSE_BYTES:
        refuse(name, _parse_cost(cost))
        return
    guard.check(cost)
    try:
        value = STRICT.decode(text)
    except (ValueError, RecursionError) as err:
        if "\n" not in text.strip():  # one line, so one document: not JSON lines either
            refuse(name, why(err, text.strip()))
            return
        del text
        f.seek(0)
        yield from _lines(f, size, refuse, guard)
        return
    del text
    yield "the document", value


def _skip_line(f: BinaryIO) -> int:
    """Read past the rest of an over-long line; the bytes skipped."""
    skipped = 0
    while chunk := f.readline(CHUNK):
        skipped += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return skipped


def _lines(f: BinaryIO, size: int, refuse: Refuse, guard: Guard):
    """JSON lines, one line read and parsed at a time."""
    f.seek(0)
    n, since = 0, 0
    while raw := f.readline(MAX_DOC_BYTES + 1):
        n += 1
        if n == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        if len(raw) > MAX_DOC_BYTES and not raw.endswith(b"\n"):
            refuse(f"line {n}", _too_big("a line", len(raw) + _skip_line(f)))
            continue
        since += len(raw)
        if not raw.strip():
            continue
        cost = estimate(raw)
        if cost > MAX_PARSE_BYTES:
            refuse(f"line {n}", _parse_cost(cost))
            continue
        if since >= CHECK_EVERY or cost >= CHECK_EVERY:
            guard.check(cost)
            since = 0
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            refuse(f"line {n}", "not UTF-8 text")
            continue
        try:
            value = STRICT.decode(text)
        except (ValueError, RecursionError) as err:
            refuse(f"line {n}", why(err, text, last=f.tell() >= size))
            continue
        yield f"line {n}", value


class _Buffer:
    """Decoded text of a JSON list, read ``CHUNK`` bytes at a time; ``pos`` is where parsing is."""

    def __init__(self, f: BinaryIO, guard: Guard) -> None:
        self.f, self.guard = f, guard
        self.decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self.text, self.pos, self.eof, self.cost = "", 0, False, 0

    def more(self, at_least: int = CHUNK) -> bool:
        """Read on (at least ``at_least`` bytes); False at the end of the file."""
        if self.eof:
            return False
        data = self.f.read(max(CHUNK, at_least))
        self.eof = not data
        self.text = self.text[self.pos:] + self.decoder.decode(data, final=self.eof)
        self.pos = 0
        self.cost = estimate(self.text)  # what the items now in the buffer may take, parsed
        self.guard.check(self.cost)
        return not self.eof

    def skip_space(self) -> str:
        """The next character that is not white space ("" at the end)."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self.more():
                return ""


def _items(f: BinaryIO, refuse: Refuse, guard: Guard):
    """The items of a JSON list, each decoded alone from a sliding buffer."""
    buf = _Buffer(f, guard)
    try:
        buf.skip_space()
        buf.pos += 1  # the "["
        n = 0
        while True:
            c = buf.skip_space()
            if c == "]" or (c == "" and n == 0):
                buf.pos += 1
                if c == "" or buf.skip_space():
                    refuse("the list", "cut off (the file ends before the list does)" if c == "" else
                           "text after the end of the list is not read")
                return
            if n:
                if c != ",":
                    refuse(f"item {n + 1}", "cut off (the file ends before the list does)" if c == ""
                           else f"not valid JSON (expected ',' or ']' after item {n})")
                    return
                buf.pos += 1
                buf.skip_space()
            n += 1
            value, failure = _one_item(buf)
            if failure:
                refuse(f"item {n}", failure)
                if buf.pos < 0:  # its end is unknown: the rest of the list cannot be read
                    return
                continue
            yield f"item {n}", value
    except UnicodeDecodeError:
        refuse("the list", "not UTF-8 text; reading stopped there")


def _one_item(buf: _Buffer) -> tuple[object, str | None]:
    """The next item of the list, or why it cannot be read (``buf.pos`` -1 when its end is unknown)."""
    while True:
        if buf.cost > MAX_PARSE_BYTES:
            buf.pos = -1
            return None, _parse_cost(buf.cost) + "; the rest of the list is not read"
        try:
            value, end = STRICT.raw_decode(buf.text, buf.pos)
            if end < len(buf.text) or buf.eof:  # a number at the buffer's end may go on
                buf.pos = end
                return value, None
            failure = None
        except NonFinite as err:
            try:
                _, end = LENIENT.raw_decode(buf.text, buf.pos)
                if end < len(buf.text) or buf.eof:
                    buf.pos = end
                    return None, str(err)
            except (ValueError, RecursionError):
                pass
            failure = str(err)
        except RecursionError:
            buf.pos = -1
            return None, "nested too deeply to read"
        except ValueError as err:
            failure = why(err, buf.text[buf.pos:], last=buf.eof)
        pending = len(buf.text) - buf.pos
        if pending > MAX_DOC_BYTES:
            buf.pos = -1
            return None, _too_big("an item", pending) + "; the rest of the list is not read"
        if not buf.more(pending):
            if failure is None:
                continue
            buf.pos = -1
            return None, failure
