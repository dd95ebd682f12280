"""The sidebar's controls: its widgets, read into one configuration per script run, and the policy labels.

The URL mirror is ``_url`` (its ``CONTROL_KEYS`` and ``DEFAULT`` are named here too); the memory
budget and the over-budget flag are ``_budget``.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

import streamlit as st

from pages import _attention, _llm, _mesh, _precision, _user_block
from pages._budget import budget_message, memory_caption, over_budget
from pages._budget import device_limit as _device_limit  # noqa: F401 - the pages ask for it here
from pages._url import CONTROL_KEYS, DEFAULT, LLM_KEYS, read_url_once, write_url
from remat_lab.config import (
    CHOICES,
    LIMITS,
    LOCAL,
    OBJECTIVES,
    TARGET_NAMES,
    ConfigError,
    RunConfig,
    mesh_devices,
)
from remat_lab.model.models import SEQ_MODELS, names_of
from remat_lab.model.policies import GROUPS, POLICIES
from remat_lab.present.target_charts import target_label, target_name
from remat_lab.serve.safe_text import escape_markdown

NAME_CHOICES = ("save", "offload", "recompute")  # the custom editor, one control per checkpoint name
POW2_WIDTHS = [2 ** i for i in range(3, 13)]  # 8 .. 4096
POW2_BATCHES = [2 ** i for i in range(0, 13)]  # 1 .. 4096
POW2_SEQS = [2 ** i for i in range(0, 11)]  # 1 .. 1024 (the llm: up to 32768)

_ROUTED = threading.local()  # the router's config for this script run


def policy_label(pid: str) -> str:
    return POLICIES[pid].label if pid in POLICIES else pid


def grouped_policy_label(pid: str) -> str:
    """The policy picker's label: its group (JAX policies / MaxText recipes / custom), then the id."""
    return f"{GROUPS[POLICIES[pid].group]} › {pid}" if pid in POLICIES else pid


def _custom_names(ss) -> dict:
    """``save_names``/``offload_names`` from the custom editor's controls (only for policy custom)."""
    if ss["policy"] != "custom" or _user_block.active(ss):  # the user's block: _user_block.apply
        return {}
    choice = {n: ss.get(f"custom_{n}") or "recompute" for n in names_of(ss["model"])}
    return {"save_names": tuple(n for n, c in choice.items() if c == "save"),
            "offload_names": tuple(n for n, c in choice.items() if c == "offload")}


def describe(cfg: RunConfig) -> str:
    shape = "x".join(map(str, cfg.input_shape))
    if cfg.model == "llm":
        shape = f"{cfg.preset or 'llm'} seq {cfg.seq} batch {cfg.batch}"
    if cfg.compile_only:
        return f"{cfg.model} {cfg.dtype} x:({shape}) {cfg.policy}, step {cfg.step}, compile only"
    if cfg.target != LOCAL:
        return (f"{cfg.model} {cfg.dtype} x:({shape}) depth {cfg.depth}, {cfg.policy}, "
                f"{cfg.objective}, compiled for {target_name(cfg.target)}")
    return (f"{cfg.model} {cfg.dtype} x:({shape}) depth {cfg.depth}, {cfg.policy}, "
            f"{cfg.objective}, {cfg.repeats} repeats")


def _with_target(cfg: RunConfig, target: str) -> RunConfig:
    """``cfg`` compiled for ``target``: a named target holds the mesh's devices (one without a mesh)."""
    if target == LOCAL:
        return cfg
    try:
        return cfg.replace(target=target, target_devices=mesh_devices(cfg.mesh))
    except ConfigError as err:  # should not happen: the mesh's devices are what the target needs
        st.warning(f"{escape_markdown(err)} Running locally.")
        return cfg


def _width_from_slider() -> None:
    st.session_state["width_exact"] = st.session_state["width"]


def _width_from_entry() -> None:
    st.session_state["width"] = int(st.session_state["width_exact"])


def _reassert_on_page_change(page: str | None) -> None:
    """On the first run of a newly chosen page, hand the controls' values to the browser again.

    A widget the browser mounts afresh shows its own default (a slider's first option, a number
    input's minimum) unless the server says the value was set; after a page switch that could show
    (and on the next click send) width 8, batch "single vector", depth 1 while this session holds
    the real settings. Assigning each value to itself before the widgets are created marks it set.
    """
    ss = st.session_state
    if page is None or ss.get("_controls_page") == page:
        return
    first = "_controls_page" not in ss
    ss["_controls_page"] = page
    if first:
        return
    for key in (*CONTROL_KEYS, *LLM_KEYS, "width_exact",
                *(k for k in list(ss.keys()) if str(k).startswith("custom_"))):
        if key in ss:
            ss[key] = ss[key]


def _render_controls(page: str | None = None) -> RunConfig:
    warnings = read_url_once()
    ss = st.session_state
    for key in (*CONTROL_KEYS, *LLM_KEYS):
        ss.setdefault(key, getattr(DEFAULT, key))
    ss.setdefault("width_exact", ss["width"])
    _reassert_on_page_change(page)
    sb = st.sidebar
    sb.title("Remat Lab")
    sb.caption("What a JAX checkpoint policy does to a Flax NNX model.")
    flag = sb.empty()  # the over-budget flag goes here, above the controls, once they are read
    sb.selectbox("Target", TARGET_NAMES, key="target", format_func=target_label,
                 help="local: this machine runs and times the step. A GPU or TPU: the step is "
                      "compiled for it without the device (memory, products, an estimated time; "
                      "nothing runs). With a device mesh the target has the mesh's devices.")
    sb.radio("Model", CHOICES["model"], key="model", horizontal=True,
             help="mlp: relu(l2(relu(l1(x)))); seq_mixer adds token mixing whose dots pair batch axes; "
                  "transformer: a pre-norm decoder block (causal attention, gated MLP) with "
                  "MaxText's checkpoint names; llm: a decoder language model (embedding, "
                  "grouped-query attention with rotary positions, gated MLP, vocabulary projection).")
    _user_block.controls(sb)
    _llm.clamp_for_model(ss)
    if ss["model"] == "llm":
        _llm.preset_control(sb)
    sb.select_slider("Width D (features)", options=sorted(set(POW2_WIDTHS) | {ss["width"]}),
                     key="width", on_change=_width_from_slider)
    sb.number_input("…or type any width", min_value=LIMITS["width"][0], max_value=LIMITS["width"][1],
                    step=1, key="width_exact", on_change=_width_from_entry)
    if ss["model"] != "mlp" and ss["batch"] == 0:
        ss["batch"] = 1
    batches = ([0] if ss["model"] == "mlp" else []) + POW2_BATCHES
    sb.select_slider("Batch B", options=sorted(set(batches) | {ss["batch"]}), key="batch",
                     format_func=lambda b: "single vector" if b == 0 else str(b),
                     help="single vector = x: (D,), the seed's case (mlp only).")
    sb.select_slider("Sequence length N (seq_mixer, transformer, llm)",
                     options=_llm.seq_options(POW2_SEQS, ss["model"], ss["seq"]), key="seq",
                     disabled=ss["model"] not in SEQ_MODELS)
    if ss["model"] == "llm":
        _llm.shape_controls(sb)
        _attention.controls(sb)  # attention kernel, its block, the vocabulary loss's chunks
    elif ss["model"] == "transformer":
        heads = [h for h in range(1, LIMITS["heads"][1] + 1) if int(ss["width"]) % h == 0]
        if ss["heads"] not in heads:  # the width changed: the nearest head count that divides it
            ss["heads"] = max(h for h in heads if h <= ss["heads"]) if ss["heads"] > 1 else 1
        sb.select_slider("Attention heads", options=heads, key="heads",
                         help="Heads of width / heads features each; only divisors of the width.")
    sb.slider("Depth (remat'd blocks)", *_llm.limits("depth", ss["model"]), key="depth")
    sb.radio("Stack", CHOICES["stack"], key="stack", horizontal=True, disabled=ss["depth"] == 1,
             help="How depth > 1 blocks run: scan over layers stacked on a leading axis (nnx.scan, "
                  "how production code is written), or an unrolled Python loop (see the Guide).")
    _precision.controls(sb)  # dtype; the llm: master weights, AdamW moments, the recipe
    sb.selectbox("Checkpoint policy", list(POLICIES), key="policy", format_func=grouped_policy_label,
                 help=POLICIES[ss["policy"]].description if ss["policy"] in POLICIES else None)
    if ss["policy"] == "custom":
        sb.caption(f"Per checkpoint name of {ss['model']}: save on the device, offload to pinned "
                   "host memory, or recompute.")
        for name in _user_block.custom_names(ss, names_of(ss["model"])):
            ss.setdefault(f"custom_{name}", "recompute")
            sb.segmented_control(f"`{name}`", NAME_CHOICES, key=f"custom_{name}")
    _llm.step_controls(sb)
    sb.radio("Objective", OBJECTIVES, key="objective", horizontal=True, disabled=ss["step"] == "train",
             help="step train always computes value_and_grad.")
    sb.number_input("Timed repeats", min_value=LIMITS["repeats"][0], max_value=LIMITS["repeats"][1],
                    step=1, key="repeats", disabled=ss["target"] != LOCAL,
                    help="Only local runs are timed; a named target is compiled, not run.")
    keys = (*CONTROL_KEYS, *(LLM_KEYS if ss["model"] == "llm" else ()))
    try:
        cfg = RunConfig(**{k: (int(ss[k]) if k in LIMITS else ss[k]) for k in keys
                           if k != "target"}, **_custom_names(ss))
    except ConfigError as err:  # a combination the controls allow (an odd head size): the last good one
        cfg = ss.get("_last_config", DEFAULT)
        st.warning(f"{escape_markdown(err)} Using the last valid settings "
                   f"({escape_markdown(describe(cfg))}).")
    cfg = _user_block.apply(cfg)
    ss["_last_config"] = cfg
    cfg = _with_target(_mesh.apply(cfg, ss["target"]), ss["target"])  # several devices or a target
    ss["_sidebar_config"] = cfg  # what a model loaded next is fitted to (pages/_load_fit.py)
    for text in warnings:
        st.warning(text)
    write_url(cfg)
    # The Advisor searches the batch (the batch control does not apply there): no width-based flag.
    over = None if page == "advisor" else over_budget(cfg.replace(compile_only=False))
    drawn = _llm.flag(flag.container(), over, cfg, budget_message(*over, cfg.model) if over else "")
    if not drawn:
        _llm.compile_only_toggle(sb, disabled=cfg.target != LOCAL or bool(cfg.mesh))
    if not over:  # on a named target nothing is allocated: this server's memory does not limit it
        sb.caption(memory_caption(cfg) + "The link in the address bar restores these settings.")
    return cfg


def _leave_legacy_page_mode() -> None:
    """Hand a page run by Streamlit's legacy ``pages/`` discovery back to the router.

    A server's first requests that name a page (``/sweep``, a shared link) can start before any
    session has called ``st.navigation``: Streamlit then runs the page script without ``app.py``
    and lists every file in ``pages/`` in the sidebar. app.py switches that mode off for the
    process; a run that started before is recognised here (a page script in a server whose main
    script is app.py, but not routed), and rerun: the rerun executes ``app.py``, which routes to
    the same URL path. (AppTest runs a page file as its own main script: not a legacy run.)
    """
    from streamlit.runtime.pages_manager import PagesManager  # the flag lives nowhere public
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None or Path(ctx.main_script_path).name != "app.py":
        return
    PagesManager.uses_pages_directory = False
    st.rerun()


def controls(router: bool = False, page: str | None = None) -> RunConfig:
    """The sidebar controls' configuration; rendered once per script run (``router=True``: by
    app.py, before it runs the page ``page``; otherwise by a page run on its own)."""
    cfg = getattr(_ROUTED, "config", None)
    if cfg is not None:
        return cfg
    if not router:
        _leave_legacy_page_mode()
    return _render_controls(page)


@contextmanager
def routed(cfg: RunConfig):
    """Used by app.py around ``pg.run()`` so pages reuse the router's controls."""
    _ROUTED.config = cfg
    try:
        yield
    finally:
        _ROUTED.config = None
