"""Jobs on a shared server: deadlines per kind, the queue served in turn by session, one queued job each.

The worker tests share one pool (one worker process) for the module: each (re)start costs a JAX
import. The per-session rule and the queue's order are checked with the timing lock held, so the
dispatcher is busy and nothing starts a worker.
"""

import time

import pytest

from remat_lab.config import RunConfig
from remat_lab.serve import quotas
from remat_lab.serve.fairqueue import FairQueue
from remat_lab.serve.worker import Pool, Superseded, TimeLimit, WorkerLost

TINY = RunConfig(width=16, batch=2, repeats=1, warmup=0)
SLOW = RunConfig(width=512, batch=256, repeats=1000, warmup=100)  # ~10 s of timing on 2 cores
MEDIUM = RunConfig(width=512, batch=256, repeats=300, warmup=10)  # a few seconds of timing


@pytest.fixture(scope="module")
def pool():
    p = Pool(size=1, max_runs=100)
    p._ensure(0)  # warm, so the tests' clocks do not include the first start
    yield p
    p.close()


def _wait_for_stage(job, stage, timeout=120.0):
    deadline = time.monotonic() + timeout
    while stage not in job.stages:
        assert time.monotonic() < deadline, job.stages
        assert not job.done.is_set(), (job.value, job.error)
        time.sleep(0.05)


def _run(config: RunConfig) -> dict:
    return {"config": config.as_dict()}


# ---------------------------------------------------------------- deadlines, without a worker


def test_deadlines_per_kind_and_the_environment_variable_scales_them():
    table = quotas.deadlines(env={})
    assert table["run"] == quotas.DEADLINES_S["run"] and table["advise"] > table["advise_sizes"]
    assert set(quotas.DEADLINES_S) >= {"run", "programs", "compare", "advise", "advise_sizes",
                                       "environment", "device_limit"}
    half = quotas.deadlines(env={quotas.DEADLINE_ENV: "60"})  # the run deadline; others keep ratio
    assert half["run"] == 60 and half["compare"] == quotas.DEADLINES_S["compare"] / 2
    assert quotas.deadline_for(half, "some_new_kind") == quotas.DEFAULT_DEADLINE_S / 2
    assert all(v is None for v in quotas.deadlines(env={quotas.DEADLINE_ENV: "off"}).values())
    assert quotas.deadlines(env={quotas.DEADLINE_ENV: "nonsense"})["run"] == quotas.DEADLINES_S["run"]


def test_a_private_instance_has_no_deadline_unless_its_owner_sets_one(monkeypatch):
    private = {"REMAT_LAB_PUBLIC": "0"}
    assert all(v is None for v in quotas.deadlines(env=private).values())
    assert quotas.deadlines(env={**private, quotas.DEADLINE_ENV: "60"})["run"] == 60
    assert quotas.deadlines(env={"REMAT_LAB_PUBLIC": "1"})["advise"] == quotas.DEADLINES_S["advise"]
    monkeypatch.setenv("REMAT_LAB_PUBLIC", "0")  # the owner reads which setting stopped it
    assert "$REMAT_LAB_JOB_DEADLINE_S" in quotas.stopped_message("advise", 120)
    monkeypatch.setenv("REMAT_LAB_PUBLIC", "1")  # a web visitor never reads a variable's name
    assert "REMAT_LAB" not in quotas.stopped_message("advise", 120)
    assert quotas.deadlines({"run": 2.0}, env={quotas.DEADLINE_ENV: "60"})["run"] == 2.0
    assert (quotas.stopped_message("advise", 180) ==
            "Stopped after 180 s, this server's limit for an advice; try fewer policies, a smaller "
            "model or turning timing off.")
    assert quotas.stopped_message("run", 2.5).startswith(
        "Stopped after 2.5 s, this server's limit for a run;")


# ---------------------------------------------------------------- the queue, without a worker


def test_fair_queue_serves_the_session_served_least_recently():
    q = FairQueue()
    q.put("a1", "A")
    assert q.get() == "a1"  # A has been served once
    q.put("a2", "A")
    q.put("a3", "A")
    q.put("b1", "B")
    q.put("c1", "C")
    assert q.order() == ["b1", "c1", "a2", "a3"]
    assert [q.get() for _ in range(2)] == ["b1", "c1"]
    q.put("b2", "B")  # B was served after A: A's next job goes first
    assert q.order() == ["a2", "b2", "a3"]
    assert q.discard("b2") and not q.discard("b2") and len(q) == 2
    q.stop()
    assert q.get() is None and q.get() == "a2"


def test_one_queued_job_per_session_the_newer_replaces_the_older():
    p = Pool(size=1, max_runs=100)
    p.timing_lock.acquire()  # the dispatcher takes the first job and waits for the lock: no worker
    try:
        running = p.submit("run", _run(TINY), key="running", session="C")
        deadline = time.monotonic() + 10
        while len(p._jobs) or not p._busy[0]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        a1 = p.submit("run", _run(TINY), key="a1", session="A")
        assert p.submit("run", _run(TINY), key="a1", session="A") is a1  # the same request: joined
        a2 = p.submit("run", _run(TINY.replace(width=24)), key="a2", session="A")
        assert a1.done.is_set() and isinstance(a1.error, Superseded)
        with pytest.raises(Superseded, match="replaced by a newer request of the same session"):
            a1.wait()
        # Joining another session's request replaces a2 too; that shared request is not dropped when A
        # moves on: it goes to the other session's lane.
        b1 = p.submit("run", _run(TINY.replace(width=8)), key="b1", session="B")
        assert p.submit("run", _run(TINY.replace(width=8)), key="b1", session="A") is b1
        a3 = p.submit("run", _run(TINY.replace(width=32)), key="a3", session="A")  # replaces a2
        assert isinstance(a2.error, Superseded) and not b1.done.is_set()
        assert p._jobs.order() == [b1, a3] and p._queued == {"A": a3, "B": b1}
        assert "waiting" in a3.stages
        assert not running.done.is_set()
    finally:
        p.close()  # queued jobs fail with a sentence; the dispatcher's job fails when it gets the lock
        p.timing_lock.release()
    for job in (b1, a3):
        with pytest.raises(WorkerLost, match="shutting down"):
            job.wait()
    with pytest.raises(WorkerLost):
        running.wait()


# ---------------------------------------------------------------- real worker processes


def test_another_sessions_small_run_goes_before_the_same_sessions_second(pool):
    order = []
    a1 = pool.submit("run", _run(MEDIUM), key=MEDIUM, session="A", on_done=lambda v: order.append("a1"))
    _wait_for_stage(a1, "timing")  # A's slow job holds the only worker
    a2 = pool.submit("run", _run(TINY), key=TINY, session="A", on_done=lambda v: order.append("a2"))
    b1 = pool.submit("run", _run(TINY.replace(width=24)), key=TINY.replace(width=24), session="B",
                     on_done=lambda v: order.append("b1"))
    assert "waiting" in a2.stages and "waiting" in b1.stages
    assert pool._jobs.order() == [b1, a2]
    for job in (a1, a2, b1):
        job.wait()
    assert order == ["a1", "b1", "a2"]


def test_a_job_past_its_deadline_is_stopped_its_worker_replaced_and_the_next_job_served(pool):
    saved = dict(pool.deadlines)
    pool.deadlines["run"] = 3.0
    try:
        before, stopped = pool._ensure(0).process.pid, pool.stopped
        slow = pool.submit("run", _run(SLOW), key=SLOW, session="A")
        _wait_for_stage(slow, "building")
        nxt = pool.submit("programs", _run(TINY), key=TINY, session="B")  # waits behind it
        started = time.monotonic()
        with pytest.raises(TimeLimit, match=r"^Stopped after 3\.0 s, this server's limit for a run; try a "
                                            r"smaller model"):
            slow.wait()
        assert time.monotonic() - started < 10  # stopped at its deadline, not at its end
        assert pool.stopped == stopped + 1 and pool.deaths == 0
        result = nxt.wait()  # served by the new worker
        assert result["config"]["width"] == 16 and result["texts"]
        assert pool._ensure(0).process.pid != before
    finally:
        pool.deadlines.clear()
        pool.deadlines.update(saved)


def test_the_environment_variable_sets_a_pools_deadlines(monkeypatch):
    monkeypatch.setenv(quotas.DEADLINE_ENV, "1.5")
    p = Pool(size=0)
    assert p.deadlines["run"] == 1.5 and p.deadlines["advise"] == 1.5 * 180 / 120
    monkeypatch.setenv(quotas.DEADLINE_ENV, "0")
    assert Pool(size=0).deadlines["run"] is None


# ---------------------------------------------------------------- the Sweep page's bound


def test_a_public_sweep_click_runs_at_most_the_bound_and_says_so_before(monkeypatch):
    pytest.importorskip("streamlit")
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from pages import _running
    from remat_lab.config import ConfigError

    calls = []

    def refuse(cfg, status, prefix="", **_):
        calls.append(cfg)
        raise ConfigError("not run in this test")

    monkeypatch.setattr(_running, "run_config", refuse)
    page = str(Path(__file__).resolve().parents[1] / "pages" / "sweep.py")
    widths, batches = [8, 16, 32, 64, 128, 256, 512], [1, 2, 4, 8, 16, 32, 64]  # 49 runs

    def grid(public: str) -> AppTest:
        monkeypatch.setenv("REMAT_LAB_PUBLIC", public)
        at = AppTest.from_file(page, default_timeout=120)
        at.query_params["repeats"] = "1"
        at.run()
        at.multiselect(key="sweep_widths").set_value(widths)
        at.multiselect(key="sweep_batches").set_value(batches)
        return at.multiselect(key="sweep_policies").set_value(["no_remat"]).run()

    at = grid("0")
    assert at.button(key="sweep_run").label == "Run sweep (49 runs)"
    at = grid("1")
    assert not at.exception
    assert at.button(key="sweep_run").label == f"Run the first {quotas.PUBLIC_SWEEP_MAX_RUNS} of 49 runs"
    assert any(f"one click runs at most {quotas.PUBLIC_SWEEP_MAX_RUNS} configurations" in i.value
               for i in at.info)
    at.button(key="sweep_run").click().run()
    assert len(calls) == quotas.PUBLIC_SWEEP_MAX_RUNS


def test_a_waiter_sees_each_stage_when_it_is_recorded_not_at_its_poll():
    """The status names the running stage: a stage recorded while the caller waits reaches its
    ``progress`` at once (a wake-up), though its poll (only for the ``alive`` check) is a minute."""
    import threading

    from remat_lab.serve.jobs import Job

    job = Job("run", {}, 0)
    job.waiters = 1
    seen, arrived, out = [], threading.Event(), {}

    def progress(stage):
        seen.append(stage)
        arrived.set()

    waiter = threading.Thread(target=lambda: out.update(value=job.wait(progress, poll=60.0)))
    waiter.start()
    for stage in ("building", "compiling"):
        arrived.clear()
        job.stage(stage)
        assert arrived.wait(20.0), f"{stage} reached the waiter only at its 60 s poll"
    job.finish({"ok": True})
    waiter.join(20.0)
    assert not waiter.is_alive() and out["value"] == {"ok": True} and seen == ["building", "compiling"]
