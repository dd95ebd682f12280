"""The sidebar's settings in the address bar: the controls it mirrors, their defaults, read and rewritten.

On a session's first run each URL parameter is validated on its own (a bad one is named in a warning
and its control keeps the default), then against the others (heads that do not divide the width, an
llm shape that does not fit together); every run then rewrites the address bar to the configuration
in use, so a link restores these settings.
"""

from __future__ import annotations

import streamlit as st

from pages import _mesh
from remat_lab.config import (
    APP_DEFAULT,
    CHOICES,
    LIMITS,
    NAME_FIELDS,
    PRESET_FIELDS,
    PRESETS,
    ConfigError,
    RunConfig,
    coerce_config,
)
from remat_lab.config.catalog import RECIPE, USER_MODEL
from remat_lab.config.run import LLM_LIMITS
from remat_lab.serve.safe_text import code_span, escape_markdown

CONTROL_KEYS = ("model", "width", "batch", "seq", "heads", "depth", "stack", "dtype", "policy",
                "objective", "repeats", "target", "step", "microbatches", "compile_only")
# The llm's own fields: in the address bar (and the configuration) only for model llm.
LLM_KEYS = ("preset", "vocab", "kv_heads", "head_dim", "mlp_dim", "tie_embeddings", "param_dtype",
            "optimizer_dtype", "attention", "attention_block", "loss_chunks", "experts",
            "experts_per_token", "expert_mlp_dim", "shared_experts", "router_gating", "capacity_factor",
            "load_balance_loss_weight")
# Never from a link: the user's own block is code (pages/_user_block.py); these are refused with a warning.
NEVER_KEYS = ("model_module", "input_shape")
NOT_FROM_A_LINK = ("is your own block, which runs Python code: a link cannot choose it (type it in "
                   "the sidebar's \"Your block\" on a private server)")
# The app opens on the one default configuration, the CLI's run without flags too (config/defaults.py).
DEFAULT = APP_DEFAULT


def _allowed(key: str, model: str) -> str:
    if key in CHOICES:
        return ", ".join(c or "none" for c in CHOICES[key])
    if key in LIMITS:
        lo, hi = (LLM_LIMITS if model == "llm" else LIMITS).get(key, LIMITS[key])
        return f"a whole number from {lo} to {hi}"
    return "true or false"


def _check_one(key: str, raw: str, model: str):
    """The value of ``?key=raw`` checked alone (seq and depth against the URL's model's ranges)."""
    if key == "model" and raw == USER_MODEL:
        raise ConfigError(f"model {USER_MODEL} {NOT_FROM_A_LINK}.")
    if key == "batch":
        raw_cfg = {key: raw, "model": "mlp"}
    elif key in ("param_dtype", "optimizer_dtype"):  # the llm's own: checked as an llm's
        raw_cfg = {key: raw, "model": "llm"}
    elif key in ("attention", "loss_chunks"):  # the llm's only (other models: full, 1)
        raw_cfg = {key: raw, "model": "llm"}
    elif key in ("seq", "depth") and model == "llm":
        raw_cfg = {key: raw, "model": "llm", "seq": "16"} if key == "depth" else {key: raw, "model": "llm"}
    else:
        raw_cfg = {key: raw}
    return getattr(coerce_config(raw_cfg), key)


def _merged(values: dict) -> dict:
    """The configuration's fields the URL's values give: the defaults, the preset's shape (llm),
    the values themselves (explicit values win); batch 0 made 1 for models without single vectors."""
    model = values.get("model", DEFAULT.model)
    cfg = {k: getattr(DEFAULT, k) for k in CONTROL_KEYS if k != "target"}
    if model == "llm" and values.get("preset") in PRESETS:
        cfg.update({k: PRESETS[values["preset"]][k] for k in PRESET_FIELDS})
    cfg.update({k: v for k, v in values.items() if k in cfg or (model == "llm" and k in LLM_KEYS)})
    if model != "mlp" and cfg["batch"] == 0:
        cfg["batch"] = 1
    return cfg


def _fallback_heads(values: dict, warnings: list[str]) -> None:
    """Heads from the URL that do not divide the width (transformer; llm without head_dim): warned,
    replaced by the default or, if that does not divide it either, the nearest head count below."""
    cfg = _merged(values)
    model, width, heads = cfg["model"], cfg["width"], values.get("heads")
    if not (model == "transformer" or (model == "llm" and not cfg.get("head_dim"))):
        return
    if heads is None:  # not in the link: the control's own heads follow the width, unannounced
        if width % cfg["heads"]:
            values["heads"] = max(h for h in range(1, cfg["heads"] + 1) if width % h == 0)
        return
    if width % heads == 0:
        return
    use = DEFAULT.heads if width % DEFAULT.heads == 0 else max(h for h in range(1, heads) if width % h == 0)
    warnings.append(f"URL parameter `heads` = `{heads}` does not divide the width {width} (each head "
                    f"gets width / heads features). Allowed: a divisor of the width. Using `{use}`.")
    values["heads"] = use


def _problem(values: dict) -> ConfigError | None:
    try:
        RunConfig(**_merged(values))
    except ConfigError as err:
        return err
    return None


def _fit_together(values: dict, warnings: list[str]) -> None:
    """Drop URL values until the whole configuration is valid, warning about each: the one whose
    removal alone fixes it (llm fields first), else the last given."""
    while (err := _problem(values)) is not None:
        given = [k for k in reversed((*CONTROL_KEYS, *LLM_KEYS))
                 if k in values and k != "model" and k in st.query_params]
        if not given:
            return
        key = next((k for k in given if _problem({j: v for j, v in values.items() if j != k}) is None),
                   given[0])
        value = values.pop(key)
        used = _merged(values).get(key, "none") if key != "preset" else "none"
        warnings.append(f"URL parameter `{key}` = `{value}` does not fit the other settings "
                        f"({escape_markdown(err)}) Using `{used}`.")


def read_again() -> None:
    """Make the next run read the address bar again, as on a fresh visit (a page that switches to
    another with a new link: ``st.switch_page(..., query_params=...)``)."""
    st.session_state.pop("_url_loaded", None)


def read_url_once() -> list[str]:
    """On a session's first run, copy valid URL values into the controls; warn about bad ones."""
    if st.session_state.get("_url_loaded"):
        return []
    st.session_state["_url_loaded"] = True
    warnings, values = [], {}
    warnings += [f"URL parameter `{k}` {NOT_FROM_A_LINK}; ignored." for k in NEVER_KEYS
                 if k in st.query_params]
    model = st.query_params.get("model")
    model = model if model in CHOICES["model"] else DEFAULT.model
    if "model" not in st.query_params and st.query_params.get("preset") in PRESETS:
        model = "llm"  # a preset is an llm's shape
    for key in (*CONTROL_KEYS, *LLM_KEYS):
        if key not in st.query_params:
            continue
        raw = st.query_params[key]
        try:  # validate one parameter at a time so the warning names it; never executed
            values[key] = _check_one(key, raw, model)
        except ConfigError as err:
            warnings.append(f"URL parameter `{key}` = {code_span(raw)} is not valid "
                            f"({escape_markdown(err)}) Allowed: {_allowed(key, model)}. Using the "
                            f"default, `{getattr(DEFAULT, key) if key != 'preset' else 'none'}`.")
    if values.get("batch") == 0 and model != "mlp":  # seq_mixer, transformer, llm (a preset: the llm)
        warnings.append("URL parameter `batch` = `0` (a single vector) is only for the mlp model. "
                        f"Using the default, `{DEFAULT.batch}`.")
        values.pop("batch")
    if values.get("preset") and "model" not in values:
        values["model"] = "llm"  # a preset is an llm's shape
    _fallback_heads(values, warnings)
    _fit_together(values, warnings)
    if values.get("preset") and values["model"] == "llm":  # the preset fills what is not given, its
        # dtypes too (RECIPE): a dtype in the link replaces that one only
        values = {**{k: PRESETS[values["preset"]][k] for k in PRESET_FIELDS}, **RECIPE, **values}
    for key in NAME_FIELDS:  # custom's names: checked against the URL's model
        if key not in st.query_params:
            continue
        raw = st.query_params[key]
        model = values.get("model", DEFAULT.model)
        try:
            names = getattr(coerce_config({"model": model, "policy": "custom", key: raw}), key)
        except ConfigError as err:
            warnings.append(f"URL parameter `{key}` = {code_span(raw)} is not valid "
                            f"({escape_markdown(err)}) Using none: those tensors are recomputed.")
            continue
        values.update({f"custom_{n}": "save" if key == "save_names" else "offload" for n in names})
    for key, value in values.items():
        st.session_state[key] = value
    if "width" in values:
        st.session_state["width_exact"] = values["width"]
    return warnings


def write_url(cfg: RunConfig) -> None:
    llm = cfg.model == "llm"
    wanted = {k: str(getattr(cfg, k)) for k in CONTROL_KEYS
              if (k != "heads" or cfg.model in ("transformer", "llm")) and getattr(cfg, k) != USER_MODEL}
    wanted.update({k: str(getattr(cfg, k)) for k in LLM_KEYS if llm and (k != "preset" or cfg.preset)})
    wanted.update({k: ",".join(getattr(cfg, k)) for k in NAME_FIELDS if getattr(cfg, k)})
    wanted.update(_mesh.url_params(cfg))
    if {k: st.query_params.get(k) for k in st.query_params} != wanted:
        st.query_params.from_dict(wanted)
