"""Recording the app's finished runs in the run history, tagged with the browser session."""

from __future__ import annotations

import json

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from remat_lab.store import history


def session_id() -> str | None:
    """This browser session's id (the visitor's own runs in a public deployment)."""
    ctx = get_script_run_ctx()
    return ctx.session_id if ctx else None


def record(result: dict, kind: str = "run") -> None:
    """Store ``result`` (a run document, or a comparison with ``kind="compare"``); never raises.

    A history that cannot be used turns recording off for this session, said once in a toast.
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
    problem = history.try_record(result, kind=kind, source="app", session_id=session_id())
    if problem:
        st.session_state["_history_off"] = problem
        st.toast("Run history is off: its database cannot be used (see the History page).",
                 icon=":material/history_toggle_off:")
