"""This session's lane in the worker queue: its visitor (the client's address, or a trusted proxy's).

``lane`` reads what Streamlit knows of the connection (``st.context.ip_address``, the
``X-Forwarded-For`` header lines) and lets ``serve.visitors`` decide who the visitor is;
``watch`` lets the worker pool ask the runtime whether a session is still there, so a job whose
sessions have all ended (tabs closed) is stopped, the Advisor's held advice included.
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from remat_lab.serve import visitors


def lane() -> visitors.Lane | None:
    """This session and its visitor (None when not known: the session is its own lane); None
    outside a script run."""
    ctx = get_script_run_ctx()
    if ctx is None:
        return None
    try:
        peer, forwarded = st.context.ip_address, st.context.headers.get_all("X-Forwarded-For")
    except Exception:  # noqa: BLE001 - a run without a connection (AppTest, bare mode)
        peer, forwarded = None, []
    return visitors.Lane(ctx.session_id, visitors.visitor(peer, forwarded, visitors.trusted_proxies()))


def watch(pool) -> None:
    """Let ``pool`` see which sessions have ended (idempotent; nothing outside a real server)."""
    if getattr(pool, "session_alive", None) is not None:
        return
    try:
        from streamlit.runtime import Runtime
    except ImportError:  # pragma: no cover - a Streamlit without it
        return
    if Runtime.exists():
        pool.session_alive = Runtime.instance().is_active_session
