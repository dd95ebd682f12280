"""A shared link's mesh read into the sidebar's mesh selectors, once per session, every part not used said."""

from __future__ import annotations

import streamlit as st

from remat_lab.config import MESH_AXES, ConfigError, format_mesh, mesh_parts
from remat_lab.serve import safe_text

FROM_LINK = "_mesh_from_link"  # session state: a link's mesh this server has not the devices for
LOADED = "_mesh_loaded"  # session state: the mesh last read from a link or written to the URL


def read(on_target: bool, n: int, choices: list[int], dcn_choices: tuple[int, ...]) -> None:
    """A link's mesh into the selectors, when the link names one other than the mesh last read or
    written (a page opened without one keeps the selectors); every part of it not used is said:
    text that is not a mesh, dcn axes without a named target, a mesh whose devices this server
    does not have (kept as ``FROM_LINK`` for the Targets page), a size not among ``choices``
    (``dcn_choices`` for a dcn axis)."""
    ss = st.session_state
    raw = st.query_params.get("mesh", "")
    if LOADED in ss and (not raw or raw == ss[LOADED]):
        return
    ss[LOADED] = raw
    try:
        sizes, dcn = mesh_parts(raw)
    except ConfigError as err:
        st.warning(f"URL parameter `mesh` is not valid ({safe_text.escape_markdown(err)}) "
                   "Using one device.")
        sizes, dcn = {}, {}
    # The link's mesh as read (whole numbers and axis names only: no text of the link's own).
    shown = "`" + ",".join([f"dcn_{a}={v}" for a, v in dcn.items()]
                           + [f"{a}={v}" for a, v in sizes.items()]) + "`"
    if dcn and not on_target:
        st.warning("URL parameter `mesh` spans slices or hosts (its `dcn_*` axes); the attached "
                   "devices are one slice, so they are dropped here: choose a named target "
                   "(e.g. tpu-v6e or h100) to compile over several.")
    need = 1
    for size in sizes.values():
        need *= size
    if not on_target and n % need:
        ss[FROM_LINK] = format_mesh(sizes)
        st.warning(f"URL parameter `mesh` = {shown} uses {need} devices, which does not divide the "
                   f"{n} of this server: runs here are on one device. Choose a named target in the "
                   f"sidebar (e.g. h100 or tpu-v6e) to compile over {need} of its devices; the "
                   "Targets page applies the link's mesh to each named target.")
        sizes = {}
    off = ([f"{a}={v}" for a, v in sizes.items() if v not in choices]
           + [f"dcn_{a}={v}" for a, v in dcn.items() if on_target and v not in dcn_choices])
    if off:
        st.warning(f"URL parameter `mesh` = {shown}: {', '.join(off)} is not offered here (each "
                   f"axis: {', '.join(map(str, choices))}); using 1 for it.")
    for axis in MESH_AXES:
        ss[f"mesh_{axis}"] = sizes.get(axis, 1) if sizes.get(axis, 1) in choices else 1
        ss[f"mesh_dcn_{axis}"] = dcn.get(axis, 1) if dcn.get(axis, 1) in dcn_choices else 1


def written(mesh: str) -> None:
    """The mesh the page wrote to its URL: read again only when a link names another."""
    st.session_state[LOADED] = mesh


def read_network(names: list[str]) -> None:
    """A link's ``network`` into the host network selector, once per link; one the target does not
    have is said, and the default kept."""
    ss, raw = st.session_state, st.query_params.get("network", "")
    if not raw or ss.get("_network_loaded") == raw:
        return
    ss["_network_loaded"] = raw
    if raw in names:
        ss["mesh_network"] = raw
    else:
        st.warning(f"URL parameter `network` is not one of this target's host networks "
                   f"({', '.join(names)}); using its default.")
