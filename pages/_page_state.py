"""A page's own settings in the address bar (policies, grid, budget, filters): restored once, then written.

The sidebar's settings are mirrored by ``_url``. A page's own keys are added here: on the page's
first run in a session each is read from the URL the session opened with (the sidebar rewrites the
address bar before the page runs, so the URL as loaded is consulted too) and validated on its own;
a bad value is named in a warning and its control keeps its default. Every run then writes the
page's values back, so the address bar links to the page as shown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import streamlit as st

from remat_lab.config import ConfigError, parse_bytes
from remat_lab.serve.safe_text import code_span, escape_markdown

MAX_ITEMS = 16  # values in one list parameter (a sweep axis): a link cannot ask for a huge grid
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _as_loaded(key: str) -> str | None:
    """``key``'s value in the address bar, else in the URL this run started from (last of repeats)."""
    if key in st.query_params:
        return st.query_params[key]
    try:  # the URL as loaded: the sidebar may have rewritten the live one already this run
        from streamlit.runtime.state import get_session_state

        with get_session_state().query_params() as qp:
            value = qp.get_initial_value(key)
    except Exception:  # noqa: BLE001 (a Streamlit without it: only the live URL counts)
        return None
    if isinstance(value, list):
        return value[-1] if value else None
    return value


def loaded(page: str, keys: Iterable[str]) -> dict[str, str]:
    """On ``page``'s first run in this session: its URL parameters among ``keys``; later: {}."""
    flag = f"_page_url_{page}"
    if st.session_state.get(flag):
        return {}
    st.session_state[flag] = True
    return {k: v for k in keys if (v := _as_loaded(k)) is not None}


def restore(url: dict[str, str], param: str, parse: Callable[[str], object], state_key: str,
            allowed: str = "names from the page's list, separated by commas",
            default: str = "the page's default selection") -> list[str]:
    """Put ``parse(url[param])`` in ``st.session_state[state_key]``; a warning when it is invalid."""
    if param not in url:
        return []
    raw = url[param]
    try:
        st.session_state[state_key] = parse(raw)
    except (ValueError, ConfigError) as err:
        return [f"URL parameter `{param}` = {code_span(raw)} is not valid ({escape_markdown(err)}) "
                f"Allowed: {allowed}. Using the default, {default}."]
    return []


def names(options: Iterable[str], limit: int | None = None) -> Callable[[str], list[str]]:
    """A parser of comma-separated names, each one of ``options`` (at least one, at most ``limit``)."""
    offered = list(options)

    def parse(raw: str) -> list[str]:
        items = list(dict.fromkeys(s.strip() for s in str(raw).split(",") if s.strip()))
        if not items:
            raise ValueError("no names given.")
        bad = [s for s in items if s not in offered]
        if bad:
            raise ValueError(f"unknown: {', '.join(bad[:3])}.")
        if len(items) > (limit or MAX_ITEMS):
            raise ValueError(f"more than {limit or MAX_ITEMS} names.")
        return items
    return parse


def numbers(lo: int, hi: int) -> Callable[[str], list[int]]:
    """A parser of comma-separated whole numbers from ``lo`` to ``hi`` (at least one, few enough)."""
    def parse(raw: str) -> list[int]:
        items = [s.strip() for s in str(raw).split(",") if s.strip()]
        if not items:
            raise ValueError("no numbers given.")
        if len(items) > MAX_ITEMS:
            raise ValueError(f"more than {MAX_ITEMS} values.")
        out = []
        for s in items:
            if not (s.isascii() and s.isdigit() and len(s) <= 9 and lo <= int(s) <= hi):
                raise ValueError(f"{s[:20]} is not a whole number from {lo} to {hi}.")
            out.append(int(s))
        return sorted(set(out))
    return parse


def flag(raw: str) -> bool:
    """``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``."""
    text = str(raw).strip().lower()
    if text in TRUE + FALSE:
        return text in TRUE
    raise ValueError("not a yes/no value.")


def size(raw: str) -> str:
    """A memory size as typed (``512M``, ``16G``, bytes), checked by ``parse_bytes``."""
    text = str(raw).strip()[:64]
    if parse_bytes(text) <= 0:
        raise ValueError("the size must be positive.")
    return text


def show(warnings: list[str]) -> None:
    """Each of ``warnings`` in a yellow box."""
    for text in warnings:
        st.warning(text, icon=":material/link:")


def write(params: dict[str, str | None]) -> None:
    """Set the page's parameters in the address bar (None or "" removes one); only when changed."""
    for key, value in params.items():
        if not value:
            if key in st.query_params:
                del st.query_params[key]
        elif st.query_params.get(key) != value:
            st.query_params[key] = value
