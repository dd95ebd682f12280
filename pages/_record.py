"""Recording the app's finished runs in the run history, tagged with the visitor's browser token."""

from __future__ import annotations

import json
import re
import secrets

import streamlit as st

from remat_lab.store import history

VISITOR_COOKIE = "remat_lab_visitor"  # a random token: which runs are this browser's own
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{16,64}$")
WRITE_TIMEOUT_S = 1.0  # a history locked by another writer: skip this run rather than keep the page busy


def _cookie_token() -> str | None:
    try:
        value = st.context.cookies.get(VISITOR_COOKIE)
    except Exception:  # noqa: BLE001 - no browser request behind this run (tests, bare mode)
        return None
    return value if isinstance(value, str) and _TOKEN.match(value) else None


def visitor_id() -> str:
    """This visitor's id: the token their browser keeps (``remember_visitor`` sets it), so a reload
    still shows their own runs in a public deployment; a new random one for a browser without it."""
    ss = st.session_state
    if "_visitor" not in ss:
        token = _cookie_token()
        ss["_visitor"], ss["_visitor_new"] = (token, False) if token else (secrets.token_urlsafe(24), True)
    return ss["_visitor"]


def session_id() -> str:
    """The id runs are recorded under (the visitor token; kept for older callers)."""
    return visitor_id()


def remember_visitor() -> None:
    """In a public deployment, have the browser keep this visitor's token: a first-party cookie
    (one year, this site only) that the next page load sends back. The token is never in the URL,
    so a shared link does not carry it."""
    token = visitor_id()
    if not st.session_state.get("_visitor_new") or not history.public_mode() or not _TOKEN.match(token):
        return
    st.html(f"<script>document.cookie = '{VISITOR_COOKIE}={token}; Max-Age=31536000; Path=/; "
            "SameSite=Strict' + (location.protocol === 'https:' ? '; Secure' : '');</script>",
            unsafe_allow_javascript=True, width="content")


def record(result: dict, kind: str = "run") -> None:
    """Store ``result`` (a run document, or a comparison with ``kind="compare"``); never raises.

    A result already stored (a cached one shown again) adds no row, only this visitor's link to it.
    A history that cannot be used turns recording off for this session, said once in a toast; one
    locked by another writer for over a second skips this run, said in a toast.
    """
    if st.session_state.get("_history_off"):
        return
    # A page reruns on every widget change with the same (cached) result: store it once per session.
    mark = (kind, json.dumps(result.get("config"), sort_keys=True, default=str),
            repr((result.get("step_time_s") or {}).get("median")), repr(result.get("fastest_reason")))
    seen = st.session_state.setdefault("_recorded", set())
    if mark in seen:
        return
    seen.add(mark)
    problem = history.try_record_error(result, kind=kind, source="app", session_id=visitor_id(),
                                       timeout=WRITE_TIMEOUT_S)
    if isinstance(problem, history.HistoryBusy):
        st.toast("Not recorded in the run history: it is busy (another process is writing).",
                 icon=":material/history_toggle_off:")
    elif problem:
        st.session_state["_history_off"] = str(problem)
        st.toast("Run history is off: its database cannot be used (see the History page).",
                 icon=":material/history_toggle_off:")
