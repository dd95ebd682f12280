"""A model just loaded in the sidebar (a preset or a file): a batch and seq that fit, or why none does."""

from __future__ import annotations

import streamlit as st

from pages._budget import budget_or_none
from remat_lab.config import LOCAL, PRESET_FIELDS, ConfigError
from remat_lab.config.catalog import RECIPE
from remat_lab.config.moe_config import MOE_DEFAULTS, MOE_FIELDS
from remat_lab.program.footprint import starting_shape

NOTE = "_load_fit_note"  # (the sentence, the batch and seq it set): shown while they stand
FINAL = "_sidebar_config"  # the sidebar's last configuration, its target and mesh included


def on_load() -> None:
    """Called by the preset's and the file's callbacks once the shape's fields are in the session:
    the batch and seq (and, where nothing fits this server, compile only) set before the widgets
    are drawn, so the over-budget flag never speaks of settings the user did not choose."""
    ss = st.session_state
    ss.pop(NOTE, None)
    last = ss.get(FINAL)
    if last is None:
        return
    rest = {} if ss["experts"] else {k: MOE_DEFAULTS[k] for k in MOE_FIELDS if k not in PRESET_FIELDS}
    try:  # a dense model leaves a mixture of experts' other fields at rest (pages/_moe.py)
        cfg = last.replace(model="llm", preset=ss.get("preset") or "", microbatches=1, compile_only=False,
                           **{k: ss[k] for k in PRESET_FIELDS}, **RECIPE, **rest)
    except ConfigError:  # the mesh does not split this shape: the mesh's own message says so
        return
    found = starting_shape(cfg, budget_or_none())
    ss["batch"], ss["seq"], ss["microbatches"] = found["batch"], found["seq"], 1
    if last.target == LOCAL:  # compile only where nothing fits this server; run what fits
        ss["compile_only"] = found["compile_only"]
    ss[NOTE] = (found["text"], found["batch"], found["seq"], found["fits"])


def note(sb) -> None:
    """What loading set, while the batch and seq are still the ones it set."""
    ss = st.session_state
    if NOTE not in ss:
        return
    text, batch, seq, fits = ss[NOTE]
    if (int(ss["batch"]), int(ss["seq"])) != (batch, seq) or not text:
        return
    (sb.caption if fits else sb.info)(text)
