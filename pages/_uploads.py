"""Open results' uploads: one file at a time, its bytes let go once parsed, the session's open parses.

Streamlit keeps an uploaded file's bytes in its upload manager (and the widget's value) until the
widget drops it or the session ends. ``bound`` puts the server's manager under the upload budget
(``store.upload_budget``: one file per session, bytes per session and in all); ``receive`` parses
the uploader's file, removes it from the manager and moves the page to a fresh, empty uploader, so
the bytes are freed at once and only the parse (in the byte-bounded cache) stays. Every session is
also handed to ``upload_budget.REAPER``, which ends it once its tab has been gone for the server's
``server.disconnectedSessionTTL``: Streamlit then forgets the session without ending it, so its
files, budget, open parses and table sources would stay in memory for good.
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from remat_lab.store import results, upload_budget, uploads

COUNTER = "_results_upload_n"  # session state: how many uploads this session's page has taken
UNCACHED = "_results_uncached"  # session state: a parse the cache did not keep, shown once


def _ctx():
    return get_script_run_ctx()


def session() -> str | None:
    """This browser session's id (the budget's and the open parses' key); None outside a run."""
    ctx = _ctx()
    return ctx.session_id if ctx is not None else None


def bound() -> None:
    """Put this server's upload manager under the upload budget (idempotent; each run may call it)."""
    ctx = _ctx()
    manager = getattr(ctx, "uploaded_file_mgr", None) if ctx is not None else None
    if manager is not None:
        upload_budget.bound_manager(manager, ended=uploads.OPENED.end)
        _reaped(manager, ctx.session_id)


def _reaped(manager, session: str) -> None:
    """``session`` watched by the reaper; the reaper started (once) where a real server runs."""
    from streamlit.runtime import Runtime

    if not Runtime.exists():  # AppTest and bare mode: no server, nobody leaves
        return
    upload_budget.REAPER.seen(session)
    if upload_budget.REAPER.end is not None:
        return
    rt = Runtime.instance()
    upload_budget.tune_allocator()  # once, at the server's first run: large blocks freed to the system

    def end(sid: str) -> None:  # what Streamlit's own session shutdown lets go of
        manager.remove_session_files(sid)  # its files, its budget, its open parses (bound_manager)
        rt.media_file_mgr.clear_session_refs(sid)
        rt.media_file_mgr.remove_orphaned_files()
        rt.dataframe_source_mgr.clear_all_for_session(sid)

    def after() -> None:  # once per sweep that ended sessions
        forget_expired(getattr(rt, "_session_mgr", None))
        upload_budget.give_back_memory(collect=True)

    upload_budget.REAPER.watch(rt.is_active_session, end, st.get_option("server.disconnectedSessionTTL"),
                               after=after)
    upload_budget.REAPER.start()


def forget_expired(session_mgr) -> int:
    """Drop the sessions past their TTL from Streamlit's session storage (it keeps an expired one,
    with its state, until a later session is stored); how many. A no-op (0) where this Streamlit
    keeps its sessions otherwise (``tests/test_upload_reaper.py`` checks this one's)."""
    lock = getattr(session_mgr, "_storage_lock", None)
    cache = getattr(getattr(session_mgr, "_session_storage", None), "_cache", None)
    if lock is None or not callable(getattr(cache, "expire", None)) or not hasattr(cache, "_data"):
        return 0
    with lock:
        before = len(cache._data)
        cache.expire()
        return before - len(cache._data)


def uploader_key() -> str:
    """The uploader's key now: a new one after each file taken, so the widget starts empty again."""
    n = st.session_state.get(COUNTER, 0)
    return "results_files" if n == 0 else f"results_files_{n}"


def refusals() -> list[tuple[str, str]]:
    """This session's files the budget refused since the last run: (file name, sentence)."""
    said = upload_budget.BUDGET.take_refusals(session())
    if said:  # the uploader still lists the refused file: a fresh one
        st.session_state[COUNTER] = st.session_state.get(COUNTER, 0) + 1
    return said


def receive(f) -> None:
    """Parse the uploaded file ``f``, let its bytes go (manager, widget) and rerun with an empty
    uploader; the parse is opened for this session (``uploads.OPENED``)."""
    ctx, sid = _ctx(), session()
    try:
        with st.spinner(f"Reading the file ({f.size / 2**20:.1f} MiB)…"):
            item = uploads.open_upload(f.name, f)
    finally:
        f.close()
        manager = getattr(ctx, "uploaded_file_mgr", None) if ctx is not None else None
        if manager is not None:
            manager.remove_file(sid, f.file_id)  # the bytes go back to the budget
        st.session_state[COUNTER] = st.session_state.get(COUNTER, 0) + 1
    key = (item.sha256, item.name)
    if uploads.cached(item.name, item.sha256) is None:  # not kept (stopped for memory): shown once
        st.session_state[UNCACHED] = item
    else:
        uploads.OPENED.add(sid, key)
    del f, item
    upload_budget.give_back_memory()
    st.rerun()


def opened() -> tuple[list[results.Loaded], list[str]]:
    """This session's open parses (oldest first), and the names of those the cache no longer has."""
    shown, gone = [], []
    for sha, name in uploads.OPENED.keys(session()):
        item = uploads.cached(name, sha)
        (shown.append(item) if item is not None else gone.append(name))
    once = st.session_state.pop(UNCACHED, None)
    return shown + ([once] if once is not None else []), gone


def close_all() -> None:
    """The Close button's callback: this session's parses closed (the cache lets go of unshared ones)."""
    uploads.OPENED.end(session())
