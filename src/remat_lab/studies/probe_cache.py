"""Bounded, thread-safe caches for the advisor's probes, and a computation run once per key."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future


class ProbeCache:
    """Probe results by configuration (a policy's program at one batch), least recently used out
    past ``entries`` entries or (``put``'s sizes given) ``max_bytes``."""

    def __init__(self, entries: int, max_bytes: int | None = None):
        self.entries, self._data, self._lock = entries, OrderedDict(), threading.Lock()
        self.max_bytes, self._sizes = max_bytes, {}

    def get(self, key):
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        return None

    def put(self, key, value, size: int = 0) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            self._sizes[key] = size
            while len(self._data) > self.entries or (
                    self.max_bytes is not None and len(self._data) > 1
                    and sum(self._sizes.values()) > self.max_bytes):
                old, _ = self._data.popitem(last=False)
                self._sizes.pop(old, None)

    def drop(self, key) -> None:
        with self._lock:
            self._data.pop(key, None)
            self._sizes.pop(key, None)

    def items(self) -> list:
        with self._lock:
            return list(self._data.items())

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._sizes.clear()


class Once:
    """Each key computed by one thread at a time: a caller of a key in flight waits for its result."""

    def __init__(self):
        self._lock, self._running = threading.Lock(), {}

    def run(self, key, compute: Callable[[], object]) -> tuple[object, bool]:
        """``(value, waited)``: ``compute()``'s value, or the one in flight's (``waited``)."""
        with self._lock:
            future, owner = self._running.get(key), False
            if future is None:
                future, owner = self._running.setdefault(key, Future()), True
        if not owner:
            return future.result(), True  # the owner's error is raised here too
        try:
            value = compute()
            future.set_result(value)
            return value, False
        except BaseException as err:
            future.set_exception(err)
            raise
        finally:
            with self._lock:
                self._running.pop(key, None)
