"""The Advisor's job: run it in the worker pool with a Stop that keeps the finished timing rounds.

A Stop click reruns the page, which interrupts the script that waits for the job; a job nobody
waits for is killed by the pool. So the page holds the job (one extra waiter, kept in the session)
while it runs: the rerun finds it and waits again, and the Stop's flag file tells the engine to
end after the current round (``advise(should_stop=...)``), keeping the finished rounds. The hold
is released when the job ends or the page asks for something else; a session that leaves lets a
held job run to its own time budget (its result is cached as any other).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import streamlit as st

from pages import _running
from remat_lab.store.bytecache import ByteCache

HOLD = "_advisor_hold"  # session state: (pool key, job) of the held advice


def stop_file(key: tuple) -> Path:
    """The flag file the Stop creates for the advice ``key`` (server-made name, no user text)."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"remat_lab_advice_stop_{digest}"


def request_stop(key: tuple) -> None:
    """The Stop button's callback."""
    stop_file(key).touch()


def release(keep: tuple | None = None) -> None:
    """Drop this session's hold unless it is on ``keep`` and still running."""
    held = st.session_state.get(HOLD)
    if held is None:
        return
    pool_key, job = held
    if pool_key == keep and not job.done.is_set():
        return
    del st.session_state[HOLD]
    with job._lock:  # the extra waiter added by ``run``
        job.waiters -= 1


def run(kind: str, cache: ByteCache, key: tuple, payload: dict, say, need: int) -> dict:
    """The advice of ``kind`` for ``key``: cached, or from the pool with a hold and a Stop flag."""
    found = cache.get(key)
    if found is not None:
        return found
    flag = stop_file(key)
    pool_key = (kind, key)
    held = st.session_state.get(HOLD)
    if held is None or held[0] != pool_key or held[1].done.is_set():
        release()
        flag.unlink(missing_ok=True)  # a new job: an old Stop does not apply

        def keep(value: dict) -> None:  # a stopped advice or synthesis is shown, not cached
            why = str(value.get("stopped_because") or "")
            if why not in ("stopped", "deadline") and not why.startswith("stopped before"):
                cache.put(key, value)

        job = _running.pool().submit(kind, {**payload, "stop_file": str(flag)}, key=key, need=need,
                                     on_done=keep, progress=say,  # say: a pool of size 0 runs it here
                                     session=_running._session_id())
        st.session_state[HOLD] = (pool_key, job)
        if job.done.is_set() and job.error is not None:  # ran here and failed: not once more
            release()
            raise job.error
    value = _running.cached_call(kind, cache, key, {**payload, "stop_file": str(flag)}, say, need=need)
    release()
    flag.unlink(missing_ok=True)
    return value
