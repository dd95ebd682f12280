"""The sidebar's llm controls (preset, heads, vocabulary, MLP), step controls and the compile-only offer."""

from __future__ import annotations

import streamlit as st

from pages import _load_fit, _model_config, _moe
from remat_lab.config import (
    LIMITS,
    LOCAL,
    PRESET_FIELDS,
    PRESET_NAMES,
    PRESETS,
    STEPS,
    ConfigError,
    RunConfig,
    human_bytes,
    parameter_counts,
    parameters_text,
)
from remat_lab.config.run import LLM_LIMITS

# What a compile-only run has, in words (the over-budget offer and Explore say it the same way).
COMPILE_ONLY_HAS = ("the compiled peak memory and what fills it, the model's parameters and optimizer "
                    "state, the per-dot table, FLOPs and the memory timeline; no step time and no "
                    "gradient check (nothing is allocated or run)")


def _apply_preset() -> None:
    """The preset picker's callback: copy the preset's shape into the controls ("none": keep them)."""
    ss = st.session_state
    name = ss.get("preset")
    if name in PRESETS:
        for key in PRESET_FIELDS:
            ss[key] = PRESETS[name][key]
        ss["width_exact"] = ss["width"]
        _model_config.forget()
        _load_fit.on_load()  # a batch and seq that fit it, or why none does


def preset_label(name: str) -> str:
    if not name:
        return "none (the fields as set)"
    p = PRESETS[name]
    active = f", {p['active_parameters'] / 1e9:.2f} B active" if p.get("active_parameters") else ""
    return f"{name} ({p['parameters'] / 1e9:.2f} B parameters{active})"


def limits(key: str, model: str) -> tuple[int, int]:
    """The range of ``key`` for ``model`` (the llm allows longer sequences and deeper stacks)."""
    return (LLM_LIMITS if model == "llm" else LIMITS).get(key, LIMITS[key])


def seq_options(pow2: list[int], model: str, current: int) -> list[int]:
    """The sequence slider's stops: powers of two up to the model's limit (the llm: from 2)."""
    hi = limits("seq", model)[1]
    stops = [s for s in (*pow2, *(2 ** i for i in range(11, 16))) if s <= hi and (model != "llm" or s > 1)]
    return sorted(set(stops) | {current})


def clamp_for_model(ss) -> None:
    """Values another model allowed (an llm's depth 32, seq 8192) brought into this model's range."""
    for key in ("seq", "depth"):
        lo, hi = limits(key, ss["model"])
        ss[key] = min(max(int(ss[key]), lo), hi)
    if ss["model"] == "llm" and ss["seq"] < 2:
        ss["seq"] = 2


def preset_control(sb) -> None:
    """The preset picker (llm only): choosing one fills the shape's controls."""
    ss = st.session_state
    sb.selectbox("Preset (published shape)", PRESET_NAMES, key="preset", format_func=preset_label,
                 on_change=_apply_preset,
                 help="Fills width, depth, heads, key/value heads, head size, MLP size, vocabulary, "
                      "seq and tied embeddings with a published model's; change any field after. "
                      "none: the fields as set.")
    if ss["preset"] and PRESETS[ss["preset"]].get("differences"):
        sb.caption(f"Not modelled: {PRESETS[ss['preset']]['differences']}.")
    _model_config.controls(sb)  # or the shape from a published config file
    _load_fit.note(sb)


def shape_controls(sb) -> None:
    """Heads, key/value heads, head size, MLP size, vocabulary and tied embeddings (llm only)."""
    ss = st.session_state
    width, head_dim = int(ss["width"]), int(ss["head_dim"])
    heads = [h for h in range(1, LIMITS["heads"][1] + 1) if head_dim or width % h == 0]
    if ss["heads"] not in heads:  # the width changed: the nearest head count that divides it
        ss["heads"] = max(h for h in heads if h <= ss["heads"]) if ss["heads"] > 1 else 1
    sb.select_slider("Attention heads", options=heads, key="heads",
                     help="Query heads. Without a head size, only divisors of the width.")
    kv = [0] + [k for k in range(1, ss["heads"] + 1) if ss["heads"] % k == 0]
    if ss["kv_heads"] not in kv:
        ss["kv_heads"] = max(k for k in kv if k <= ss["kv_heads"])
    left, right = sb.columns(2)
    left.selectbox("Key/value heads", kv, key="kv_heads",
                   format_func=lambda k: "= heads" if k == 0 else str(k),
                   help="Grouped-query attention: each key/value head serves heads / kv heads "
                        "query heads.")
    right.number_input("Head size", min_value=0, max_value=LIMITS["head_dim"][1], step=2,
                       key="head_dim", help="0 = width / heads; must be even (rotary embedding).")
    left.number_input("MLP size", min_value=0, max_value=LIMITS["mlp_dim"][1], step=256,
                      key="mlp_dim", help="The gated MLP's hidden size; 0 = 4 × width.")
    right.number_input("Vocabulary", min_value=LIMITS["vocab"][0], max_value=LIMITS["vocab"][1],
                       step=1, key="vocab", help="Tokens; the logits are batch × seq × vocabulary.")
    sb.toggle("Tied embeddings", key="tie_embeddings",
              help="The vocabulary projection is the embedding's transpose (one matrix, not two).")
    _moe.controls(sb)  # a mixture of experts' fields, when the model has experts
    said = parameters_said(ss)
    if said:
        sb.caption(said)


SHAPE_KEYS = ("width", "depth", "heads", "kv_heads", "head_dim", "mlp_dim", "vocab", "tie_embeddings",
              "experts", "experts_per_token", "expert_mlp_dim", "shared_experts")


def parameters_said(ss) -> str:
    """The shape's parameter count, as a preset's is said ("8.03 B parameters"), for an llm typed
    by hand or edited from its preset; a mixture of experts' always, with the active ones ("" while
    a dense preset's own count stands, or the shape is not valid yet)."""
    try:
        cfg = RunConfig(model="llm", seq=2, **{k: ss[k] for k in SHAPE_KEYS})
    except (ConfigError, KeyError, TypeError, ValueError):
        return ""
    counts, preset = parameter_counts(cfg), PRESETS.get(ss.get("preset") or "", {})
    published = preset.get("parameters")
    if published and not cfg.experts and abs(counts["parameters"] - published) <= 0.005 * published:
        return ""
    said = ""
    if published:
        active = preset.get("active_parameters")
        said = (f" ({ss['preset']} publishes {published / 1e9:.2f} B"
                + (f", {active / 1e9:.2f} B active" if active else "") + ")")
    return f"{parameters_text(cfg)}, counted from this shape{said}."


def step_controls(sb) -> None:
    """Step (the gradient, or a whole AdamW training step) and gradient-accumulation microbatches."""
    ss = st.session_state
    sb.radio("Step", STEPS, key="step", horizontal=True,
             help="grad: the objective's gradients. train: value_and_grad and an AdamW update, "
                  "parameters and optimizer state donated (the memory of a real training step).")
    if ss["step"] == "train":
        ss["objective"] = "value_and_grad"
    splits = [m for m in range(1, min(max(int(ss["batch"]), 1), LIMITS["microbatches"][1]) + 1)
              if max(int(ss["batch"]), 1) % m == 0]
    if ss["microbatches"] not in splits:
        ss["microbatches"] = 1
    sb.select_slider("Microbatches", options=splits, key="microbatches",
                     help="Gradient accumulation: the batch in this many equal parts, one after "
                          "another (lax.scan); divisors of the batch only.")


def compile_only_toggle(where, disabled: bool = False) -> None:
    where.toggle("Compile only (run nothing)", key="compile_only", disabled=disabled,
                 help="Compile the step on abstract inputs: " + COMPILE_ONLY_HAS + ".")


def flag(box, over: tuple[int, int] | None, cfg, message: str) -> bool:
    """The over-budget flag with its compile-only offer. ``over``: (estimate, budget) of the run
    without compile-only. Returns whether the compile-only toggle was drawn here."""
    offer = cfg.target == LOCAL and not cfg.mesh
    if cfg.compile_only and over:
        box.info(f"**Compiled only**: running it would need about {human_bytes(over[0])}, over this "
                 f"server's {human_bytes(over[1])}. Memory, products and FLOPs; no step time, no "
                 "gradient check.", icon=":material/memory:")
    elif over:
        box.error(message + (f" It can still be **compiled without running**: {COMPILE_ONLY_HAS}."
                             if offer else ""), icon=":material/memory:")
    else:
        return False
    if offer:
        compile_only_toggle(box)
    return offer

