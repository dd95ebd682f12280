"""The sidebar's "your block" controls: the user's own NNX block, offered only on a server that is not public.

A user block runs the visitor's Python code in this server, so it is offered only when
``store.history.public_mode()`` is off (``REMAT_LAB_PUBLIC=0``) and is never read from a URL (``_url``).
Its checkpoint names come from tracing it (``model.models.block_names``); an error in its code is shown
as the user's, their traceback in a code block of its own.
"""

from __future__ import annotations

import streamlit as st

from remat_lab.config import ConfigError, RunConfig
from remat_lab.config.errors import UserCodeError
from remat_lab.config.userblock import parse_input_shape
from remat_lab.model.models import USER_MODEL, block_names
from remat_lab.model.user_block import example_input_shape
from remat_lab.serve.safe_text import escape_markdown
from remat_lab.store import history

MODULE_KEY, SHAPE_KEY = "user_module", "user_shape"


def offered() -> bool:
    """Whether this server may run a visitor's own block: only when it is not public."""
    return not history.public_mode()


def active(ss) -> bool:
    return offered() and bool(str(ss.get(MODULE_KEY) or "").strip())


def controls(sb) -> None:
    """The "your block" text inputs (nothing on a public server)."""
    ss = st.session_state
    if not offered():
        ss[MODULE_KEY] = ""
        return
    ss.setdefault(MODULE_KEY, "")
    ss.setdefault(SHAPE_KEY, "")  # empty: the module's own example_input_shape (as the CLI)
    _prefill(ss)
    sb.text_input("Your block (local only)", key=MODULE_KEY,
                  placeholder="path/to/file.py:make_block",
                  help="Your own NNX block instead of the model above: a factory make_block(rngs) -> "
                       "nnx.Module, as mypkg.blocks:make_block or path/to/file.py:make_block. The lab "
                       "stacks it (depth, stack), remats it with the policy and sums its output as "
                       "the loss; width, seq and heads are not used. Offered only on a private server.")
    if ss[MODULE_KEY].strip():
        sb.text_input("Its input shape B,N,D (batch first)", key=SHAPE_KEY,
                      placeholder="the module's example_input_shape",
                      help="Filled in from the example_input_shape your module defines (as the CLI "
                           "uses it); change it to run another batch or shape.")


def _prefill(ss) -> None:
    """The shape box filled in from the typed module's ``example_input_shape`` (before the box is
    drawn this run), unless the user typed a shape of their own: a box still holding what an earlier
    module filled in follows the new module."""
    spec = str(ss.get(MODULE_KEY) or "").strip()
    filled = ss.get("_user_shape_filled")  # (module, text) of the last fill-in
    if not spec or (ss[SHAPE_KEY] and (not filled or ss[SHAPE_KEY] != filled[1] or filled[0] == spec)):
        return
    try:
        shape = example_input_shape(spec)
    except (ConfigError, UserCodeError):  # ``apply`` shows why it cannot be loaded
        shape = None
    text = ",".join(map(str, shape)) if shape else ""
    ss[SHAPE_KEY], ss["_user_shape_filled"] = text, (spec, text)


def _user_config(ss, cfg: RunConfig, names: dict | None = None) -> RunConfig:
    shape = parse_input_shape(ss.get(SHAPE_KEY) or "")
    if not shape:  # the module's own, when it has one (loading it: its errors are the user's)
        shape = example_input_shape(ss[MODULE_KEY].strip()) or ()
    return RunConfig(**{**cfg.as_dict(), "model": USER_MODEL, "model_module": ss[MODULE_KEY].strip(),
                        "input_shape": shape, "batch": shape[0] if shape else 1, "preset": "",
                        "param_dtype": "", "save_names": (), "offload_names": (), **(names or {})})


def custom_names(ss, builtin: tuple[str, ...]) -> tuple[str, ...]:
    """The names the custom editor offers: the built-in model's, or those traced in the user's block
    (none while it cannot be loaded: ``apply`` says why)."""
    if not active(ss):
        return builtin
    try:
        return block_names(_user_config(ss, RunConfig(dtype=ss.get("dtype", "float32"))))
    except ConfigError:
        return ()


def apply(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the user's block in place of the model (custom's names from the editor), or
    ``cfg`` unchanged with the error shown (the user's own traceback in a code block)."""
    ss = st.session_state
    if not active(ss):
        return cfg
    try:
        choice = {n: ss.get(f"custom_{n}") for n in custom_names(ss, ())} if cfg.policy == "custom" else {}
        names = {"save_names": tuple(n for n, c in choice.items() if c == "save"),
                 "offload_names": tuple(n for n, c in choice.items() if c == "offload")}
        user = _user_config(ss, cfg, names)
        block_names(user)  # loads and traces it now, so its errors are shown here
        from remat_lab.model.models import llm_options
        from remat_lab.program.step import DTYPES
        llm_options(user, DTYPES)  # the stack's shape and custom's names checked
        return user
    except UserCodeError as err:
        head, _, trace = str(err).partition("\n")
        st.error(f"Your block: {escape_markdown(head)}", icon=":material/code:")
        st.code(trace, language="text")
    except ConfigError as err:
        st.error(f"Your block cannot be used: {escape_markdown(err)}")
    st.caption(f"Using {cfg.model} until your block loads.")
    return cfg
