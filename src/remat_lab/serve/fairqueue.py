"""The pool's job queue, fair across sessions: one lane per session, the lane served least recently goes next.

FIFO across sessions let one visitor's burst (a sweep, a second click) run before another visitor's
single run. Here every job waits in its session's lane; ``get`` takes the head of the lane whose
last dispatch is oldest (a lane never served counts as oldest; ties go to the job that arrived
first), which is round-robin by session. Jobs without a session share one lane (``None``).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Hashable
from typing import Any


class FairQueue:
    """Jobs in per-session lanes; ``get`` blocks and serves lanes in turn; ``stop`` wakes one getter."""

    def __init__(self, remember: int = 4096) -> None:
        self._lanes: dict[Hashable, deque[tuple[int, Any]]] = {}
        self._served: dict[Hashable, int] = {}  # lane -> tick of its last dispatch
        self._ticks, self._arrivals = itertools.count(1), itertools.count()
        self._stops = 0
        self._remember = remember
        self._cond = threading.Condition()

    def __len__(self) -> int:
        with self._cond:
            return sum(len(lane) for lane in self._lanes.values())

    def put(self, item: Any, lane: Hashable = None) -> None:
        with self._cond:
            self._lanes.setdefault(lane, deque()).append((next(self._arrivals), item))
            self._cond.notify()

    def stop(self) -> None:
        """Make one ``get`` return None (a dispatcher's signal to end), ahead of queued jobs."""
        with self._cond:
            self._stops += 1
            self._cond.notify()

    def holds(self, item: Any) -> bool:
        with self._cond:
            return any(x is item for lane in self._lanes.values() for _, x in lane)

    def discard(self, item: Any) -> bool:
        """Take ``item`` out if it is still queued; False when a ``get`` already took it."""
        with self._cond:
            for name, lane in self._lanes.items():
                for entry in lane:
                    if entry[1] is item:
                        lane.remove(entry)
                        if not lane:
                            del self._lanes[name]
                        return True
        return False

    def drain(self) -> list[Any]:
        """Every queued item, taken out (the pool fails them when it closes)."""
        with self._cond:
            items = [x for lane in self._lanes.values() for _, x in lane]
            self._lanes.clear()
            return items

    def order(self) -> list[Any]:
        """The queued items in the order ``get`` would serve them if nothing else arrived."""
        with self._cond:
            lanes = {k: deque(v) for k, v in self._lanes.items()}
            served, out = dict(self._served), []
            while lanes:
                name = self._next_lane(lanes, served)
                out.append(lanes[name].popleft()[1])
                if not lanes[name]:
                    del lanes[name]
                served[name] = max(served.values(), default=0) + 1
            return out

    @staticmethod
    def _next_lane(lanes: dict, served: dict) -> Hashable:
        return min(lanes, key=lambda name: (served.get(name, 0), lanes[name][0][0]))

    def get(self) -> Any:
        """The next job (blocking), or None after ``stop``."""
        with self._cond:
            while not self._stops and not self._lanes:
                self._cond.wait()
            if self._stops:
                self._stops -= 1
                return None
            name = self._next_lane(self._lanes, self._served)
            lane = self._lanes[name]
            _, item = lane.popleft()
            if not lane:
                del self._lanes[name]
            self._served[name] = next(self._ticks)
            if len(self._served) > self._remember:  # forget the longest-idle sessions
                keep = sorted(self._served, key=self._served.get)[-(self._remember // 2):]
                self._served = {k: self._served[k] for k in keep}
            return item
