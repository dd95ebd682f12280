"""Plotly's text made plain: what a user can influence reaches a figure with its HTML escaped.

Plotly renders a subset of HTML in trace names, legends, hover text, tick labels and annotations
(``<a href>``, ``<b>``, ``<span style>``, ``<br>``): an uploaded document's policy name such as
``<a href=…>`` would become a link. Every chart builder is reached through ``charts`` with its
inputs passed through ``plain_inputs``: each string cell of a DataFrame argument and each string
argument has ``&``, ``<`` and ``>`` escaped, so the markup the builders write themselves (line
breaks, their own hover templates) is the only markup a figure holds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pandas as pd


def plain(text: str) -> str:
    """``text`` with the characters Plotly reads as HTML escaped (shown as written)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _plain_frame(df: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in df.columns if df[c].dtype == object or pd.api.types.is_string_dtype(df[c])]
    if not cols:
        return df
    out = df.copy()
    for c in cols:
        out[c] = out[c].map(lambda v: plain(v) if isinstance(v, str) else v)
    return out


def _plain(value):
    if isinstance(value, pd.DataFrame):
        return _plain_frame(value)
    return plain(value) if isinstance(value, str) else value


def plain_inputs(builder: Callable) -> Callable:
    """``builder`` (DataFrame in, figure out) with every string it is given made plain first."""
    @functools.wraps(builder)
    def wrapped(*args, **kwargs):
        return builder(*(_plain(a) for a in args), **{k: _plain(v) for k, v in kwargs.items()})
    return wrapped
