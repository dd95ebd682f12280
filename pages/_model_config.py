"""The sidebar's model config box (llm): a published config.json or MaxText YAML, pasted or uploaded.

The engine reads the file (``config.model_config``: JSON or ``yaml.safe_load``, nothing executed);
this page only hands it the text and copies the fields it gives into the controls, as a preset
does. A file the lab cannot model is an error naming its keys; what the lab does not reproduce of a
file it reads is listed under the box. An uploaded file's bytes leave Streamlit's upload manager as
soon as they are read (its key changes, so the widget starts empty again).
"""

from __future__ import annotations

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from pages import _load_fit
from remat_lab.config import PRESET_FIELDS, ConfigError
from remat_lab.config.catalog import RECIPE
from remat_lab.config.model_config import MAX_BYTES, parse_model_config
from remat_lab.serve.safe_text import escape_markdown

TEXT = "model_config_text"  # the paste box's key
READ = "_model_config_read"  # (file name, what it is, the notes) of the file last applied
ERROR = "_model_config_error"  # the last file's refusal, shown until the next file
COUNTER = "_model_config_upload_n"  # uploads taken: the uploader's key changes after each


def _uploader_key() -> str:
    return f"model_config_file_{st.session_state.get(COUNTER, 0)}"


def _apply(text: str, name: str) -> None:
    """Read ``text``; fill the shape's controls (no preset, the recipe's dtypes), or keep the error."""
    ss = st.session_state
    ss.pop(ERROR, None)
    try:
        read = parse_model_config(text, name)
    except ConfigError as err:
        ss[ERROR] = str(err)
        return
    ss.update({k: read.fields[k] for k in PRESET_FIELDS})
    ss.update(width_exact=read.fields["width"], preset="", **RECIPE)
    ss[READ] = (name, read.source, read.notes())
    _load_fit.on_load()  # a batch and seq that fit it, or why none does


def _from_paste() -> None:
    _apply(st.session_state.get(TEXT, ""), "the pasted config")


def _from_upload() -> None:
    """The uploader's callback: its bytes read, let go of, and read as a config."""
    ss = st.session_state
    f = ss.get(_uploader_key())
    if f is None:
        return
    data, name = f.getvalue(), f.name
    ctx = get_script_run_ctx()
    manager = getattr(ctx, "uploaded_file_mgr", None) if ctx is not None else None
    if manager is not None:
        manager.remove_file(ctx.session_id, f.file_id)  # the bytes go back to the upload budget
    ss[COUNTER] = ss.get(COUNTER, 0) + 1
    if len(data) > MAX_BYTES:
        ss[ERROR] = f"{name} is {len(data):,} bytes; a model config file is at most {MAX_BYTES:,}."
        return
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        ss[ERROR] = f"{name} is not UTF-8 text; a model config is JSON or YAML."
        return
    _apply(text, name)


def forget() -> None:
    """A preset chosen after a file: the file's notes no longer describe the fields."""
    st.session_state.pop(READ, None)
    st.session_state.pop(ERROR, None)


def controls(sb) -> None:
    """The box (under the preset picker) and what the last file gave: its error, or its notes."""
    ss = st.session_state
    with sb.expander("…or a published config file", expanded=ERROR in ss):
        st.file_uploader("Hugging Face config.json or MaxText model YAML", type=["json", "yml", "yaml"],
                         key=_uploader_key(), on_change=_from_upload, max_upload_size=1,
                         help="Fills the shape as a preset does; only read as JSON or YAML data.")
        st.text_area("…or paste it", key=TEXT, height=120, max_chars=MAX_BYTES,
                     placeholder='{"hidden_size": 4096, "num_hidden_layers": 32, ...}')
        st.button("Read the pasted config", key="model_config_read", on_click=_from_paste,
                  disabled=not ss.get(TEXT, "").strip())
    if ERROR in ss:  # the file's own names and values are in it: escaped for Markdown
        sb.error(escape_markdown(ss[ERROR]), icon=":material/error:")
    elif READ in ss and not ss.get("preset"):
        name, source, notes = ss[READ]
        said = f"From {name} ({source})." + (" Not modelled: " + "; ".join(notes) + "." if notes else "")
        sb.caption(escape_markdown(said))
