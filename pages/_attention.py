"""The sidebar's llm attention kernel, its block and the vocabulary loss's chunks (``_url.LLM_KEYS``)."""

from __future__ import annotations

import streamlit as st

from remat_lab.config import CHOICES, LIMITS

KEYS = ("attention", "attention_block", "loss_chunks")  # the llm's own (``_url.LLM_KEYS``)


def controls(sb) -> None:
    """Attention (full, chunked, flash), chunked attention's block, and the loss's chunks (llm only)."""
    ss = st.session_state
    left, right = sb.columns(2)
    left.selectbox("Attention", CHOICES["attention"], key="attention",
                   help="full: the seq × seq scores materialized. chunked: blocks with an online "
                        "softmax (FlashAttention's algorithm in plain JAX), memory linear in seq. "
                        "flash: the target's fused kernel (cuDNN on a GPU, Pallas splash on a TPU) "
                        "where it compiles, else chunked; the run says which ran.")
    right.number_input("Attention block", min_value=LIMITS["attention_block"][0],
                       max_value=LIMITS["attention_block"][1], step=128, key="attention_block",
                       disabled=ss["attention"] == "full",
                       help="chunked (and flash's fallback): query and key block, tokens.")
    sb.number_input("Loss chunks", min_value=LIMITS["loss_chunks"][0],
                    max_value=LIMITS["loss_chunks"][1], step=1, key="loss_chunks",
                    help="The final norm, vocabulary projection and cross-entropy over this many "
                         "slices of the sequence, one slice's logits live at a time (1 = whole). "
                         "Presets choose 8 where seq × vocabulary is large.")
