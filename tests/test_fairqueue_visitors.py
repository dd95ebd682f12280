"""A fair queue per visitor, not per tab: lanes keyed by the client's address (or a trusted proxy's
forwarded one), a cap on one visitor's jobs in flight, and jobs stopped when their sessions end (the
Advisor's held one too).

Queue positions are counted, never timed: the dispatcher is kept busy by holding the timing lock, so
nothing starts a worker until the last test, which stops a real one.
"""

import time

import pytest

from remat_lab.config import RunConfig
from remat_lab.serve import quotas, visitors
from remat_lab.serve.visitors import Lane
from remat_lab.serve.worker import Abandoned, Busy, Pool, Superseded

TINY = RunConfig(width=16, batch=2, repeats=1, warmup=0)
SLOW = RunConfig(width=512, batch=256, repeats=1000, warmup=100)  # ~10 s of timing on 2 cores
PROXY = visitors.trusted_proxies({visitors.TRUSTED_ENV: "127.0.0.1, 10.0.0.0/8"})


def _run(width: int) -> dict:
    return {"config": TINY.replace(width=width).as_dict()}


# ---------------------------------------------------------------- who the visitor is


def test_the_visitor_is_the_address_unless_a_trusted_proxy_forwards_one():
    assert visitors.visitor("203.0.113.7") == "203.0.113.7"
    assert visitors.visitor("203.0.113.7", ["198.51.100.1"], PROXY) == "203.0.113.7"  # not a proxy
    assert visitors.visitor(None) is None  # loopback, no proxy configured: cannot be told apart
    assert visitors.visitor(None, ["198.51.100.1"]) is None  # ... and its header is not believed
    # Through a trusted proxy: the right-most hop that is not a trusted proxy. A client that writes
    # its own X-Forwarded-For gets its real address appended by the proxy, and that one counts.
    assert visitors.visitor(None, ["198.51.100.1"], PROXY) == "198.51.100.1"
    assert visitors.visitor(None, ["6.6.6.6, 198.51.100.1"], PROXY) == "198.51.100.1"
    assert visitors.visitor("10.1.2.3", ["6.6.6.6", "198.51.100.1, 10.0.0.9"], PROXY) == "198.51.100.1"
    assert visitors.visitor(None, ["1.2.3.4:5678"], PROXY) == "1.2.3.4"
    assert visitors.visitor(None, ["evil, [2001:db8::1]:443"], PROXY) == "2001:db8::/64"
    assert visitors.visitor(None, ["not an address"], PROXY) == "unreadable:not an address"
    assert visitors.visitor(None, [], PROXY) is None  # the proxy's own health check
    # IPv6: one client's /64 is one visitor
    assert visitors.visitor("2001:db8::1") == visitors.visitor("2001:db8::ffff:1") == "2001:db8::/64"
    assert visitors.trusted_proxies({visitors.TRUSTED_ENV: "nonsense 192.0.2.1"}) == \
        visitors.trusted_proxies({visitors.TRUSTED_ENV: "192.0.2.1/32"})
    assert visitors.lane_of(Lane("s1", "1.2.3.4")) == visitors.lane_of(Lane("s2", "1.2.3.4")) != "s1"
    assert visitors.lane_of(Lane("s1", None)) == "s1" and visitors.session_of(Lane("s1", "x")) == "s1"


def test_the_cap_is_for_public_servers_and_says_why_without_settings():
    assert quotas.visitor_cap({"REMAT_LAB_PUBLIC": "1"}) == quotas.PUBLIC_VISITOR_MAX_JOBS == 2
    assert quotas.visitor_cap({}) == 2 and quotas.visitor_cap({"REMAT_LAB_PUBLIC": "0"}) is None
    said = quotas.busy_message(2)
    assert said.startswith("Not started: you already have 2 jobs running or waiting") and "REMAT" not in said


# ---------------------------------------------------------------- positions in the queue


@pytest.fixture
def busy_pool():
    """A pool of one worker whose dispatcher holds a job from visitor X while the timing lock is
    held: nothing runs, nothing starts a worker; jobs submitted now wait in the queue."""
    p = Pool(size=1, max_runs=100, visitor_cap=2)
    p.timing_lock.acquire()
    running = p.submit("run", _run(8), key="x1", session=Lane("x-tab1", "192.0.2.10"))
    deadline = time.monotonic() + 10
    while len(p._jobs) or not p._busy[0]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield p, running
    p.close()
    p.timing_lock.release()


def test_four_tabs_of_one_client_cannot_delay_another_visitor(busy_pool):
    p, x1 = busy_pool
    tabs = [p.submit("run", _run(8 * i), key=f"x{i}", session=Lane(f"x-tab{i}", "192.0.2.10"))
            for i in (2, 3, 4)]
    assert not tabs[0].done.is_set()  # X's second job waits: X has 2 in flight (running + queued)
    for refused in tabs[1:]:  # the third and fourth tab: refused with a sentence, not queued
        with pytest.raises(Busy, match="you already have 2 jobs running or waiting"):
            refused.wait()
    y = p.submit("run", _run(200), key="y1", session=Lane("y-tab", "198.51.100.20"))
    order = p._jobs.order()
    assert order.index(y) == 0 and order == [y, tabs[0]]  # the other visitor goes next
    # The bound: Y's job starts after the job running now and no other; X's next is after Y's.
    x_again = p.submit("run", _run(16), key="x2b", session=Lane("x-tab2", "192.0.2.10"))
    assert isinstance(tabs[0].error, Superseded)  # tab 2's queued request replaced by its newer one
    assert p._jobs.order() == [y, x_again]
    assert not x1.done.is_set()


def test_per_tab_lanes_would_put_the_other_visitor_last(busy_pool):
    """The same four tabs, each its own lane (the queue before visitors): the fifth waits behind
    every tab; the reason lanes are keyed by visitor."""
    p, _ = busy_pool
    p.visitor_cap = None
    tabs = [p.submit("run", _run(8 * i), key=f"x{i}", session=f"x-tab{i}") for i in (2, 3, 4)]
    y = p.submit("run", _run(200), key="y1", session="y-tab")
    assert p._jobs.order() == [*tabs, y]


def test_a_shared_request_counts_once_and_a_private_server_has_no_cap(busy_pool):
    p, x1 = busy_pool
    a = p.submit("run", _run(24), key="x2", session=Lane("x-tab2", "192.0.2.10"))
    assert p.submit("run", _run(24), key="x2", session=Lane("x-tab3", "192.0.2.10")) is a  # joined
    p.visitor_cap = None
    more = [p.submit("run", _run(32 + i), key=f"x{5 + i}", session=Lane(f"x-tab{5 + i}", "192.0.2.10"))
            for i in range(3)]
    assert not any(j.done.is_set() for j in more)


def test_a_job_whose_sessions_all_ended_is_stopped_before_it_runs():
    p = Pool(size=1, max_runs=100, visitor_cap=2)
    p.session_alive = lambda sid: sid != "gone-tab"
    try:
        job = p.submit("run", _run(8), key="held", session=Lane("gone-tab", "192.0.2.10"))
        with job._lock:
            job.waiters += 1  # the Advisor's hold: a waiter kept in the session's state
        with pytest.raises(Abandoned):
            job.wait()
        assert p.workers == [None]  # stopped before a worker was started for it
    finally:
        p.close()


# ---------------------------------------------------------------- a real worker


def test_a_held_running_job_is_stopped_when_its_session_ends():
    """The Advisor's case: the page holds the job (an extra waiter) so that a Stop click does not
    kill it; when the tab closes, nobody waits but the hold. The runtime says the session ended,
    and the pool stops the job and replaces its worker."""
    p = Pool(size=1, max_runs=100, visitor_cap=2)
    try:
        job = p.submit("run", {"config": SLOW.as_dict()}, key="slow", session=Lane("tab", "192.0.2.10"))
        with job._lock:
            job.waiters += 1
        deadline = time.monotonic() + 180
        while "timing" not in job.stages:
            assert time.monotonic() < deadline and not job.done.is_set(), (job.stages, job.error)
            time.sleep(0.05)
        worker = p.workers[0]
        p.session_alive = lambda sid: False  # the tab closed
        with pytest.raises(Abandoned, match="every session that asked for this run left"):
            job.wait()
        assert p.workers[0] is not worker and not worker.process.is_alive()
    finally:
        p.close()
