"""The worker pool: a killed worker costs only its run, an abandoned run is stopped, memory is judged.

One pool (one worker process) serves the whole module: each (re)start costs a JAX import.
"""

import os
import signal
import time

import pytest

from remat_lab.config import MemoryBudgetError, RunConfig
from remat_lab.serve.worker import Abandoned, Pool, WorkerLost
from remat_lab.store.bytecache import ByteCache, deep_size

TINY = RunConfig(width=16, batch=2, repeats=1, warmup=0)
SLOW = RunConfig(width=512, batch=256, repeats=1000, warmup=100)  # ~10 s of timing: time to stop it


@pytest.fixture(scope="module")
def pool():
    p = Pool(size=1, max_runs=100)
    yield p
    p.close()


def _pid(pool) -> int:
    return pool._ensure(0).process.pid


def _wait_for_stage(job, stage, timeout=120.0):
    deadline = time.monotonic() + timeout
    while stage not in job.stages:
        assert time.monotonic() < deadline, job.stages
        assert not job.done.is_set(), (job.value, job.error)
        time.sleep(0.05)


def test_a_run_in_the_worker_and_its_stages(pool):
    stages = []
    result = pool.call("run", {"config": TINY.as_dict()}, key=TINY, progress=stages.append)
    assert result["config"]["width"] == 16 and result["gradient_check"]["ok"]
    assert "texts" not in result
    assert [s for s in stages if s != "waiting"][:3] == ["building", "lowering", "compiling"]
    assert os.getpid() != _pid(pool)


def test_a_killed_worker_gives_a_clear_message_and_the_next_run_succeeds(pool):
    job = pool.submit("run", {"config": SLOW.as_dict()}, key=SLOW)
    _wait_for_stage(job, "timing")
    os.kill(_pid(pool), signal.SIGKILL)
    # Killed by the test, not by the kernel's out-of-memory killer: said so (test_worker_deaths.py)
    with pytest.raises(WorkerLost, match=r"stopped from outside the app \(SIGKILL|killed \(SIGKILL\)"):
        job.wait()
    assert pool.deaths == 1
    started = time.monotonic()
    result = pool.call("run", {"config": TINY.replace(width=24).as_dict()}, key=TINY.replace(width=24))
    assert result["config"]["width"] == 24
    assert time.monotonic() - started < 60  # a new worker (the README reports the measured time)


def test_a_run_nobody_waits_for_is_stopped_but_a_finished_one_is_kept(pool):
    kept, deaths = [], pool.deaths
    job = pool.submit("run", {"config": SLOW.as_dict()}, key=SLOW, on_done=kept.append)
    before = _pid(pool)
    _wait_for_stage(job, "timing")
    with pytest.raises(Abandoned):
        job.wait(alive=lambda: False)
    deadline = time.monotonic() + 30
    while pool.workers[0] is not None and pool.workers[0].process.pid == before:
        assert time.monotonic() < deadline, "the abandoned run was not stopped"
        time.sleep(0.1)
    assert not kept and pool.deaths == deaths  # stopped on purpose, not counted as a death
    small = TINY.replace(width=20)
    job = pool.submit("run", {"config": small.as_dict()}, key=small, on_done=kept.append)
    job.wait()
    assert [r["config"]["width"] for r in kept] == [20]


def test_equal_requests_share_one_job(pool):
    a = pool.submit("run", {"config": TINY.as_dict()}, key=("same", TINY))
    b = pool.submit("run", {"config": TINY.as_dict()}, key=("same", TINY))
    assert a is b and a.waiters == 2
    assert a.wait() is b.wait()


def test_workers_are_recycled_after_max_runs_and_above_max_rss():
    p = Pool(size=1, max_runs=1, max_rss=1 << 40)
    try:
        pids = []
        for _ in range(2):
            p.call("environment", {})
            pids.append(p._ensure(0).process.pid)
        assert pids[0] != pids[1] and p.recycled >= 1  # one job each: a new worker for the next
    finally:
        p.close()
    p = Pool(size=1, max_runs=100, max_rss=1 << 20)  # 1 MiB: every worker is over it after a job
    try:
        first = p._ensure(0).process.pid
        p.call("environment", {})
        assert p._ensure(0).process.pid != first and p.recycled == 1
    finally:
        p.close()


def test_a_run_that_does_not_fit_under_the_limit_is_refused_before_it_starts():
    p = Pool(size=0, limit=1 << 40)  # in-process: the memory check belongs to the worker path
    assert p.call("environment", {})["backend"]
    small = Pool(size=1, limit=1 << 20, start_timeout=120)  # 1 MiB: nothing fits
    try:
        with pytest.raises(MemoryBudgetError, match="more than is free under this server's memory"):
            small.call("run", {"config": TINY.as_dict()}, need=1 << 20)
    finally:
        small.close()


def test_byte_cache_stays_under_its_budget():
    cache = ByteCache(1 << 20)
    for i in range(200):  # ~2.6 MB of synthetic entries (400 distinct floats each) for a 1 MiB cache
        assert cache.put(i, {"rows": [i + j / 1000 for j in range(400)], "name": f"config {i}"})
        assert cache.nbytes <= 1 << 20
    assert 0 < len(cache) < 200 and cache.get(199) is not None and cache.get(0) is None
    assert 400 * 32 < deep_size({"rows": [j / 7 for j in range(400)]}) < 400 * 40
    assert not cache.put("huge", b"x" * (2 << 20)) and "huge" not in cache
    assert cache.nbytes == sum(size for _, size in cache._items.values())
