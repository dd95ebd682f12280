"""Caches bounded by bytes, not entries: least recently used first out when a new value does not fit."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import numpy as np


def deep_size(obj: Any, _seen: set | None = None) -> int:
    """Bytes held by ``obj`` and everything it refers to (dicts, lists, tuples, sets, strings, arrays).

    Shared objects are counted once. NumPy arrays count their buffers; other objects their
    ``sys.getsizeof``.
    """
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return sys.getsizeof(obj) + (obj.nbytes if obj.base is None else 0)
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | frozenset):
        size += sum(deep_size(v, seen) for v in obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        size += deep_size(vars(obj), seen)
    return size


class ByteCache:
    """A thread-safe LRU mapping whose values together stay under ``max_bytes``.

    A value larger than the whole budget is not kept (``put`` returns False).
    """

    def __init__(self, max_bytes: int, name: str = "cache") -> None:
        self.max_bytes, self.name = int(max_bytes), name
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            if key not in self._items:
                return default
            self._items.move_to_end(key)
            return self._items[key][0]

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def put(self, key: Hashable, value: Any, size: int | None = None) -> bool:
        """Keep ``value`` (``size`` bytes, measured when not given), evicting the oldest to fit."""
        size = deep_size(value) if size is None else int(size)
        with self._lock:
            if key in self._items:
                self._bytes -= self._items.pop(key)[1]
            if size > self.max_bytes:
                return False
            while self._items and self._bytes + size > self.max_bytes:
                self._bytes -= self._items.popitem(last=False)[1][1]
            self._items[key] = (value, size)
            self._bytes += size
            return True

    def discard(self, key: Hashable) -> None:
        """Drop ``key`` if it is kept (its bytes are freed once nothing else refers to the value)."""
        with self._lock:
            if key in self._items:
                self._bytes -= self._items.pop(key)[1]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes held now (the sum of the sizes given to or measured by ``put``)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
