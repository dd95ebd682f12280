"""A closed tab's session is ended once gone for the session TTL: its upload bytes, budget and parses go."""

import pytest

from remat_lab.store import upload_budget, uploads
from remat_lab.store.bytecache import ByteCache

MIB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _setup():
    pytest.importorskip("streamlit")
    from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
    from streamlit.runtime.uploaded_file_manager import UploadedFileRec

    budget = upload_budget.UploadBudget(per_session=10 * MIB, total=15 * MIB)
    cache = ByteCache(4 * MIB)
    opened = uploads.Opened(cache)
    mgr = upload_budget.bound_manager(MemoryUploadedFileManager("/upload"), budget, opened.end)
    # A's tab closed while its 8 MiB file was still to be read; both have a parse open.
    mgr.add_file("A", UploadedFileRec(file_id="a1", name="a.jsonl", type="application/json",
                                      data=b"x" * (8 * MIB)))
    for session, key in (("A", ("sa", "a.jsonl")), ("B", ("sb", "b.jsonl"))):
        cache.put(key, {"parse": key}, MIB)
        opened.add(session, key)
    return budget, cache, mgr


def test_a_session_gone_for_the_ttl_gives_back_its_upload_its_budget_and_its_parses():
    budget, cache, mgr = _setup()
    clock, connected = Clock(), {"A": False, "B": True}
    reaper = upload_budget.SessionReaper(clock)
    assert reaper.sweep() == []  # not told how to end a session yet
    ended = []

    def end(sid):
        ended.append(sid)
        mgr.remove_session_files(sid)

    reaper.watch(connected.__getitem__, end, grace_s=60)
    reaper.seen("A")
    reaper.seen("B")
    assert reaper.sweep() == [] and budget.in_flight() == 8 * MIB  # A first found gone now
    clock.t += 59
    assert reaper.sweep() == [] and ("sa", "a.jsonl") in cache  # not for the TTL yet
    clock.t += 1
    assert reaper.sweep() == ["A"] and ended == ["A"]
    assert budget.in_flight() == 0 and mgr._total_bytes == 0 and mgr.get_files("A", ["a1"]) == []
    assert ("sa", "a.jsonl") not in cache and ("sb", "b.jsonl") in cache  # B's parse still open
    assert reaper.watched() == 1  # B, still connected
    clock.t += 1000
    assert reaper.sweep() == [] and ended == ["A"]  # ended once


def test_a_session_that_reconnects_within_the_ttl_is_not_ended():
    clock, connected, ended = Clock(), {"A": False}, []
    reaper = upload_budget.SessionReaper(clock)
    reaper.watch(connected.__getitem__, ended.append, grace_s=60)
    reaper.seen("A")
    reaper.sweep()
    clock.t += 50
    connected["A"] = True  # the tab came back
    assert reaper.sweep() == []
    connected["A"] = False
    clock.t += 20
    assert reaper.sweep() == []  # gone again, its 60 s count from now
    clock.t += 59
    assert reaper.sweep() == []
    clock.t += 1
    assert reaper.sweep() == ["A"] and ended == ["A"] and reaper.watched() == 0


def test_one_failing_clean_up_does_not_stop_the_others():
    clock, ended = Clock(), []

    def end(sid):
        if sid == "A":
            raise RuntimeError("boom")
        ended.append(sid)

    reaper = upload_budget.SessionReaper(clock)
    reaper.watch(lambda sid: False, end, grace_s=1)
    reaper.seen("A")
    reaper.seen("B")
    reaper.sweep()
    clock.t += 1
    assert sorted(reaper.sweep()) == ["A", "B"] and ended == ["B"] and reaper.watched() == 0


def test_the_allocator_is_tuned_where_glibc_runs():
    import ctypes.util
    import platform

    tuned = upload_budget.tune_allocator()
    glibc = platform.libc_ver()[0] == "glibc" and ctypes.util.find_library("c") is not None
    assert tuned is glibc  # glibc took the fixed mmap threshold; elsewhere nothing is claimed
    upload_budget.give_back_memory()  # callable after it, on any platform


def test_streamlits_expired_sessions_are_dropped_from_its_storage():
    pytest.importorskip("streamlit")
    import threading

    from streamlit.runtime.memory_session_storage import MemorySessionStorage
    from streamlit.runtime.session_manager import SessionInfo

    from pages import _uploads

    class Session:
        def __init__(self, sid):
            self.id = sid

    class Manager:  # the attributes of Streamlit's WebsocketSessionManager that forget_expired uses
        def __init__(self):
            self._storage_lock = threading.Lock()
            self._session_storage = MemorySessionStorage(ttl_seconds=60)

    mgr, clock = Manager(), Clock()
    mgr._session_storage._cache._timer = clock
    mgr._session_storage.save(SessionInfo(client=None, session=Session("A")))
    clock.t += 30
    mgr._session_storage.save(SessionInfo(client=None, session=Session("B")))
    clock.t += 29
    assert _uploads.forget_expired(mgr) == 0 and len(mgr._session_storage._cache._data) == 2
    clock.t += 1  # A stored 60 s ago (its TTL), B 30 s
    assert _uploads.forget_expired(mgr) == 1
    assert [i.session.id for i in mgr._session_storage._cache._data.values()] == ["B"]
    assert _uploads.forget_expired(None) == 0  # another Streamlit: nothing done


def test_after_runs_once_per_sweep_that_ended_sessions_and_frees_cycles():
    import gc
    import weakref

    clock, calls = Clock(), []
    reaper = upload_budget.SessionReaper(clock)
    reaper.watch(lambda sid: False, lambda sid: None, grace_s=1, after=lambda: calls.append("after"))
    reaper.seen("A")
    reaper.seen("B")
    reaper.sweep()
    assert calls == []  # nothing ended yet
    clock.t += 1
    assert sorted(reaper.sweep()) == ["A", "B"] and calls == ["after"]  # two ended, one clean-up
    clock.t += 1
    assert reaper.sweep() == [] and calls == ["after"]

    class State:  # what an ended session leaves: objects only a reference cycle keeps
        pass

    gc.disable()  # as on an idle server: nothing allocates, so the collector would not run
    try:
        a, b = State(), State()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None  # only the collector frees a cycle
        upload_budget.give_back_memory(collect=True)
        assert gone() is None
    finally:
        gc.enable()
