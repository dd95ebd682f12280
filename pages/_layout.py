"""Charts side by side on a wide page and stacked on a narrow one (Streamlit knows no viewport width)."""

from __future__ import annotations

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

# A chart narrower than this cramps its ticks, titles and legend: below it the row wraps. At a
# 1024 px window (the sidebar open, about 560 px of page) every chart takes a row of its own; at
# 1440 px (about 980 px) two share one; at 1600 px and up three.
CHART_MIN_PX = 360


def chart_row(key: str, n: int, min_px: int = CHART_MIN_PX) -> list[DeltaGenerator]:
    """``n`` cells in a row that wraps: each at least ``min_px`` wide (or the page's width when that
    is narrower), the cells of a line sharing its width. ``key`` names the row (unique on the page).

    A flex row (``st.container(horizontal=True)``) whose cells get a CSS ``min-width``: the one
    place where the app sets a style, a constant, nothing a user typed."""
    st.html(f"<style>.st-key-{key} > div {{ min-width: min({int(min_px)}px, 100%); }}</style>")
    with st.container(horizontal=True, key=key, gap="small"):
        return [st.container(key=f"{key}_{i}") for i in range(n)]
