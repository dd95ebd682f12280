"""Explore's compile details on request: what XLA's own remat pass did, XLA's and JAX's log summary."""

from __future__ import annotations

import streamlit as st

from remat_lab.serve.safe_text import escape_markdown


def compile_details(where, result: dict) -> None:
    """An expander in ``where`` (a column) with ``compile.xla_remat`` and ``compile.log``: counts,
    then the first distinct lines as code (never rendered as Markdown)."""
    comp = result.get("compile") or {}
    log, remat = comp.get("log") or {}, comp.get("xla_remat") or {}
    if not log and not remat:
        return
    lines, warned = log.get("lines", 0), log.get("warnings_total", 0)
    with where.expander(f"Compiler log: {lines} XLA line{'s' * (lines != 1)}, "
                        f"{warned} warning{'s' * (warned != 1)}"):
        if remat:
            st.markdown("XLA's own rematerialization pass " + (
                f"**rewrote** this program ({remat.get('instructions', 0)} instructions cloned)"
                if remat.get("applied") else "left this program as written") + ".")
        for key, title in (("xla_remat_lines", "From XLA's rematerialization pass"),
                           ("xla_lines", "Other XLA log lines"), ("warnings", "JAX's warnings")):
            if log.get(key):
                st.caption(escape_markdown(title))
                st.code("\n".join(log[key]), language=None)
        if log:
            st.caption(f"The first distinct lines of each kind; the raw stream is kept off the terminal "
                       f"({escape_markdown(log.get('shown_with') or 'REMAT_LAB_SHOW_LOGS=1')} shows it).")
