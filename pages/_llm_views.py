"""Explore's model and memory-by-kind section, and the Guide's lesson on a 1B-class language model."""

from __future__ import annotations

from urllib.parse import urlencode

import streamlit as st

from remat_lab.config import PRESETS, RunConfig, human_bytes
from remat_lab.present import charts, tables
from remat_lab.serve.safe_text import escape_markdown

COMPILE_ONLY_NUMBERS = ("**Compiled only, nothing ran.** These numbers are the compiled program's: "
                        "peak memory and what fills it, the model's parameters and optimizer state, "
                        "the per-dot table, compiled products, FLOPs and the memory timeline. There "
                        "is **no step time** and **no gradient check** (nothing was allocated).")


def count(n: float) -> str:
    """``1235814400`` -> ``'1.24 B'`` (parameters)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:,.0f}"


def model_section(cfg: RunConfig, result: dict) -> None:
    """The model's size (llm, or a training step) and the stacked bar of the memory at the peak."""
    model, mem = result.get("model") or {}, result.get("memory") or {}
    if model and (cfg.model == "llm" or cfg.step == "train"):
        st.subheader("The model")
        cols = st.columns(3)
        active = model.get("active_parameters")  # a mixture of experts: those one token uses
        said = count(model["parameters"]) + (f" ({count(active)} active)" if active else "")
        cols[0].metric("Parameters", said,
                       help="Every weight of the model, counted from the built parameters"
                            + ("; active: those one token uses (its k experts)" if active else ""))
        preset = PRESETS.get(cfg.preset) if cfg.preset else None
        changed = ", ".join(f"{k} {a} → {b}" for k, (a, b) in cfg.preset_overrides.items()
                            if k != "seq")
        cols[0].caption(f"{model['parameters']:,}" + (
            "" if not preset else f" · {cfg.preset} with {changed}" if changed else
            f" · {cfg.preset} publishes {preset['parameters']:,}"))
        cols[1].metric("Parameter bytes", human_bytes(model["parameter_bytes"]),
                       help="The parameters in their dtype: an argument of the step")
        cols[1].caption(f"in {cfg.param_dtype_used}")
        state = model["optimizer_state_bytes"]
        cols[2].metric("Optimizer state", human_bytes(state) if state else "none",
                       help="AdamW's two moments per parameter, in the parameter dtype (step train)")
        cols[2].caption("AdamW: two moments per parameter" if state else "step grad: no optimizer")
    frame = tables.memory_by_kind_frame([result])
    if frame.empty:
        return
    st.subheader("What fills the memory at the peak")
    st.plotly_chart(charts.make_memory_by_kind_figure(frame), width="stretch")
    by_kind = mem.get("by_kind") or {}
    whole = " of the whole training step (AdamW update included)" if cfg.step == "train" else ""
    source = mem.get("by_kind_source") or "size split (fallback)"
    st.caption(f"XLA's compiled peak{whole}, {human_bytes(mem['peak_bytes'])}, split by kind "
               f"({escape_markdown(source)}). How: {escape_markdown(by_kind.get('method', ''))}.")
    parts = tables.other_parts_frame(result)
    if not parts.empty:  # what "other" holds, as XLA's buffer assignment names it
        st.markdown(f"**What other holds** ({human_bytes(by_kind.get('other') or 0)} at the peak):")
        st.dataframe(parts.assign(bytes=parts["bytes"].map(human_bytes),
                                  share=parts["share"].map(lambda x: f"{x:.1%}" if x is not None else "-")),
                     hide_index=True, width="stretch", key="explore_other_parts")


def _explore(**config) -> str:
    return "/?" + urlencode(config)


LESSON = dict(model="llm", preset="llama3.2-1b", seq=2048, batch=1, step="train",
              compile_only="True", dtype="bfloat16")
GIB = float(1 << 30)
# Measured 2026-12-01 with `python -m remat_lab run --preset llama3.2-1b --seq 2048 --batch 1
# --step train --dtype bfloat16 --compile-only --policy P --json` (XLA CPU, 2 Intel Xeon cores at
# 2.6 GHz, jax 0.10.2): memory.by_kind in bytes, then the compiled matrix products and XLA's flops.
MEASURED = {  # policy: (peak, activations, products, TFLOP)
    "no_remat": (42.14, 32.45, 435, 16.86),
    "nothing_saveable": (17.55, 7.85, 563, 20.29),
    "dots_with_no_batch_dims_saveable": (20.17, 10.47, 467, 17.40),
    "minimal": (20.17, 10.47, 467, 17.40),
    "save_qkv_proj": (17.92, 8.22, 515, 19.87),
}
FIXED = {"parameters": 2.302, "optimizer state": 4.604, "gradients": 2.302, "logits": 0.489}


def guide_lesson() -> None:
    """A 1B-class model at seq 2048: what each part of a training step costs, what each policy buys."""
    rows = "\n".join(
        f"| [{p}]({_explore(**LESSON, policy=p)}) | {peak:.2f} GiB "
        f"({peak / MEASURED['no_remat'][0]:.2f}×) | {act:.2f} GiB | {dots} | {tf:.2f} "
        f"({100 * (tf / MEASURED['no_remat'][3] - 1):+.0f} %) |"
        for p, (peak, act, dots, tf) in MEASURED.items())
    fixed = ", ".join(f"{k} **{v:.2f} GiB**" for k, v in FIXED.items())
    st.markdown(f"""
### A seventh lesson: a 1B-class language model at sequence length 2048
The sidebar's **llm** model with the **llama3.2-1b** preset (1,235,814,400 parameters, as
published: width 2048, 16 blocks, 32 query and 8 key/value heads, vocabulary 128,256, tied
embeddings), batch 1, seq 2048, bfloat16, **step train** (the loss, its gradients and an AdamW
update, parameters and optimizer state donated), **compiled only** on this app's server (XLA CPU,
2 Intel Xeon cores at 2.6 GHz, jax 0.10.2), measured 2026-12-01 with the engine; each compile takes
10 to 20 s. Nothing is allocated, so the sizes are XLA's compiled program's, not a run's.

**What each part of the step costs.** Whatever the policy: {fixed}. The parameters are 2 bytes
each; AdamW keeps two moments per parameter (twice the parameters); the gradients are one more
copy; the logits are batch × seq × vocabulary in bfloat16 (2048 × 128,256 × 2 bytes). Together
**9.70 GiB** before a single activation is kept. The rest of the peak is the **activations**, and
that is all a policy can change:

| policy (opens Explore) | peak (vs no_remat) | activations | products | TFLOP |
|---|---|---|---|---|
{rows}

**What each policy buys.** no_remat keeps every intermediate of all 16 blocks: 32.4 GiB of
activations, three quarters of its 42.1 GiB peak (on CPU the (heads × seq × seq) attention scores are
float32, which makes them larger still). nothing_saveable keeps only each block's input and recomputes
the rest: 0.42× the peak, for 20 % more flops (128 more products). MaxText's `minimal` saves the
projections' outputs: here it compiles to exactly the numbers of
`dots_with_no_batch_dims_saveable` (0.48× the peak, +3 % flops): every projection of the llm is a
product without batch dimensions, the attention's two products have them. `save_qkv_proj` saves
only the query, key and value projections: 0.43× the peak for +18 % flops, nearly nothing_saveable's
memory with a little less recomputation. As XLA CPU compiles it, no_remat's step needs more than a
40 GiB device; every other policy fits in 24 GiB. "Products" are the compiled program's matrix
products, forward and backward; the extra ones over no_remat are what the policy recomputes.
""")
