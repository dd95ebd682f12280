"""The server's side of the process boundary: recyclable worker processes fed from one fair job queue.

A ``Pool`` (no Streamlit) owns ``size`` worker processes (``spawn``: JAX is not fork-safe), each
fed by one dispatcher thread from a job queue served round-robin by visitor (``fairqueue``, lanes
from ``visitors``: the client's address, else the session); equal jobs in flight are one ``Job``.
A session has at most one queued job: a newer request replaces its queued one (``Superseded``); a
visitor has at most ``visitor_cap`` jobs queued or running, all its tabs together (``Busy``). A job
past its kind's deadline (``quotas``) has its worker killed and replaced (``TimeLimit``). A dead
worker fails only its job (``WorkerLost``, its cause told by ``deaths``) and is replaced; a job
nobody waits for, or whose sessions have all ended (``session_alive``), is stopped
(``Abandoned``); a worker is recycled after ``max_runs`` jobs or above ``max_rss``; a job's
estimate must fit under the memory limit first; timed kinds hold one lock (one timing at a time).
``shared_pool`` is the process's pool.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import types
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from remat_lab.config import ConfigError, MemoryBudgetError, human_bytes, limits
from remat_lab.program import failures
from remat_lab.program.backend import ExecutionError
from remat_lab.serve import deaths, quotas, visitors
from remat_lab.serve.fairqueue import FairQueue
from remat_lab.serve.in_worker import execute, serve
from remat_lab.serve.jobs import Abandoned, Busy, Job, Superseded, TimeLimit, WorkerLost

TIMED = ("run", "compare", "advise", "sweep_time")
MARGIN = 64 << 20  # left free under the limit, for the server's own page work


class _Worker:
    """One worker process and its two queues."""

    def __init__(self, env: dict) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.requests, self.replies = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(target=serve, args=(self.requests, self.replies, env),
                                   name="remat-lab-worker", daemon=True)
        # spawn re-imports the parent's __main__ in the child: under Streamlit that is the page
        # script being run. Nothing of it is needed, so the child gets an empty one.
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            self.process.start()
        finally:
            sys.modules["__main__"] = main
        self.runs, self.baseline = 0, None
        self._ready = threading.Lock()

    def wait_ready(self, timeout: float) -> None:
        """Block until the worker has warmed up (once; callers after the first return at once)."""
        with self._ready:
            if self.baseline is None:
                self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                _, what, _pid, rss = self.replies.get(timeout=0.2)
            except queue.Empty:
                if not self.process.is_alive():
                    break
                continue
            if what == "ready":
                self.baseline = rss
                return
        raise WorkerLost(f"the worker process did not start (exit code {self.process.exitcode}).")

    def rss(self) -> int:
        return limits.rss_bytes(self.process.pid) or 0

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        elif self.process.is_alive():
            self.requests.put(None)
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)
        for q in (self.requests, self.replies):
            q.cancel_join_thread()
            q.close()


class Pool:
    """``size`` worker processes behind one fair job queue (``size=0``: in the caller's thread).

    ``deadlines``: seconds per job kind over ``quotas.deadlines()`` (None for a kind: no deadline);
    a pool of size 0 has none (nothing to kill). ``visitor_cap``: jobs one lane may have queued or
    running (default ``quotas.visitor_cap()``; 0: none). ``session_alive(session_id)``, when set,
    tells whether a browser session is still there: a job whose sessions are all gone is stopped.
    """

    def __init__(self, size: int = 1, *, max_runs: int = 40, max_rss: int | None = None,
                 margin: int = MARGIN, env: dict | None = None, start_timeout: float = 120.0,
                 limit: int | None = None, deadlines: Mapping[str, float | None] | None = None,
                 visitor_cap: int | None = -1) -> None:
        self.size, self.max_runs, self.margin = size, max_runs, margin
        self.limit = limit or limits.memory_limit()
        # Recycle above half the limit by default: a worker that big cannot take the next large job.
        self.max_rss = max_rss or self.limit // 2
        self.env, self.start_timeout = dict(env or {}), start_timeout
        self.timing_lock = threading.Lock()
        self.deadlines = quotas.deadlines(deadlines)
        self.visitor_cap = quotas.visitor_cap() if visitor_cap == -1 else visitor_cap
        self.session_alive: Callable[[Hashable], bool] | None = None
        self._lane_jobs: dict[Hashable, set[Job]] = {}  # lane -> the jobs it started, not yet done
        self._jobs = FairQueue()
        self._queued: dict[Hashable, Job] = {}  # session -> its one queued job
        self._in_flight: dict[Any, Job] = {}
        self._lock = threading.Lock()
        self.workers: list[_Worker | None] = [None] * size
        self._busy = [False] * size
        self.deaths = self.recycled = self.stopped = 0
        self._closed = False
        self._threads = [threading.Thread(target=self._dispatch, args=(i,), daemon=True,
                                          name=f"remat-lab-dispatch-{i}") for i in range(size)]
        for t in self._threads:
            t.start()

    # ---- callers

    def submit(self, kind: str, payload: dict, key: Any = None, need: int = 0,
               on_done: Callable[[Any], None] | None = None,
               progress: Callable[[str], None] | None = None, session: Hashable = None) -> Job:
        """The job for ``key`` (an equal one in flight is shared), with one more waiter.

        ``need``: the job's estimated bytes (checked against the limit before it runs);
        ``on_done``: called with the value when the job succeeds, whoever still waits;
        ``progress``: for a pool of size 0, called with each stage as the job runs here;
        ``session``: who asks (a ``visitors.Lane`` or a plain key; its lane in the queue). A
        session's still-queued job is replaced by its newer request: the older one ends with
        ``Superseded`` unless another session shares it. A new job of a lane that has
        ``visitor_cap`` jobs in flight is not queued: it comes back finished with ``Busy``.
        """
        key = (kind, key) if key is not None else None
        replaced, lane = None, visitors.lane_of(session)
        with self._lock:
            job = self._in_flight.get(key) if key is not None else None
            fresh = job is None or job.done.is_set()
            if fresh and self._over_cap(lane, session):
                job = Job(kind, payload, need)
                job.finish(error=Busy(quotas.busy_message(self.visitor_cap)))
                return job
            if fresh:
                job = Job(kind, payload, need, on_done)
                job.key = key
                if key is not None:
                    self._in_flight[key] = job
                if self.size and lane is not None:
                    self._lane_jobs.setdefault(lane, set()).add(job)
            with job._lock:
                job.waiters += 1
            job.sessions.add(session)
            if self.size and session is not None:
                old = self._queued.get(session)
                if old is not None and old is not job:
                    replaced = self._withdraw(old, session)
                if fresh or self._jobs.holds(job):
                    self._queued[session] = job
            if fresh and self.size:
                if len(self._jobs) or any(self._busy):
                    job.stage("waiting")
                self._jobs.put(job, lane)
        if replaced is not None:
            replaced.finish(error=Superseded("replaced by a newer request of the same session"))
            self._forget(replaced)
        if fresh and self.size == 0:
            self._inline(job, progress)
        return job

    def _withdraw(self, old: Job, session: Hashable) -> Job | None:
        """Take ``session`` off its queued job ``old`` (under ``_lock``); ``old`` when nobody else
        wants it and it was taken out of the queue (the caller finishes it)."""
        del self._queued[session]
        old.sessions.discard(session)
        if not self._jobs.discard(old):  # already running: it finishes for whoever still waits
            return None
        if old.sessions:  # shared with another session: queued again in that one's lane
            self._jobs.put(old, visitors.lane_of(next(iter(old.sessions))))
            return None
        return old

    def _over_cap(self, lane: Hashable, session: Hashable) -> bool:
        """Whether ``lane`` has ``visitor_cap`` jobs in flight besides ``session``'s queued one (a
        new request replaces that); under ``_lock``. Forgets lanes with nothing in flight."""
        for name in [n for n, jobs in self._lane_jobs.items() if all(j.done.is_set() for j in jobs)]:
            del self._lane_jobs[name]
        if not self.size or not self.visitor_cap or lane is None:
            return False
        live = {j for j in self._lane_jobs.get(lane, ()) if not j.done.is_set()}
        live.discard(self._queued.get(session))
        return len(live) >= self.visitor_cap

    def _gone(self, job: Job) -> bool:
        """Whether every browser session that asked for ``job`` has ended (``session_alive``)."""
        alive, sessions = self.session_alive, list(job.sessions)
        if alive is None or not sessions or None in sessions:
            return False
        return not any(alive(visitors.session_of(s)) for s in sessions)

    def call(self, kind: str, payload: dict, *, key: Any = None, need: int = 0,
             progress: Callable[[str], None] | None = None, alive: Callable[[], bool] | None = None,
             on_done: Callable[[Any], None] | None = None, session: Hashable = None) -> Any:
        """Submit and wait: the job's value, or its error raised here."""
        job = self.submit(kind, payload, key, need, on_done, progress, session)
        ran_here = getattr(job, "thread", None) == threading.get_ident()
        return job.wait(None if ran_here else progress, alive)  # stages already shown if ran here

    def running(self, kind: str, key: Any) -> bool:
        """Whether a job of ``kind`` for ``key`` is in flight (another tab's, found again)."""
        return (job := self._in_flight.get((kind, key))) is not None and not job.done.is_set()

    def warm(self) -> None:
        """Start every worker now (in the background) so the first answer does not wait for it."""
        for i in range(self.size):
            threading.Thread(target=self._ensure, args=(i,), daemon=True).start()

    def close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._jobs.stop()
        for job in self._jobs.drain():
            job.finish(error=WorkerLost("the server is shutting down"))
        for i, w in enumerate(self.workers):
            if w is not None:
                w.stop()
                self.workers[i] = None

    # ---- dispatch

    def _forget(self, job: Job) -> None:
        with self._lock:
            if job.key is not None and self._in_flight.get(job.key) is job:
                del self._in_flight[job.key]

    def _inline(self, job: Job, progress: Callable[[str], None] | None) -> None:
        """Run ``job`` in the caller's thread (the engine's own lock keeps one timing at a time)."""
        job.thread = threading.get_ident()

        def stage(name: str) -> None:
            job.stage(name)
            if progress is not None:
                progress(name)

        try:
            job.finish(execute(job.kind, job.payload, stage))
        except BaseException as err:  # a stopped script run too: others waiting must not hang
            job.finish(error=err)
            if not isinstance(err, Exception):
                raise
        finally:
            self._forget(job)

    def _ensure(self, i: int) -> _Worker:
        """Worker ``i``, started (and warmed up) if it is not running."""
        dead = None
        with self._lock:
            w = self.workers[i]
            if self._closed:
                raise WorkerLost("the server is shutting down")
            if w is None or not w.process.is_alive():
                dead, w = w, _Worker(self.env)
                self.workers[i] = w
        if dead is not None:
            dead.stop(kill=True)
        w.wait_ready(self.start_timeout)
        return w

    def _replace(self, i: int, kill: bool) -> None:
        with self._lock:
            w, self.workers[i] = self.workers[i], None
        if w is not None:
            w.stop(kill=kill)

    def _fits(self, w: _Worker, need: int) -> bool:
        used = w.rss() + (limits.rss_bytes() or 0)
        return used + need <= self.limit - self.margin

    def _dispatch(self, i: int) -> None:
        while (job := self._jobs.get()) is not None:
            self._busy[i] = True
            with self._lock:  # running now: no longer any session's queued job
                for s in job.sessions:
                    if self._queued.get(s) is job:
                        del self._queued[s]
            try:
                self._run(i, job)
            except Exception as err:  # never let a dispatcher die
                if not job.done.is_set():
                    job.finish(error=WorkerLost(f"the worker failed: {err}"))
            finally:
                self._busy[i] = False
                self._forget(job)

    def _run(self, i: int, job: Job) -> None:
        if job.abandoned() or self._gone(job):
            job.finish(error=Abandoned("nobody waits for this run any more"))
            return
        lock = self.timing_lock if job.kind in TIMED else None
        if lock is not None and not lock.acquire(blocking=False):
            job.stage("waiting")
            lock.acquire()
        try:
            w = self._ensure(i)
            if job.need and not self._fits(w, job.need) and w.runs:
                self._replace(i, kill=False)  # back to the worker's baseline, then judge again
                self.recycled += 1
                w = self._ensure(i)
            if job.need and not self._fits(w, job.need):
                job.finish(error=MemoryBudgetError(
                    f"this configuration needs about {human_bytes(job.need)} in the worker, more than "
                    f"is free under this server's memory limit of {human_bytes(self.limit)} (the "
                    f"worker holds {human_bytes(w.rss())} and the server "
                    f"{human_bytes(limits.rss_bytes() or 0)}); lower width, batch, seq or depth."))
                return
            self._exchange(i, w, job)
        finally:
            if lock is not None:
                lock.release()

    def _exchange(self, i: int, w: _Worker, job: Job) -> None:
        limit = quotas.deadline_for(self.deadlines, job.kind)
        ends = time.monotonic() + limit if limit else None
        oom = deaths.oom_kills()  # the kernel's OOM kills so far: did it kill the worker, or someone?
        w.requests.put((job.id, job.kind, job.payload))
        while True:
            if ends is not None and time.monotonic() > ends:
                self.stopped += 1
                self._replace(i, kill=True)
                job.finish(error=TimeLimit(quotas.stopped_message(job.kind, limit)))
                threading.Thread(target=self._restart, args=(i,), daemon=True).start()
                return
            try:
                msg = w.replies.get(timeout=0.2)
            except queue.Empty:
                if not w.process.is_alive():
                    code = w.process.exitcode
                    self.deaths += 1
                    self._replace(i, kill=True)
                    job.finish(error=WorkerLost(deaths.message(code, self.limit, oom, deaths.oom_kills())))
                    return
                if job.abandoned() or self._gone(job):
                    self._replace(i, kill=True)
                    job.finish(error=Abandoned("every session that asked for this run left; stopped"))
                    return
                continue
            job_id, what, value, rss = msg
            if job_id != job.id:
                continue
            if what == "stage":
                job.stage(value)
                continue
            w.runs += 1
            if what == "done":
                job.finish(value)
            else:
                kind, text = value
                cls = {"budget": MemoryBudgetError, "config": ConfigError}.get(kind) or getattr(
                    failures, kind, ExecutionError)  # a failure's own kind (program.failures)
                job.finish(error=cls(text))
            if w.runs >= self.max_runs or (rss or 0) > self.max_rss:
                self.recycled += 1
                self._replace(i, kill=False)
            return

    def _restart(self, i: int) -> None:
        """Start worker ``i`` again now (after a stop), so the next job does not wait for it."""
        try:
            self._ensure(i)
        except WorkerLost:  # closed meanwhile, or it did not start: the next job tries again
            pass


_SHARED: dict[str, Pool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool() -> Pool:
    """The process's pool: ``$REMAT_LAB_WORKERS`` workers (0 runs in-process; at most 4), else
    ``quotas.default_workers``."""
    with _SHARED_LOCK:
        if "pool" not in _SHARED:
            text = os.environ.get("REMAT_LAB_WORKERS", "").strip()
            size = min(int(text), 4) if text.isdigit() else quotas.default_workers()
            _SHARED["pool"] = pool = Pool(size=size)
            pool.warm()
        return _SHARED["pool"]
