"""The sidebar's settings in the address bar: the controls it mirrors, their defaults, read and rewritten.

On a session's first run each URL parameter is validated on its own (a bad one is named in a warning
and its control keeps the default); every run then rewrites the address bar to the configuration in
use, so a link restores these settings.
"""

from __future__ import annotations

import streamlit as st

from pages import _mesh
from remat_lab.config import CHOICES, LIMITS, NAME_FIELDS, ConfigError, RunConfig, coerce_config
from remat_lab.serve.safe_text import code_span, escape_markdown

CONTROL_KEYS = ("model", "width", "batch", "seq", "heads", "depth", "stack", "dtype", "policy",
                "objective", "repeats", "target")
# The app opens where policies visibly differ on a CPU: a scanned 8-block mlp (width 256, batch
# 128). Measured (XLA CPU): peak 10.4 MiB (nothing_saveable) / 11.7 (no_remat) / 12.2
# (dots_with_no_batch_dims_saveable), one step about 8 ms; the engine's own default stays the
# seed's one-block case.
DEFAULT = RunConfig(width=256, batch=128, depth=8)


def read_url_once() -> list[str]:
    """On a session's first run, copy valid URL values into the controls; warn about bad ones."""
    if st.session_state.get("_url_loaded"):
        return []
    st.session_state["_url_loaded"] = True
    warnings, values = [], {}
    for key in CONTROL_KEYS:
        if key not in st.query_params:
            continue
        raw = st.query_params[key]
        try:  # validate one parameter at a time so the warning names it; never executed
            values[key] = getattr(coerce_config({key: raw} if key != "batch" else
                                                {key: raw, "model": "mlp"}), key)
        except ConfigError as err:
            allowed = (", ".join(CHOICES[key]) if key in CHOICES
                       else "a whole number from {} to {}".format(*LIMITS[key]))
            warnings.append(f"URL parameter `{key}` = {code_span(raw)} is not valid "
                            f"({escape_markdown(err)}) Allowed: {allowed}. Using the default, "
                            f"`{getattr(DEFAULT, key)}`.")
    if values.get("batch") == 0 and values.get("model") == "seq_mixer":
        warnings.append("URL parameter `batch` = `0` (a single vector) is only for the mlp model. "
                        f"Using the default, `{DEFAULT.batch}`.")
        values.pop("batch")
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
    wanted = {k: str(getattr(cfg, k)) for k in CONTROL_KEYS if k != "heads" or cfg.model == "transformer"}
    wanted.update({k: ",".join(getattr(cfg, k)) for k in NAME_FIELDS if getattr(cfg, k)})
    wanted.update(_mesh.url_params(cfg))
    if {k: st.query_params.get(k) for k in st.query_params} != wanted:
        st.query_params.from_dict(wanted)
