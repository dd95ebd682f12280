"""What a Hugging Face ``config.json`` says that the lab does not reproduce: one sentence per key.

``config/model_config.py`` files each key of a file; the keys here are its differences: they change
no shape, memory or FLOPs the lab reports, or a negligible share, said with its size (biases, Qwen 3's
per-head q/k norm). A note is written from the file's own values, so it never contradicts them.
"""

from __future__ import annotations

from .mesh_text import _show

LAB_ROPE_BASE = 10000
# model_type -> its name in a note, for the families with an RMSNorm over each head of q and k
QK_NORM_FAMILIES = {"qwen3": "Qwen 3", "qwen3_moe": "Qwen 3"}


def show_value(v: object) -> str:
    """A file's value for a message: scalars as written (cut short), containers by their kind only
    (a YAML alias tree is never walked)."""
    if isinstance(v, dict):
        return "(a mapping)"
    if isinstance(v, list):
        return f"(a list of {len(v)})"
    return _show(v)


def hf_differences(data: dict, family: str | None) -> dict[str, str]:
    """Keys the lab does not reproduce but that change no shape, memory or FLOPs it reports (or a
    negligible share, with its size): key -> the sentence ("" = the lab's own value)."""
    out = {}
    base = data.get("rope_theta")
    if "rope_theta" in data:
        out["rope_theta"] = "" if base in (None, LAB_ROPE_BASE) else (
            f"rope_theta {show_value(base)}: the lab's rotary base is {LAB_ROPE_BASE} (frequencies only)")
    for key in ("rope_scaling", "rope_parameters"):
        if key in data:
            given = data[key] if isinstance(data[key], dict) else {}
            kind = given.get("rope_type") or given.get("type")
            out[key] = "" if data[key] is None else (
                f"{key} {show_value(kind or data[key])}: not modelled (frequencies only)")
    for key in ("hidden_act", "hidden_activation"):
        if key in data:
            out[key] = "" if data[key] in ("silu", "swish", None) else (
                f"{key} {show_value(data[key])}: the gated MLP's activation is SiLU here (elementwise; "
                "the same shapes)")
    per_block = data["num_hidden_layers"]
    heads, width = data["num_attention_heads"], data["hidden_size"]
    kv, hd = data.get("num_key_value_heads") or heads, data.get("head_dim") or width // heads
    for key, count in (("attention_bias", per_block * hd * (heads + 2 * kv) + per_block * width),
                       ("mlp_bias", per_block * (2 * data["intermediate_size"] + width))):
        if key in data:
            out[key] = "" if not data[key] else (
                f"{key} true: no biases here ({count:,} parameters; elementwise adds)")
    if family == "qwen2" and "attention_bias" not in data:  # Qwen 2's q, k and v always have biases
        out["(qwen2)"] = (f"Qwen 2's q/k/v biases not modelled ({per_block * hd * (heads + 2 * kv):,} "
                          "parameters; elementwise adds)")
    experts = data.get("num_experts") or data.get("num_local_experts") or 0
    if isinstance(experts, int) and experts > 1 and data.get("moe_intermediate_size"):
        out["(dense mlp)"] = (f"intermediate_size {show_value(data['intermediate_size'])} (a dense layer's) "
                              "is not used: every layer is a mixture of experts of moe_intermediate_size "
                              f"{show_value(data['moe_intermediate_size'])}")
    if data.get("norm_topk_prob") is False:
        out["norm_topk_prob"] = ("norm_topk_prob false: the lab renormalises the top k's weights (a scale "
                                 "a token; the same shapes)")
    if family in QK_NORM_FAMILIES:
        out["(qk_norm)"] = (f"{QK_NORM_FAMILIES[family]}'s per-head RMSNorm of queries and keys (q_norm, "
                            f"k_norm) not modelled ({per_block} x 2 x {hd} = {per_block * 2 * hd:,} "
                            "parameters; elementwise over q and k)")
    if family in ("gemma", "gemma2"):
        out["(gemma)"] = ("Gemma's sqrt(width) embedding scale and (1 + scale) norm offset not "
                          "modelled (elementwise)")
    if "query_pre_attn_scalar" in data:
        out["query_pre_attn_scalar"] = (f"query_pre_attn_scalar {show_value(data['query_pre_attn_scalar'])}: "
                                        "the scores are scaled by 1/sqrt(head_dim) here (a constant)")
    if "partial_rotary_factor" in data:
        out["partial_rotary_factor"] = "" if data["partial_rotary_factor"] == 1 else (
            f"partial_rotary_factor {show_value(data['partial_rotary_factor'])}: the lab rotates every "
            "feature (elementwise)")
    return out


def gemma2_differences(data: dict) -> dict[str, str]:
    """Gemma 2's file, read as the gemma2-2b preset is: its soft-capping, its sliding window on
    every other layer and its two more norms a block, each said (key -> sentence, "" where another
    key's sentence says it; "(gemma2)" for the norms, which no key names)."""
    out = {}
    capped = [f"{k} {show_value(data[k])}" for k in ("attn_logit_softcapping", "final_logit_softcapping")
              if data.get(k) not in (None, 0, 0.0)]
    if capped:
        out["attn_logit_softcapping"] = (f"{', '.join(capped)}: no soft-capping here (a tanh of the scores "
                                         "and logits; what its backward keeps is memory the lab does not "
                                         "count)")
        out["final_logit_softcapping"] = ""
    window, context = data.get("sliding_window"), data.get("max_position_embeddings")
    if isinstance(window, int) and not (isinstance(context, int) and window >= context):
        out["sliding_window"] = (f"sliding_window {window:,} on every other layer: the lab's attention is "
                                 f"causal over the whole sequence (exact up to {window:,} tokens; past it, "
                                 "full attention's FLOPs and memory)")
    layers, width = data["num_hidden_layers"], data["hidden_size"]
    out["(gemma2)"] = (f"Gemma 2's post-attention and post-MLP norms not modelled ({layers} x 2 x {width} "
                       f"= {layers * 2 * width:,} parameters; elementwise)")
    return out  # "" : a key taken, its sentence said with another's


def gpt2_differences(data: dict, inner: int, mlp_dim: int) -> dict[str, str]:
    """GPT-2's file, read as the gpt2-small preset is (a Llama-style stand-in): key -> sentence."""
    width, positions = data["n_embd"], data.get("n_positions") or 0
    act = data.get("activation_function", "gelu_new")
    out = {"activation_function": (
        f"a Llama-style stand-in, not GPT-2: its MLP ({width} -> {inner:,} -> {width}, {show_value(act)}, "
        f"not gated) is a gated MLP of mlp_dim {mlp_dim:,} (2/3 x {inner:,}: the same parameters and FLOPs "
        "a token); RMSNorm without biases for LayerNorm with biases; no linear biases; rotary positions "
        f"for {positions:,} x {width} learned ones ({positions * width:,} parameters)")}
    drops = [f"{k} {show_value(data[k])}" for k in ("attn_pdrop", "embd_pdrop", "resid_pdrop")
             if data.get(k) not in (None, 0, 0.0)]
    out.update(dict.fromkeys(("attn_pdrop", "embd_pdrop", "resid_pdrop"), ""))
    if drops:
        out["attn_pdrop"] = (f"{', '.join(drops)}: no dropout here (its masks are memory the lab does "
                             "not count)")
    return out
