"""A job of the pool and its callers: one request that every equal caller shares, and what they may see.

A caller ``wait``s on a ``Job`` (its stages come back as they happen); when every caller has left,
the job is abandoned. ``WorkerLost`` (and its ``TimeLimit``: stopped at the kind's deadline),
``Abandoned`` (and its ``Superseded``: replaced by the same session's newer request) and ``Busy``
(refused: its visitor has enough jobs in flight) are the errors that only a worker pool gives.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

from remat_lab.program.backend import ExecutionError


class WorkerLost(ExecutionError):
    """The worker process died while running a job (out of memory, an abort) or was stopped."""


class Abandoned(ExecutionError):
    """Every caller of a job left before it finished; the job was stopped (nobody sees this)."""


class TimeLimit(WorkerLost):
    """The job ran past its kind's deadline (``quotas``): its worker was killed and replaced."""


class Superseded(Abandoned):
    """The job was still queued when the same session asked for another; the newer one replaced it."""


class Busy(ExecutionError):
    """Not queued: its visitor already has as many jobs queued or running as one may (``quotas``)."""


class Job:
    """One request; callers ``wait`` on it, sharing its result."""

    _ids = itertools.count(1)

    def __init__(self, kind: str, payload: dict, need: int,
                 on_done: Callable[[Any], None] | None = None) -> None:
        self.id, self.kind, self.payload, self.need = next(self._ids), kind, payload, need
        self.on_done, self.key = on_done, None
        self.stages: list[str] = []
        self.value = self.error = None
        self.done = threading.Event()
        self._news = threading.Condition()  # notified on a new stage and on the finish
        self.waiters = 0
        self.sessions: set = set()  # the sessions that asked for it (None: callers without one)
        self._lock = threading.Lock()

    def abandoned(self) -> bool:
        with self._lock:
            return self.waiters == 0

    def stage(self, name: str) -> None:
        """Record a stage; every waiter hands it to its ``progress`` now, not at its next poll."""
        with self._news:
            self.stages.append(name)
            self._news.notify_all()

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        """Record the outcome; a value is handed to ``on_done`` (the caller's cache) even when
        nobody waits any more."""
        self.value, self.error = value, error
        if error is None and self.on_done is not None:
            self.on_done(value)
        with self._news:
            self.done.set()
            self._news.notify_all()

    def wait(self, progress: Callable[[str], None] | None = None,
             alive: Callable[[], bool] | None = None, poll: float = 0.25) -> Any:
        """The job's value; stages go to ``progress`` in the caller's thread. Leaving (an exception
        in ``progress``, or ``alive()`` false) withdraws this caller. Stages are handed over as
        they are recorded (a wake-up, not the poll: the status names the stage that is running);
        ``poll`` only paces the ``alive`` check."""
        seen = 0
        try:
            while True:
                with self._news:
                    if not self.done.is_set() and len(self.stages) == seen:
                        self._news.wait(poll)  # until a stage or the finish, or the poll
                finished = self.done.is_set()
                while seen < len(self.stages):
                    (progress or (lambda s: None))(self.stages[seen])
                    seen += 1
                if finished:
                    break
                if alive is not None and not alive():
                    raise Abandoned("the session that asked for this run is gone")
        finally:
            with self._lock:
                self.waiters -= 1
        if self.error is not None:
            raise self.error
        return self.value
