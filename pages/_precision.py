"""The sidebar's precision controls: the compute dtype; the llm's master weights and AdamW moments.

A preset starts from the common mixed-precision recipe (``config.run.RECIPE``: float32 master
weights and moments, bfloat16 compute), as the CLI does: choosing one sets the three controls,
and a link with a preset and no dtype gets it too (``_url``); change any after. The caption under
the controls says which precision the step uses.
"""

from __future__ import annotations

import streamlit as st

from remat_lab.config import DTYPES
from remat_lab.config.catalog import RECIPE, RECIPE_TEXT
from remat_lab.config.run import OPTIMIZER_DTYPES, PARAM_DTYPES

KEYS = ("param_dtype", "optimizer_dtype")  # the llm's own (``_url.LLM_KEYS``)
SEEN = "_recipe_preset"  # the preset the recipe was last applied for (session state)


def _follow_preset(ss) -> None:
    """A newly chosen preset sets the recipe's dtypes (before their widgets are drawn); the first
    run takes the controls as the link left them."""
    preset = ss.get("preset") or ""
    if SEEN not in ss:
        ss[SEEN] = preset
    elif ss[SEEN] != preset:
        ss[SEEN] = preset
        if preset:
            ss.update(RECIPE)


def words(dtype: str, param: str, optimizer: str, step: str) -> str:
    """The precision in one sentence: the recipe's own, or the three dtypes in use."""
    used = {"dtype": dtype, "param_dtype": param or dtype, "optimizer_dtype": optimizer or param or dtype}
    if used == RECIPE:
        return RECIPE_TEXT[0].upper() + RECIPE_TEXT[1:] + "."
    text = f"Compute {used['dtype']}, master weights {used['param_dtype']}"
    return text + (f", AdamW moments {used['optimizer_dtype']}." if step == "train" else ".")


def controls(sb) -> None:
    """The dtype radio; for the llm also master weights and AdamW's moments, and the caption."""
    ss = st.session_state
    _follow_preset(ss)
    sb.radio("dtype", DTYPES, key="dtype", horizontal=True,
             help="The compute dtype: activations and products.")
    if ss["model"] != "llm":
        return
    left, right = sb.columns(2)
    left.selectbox("Master weights", PARAM_DTYPES, key="param_dtype",
                   format_func=lambda d: d or "= dtype",
                   help="The parameters' dtype (their gradients too); = dtype: the compute dtype.")
    right.selectbox("AdamW moments", OPTIMIZER_DTYPES, key="optimizer_dtype",
                    format_func=lambda d: d or "= weights", disabled=ss["step"] != "train",
                    help="Step train: the dtype of AdamW's two moments; = weights: the master "
                         "weights' dtype.")
    sb.caption(words(ss["dtype"], ss["param_dtype"], ss["optimizer_dtype"], ss["step"]))
