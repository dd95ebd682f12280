"""Page furniture shared by every page: the controls, the header and the environment line."""

from __future__ import annotations

import streamlit as st

from pages._record import remember_visitor
from pages._sidebar import controls
from remat_lab.config import RunConfig
from remat_lab.program.backend import ExecutionError
from remat_lab.serve import worker
from remat_lab.serve.safe_text import escape_markdown


@st.cache_resource(show_spinner=False)
def _environment() -> dict:
    """Backend, devices and versions of the worker process, where the runs happen."""
    return worker.shared_pool().call("environment", {})


def page_start(title: str, intro: str | None = None) -> RunConfig:
    """Controls, header and environment line; the configuration to use."""
    cfg = controls()
    remember_visitor()  # public deployments: the browser keeps the token naming its own runs
    st.header(title)
    if intro:
        st.caption(intro)
    env_line()
    return cfg


def env_line() -> None:
    try:
        e = _environment()
    except ExecutionError as err:  # no worker could start: say so, the page still renders
        st.caption(f"Environment: unavailable ({escape_markdown(err)})")
        return
    st.caption(f"Environment: backend **{e['backend']}** · device {e['device_kind']} × "
               f"{e['device_count']} · {e['cpu_count']} CPU cores · jax {e['jax']} · jaxlib "
               f"{e['jaxlib']} · flax {e['flax']} · streamlit {st.__version__}")
